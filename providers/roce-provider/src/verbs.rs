//! The verbs of an open device: `provider::Device` for [`RoceDevice`],
//! with the checks every object's creation makes.

use al::sync::atomic::{AtomicU64, Ordering};
use al::sync::Arc;

use al::sync::Mutex;
use al::{Error, Result};
use provider::buffer::for_providers::{memory_of, region_memory, Memory, Span};
use provider::{
    Access, AvAttr, CqArm, CqInit, Device, DeviceAttr, PortAttr, QpAttr, QpInit, QpModify, QpType,
    RawRegion, RecvWr, RegisteredBuffer, SendWr, SrqInit, Wc,
};

use crate::cq::CqInner;
use crate::device::RoceDevice;
use crate::limits::Kind;
use crate::mr::{MrInner, Posted, RecvEntry};
use crate::objects::{RoceAv, RoceCq, RoceMr, RocePd, RoceQp, RoceSrq};
use crate::qp::{fresh_attr, QpCore, QpInner, SrqInner, GSI_KEY, QPN_MASK};
use crate::shared::new_identity;
use crate::timers::NO_DEADLINE;

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

impl RoceDevice {
    fn insert_mr(
        &self,
        pd: &RocePd,
        mem: al::sync::Arc<Memory>,
        mem_off: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<RoceMr> {
        let pd_id = pd.id;
        let inner = self.shared.mrs.insert(|key| MrInner {
            key,
            pd: pd_id,
            access,
            iova,
            len,
            mem,
            mem_off,
            deregistered: al::sync::atomic::AtomicBool::new(false),
        })?;
        inner.mem.in_flight.add_span(Span {
            key: inner.key,
            iova: inner.iova,
            off: inner.mem_off,
            len: inner.len,
        });
        Ok(RoceMr {
            inner,
            dev: self.shared.clone(),
        })
    }
}

impl RoceDevice {
    fn check_pd(&self, pd: &RocePd) -> Result<()> {
        if pd.device != self.shared.id {
            return Err(Error::invalid_parameter("the PD belongs to another device"));
        }
        Ok(())
    }

    fn check_caps(&self, init: &QpInit<'_, RoceCq, RoceSrq>) -> Result<()> {
        let a = &self.shared.attr;
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
        for (cq, which) in [(init.send_cq, "send"), (init.recv_cq, "receive")] {
            if cq.inner.device != self.shared.id {
                return Err(Error::invalid_parameter(format!(
                    "the {which} CQ belongs to another device"
                )));
            }
        }
        Ok(())
    }

    fn max_qp_reached(&self) -> Error {
        Error::insufficient_resources(format!(
            "max_qp reached: the device allows {} QPs",
            self.shared.attr.max_qp
        ))
    }

    /// Refuses a QP past `max_qp` before a QP number is looked for (the
    /// insert checks again, under the map's lock).
    fn check_qp_count(&self) -> Result<()> {
        if self.shared.qps.read().len() >= self.shared.attr.max_qp as usize {
            return Err(self.max_qp_reached());
        }
        Ok(())
    }

    fn make_qp(
        &self,
        pd: &RocePd,
        key: u32,
        qpn: u32,
        qp_type: QpType,
        port: u8,
        init: &QpInit<'_, RoceCq, RoceSrq>,
    ) -> Result<RoceQp> {
        if let Some(srq) = init.srq {
            if srq.inner.pd != pd.id {
                return Err(Error::invalid_parameter(
                    "the SRQ belongs to another PD (or another device)",
                ));
            }
        }
        let inner = Arc::new(QpInner {
            dev: self.shared.clone(),
            key,
            qpn,
            qp_type,
            pd: pd.id,
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            srq: init.srq.map(|s| s.inner.clone()),
            core: Mutex::new(QpCore::new(fresh_attr(
                qpn,
                qp_type,
                init.caps,
                init.sq_sig_all,
                port,
            ))),
            rq: Posted::new(),
            deadline: AtomicU64::new(NO_DEADLINE),
            queued: AtomicU64::new(NO_DEADLINE),
            filter: al::sync::ArcCell::new(al::sync::Arc::new(crate::qp::filter_of(
                &self.shared,
                qpn,
                &fresh_attr(qpn, qp_type, init.caps, init.sq_sig_all, port),
            ))),
        });
        self.shared.qps.change(|qps| {
            if qps.len() >= self.shared.attr.max_qp as usize {
                return Err(self.max_qp_reached());
            }
            if qps.contains_key(&key) {
                return Err(Error::busy(format!("port {port} already has a GSI QP")));
            }
            qps.insert(key, inner.clone());
            Ok(())
        })?;
        Ok(RoceQp { inner })
    }
}

impl Device for RoceDevice {
    type Pd = RocePd;
    type Cq = RoceCq;
    type Mr = RoceMr;
    type Srq = RoceSrq;
    type Av = RoceAv;
    type Qp = RoceQp;

