//! A QP's attributes and states: `modify_qp` through the provider-neutral
//! checks of `provider::qp_state`, the transport made at RTR, and the
//! moves to RESET and ERR.

use al::sync::atomic::Ordering;

use al::{Error, Result};
use provider::qp_state;
use provider::{QpAttr, QpModify, QpState, QpType, RecvWr, SendWr, UdDest, WcOpcode, WcStatus};
use roce_transport::Transport;

use super::{fresh_attr, send_opcode, HeldSend, QpCore, QpInner};
use crate::cq::Deferred;
use crate::mr::{MrCache, RecvEntry};
use crate::timers::NO_DEADLINE;

impl QpInner {
    pub(crate) fn modify(&self, m: &QpModify) -> Result<()> {
        // ACKs held for this QP's peer leave before the QP changes (a move
        // to ERR would otherwise strand them: its peer's last request
        // would stay unacknowledged and end flushed).
        self.flush_held_acks();
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.modify_locked(&mut core, m, &mut d);
            self.publish_filter(&core.attr);
            r
        };
        d.run();
        r
    }

    fn modify_locked(&self, core: &mut QpCore, m: &QpModify, d: &mut Deferred) -> Result<()> {
        let from = core.attr.state;
        if let Some(cur) = m.cur_state {
            if cur != from {
                return Err(Error::InvalidQpState(
                    format!("cur_state says {cur} but the QP is in {from}").into(),
                ));
            }
        }
        qp_state::check_transition(self.qp_type, from, m.state, m.given())?;
        self.check_values(&core.attr, m)?;
        let to = m.state;
        match to {
            QpState::Reset => {
                self.reset(core);
                return Ok(());
            }
            QpState::Err => {
                self.enter_error(core, d);
                return Ok(());
            }
            _ => {}
        }
        let mut a = core.attr;
        m.apply_to(&mut a);
        a.state = to;
        let cfg = self.config(&a);
        match core.t.as_mut() {
            None if to == QpState::Rtr => {
                let mut t =
                    Transport::new(cfg).map_err(|e| Error::invalid_parameter(e.to_string()))?;
                // Receives posted in INIT go to the new transport.
                if self.srq.is_none() {
                    for e in &self.rq.lock().wrs {
                        t.post_recv(&RecvWr {
                            wr_id: e.wr_id,
                            sg_list: &e.sg,
                        })
                        .map_err(|e| Error::insufficient_resources(e.to_string()))?;
                    }
                }
                core.t = Some(t);
            }
            None => {}
            Some(t) => t
                .update_config(cfg)
                .map_err(|e| Error::invalid_parameter(e.to_string()))?,
        }
        core.attr = a;
        if to == QpState::Rts && !core.held.is_empty() {
            // Back from SQD: the held sends go, in order.
            let held: Vec<HeldSend> = core.held.drain().collect();
            for h in held {
                if h.leased {
                    self.dev.mrs.release(&h.sg);
                }
                let wr = SendWr {
                    wr_id: h.wr_id,
                    op: h.op,
                    sg_list: &h.sg,
                    signaled: h.signaled,
                    solicited: h.solicited,
                    ud: h.ud.as_ref().map(|u| UdDest {
                        av: &u.av,
                        remote_qpn: u.remote_qpn,
                        remote_qkey: u.remote_qkey,
                        pkey_index: u.pkey_index,
                    }),
                };
                // A refusal here (queue full) cannot name a request the
                // caller still holds: it completes with a flush instead.
                if self.submit(core, &wr, d).is_err() {
                    self.send_cq.push(
                        self.wc(h.wr_id, WcStatus::WrFlushError, send_opcode(&h.op)),
                        d,
                    );
                }
            }
        }
        self.drive(core, d);
        Ok(())
    }

    fn reset(&self, core: &mut QpCore) {
        self.release_leases(core);
        core.t = None;
        self.release_responding(core);
        for h in core.held.drain() {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
        }
        self.rq.lock().wrs.clear();
        let port = if self.qp_type == QpType::Gsi {
            core.attr.port
        } else {
            0
        };
        core.attr = fresh_attr(self.qpn, self.qp_type, self.caps, self.sq_sig_all, port);
        core.mrs_seen = MrCache::default();
        self.deadline.store(NO_DEADLINE, Ordering::SeqCst);
    }

    /// To ERR: everything outstanding is flushed, in order.
    fn enter_error(&self, core: &mut QpCore, d: &mut Deferred) {
        if core.attr.state == QpState::Reset {
            core.attr.state = QpState::Err;
            return;
        }
        match core.t.as_mut() {
            Some(t) => {
                t.set_error();
                core.attr.state = QpState::Err;
                self.drive(core, d);
            }
            None => {
                core.attr.state = QpState::Err;
                let wrs: Vec<RecvEntry> = self.rq.lock().wrs.drain(..).collect();
                for e in wrs {
                    self.recv_cq
                        .push(self.wc(e.wr_id, WcStatus::WrFlushError, WcOpcode::Recv), d);
                }
            }
        }
        self.flush_held(core, d);
    }

    fn flush_held(&self, core: &mut QpCore, d: &mut Deferred) {
        for h in core.held.drain() {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
            self.send_cq.push(
                self.wc(h.wr_id, WcStatus::WrFlushError, send_opcode(&h.op)),
                d,
            );
        }
    }

    fn check_values(&self, cur: &QpAttr, m: &QpModify) -> Result<()> {
        if self.qp_type == QpType::Gsi && m.port.is_some_and(|p| p != cur.port) {
            return Err(Error::invalid_parameter("a GSI QP's port is fixed"));
        }
        self.dev
            .with_limits(|l| provider::qp_state::check_modify_values(cur.port, m, l))
    }
}
