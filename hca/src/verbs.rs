//! Verbs objects in the access-layer handle tables: CA, PD, CQ, MR, SRQ, AV.
//!
//! Each object is an [`al::Obj`] whose body wraps the provider's object, so
//! it gets the common lifecycle: a typed generational handle, a parent that
//! it keeps alive (PD, CQ -> CA; MR, SRQ, AV -> PD), cascading non-blocking
//! destroy, and a destroy callback once the provider resource is released.
//!
//! ```text
//! AL ── CA ─┬─ PD ─┬─ MR
//!           │      ├─ SRQ  <── QPs receive through it
//!           │      ├─ AV
//!           │      └─ QP (qp crate)
//!           └─ CQ  <── QPs complete into it
//! ```
//!
//! Destroying a CQ or an SRQ that QPs are still bound to fails with
//! `ResourceBusy` (as IBAL documents); a QP stays bound until it is fully
//! destroyed. A parent's cascade (CA close, PD destroy, AL close) destroys
//! regardless: the QPs go in the same cascade, and each QP keeps the
//! provider queues it uses alive until it is gone.
//!
//! Completion and asynchronous-event callbacks run on the AL's callback
//! executor, never on the thread that produced the completion and never
//! under a lock; each holds a reference to its CQ while it runs.

use std::fmt;

use al::sync::atomic::{AtomicUsize, Ordering};
use al::sync::Arc;
use al::{create, post_callback, AlInstance, Error, Handle, Kind, Obj, Object, Result};

use crate::any::AnyProvider;
use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::{
    Access, AsyncEvent, AvAttr, CqArm, CqInit, Device, DeviceAttr, PortAttr, RecvWr, SrqInit, Wc,
};

/// The device type the object layer drives: an enum over every built-in
/// provider ([`crate::any`]), so CAs of different providers live side by
/// side in one AL.
pub type Dev = crate::any::AnyDevice;

/// The provider's protection domain type.
pub type DevPd = <Dev as Device>::Pd;
/// The provider's completion queue type.
pub type DevCq = <Dev as Device>::Cq;
/// The provider's memory region type.
pub type DevMr = <Dev as Device>::Mr;
/// The provider's SRQ type.
pub type DevSrq = <Dev as Device>::Srq;
/// The provider's address vector type.
pub type DevAv = <Dev as Device>::Av;

/// Called on the AL executor when an armed CQ has a completion.
pub type CompletionCallback = std::sync::Arc<dyn Fn(Handle<Cq>) + Send + Sync>;
/// Called on the AL executor for a CQ's asynchronous events (overflow).
pub type CqEventCallback = std::sync::Arc<dyn Fn(Handle<Cq>, AsyncEvent) + Send + Sync>;

// ---------------------------------------------------------------- bindings --

/// How many QPs use a CQ or SRQ, and whether it is closed to new ones: one
/// atomic word, so "no QP bound" and "closed" are decided together.
#[derive(Default)]
pub struct Bindings(AtomicUsize);

const CLOSED: usize = 1 << (usize::BITS - 1);

impl Bindings {
    /// Record one more QP; fails once the object is being destroyed.
    pub fn bind(&self, what: &'static str) -> Result<()> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return Err(Error::invalid_state(format!(
                    "the {what} is being destroyed"
                )));
            }
            match self
                .0
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Forget one QP.
    pub fn unbind(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// QPs bound now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire) & !CLOSED
    }

    /// Close if no QP is bound; else `ResourceBusy`.
    fn close(&self, what: &'static str) -> Result<()> {
        match self
            .0
            .compare_exchange(0, CLOSED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(cur) if cur & CLOSED != 0 => Ok(()),
            Err(cur) => Err(Error::busy(format!(
                "{} QP(s) still use this {what}",
                cur & !CLOSED
            ))),
        }
    }
}

impl fmt::Debug for Bindings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bound", self.count())
    }
}

// --------------------------------------------------------------------- CA --

/// An opened channel adapter.
pub struct Ca {
    device: Dev,
    attr: DeviceAttr,
}

impl Object for Ca {
    const KIND: Kind = Kind::CA;
    al::object_table!(Ca);

