//! Posted receives as the MRs see them: the entries, the queue that owns
//! them, and the view the in-flight check walks (below `mr.rs`, which
//! notes posters, and `qp.rs`, which owns the queues).

use std::collections::VecDeque;

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::{Arc, Mutex};
use provider::buffer::for_providers::PostedQueue;
use provider::Sge;

/// A scatter list kept with a posted receive; four entries inline.
pub(crate) enum SgVec {
    /// The common case, one element: stored without the inline array's
    /// padding, so posting a receive writes 16 bytes of list, not 64.
    One(Sge),
    Inline(u8, [Sge; 4]),
    Heap(Box<[Sge]>),
}

impl SgVec {
    pub(crate) fn new(s: &[Sge]) -> SgVec {
        match s {
            [one] => SgVec::One(*one),
            _ if s.len() <= 4 => {
                let mut a = [Sge::default(); 4];
                a[..s.len()].copy_from_slice(s);
                SgVec::Inline(s.len() as u8, a)
            }
            _ => SgVec::Heap(s.into()),
        }
    }
    #[inline]
    pub(crate) fn as_slice(&self) -> &[Sge] {
        match self {
            SgVec::One(s) => std::slice::from_ref(s),
            SgVec::Inline(n, a) => &a[..*n as usize],
            SgVec::Heap(b) => b,
        }
    }
}

/// A posted receive.
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    pub(crate) sg: SgVec,
}

/// A queue of posted receives, shared with the memories it posts into:
/// their in-flight check scans its entries (`buffer/in_flight.rs`). It
/// holds nothing but its entries and plain state, so sharing it makes no
/// reference cycle.
pub(crate) struct Posted<Q> {
    q: Mutex<Q>,
    /// Set when its QP or SRQ ends; the memories then forget it.
    closed: AtomicBool,
}

impl<Q> Posted<Q> {
    pub(crate) fn new(q: Q) -> Arc<Posted<Q>> {
        Arc::new(Posted {
            q: Mutex::new(q),
            closed: AtomicBool::new(false),
        })
    }

    /// The queue has ended.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl<Q> std::ops::Deref for Posted<Q> {
    type Target = Mutex<Q>;
    #[inline]
    fn deref(&self) -> &Mutex<Q> {
        &self.q
    }
}

/// A queue whose entries are posted receives.
pub(crate) trait RecvEntries: Send + 'static {
    fn entries(&self) -> &VecDeque<RecvEntry>;
}

/// A shared receive queue as the memories it posts into hold it.
pub(crate) struct SharedPosted<Q>(pub(crate) Arc<Posted<Q>>);

impl<Q: RecvEntries> PostedQueue for SharedPosted<Q> {
    fn each_sge(&self, f: &mut dyn FnMut(&Sge)) {
        for e in self.0.q.lock().entries() {
            e.sg.as_slice().iter().for_each(&mut *f);
        }
    }
    fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }
    fn share(&self) -> Box<dyn PostedQueue> {
        Box::new(SharedPosted(self.0.clone()))
    }
    fn id(&self) -> usize {
        &*self.0 as *const Posted<Q> as usize
    }
}
