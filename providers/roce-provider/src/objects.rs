//! The verbs objects a device hands out: PD, CQ, MR, SRQ, AV and QP. Each
//! holds its provider-side state and its place in the device's limits; an
//! MR's and a QP's drop take them out of the device's tables.

use al::sync::Arc;

use provider::AvAttr;

use crate::cq::CqInner;
use crate::limits::Charge;
use crate::mr::MrInner;
use crate::qp::{AvView, Dev, QpInner, SrqInner};

/// A protection domain.
#[derive(Debug)]
pub struct RocePd {
    pub(crate) id: u64,
    pub(crate) device: u64,
    pub(crate) _charge: Charge,
}

/// A completion queue.
pub struct RoceCq {
    pub(crate) inner: Arc<CqInner>,
    pub(crate) _charge: Charge,
}

impl std::fmt::Debug for RoceCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceCq")
            .field("len", &self.inner.len())
            .field("lost", &self.inner.lost())
            .finish()
    }
}

/// A memory region. Dropping it deregisters it: when the drop returns,
/// the provider no longer touches the memory.
pub struct RoceMr {
    pub(crate) inner: Arc<MrInner>,
    pub(crate) dev: Arc<Dev>,
}

impl std::fmt::Debug for RoceMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceMr")
            .field("iova", &format_args!("{:#x}", self.inner.iova))
            .field("len", &self.inner.len)
            .field("access", &self.inner.access)
            .finish()
    }
}

impl Drop for RoceMr {
    fn drop(&mut self) {
        self.dev.mrs.remove(self.inner.key);
        self.inner.mem.in_flight.remove_span(self.inner.key);
        self.inner.mem.invalidate();
    }
}

/// A shared receive queue.
pub struct RoceSrq {
    pub(crate) inner: Arc<SrqInner>,
    pub(crate) _charge: Charge,
}

impl std::fmt::Debug for RoceSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceSrq")
            .field("len", &self.inner.q.lock().wrs.len())
            .finish()
    }
}

/// An address vector (always with a GRH).
#[derive(Debug)]
pub struct RoceAv {
    pub(crate) attr: AvAttr,
    pub(crate) pd: u64,
    pub(crate) _charge: Charge,
}

/// A queue pair. Dropping it destroys it (outstanding work is discarded
/// without completions).
pub struct RoceQp {
    pub(crate) inner: Arc<QpInner>,
}

impl std::fmt::Debug for RoceQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceQp")
            .field("qpn", &self.inner.qpn)
            .field("type", &self.inner.qp_type)
            .finish()
    }
}

impl Drop for RoceQp {
    fn drop(&mut self) {
        self.inner.dev.qps.change(|qps| qps.remove(&self.inner.key));
        crate::delay::point(crate::delay::Point::QpRemoved);
        // The mistake: the QP only leaves the map; a feeder that found it
        // before keeps feeding it (and completing its work) after this.
        #[cfg(not(ibal_mutant = "qp_destroy_unmap_only"))]
        self.inner.destroy();
    }
}

impl AvView for RoceAv {
    #[inline]
    fn attr(&self) -> &AvAttr {
        &self.attr
    }

    #[inline]
    fn pd(&self) -> u64 {
        self.pd
    }
}
