//! The verbs of an open RDMA device: `provider::Device` for
//! [`RdmaDevice`], with the checks and conversions each makes.

use al::sync::atomic::AtomicU64;
use al::sync::{Arc, Mutex};

use al::{Error, Result};
use provider::buffer::for_providers::{memory_of, region_memory, Memory, Span};
use provider::qp_state::DeviceLimits;
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, PortAttr, QpAttr, QpInit, QpModify, QpState,
    QpType, RawRegion, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, SrqInit, Wc,
};

use crate::convert::{self, send_flags, RawWc};
use crate::device::RdmaDevice;
use crate::event_thread::CqHooks;
use crate::leases::{QpTrack, Track};
use crate::objects::{LeaseKey, QpLeases, QpSet, RdmaAv, RdmaCq, RdmaMr, RdmaPd, RdmaQp, RdmaSrq};
use crate::sys::{self};

/// The access bits a registration or a QP may name: the provider
/// interface's are `IBV_ACCESS_*`'s (checked against the headers).
fn access_bits(access: Access) -> Result<u32> {
    if access.undefined_bits() != 0 {
        return Err(Error::invalid_parameter(format!(
            "access flags {:#x} have bits that name no right ({:#x})",
            access.bits(),
            access.undefined_bits()
        )));
    }
    Ok(access.bits())
}

impl RdmaDevice {
    fn with_limits<R>(&self, f: impl FnOnce(&DeviceLimits<'_>) -> R) -> R {
        let a = &self.inner.attr;
        f(&DeviceLimits {
            ports: &self.inner.ports,
            max_qp_rd_atomic: a.max_qp_rd_atomic,
            max_qp_init_rd_atomic: a.max_qp_init_rd_atomic,
        })
    }

    fn register(
        &self,
        pd: &RdmaPd,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<RdmaMr> {
        let bits = access_bits(access)?;
        // IBTA: remote write and atomic rights need local write (the
        // kernel says EINVAL too; this names the rule).
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::invalid_parameter(
                "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        if len == 0 {
            return Err(Error::invalid_parameter(
                "an MR of 0 bytes: the device registers at least one",
            ));
        }
        let mr = sys::Mr::register(&pd.pd, mem, offset, len, iova, bits)?;
        let (lkey, _) = mr.keys();
        self.inner.leases.add_mr(
            mem,
            Span {
                key: lkey,
                iova,
                off: offset,
                len,
            },
        );
        Ok(RdmaMr {
            mr,
            lease_key: LeaseKey {
                lkey,
                leases: self.inner.leases.clone(),
            },
        })
    }

    /// Builds the libibverbs form of request `i`, or says why the
    /// provider interface refuses it on this QP.
    fn send_req<'a, H>(
        &self,
        qp: &RdmaQp,
        i: usize,
        wr: &'a SendWr<'a, H>,
        av: Option<&'a RdmaAv>,
        own_qkey: u32,
    ) -> Result<sys::SendReq<'a>> {
        let refuse = |why: &str| {
            Err(Error::invalid_parameter(format!(
                "request {i}: {why} on a {} QP",
                qp.qp_type
            )))
        };
        let ud = match qp.qp_type {
            QpType::Ud => {
                if !matches!(wr.op, SendOp::Send | SendOp::SendImm(_)) {
                    return refuse("only SEND and SEND with immediate are allowed");
                }
                let Some(dest) = &wr.ud else {
                    return refuse("a datagram send needs a destination");
                };
                let Some(av) = av else {
                    return refuse("the destination's address vector is not there");
                };
                // IBTA's controlled Q_Key rule: a destination Q_Key with
                // the high bit set means the sending QP's own. Not every
                // device applies it (Linux 6.1's rxe sends the value as
                // given), so the provider does.
                let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
                    own_qkey
                } else {
                    dest.remote_qkey
                };
                Some((&av.ah, dest.remote_qpn, qkey))
            }
            QpType::Uc => {
                if matches!(
                    wr.op,
                    SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
                ) {
                    return refuse("RDMA READ and atomics are not allowed");
                }
                None
            }
            _ => None,
        };
        let mut flags = 0;
        if wr.signaled || qp.sq_sig_all {
            flags |= send_flags::SIGNALED;
        }
        if wr.solicited {
            flags |= send_flags::SOLICITED;
        }
        Ok(sys::SendReq {
            wr_id: wr.wr_id,
            opcode: convert::wr_opcode_of(&wr.op),
            flags,
            op: wr.op,
            sg_list: wr.sg_list,
            ud,
        })
    }

    fn qp_set(qp: &RdmaQp) -> QpSet {
        *qp.set.lock()
    }
}

