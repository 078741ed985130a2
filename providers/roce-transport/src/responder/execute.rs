//! Running a request at the expected PSN: SEND data into the receive it
//! takes, WRITE into the MR its R_Key names, READs and atomics queued as
//! jobs, each check answered with the NAK IBTA names.

use provider::{Access, Wc, WcOpcode, WcStatus};
use roce::{NakCode, Opcode, Packet};

use super::state::{InMsg, Job, Replay};
use super::{remote, Fail};
use crate::memory::{AtomicOp, MemError, Memory};
use crate::psn;
use crate::transport::Transport;
use crate::wqe::RecvWqe;

impl<R: Clone> Transport<R> {
    /// Runs a request at the expected PSN.
    pub(super) fn execute<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) -> Result<(), Fail> {
        use Opcode::*;
        let h = &pkt.headers;
        let opcode = h.bth.opcode;
        // The RC opcode (UC opcodes map onto it).
        let rc = Opcode::from_u8(opcode.value() & 0x1f).unwrap_or(opcode);
        let mtu = self.mtu as usize;
        let len = pkt.payload.len();
        let in_send = matches!(self.resp.cur, Some(InMsg::Send { .. }));
        let in_write = matches!(self.resp.cur, Some(InMsg::Write { .. }));
        let invalid = Err(Fail::Nak(NakCode::InvalidRequest));
        // Opcode sequence (§9.7.5.1.3) and payload length checks.
        let seq_ok = match rc {
            RcSendFirst | RcSendOnly | RcSendOnlyImm | RcSendOnlyInvalidate | RcWriteFirst
            | RcWriteOnly | RcWriteOnlyImm | RcReadRequest | RcCompareSwap | RcFetchAdd => {
                self.resp.cur.is_none()
            }
            RcSendMiddle | RcSendLast | RcSendLastImm | RcSendLastInvalidate => in_send,
            RcWriteMiddle | RcWriteLast | RcWriteLastImm => in_write,
            _ => false,
        };
        if !seq_ok {
            return invalid;
        }
        let len_ok = match rc {
            RcSendFirst | RcSendMiddle | RcWriteFirst | RcWriteMiddle => len == mtu,
            _ => len <= mtu,
        };
        if !len_ok {
            return invalid;
        }
        match rc {
            RcSendFirst | RcSendOnly | RcSendOnlyImm | RcSendOnlyInvalidate => {
                let Some(wqe) = self.resp.rq.pop_front() else {
                    return Err(Fail::Rnr);
                };
                self.resp.cur = Some(InMsg::Send { wqe, offset: 0 });
                self.recv_data(pkt, mem)
            }
            RcSendMiddle | RcSendLast | RcSendLastImm | RcSendLastInvalidate => {
                self.recv_data(pkt, mem)
            }
            RcWriteFirst | RcWriteOnly | RcWriteOnlyImm => {
                if !self.cfg.access.contains(Access::REMOTE_WRITE) {
                    return invalid;
                }
                let Some(reth) = h.reth else { return invalid };
                if reth.dma_len > crate::MAX_MSG {
                    return invalid;
                }
                if rc != RcWriteFirst && len as u32 != reth.dma_len {
                    return invalid;
                }
                if rc == RcWriteFirst && (reth.dma_len as usize) <= mtu {
                    return invalid;
                }
                if reth.dma_len > 0 {
                    mem.check_remote(
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_WRITE,
                    )
                    .map_err(remote)?;
                }
                if rc == RcWriteOnlyImm && self.resp.rq.is_empty() {
                    return Err(Fail::Rnr);
                }
                self.resp.cur = Some(InMsg::Write {
                    rkey: reth.rkey,
                    va: reth.va,
                    offset: 0,
                    total: reth.dma_len,
                });
                self.write_data(pkt, mem)
            }
            RcWriteMiddle | RcWriteLast | RcWriteLastImm => {
                if rc == RcWriteLastImm && self.resp.rq.is_empty() {
                    return Err(Fail::Rnr);
                }
                self.write_data(pkt, mem)
            }
            RcReadRequest => {
                if !self.cfg.access.contains(Access::REMOTE_READ) {
                    return invalid;
                }
                let Some(reth) = h.reth else { return invalid };
                if reth.dma_len > crate::MAX_MSG {
                    return invalid;
                }
                if self.resp.rd_jobs >= self.resp.resources {
                    // More READs than the resources we offered: the
                    // requester broke max_rd_atomic (§9.4.4).
                    return invalid;
                }
                if reth.dma_len > 0 {
                    mem.check_remote(
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_READ,
                    )
                    .map_err(remote)?;
                }
                let npkts = psn::packets(reth.dma_len, self.mtu);
                let p = h.bth.psn;
                self.resp.epsn = psn::add(p, npkts);
                self.resp.msn = psn::add(self.resp.msn, 1);
                let msn = self.resp.msn;
                self.resp.rd_jobs += 1;
                self.resp.out.push_back(Job::Read {
                    first_psn: p,
                    rkey: reth.rkey,
                    va: reth.va,
                    len: reth.dma_len,
                    next: 0,
                    npkts,
                    msn,
                    origin: p,
                    replay: false,
                });
                self.resp.remember(Replay::Read {
                    first_psn: p,
                    rkey: reth.rkey,
                    va: reth.va,
                    len: reth.dma_len,
                    npkts,
                    msn,
                });
                Ok(())
            }
            RcCompareSwap | RcFetchAdd => {
                if !self.cfg.access.contains(Access::REMOTE_ATOMIC) {
                    return invalid;
                }
                let Some(a) = h.atomic_eth else {
                    return invalid;
                };
                if a.va % 8 != 0 {
                    return invalid;
                }
                if self.resp.rd_jobs >= self.resp.resources {
                    return invalid;
                }
                let op = if rc == RcCompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                mem.check_remote(a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
                    .map_err(remote)?;
                let orig = mem.atomic(a.rkey, a.va, op).map_err(remote)?;
                let p = h.bth.psn;
                self.resp.epsn = psn::add(p, 1);
                self.resp.msn = psn::add(self.resp.msn, 1);
                let msn = self.resp.msn;
                self.resp.rd_jobs += 1;
                self.resp.out.push_back(Job::Atomic {
                    psn: p,
                    orig,
                    msn,
                    replay: false,
                });
                self.resp.remember(Replay::Atomic { psn: p, orig, msn });
                Ok(())
            }
            _ => invalid,
        }
    }

    /// SEND payload into the current receive; completes it on the last
    /// packet.
    fn recv_data<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) -> Result<(), Fail> {
        let h = &pkt.headers;
        let Some(InMsg::Send { wqe, offset }) = self.resp.cur.as_mut() else {
            return Err(Fail::Nak(NakCode::InvalidRequest));
        };
        let at = *offset;
        if let Err(e) = mem.scatter(&wqe.sges, u64::from(at), pkt.payload) {
            // Too long for the receive buffer: invalid request; a bad
            // receive L_Key: remote operational error (§9.7.5.2.4).
            let wqe = wqe.clone();
            self.resp.cur = None;
            let (local, nak) = match e {
                MemError::TooShort => (WcStatus::LocalLengthError, NakCode::InvalidRequest),
                _ => (
                    WcStatus::LocalProtectionError,
                    NakCode::RemoteOperationalError,
                ),
            };
            self.recv_error(wqe, local);
            return Err(Fail::Nak(nak));
        }
        *offset = at + pkt.payload.len() as u32;
        let last = matches!(
            h.bth.opcode.value() & 0x1f,
            0x02 | 0x03 | 0x04 | 0x05 | 0x16 | 0x17
        );
        if last {
            if let Some(ieth) = h.ieth {
                if mem.invalidate(ieth.rkey).is_err() {
                    // The message landed but names no key this QP may
                    // invalidate: its receive completes in error
                    // (REM_INV_REQ_ERR, as rxe's class J) rather than
                    // vanish with the message, then NAK and ERR.
                    if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
                        self.recv_error(wqe, WcStatus::RemoteInvalidRequest);
                    }
                    return Err(Fail::Nak(NakCode::InvalidRequest));
                }
            }
            let Some(InMsg::Send { wqe, offset }) = self.resp.cur.take() else {
                return Ok(());
            };
            self.completions.push_back(Wc {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: offset,
                imm: h.imm.map(|i| i.value),
                qp_num: self.cfg.qpn,
                src_qp: self.cfg.dest_qpn,
                solicited: h.bth.solicited,
                ..Wc::default()
            });
        }
        Ok(())
    }

    pub(super) fn recv_error(&mut self, wqe: RecvWqe, status: WcStatus) {
        self.completions.push_back(Wc {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.cfg.qpn,
            ..Wc::default()
        });
    }

    /// WRITE payload into the target; consumes a receive for the
    /// immediate on the last packet.
    fn write_data<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) -> Result<(), Fail> {
        let h = &pkt.headers;
        let Some(InMsg::Write {
            rkey,
            va,
            offset,
            total,
        }) = self.resp.cur.as_mut()
        else {
            return Err(Fail::Nak(NakCode::InvalidRequest));
        };
        let len = pkt.payload.len() as u32;
        let end = offset.saturating_add(len);
        let rc = h.bth.opcode.value() & 0x1f;
        let last = matches!(rc, 0x08..=0x0b);
        if end > *total || (last && end != *total) {
            self.resp.cur = None;
            return Err(Fail::Nak(NakCode::InvalidRequest));
        }
        if len > 0 {
            let at = va.wrapping_add(u64::from(*offset));
            if let Err(e) = mem.write_remote(*rkey, at, pkt.payload) {
                self.resp.cur = None;
                return Err(remote(e));
            }
        }
        *offset = end;
        if last {
            let total = *total;
            self.resp.cur = None;
            if let Some(imm) = h.imm {
                let Some(wqe) = self.resp.rq.pop_front() else {
                    return Err(Fail::Rnr);
                };
                self.completions.push_back(Wc {
                    wr_id: wqe.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: total,
                    imm: Some(imm.value),
                    qp_num: self.cfg.qpn,
                    src_qp: self.cfg.dest_qpn,
                    solicited: h.bth.solicited,
                    ..Wc::default()
                });
            }
        }
        Ok(())
    }
}
