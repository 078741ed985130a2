//! Public handles of the soft provider: HCA, PD, CQ, MR, SRQ, AV, QP.

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::Arc;
use al::{Error, Result};

use crate::cq::{CqInner, Deferred};
use crate::fabric::{
    new_identity, Charge, Counted, Fabric, FabricInner, HcaCore, HcaNode, Identity, GSI_KEY,
};
use crate::mr::MrInner;
use crate::qp::{QpInner, SrqInner, UdInfo, WrView, PSN_MASK};
use crate::{engine, fast};
use provider::buffer::for_providers::{memory_of, region_memory, Memory, Span};
use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, DeviceInfo, PortAttr, PortState, Provider,
    QpAttr, QpInit, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, SrqInit, Wc,
};

/// A soft HCA on a [`Fabric`]. Cloning gives another handle to the same
/// HCA.
#[derive(Clone)]
pub struct SoftHca {
    pub(crate) fabric: Arc<FabricInner>,
    pub(crate) node: Arc<HcaNode>,
}

impl SoftHca {
    /// Identifies this device among the open devices of the process (two
    /// handles to one soft HCA answer the same; HCAs of different fabrics
    /// differ even when their node GUIDs are equal). Stable while any handle
    /// to the HCA lives.
    pub fn instance_key(&self) -> usize {
        Arc::as_ptr(&self.node) as *const () as usize
    }
}

impl std::fmt::Debug for SoftHca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftHca")
            .field(
                "node_guid",
                &format_args!("{:#x}", self.node.core.attr.node_guid),
            )
            .finish()
    }
}

fn core_of(node: &HcaNode) -> &HcaCore {
    &node.core
}

impl SoftHca {
    fn core(&self) -> &HcaCore {
        core_of(&self.node)
    }

    fn check_pd(&self, pd: &SoftPd) -> Result<()> {
        if !std::ptr::eq(&*pd.core, self.core()) {
            return Err(Error::invalid_parameter("the PD belongs to another HCA"));
        }
        Ok(())
    }

    /// The fabric this HCA is on.
    pub fn fabric(&self) -> Fabric {
        Fabric {
            inner: self.fabric.clone(),
        }
    }

    /// Node GUID.
    pub fn node_guid(&self) -> u64 {
        self.core().attr.node_guid
    }

    /// How many PDs, CQs, QPs, SRQs, AVs and MRs the HCA holds now (what
    /// its limits are checked against; all 0 once every user is gone).
    pub fn usage(&self) -> crate::fabric::HcaUsage {
        self.core().usage()
    }

    /// Device attributes.
    pub fn query(&self) -> DeviceAttr {
        self.core().attr.clone()
    }