/// How many requests a post took, and its result without the index.
fn taken(r: sys::PostResult, n: usize) -> (usize, Result<()>) {
    match r {
        Ok(()) => (n, Ok(())),
        Err((i, e)) => (i, Err(e)),
    }
}

impl Device for RdmaDevice {
    type Pd = RdmaPd;
    type Cq = RdmaCq;
    type Mr = RdmaMr;
    type Srq = RdmaSrq;
    type Av = RdmaAv;
    type Qp = RdmaQp;

    fn query(&self) -> DeviceAttr {
        self.inner.attr.clone()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let n = self.inner.attr.num_ports;
        if port == 0 || port > n {
            return Err(Error::NotFound(
                format!("{} has ports 1..={n}, not {port}", self.inner.attr.name).into(),
            ));
        }
        let ctx = &self.inner.ctx;
        let raw = ctx.query_port(port)?;
        let gids = (0..raw.gid_tbl_len.max(0))
            .map(|i| ctx.query_gid(port, i))
            .collect::<Result<Vec<_>>>()?;
        let pkeys = (0..i32::from(raw.pkey_tbl_len))
            .map(|i| ctx.query_pkey(port, i))
            .collect::<Result<Vec<_>>>()?;
        convert::port_attr(port, &raw, gids, pkeys)
    }

    fn alloc_pd(&self) -> Result<RdmaPd> {
        Ok(RdmaPd {
            pd: Arc::new(sys::Pd::alloc(&self.inner.ctx)?),
        })
    }

    /// Frees the PD now, or, while objects made in it still live (they
    /// hold it), when the last of them goes.
    fn dealloc_pd(&self, pd: RdmaPd) -> Result<()> {
        match Arc::try_unwrap(pd.pd) {
            Ok(pd) => pd.dealloc(),
            Err(_) => Ok(()),
        }
    }

    fn create_cq(&self, init: CqInit) -> Result<RdmaCq> {
        let max = self.inner.attr.max_cqe;
        if init.capacity == 0 || init.capacity > max {
            return Err(Error::invalid_parameter(format!(
                "CQ capacity {} must be 1..={max}",
                init.capacity
            )));
        }
        let events = &self.inner.events;
        let cq = Arc::new(sys::Cq::new(
            &self.inner.ctx,
            &events.state.channel,
            i32::try_from(init.capacity).unwrap_or(i32::MAX),
        )?);
        let entry = events.add_cq(
            cq.key(),
            CqHooks {
                on_completion: init.on_completion,
                on_async_error: init.on_async_error,
                lost: AtomicU64::new(0),
            },
        );
        Ok(RdmaCq { entry, cq })
    }

    /// Destroys the CQ now, or, while QPs on it still live (they hold
    /// it), when the last of them goes; its hooks are not called again
    /// either way (a call already under way on the event thread ends).
    fn destroy_cq(&self, cq: RdmaCq) -> Result<()> {
        let RdmaCq { entry, cq } = cq;
        drop(entry);
        match Arc::try_unwrap(cq) {
            Ok(cq) => cq.destroy(),
            Err(_) => Ok(()),
        }
    }

    fn arm_cq(&self, cq: &RdmaCq, arm: CqArm) -> Result<()> {
        cq.cq.req_notify(arm == CqArm::Solicited)
    }

