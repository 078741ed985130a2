//! Completion queues and the deferred-work list that keeps every user
//! callback outside provider locks.

use std::collections::VecDeque;

use al::sync::{Arc, Mutex, MutexGuard};

use crate::provider::{AsyncEvent, AsyncHook, CompletionHook, CqArm, Wc, WcStatus};
use crate::soft::qp::QpInner;

pub(crate) struct CqInner {
    state: Mutex<CqState>,
    on_completion: Option<CompletionHook>,
    on_async: Option<AsyncHook>,
}

struct CqState {
    q: VecDeque<Wc>,
    cap: usize,
    armed: Option<CqArm>,
    lost: u64,
}

impl CqInner {
    pub(crate) fn new(
        cap: usize,
        on_completion: Option<CompletionHook>,
        on_async: Option<AsyncHook>,
    ) -> CqInner {
        CqInner {
            state: Mutex::new(CqState {
                q: VecDeque::with_capacity(cap),
                cap,
                armed: None,
                lost: 0,
            }),
            on_completion,
            on_async,
        }
    }

    /// Add a completion. `solicited` marks a receive whose sender set the
    /// solicited bit. Hooks to run are put on `d`.
    pub(crate) fn push(&self, wc: Wc, solicited: bool, d: &mut Deferred) {
        let mut p = self.begin_push();
        p.push(wc, solicited);
        p.finish(d);
    }

    /// Lock the CQ for a series of pushes (the batched send path holds it
    /// across a run of requests); [`CqPush::finish`] queues the hooks.
    pub(crate) fn begin_push(&self) -> CqPush<'_> {
        CqPush {
            cq: self,
            state: self.state.lock(),
            fire: false,
            lost: None,
        }
    }

    pub(crate) fn poll(&self, out: &mut [Wc]) -> usize {
        let mut s = self.state.lock();
        let n = out.len().min(s.q.len());
        for (slot, wc) in out.iter_mut().zip(s.q.drain(..n)) {
            *slot = wc;
        }
        n
    }

    pub(crate) fn arm(&self, arm: CqArm) {
        let mut s = self.state.lock();
        s.armed = match (s.armed, arm) {
            (Some(CqArm::NextCompletion), _) => Some(CqArm::NextCompletion),
            (_, a) => Some(a),
        };
    }

    pub(crate) fn len(&self) -> usize {
        self.state.lock().q.len()
    }

    pub(crate) fn lost(&self) -> u64 {
        self.state.lock().lost
    }
}

/// A CQ locked for pushing: each push applies the overflow and arming
/// rules; the hooks they call for are queued by [`CqPush::finish`] (or
/// lost if the push guard is dropped without it, which no caller does).
pub(crate) struct CqPush<'c> {
    cq: &'c CqInner,
    state: MutexGuard<'c, CqState>,
    fire: bool,
    /// The CQ's lost-completion count before and after this push series.
    lost: Option<(u64, u64)>,
}

impl CqPush<'_> {
    /// Add a completion (see [`CqInner::push`]).
    #[inline]
    pub(crate) fn push(&mut self, wc: Wc, solicited: bool) {
        let s = &mut *self.state;
        if s.q.len() >= s.cap {
            s.lost += 1;
            let first = self.lost.map_or(s.lost, |(first, _)| first);
            self.lost = Some((first, s.lost));
            return;
        }
        s.q.push_back(wc);
        let fire = match s.armed {
            Some(CqArm::NextCompletion) => true,
            Some(CqArm::Solicited) => solicited || wc.status != WcStatus::Success,
            None => false,
        };
        if fire {
            s.armed = None;
            self.fire = true;
        }
    }

    /// Unlock, and queue the completion hook (if an armed CQ fired) and
    /// one overflow event per lost completion (each with the running lost
    /// count, as single pushes report them) on `d`.
    pub(crate) fn finish(self, d: &mut Deferred) {
        let CqPush {
            cq,
            state,
            fire,
            lost,
        } = self;
        drop(state);
        if let (Some((first, last)), Some(h)) = (lost, &cq.on_async) {
            for lost in first..=last {
                d.events.push((h.clone(), AsyncEvent::CqOverflow { lost }));
            }
        }
        if fire {
            if let Some(h) = &cq.on_completion {
                d.notify(h.clone());
            }
        }
    }
}

/// Work collected under locks and run after they are released: user hooks
/// and QP error transitions (which need the QP's own locks).
#[derive(Default)]
pub(crate) struct Deferred {
    first: Option<CompletionHook>,
    more: Vec<CompletionHook>,
    events: Vec<(AsyncHook, AsyncEvent)>,
    pub(crate) errors: Vec<Arc<QpInner>>,
}

impl Deferred {
    pub(crate) fn new() -> Deferred {
        Deferred::default()
    }

    fn notify(&mut self, h: CompletionHook) {
        if self.first.is_none() {
            self.first = Some(h);
        } else {
            self.more.push(h);
        }
    }

    /// Run everything. Must be called with no provider lock held.
    pub(crate) fn run(mut self) {
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
