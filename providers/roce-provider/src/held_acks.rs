//! Positive ACKs a polling thread holds back until after the answer its
//! application sends ([`HeldAcks`]), and the encoding of a packet onto a
//! batch's buffer that they and every other packet use ([`encode_onto`]).

use al::sync::atomic::{AtomicU64, Ordering};
use std::net::SocketAddr;

use al::sync::Mutex;
use roce::{Endpoints, Packet};

/// A positive ACK waiting to leave: its headers and flow, encoded (and
/// its ICRC computed) only when it leaves, off the path from a received
/// SEND to its completion.
struct HeldAck {
    qpn: u32,
    /// Index of the send socket (`PortShared::batch`).
    sock: usize,
    to: SocketAddr,
    ep: Endpoints,
    headers: roce::Headers,
}

/// Positive ACKs a polling thread held back instead of sending them before
/// it returned the completion the same packet produced.
///
/// Why: in a ping-pong the poller that takes a SEND answers it with an
/// ACK and then (its application) with its own SEND. Held, the ACK leaves
/// after that SEND, in the poller's next [`crate::driver::progress`]: the
/// peer sees the answer first and handles the ACK in a later poll, off
/// the round trip's path. (Riding in the same `sendmmsg` after the SEND,
/// as first done, saved a system call but the peer mostly took both in
/// one receive and handled the ACK before returning the answer: 8.2-10.1
/// us per round trip against 7.2-7.8 us now.)
/// A held ACK is never late by more than this: every poller's next
/// [`crate::driver::progress`] and every turn of the port's receive thread
/// (at most a nap, 100 us to 1.6 ms, apart while pollers are active) sends what is
/// held. At most one per QP is kept (a newer ACK of a QP acknowledges
/// everything the older one did), so the list is bounded by the QPs of
/// the port. NAKs, RNR NAKs and atomic ACKs are never held. A packet of
/// another QP never overtakes a held ACK (every batch sends those first:
/// a DREQ must not reach the peer before the ACK of a request the
/// application already saw complete), and modifying or destroying a QP
/// or closing the device sends what is held.
pub(crate) struct HeldAcks {
    /// What `list` holds, readable without its lock: [`NONE_HELD`], the
    /// (socket, QPN) of the one ACK held packed by [`sole_key`], or
    /// [`SEVERAL_HELD`]. A batch sees in one load that the only ACK held
    /// is its own QP's (a ping-pong's answer finds its own ACK held,
    /// every time).
    summary: AtomicU64,
    list: Mutex<Vec<HeldAck>>,
}

impl Default for HeldAcks {
    fn default() -> Self {
        HeldAcks {
            summary: AtomicU64::new(NONE_HELD),
            list: Mutex::new(Vec::new()),
        }
    }
}

/// [`HeldAcks::summary`] of an empty list, and of a list of two or more
/// (no [`sole_key`] reaches either: QPNs have 24 bits).
const NONE_HELD: u64 = u64::MAX;
const SEVERAL_HELD: u64 = u64::MAX - 1;

fn sole_key(sock: usize, qpn: u32) -> u64 {
    ((sock as u64) << 32) | u64::from(qpn)
}