    /// `dev NAME node-guid 0x..`, for a snapshot.
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.text("dev", obj.attr.name.clone())
            .hex("node-guid", obj.attr.node_guid);
    }
}

impl Ca {
    /// The provider device.
    pub fn device(&self) -> &Dev {
        &self.device
    }
    /// Device attributes (as of open).
    pub fn attr(&self) -> &DeviceAttr {
        &self.attr
    }
    /// Current attributes of port `port` (1-based).
    pub fn port(&self, port: u8) -> Result<PortAttr> {
        self.device.query_port(port)
    }
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("name", &self.attr.name)
            .field("node_guid", &format_args!("{:#018x}", self.attr.node_guid))
            .finish()
    }
}

/// Open the device with node GUID `guid` of `provider` in `al`.
pub fn open_ca<P: AnyProvider + ?Sized>(
    al: &Arc<AlInstance>,
    provider: &P,
    guid: u64,
) -> Result<Handle<Ca>> {
    let obj = create(al, None, |_| {
        let device = provider.open_any(guid)?;
        let attr = device.query();
        Ok(Ca { device, attr })
    })?;
    Ok(obj.handle())
}

// --------------------------------------------------------------------- PD --

/// A protection domain.
pub struct Pd {
    ca: Arc<Obj<Ca>>,
    pd: DevPd,
}

impl Object for Pd {
    const KIND: Kind = Kind::PD;
    al::object_table!(Pd);
}

impl Pd {
    /// The CA it belongs to.
    pub fn ca(&self) -> &Arc<Obj<Ca>> {
        &self.ca
    }
    /// The provider PD.
    pub fn provider(&self) -> &DevPd {
        &self.pd
    }
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd").field("ca", &self.ca.handle()).finish()
    }
}

/// Allocate a protection domain on `ca`.
pub fn alloc_pd(al: &Arc<AlInstance>, ca: Handle<Ca>) -> Result<Handle<Pd>> {
    let ca = al.resolve_live(ca)?;
    let obj = create(al, Some(ca.core()), |_| {
        Ok(Pd {
            pd: ca.device.alloc_pd()?,
            ca: ca.clone(),
        })
    })?;
    Ok(obj.handle())
}

// --------------------------------------------------------------------- CQ --

/// A completion queue.
pub struct Cq {
    ca: Arc<Obj<Ca>>,
    cq: DevCq,
    capacity: u32,
    bindings: Bindings,
    on_completion: Option<CompletionCallback>,
    on_event: Option<CqEventCallback>,
}

impl Object for Cq {
    const KIND: Kind = Kind::CQ;
    al::object_table!(Cq);

    /// `cqe DEPTH bindings N`: its depth, as `rdma res show cq`, and the
    /// QPs' bindings to it (a QP that sends and receives on it counts twice).
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.num("cqe", obj.capacity)
            .num("bindings", obj.bindings.count() as u64);
    }

    fn check_destroy(obj: &Obj<Self>) -> Result<()> {
        obj.bindings.close("CQ")
    }
}

impl Cq {
    /// The CA it belongs to.
    pub fn ca(&self) -> &Arc<Obj<Ca>> {
        &self.ca
    }
    /// The provider CQ.
    pub fn provider(&self) -> &DevCq {
        &self.cq
    }
    /// QPs bound to it.
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }
    /// Number of entries.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("capacity", &self.capacity)
            .field("bindings", &self.bindings)
            .finish()
    }
}