    fn query(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.shared
            .port(port)
            .map(|p| p.attr())
            .ok_or_else(|| Error::NotFound(format!("port {port}").into()))
    }

    fn alloc_pd(&self) -> Result<RocePd> {
        Ok(RocePd {
            _charge: self.shared.charge(Kind::Pd)?,
            id: new_identity(),
            device: self.shared.id,
        })
    }

    fn dealloc_pd(&self, pd: RocePd) -> Result<()> {
        self.check_pd(&pd)
    }

    fn create_cq(&self, init: CqInit) -> Result<RoceCq> {
        let max = self.shared.attr.max_cqe;
        if init.capacity == 0 || init.capacity > max {
            return Err(Error::invalid_parameter(format!(
                "CQ capacity {} must be 1..={max} (max_cqe)",
                init.capacity
            )));
        }
        Ok(RoceCq {
            _charge: self.shared.charge(Kind::Cq)?,
            inner: Arc::new(CqInner::new(
                self.shared.id,
                init.capacity as usize,
                init.on_completion,
                init.on_async_error,
            )),
        })
    }

    fn destroy_cq(&self, cq: RoceCq) -> Result<()> {
        drop(cq);
        Ok(())
    }

    fn arm_cq(&self, cq: &RoceCq, arm: CqArm) -> Result<()> {
        cq.inner.arm(arm);
        Ok(())
    }

    fn poll_cq(&self, cq: &RoceCq, out: &mut [Wc]) -> Result<usize> {
        let n = cq.inner.poll(out);
        if n > 0 || out.is_empty() {
            return Ok(n);
        }
        // Nothing yet: take what has already arrived on the ports on this
        // thread rather than wait for a receive thread to wake up
        // (`docs/roce-provider.md`, "Progress on the polling thread").
        let took = crate::driver::progress(&self.shared);
        let n = if took.is_some() {
            cq.inner.poll(out)
        } else {
            0
        };
        self.shared.note_poll(n, took);
        Ok(n)
    }

