//! The requester: turns send work requests into packets (IBTA vol. 1
//! §9.7.1 and §9.7.2): segmentation at the path MTU, PSN assignment,
//! AckReq, the send window (1 MiB of payload, 128 to 1024 PSNs) and the
//! READ/atomic limit.

use std::time::Duration;

use provider::{QpState, QpType, SendOp, WcStatus};
use roce::{AtomicEth, Bth, Deth, Headers, ImmDt, Opcode, Reth};

use crate::psn;
use crate::timers::ack_timeout;
use crate::transport::{Transmit, Transport};
use crate::wqe::SendWqe;
use crate::{Leased, MemError, Payload};

/// At most this many PSNs may be sent and not yet acknowledged (at MTU
/// 1024 and below; see [`max_unacked_psns`]).
pub const MAX_UNACKED_PSNS: u32 = 1024;

/// Bytes of payload a requester keeps in flight at most: the window in
/// PSNs is this over the path MTU, between 128 and [`MAX_UNACKED_PSNS`].
/// Why: a window of 128 PSNs (what it was) left the sender idle while the
/// receiver worked through each window and the receiver idle while the
/// sender refilled it (half of two cores idle in `perf write-bw`, 4.5
/// Gbit/s at MTU 1024, 9.4 with 1024 PSNs: `docs/benchmarks.md`). 1 MiB
/// in flight stays within the 4 MiB socket buffers the provider asks for,
/// so a receiver that stalls does not drop the window's tail.
pub const MAX_UNACKED_BYTES: u32 = 1 << 20;

/// The window for packets of messages that take a receive at the
/// responder (SENDs, WRITE with immediate): the responder's receive queue,
/// not its buffers, is what they fill, and this transport does not follow
/// the responder's end-to-end credits (AETH), so a deeper window only
/// outruns the receives a consumer keeps posted: `perf send-rate` with
/// 512 receives posted fell from 1.8-2.6x raw UDP to 0.65x with 1,024
/// SENDs in flight (RNR NAKs and their waits).
pub const SEND_WINDOW_PSNS: u32 = 128;

/// The window a packet of a message doing `op` waits for: RDMA WRITE and
/// READ and atomics take no receive and get [`max_unacked_psns`]; the
/// rest [`SEND_WINDOW_PSNS`].
fn window_for(op: &SendOp, mtu: u32) -> u32 {
    match op {
        SendOp::Write { .. }
        | SendOp::Read { .. }
        | SendOp::CompareSwap { .. }
        | SendOp::FetchAdd { .. } => max_unacked_psns(mtu),
        _ => SEND_WINDOW_PSNS,
    }
}

/// The send window in PSNs at path MTU `mtu` bytes.
pub const fn max_unacked_psns(mtu: u32) -> u32 {
    let w = MAX_UNACKED_BYTES / if mtu == 0 { 1 } else { mtu };
    if w < 128 {
        128
    } else if w > MAX_UNACKED_PSNS {
        MAX_UNACKED_PSNS
    } else {
        w
    }
}

/// AckReq is set at least once every this many packets.
pub const ACKREQ_EVERY: u32 = 64;

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    Only,
    First,
    Middle,
    Last,
}

fn pos(k: u32, n: u32) -> Pos {
    match (k, n) {
        (_, 1) => Pos::Only,
        (0, _) => Pos::First,
        (k, n) if k + 1 == n => Pos::Last,
        _ => Pos::Middle,
    }
}

/// The RC opcode of a SEND or WRITE packet; UC opcodes are these plus 0x20.
fn rc_opcode(op: &SendOp, p: Pos) -> Opcode {
    use Opcode::*;
    match (op, p) {
        (SendOp::Send, Pos::Only) => RcSendOnly,
        (SendOp::SendImm(_), Pos::Only) => RcSendOnlyImm,
        (SendOp::Send | SendOp::SendImm(_), Pos::First) => RcSendFirst,
        (SendOp::Send | SendOp::SendImm(_), Pos::Middle) => RcSendMiddle,
        (SendOp::Send, Pos::Last) => RcSendLast,
        (SendOp::SendImm(_), Pos::Last) => RcSendLastImm,
        (SendOp::WriteImm { .. }, Pos::Only) => RcWriteOnlyImm,
        (_, Pos::Only) => RcWriteOnly,
        (_, Pos::First) => RcWriteFirst,
        (_, Pos::Middle) => RcWriteMiddle,
        (SendOp::WriteImm { .. }, Pos::Last) => RcWriteLastImm,
        (_, Pos::Last) => RcWriteLast,
    }
}

fn imm_of(op: &SendOp) -> Option<u32> {
    match *op {
        SendOp::SendImm(i) => Some(i),
        SendOp::WriteImm { imm, .. } => Some(imm),
        _ => None,
    }
}

