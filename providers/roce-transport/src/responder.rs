//! The responder: checks the PSN of each request (IBTA vol. 1 §9.7.5.1),
//! executes SENDs, WRITEs, READs and atomics, and queues the answers:
//! coalesced ACKs, NAKs, READ responses and atomic ACKs, in PSN order.
//! Duplicate READ and atomic requests are answered from a replay cache
//! of `max_dest_rd_atomic` entries (§9.7.5.1.2, "responder resources").

use std::collections::VecDeque;
use std::time::Duration;

use provider::{Access, QpState, QpType, Wc, WcOpcode, WcStatus, GRH_SIZE};
use roce::{Aeth, AtomicAckEth, Bth, Frame, Headers, IpHeader, NakCode, Opcode, Packet, Syndrome};

use crate::memory::{AtomicOp, MemError, Memory};
use crate::psn;
use crate::transport::{RecvWqe, Source, Transmit, Transport};

/// Credit count sent in ACKs: "no credit information" (end-to-end flow
/// control is not implemented, IBTA §9.7.7.2).
const NO_CREDITS: u8 = Syndrome::INVALID_CREDITS;

/// A message being received (multi-packet SEND or WRITE).
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u32,
    },
    Write {
        rkey: u32,
        va: u64,
        offset: u32,
        total: u32,
    },
}

/// An answer waiting to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    /// ACK, RNR NAK or NAK of `psn`.
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
    },
    /// READ response packets `next..npkts` of a READ at `first_psn`
    /// (the point a resumed READ asked for), part of the READ first
    /// executed at `origin`.
    Read {
        first_psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
        next: u32,
        npkts: u32,
        msn: u32,
        origin: u32,
        replay: bool,
    },
    /// Atomic ACK of `psn` with the original value.
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
        replay: bool,
    },
}

impl Job {
    /// Whether this job answers a duplicate request from the replay
    /// cache (`Some(true)`), a request executed now (`Some(false)`), or
    /// is an ACK (`None`).
    fn replay(&self) -> Option<bool> {
        match *self {
            Job::Ack { .. } => None,
            Job::Read { replay, .. } | Job::Atomic { replay, .. } => Some(replay),
        }
    }
}

/// A READ or atomic served, kept to answer its duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    Read {
        first_psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
        npkts: u32,
        msn: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
    },
}

/// Responder state.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: u32,
    /// Messages completed (24 bits).
    pub msn: u32,
    /// A PSN sequence NAK (or RNR NAK) was sent for the current gap.
    pub nak_sent: bool,
    /// UC: drop packets until the next first/only.
    pub uc_dropping: bool,
    pub cur: Option<InMsg>,
    pub rq: VecDeque<RecvWqe>,
    pub out: VecDeque<Job>,
    pub replay: VecDeque<Replay>,
    /// READ/atomic jobs in `out` for requests executed (not replays):
    /// a requester within its `max_rd_atomic` never has more than
    /// `resources` of these waiting, since each is a READ or atomic it has
    /// not had the whole answer to.
    pub rd_jobs: usize,
    /// Jobs in `out` that answer duplicates from the replay cache: at most
    /// one per cached request, so at most `resources`. They are not
    /// counted against the requester's limit: a late duplicate may be
    /// replayed after the requester has its answer and moved on.
    pub replay_jobs: usize,
    /// Size of the replay cache and of the READ/atomic job limit
    /// (`max_dest_rd_atomic`; 0: READs and atomics are refused).
    pub resources: usize,
}

impl Responder {
    pub(crate) fn new(cfg: &crate::Config) -> Responder {
        Responder {
            epsn: cfg.rq_psn,
            msn: 0,
            nak_sent: false,
            uc_dropping: false,
            cur: None,
            rq: VecDeque::new(),
            out: VecDeque::new(),
            replay: VecDeque::new(),
            rd_jobs: 0,
            replay_jobs: 0,
            // 0 is none (IBTA): every READ and atomic is then NAKed as an
            // invalid request, as a responder that offered no resources.
            resources: usize::from(cfg.max_dest_rd_atomic),
        }
    }

    pub(crate) fn take_current_recv(&mut self) -> Option<RecvWqe> {
        match self.cur.take() {
            Some(InMsg::Send { wqe, .. }) => Some(wqe),
            _ => None,
        }
    }

