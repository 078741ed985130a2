//! Handles of a soft HCA's completion queues, shared receive queues and
//! address vectors.

use crate::cq::CqInner;
use crate::hca_core::Charge;
use crate::identity::Identity;
use crate::node::FabricInner;
use crate::qp::SrqInner;
use al::sync::Arc;
use al::Result;
use provider::{AvAttr, CqArm, RecvWr, Wc};

/// A completion queue.
pub struct SoftCq {
    pub(crate) inner: Arc<CqInner>,
    /// Its place in the HCA's `max_cq` (given back when the handle drops;
    /// QPs may keep the queue itself alive a little longer).
    pub(crate) _charge: Charge,
}

impl std::fmt::Debug for SoftCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftCq")
            .field("len", &self.inner.len())
            .finish()
    }
}

impl SoftCq {
    /// Move up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.inner.poll(out)
    }
    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        let mut wc = [Wc::default()];
        (self.inner.poll(&mut wc) == 1).then_some(wc[0])
    }
    /// Request a notification (once) for the next (solicited) completion.
    pub fn arm(&self, arm: CqArm) {
        self.inner.arm(arm)
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Completions lost to overflow so far.
    pub fn lost(&self) -> u64 {
        self.inner.lost()
    }
}

/// A shared receive queue.
pub struct SoftSrq {
    pub(crate) inner: Arc<SrqInner>,
    pub(crate) fabric: Arc<FabricInner>,
    /// Its place in the HCA's `max_srq`.
    pub(crate) _charge: Charge,
}

impl std::fmt::Debug for SoftSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftSrq").field("len", &self.len()).finish()
    }
}

impl SoftSrq {
    /// Post receives.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let mut wake = false;
        let r = self.inner.post(wrs, &mut wake);
        if wake {
            // Senders held by an RNR NAK from a QP of this SRQ look again.
            let me = &self.inner;
            self.fabric
                .wake_rnr_waiters(|d| d.srq.as_ref().is_some_and(|s| Arc::ptr_eq(s, me)));
        }
        r
    }
    /// Receives waiting.
    pub fn len(&self) -> usize {
        self.inner.q.lock().wrs.len()
    }
    /// Whether no receive waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An address vector.
#[derive(Debug)]
pub struct SoftAv {
    /// Its place in the HCA's `max_av`.
    pub(crate) _charge: Charge,
    pub(crate) attr: AvAttr,
    pub(crate) pd: Identity,
}

impl SoftAv {
    /// The attributes.
    pub fn attr(&self) -> &AvAttr {
        &self.attr
    }
}
