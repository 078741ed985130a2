//! Completion queues and the deferred-work list that keeps every user
//! callback outside provider locks.

use al::sync::{Mutex, MutexGuard};

use crate::deferred::{Deferred, EnterError};
use provider::{AsyncEvent, AsyncHook, CompletionHook, CqArm, Wc, WcStatus};

pub(crate) struct CqInner {
    /// The device that created it: a QP may only use CQs of its own device.
    pub(crate) device: crate::identity::Identity,
    state: Mutex<CqState>,
    on_completion: Option<CompletionHook>,
    on_async: Option<AsyncHook>,
}

struct CqState {
    q: WcRing,
    armed: Option<CqArm>,
    lost: u64,
}

/// The completions a CQ holds: a ring of its capacity, allocated when the
/// CQ is created, so pushing never allocates and polling copies whole runs.
struct WcRing {
    buf: Box<[Wc]>,
    head: usize,
    len: usize,
}

impl WcRing {
    fn new(cap: usize) -> WcRing {
        WcRing {
            buf: vec![Wc::default(); cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Append; false (and nothing stored) when full.
    #[inline]
    fn push(&mut self, wc: Wc) -> bool {
        let cap = self.buf.len();
        if self.len == cap {
            return false;
        }
        let mut i = self.head + self.len;
        if i >= cap {
            i -= cap;
        }
        self.buf[i] = wc;
        self.len += 1;
        true
    }

    /// Move the oldest entries into `out`; returns how many.
    fn pop_into(&mut self, out: &mut [Wc]) -> usize {
        let cap = self.buf.len();
        let n = out.len().min(self.len);
        if n == 0 {
            // An empty poll (the common case for a busy-polling consumer)
            // copies nothing.
            return 0;
        }
        let first = n.min(cap - self.head);
        out[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        out[first..n].copy_from_slice(&self.buf[..n - first]);
        self.head += n;
        if self.head >= cap {
            self.head -= cap;
        }
        self.len -= n;
        n
    }
}

impl CqInner {
    pub(crate) fn new(
        device: crate::identity::Identity,
        cap: usize,
        on_completion: Option<CompletionHook>,
        on_async: Option<AsyncHook>,
    ) -> CqInner {
        CqInner {
            device,
            state: Mutex::new(CqState {
                q: WcRing::new(cap),
                armed: None,
                lost: 0,
            }),
            on_completion,
            on_async,
        }
    }

    /// Add a completion. `solicited` marks a receive whose sender set the
    /// solicited bit. Hooks to run are put on `d`.
    pub(crate) fn push<Q: EnterError>(&self, wc: Wc, solicited: bool, d: &mut Deferred<Q>) {
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
        s.q.pop_into(out)
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
        if !s.q.push(wc) {
            s.lost += 1;
            let first = self.lost.map_or(s.lost, |(first, _)| first);
            self.lost = Some((first, s.lost));
            return;
        }
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
    pub(crate) fn finish<Q: EnterError>(self, d: &mut Deferred<Q>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64) -> Wc {
        Wc {
            wr_id: id,
            ..Wc::default()
        }
    }

    /// The ring against a `VecDeque` model: random pushes and partial
    /// pops across the wrap point, for several capacities (0 included).
    #[test]
    fn the_ring_keeps_order_and_capacity_across_wraps() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for cap in [0usize, 1, 2, 3, 7, 16] {
            let mut ring = WcRing::new(cap);
            let mut model = std::collections::VecDeque::new();
            let mut id = 0;
            for _ in 0..2000 {
                if next() % 3 != 0 {
                    id += 1;
                    let stored = ring.push(wc(id));
                    assert_eq!(stored, model.len() < cap);
                    if stored {
                        model.push_back(id);
                    }
                } else {
                    let mut out = vec![Wc::default(); (next() % 9) as usize];
                    let n = ring.pop_into(&mut out);
                    assert_eq!(n, out.len().min(model.len()));
                    for w in &out[..n] {
                        assert_eq!(Some(w.wr_id), model.pop_front());
                    }
                }
                assert_eq!(ring.len(), model.len());
            }
        }
    }
}
