//! The completer: what the requester does with the responder's answers
//! (IBTA vol. 1 §9.7.5.2 and §9.9): ACKs and coalesced ACKs, NAKs, READ
//! responses and atomic ACKs; in-order completion; go-back-N on a PSN
//! sequence NAK, an implied NAK or the retransmit timer; retry_cnt and
//! rnr_retry; error completions and flush.

use std::time::Duration;

use provider::{QpState, SendOp, WcStatus};
use roce::{NakCode, Opcode, Packet, Syndrome};

use crate::memory::Memory;
use crate::psn;
use crate::timers::{ack_timeout, rnr_delay};
use crate::trace;
use crate::transport::Transport;

/// `rnr_retry` value meaning "retry forever".
pub const RNR_RETRY_INFINITE: u8 = 7;

/// What walking the queue up to a PSN found.
enum Walk {
    /// Everything before the PSN is complete.
    Done,
    /// A READ or atomic before the PSN has not had its response: the
    /// responder skipped past it, so its response was lost (implied NAK).
    Missing(u32),
}

impl<R: Clone> Transport<R> {
    /// A response (ACK, NAK, READ response, atomic ACK) for this QP.
    pub(crate) fn handle_response<M: Memory>(
        &mut self,
        now: Duration,
        pkt: &Packet<'_>,
        mem: &mut M,
    ) {
        if self.state != QpState::Rts {
            return;
        }
        let h = &pkt.headers;
        let p = h.bth.psn;
        // Only PSNs sent and not yet acknowledged are of interest.
        if psn::before(p, self.sq.una) || !psn::before(p, self.sq.sent_end) {
            self.counters.ignored_responses += 1;
            return;
        }
        let Some(aeth) = h.aeth else {
            // READ response middle: no AETH.
            if h.bth.opcode == Opcode::RcReadResponseMiddle {
                self.read_response(now, pkt, mem);
            } else {
                self.counters.ignored_responses += 1;
            }
            return;
        };
        match (h.bth.opcode, aeth.syndrome) {
            (Opcode::RcAck, Syndrome::Ack { .. }) => {
                if let Walk::Missing(at) = self.complete_through(p, true) {
                    self.gap_retry(now, at);
                    return;
                }
                self.progress(now);
            }
            (Opcode::RcAck, Syndrome::RnrNak { timer }) => {
                let una = self.sq.una;
                if let Walk::Missing(at) = self.complete_through(psn::prev(p), true) {
                    self.gap_retry(now, at);
                    return;
                }
                if self.sq.una != una {
                    self.progress(now);
                }
                if self.sq.rnr_left == 0 {
                    self.enter_error(Some(WcStatus::RnrRetryExceeded), "RNR retry count exceeded");
                    return;
                }
                if self.cfg.rnr_retry != RNR_RETRY_INFINITE {
                    self.sq.rnr_left -= 1;
                }
                self.counters.rnr_retries += 1;
                trace::rnr_wait(&self.cfg, p, timer, rnr_delay(timer), self.sq.rnr_left);
                self.sq.rnr_until = Some(now + rnr_delay(timer));
                self.sq.retrans_at = None;
                self.rewind_to(p);
            }
            (Opcode::RcAck, Syndrome::Nak(NakCode::PsnSequenceError)) => {
                trace::nak_received(&self.cfg, p, NakCode::PsnSequenceError);
                if let Walk::Missing(at) = self.complete_through(psn::prev(p), true) {
                    self.gap_retry(now, at);
                    return;
                }
                self.progress(now);
                self.gap_retry(now, p);
            }
            (Opcode::RcAck, Syndrome::Nak(code)) => {
                trace::nak_received(&self.cfg, p, code);
                if let Walk::Missing(at) = self.complete_through(psn::prev(p), true) {
                    self.gap_retry(now, at);
                    return;
                }
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemoteInvalidRequest,
                    NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                    // Remote operational error, and every code an RC
                    // requester has no meaning for (invalid RD request):
                    // the responder failed in a way it did not name, as
                    // rxe reads any other NAK code.
                    _ => WcStatus::RemoteOpError,
                };
                self.enter_error(Some(status), "NAK received");
            }
            (Opcode::RcAtomicAck, Syndrome::Ack { .. }) => self.atomic_ack(now, pkt, mem),
            (
                Opcode::RcReadResponseFirst
                | Opcode::RcReadResponseLast
                | Opcode::RcReadResponseOnly,
                Syndrome::Ack { .. },
            ) => self.read_response(now, pkt, mem),
            _ => self.counters.ignored_responses += 1,
        }
    }

    /// Completes the work requests that end at or before `p` (a READ or
    /// atomic only when its response came); with `partial`, also moves
    /// `una` inside a SEND/WRITE that `p` falls in.
    fn complete_through(&mut self, p: u32, partial: bool) -> Walk {
        while let Some(w) = self.sq.wqes.front() {
            if w.failed.is_some() {
                break;
            }
            if psn::before(p, w.last_psn()) {
                // `w` ends after `p`.
                if partial && !w.needs_response() && w.contains(p) {
                    self.sq.una = psn::add(p, 1);
                }
                break;
            }
            if w.needs_response() {
                return Walk::Missing(w.first_psn);
            }
            // Never complete what has not been sent.
            if self.sq.tx_idx == 0 {
                break;
            }
            let w = self.sq.wqes.pop_front().expect("front exists");
            self.sq.tx_idx -= 1;
            self.sq.una = psn::add(w.last_psn(), 1);
            self.complete_send(&w, WcStatus::Success);
            self.recycle(w.data);
        }
        if let Some(status) = self.sq.wqes.front().and_then(|w| w.failed) {
            if self.sq.tx_idx == 0 {
                self.head_failed(status);
            }
        }
        Walk::Done
    }

    /// Forward progress: retries are refilled and the timer restarts for
    /// what is still outstanding.
    fn progress(&mut self, now: Duration) {
        self.sq.retry_left = self.cfg.retry_cnt;
        self.sq.rnr_left = self.cfg.rnr_retry;
        self.sq.gap_retry_armed = true;
        self.rearm(now);
    }

    fn rearm(&mut self, now: Duration) {
        let outstanding = psn::before(self.sq.una, self.sq.sent_end) && !self.sq.wqes.is_empty();
        self.sq.retrans_at = if outstanding && self.state == QpState::Rts {
            ack_timeout(self.cfg.timeout).map(|d| now + d)
        } else {
            None
        };
    }

    /// A retry revealed by a gap: at most one until forward progress.
    fn gap_retry(&mut self, now: Duration, p: u32) {
        if !self.sq.gap_retry_armed {
            self.counters.ignored_responses += 1;
            return;
        }
        self.retry(now, p, "a response showed a gap");
    }

    /// One transport retry from PSN `p`, or RETRY_EXC_ERR when none is
    /// left.
    pub(crate) fn retry(&mut self, now: Duration, p: u32, cause: &'static str) {
        if self.sq.retry_left == 0 {
            self.enter_error(Some(WcStatus::RetryExceeded), "retry count exceeded");
            return;
        }
        self.sq.retry_left -= 1;
        trace::retransmit(&self.cfg, p, self.sq.retry_left, cause);
        self.sq.gap_retry_armed = false;
        self.counters.retries += 1;
        self.rewind_to(p);
        self.sq.retrans_at = None;
        let _ = now;
    }

    /// The retransmit timer fired (called by `handle_timeout`).
    pub(crate) fn retransmit_timeout(&mut self, now: Duration) {
        let Some(at) = self.sq.retrans_at else { return };
        if now < at {
            return;
        }
        self.sq.retrans_at = None;
        if self.sq.wqes.is_empty() || !psn::before(self.sq.una, self.sq.sent_end) {
            return;
        }
        let una = self.sq.una;
        self.retry(now, una, "ACK timeout");
    }

    fn atomic_ack<M: Memory>(&mut self, now: Duration, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        if let Walk::Missing(at) = self.complete_through(psn::prev(p), false) {
            // A READ or atomic before this one lost its response.
            self.gap_retry(now, at);
            return;
        }
        let Some(orig) = pkt.headers.atomic_ack_eth.map(|a| a.original) else {
            return;
        };
        let ok = self.sq.tx_idx > 0
            && self.sq.wqes.front().is_some_and(|w| {
                w.first_psn == p
                    && matches!(w.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
            });
        if !ok {
            self.counters.ignored_responses += 1;
            return;
        }
        let w = self.sq.wqes.pop_front().expect("checked");
        self.sq.tx_idx -= 1;
        self.sq.una = psn::add(p, 1);
        match mem.scatter(&w.sges, 0, &orig.to_ne_bytes()) {
            Ok(()) => {
                self.complete_send(&w, WcStatus::Success);
                self.recycle(w.data);
                self.progress(now);
            }
            Err(e) => {
                self.sq.wqes.push_front(w);
                self.enter_error(
                    Some(e.local_status()),
                    "local memory error placing a response",
                );
            }
        }
    }

    fn read_response<M: Memory>(&mut self, now: Duration, pkt: &Packet<'_>, mem: &mut M) {
        let p = pkt.headers.bth.psn;
        if let Walk::Missing(at) = self.complete_through(psn::prev(p), false) {
            // A READ or atomic before this one lost its response.
            self.gap_retry(now, at);
            return;
        }
        let mtu = self.mtu;
        let Some(w) = self.sq.wqes.front_mut() else {
            return;
        };
        if self.sq.tx_idx == 0 || !w.contains(p) || !matches!(w.op, SendOp::Read { .. }) {
            self.counters.ignored_responses += 1;
            return;
        }
        let k = psn::diff(p, w.first_psn) as u32;
        if k < w.resp_pkts {
            // A duplicate of a response already placed.
            self.counters.ignored_responses += 1;
            return;
        }
        if k > w.resp_pkts {
            // A response packet was lost: ask again.
            let first = w.first_psn;
            self.gap_retry(now, first);
            return;
        }
        // A resumed READ's responses are numbered from the request that
        // asked for them (First at the resume point), as IBTA reads; Linux
        // rxe numbers them as part of the whole message (Middle there).
        // Placement goes by PSN, so either numbering is taken.
        let position = |r: u32, n: u32| match (r, n) {
            (_, 1) => Opcode::RcReadResponseOnly,
            (0, _) => Opcode::RcReadResponseFirst,
            (r, n) if r + 1 == n => Opcode::RcReadResponseLast,
            _ => Opcode::RcReadResponseMiddle,
        };
        let base = w.read_base.min(k);
        let resumed = position(k - base, w.npkts - w.read_base.min(w.npkts));
        let whole = position(k, w.npkts);
        let off = k * mtu;
        let size = (w.len - off.min(w.len)).min(mtu) as usize;
        let op = pkt.headers.bth.opcode;
        if (op != resumed && op != whole) || pkt.payload.len() != size {
            self.counters.ignored_responses += 1;
            return;
        }
        if let Err(e) = mem.scatter(&w.sges, u64::from(off), pkt.payload) {
            self.enter_error(
                Some(e.local_status()),
                "local memory error placing a response",
            );
            return;
        }
        w.resp_pkts += 1;
        self.sq.una = psn::add(p, 1);
        if w.resp_pkts == w.npkts {
            let w = self.sq.wqes.pop_front().expect("front exists");
            self.sq.tx_idx -= 1;
            self.complete_send(&w, WcStatus::Success);
            self.recycle(w.data);
            if let Some(status) = self.sq.wqes.front().and_then(|w| w.failed) {
                if self.sq.tx_idx == 0 {
                    self.head_failed(status);
                }
            }
        }
        self.progress(now);
    }
}