    fn register_mr(
        &self,
        pd: &RocePd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<RoceMr> {
        self.check_pd(pd)?;
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
        self.insert_mr(pd, memory_of(buf).clone(), offset, len, iova, access)
    }

    fn register_region(&self, pd: &RocePd, region: RawRegion, access: Access) -> Result<RoceMr> {
        self.check_pd(pd)?;
        check_access(access)?;
        let len = region.len();
        let mem = region_memory(&region).clone();
        let iova = mem.raw_addr().unwrap_or(0);
        self.insert_mr(pd, mem, 0, len, iova, access)
    }

    fn mr_keys(&self, mr: &RoceMr) -> (u32, u32) {
        (mr.inner.key, mr.inner.key)
    }

    fn deregister_mr(&self, mr: RoceMr) -> Result<()> {
        drop(mr);
        Ok(())
    }

    fn create_srq(&self, pd: &RocePd, init: SrqInit) -> Result<RoceSrq> {
        self.check_pd(pd)?;
        let a = &self.shared.attr;
        if init.max_wr == 0 || init.max_wr > a.max_srq_wr || init.max_sge > a.max_sge {
            return Err(Error::invalid_parameter(format!(
                "SRQ sizes {init:?} out of range (max_wr 1..={} (max_srq_wr), max_sge <= {})",
                a.max_srq_wr, a.max_sge
            )));
        }
        Ok(RoceSrq {
            _charge: self.shared.charge(Kind::Srq)?,
            inner: Arc::new(SrqInner {
                pd: pd.id,
                max_wr: init.max_wr as usize,
                max_sge: init.max_sge as usize,
                q: Posted::new(),
            }),
        })
    }

    fn destroy_srq(&self, srq: RoceSrq) -> Result<()> {
        drop(srq);
        Ok(())
    }

    fn post_srq_recv(&self, srq: &RoceSrq, wrs: &[RecvWr<'_>]) -> Result<()> {
        let s = &srq.inner;
        let mut q = s.q.lock();
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > s.max_sge {
                return Err(Error::invalid_parameter(format!(
                    "SRQ receive {i}: {} SGEs, the SRQ allows {}",
                    wr.sg_list.len(),
                    s.max_sge
                )));
            }
            if q.wrs.len() >= s.max_wr {
                return Err(Error::insufficient_resources(format!(
                    "SRQ receive {i}: the SRQ is full ({} requests)",
                    s.max_wr
                )));
            }
            let list = &mut *q;
            for sge in wr.sg_list {
                self.shared.mrs.note_poster(sge, &mut list.seen, &s.q);
            }
            list.wrs.push_back(RecvEntry {
                wr_id: wr.wr_id,
                sg: wr.sg_list.into(),
            });
        }
        Ok(())
    }

    fn create_av(&self, pd: &RocePd, attr: &AvAttr) -> Result<RoceAv> {
        self.check_pd(pd)?;
        self.shared.check_av(attr, "AV")?;
        Ok(RoceAv {
            _charge: self.shared.charge(Kind::Av)?,
            attr: *attr,
            pd: pd.id,
        })
    }

    fn destroy_av(&self, _av: RoceAv) -> Result<()> {
        Ok(())
    }

    fn create_qp(&self, pd: &RocePd, init: &QpInit<'_, RoceCq, RoceSrq>) -> Result<RoceQp> {
        self.check_pd(pd)?;
        if init.qp_type == QpType::Gsi {
            return Err(Error::invalid_parameter(
                "GSI QPs are created with create_gsi_qp",
            ));
        }
        self.check_caps(init)?;
        self.check_qp_count()?;
        // At most max_qp (<= 2^24 - 2) numbers are in use, so a free one
        // exists; the tries are bounded all the same (creators racing past
        // the count check could take the last ones).
        let qpn = (0..=QPN_MASK)
            .map(|_| self.shared.next_qpn.fetch_add(1, Ordering::Relaxed) & QPN_MASK)
            .find(|&n| n > 1 && !self.shared.qps.read().contains_key(&n))
            .ok_or_else(|| Error::insufficient_resources("max_qp reached: no free QP number"))?;
        self.make_qp(pd, qpn, qpn, init.qp_type, 0, init)
    }

    fn create_gsi_qp(
        &self,
        pd: &RocePd,
        port: u8,
        init: &QpInit<'_, RoceCq, RoceSrq>,
    ) -> Result<RoceQp> {
        self.check_pd(pd)?;
        if self.shared.port(port).is_none() {
            return Err(Error::NotFound(format!("port {port}").into()));
        }
        self.check_caps(init)?;
        self.make_qp(pd, GSI_KEY | u32::from(port), 1, QpType::Gsi, port, init)
    }

    fn qp_num(&self, qp: &RoceQp) -> u32 {
        qp.inner.qpn
    }

    fn qp_footprint(&self, qp: &RoceQp) -> usize {
        qp.inner.footprint()
    }

    fn modify_qp(&self, qp: &RoceQp, m: &QpModify) -> Result<()> {
        qp.inner.modify(m)
    }

    fn query_qp(&self, qp: &RoceQp) -> Result<QpAttr> {
        Ok(qp.inner.query())
    }

    fn destroy_qp(&self, qp: RoceQp) -> Result<()> {
        drop(qp);
        Ok(())
    }

    fn post_send<'v, H>(
        &self,
        qp: &RoceQp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v RoceAv>,
    ) -> Result<()> {
        qp.inner.post_send(wrs, av_of)
    }

    fn post_recv(&self, qp: &RoceQp, wrs: &[RecvWr<'_>]) -> Result<()> {
        qp.inner.post_recv(wrs)
    }
}