    /// Queues an ACK of `psn`, merged with a queued ACK just before it.
    fn ack(&mut self, psn: u32) {
        let msn = self.msn;
        if let Some(Job::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.out.back_mut()
        {
            *p = psn;
            *m = msn;
            return;
        }
        self.out.push_back(Job::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credits: NO_CREDITS,
            },
            msn,
        });
    }

    fn nak(&mut self, psn: u32, syndrome: Syndrome) {
        let msn = self.msn;
        self.out.push_back(Job::Ack { psn, syndrome, msn });
    }

    /// Takes a READ/atomic job out of the counts when it leaves `out`.
    fn job_done(&mut self, job: &Job) {
        match job.replay() {
            Some(false) => self.rd_jobs = self.rd_jobs.saturating_sub(1),
            Some(true) => self.replay_jobs = self.replay_jobs.saturating_sub(1),
            None => {}
        }
    }

    /// Queues a replay of a cached READ or atomic. A job already queued
    /// for the same request is restarted at the point the duplicate asks
    /// for, as rxe does with its responder resource, rather than queued
    /// twice; otherwise a new job is queued if fewer than `resources`
    /// replays wait. Returns false when the duplicate is dropped.
    fn replay_job(&mut self, job: Job) -> bool {
        let same = |queued: &Job| match (queued, &job) {
            (Job::Read { origin: a, .. }, Job::Read { origin: b, .. }) => a == b,
            (Job::Atomic { psn: a, .. }, Job::Atomic { psn: b, .. }) => a == b,
            _ => false,
        };
        if let Some(queued) = self.out.iter_mut().find(|q| same(q)) {
            if let (Job::Read { replay: was, .. }, Job::Read { .. }) = (*queued, job) {
                // Restarted in its place (PSN order holds); it keeps the
                // count it was queued under.
                *queued = job;
                if let Job::Read { replay, .. } = queued {
                    *replay = was;
                }
            }
            // An atomic's answer is the same value: the queued one serves.
            return true;
        }
        if self.replay_jobs >= self.resources {
            return false;
        }
        self.replay_jobs += 1;
        self.out.push_back(job);
        true
    }

    fn remember(&mut self, r: Replay) {
        if self.replay.len() >= self.resources {
            self.replay.pop_front();
        }
        self.replay.push_back(r);
    }
}