impl HeldAcks {
    /// Whether anything is held (one load; no lock).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.summary.load(Ordering::Acquire) == NONE_HELD
    }

    /// Whether nothing is held but (at most) QP `qpn`'s ACK on socket
    /// `sock` (one load; no lock).
    #[inline]
    pub(crate) fn only(&self, sock: usize, qpn: u32) -> bool {
        let s = self.summary.load(Ordering::Acquire);
        s == NONE_HELD || s == sole_key(sock, qpn)
    }

    /// Publishes what `list` now holds (under its lock).
    fn publish(&self, list: &[HeldAck]) {
        let summary = match list {
            [] => NONE_HELD,
            [h] => sole_key(h.sock, h.qpn),
            _ => SEVERAL_HELD,
        };
        self.summary.store(summary, Ordering::Release);
    }

    /// Keeps the ACK (`headers`, for the flow `ep` to `to`) of QP `qpn`
    /// for socket `sock`, replacing an older one of the same QP.
    pub(crate) fn hold(
        &self,
        qpn: u32,
        sock: usize,
        to: SocketAddr,
        ep: Endpoints,
        headers: roce::Headers,
    ) {
        let held = HeldAck {
            qpn,
            sock,
            to,
            ep,
            headers,
        };
        let mut list = self.list.lock();
        // The mistake: the summary published from the list as it was
        // before this ACK joined it.
        #[cfg(ibal_mutant = "held_summary_stale")]
        self.publish(&list);
        match list.iter_mut().find(|h| h.qpn == qpn) {
            Some(old) => *old = held,
            None => list.push(held),
        }
        crate::delay::point(crate::delay::Point::HoldChanged);
        #[cfg(not(any(
            ibal_mutant = "held_summary_stale",
            ibal_mutant = "held_summary_outside_lock"
        )))]
        self.publish(&list);
        #[cfg(ibal_mutant = "held_summary_outside_lock")]
        {
            // The mistake: the summary computed under the lock but stored
            // after it is given up, over a newer one.
            let summary = match &list[..] {
                [h] => sole_key(h.sock, h.qpn),
                _ => SEVERAL_HELD,
            };
            drop(list);
            self.summary.store(summary, Ordering::Release);
        }
    }

    /// The list, locked, to take ACKs from and send them ([`HeldList`]).
    pub(crate) fn lock(&self) -> HeldList<'_> {
        HeldList {
            acks: self,
            list: self.list.lock(),
        }
    }
}

/// The held ACKs, locked ([`HeldAcks::lock`]). The ACKs taken through it
/// are sent while it is held, and the summary is published only when it
/// is dropped, after they left: until then a sender reading the summary
/// still sees them held, takes the slow path (`TxBatch::send`) and waits
/// here for the lock. Publishing at the take let a packet of another QP
/// overtake an ACK a concurrent flush had taken but not yet sent (the
/// loom model `roce_held_acks_flush_vs_answer_order`; mutant
/// `held_published_before_sent`).
pub(crate) struct HeldList<'a> {
    acks: &'a HeldAcks,
    list: al::sync::MutexGuard<'a, Vec<HeldAck>>,
}

impl Drop for HeldList<'_> {
    fn drop(&mut self) {
        self.acks.publish(&self.list);
    }
}

impl HeldList<'_> {
    /// Encodes the ACKs held for socket `sock` that `pick` selects into
    /// `bytes`/`msgs` and forgets them; returns how many were taken and
    /// how many of those failed to encode (dropped). The caller sends
    /// them before it drops the list.
    pub(crate) fn take_for(
        &mut self,
        sock: usize,
        pick: impl Fn(u32) -> bool,
        bytes: &mut Vec<u8>,
        msgs: &mut Vec<(SocketAddr, usize, usize)>,
    ) -> (usize, u64) {
        let (mut taken, mut failed) = (0, 0);
        let list = &mut self.list;
        list.retain(|h| {
            if h.sock != sock || !pick(h.qpn) {
                return true;
            }
            let pkt = Packet {
                headers: h.headers,
                payload: &[],
            };
            match encode_onto(bytes, &pkt, &h.ep) {
                Some((start, n)) => {
                    msgs.push((h.to, start, n));
                    taken += 1;
                }
                None => failed += 1,
            }
            false
        });
        crate::delay::point(crate::delay::Point::TakeChanged);
        // The mistake: the summary published as the ACKs are taken, before
        // they are sent.
        #[cfg(ibal_mutant = "held_published_before_sent")]
        self.acks.publish(&self.list);
        (taken, failed)
    }

    /// The socket indexes that have ACKs held.
    pub(crate) fn sockets(&self) -> Vec<usize> {
        let mut s: Vec<usize> = self.list.iter().map(|h| h.sock).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// A socket other than `sock` with an ACK held, if any (no allocation:
    /// a batch asks this on every send while its own QP's ACK is held).
    pub(crate) fn other_socket(&self, sock: usize) -> Option<usize> {
        self.list.iter().map(|h| h.sock).find(|&s| s != sock)
    }
}