/// Create a completion queue of `capacity` entries on `ca`.
///
/// `on_completion` runs on the AL executor after [`arm_cq`] when a
/// completion arrives; `on_event` for asynchronous errors (overflow).
pub fn create_cq(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    capacity: u32,
    on_completion: Option<CompletionCallback>,
    on_event: Option<CqEventCallback>,
) -> Result<Handle<Cq>> {
    let ca = al.resolve_live(ca)?;
    let obj = create(al, Some(ca.core()), |core| {
        let h: Handle<Cq> = Handle::from_raw(core.handle());
        // The provider calls these on the thread that produced the event;
        // they only find the CQ by handle and post to the executor, holding
        // a reference across the user's callback. After destroy the lookup
        // fails and the event is dropped.
        let completion_hook = std::sync::Arc::new(move || {
            if let Ok(r) = Cq::table().get(h.raw()) {
                if r.on_completion.is_some() {
                    post_callback(&r.to_arc(), |cq| {
                        if let Some(cb) = &cq.on_completion {
                            cb(cq.handle());
                        }
                    });
                }
            }
        });
        let event_hook = std::sync::Arc::new(move |event: AsyncEvent| {
            tracing::warn!(target: "ibal::hca", cq = ?h, event = ?event, "asynchronous error");
            if let Ok(r) = Cq::table().get(h.raw()) {
                if r.on_event.is_some() {
                    post_callback(&r.to_arc(), move |cq| {
                        if let Some(cb) = &cq.on_event {
                            cb(cq.handle(), event);
                        }
                    });
                }
            }
        });
        let cq = ca.device.create_cq(CqInit {
            capacity,
            on_completion: Some(completion_hook),
            on_async_error: Some(event_hook),
        })?;
        Ok(Cq {
            ca: ca.clone(),
            cq,
            capacity,
            bindings: Bindings::default(),
            on_completion,
            on_event,
        })
    })?;
    Ok(obj.handle())
}

/// Move up to `out.len()` completions into `out`; returns how many.
pub fn poll_cq(al: &AlInstance, cq: Handle<Cq>, out: &mut [Wc]) -> Result<usize> {
    let r = al.resolve(cq)?;
    r.ca.device.poll_cq(&r.cq, out)
}

/// Request the completion callback for the next (or next solicited)
/// completion.
pub fn arm_cq(al: &AlInstance, cq: Handle<Cq>, arm: CqArm) -> Result<()> {
    let r = al.resolve(cq)?;
    r.ca.device.arm_cq(&r.cq, arm)
}

// --------------------------------------------------------------------- MR --

/// A memory region.
pub struct Mr {
    pd: Arc<Obj<Pd>>,
    mr: DevMr,
    lkey: u32,
    rkey: u32,
    len: usize,
    buffer: Option<RegisteredBuffer>,
}

impl Object for Mr {
    const KIND: Kind = Kind::MR;
    al::object_table!(Mr);

    /// `lkey 0x.. rkey 0x.. mrlen N`, as `rdma res show mr`.
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.hex("lkey", obj.lkey)
            .hex("rkey", obj.rkey)
            .num("mrlen", obj.len as u64);
    }
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Registered length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The registered buffer (for buffer-backed MRs).
    pub fn buffer(&self) -> Option<&RegisteredBuffer> {
        self.buffer.as_ref()
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<Obj<Pd>> {
        &self.pd
    }
    /// The provider MR.
    pub fn provider(&self) -> &DevMr {
        &self.mr
    }
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("len", &self.len)
            .finish()
    }
}

/// Register `len` bytes of `buf` from `offset` in `pd`, addressed from
/// `iova`. The buffer stays shared with the caller, who reads and writes it
/// through its methods while the HCA does the same: no byte outside the
/// registered range is ever touched.
pub fn register_mr(
    al: &Arc<AlInstance>,
    pd: Handle<Pd>,
    buf: &RegisteredBuffer,
    offset: usize,
    len: usize,
    iova: u64,
    access: Access,
) -> Result<Handle<Mr>> {
    let pd = al.resolve_live(pd)?;
    let obj = create(al, Some(pd.core()), |_| {
        let device = &pd.ca.device;
        let mr = device.register_mr(&pd.pd, buf, offset, len, iova, access)?;
        let (lkey, rkey) = device.mr_keys(&mr);
        Ok(Mr {
            pd: pd.clone(),
            mr,
            lkey,
            rkey,
            len,
            buffer: Some(buf.clone()),
        })
    })?;
    Ok(obj.handle())
}

/// Register caller-managed memory (zero copy). The contract was accepted
/// when the [`RawRegion`] was built (`unsafe`): the memory stays valid and
/// untouched by safe code until the MR is gone (its destroy callback ran).
pub fn register_region(
    al: &Arc<AlInstance>,
    pd: Handle<Pd>,
    region: RawRegion,
    access: Access,
) -> Result<Handle<Mr>> {
    let pd = al.resolve_live(pd)?;
    let len = region.len();
    let obj = create(al, Some(pd.core()), |_| {
        let device = &pd.ca.device;
        let mr = device.register_region(&pd.pd, region, access)?;
        let (lkey, rkey) = device.mr_keys(&mr);
        Ok(Mr {
            pd: pd.clone(),
            mr,
            lkey,
            rkey,
            len,
            buffer: None,
        })
    })?;
    Ok(obj.handle())
}

