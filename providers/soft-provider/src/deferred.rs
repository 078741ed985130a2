//! Work collected under provider locks and run after they are released:
//! completion hooks, asynchronous events, and QP error transitions.
//!
//! Generic over the QP type (`Q`, the soft provider's `QpInner`), so that
//! the CQ below the QP can collect into it without naming the QP; the one
//! thing it asks of a QP is [`EnterError`].

use al::sync::Arc;
use provider::{AsyncEvent, AsyncHook, CompletionHook};

/// What a deferred error transition asks of a QP.
pub(crate) trait EnterError: Sized {
    /// Move to the error state (flushing), collecting follow-up work in `d`.
    fn enter_error(&self, d: &mut Deferred<Self>);
}

/// Work collected under locks and run after they are released: user hooks
/// and QP error transitions (which need the QP's own locks).
pub(crate) struct Deferred<Q> {
    pub(crate) first: Option<CompletionHook>,
    pub(crate) more: Vec<CompletionHook>,
    pub(crate) events: Vec<(AsyncHook, AsyncEvent)>,
    pub(crate) errors: Vec<Arc<Q>>,
}

impl<Q> Default for Deferred<Q> {
    fn default() -> Self {
        Deferred {
            first: None,
            more: Vec::new(),
            events: Vec::new(),
            errors: Vec::new(),
        }
    }
}

impl<Q: EnterError> Deferred<Q> {
    pub(crate) fn new() -> Self {
        Deferred::default()
    }

    pub(crate) fn notify(&mut self, h: CompletionHook) {
        if self.first.is_none() {
            self.first = Some(h);
        } else {
            self.more.push(h);
        }
    }

    /// Run everything. Must be called with no provider lock held.
    pub(crate) fn run(mut self) {
        // The common case on the data path: nothing was deferred.
        if self.first.is_none()
            && self.errors.is_empty()
            && self.more.is_empty()
            && self.events.is_empty()
        {
            return;
        }
        for qp in std::mem::take(&mut self.errors) {
            let mut d = Deferred::new();
            qp.enter_error(&mut d);
            d.run();
        }
        if let Some(h) = self.first.take() {
            h();
        }
        for h in self.more.drain(..) {
            h();
        }
        for (h, e) in self.events.drain(..) {
            h(e);
        }
    }
}
