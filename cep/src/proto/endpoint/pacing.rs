//! Pacing: at most [`EndpointConfig::request_window`] requests (REQ, DREQ,
//! LAP, SIDR_REQ) on the wire at once awaiting their answer; the rest wait
//! here in the order they were made and go out as answers come or
//! requests end. The CEP's state moves at once (a `disconnect` leaves it in
//! DREQ_SENT); only the transmission and the arming of its retry timer
//! wait. `docs/cm-protocol.md`, "Bursts".
//!
//! The IBTA CM has no flow control: a burst of requests (a consumer
//! disconnecting 100,000 connections at once) reaches the peer's QP1
//! faster than its agent takes MADs, its receive queue overflows, the
//! provider drops the excess unseen and every lost request is sent again
//! at its response timeout, again into a full queue. A window bounds what
//! this endpoint makes a peer receive at once, so nothing is lost and no
//! request is retried because of the burst.
//!
//! A REP is not paced: it answers a REQ the peer sent, so the peer's own
//! window bounds it.
//!
//! [`EndpointConfig::request_window`]: crate::proto::EndpointConfig::request_window

use super::window::Pacing;
use super::{Conn, Endpoint};
use crate::proto::{Nanos, State};

impl Endpoint {
    /// The most requests on the wire at once (at least 1).
    pub(super) fn window(&self) -> u32 {
        self.config.request_window.max(1)
    }

    /// Where a waiting request stands in line: its transaction id, counted
    /// from the first this endpoint gave (each request gets a fresh one
    /// just before it is queued, so this is the order they were made in,
    /// without a sequence number in every CEP). `None` outside the paced
    /// states.
    pub(super) fn line_key(&self, c: &Conn) -> Option<(u64, u32)> {
        let tid = match c.state {
            State::ReqSent | State::SidrReqSent => c.tid,
            State::DreqSent => c.dreq_tid,
            State::LapSent => c.lap_tid,
            _ => return None,
        };
        Some((tid.wrapping_sub(self.config.first_tid), c.id))
    }

    /// The request `Conn::resend` of CEP `id` (just made, in a paced
    /// state) goes out now if the window has room and nothing waits before
    /// it, else it waits in line.
    pub(super) fn send_paced(&mut self, now: Nanos, id: u32) {
        if self.in_flight < self.window() && self.waiting.is_empty() {
            self.put_on_wire(now, id);
            return;
        }
        let Some(key) = self.conns.get(id).and_then(|c| self.line_key(c)) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(id) {
            c.pacing = Pacing::Waiting;
        }
        self.waiting.insert(key);
        self.requests_queued += 1;
        // The window may have room with others in line (the request this
        // one replaces, a LAP, just gave up its place): oldest first.
        self.pace(now);
    }

    /// Sends CEP `id`'s request and arms its retry timer: it takes a place
    /// in the window.
    fn put_on_wire(&mut self, now: Nanos, id: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let Some(mad) = c.resend.as_deref().copied() else {
            return;
        };
        c.pacing = Pacing::OnWire;
        let at = now.saturating_add(c.response_wait());
        self.in_flight += 1;
        self.set_timer(id, at);
        self.send_for(id, mad);
    }

    /// Fills the window from the line, oldest first. Run at the end of
    /// every input that may end a request (a received MAD, the timers, a
    /// user call), so a request waits only while the window is full.
    pub(super) fn pace(&mut self, now: Nanos) {
        while self.in_flight < self.window() {
            let Some((_, id)) = self.waiting.pop_first() else {
                break;
            };
            self.put_on_wire(now, id);
        }
    }

    /// CEP `id`'s request ended (answered, rejected, timed out, replaced
    /// by a DREQ, the CEP destroyed or freed) or never was paced: a waiting
    /// one leaves the line unsent, one on the wire gives up its place.
    /// Called wherever a request's retry timer stops (`cancel_timer`),
    /// when a CEP enters TIMEWAIT or is freed, and when a LAP runs out of
    /// retries; the next [`Endpoint::pace`] gives the place to the next in
    /// line.
    pub(super) fn end_request(&mut self, id: u32) {
        let Some(c) = self.conns.get(id) else {
            return;
        };
        let key = self.line_key(c);
        match c.pacing {
            Pacing::Off => return,
            Pacing::Waiting => {
                if let Some(key) = key {
                    self.waiting.remove(&key);
                }
            }
            Pacing::OnWire => self.in_flight = self.in_flight.saturating_sub(1),
        }
        if let Some(c) = self.conns.get_mut(id) {
            c.pacing = Pacing::Off;
        }
    }

    /// Whether CEP `id`'s request waits for the window (not on the wire
    /// yet, so nothing the peer sends can answer it).
    pub(super) fn is_waiting(&self, id: u32) -> bool {
        self.conns
            .get(id)
            .is_some_and(|c| c.pacing == Pacing::Waiting)
    }

    /// Requests that had to wait for the window since the endpoint began.
    pub fn requests_queued(&self) -> u64 {
        self.requests_queued
    }

    /// Requests waiting for the window now.
    pub fn requests_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests on the wire awaiting their answer now (at most the window).
    pub fn requests_in_flight(&self) -> u32 {
        self.in_flight
    }
}
