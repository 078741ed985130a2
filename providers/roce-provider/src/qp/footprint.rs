//! What a QP holds in host memory (`Device::qp_footprint`,
//! `docs/scale.md`), counted as the system allocator allocates it.

use std::mem::size_of;

use al::footprint::{allocated, arc_bytes};

use super::lazy_deque::LazyDeque;
use super::QpInner;
use crate::mr::{Posted, RecvEntry};
use roce_transport::receive::QpFilter;

fn lazy_bytes<T>(d: &LazyDeque<T>) -> usize {
    d.capacity().map_or(0, |c| {
        allocated(size_of::<std::collections::VecDeque<T>>()) + nonzero(c * size_of::<T>())
    })
}

fn nonzero(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        allocated(n)
    }
}

impl QpInner {
    /// The QP's bytes: its state (with the transport's struct inline),
    /// the shared receive list and its entries, the receive stage's
    /// filter, the transport's queues and buffers, the lazily made SQD
    /// and READ queues, and its entry in the device's QP map (hashed,
    /// load factor 7/8).
    pub(crate) fn footprint(&self) -> usize {
        let (transport, held, responding) = {
            let core = self.core.lock();
            (
                core.t.as_ref().map_or(0, |t| t.heap_bytes()),
                lazy_bytes(&core.held),
                lazy_bytes(&core.responding),
            )
        };
        let posted = nonzero(self.rq.lock().wrs.capacity() * size_of::<RecvEntry>());
        arc_bytes::<QpInner>()
            + arc_bytes::<Posted>()
            + posted
            + arc_bytes::<QpFilter>()
            + transport
            + held
            + responding
            + (size_of::<(u32, al::sync::Arc<QpInner>)>() + 1) * 8 / 7
    }
}
