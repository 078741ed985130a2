//! What a listen's handlers, its [`Listener`](super::Listener) stream and
//! the [`Accept`](super::Accept) futures of its requests share
//! ([`ListenShared`]), and [`Passive`], the record of one passive CEP its
//! holder keeps. Below `connect.rs` (Accept) and `listener.rs`, which both
//! use it.

use std::collections::{HashMap, VecDeque};
use std::task::Waker;

use al::sync::{Arc, Mutex};
use al::{AlInstance, Handle};
use cep::cm::Cep;
use cep::proto::Event;

use super::conn_shared::ConnShared;

/// What the listen's handlers and the stream share.
#[derive(Default)]
pub(super) struct ListenShared {
    pub(super) state: Mutex<ListenState>,
}

#[derive(Default)]
pub(super) struct ListenState {
    pub(super) waker: Option<Waker>,
    /// Requests not yet taken by the stream.
    pub(super) queue: VecDeque<(Handle<Cep>, Arc<ConnShared>, Event)>,
    /// The stream was dropped: new requests are refused.
    pub(super) closed: bool,
    /// The listen object is gone: the stream ends once the queue is empty.
    pub(super) gone: bool,
    /// Every passive CEP of this listen still alive, for the event
    /// handler they share (a listen has one handler for all its CEPs).
    pub(super) conns: HashMap<Handle<Cep>, Arc<ConnShared>>,
}

impl ListenShared {
    pub(super) fn wake(&self, f: impl FnOnce(&mut ListenState)) {
        let waker = {
            let mut st = self.state.lock();
            f(&mut st);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub(super) fn conn(&self, cep: Handle<Cep>) -> Option<Arc<ConnShared>> {
        self.state.lock().conns.get(&cep).cloned()
    }
}

/// The listener's record of one of its passive CEPs, for whoever holds the
/// CEP: a CEP destroyed here gets no `Released` event, so its entry in
/// the shared handler's map is removed here.
pub(super) struct Passive(pub(super) Arc<ListenShared>);

impl Passive {
    /// Destroy the CEP (non-blocking; a CEP already gone is fine) and
    /// forget it.
    pub(super) fn destroy(&self, al: &AlInstance, cep: Handle<Cep>) {
        let _ = al.destroy(cep, None);
        self.forget(cep);
    }

    /// Forget a CEP that is gone without its `Released` event.
    pub(super) fn forget(&self, cep: Handle<Cep>) {
        self.0.state.lock().conns.remove(&cep);
    }
}
