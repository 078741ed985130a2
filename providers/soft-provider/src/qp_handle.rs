//! A soft HCA's queue-pair handle: posting, modify, query, destroy.

use crate::engine::drain_pending;
use crate::handles::SoftAv;
use crate::hca_core::Charge;
use crate::node::{FabricInner, HcaNode};
use crate::qp::{Deferred, QpInner, UdInfo, WrView, PSN_MASK};
use crate::{engine, fast};
use al::sync::atomic::Ordering;
use al::sync::Arc;
use al::{Error, Result};
use provider::{QpAttr, QpModify, QpState, QpType, RecvWr, SendOp, SendWr};

/// A queue pair. Dropping it destroys it (outstanding work is discarded
/// without completions).
pub struct SoftQp {
    /// Its place in the HCA's `max_qp`.
    pub(crate) _charge: Charge,
    pub(crate) inner: Arc<QpInner>,
    pub(crate) fabric: Arc<FabricInner>,
    pub(crate) node: Arc<HcaNode>,
    pub(crate) key: u32,
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
    /// Bytes this QP holds (`Device::qp_footprint`): its state, its shared
    /// receive queue, the queues' allocations and its entry in the HCA's
    /// QP map.
    pub(crate) fn footprint(&self) -> usize {
        use al::footprint::{allocated, arc_bytes};
        use std::mem::size_of;
        let sq = {
            let sq = self.inner.sq.lock();
            sq.pending.capacity() * size_of::<crate::qp::PendingWr>()
        };
        let rq = {
            let rq = self.inner.rq.lock();
            rq.wrs.capacity() * size_of::<crate::queues::RecvEntry>()
        };
        let heap = |n: usize| if n == 0 { 0 } else { allocated(n) };
        arc_bytes::<QpInner>()
            + arc_bytes::<crate::queues::Posted<crate::qp::RecvQueue>>()
            + heap(sq)
            + heap(rq)
            + (size_of::<(u32, Arc<QpInner>)>() + 1) * 8 / 7
    }

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
        let r = QpInner::modify(&self.inner, m, &mut d, |qp, sq, d| {
            drain_pending(&self.fabric, qp, sq, d)
        });
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
