//! The provider interface: what the object layer calls to reach a channel
//! adapter, independent of which provider (soft, RoCEv2, rdma-core)
//! implements it.
//!
//! # Shape
//!
//! A [`Provider`] lists devices and opens them; a [`Device`] performs the
//! verbs. Each verbs object (PD, CQ, MR, SRQ, AV, QP) is an *associated type*
//! of the device: an owned value, destroyed by passing it back to the
//! matching `destroy_*`/`dealloc_*`/`deregister_*` call (dropping it has the
//! same effect). The object layer wraps these values in its own objects
//! (handle table, lifecycle) and is generic over the device type; a build
//! that must choose a provider at run time wraps the devices in an enum.
//! Associated types rather than boxed trait objects keep the data path free
//! of downcasts and virtual calls.
//!
//! Errors are [`al::Error`] with IBAL's meanings: a bad argument is
//! `InvalidParameter`, a verb in the wrong QP state `InvalidQpState`, a full
//! queue `InsufficientResources`, an unknown port `NotFound`.

use al::Result;

use crate::attrs::{Access, AvAttr, DeviceAttr, PortAttr};
use crate::buffer::{RawRegion, RegisteredBuffer};
use crate::qp_attr::{QpAttr, QpInit, QpModify};
use crate::work::{CqArm, RecvWr, SendWr, Wc};

/// Asynchronous events a provider raises.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A completion was lost because the CQ was full; the CQ is in error.
    CqOverflow {
        /// Number of completions lost so far.
        lost: u64,
    },
}

/// Called when an armed CQ gets a completion. Runs on whichever thread
/// produced the completion, with no provider lock held; it may call any
/// verb (re-arm, poll, post).
///
/// A `std` `Arc` even under the loom build: a hook is a plain callable,
/// not a synchronisation point, and loom's `Arc` cannot hold a `dyn`.
pub type CompletionHook = std::sync::Arc<dyn Fn() + Send + Sync>;
/// Called on an asynchronous error, with no provider lock held.
pub type AsyncHook = std::sync::Arc<dyn Fn(AsyncEvent) + Send + Sync>;

/// CQ creation parameters.
#[derive(Clone, Default)]
pub struct CqInit {
    /// Number of entries.
    pub capacity: u32,
    /// Completion-notification hook.
    pub on_completion: Option<CompletionHook>,
    /// Asynchronous-error hook (CQ overflow).
    pub on_async_error: Option<AsyncHook>,
}

impl std::fmt::Debug for CqInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqInit")
            .field("capacity", &self.capacity)
            .field("on_completion", &self.on_completion.is_some())
            .field("on_async_error", &self.on_async_error.is_some())
            .finish()
    }
}

/// SRQ creation parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInit {
    /// Maximum outstanding receive work requests.
    pub max_wr: u32,
    /// Maximum scatter entries per work request.
    pub max_sge: u32,
}

/// Identity of a device a provider offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Node GUID (what [`Provider::open`] takes).
    pub node_guid: u64,
}

/// A provider: a source of devices.
pub trait Provider: Send + Sync {
    /// The device type.
    type Device: Device;
    /// Provider name ("soft", "rdma").
    fn name(&self) -> &str;
    /// The devices present now.
    fn devices(&self) -> Vec<DeviceInfo>;
    /// Open the device with this node GUID (`NotFound` when absent).
    fn open(&self, node_guid: u64) -> Result<Self::Device>;
}

/// One channel adapter and its verbs.
///
/// Objects are owned values; `destroy_*` consumes them and dropping them
/// has the same effect. A child keeps what it needs of its parents alive
/// internally, so the provider never frees memory in use; the object layer
/// still enforces the IBAL order (children before parents).
pub trait Device: Send + Sync {
    /// Protection domain.
    type Pd: Send + Sync;
    /// Completion queue.
    type Cq: Send + Sync;
    /// Memory region.
    type Mr: Send + Sync;
    /// Shared receive queue.
    type Srq: Send + Sync;
    /// Address vector.
    type Av: Send + Sync;
    /// Queue pair.
    type Qp: Send + Sync;