    /// Attributes of port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.core()
            .port(port)
            .map(|p| p.attr())
            .ok_or_else(|| Error::NotFound(format!("port {port}").into()))
    }

    /// Change a port's state (packets flow only between active ports).
    pub fn set_port_state(&self, port: u8, state: PortState) -> Result<()> {
        self.core()
            .port(port)
            .ok_or_else(|| Error::NotFound(format!("port {port}").into()))?
            .set_state(state);
        Ok(())
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            _charge: HcaCore::charge(&self.node.core, Counted::Pd)?,
            id: new_identity(),
            core: self.node.core.clone(),
        })
    }

    /// Create a completion queue.
    pub fn create_cq(&self, init: CqInit) -> Result<SoftCq> {
        let max = self.core().attr.max_cqe;
        if init.capacity == 0 || init.capacity > max {
            return Err(Error::invalid_parameter(format!(
                "CQ capacity {} must be 1..={max}",
                init.capacity
            )));
        }
        let charge = HcaCore::charge(&self.node.core, Counted::Cq)?;
        Ok(SoftCq {
            _charge: charge,
            inner: Arc::new(CqInner::new(
                self.core().id,
                init.capacity as usize,
                init.on_completion,
                init.on_async_error,
            )),
        })
    }

    /// Create a shared receive queue.
    pub fn create_srq(&self, pd: &SoftPd, init: SrqInit) -> Result<SoftSrq> {
        self.check_pd(pd)?;
        let a = &self.core().attr;
        if init.max_wr == 0 || init.max_wr > a.max_srq_wr || init.max_sge > a.max_sge {
            return Err(Error::invalid_parameter(format!(
                "SRQ sizes {init:?} out of range (max_wr 1..={}, max_sge <= {})",
                a.max_srq_wr, a.max_sge
            )));
        }
        let charge = HcaCore::charge(&self.node.core, Counted::Srq)?;
        Ok(SoftSrq {
            fabric: self.fabric.clone(),
            _charge: charge,
            inner: Arc::new(SrqInner::new(
                pd.id,
                self.node.core.clone(),
                init.max_sge as usize,
                init.max_wr as usize,
            )),
        })
    }

    /// Create an address vector.
    pub fn create_av(&self, pd: &SoftPd, attr: &AvAttr) -> Result<SoftAv> {
        self.check_pd(pd)?;
        self.core().check_av(attr, "AV")?;
        Ok(SoftAv {
            _charge: HcaCore::charge(&self.node.core, Counted::Av)?,
            attr: *attr,
            pd: pd.id,
        })
    }

    fn check_caps(&self, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<()> {
        let a = &self.core().attr;
        let c = init.caps;
        if c.max_send_wr > a.max_qp_wr
            || c.max_recv_wr > a.max_qp_wr
            || c.max_send_sge > a.max_sge
            || c.max_recv_sge > a.max_sge
        {
            return Err(Error::invalid_parameter(format!(
                "QP caps {c:?} exceed the device (max_qp_wr {}, max_sge {})",
                a.max_qp_wr, a.max_sge
            )));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn make_qp(
        &self,
        pd: &SoftPd,
        qpn: u32,
        key: u32,
        qp_type: QpType,
        gsi_port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
        charge: Charge,
    ) -> Result<SoftQp> {
        for (cq, which) in [(init.send_cq, "send"), (init.recv_cq, "receive")] {
            if cq.inner.device != self.core().id {
                return Err(Error::invalid_parameter(format!(
                    "the {which} CQ belongs to another HCA"
                )));
            }
        }
        if let Some(srq) = init.srq {
            // PD identities are unique across devices: this also refuses
            // an SRQ of another HCA.
            if srq.inner.pd != pd.id {
                return Err(Error::invalid_parameter(
                    "the SRQ belongs to another PD (or another HCA)",
                ));
            }
        }
        let inner = Arc::new(QpInner::new(
            qpn,
            qp_type,
            pd.id,
            self.node.core.clone(),
            init.send_cq.inner.clone(),
            init.recv_cq.inner.clone(),
            init.srq.map(|s| s.inner.clone()),
            init.caps,
            init.sq_sig_all,
            gsi_port,
        ));
        let mut qps = self.node.qps.write();
        if qps.contains_key(&key) {
            return Err(Error::busy(format!("port {gsi_port} already has a GSI QP")));
        }
        qps.insert(key, inner.clone());
        Ok(SoftQp {
            _charge: charge,
            inner,
            fabric: self.fabric.clone(),
            node: self.node.clone(),
            key,
        })
    }

    /// Create an RC, UC or UD queue pair (in RESET).
    pub fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<SoftQp> {
        self.check_pd(pd)?;
        if init.qp_type == QpType::Gsi {
            return Err(Error::invalid_parameter(
                "GSI QPs are created with create_gsi_qp",
            ));
        }
        self.check_caps(init)?;
        // Charged before a QP number is looked for: with at most max_qp
        // (< 2^24 - 2) QPs a free number always exists.
        let charge = HcaCore::charge(&self.node.core, Counted::Qp)?;
        let qpn = loop {
            let n = self.core().next_qpn.fetch_add(1, Ordering::Relaxed) & PSN_MASK;
            if n > 1 && !self.node.qps.read().contains_key(&n) {
                break n;
            }
        };
        self.make_qp(pd, qpn, qpn, init.qp_type, 0, init, charge)
    }

    /// Create port `port`'s GSI QP (QP1, in RESET): a UD QP that carries
    /// 256-byte MADs, accepts only Q_Key 0x80010000 and any P_Key of the
    /// port's table. One per port at a time (`ResourceBusy` otherwise).
    pub fn create_gsi_qp(
        &self,
        pd: &SoftPd,
        port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
    ) -> Result<SoftQp> {
        self.check_pd(pd)?;
        if self.core().port(port).is_none() {
            return Err(Error::NotFound(format!("port {port}").into()));
        }
        self.check_caps(init)?;
        let key = GSI_KEY | port as u32;
        let charge = HcaCore::charge(&self.node.core, Counted::Qp)?;
        self.make_qp(pd, key, key, QpType::Gsi, port, init, charge)
    }
}

/// A protection domain.
pub struct SoftPd {
    /// Its place in the HCA's `max_pd`.
    _charge: Charge,
    /// Unique across devices, so an SRQ, AV or MR that carries it cannot
    /// belong to a PD of another device.
    pub(crate) id: Identity,
    pub(crate) core: Arc<HcaCore>,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPd").field("id", &self.id).finish()
    }
}

fn check_access(access: Access) -> Result<()> {
    if access.undefined_bits() != 0 {
        return Err(Error::invalid_parameter(format!(
            "access {:#x} has bits that name no right ({:#x})",
            access.bits(),
            access.undefined_bits()
        )));
    }
    if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(Error::invalid_parameter(
            "remote write or atomic access requires local write (IBTA 10.6.3.1)",
        ));
    }
    Ok(())
}