/// P_Key match (IBTA §10.9.3): the low 15 bits agree and at least one of
/// the two is a full member.
pub fn pkey_match(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a | b) & 0x8000 != 0 && (a & 0x7fff) != 0
}

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
    /// Takes one decoded packet that arrived for this QP at `now`, from
    /// `src` (used by UD for the GRH). Packets of another QP, service or
    /// partition are dropped and counted; nothing here panics or grows
    /// without bound.
    pub fn handle_packet<M: Memory>(
        &mut self,
        now: Duration,
        src: &Source,
        pkt: &Packet<'_>,
        mem: &mut M,
    ) {
        // The receive stage ran these checks against the QP's filter; a
        // transport driven without it (tests, fuzzing) still refuses what
        // is not its own, with the same function.
        let own = crate::QpFilter {
            qpn: self.cfg.qpn,
            qp_type: self.cfg.qp_type,
            port: 0,
            state: self.state,
            pkey: self.cfg.pkey,
            qkey: self.cfg.qkey,
            path: None,
        };
        if let Err(why) = crate::receive::admit(&own, pkt) {
            match why {
                crate::Discard::BadPkey => self.counters.bad_pkey += 1,
                crate::Discard::BadQkey => self.counters.bad_qkey += 1,
                _ => self.counters.bad_opcode += 1,
            }
            return;
        }
        let bth = &pkt.headers.bth;
        match bth.opcode {
            Opcode::RcAck
            | Opcode::RcAtomicAck
            | Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly => self.handle_response(now, pkt, mem),
            Opcode::UdSendOnly | Opcode::UdSendOnlyImm => self.ud_receive(src, pkt, mem),
            _ if self.cfg.qp_type == QpType::Uc => self.uc_request(pkt, mem),
            _ => self.rc_request(pkt, mem),
        }
    }

    /// Runs the timers due at `now`: the retransmit timer (go-back-N from
    /// the oldest unacknowledged PSN, or RETRY_EXC_ERR) and the end of an
    /// RNR wait.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.state != QpState::Rts {
            return;
        }
        if self.sq.rnr_until.is_some_and(|t| now >= t) {
            self.sq.rnr_until = None;
        }
        self.retransmit_timeout(now);
    }

    fn rc_request<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        let d = psn::diff(p, self.resp.epsn);
        if d > 0 {
            // Invalid (ahead): NAK once per gap (§9.7.5.1.2).
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.resp.nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
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
            }
            Err(Fail::Nak(code)) => {
                self.counters.naks_sent += 1;
                // Class B/C errors: NAK, then the QP goes to ERR.
                self.enter_error(None);
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

    /// Runs a request at the expected PSN.
    fn execute<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) -> Result<(), Fail> {
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

    fn recv_error(&mut self, wqe: RecvWqe, status: WcStatus) {
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

    /// UC: PSN gaps drop the message in progress silently; errors drop
    /// the message; nothing is acknowledged (IBTA §9.8).
    fn uc_request<M: Memory>(&mut self, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        let starts = matches!(
            pkt.headers.bth.opcode.value() & 0x1f,
            0x00 | 0x04 | 0x05 | 0x06 | 0x0a | 0x0b
        );
        if p != self.resp.epsn {
            self.counters.out_of_sequence += 1;
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
    fn ud_receive<M: Memory>(&mut self, src: &Source, pkt: &Packet<'_>, mem: &mut M) {
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

    /// The next responder packet, if any.
    pub(crate) fn responder_transmit<M: Memory>(&mut self, mem: &mut M) -> Option<Transmit<R>> {
        let job = self.resp.out.front_mut()?;
        let dest = self.cfg.dest_qpn;
        let mtu = self.mtu;
        let (headers, payload, done) = match job {
            Job::Ack { psn, syndrome, msn } => {
                let mut h = Headers::new(Bth::new(Opcode::RcAck, dest, *psn));
                h.aeth = Some(Aeth {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                (h, Vec::new(), true)
            }
            Job::Atomic { psn, orig, msn, .. } => {
                let mut h = Headers::new(Bth::new(Opcode::RcAtomicAck, dest, *psn));
                h.aeth = Some(Aeth {
                    syndrome: Syndrome::Ack {
                        credits: NO_CREDITS,
                    },
                    msn: *msn,
                });
                h.atomic_ack_eth = Some(AtomicAckEth { original: *orig });
                (h, Vec::new(), true)
            }
            Job::Read {
                first_psn,
                rkey,
                va,
                len,
                next,
                npkts,
                msn,
                ..
            } => {
                let k = *next;
                let off = k * mtu;
                let size = (*len - off.min(*len)).min(mtu) as usize;
                let mut data = vec![0; size];
                let p = psn::add(*first_psn, k);
                if size > 0
                    && mem
                        .read_remote(*rkey, va.wrapping_add(u64::from(off)), &mut data)
                        .is_err()
                {
                    // The region went away under the READ (deregistered
                    // since the request was checked): the class C error
                    // the check would have found, so NAK remote access and
                    // go to ERR, as after any such NAK. The requester goes
                    // to ERR on the NAK; a responder left in RTS would go
                    // on serving a peer that can no longer talk to it.
                    let msn = *msn;
                    if let Some(job) = self.resp.out.pop_front() {
                        self.resp.job_done(&job);
                    }
                    self.counters.naks_sent += 1;
                    if self.state == QpState::Rts {
                        self.enter_error(None);
                    }
                    let mut h = Headers::new(Bth::new(Opcode::RcAck, dest, p));
                    h.aeth = Some(Aeth {
                        syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                        msn,
                    });
                    return Some(self.respond(h, Vec::new()));
                }
                let opcode = match (k, *npkts) {
                    (_, 1) => Opcode::RcReadResponseOnly,
                    (0, _) => Opcode::RcReadResponseFirst,
                    (k, n) if k + 1 == n => Opcode::RcReadResponseLast,
                    _ => Opcode::RcReadResponseMiddle,
                };
                let mut h = Headers::new(Bth::new(opcode, dest, p));
                if opcode.layout().aeth {
                    h.aeth = Some(Aeth {
                        syndrome: Syndrome::Ack {
                            credits: NO_CREDITS,
                        },
                        msn: *msn,
                    });
                }
                *next += 1;
                (h, data, *next >= *npkts)
            }
        };
        if done {
            if let Some(job) = self.resp.out.pop_front() {
                self.resp.job_done(&job);
            }
        }
        Some(self.respond(headers, payload))
    }

    fn respond(&self, mut h: Headers, payload: Vec<u8>) -> Transmit<R> {
        h.bth.pkey = self.cfg.pkey;
        Transmit {
            headers: h,
            payload: payload.into(),
            route: None,
        }
    }
}

/// The 40 bytes a UD receive buffer starts with: for IPv6 the IPv6 header,
/// for IPv4 twenty zero bytes and then the IPv4 header, as Linux rxe fills
/// them (`union rdma_network_hdr` in `include/rdma/ib_verbs.h`; rxe's
/// `send_data_in` copies the received IP header there).
pub fn grh_bytes(src: &Source, pkt: &Packet<'_>) -> [u8; GRH_SIZE] {
    let mut out = [0u8; GRH_SIZE];
    let frame = Frame {
        ip: src.ip,
        src_port: src.src_port,
        dst_port: src.dst_port,
        udp_checksum: false,
        packet: *pkt,
    };
    if let Ok(bytes) = frame.encode() {
        match src.ip {
            IpHeader::V4(_) => out[20..40].copy_from_slice(&bytes[..20]),
            IpHeader::V6(_) => out.copy_from_slice(&bytes[..40]),
        }
    }
    out
}