// -------------------------------------------------------------------- SRQ --

/// A shared receive queue.
pub struct Srq {
    pd: Arc<Obj<Pd>>,
    srq: DevSrq,
    bindings: Bindings,
}

impl Object for Srq {
    const KIND: Kind = Kind::SRQ;
    al::object_table!(Srq);

    /// `bindings N`: the QPs receiving through it.
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.num("bindings", obj.bindings.count() as u64);
    }

    fn check_destroy(obj: &Obj<Self>) -> Result<()> {
        obj.bindings.close("SRQ")
    }
}

impl Srq {
    /// The provider SRQ.
    pub fn provider(&self) -> &DevSrq {
        &self.srq
    }
    /// QPs bound to it.
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<Obj<Pd>> {
        &self.pd
    }
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("bindings", &self.bindings)
            .finish()
    }
}

/// Create a shared receive queue in `pd`.
pub fn create_srq(al: &Arc<AlInstance>, pd: Handle<Pd>, init: SrqInit) -> Result<Handle<Srq>> {
    let pd = al.resolve_live(pd)?;
    let obj = create(al, Some(pd.core()), |_| {
        Ok(Srq {
            srq: pd.ca.device.create_srq(&pd.pd, init)?,
            pd: pd.clone(),
            bindings: Bindings::default(),
        })
    })?;
    Ok(obj.handle())
}

/// Post receive work requests to an SRQ.
pub fn post_srq_recv(al: &AlInstance, srq: Handle<Srq>, wrs: &[RecvWr<'_>]) -> Result<()> {
    let r = al.resolve(srq)?;
    r.core().check_live()?;
    r.pd.ca.device.post_srq_recv(&r.srq, wrs)
}

// --------------------------------------------------------------------- AV --

/// An address vector.
pub struct Av {
    pd: Arc<Obj<Pd>>,
    av: DevAv,
    attr: AvAttr,
}

impl Object for Av {
    const KIND: Kind = Kind::AV;
    al::object_table!(Av);
}

impl Av {
    /// The provider AV (what a UD send names).
    pub fn provider(&self) -> &DevAv {
        &self.av
    }
    /// The attributes it was created with.
    pub fn attr(&self) -> &AvAttr {
        &self.attr
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<Obj<Pd>> {
        &self.pd
    }
}

impl fmt::Debug for Av {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Av").field("attr", &self.attr).finish()
    }
}

/// Create an address vector in `pd`.
pub fn create_av(al: &Arc<AlInstance>, pd: Handle<Pd>, attr: AvAttr) -> Result<Handle<Av>> {
    let pd = al.resolve_live(pd)?;
    let obj = create(al, Some(pd.core()), |_| {
        Ok(Av {
            av: pd.ca.device.create_av(&pd.pd, &attr)?,
            pd: pd.clone(),
            attr,
        })
    })?;
    Ok(obj.handle())
}

/// Create an address vector in `pd` back to the sender of a received UD
/// datagram (`ibv_create_ah_from_wc`): [`AvAttr::from_wc`] on the
/// completion and the first `GRH_SIZE` bytes of its receive buffer
/// (`grh`), sent from `port`, whose GID table index is the one of the GID
/// the datagram was sent to (0 when none matches, or without a GRH).
pub fn create_av_from_wc(
    al: &Arc<AlInstance>,
    pd: Handle<Pd>,
    wc: &Wc,
    grh: &[u8],
    port: u8,
) -> Result<Handle<Av>> {
    let mut attr = AvAttr::from_wc(wc, grh, port)?;
    if let Some(g) = attr.grh.as_mut() {
        let ours = provider::ReceivedHeader::parse(grh)?.dgid;
        let table = al.resolve_live(pd)?.ca.port(port)?.gid_table;
        let index = table.iter().position(|gid| *gid == ours).unwrap_or(0);
        g.sgid_index = u8::try_from(index).unwrap_or(0);
    }
    create_av(al, pd, attr)
}