    fn poll_cq(&self, cq: &RdmaCq, out: &mut [Wc]) -> Result<usize> {
        let mut raw = [RawWc::default(); 16];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(raw.len());
            let n = cq.cq.poll(&mut raw[..want])?;
            for (o, r) in out[done..].iter_mut().zip(&raw[..n]) {
                *o = convert::wc_from_raw(r);
                self.inner.leases.completed(o);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn register_mr(
        &self,
        pd: &RdmaPd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<RdmaMr> {
        self.register(pd, memory_of(buf), offset, len, iova, access)
    }

    /// The MR's iova is the region's own address (as on the other
    /// providers).
    fn register_region(&self, pd: &RdmaPd, region: RawRegion, access: Access) -> Result<RdmaMr> {
        let mem = region_memory(&region);
        let iova = mem.raw_addr().unwrap_or(0);
        self.register(pd, mem, 0, mem.len(), iova, access)
    }

    fn mr_keys(&self, mr: &RdmaMr) -> (u32, u32) {
        mr.mr.keys()
    }

    fn deregister_mr(&self, mr: RdmaMr) -> Result<()> {
        let RdmaMr { mr, lease_key } = mr;
        let done = mr.deregister();
        drop(lease_key);
        done
    }

    fn create_srq(&self, pd: &RdmaPd, init: SrqInit) -> Result<RdmaSrq> {
        let a = &self.inner.attr;
        if init.max_wr == 0 || init.max_wr > a.max_srq_wr || init.max_sge > a.max_sge {
            return Err(Error::invalid_parameter(format!(
                "SRQ sizes {init:?} out of range (max_wr 1..={}, max_sge <= {})",
                a.max_srq_wr, a.max_sge
            )));
        }
        Ok(RdmaSrq {
            srq: Arc::new(sys::Srq::new(&pd.pd, init.max_wr, init.max_sge.max(1))?),
            track: Arc::new(Track::default()),
        })
    }

    /// Destroys the SRQ now, or when the last QP on it goes.
    fn destroy_srq(&self, srq: RdmaSrq) -> Result<()> {
        match Arc::try_unwrap(srq.srq) {
            Ok(srq) => srq.destroy(),
            Err(_) => Ok(()),
        }
    }

    fn post_srq_recv(&self, srq: &RdmaSrq, wrs: &[RecvWr<'_>]) -> Result<()> {
        let reqs: Vec<(u64, &[Sge])> = wrs.iter().map(|w| (w.wr_id, w.sg_list)).collect();
        srq.track.post(&self.inner.leases, &reqs, || {
            taken(srq.srq.post_recv(wrs), wrs.len())
        })
    }

    fn create_av(&self, pd: &RdmaPd, attr: &AvAttr) -> Result<RdmaAv> {
        self.with_limits(|l| provider::qp_state::check_av(attr, l, "AV"))?;
        Ok(RdmaAv {
            ah: sys::Ah::new(&pd.pd, &convert::raw_ah(attr))?,
        })
    }

    fn destroy_av(&self, av: RdmaAv) -> Result<()> {
        av.ah.destroy()
    }

    fn create_qp(&self, pd: &RdmaPd, init: &QpInit<'_, RdmaCq, RdmaSrq>) -> Result<RdmaQp> {
        let Some(code) = convert::qp_type_code(init.qp_type) else {
            return Err(Error::invalid_parameter(format!(
                "create_qp makes RC, UC and UD QPs, not {}",
                init.qp_type
            )));
        };
        let c = &init.caps;
        let (qp, _granted) = sys::Qp::new(
            &pd.pd,
            &sys::QpCreate {
                qp_type: code,
                send_cq: &init.send_cq.cq,
                recv_cq: &init.recv_cq.cq,
                srq: init.srq.map(|s| &s.srq),
                caps: [c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge],
                sq_sig_all: init.sq_sig_all,
            },
        )?;
        let qpn = qp.qp_num();
        let track = Arc::new(QpTrack::new(init.srq.map(|s| s.track.clone())));
        self.inner.leases.add_qp(qpn, track.clone());
        Ok(RdmaQp {
            events: self.inner.events.add_qp(qp.key()),
            qpn,
            leases: QpLeases {
                qpn,
                track,
                leases: self.inner.leases.clone(),
            },
            qp,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            set: Mutex::new(QpSet {
                state: QpState::Reset,
                qkey: 0,
            }),
        })
    }

    /// Unsupported: on a real device QP1 belongs to the kernel (its CM
    /// and SA clients); connections go through librdmacm instead.
    fn create_gsi_qp(
        &self,
        _pd: &RdmaPd,
        port: u8,
        _init: &QpInit<'_, RdmaCq, RdmaSrq>,
    ) -> Result<RdmaQp> {
        Err(Error::Unsupported(
            format!(
                "{} port {port}: QP1 belongs to the kernel on an rdma device, so the \
                 project's CM cannot run there; connect through librdmacm \
                 (ibal::rdma::cm, crate cep-rdmacm)",
                self.inner.attr.name
            )
            .into(),
        ))
    }

    fn qp_num(&self, qp: &RdmaQp) -> u32 {
        qp.qpn
    }

    /// Checks the IBTA transition and the values the way every provider
    /// does (`qp_state::check_transition`, `check_modify_values`), from the
    /// state the device reports now, then `ibv_modify_qp`.
    fn modify_qp(&self, qp: &RdmaQp, m: &QpModify) -> Result<()> {
        let now = qp.qp.query()?;
        let from = convert::qp_state_from_code(now.state).ok_or_else(|| {
            Error::Other(format!("ibv_query_qp: unknown QP state code {}", now.state).into())
        })?;
        provider::qp_state::check_transition(qp.qp_type, from, m.state, m.given())?;
        self.with_limits(|l| provider::qp_state::check_modify_values(now.port, m, l))?;
        let (raw, mask) = convert::modify_to_raw(m);
        let mut set = qp.set.lock();
        if from == QpState::Reset && m.state == QpState::Err {
            // IBTA allows RESET -> ERR; Linux's transition table does not
            // (EINVAL). Go through INIT with the attributes it requires
            // (port 1, P_Key index 0, no rights or Q_Key 0): nothing can
            // be posted or received in between, and ERR ends the same.
            let init = match qp.qp_type {
                QpType::Ud => QpModify::to(QpState::Init).qkey(0),
                _ => QpModify::to(QpState::Init).access(Access::NONE),
            }
            .port(1)
            .pkey_index(0);
            let (raw_init, mask_init) = convert::modify_to_raw(&init);
            qp.qp.modify(&raw_init, mask_init)?;
        }
        qp.qp.modify(&raw, mask)?;
        if m.state == QpState::Reset {
            // RESET empties the queues without completions.
            qp.leases.track.reset();
        }
        set.state = m.state;
        if let Some(q) = m.qkey {
            set.qkey = q;
        }
        Ok(())
    }

    fn query_qp(&self, qp: &RdmaQp) -> Result<QpAttr> {
        let raw = qp.qp.query()?;
        convert::qp_attr_from_raw(&raw, qp.qpn, qp.qp_type, qp.sq_sig_all)
    }

    fn destroy_qp(&self, qp: RdmaQp) -> Result<()> {
        let RdmaQp {
            events, qp, leases, ..
        } = qp;
        // Out of the event table before the address can be reused.
        drop(events);
        let done = qp.destroy();
        drop(leases);
        done
    }

    fn post_send<'v, H>(
        &self,
        qp: &RdmaQp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v RdmaAv>,
    ) -> Result<()> {
        let set = Self::qp_set(qp);
        let state = set.state;
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(Error::InvalidQpState(
                format!("post_send on a QP in {state}").into(),
            ));
        }
        let datagram = qp.qp_type.is_datagram();
        let mut reqs = Vec::with_capacity(wrs.len());
        let mut refused = None;
        for (i, wr) in wrs.iter().enumerate() {
            let av = if datagram { av_of(i) } else { None };
            match self.send_req(qp, i, wr, av, set.qkey) {
                Ok(r) => reqs.push(r),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let items: Vec<(u64, &[Sge])> = reqs.iter().map(|r| (r.wr_id, r.sg_list)).collect();
        qp.leases.track.sq.post(&self.inner.leases, &items, || {
            taken(qp.qp.post_send(&reqs), reqs.len())
        })?;
        refused.map_or(Ok(()), Err)
    }

    fn post_recv(&self, qp: &RdmaQp, wrs: &[RecvWr<'_>]) -> Result<()> {
        if Self::qp_set(qp).state == QpState::Reset {
            return Err(Error::InvalidQpState("post_recv on a QP in RESET".into()));
        }
        let reqs: Vec<(u64, &[Sge])> = wrs.iter().map(|w| (w.wr_id, w.sg_list)).collect();
        let track = &qp.leases.track;
        // A QP on an SRQ has no receive queue of its own; the device
        // refuses the post, and nothing is recorded.
        let queue = match &track.srq {
            Some(_) => return taken(qp.qp.post_recv(wrs), wrs.len()).1,
            None => &track.rq,
        };
        queue.post(&self.inner.leases, &reqs, || {
            taken(qp.qp.post_recv(wrs), wrs.len())
        })
    }
}
