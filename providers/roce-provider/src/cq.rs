//! Completion queues, and the list of user hooks that run after every
//! provider lock is released.

use al::sync::atomic::{AtomicUsize, Ordering};
use std::collections::VecDeque;

use al::sync::Mutex;
use provider::{AsyncEvent, AsyncHook, CompletionHook, CqArm, Wc, WcStatus};

pub(crate) struct CqInner {
    /// The device that made it (a QP may only use its own device's CQs).
    pub(crate) device: u64,
    state: Mutex<CqState>,
    /// How many completions `state` holds, written under its lock: a
    /// poll of an empty CQ (a busy-polling application's every poll but
    /// one) reads it and returns without taking the lock.
    queued: AtomicUsize,
    on_completion: Option<CompletionHook>,
    on_async: Option<AsyncHook>,
}

struct CqState {
    /// Bounded by `cap`: a full CQ loses the completion and raises
    /// `CqOverflow`.
    q: VecDeque<Wc>,
    cap: usize,
    armed: Option<CqArm>,
    lost: u64,
}

impl CqInner {
    pub(crate) fn new(
        device: u64,
        cap: usize,
        on_completion: Option<CompletionHook>,
        on_async: Option<AsyncHook>,
    ) -> CqInner {
        CqInner {
            device,
            state: Mutex::new(CqState {
                q: VecDeque::with_capacity(cap),
                cap,
                armed: None,
                lost: 0,
            }),
            queued: AtomicUsize::new(0),
            on_completion,
            on_async,
        }
    }

    /// Add a completion; hooks to call go on `d`.
    pub(crate) fn push(&self, wc: Wc, d: &mut Deferred) {
        let mut s = self.state.lock();
        if s.q.len() >= s.cap {
            s.lost += 1;
            let lost = s.lost;
            drop(s);
            if let Some(h) = &self.on_async {
                d.events.push((h.clone(), AsyncEvent::CqOverflow { lost }));
            }
            return;
        }
        s.q.push_back(wc);
        crate::delay::point(crate::delay::Point::CqPushed);
        #[cfg(ibal_mutant = "cq_queued_outside_lock")]
        {
            // The mistake: the count published after the lock is given
            // up, so an arm and a lock-free re-poll fit in between.
            let fire = s.armed == Some(CqArm::NextCompletion);
            if fire {
                s.armed = None;
            }
            let len = s.q.len();
            drop(s);
            self.queued.store(len, Ordering::Release);
            if let (true, Some(h)) = (fire, &self.on_completion) {
                d.hooks.push(h.clone());
            }
            return;
        }
        #[cfg(not(ibal_mutant = "cq_queued_outside_lock"))]
        self.queued.store(s.q.len(), Ordering::Release);
        #[cfg_attr(ibal_mutant = "cq_queued_outside_lock", allow(unreachable_code))]
        let fire = match s.armed {
            Some(CqArm::NextCompletion) => true,
            Some(CqArm::Solicited) => wc.solicited || wc.status != WcStatus::Success,
            None => false,
        };
        if fire {
            s.armed = None;
            drop(s);
            if let Some(h) = &self.on_completion {
                d.hooks.push(h.clone());
            }
        }
    }

    pub(crate) fn poll(&self, out: &mut [Wc]) -> usize {
        // A completion pushed while this reads 0 is found by the next poll,
        // as it would be had it come just after this one.
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        crate::delay::point(crate::delay::Point::CqPollChecked);
        let mut s = self.state.lock();
        let n = out.len().min(s.q.len());
        for (slot, wc) in out.iter_mut().zip(s.q.drain(..n)) {
            *slot = wc;
        }
        #[cfg(not(ibal_mutant = "cq_poll_queued_outside_lock"))]
        self.queued.store(s.q.len(), Ordering::Release);
        #[cfg(ibal_mutant = "cq_poll_queued_outside_lock")]
        {
            // The mistake: the count published after the lock is given
            // up, over a push's newer one.
            let len = s.q.len();
            drop(s);
            self.queued.store(len, Ordering::Release);
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

/// User hooks collected under locks, run by [`Deferred::run`] with none
/// held.
#[derive(Default)]
pub(crate) struct Deferred {
    hooks: Vec<CompletionHook>,
    events: Vec<(AsyncHook, AsyncEvent)>,
}

impl Deferred {
    pub(crate) fn run(self) {
        // Most calls (every post and drive) have nothing to run.
        if self.hooks.is_empty() && self.events.is_empty() {
            return;
        }
        for h in self.hooks {
            h();
        }
        for (h, e) in self.events {
            h(e);
        }
    }
}
