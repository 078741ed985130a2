//! The responder: checks the PSN of each request (IBTA vol. 1 §9.7.5.1),
//! executes SENDs, WRITEs, READs and atomics, and queues the answers:
//! coalesced ACKs, NAKs, READ responses and atomic ACKs, in PSN order.
//! Duplicate READ and atomic requests are answered from a replay cache
//! of `max_dest_rd_atomic` entries (§9.7.5.1.2, "responder resources").
//!
//! Here: requests in, by service (RC with its PSN checks and duplicates,
//! UC, UD). `state` is what the responder keeps, `execute` runs a request
//! at the expected PSN, `answer` turns the queued answers into packets.

mod answer;
mod execute;
pub(crate) mod state;

pub use self::answer::grh_bytes;

use provider::{Wc, WcOpcode, WcStatus, GRH_SIZE};
use roce::{NakCode, Opcode, Packet, Syndrome};

use self::state::{InMsg, Job, Replay};
use crate::memory::{MemError, Memory};
use crate::psn;
use crate::trace;
use crate::transport::{Source, Transport};

/// Why a request failed at the responder.
enum Fail {
    /// NAK with this code; the QP goes to ERR (RC), the message is
    /// dropped (UC).
    Nak(NakCode),
    /// No receive posted: RNR NAK (RC), drop (UC).
    Rnr,
}

fn remote(e: MemError) -> Fail {
    let _ = e;
    Fail::Nak(NakCode::RemoteAccessError)
}