impl SoftPd {
    /// Register the whole buffer; the MR's iova is 0.
    pub fn register(&self, buf: &RegisteredBuffer, access: Access) -> Result<SoftMr> {
        self.register_range(buf, 0, buf.len(), 0, access)
    }

    /// Register `len` bytes of `buf` from `offset`; addresses in work
    /// requests are `iova + offset_in_mr`.
    pub fn register_range(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        check_access(access)?;
        if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
            return Err(Error::invalid_parameter(format!(
                "MR range {offset}+{len} outside the {}-byte buffer",
                buf.len()
            )));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::invalid_parameter("iova + len overflows"));
        }
        self.insert(memory_of(buf).clone(), offset, len, iova, access)
    }

    /// Register caller-managed memory; the MR's iova is the pointer value.
    /// The contract was accepted by [`RawRegion::new`].
    pub fn register_region(&self, region: RawRegion, access: Access) -> Result<SoftMr> {
        check_access(access)?;
        let len = region.len();
        let mem = region_memory(&region).clone();
        let iova = mem.raw_addr().unwrap_or(0);
        self.insert(mem, 0, len, iova, access)
    }

    fn insert(
        &self,
        mem: Arc<Memory>,
        mem_off: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        let pd = self.id;
        let inner = self.core.mrs.insert(|key| MrInner {
            key,
            pd,
            access,
            iova,
            len,
            mem,
            mem_off,
            deregistered: AtomicBool::new(false),
        })?;
        inner.mem.in_flight.add_span(Span {
            key: inner.key,
            iova: inner.iova,
            off: inner.mem_off,
            len: inner.len,
        });
        Ok(SoftMr {
            inner,
            core: self.core.clone(),
        })
    }
}

/// A memory region. Dropping it deregisters it: when the drop returns, the
/// provider no longer touches the memory.
pub struct SoftMr {
    inner: Arc<MrInner>,
    core: Arc<HcaCore>,
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftMr")
            .field("key", &format_args!("{:#x}", self.inner.key))
            .field("iova", &format_args!("{:#x}", self.inner.iova))
            .field("len", &self.inner.len)
            .field("access", &self.inner.access)
            .finish()
    }
}

impl SoftMr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.key
    }
    /// Remote key (the same value in the soft provider).
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }
    /// Address of the MR's first byte in work requests.
    pub fn iova(&self) -> u64 {
        self.inner.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the MR is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// An SGE for `len` bytes at `offset` in this MR.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.inner.iova + offset,
            length: len,
            lkey: self.inner.key,
        }
    }

    fn range(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(e) if e <= self.inner.len => Ok(self.inner.mem_off + offset),
            _ => Err(Error::invalid_parameter(format!(
                "range {offset}+{len} outside the {}-byte MR",
                self.inner.len
            ))),
        }
    }

    /// Copy bytes out of the MR (offset relative to the MR's start).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let at = self.range(offset, out.len())?;
        self.inner
            .mem
            .with(|m| out.copy_from_slice(&m[at..at + out.len()]))
            .ok_or_else(|| Error::invalid_state("the MR was deregistered"))
    }

    /// Copy bytes into the MR (offset relative to the MR's start).
    /// `ResourceBusy` (nothing written) if a posted work request still
    /// names any of those bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let at = self.range(offset, data.len())?;
        self.inner
            .mem
            .in_flight
            .check_writable(at, at + data.len())?;
        self.inner
            .mem
            .with_mut(|m| m[at..at + data.len()].copy_from_slice(data))
            .ok_or_else(|| Error::invalid_state("the MR was deregistered"))
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.core.mrs.remove(self.inner.key);
        // Its queued requests can no longer reach the bytes (their key
        // names nothing now): the application may write them again.
        self.inner.mem.in_flight.remove_span(self.inner.key);
        self.inner.mem.invalidate();
    }
}