    /// Device attributes.
    fn query(&self) -> DeviceAttr;
    /// Attributes of port `port` (1-based); `NotFound` for a bad number.
    fn query_port(&self, port: u8) -> Result<PortAttr>;

    /// Allocate a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd>;
    /// Free a protection domain.
    fn dealloc_pd(&self, pd: Self::Pd) -> Result<()>;

    /// Create a completion queue.
    fn create_cq(&self, init: CqInit) -> Result<Self::Cq>;
    /// Destroy a completion queue.
    fn destroy_cq(&self, cq: Self::Cq) -> Result<()>;
    /// Request a notification for the next (solicited) completion.
    fn arm_cq(&self, cq: &Self::Cq, arm: CqArm) -> Result<()>;
    /// Move up to `out.len()` completions into `out`; returns how many.
    fn poll_cq(&self, cq: &Self::Cq, out: &mut [Wc]) -> Result<usize>;

    /// Register `len` bytes of `buf` from `offset`; the MR's iova is `iova`.
    fn register_mr(
        &self,
        pd: &Self::Pd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Self::Mr>;
    /// Register caller-managed memory (see [`RawRegion::new`] for the
    /// contract, which was accepted when the region was built).
    fn register_region(&self, pd: &Self::Pd, region: RawRegion, access: Access)
        -> Result<Self::Mr>;
    /// The (lkey, rkey) pair of an MR.
    fn mr_keys(&self, mr: &Self::Mr) -> (u32, u32);
    /// Deregister: when this returns no access to the memory is in progress
    /// and none will start.
    fn deregister_mr(&self, mr: Self::Mr) -> Result<()>;

    /// Create a shared receive queue.
    fn create_srq(&self, pd: &Self::Pd, init: SrqInit) -> Result<Self::Srq>;
    /// Destroy a shared receive queue.
    fn destroy_srq(&self, srq: Self::Srq) -> Result<()>;
    /// Post receives to an SRQ.
    fn post_srq_recv(&self, srq: &Self::Srq, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// Create an address vector.
    fn create_av(&self, pd: &Self::Pd, attr: &AvAttr) -> Result<Self::Av>;
    /// Destroy an address vector.
    fn destroy_av(&self, av: Self::Av) -> Result<()>;

    /// Create an RC, UC or UD queue pair in RESET.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self::Cq, Self::Srq>) -> Result<Self::Qp>;
    /// Create port `port`'s GSI QP (QP1) in RESET. One per port at a time.
    fn create_gsi_qp(
        &self,
        pd: &Self::Pd,
        port: u8,
        init: &QpInit<'_, Self::Cq, Self::Srq>,
    ) -> Result<Self::Qp>;
    /// The QP number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// Modify a QP (state machine in [`crate::qp_state`]).
    fn modify_qp(&self, qp: &Self::Qp, m: &QpModify) -> Result<()>;
    /// Query a QP.
    fn query_qp(&self, qp: &Self::Qp) -> Result<QpAttr>;
    /// Bytes of host memory the provider holds for `qp` (its state, queues
    /// and table entries, as allocated), for sizing a deployment
    /// (`docs/scale.md`). The default knows only the handle's own size; a
    /// provider whose QP state lives elsewhere (a kernel, a NIC) counts
    /// what it can see.
    fn qp_footprint(&self, qp: &Self::Qp) -> usize {
        let _ = qp;
        std::mem::size_of::<Self::Qp>()
    }
    /// Destroy a QP.
    fn destroy_qp(&self, qp: Self::Qp) -> Result<()>;
    /// Post send work requests, in order. On error the requests before the
    /// failing one are posted, the rest are not; the error names the index.
    ///
    /// A request names its datagram destination's AV as `H` (the object
    /// layer uses its AV handles); `av_of(i)` is request `i`'s AV, resolved
    /// by the caller, and is asked for datagram QPs only. A connected QP's
    /// requests go through as they are: no copy, no lookup.
    fn post_send<'v, H>(
        &self,
        qp: &Self::Qp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v Self::Av>,
    ) -> Result<()>;
    /// Post receive work requests, with the same partial-failure rule.
    fn post_recv(&self, qp: &Self::Qp, wrs: &[RecvWr<'_>]) -> Result<()>;
}