impl<R: Clone> Transport<R> {
    /// The next requester packet, if the window, the READ/atomic limit and
    /// the RNR pause allow one.
    pub(crate) fn requester_transmit<M: crate::Memory>(
        &mut self,
        now: Duration,
        mem: &mut M,
    ) -> Option<Transmit<R>> {
        if self.state != QpState::Rts {
            return None;
        }
        if let Some(until) = self.sq.rnr_until {
            if now < until {
                return None;
            }
            self.sq.rnr_until = None;
        }
        // Work requests that failed at post time complete in order; a
        // datagram QP goes on past them.
        while self.sq.tx_idx == 0 {
            let Some(status) = self.sq.wqes.front().and_then(|w| w.failed) else {
                break;
            };
            self.head_failed(status);
            if self.state != QpState::Rts {
                return None;
            }
        }
        let w = self.sq.wqes.get(self.sq.tx_idx)?;
        if w.failed.is_some() {
            return None;
        }
        let k = self.sq.tx_pkt;
        let p = psn::add(w.first_psn, k);
        let rc = self.cfg.qp_type == QpType::Rc;
        if rc && psn::diff(p, self.sq.una) >= window_for(&w.op, self.mtu) as i32 {
            return None;
        }
        if rc && k == 0 && w.needs_response() {
            let busy = self
                .sq
                .wqes
                .iter()
                .take(self.sq.tx_idx)
                .filter(|o| o.needs_response())
                .count();
            // max_rd_atomic 0 never gets here with a READ or atomic
            // queued: post_send and update_config refuse that.
            if busy >= usize::from(self.cfg.max_rd_atomic) {
                return None;
            }
        }
        // A leased message is read from memory now, packet by packet, or
        // by the driver as it encodes the packet (RC only: a datagram
        // QP's request completes as its last packet is built).
        let gathered = if w.leased {
            let mtu = self.mtu as usize;
            let len = w.len as usize;
            let at = (k as usize * mtu).min(len);
            let n = (at + mtu).min(len) - at;
            if rc && mem.reads_as_encoded() {
                Some(Payload::Leased(Leased::new(&w.sges, at as u64, n)))
            } else {
                let mut bytes = mem.packet_buffer(n);
                if let Err(e) = mem.gather(&w.sges, at as u64, &mut bytes) {
                    // The memory went away under the request (its MR was
                    // deregistered): it fails when it reaches the head, as
                    // a request failing its checks at post does.
                    self.sq.wqes[self.sq.tx_idx].failed = Some(e.local_status());
                    return None;
                }
                Some(Payload::Owned(bytes))
            }
        } else {
            None
        };
        let t = Self::build(
            &self.cfg,
            self.mtu,
            &mut self.sq.since_ackreq,
            w,
            k,
            p,
            gathered,
        );
        let last_of_msg = match w.op {
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => true,
            _ => k + 1 >= w.npkts,
        };
        let npkts = w.npkts;
        let first_psn = w.first_psn;
        let is_read = matches!(w.op, SendOp::Read { .. });
        if is_read {
            self.sq.wqes[self.sq.tx_idx].read_base = k;
        }
        // Advance the cursor; a READ request stands for all its PSNs.
        if last_of_msg {
            self.sq.tx_idx += 1;
            self.sq.tx_pkt = 0;
        } else {
            self.sq.tx_pkt += 1;
        }
        let end = if is_read {
            psn::add(first_psn, npkts)
        } else {
            psn::add(p, 1)
        };
        if psn::diff(end, self.sq.sent_end) > 0 {
            self.sq.sent_end = end;
        }
        match self.cfg.qp_type {
            QpType::Rc => {
                if self.sq.retrans_at.is_none() {
                    self.sq.retrans_at = ack_timeout(self.cfg.timeout).map(|d| now + d);
                }
            }
            _ => {
                // Unreliable: complete as soon as the last packet is out.
                if last_of_msg {
                    self.sq.tx_idx -= 1;
                    if let Some(done) = self.sq.wqes.remove(self.sq.tx_idx) {
                        self.sq.una = psn::add(done.first_psn, done.npkts);
                        self.complete_send(&done, WcStatus::Success);
                        self.recycle(done.data);
                    }
                }
            }
        }
        Some(t)
    }