/// A completion queue.
pub struct SoftCq {
    inner: Arc<CqInner>,
    /// Its place in the HCA's `max_cq` (given back when the handle drops;
    /// QPs may keep the queue itself alive a little longer).
    _charge: Charge,
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
    inner: Arc<SrqInner>,
    fabric: Arc<FabricInner>,
    /// Its place in the HCA's `max_srq`.
    _charge: Charge,
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
    _charge: Charge,
    attr: AvAttr,
    pd: Identity,
}

impl SoftAv {
    /// The attributes.
    pub fn attr(&self) -> &AvAttr {
        &self.attr
    }
}

/// A queue pair. Dropping it destroys it (outstanding work is discarded
/// without completions).
pub struct SoftQp {
    /// Its place in the HCA's `max_qp`.
    _charge: Charge,
    inner: Arc<QpInner>,
    fabric: Arc<FabricInner>,
    node: Arc<HcaNode>,
    key: u32,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQp")
            .field("qpn", &self.qpn())
            .field("type", &self.inner.qp_type)
            .finish()
    }
}

impl SoftQp {
    /// QP number (1 for a GSI QP).
    pub fn qpn(&self) -> u32 {
        self.inner.wire_qpn()
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// Modify the QP (IBTA state machine, see [`provider::qp_state`]).
    pub fn modify(&self, m: &QpModify) -> Result<()> {
        let mut d = Deferred::new();
        let r = QpInner::modify(&self.inner, &self.fabric, m, &mut d);
        d.run();
        r
    }
    /// Query the QP.
    pub fn query(&self) -> QpAttr {
        self.inner.query()
    }

    fn view<'a, H>(&self, i: usize, wr: &SendWr<'a, H>, av: Option<&SoftAv>) -> Result<WrView<'a>> {
        let qp = &self.inner;
        if wr.sg_list.len() > qp.caps.max_send_sge as usize {
            return Err(Error::invalid_parameter(format!(
                "send {i}: {} SGEs, the QP allows {}",
                wr.sg_list.len(),
                qp.caps.max_send_sge
            )));
        }
        let ok = match qp.qp_type {
            QpType::Ud | QpType::Gsi => matches!(wr.op, SendOp::Send | SendOp::SendImm(_)),
            QpType::Uc => matches!(
                wr.op,
                SendOp::Send | SendOp::SendImm(_) | SendOp::Write { .. } | SendOp::WriteImm { .. }
            ),
            QpType::Rc => true,
        };
        if !ok {
            return Err(Error::invalid_parameter(format!(
                "send {i}: {:?} is not available on a {} QP",
                wr.op, qp.qp_type
            )));
        }
        let ud = match (qp.qp_type.is_datagram(), &wr.ud) {
            (true, None) => {
                return Err(Error::invalid_parameter(format!(
                    "send {i}: a datagram send needs a destination (ud)"
                )))
            }
            (true, Some(u)) => {
                let Some(av) = av else {
                    return Err(Error::invalid_parameter(format!(
                        "send {i}: the destination names no address vector"
                    )));
                };
                // One integer compare; PD identities are unique across
                // devices, so an AV of another HCA fails it too.
                if av.pd != qp.pd {
                    return Err(Error::invalid_parameter(format!(
                        "send {i}: the AV belongs to another PD (or another HCA)"
                    )));
                }
                if u.remote_qpn > PSN_MASK {
                    return Err(Error::invalid_parameter(format!(
                        "send {i}: remote QPN must fit 24 bits"
                    )));
                }
                Some(UdInfo {
                    av: av.attr,
                    qpn: u.remote_qpn,
                    qkey: u.remote_qkey,
                    pkey_index: u.pkey_index,
                })
            }
            (false, _) => None,
        };
        Ok(WrView {
            wr_id: wr.wr_id,
            op: wr.op,
            sg: wr.sg_list,
            signaled: wr.signaled,
            solicited: wr.solicited,
            ud,
        })
    }

    /// Post sends in order. On error, the sends before the failing one
    /// were posted; the error names the failing index.
    pub fn post_send(&self, wrs: &[SendWr<'_, SoftAv>]) -> Result<()> {
        self.post_send_with(wrs, &|i| {
            wrs.get(i).and_then(|w| w.ud.as_ref().map(|u| u.av))
        })
    }

    /// [`SoftQp::post_send`] for requests that name their datagram
    /// destination's AV some other way (a handle the caller resolved):
    /// `av_of(i)` is request `i`'s AV. A connected QP never asks.
    pub fn post_send_with<'v, H>(
        &self,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v SoftAv>,
    ) -> Result<()> {
        let mut d = Deferred::new();
        let r = (|| {
            let mut sq = self.inner.sq.lock();
            let mut i = 0;
            while i < wrs.len() {
                // Plain RC SENDs and WRITEs run in batches; the rest, one by
                // one below.
                if self.fabric.batched_sends.load(Ordering::Relaxed) {
                    i += fast::rc_run(&self.fabric, &self.inner, &mut sq, &wrs[i..], &mut d);
                }
                let Some(wr) = wrs.get(i) else {
                    break;
                };
                let av = if self.inner.qp_type.is_datagram() {
                    av_of(i)
                } else {
                    None
                };
                let v = self.view(i, wr, av)?;
                // max_rd_atomic 0 is none (IBTA): a READ or atomic could
                // never be outstanding. Refused where the QP takes sends
                // (RTS, SQD), the QP unchanged; other states answer below.
                let responds = matches!(
                    wr.op,
                    SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
                );
                if responds
                    && self.inner.qp_type == QpType::Rc
                    && matches!(sq.attr.state, QpState::Rts | QpState::Sqd)
                    && sq.attr.max_rd_atomic == 0
                {
                    return Err(Error::invalid_parameter(format!(
                        "send {i}: {:?} needs max_rd_atomic of at least 1",
                        wr.op
                    )));
                }
                engine::submit(&self.fabric, &self.inner, &mut sq, &v, &mut d).map_err(
                    |e| match e {
                        Error::InvalidQpState(s) => {
                            Error::InvalidQpState(format!("send {i}: {s}").into())
                        }
                        Error::InsufficientResources(s) => {
                            Error::InsufficientResources(format!("send {i}: {s}").into())
                        }
                        e => e,
                    },
                )?;
                i += 1;
            }
            Ok(())
        })();
        d.run();
        r
    }

    /// Post receives in order (same partial-failure rule as sends).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let mut d = Deferred::new();
        let mut wake = false;
        let r = self.inner.post_recv(wrs, &mut d, &mut wake);
        d.run();
        if wake {
            // Senders held by an RNR NAK from this QP look again now,
            // instead of waiting for a fabric tick nobody may give.
            let me: &QpInner = &self.inner;
            self.fabric.wake_rnr_waiters(|d| std::ptr::eq(d, me));
        }
        r
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.inner.destroyed.store(true, Ordering::Release);
        self.node.qps.write().remove(&self.key);
        let mut sq = self.inner.sq.lock();
        // Requests still queued end with the QP (and held sends' leases
        // with them); the memories it posted into forget its queue.
        self.inner.drop_queued(&mut sq, &mut self.inner.rq.lock());
        self.inner.rq.close();
        // The batched path's cache may hold the peer QP (which may hold
        // this one): let go of it now.
        sq.run_cache.clear();
    }
}

