//! The state one connection's futures share with its CEP's handler
//! ([`ConnShared`]): the handler records each event there and wakes the
//! task that waits on it. Below every future of a connection: `connect.rs`,
//! `conn.rs`, `disconnect.rs` and `listener.rs` use it.

use std::task::{Context, Waker};

use al::sync::{Arc, Mutex};
use al::{AlInstance, Error, Handle};
use cep::cm::{self, Cep, CmHandler};
use cep::proto::{Event, RejectOrigin, State, TimedOut};
use cep::wire::MessageRejected;

use super::wake::park;

/// What the CEP's handler tells the future waiting on the connection.
#[derive(Default)]
pub(super) struct ConnShared {
    state: Mutex<ConnState>,
}

#[derive(Default)]
pub(super) struct ConnState {
    waker: Option<Waker>,
    /// ESTABLISHED was reached.
    pub(super) established: bool,
    /// What ended the connection before it was established.
    pub(super) failed: Option<Error>,
    /// The CM ends the CEP by itself (REJ, timeout: it goes after
    /// timewait); otherwise a failed future must destroy it.
    pub(super) cm_ends: bool,
    /// A DREQ was sent or received.
    pub(super) disconnecting: bool,
    /// The CEP is released (its last event came) or gone.
    pub(super) released: bool,
    /// The peer's private data: the REP's (active side) or the REQ's
    /// (passive side).
    pub(super) peer_data: Vec<u8>,
    /// Private data of the RTU the handler sends (active side).
    pub(super) rtu_data: Vec<u8>,
}

impl ConnShared {
    pub(super) fn lock(&self) -> al::sync::MutexGuard<'_, ConnState> {
        self.state.lock()
    }

    /// Run `f` on the state, then wake the waiting task (outside the lock).
    fn update(&self, f: impl FnOnce(&mut ConnState)) {
        let waker = {
            let mut st = self.state.lock();
            f(&mut st);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Remember the task to wake (call with the state locked).
    pub(super) fn park(st: &mut ConnState, cx: &Context<'_>) {
        park(&mut st.waker, cx);
    }

    /// The CEP is gone without its `Released` event (destroyed by the
    /// application, a QP destroy or AL close).
    pub(super) fn gone(&self) {
        self.update(|st| {
            st.released = true;
            if !st.established && st.failed.is_none() {
                st.failed = Some(Error::Canceled(
                    "the connection endpoint was destroyed before the connection was established"
                        .into(),
                ));
                st.cm_ends = true;
            }
        });
    }

    /// One event of the CEP, on the AL executor.
    pub(super) fn on_event(&self, al: &AlInstance, cep: Handle<Cep>, ev: &Event) {
        match ev {
            Event::ReplyReceived { rep, .. } => {
                let rtu_data = {
                    let mut st = self.state.lock();
                    st.peer_data = rep.private_data.as_bytes().to_vec();
                    st.rtu_data.clone()
                };
                // The active side answers the REP (the QP goes to RTS);
                // ESTABLISHED follows.
                if let Err(e) = cm::rtu(al, cep, &rtu_data) {
                    // A REJ or a timeout that overtook this event is
                    // reported by its own event, next; anything else
                    // failed here, with the CEP still waiting for an
                    // answer (the future destroys it).
                    let waiting = al.resolve(cep).is_ok_and(|c| {
                        matches!(c.protocol_state(), Some(State::RepRcvd | State::MraRepSent))
                    });
                    if waiting {
                        self.fail(e, false);
                    }
                }
            }
            Event::Established { .. } => self.update(|st| st.established = true),
            Event::Rejected {
                reason,
                message,
                origin,
                ..
            } => {
                // A REJ of our LAP leaves an established connection alone.
                if *message == MessageRejected::Other && self.lock().established {
                    return;
                }
                let who = match origin {
                    RejectOrigin::Remote => "the peer",
                    RejectOrigin::Local => "this side",
                };
                let detail = format!(
                    "connection rejected by {who}: {reason:?} (REJ reason {}) of the {message:?}",
                    reason.code()
                );
                let e = match origin {
                    RejectOrigin::Remote => Error::RemoteError(detail.into()),
                    RejectOrigin::Local => Error::Other(detail.into()),
                };
                self.fail(e, true);
            }
            Event::Timeout { message, .. } => {
                let detail = match message {
                    TimedOut::Lap => return, // the connection stays up
                    TimedOut::Req => "no REP: the peer did not answer the REQ within its retries",
                    TimedOut::Rep => "no RTU: the peer did not answer the REP within its retries",
                    TimedOut::Answer => "the request waited too long for an answer",
                    TimedOut::SidrReq => "no SIDR reply",
                };
                self.fail(Error::Timeout(detail.into()), true);
            }
            Event::StaleConnection { .. } => self.fail(
                Error::invalid_state("the peer reports this connection as stale"),
                true,
            ),
            Event::DisconnectRequest { .. } => {
                // The peer disconnects: answer it (the CEP enters timewait
                // and is released after it).
                self.update(|st| st.disconnecting = true);
                let _ = cm::disconnect_reply(al, cep, &[]);
                self.fail(
                    Error::invalid_state(
                        "the peer disconnected before the connection was established",
                    ),
                    true,
                );
            }
            Event::Disconnected { .. } => self.update(|st| st.disconnecting = true),
            Event::Released { .. } => self.gone(),
            _ => {}
        }
    }

    /// The connection failed with `e` (if it was not established yet).
    fn fail(&self, e: Error, cm_ends: bool) {
        self.update(|st| {
            if !st.established && st.failed.is_none() {
                st.failed = Some(e);
                st.cm_ends = cm_ends;
            }
        });
    }
}

/// Held only by an active CEP's handler, so it drops with the CEP object.
struct ConnGone(Arc<ConnShared>);

impl Drop for ConnGone {
    fn drop(&mut self) {
        self.0.gone();
    }
}

/// The handler of an active CEP: every event into `shared`.
pub(super) fn active_handler(al: &Arc<AlInstance>, shared: &Arc<ConnShared>) -> CmHandler {
    let (al, gone) = (al.clone(), ConnGone(shared.clone()));
    std::sync::Arc::new(move |cep, ev| gone.0.on_event(&al, cep, ev))
}