al::thread_local_value! {
    /// Set while a polling thread makes progress (`driver::progress`): the
    /// positive ACKs its drives produce are held ([`HeldAcks`]).
    pub(crate) static HOLDING_ACKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's positive ACKs held back ([`HeldAcks`]).
pub(crate) fn holding_acks<R>(f: impl FnOnce() -> R) -> R {
    let before = HOLDING_ACKS.with(|h| h.replace(true));
    let r = f();
    HOLDING_ACKS.with(|h| h.set(before));
    r
}

/// Appends `pkt` encoded for the flow `ep` to `bytes`; returns where it
/// starts and its length, or None (and `bytes` as it was) if it does not
/// encode.
#[inline]
pub(crate) fn encode_onto(
    bytes: &mut Vec<u8>,
    pkt: &Packet<'_>,
    ep: &Endpoints,
) -> Option<(usize, usize)> {
    let start = bytes.len();
    pkt.encode_append(ep, bytes).ok().map(|n| (start, n))
}

/// Whether `pkt` is a plain positive acknowledgement (may be held).
#[inline]
pub(crate) fn is_positive_ack(pkt: &Packet<'_>) -> bool {
    pkt.headers.bth.opcode == roce::Opcode::RcAck
        && matches!(
            pkt.headers.aeth.map(|a| a.syndrome),
            Some(roce::Syndrome::Ack { .. })
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A positive ACK of `psn` for `qpn`, encoded for `ep`.
    fn ack(qpn: u32, psn: u32) -> roce::Headers {
        let mut h = roce::Headers::new(roce::Bth::new(roce::Opcode::RcAck, qpn, psn));
        h.aeth = Some(roce::Aeth {
            syndrome: roce::Syndrome::Ack { credits: 31 },
            msn: psn,
        });
        h
    }

    #[test]
    fn one_ack_per_qp_is_held_and_taken_by_its_socket_only() {
        let held = HeldAcks::default();
        let from: SocketAddr = "127.0.0.8:4791".parse().unwrap();
        let to: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        let ep = Endpoints::new(from, to).unwrap();
        let encoded = |h: roce::Headers| {
            Packet {
                headers: h,
                payload: &[],
            }
            .encode(&ep)
            .unwrap()
        };
        assert!(held.is_empty());
        held.hold(7, 0, to, ep, ack(7, 1));
        held.hold(7, 0, to, ep, ack(7, 2)); // the newer ACK of QP 7
        held.hold(8, 1, to, ep, ack(8, 3));
        assert_eq!(held.lock().sockets(), vec![0, 1]);
        assert_eq!(held.lock().other_socket(0), Some(1));
        assert_eq!(held.lock().other_socket(1), Some(0));
        let (mut bytes, mut msgs) = (Vec::new(), Vec::new());
        assert_eq!(
            held.lock().take_for(0, |_| true, &mut bytes, &mut msgs),
            (1, 0)
        );
        let newest = encoded(ack(7, 2));
        assert_eq!(msgs, vec![(to, 0, newest.len())]);
        assert_eq!(
            bytes, newest,
            "only the newest ACK of QP 7 goes, encoded as sent"
        );
        assert!(!held.is_empty(), "socket 1's ACK stays");
        assert_eq!(
            held.lock().take_for(1, |q| q != 8, &mut bytes, &mut msgs),
            (0, 0)
        );
        held.lock().take_for(1, |q| q == 8, &mut bytes, &mut msgs);
        assert_eq!(&bytes[newest.len()..], &encoded(ack(8, 3))[..]);
        let decoded = Packet::decode(&bytes[newest.len()..], &ep).unwrap();
        assert_eq!(decoded.headers.bth.psn, 3, "a valid packet, ICRC included");
        assert!(held.is_empty());
    }
}
