//! The time stamps the CM callbacks take of every connection and probe,
//! and the active side's handler that takes them.

use std::collections::HashMap;
use std::sync::{Arc as StdArc, Condvar, Mutex};
use std::time::Instant;

use al::{AlInstance, Handle};
use cep::cm::{self, Cep, CmHandler};
use cep::proto::Event;
use qp::Qp;

use super::config::WAIT;
use crate::BenchResult;

/// Instants of one connection (or probe), stamped in the callbacks.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Times {
    pub(super) start: Option<Instant>,
    /// The listener's request callback ran.
    pub(super) request: Option<Instant>,
    /// The active side's `ReplyReceived` callback ran.
    pub(super) reply: Option<Instant>,
    pub(super) active_established: Option<Instant>,
    pub(super) passive_established: Option<Instant>,
    pub(super) rejected: Option<Instant>,
}

impl Times {
    pub(super) fn established(&self) -> Option<Instant> {
        Some(self.active_established?.max(self.passive_established?))
    }
}

#[derive(Default)]
pub(super) struct TrackState {
    pub(super) slots: Vec<Times>,
    /// Active QPN -> (slot, the passive QP reserved for it).
    pub(super) reserved: HashMap<u32, (usize, Handle<Qp>)>,
    /// Passive CEP -> slot.
    pub(super) passive: HashMap<Handle<Cep>, usize>,
    /// Connections established on both sides.
    pub(super) completed: usize,
    /// Probes rejected.
    pub(super) rejected: usize,
    pub(super) errors: Vec<String>,
}

/// What the callbacks record and the main thread waits on. Only a finished
/// connection, a rejection or an error wakes the main thread.
#[derive(Default)]
pub(super) struct Tracker {
    pub(super) state: Mutex<TrackState>,
    pub(super) changed: Condvar,
}

impl Tracker {
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut TrackState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    pub(super) fn error(&self, e: String) {
        self.with(|s| s.errors.push(e));
        self.changed.notify_all();
    }

    pub(super) fn established(&self, slot: usize, active: bool, at: Instant) {
        let done = self.with(|s| {
            let t = &mut s.slots[slot];
            if active {
                t.active_established = Some(at);
            } else {
                t.passive_established = Some(at);
            }
            let done = t.established().is_some();
            if done {
                s.completed += 1;
            }
            done
        });
        if done {
            self.changed.notify_all();
        }
    }

    pub(super) fn rejected(&self, slot: usize, at: Instant) {
        self.with(|s| {
            s.slots[slot].rejected = Some(at);
            s.rejected += 1;
        });
        self.changed.notify_all();
    }

    /// Whether `done` holds; an error a callback reported is an error.
    pub(super) fn check(&self, done: impl Fn(&TrackState) -> bool) -> BenchResult<bool> {
        self.with(|s| match s.errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(done(s)),
        })
    }

    /// Wait until `done` holds (or a callback reported an error).
    pub(super) fn wait(&self, what: &str, done: impl Fn(&TrackState) -> bool) -> BenchResult<()> {
        let deadline = Instant::now() + WAIT;
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(e) = st.errors.first() {
                return Err(e.clone());
            }
            if done(&st) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            st = self.changed.wait_timeout(st, deadline - now).unwrap().0;
        }
    }
}

pub(super) fn active_handler(
    inst: StdArc<AlInstance>,
    track: StdArc<Tracker>,
    slot: usize,
) -> CmHandler {
    StdArc::new(move |cep, ev| {
        let now = Instant::now();
        match ev {
            Event::ReplyReceived { .. } => {
                track.with(|s| s.slots[slot].reply = Some(now));
                if let Err(e) = cm::rtu(&inst, cep, &[]) {
                    track.error(format!("connection {slot}: rtu failed: {e}"));
                }
            }
            Event::Established { .. } => track.established(slot, true, now),
            Event::Rejected { reason, .. } => {
                let probe = track.with(|s| s.slots[slot].request.is_none());
                if probe {
                    track.rejected(slot, now);
                } else {
                    track.error(format!("connection {slot} was rejected: {reason:?}"));
                }
            }
            Event::Timeout { .. } => track.error(format!("connection {slot} timed out")),
            _ => {}
        }
    })
}
