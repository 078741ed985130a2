//! A completion queue as a [`Stream`] of work completions.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use futures_core::stream::{FusedStream, Stream};

use al::sync::{Arc, Mutex};
use al::{AlInstance, Error, Handle, Result};
use hca::verbs::{self, Ca, CompletionCallback, Cq};
use provider::{CqArm, Wc};

use super::wake::park;

/// What the CQ's completion callback and the stream share.
#[derive(Default)]
struct CqShared {
    state: Mutex<CqState>,
}

#[derive(Default)]
struct CqState {
    /// The task of the stream waiting for a completion.
    waker: Option<Waker>,
    /// A [`CqStream`] is open (one at a time: two would steal each other's
    /// completions and wake-ups).
    streaming: bool,
}

impl CqShared {
    fn wake(&self) {
        let waker = self.state.lock().waker.take();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Held only by the CQ's completion callback, so it drops with the CQ
/// object (explicit destroy, a parent's cascade or AL close): the waiting
/// stream is woken and finds the CQ gone.
struct CqGone(Arc<CqShared>);

impl Drop for CqGone {
    fn drop(&mut self) {
        self.0.wake();
    }
}

/// A completion queue created with a completion callback that wakes a
/// [`CqStream`]. Made by
/// [`create_cq_async`](super::AsyncCaMethods::create_cq_async).
///
/// The CQ is an ordinary CQ object: give [`AsyncCq::handle`] to
/// [`QpCreate`](crate::verbs::QpCreate), and destroy it like any other
/// (explicitly, with its CA, or at AL close). This value only names it;
/// dropping it destroys nothing. Cloning it is cheap.
#[derive(Clone)]
pub struct AsyncCq {
    al: Arc<AlInstance>,
    cq: Handle<Cq>,
    shared: Arc<CqShared>,
}

impl AsyncCq {
    pub(super) fn create(al: &Arc<AlInstance>, ca: Handle<Ca>, capacity: u32) -> Result<Self> {
        let shared = Arc::new(CqShared::default());
        let gone = CqGone(shared.clone());
        let on_completion: CompletionCallback = std::sync::Arc::new(move |_cq| gone.0.wake());
        let cq = verbs::create_cq(al, ca, capacity, Some(on_completion), None)?;
        Ok(AsyncCq {
            al: al.clone(),
            cq,
            shared,
        })
    }

    /// The CQ's handle.
    pub fn handle(&self) -> Handle<Cq> {
        self.cq
    }

    /// A stream of the CQ's completions. One stream at a time: a second
    /// while the first lives fails with [`Error::InvalidState`]; so does a
    /// CQ that is gone ([`Error::InvalidHandle`]).
    pub fn stream(&self) -> Result<CqStream> {
        self.al.resolve(self.cq)?;
        let mut st = self.shared.state.lock();
        if st.streaming {
            return Err(Error::invalid_state(
                "this CQ already has a stream; drop it before opening another",
            ));
        }
        st.streaming = true;
        Ok(CqStream {
            al: self.al.clone(),
            cq: self.cq,
            shared: self.shared.clone(),
            done: false,
        })
    }
}

impl fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AsyncCq").field(&self.cq).finish()
    }
}

/// The completions of an [`AsyncCq`], in the order the CQ holds them.
///
/// Each poll takes one completion from the CQ. When there is none, the
/// stream registers its waker, arms the CQ for the next completion, and
/// polls once more before it returns `Pending`: a completion that arrived
/// between the first poll and the arm is found by the second, and one that
/// arrives after the arm fires the callback, which wakes the task. No busy
/// polling.
///
/// Items are `Ok(wc)` (a failed work request is an `Ok` with its status);
/// an error of the CQ itself (destroyed, by the application, its CA's
/// destroy or AL close) is yielded once as `Err`, after which the stream
/// ends. Dropping the stream unregisters its waker (a CQ armed at that time
/// fires its callback once more, into nothing) and lets a new stream be
/// opened; completions not taken stay in the CQ.
pub struct CqStream {
    al: Arc<AlInstance>,
    cq: Handle<Cq>,
    shared: Arc<CqShared>,
    done: bool,
}

impl CqStream {
    /// The CQ's handle.
    pub fn handle(&self) -> Handle<Cq> {
        self.cq
    }

    fn poll_one(&self) -> Result<Option<Wc>> {
        let mut wc = [Wc::default()];
        let n = verbs::poll_cq(&self.al, self.cq, &mut wc)?;
        Ok((n == 1).then_some(wc[0]))
    }

    fn finish(&mut self, e: Error) -> Poll<Option<Result<Wc>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }
}

impl Stream for CqStream {
    type Item = Result<Wc>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Wc>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // Poll, ...
        match this.poll_one() {
            Ok(Some(wc)) => return Poll::Ready(Some(Ok(wc))),
            Ok(None) => {}
            Err(e) => return this.finish(e),
        }
        // ... register the waker before arming (the callback may run at
        // once), arm, ...
        park(&mut this.shared.state.lock().waker, cx);
        if let Err(e) = verbs::arm_cq(&this.al, this.cq, CqArm::NextCompletion) {
            return this.finish(e);
        }
        // ... and poll again: what came before the arm fired nothing.
        match this.poll_one() {
            Ok(Some(wc)) => Poll::Ready(Some(Ok(wc))),
            Ok(None) => Poll::Pending,
            Err(e) => this.finish(e),
        }
    }
}

impl FusedStream for CqStream {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl Drop for CqStream {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        st.waker = None;
        st.streaming = false;
    }
}

impl fmt::Debug for CqStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqStream")
            .field("cq", &self.cq)
            .field("done", &self.done)
            .finish()
    }
}