impl<R: Clone> Transport<R> {
    pub(crate) fn rc_request<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        let d = psn::diff(p, self.resp.epsn);
        if d > 0 {
            // Invalid (ahead): NAK once per gap (§9.7.5.1.2).
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.resp.nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
                trace::nak_sent(&self.cfg, e, Syndrome::Nak(NakCode::PsnSequenceError));
                self.counters.naks_sent += 1;
            }
            return;
        }
        if d < 0 {
            self.counters.duplicates += 1;
            self.duplicate(pkt);
            return;
        }
        self.resp.nak_sent = false;
        let opcode = pkt.headers.bth.opcode;
        match self.execute(pkt, mem) {
            Ok(()) => {
                let ends = !matches!(
                    opcode,
                    Opcode::RcSendFirst
                        | Opcode::RcSendMiddle
                        | Opcode::RcWriteFirst
                        | Opcode::RcWriteMiddle
                );
                match opcode {
                    Opcode::RcReadRequest | Opcode::RcCompareSwap | Opcode::RcFetchAdd => {}
                    _ => {
                        self.resp.epsn = psn::add(p, 1);
                        if ends {
                            self.resp.msn = psn::add(self.resp.msn, 1);
                        }
                        if ends || pkt.headers.bth.ack_req {
                            self.resp.ack(p);
                        }
                    }
                }
            }
            Err(Fail::Rnr) => {
                self.counters.rnr_naks_sent += 1;
                // Later packets of the same burst are not NAKed again.
                self.resp.nak_sent = true;
                let t = self.cfg.min_rnr_timer;
                self.resp.nak(p, Syndrome::RnrNak { timer: t });
                trace::nak_sent(&self.cfg, p, Syndrome::RnrNak { timer: t });
            }
            Err(Fail::Nak(code)) => {
                self.counters.naks_sent += 1;
                // Class B/C errors: NAK, then the QP goes to ERR.
                trace::nak_sent(&self.cfg, p, Syndrome::Nak(code));
                self.enter_error(None, "NAK sent for a request in error");
                self.resp.nak(p, Syndrome::Nak(code));
            }
        }
    }

    /// A request in the duplicate region: re-ACK, or replay a READ or an
    /// atomic from the cache (§9.7.5.1.2 and §9.7.5.2.x).
    fn duplicate(&mut self, pkt: &Packet<'_>) {
        let p = pkt.headers.bth.psn;
        match pkt.headers.bth.opcode {
            Opcode::RcReadRequest => {
                let Some(reth) = pkt.headers.reth else { return };
                let mtu = u64::from(self.mtu);
                // The request must be the cached one, or its tail (a
                // requester resuming at a later PSN with the address and
                // length moved along); it is then served as a new READ.
                let hit = self.resp.replay.iter().find_map(|r| match *r {
                    Replay::Read {
                        first_psn,
                        rkey,
                        va,
                        len,
                        npkts,
                        msn,
                    } => {
                        let k = psn::diff(p, first_psn);
                        if k < 0 || k as u32 >= npkts {
                            return None;
                        }
                        let off = k as u64 * mtu;
                        let same = rkey == reth.rkey
                            && va.wrapping_add(off) == reth.va
                            && u64::from(len) == u64::from(reth.dma_len) + off;
                        same.then_some(Job::Read {
                            first_psn: p,
                            rkey,
                            va: reth.va,
                            len: reth.dma_len,
                            next: 0,
                            npkts: npkts - k as u32,
                            msn,
                            origin: first_psn,
                            replay: true,
                        })
                    }
                    _ => None,
                });
                match hit {
                    Some(job) => {
                        if !self.resp.replay_job(job) {
                            self.counters.resources_busy += 1;
                            trace::dropped(&self.cfg, p, "READ/atomic responder resources busy");
                        }
                    }
                    None => self.counters.ignored_responses += 1,
                }
            }
            Opcode::RcCompareSwap | Opcode::RcFetchAdd => {
                let hit = self.resp.replay.iter().find_map(|r| match *r {
                    Replay::Atomic { psn, orig, msn } if psn == p => Some(Job::Atomic {
                        psn,
                        orig,
                        msn,
                        replay: true,
                    }),
                    _ => None,
                });
                match hit {
                    Some(job) => {
                        if !self.resp.replay_job(job) {
                            self.counters.resources_busy += 1;
                            trace::dropped(&self.cfg, p, "READ/atomic responder resources busy");
                        }
                    }
                    None => self.counters.ignored_responses += 1,
                }
            }
            _ => {
                // SEND/WRITE already executed: ACK what we have.
                let last = psn::prev(self.resp.epsn);
                self.resp.ack(last);
            }
        }
    }

    /// UC: PSN gaps drop the message in progress silently; errors drop
    /// the message; nothing is acknowledged (IBTA §9.8).
    pub(crate) fn uc_request<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        let starts = matches!(
            pkt.headers.bth.opcode.value() & 0x1f,
            0x00 | 0x04 | 0x05 | 0x06 | 0x0a | 0x0b
        );
        if p != self.resp.epsn {
            self.counters.out_of_sequence += 1;
            trace::dropped(
                &self.cfg,
                p,
                "PSN gap (UC): the message in progress is abandoned",
            );
            self.uc_abandon();
        }
        self.resp.epsn = psn::add(p, 1);
        if self.resp.uc_dropping {
            if !starts {
                return;
            }
            self.resp.uc_dropping = false;
        }
        if starts && self.resp.cur.is_some() {
            // A new message while one was in progress: its end was lost.
            self.uc_abandon();
            self.resp.uc_dropping = false;
        }
        match self.execute(pkt, mem) {
            Ok(()) => {}
            Err(fail) => {
                if matches!(fail, Fail::Rnr) {
                    self.counters.no_receive += 1;
                    trace::dropped(&self.cfg, p, "no receive posted");
                }
                self.uc_abandon();
            }
        }
    }

    /// Drops the UC message in progress; its receive goes back to the
    /// head of the queue for the next message.
    fn uc_abandon(&mut self) {
        if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
            self.resp.rq.push_front(wqe);
        }
        self.resp.cur = None;
        self.resp.uc_dropping = true;
    }

    /// UD: Q_Key check, one packet per message, the GRH area in the first
    /// 40 bytes of the receive buffer (IBTA §9.8.4 and A17.4.5.1).
    pub(crate) fn ud_receive<M: Memory>(&mut self, src: &Source, pkt: &Packet<'_>, mem: &mut M) {
        let h = &pkt.headers;
        // `admit` checked the DETH's presence and Q_Key.
        let Some(deth) = h.deth else {
            self.counters.bad_opcode += 1;
            return;
        };
        if pkt.payload.len() > self.mtu as usize {
            self.counters.bad_opcode += 1;
            return;
        }
        let Some(wqe) = self.resp.rq.pop_front() else {
            self.counters.no_receive += 1;
            trace::dropped(&self.cfg, h.bth.psn, "no receive posted");
            return;
        };
        let grh = grh_bytes(src, pkt);
        let status = match mem
            .scatter(&wqe.sges, 0, &grh)
            .and_then(|()| mem.scatter(&wqe.sges, GRH_SIZE as u64, pkt.payload))
        {
            Ok(()) => WcStatus::Success,
            Err(e) => e.local_status(),
        };
        if status != WcStatus::Success {
            self.recv_error(wqe, status);
            return;
        }
        self.completions.push_back(Wc {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: (GRH_SIZE + pkt.payload.len()) as u32,
            imm: h.imm.map(|i| i.value),
            qp_num: self.cfg.qpn,
            src_qp: deth.src_qp,
            grh: true,
            solicited: h.bth.solicited,
            ..Wc::default()
        });
    }
}