impl Device for SoftHca {
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Mr = SoftMr;
    type Srq = SoftSrq;
    type Av = SoftAv;
    type Qp = SoftQp;

    fn query(&self) -> DeviceAttr {
        SoftHca::query(self)
    }
    fn query_port(&self, port: u8) -> Result<PortAttr> {
        SoftHca::query_port(self, port)
    }
    fn alloc_pd(&self) -> Result<SoftPd> {
        SoftHca::alloc_pd(self)
    }
    fn dealloc_pd(&self, pd: SoftPd) -> Result<()> {
        self.check_pd(&pd)
    }
    fn create_cq(&self, init: CqInit) -> Result<SoftCq> {
        SoftHca::create_cq(self, init)
    }
    fn destroy_cq(&self, cq: SoftCq) -> Result<()> {
        drop(cq);
        Ok(())
    }
    fn arm_cq(&self, cq: &SoftCq, arm: CqArm) -> Result<()> {
        cq.arm(arm);
        Ok(())
    }
    fn poll_cq(&self, cq: &SoftCq, out: &mut [Wc]) -> Result<usize> {
        Ok(cq.poll(out))
    }
    fn register_mr(
        &self,
        pd: &SoftPd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        self.check_pd(pd)?;
        pd.register_range(buf, offset, len, iova, access)
    }
    fn register_region(&self, pd: &SoftPd, region: RawRegion, access: Access) -> Result<SoftMr> {
        self.check_pd(pd)?;
        pd.register_region(region, access)
    }
    fn mr_keys(&self, mr: &SoftMr) -> (u32, u32) {
        (mr.lkey(), mr.rkey())
    }
    fn deregister_mr(&self, mr: SoftMr) -> Result<()> {
        drop(mr);
        Ok(())
    }
    fn create_srq(&self, pd: &SoftPd, init: SrqInit) -> Result<SoftSrq> {
        SoftHca::create_srq(self, pd, init)
    }
    fn destroy_srq(&self, srq: SoftSrq) -> Result<()> {
        drop(srq);
        Ok(())
    }
    fn post_srq_recv(&self, srq: &SoftSrq, wrs: &[RecvWr<'_>]) -> Result<()> {
        srq.post_recv(wrs)
    }
    fn create_av(&self, pd: &SoftPd, attr: &AvAttr) -> Result<SoftAv> {
        SoftHca::create_av(self, pd, attr)
    }
    fn destroy_av(&self, _av: SoftAv) -> Result<()> {
        Ok(())
    }
    fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, SoftCq, SoftSrq>) -> Result<SoftQp> {
        SoftHca::create_qp(self, pd, init)
    }
    fn create_gsi_qp(
        &self,
        pd: &SoftPd,
        port: u8,
        init: &QpInit<'_, SoftCq, SoftSrq>,
    ) -> Result<SoftQp> {
        SoftHca::create_gsi_qp(self, pd, port, init)
    }
    fn qp_num(&self, qp: &SoftQp) -> u32 {
        qp.qpn()
    }
    fn modify_qp(&self, qp: &SoftQp, m: &QpModify) -> Result<()> {
        qp.modify(m)
    }
    fn query_qp(&self, qp: &SoftQp) -> Result<QpAttr> {
        Ok(qp.query())
    }
    fn destroy_qp(&self, qp: SoftQp) -> Result<()> {
        drop(qp);
        Ok(())
    }
    fn post_send<'v, H>(
        &self,
        qp: &SoftQp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v SoftAv>,
    ) -> Result<()> {
        qp.post_send_with(wrs, av_of)
    }
    fn post_recv(&self, qp: &SoftQp, wrs: &[RecvWr<'_>]) -> Result<()> {
        qp.post_recv(wrs)
    }
}

/// The soft provider: the devices of one [`Fabric`].
#[derive(Clone, Debug, Default)]
pub struct SoftProvider {
    fabric: Fabric,
}

impl SoftProvider {
    /// A provider over `fabric`.
    pub fn new(fabric: Fabric) -> SoftProvider {
        SoftProvider { fabric }
    }
    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }
}

impl Provider for SoftProvider {
    type Device = SoftHca;
    fn name(&self) -> &str {
        "soft"
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        self.fabric.devices()
    }
    fn open(&self, node_guid: u64) -> Result<SoftHca> {
        self.fabric
            .hca(node_guid)
            .ok_or_else(|| Error::NotFound(format!("HCA {node_guid:#x}").into()))
    }
}