    /// Packet `k` (PSN `p`) of `w`.
    fn build(
        cfg: &crate::Config,
        mtu: u32,
        since_ackreq: &mut u32,
        w: &SendWqe<R>,
        k: u32,
        p: u32,
        gathered: Option<Payload>,
    ) -> Transmit<R> {
        let mtu = mtu as usize;
        let qt = cfg.qp_type;
        let mut route = None;
        let (opcode, reth, atomic, payload) = match w.op {
            SendOp::Read { remote_addr, rkey } => (
                Opcode::RcReadRequest,
                // A retried READ asks for what has not arrived (IBTA
                // §9.7.5.1.2 lets the requester resume a READ at any of
                // its PSNs, with the address and length adjusted).
                Some(Reth {
                    va: remote_addr.wrapping_add(u64::from(k) * mtu as u64),
                    rkey,
                    dma_len: w.len - (k * mtu as u32).min(w.len),
                }),
                None,
                Payload::Owned(Vec::new()),
            ),
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (
                Opcode::RcCompareSwap,
                None,
                Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                }),
                Payload::Owned(Vec::new()),
            ),
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => (
                Opcode::RcFetchAdd,
                None,
                Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                }),
                Payload::Owned(Vec::new()),
            ),
            ref op => {
                let at = (k as usize * mtu).min(w.data.len());
                let to = (at + mtu).min(w.data.len());
                let payload = gathered.unwrap_or_else(|| Payload::Shared(w.data.clone(), at..to));
                let position = pos(k, w.npkts);
                let rc = rc_opcode(op, position);
                let opcode = match qt {
                    QpType::Rc => rc,
                    QpType::Uc => Opcode::from_u8(rc.value() | 0x20).unwrap_or(rc),
                    _ => {
                        route = w.route.clone();
                        if imm_of(op).is_some() {
                            Opcode::UdSendOnlyImm
                        } else {
                            Opcode::UdSendOnly
                        }
                    }
                };
                let reth = match (op, position) {
                    (
                        SendOp::Write { remote_addr, rkey }
                        | SendOp::WriteImm {
                            remote_addr, rkey, ..
                        },
                        Pos::Only | Pos::First,
                    ) => Some(Reth {
                        va: *remote_addr,
                        rkey: *rkey,
                        dma_len: w.len,
                    }),
                    _ => None,
                };
                (opcode, reth, None, payload)
            }
        };
        let layout = opcode.layout();
        let mut bth = Bth::new(opcode, w.remote_qpn, p);
        bth.pkey = cfg.pkey;
        let ends = matches!(
            opcode,
            Opcode::RcSendOnly
                | Opcode::RcSendOnlyImm
                | Opcode::RcSendLast
                | Opcode::RcSendLastImm
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
                | Opcode::RcWriteLast
                | Opcode::RcWriteLastImm
        );
        // The solicited bit goes on the last packet of a SEND or of a
        // WRITE with immediate.
        bth.solicited = w.solicited
            && k + 1 >= w.npkts
            && matches!(
                w.op,
                SendOp::Send | SendOp::SendImm(_) | SendOp::WriteImm { .. }
            );
        if qt == QpType::Rc {
            *since_ackreq += 1;
            if ends || *since_ackreq >= ACKREQ_EVERY || layout.atomic_eth {
                bth.ack_req = true;
            }
            if bth.ack_req || opcode == Opcode::RcReadRequest {
                *since_ackreq = 0;
            }
        }
        let mut h = Headers::new(bth);
        h.reth = reth;
        h.atomic_eth = atomic;
        if layout.imm {
            h.imm = imm_of(&w.op).map(|value| ImmDt { value });
        }
        if layout.deth {
            // Controlled Q_Key: a work-request Q_Key with the high bit set
            // means the QP's own (IBTA §10.2.4, Q_Keys).
            let qkey = if w.remote_qkey & 0x8000_0000 != 0 {
                cfg.qkey
            } else {
                w.remote_qkey
            };
            h.deth = Some(Deth {
                qkey,
                src_qp: cfg.qpn,
            });
        }
        Transmit {
            headers: h,
            payload,
            route,
        }
    }

    /// The head work request failed before it was sent: complete it with
    /// its status; a connected QP then goes to ERR (the rest flushed), a
    /// datagram QP goes on.
    pub(crate) fn head_failed(&mut self, status: WcStatus) {
        if self.is_datagram() {
            if let Some(w) = self.sq.wqes.pop_front() {
                self.complete_send(&w, status);
            }
        } else {
            self.enter_error(Some(status), "work request failed before it was sent");
        }
    }

    /// Go-back-N: the next packet sent is the one with PSN `p` (or the
    /// first packet of the READ it belongs to).
    pub(crate) fn rewind_to(&mut self, p: u32) {
        for (i, w) in self.sq.wqes.iter_mut().enumerate() {
            if w.contains(p) {
                self.sq.tx_idx = i;
                if w.needs_response() {
                    // Resume a READ at its first missing response.
                    self.sq.tx_pkt = w.resp_pkts;
                } else {
                    self.sq.tx_pkt = psn::diff(p, w.first_psn) as u32;
                }
                return;
            }
        }
        self.sq.tx_idx = 0;
        self.sq.tx_pkt = 0;
    }

    /// The driver could not read the payload of `tx` (a
    /// [`crate::Payload::Leased`] packet [`Transport::poll_transmit`] just
    /// gave it) from memory: its MR was deregistered in between. The
    /// packet did not leave; its work request fails as one whose memory
    /// went away before its packet was built does (with `e`'s local
    /// status when it reaches the head of the queue, the QP then in
    /// error), and nothing after it is sent.
    pub fn leased_read_failed(&mut self, tx: &Transmit<R>, e: MemError) {
        if self.cfg.qp_type != QpType::Rc {
            return; // never given out: a datagram QP completes at send
        }
        let p = tx.headers.bth.psn;
        let Some(i) = self
            .sq
            .wqes
            .iter()
            .position(|w| w.leased && !w.needs_response() && w.contains(p))
        else {
            return;
        };
        let w = &mut self.sq.wqes[i];
        w.failed.get_or_insert(e.local_status());
        // Back to the packet that did not leave, as if it had not been
        // built: the requester stops at a failed request.
        self.sq.tx_idx = i;
        self.sq.tx_pkt = psn::diff(p, w.first_psn) as u32;
    }
}
