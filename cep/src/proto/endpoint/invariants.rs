//! The cross-table invariants of an [`Endpoint`], for tests and fuzzers.

use super::window::Pacing;
use super::Endpoint;
use crate::proto::{ConnId, State};

/// States of a CEP whose request is outstanding: waiting for the window
/// or on the wire awaiting its answer (an MRA does not answer it: the
/// request may still be sent again when the MRA's wait runs out).
fn awaits_answer(state: State) -> bool {
    matches!(
        state,
        State::ReqSent
            | State::MraReqRcvd
            | State::DreqSent
            | State::LapSent
            | State::MraLapRcvd
            | State::SidrReqSent
    )
}

impl Endpoint {
    /// Checks that the tables agree with each other and with the CEP states:
    /// every table entry names a live CEP in a state that belongs in that
    /// table and that owns the entry; no comm id is used twice; a timer is
    /// armed exactly for the states that need one. For tests and fuzzers.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conns.check()?;
        let mut armed = 0usize;
        let (mut on_wire, mut waiting) = (0u32, 0usize);
        // Listener id -> requests counting in its backlog.
        let mut queued = std::collections::BTreeMap::<u32, u32>::new();
        for (id, c) in self.conns.iter() {
            let name = ConnId(id);
            let waits_for_user = matches!(
                c.state,
                State::ReqRcvd | State::MraReqSent | State::SidrReqRcvd
            );
            if c.listener != 0 {
                if !waits_for_user || c.destroyed {
                    return Err(format!("{name}: in {} but queued", c.state));
                }
                *queued.entry(c.listener).or_default() += 1;
            }
            if c.id != id {
                return Err(format!("{name}: stored id {:#x}", c.id));
            }
            // A request waiting for the window has no retry timer yet.
            let needs_timer = c.state.has_timer() && c.pacing != Pacing::Waiting;
            if needs_timer != c.timer.is_some() {
                return Err(format!(
                    "{name}: state {} ({:?}) but timer {:?}",
                    c.state, c.pacing, c.timer
                ));
            }
            if (c.pacing != Pacing::Off) != awaits_answer(c.state) {
                return Err(format!("{name}: {} but {:?}", c.state, c.pacing));
            }
            match c.pacing {
                Pacing::Off => {}
                Pacing::OnWire => on_wire += 1,
                Pacing::Waiting => {
                    waiting += 1;
                    // Not sent yet: made in its first state, not MRA'd,
                    // its MAD kept to send, and in line under its key.
                    let in_line = self.line_key(c).is_some_and(|k| self.waiting.contains(&k));
                    if !in_line || c.resend.is_none() || c.destroyed {
                        return Err(format!("{name}: waits in {} but not in line", c.state));
                    }
                }
            }
            if let Some(t) = c.timer {
                armed += 1;
                if !self.timers.contains(&(t, id)) {
                    return Err(format!("{name}: timer {t} not in the timer set"));
                }
            }
            if c.destroyed && c.state != State::Timewait {
                return Err(format!("{name}: destroyed but in {}", c.state));
            }
            if (c.state == State::Timewait) != self.timewait.contains(&id) {
                return Err(format!("{name}: {} vs timewait list", c.state));
            }
            if (c.state == State::Listen)
                != (self.listeners.get(&c.service_id).map(|l| l.id) == Some(id))
            {
                return Err(format!("{name}: {} vs listen table", c.state));
            }
            if let Some(k) = c.remote_key {
                if self.remote_ids.get(&k) != Some(&id) {
                    return Err(format!("{name}: remote id {k:x?} not registered"));
                }
            }
            if let Some(k) = c.qpn_key {
                if self.remote_qpns.get(&k) != Some(&id) {
                    return Err(format!("{name}: remote QPN {k:x?} not registered"));
                }
                if c.state == State::Timewait {
                    return Err(format!("{name}: remote QPN kept in TIMEWAIT"));
                }
            }
            if let Some(k) = c.sidr_key {
                if self.sidr_remote.get(&k) != Some(&id) || c.state != State::SidrReqRcvd {
                    return Err(format!("{name}: SIDR key {k:x?} in {}", c.state));
                }
            }
            let needs_remote = matches!(
                c.state,
                State::ReqRcvd
                    | State::MraReqSent
                    | State::RepSent
                    | State::MraRepRcvd
                    | State::RepRcvd
                    | State::MraRepSent
                    | State::DreqSent
                    | State::DreqRcvd
            ) || c.state.is_established();
            if needs_remote && (c.remote_key.is_none() || c.qpn_key.is_none()) {
                return Err(format!("{name}: {} without remote tables", c.state));
            }
            if matches!(c.state, State::ReqSent | State::MraReqRcvd)
                && (c.remote_key.is_some() || c.qpn_key.is_some())
            {
                return Err(format!("{name}: {} with remote entries", c.state));
            }
        }
        if on_wire != self.in_flight || self.in_flight > self.window() {
            return Err(format!(
                "{on_wire} requests on the wire but {} counted (window {})",
                self.in_flight,
                self.window()
            ));
        }
        if waiting != self.waiting.len() {
            return Err(format!(
                "{} requests in line but {waiting} CEPs wait",
                self.waiting.len()
            ));
        }
        if !self.waiting.is_empty() && self.in_flight < self.window() {
            return Err(format!(
                "{} requests wait with {} of {} places taken",
                self.waiting.len(),
                self.in_flight,
                self.window()
            ));
        }
        if armed != self.timers.len() {
            return Err(format!(
                "{} timers armed but {armed} CEPs own one",
                self.timers.len()
            ));
        }
        for (&sid, l) in &self.listeners {
            let id = l.id;
            match self.conns.get(id) {
                Some(c) if c.state == State::Listen && c.service_id == sid => {}
                _ => return Err(format!("listen entry {sid:#x} -> {id:#x} is stale")),
            }
            let held = queued.remove(&id).unwrap_or(0);
            if l.queued != held {
                return Err(format!(
                    "listener {id:#x} counts {} queued requests but holds {held}",
                    l.queued
                ));
            }
        }
        // What is left counts for listeners that are gone: harmless (their
        // requests live on), but nothing counts them.
        for (k, &id) in &self.remote_ids {
            match self.conns.get(id) {
                Some(c) if c.remote_key == Some(*k) => {}
                _ => return Err(format!("remote id entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for (k, &id) in &self.remote_qpns {
            match self.conns.get(id) {
                Some(c) if c.qpn_key == Some(*k) => {}
                _ => return Err(format!("remote QPN entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for (k, &id) in &self.sidr_remote {
            match self.conns.get(id) {
                Some(c) if c.sidr_key == Some(*k) => {}
                _ => return Err(format!("SIDR entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for &id in &self.timewait {
            if self.conns.get(id).map(|c| c.state) != Some(State::Timewait) {
                return Err(format!("timewait entry {id:#x} is not in TIMEWAIT"));
            }
        }
        Ok(())
    }
}
