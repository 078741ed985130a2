//! Posting: receives and sends from the application, checked against the
//! QP's type, state and sizes, held in SQD, and given to the transport.

use al::{Error, Result};
use provider::{
    Access, AvAttr, QpState, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
};

use roce_transport::Memory;

use super::{send_opcode, AvView, HeldSend, HeldUd, QpCore, QpInner, Responding, QPN_MASK};
use crate::cq::Deferred;
use crate::mr::RecvEntry;

impl QpInner {
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::invalid_state(
                "the QP uses an SRQ; post receives to the SRQ",
            ));
        }
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.post_recv_locked(&mut core, wrs, &mut d);
            // A receive only changes what the transport has to do when
            // it completes at once (flushed in ERR): skip the drive (a
            // clock read, the send and completion queues' checks) on the
            // application's path otherwise.
            if core.t.as_ref().is_some_and(|t| t.has_completions()) {
                self.drive(&mut core, &mut d);
            }
            r
        };
        d.run();
        r
    }

    fn post_recv_locked(
        &self,
        core: &mut QpCore,
        wrs: &[RecvWr<'_>],
        d: &mut Deferred,
    ) -> Result<()> {
        for (i, wr) in wrs.iter().enumerate() {
            let state = core.attr.state;
            if !state.can_post_recv() {
                return Err(Error::InvalidQpState(
                    format!("receive {i}: cannot post receives in {state}").into(),
                ));
            }
            if wr.sg_list.len() > self.caps.max_recv_sge as usize {
                return Err(Error::invalid_parameter(format!(
                    "receive {i}: {} SGEs, the QP allows {}",
                    wr.sg_list.len(),
                    self.caps.max_recv_sge
                )));
            }
            if state == QpState::Err && core.t.is_none() {
                self.recv_cq
                    .push(self.wc(wr.wr_id, WcStatus::WrFlushError, WcOpcode::Recv), d);
                continue;
            }
            let mut rq = self.rq.lock();
            if rq.wrs.len() >= self.caps.max_recv_wr as usize {
                return Err(Error::insufficient_resources(format!(
                    "receive {i}: the receive queue is full ({} requests)",
                    self.caps.max_recv_wr
                )));
            }
            if let Some(t) = core.t.as_mut() {
                t.post_recv(wr)
                    .map_err(|e| Error::insufficient_resources(format!("receive {i}: {e}")))?;
            }
            let list = &mut *rq;
            for sge in wr.sg_list {
                self.dev.mrs.note_poster(sge, &mut list.seen, &self.rq);
            }
            list.wrs.push_back(RecvEntry {
                wr_id: wr.wr_id,
                sg: wr.sg_list.into(),
            });
        }
        Ok(())
    }

    /// Check a send against the QP type and resolve its destination.
    fn view<'a, H, A: AvView>(
        &self,
        i: usize,
        wr: &SendWr<'a, H>,
        av: Option<&'a A>,
    ) -> Result<Option<HeldUd>> {
        if wr.sg_list.len() > self.caps.max_send_sge as usize {
            return Err(Error::invalid_parameter(format!(
                "send {i}: {} SGEs, the QP allows {}",
                wr.sg_list.len(),
                self.caps.max_send_sge
            )));
        }
        let ok = match self.qp_type {
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
                wr.op, self.qp_type
            )));
        }
        if !self.qp_type.is_datagram() {
            return Ok(None);
        }
        let Some(u) = &wr.ud else {
            return Err(Error::invalid_parameter(format!(
                "send {i}: a datagram send needs a destination (ud)"
            )));
        };
        let Some(av) = av else {
            return Err(Error::invalid_parameter(format!(
                "send {i}: the destination names no address vector"
            )));
        };
        if av.pd() != self.pd {
            return Err(Error::invalid_parameter(format!(
                "send {i}: the AV belongs to another PD (or another device)"
            )));
        }
        if self.qp_type == QpType::Gsi && u.pkey_index != 0 {
            return Err(Error::invalid_parameter(format!(
                "send {i}: pkey_index {} is outside the port's P_Key table (one entry)",
                u.pkey_index
            )));
        }
        if u.remote_qpn > QPN_MASK {
            return Err(Error::invalid_parameter(format!(
                "send {i}: remote QPN must fit 24 bits"
            )));
        }
        Ok(Some(HeldUd {
            av: *av.attr(),
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
            pkey_index: u.pkey_index,
        }))
    }

    pub(crate) fn post_send<'v, H, A: AvView>(
        &self,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v A>,
    ) -> Result<()> {
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.post_send_locked(&mut core, wrs, av_of, &mut d);
            self.drive(&mut core, &mut d);
            r
        };
        d.run();
        r
    }

    fn post_send_locked<'v, H, A: AvView>(
        &self,
        core: &mut QpCore,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v A>,
        d: &mut Deferred,
    ) -> Result<()> {
        for (i, wr) in wrs.iter().enumerate() {
            let av = if self.qp_type.is_datagram() {
                av_of(i)
            } else {
                None
            };
            let ud = self.view(i, wr, av)?;
            let signaled = wr.signaled || self.sq_sig_all;
            match core.attr.state {
                QpState::Reset | QpState::Init | QpState::Rtr => {
                    return Err(Error::InvalidQpState(
                        format!("send {i}: cannot post sends in {}", core.attr.state).into(),
                    ))
                }
                QpState::Err | QpState::Sqe => {
                    self.send_cq.push(
                        self.wc(wr.wr_id, WcStatus::WrFlushError, send_opcode(&wr.op)),
                        d,
                    );
                    continue;
                }
                QpState::Sqd => {
                    // Refused at post as in RTS (the transport's rule):
                    // held, it would end flushed instead.
                    if core.attr.max_rd_atomic == 0
                        && matches!(
                            wr.op,
                            SendOp::Read { .. }
                                | SendOp::CompareSwap { .. }
                                | SendOp::FetchAdd { .. }
                        )
                    {
                        return Err(Error::invalid_parameter(format!(
                            "send {i}: READ and atomics need max_rd_atomic of at least 1"
                        )));
                    }
                    if core.held.len() >= self.caps.max_send_wr as usize {
                        return Err(Error::insufficient_resources(format!(
                            "send {i}: the send queue is full ({} requests held)",
                            self.caps.max_send_wr
                        )));
                    }
                    let leased = self.dev.mrs.hold(wr.sg_list);
                    core.held.push_back(HeldSend {
                        wr_id: wr.wr_id,
                        op: wr.op,
                        sg: wr.sg_list.to_vec(),
                        signaled,
                        solicited: wr.solicited,
                        ud,
                        leased,
                    });
                    continue;
                }
                QpState::Rts => {}
            }
            let twr = SendWr {
                wr_id: wr.wr_id,
                op: wr.op,
                sg_list: wr.sg_list,
                signaled,
                solicited: wr.solicited,
                ud: ud.as_ref().map(|u| UdDest {
                    av: &u.av,
                    remote_qpn: u.remote_qpn,
                    remote_qkey: u.remote_qkey,
                    pkey_index: u.pkey_index,
                }),
            };
            if let Err(e) = self.submit(core, &twr, d) {
                return Err(match e {
                    Error::InsufficientResources(s) => {
                        Error::InsufficientResources(format!("send {i}: {s}").into())
                    }
                    Error::InvalidParameter(s) => {
                        Error::InvalidParameter(format!("send {i}: {s}").into())
                    }
                    e => e,
                });
            }
        }
        Ok(())
    }

    /// Give one send to the transport (the QP is in RTS). An unreliable
    /// QP checks the local memory first: a send that fails locally
    /// completes with its error and moves the QP to SQE (after the sends
    /// before it completed).
    pub(super) fn submit(
        &self,
        core: &mut QpCore,
        wr: &SendWr<'_, AvAttr>,
        d: &mut Deferred,
    ) -> Result<()> {
        if core.t.is_none() {
            return Err(Error::InvalidQpState("the QP has no transport".into()));
        }
        if matches!(self.qp_type, QpType::Uc | QpType::Ud | QpType::Gsi) {
            let mtu = core
                .t
                .as_ref()
                .map_or(1024, |t| t.config().path_mtu.bytes()) as u64;
            let status = match self
                .mem(&mut core.mrs_seen)
                .check_local(wr.sg_list, Access::NONE)
            {
                Err(e) => Some(e.local_status()),
                Ok(len) if self.qp_type.is_datagram() && len > mtu => {
                    Some(WcStatus::LocalLengthError)
                }
                Ok(_) => None,
            };
            if let Some(status) = status {
                self.drive(core, d);
                self.send_cq
                    .push(self.wc(wr.wr_id, status, send_opcode(&wr.op)), d);
                core.attr.state = QpState::Sqe;
                self.publish_filter(&core.attr);
                return Ok(());
            }
        }
        let responds = matches!(
            wr.op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        let mut twr = *wr;
        twr.signaled |= responds;
        let r = match self.transport_post(core, &twr) {
            Ok(()) => Ok(()),
            Err(roce_transport::Error::QueueFull) => {
                // Completions waiting to be moved out count against the
                // queue: move them, then try once more.
                self.drive(core, d);
                self.transport_post(core, &twr).map_err(|_| {
                    Error::insufficient_resources(format!(
                        "the send queue is full ({} requests)",
                        self.caps.max_send_wr
                    ))
                })
            }
            Err(e) => Err(Error::invalid_parameter(e.to_string())),
        };
        if r.is_ok() && responds {
            core.responding.push_back(Responding {
                leased: self.dev.mrs.hold(wr.sg_list),
                sg: wr.sg_list.to_vec(),
                signaled: wr.signaled,
            });
        }
        r
    }

    /// Gives `wr` to the transport (the QP has one: `submit` checked).
    fn transport_post(
        &self,
        core: &mut QpCore,
        wr: &SendWr<'_, AvAttr>,
    ) -> std::result::Result<(), roce_transport::Error> {
        let mut mem = self.mem(&mut core.mrs_seen);
        match core.t.as_mut() {
            Some(t) => t.post_send(wr, &mut mem),
            None => Err(roce_transport::Error::InvalidWr("the QP has no transport")),
        }
    }
}
