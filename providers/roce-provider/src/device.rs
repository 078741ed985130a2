//! The provider, the device and its objects (PD, CQ, MR, SRQ, AV, QP),
//! and the `provider::Device` implementation.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use al::{Error, Result};
use parking_lot::Mutex;
use provider::buffer::for_providers::{memory_of, region_memory, Memory, Span};
use provider::qp_state::{DeviceLimits, PortLimits};
use provider::{
    Access, AtomicCap, AvAttr, CqArm, CqInit, Device, DeviceAttr, DeviceInfo, Gid, LinkLayer,
    PortAttr, PortState, Provider, QpAttr, QpInit, QpModify, QpType, RawRegion, RecvWr,
    RegisteredBuffer, SendWr, SrqInit, Wc,
};
use roce::{Endpoints, Packet};

use crate::clock::monotonic_ns;
use crate::config::{gid_of, DeviceConfig, Directory, PortConfig, ROCE_PORT};
use crate::counters::{AtomicCounters, PortCounters};
use crate::cq::CqInner;
use crate::driver::{run_port, run_timers, Timers, RECV_TIMEOUT};
use crate::mr::{MrInner, MrTable, Posted, RecvEntry};
use crate::qp::{fresh_attr, QpCore, QpInner, SrqInner, GSI_KEY, NO_DEADLINE, QPN_MASK};
use crate::qp_map::{QpMap, QpMemo};
use crate::shutdown::{self, join_all, signal_stop, CloseWatch, Closed, Reap};

/// [`BUSY_POLL_STREAK`] empty polls of a device's CQs, each this close
/// behind the one before, mean an application busy-polls
/// ([`DevShared::note_poll`]).
const BUSY_POLL_GAP: Duration = Duration::from_micros(50);
const BUSY_POLL_STREAK: u32 = 16;

/// Tells an application that busy-polls a device's CQs from consumers
/// that poll when woken.
///
/// Only a run of [`BUSY_POLL_STREAK`] polls that found nothing, each
/// close behind the one before ([`BUSY_POLL_GAP`]), marks the device as
/// busy-polled: an application spinning on its CQ does that all the time,
/// while a consumer woken by a completion (the CM agent on QP1, which polls
/// its receive and send CQs once each per round; an async CQ stream)
/// drains its CQs and stops after a poll or two. Counting every poll made
/// the receive threads nap after each CM message, and the next MAD waited
/// out the nap (`ibal perf conn-rate --transport udp`: ~650 of ~700 us per
/// connect).
#[derive(Default)]
struct PollWatch {
    /// When (ns from the device's base) the device was last busy-polled.
    busy_at: AtomicU64,
    /// When a poll last found a CQ empty, and how many did in a row.
    last_empty: AtomicU64,
    streak: AtomicU32,
}

impl PollWatch {
    /// A poll at `now` found `found` completions.
    ///
    /// Loads and stores, not read-modify-writes (two locked instructions
    /// on every empty poll): pollers of one device racing here may lose
    /// a step of each other's streak, which delays the receive threads'
    /// stepping aside by a poll or two; a lone poller counts exactly.
    /// The poll's gap to the one before runs to `began` (when it started
    /// its real work, at the latest `now`, its end).
    fn note(&self, began: u64, now: u64, found: usize) {
        if found > 0 {
            return;
        }
        let before = self.last_empty.load(Ordering::Relaxed);
        self.last_empty.store(now, Ordering::Relaxed);
        let streak = if began.saturating_sub(before) < BUSY_POLL_GAP.as_nanos() as u64 {
            let s = self.streak.load(Ordering::Relaxed).saturating_add(1);
            self.streak.store(s, Ordering::Relaxed);
            s
        } else {
            self.streak.store(1, Ordering::Relaxed);
            1
        };
        if streak >= BUSY_POLL_STREAK {
            self.busy_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether the device was busy-polled within `window` of `now`.
    fn busy_within(&self, now: u64, window: Duration) -> bool {
        let at = self.busy_at.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) < window.as_nanos() as u64
    }
}

/// Identities unique in the process (devices and PDs), so an object of
/// another device or PD is recognised by one compare.
fn new_identity() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One port of an open device.
pub(crate) struct PortShared {
    pub(crate) num: u8,
    pub(crate) cfg: PortConfig,
    pub(crate) socket: UdpSocket,
    /// Send sockets on source ports in 0xC000..=0xFFFF (ECMP), with
    /// their addresses; empty: send from `socket`.
    tx: Vec<(UdpSocket, SocketAddr)>,
    /// The bound address (the configured one, with the real UDP port).
    pub(crate) local: SocketAddr,
    pub(crate) gid: Gid,
    pub(crate) counters: AtomicCounters,
    /// The port as the receive stage sees it.
    pub(crate) view: roce_transport::Port,
    /// Held by whoever is taking datagrams off `socket` and feeding them
    /// to QPs (the port's receive thread, or a poller making progress), so
    /// two threads never feed one port's packets concurrently (which could
    /// reorder them). Taken as a [`Feeding`].
    rx_lock: Mutex<RxState>,
    /// Positive ACKs a polling thread held back (see [`HeldAcks`]).
    pub(crate) held: HeldAcks,
}

/// What the feeder of a port's datagrams keeps between them.
#[derive(Default)]
pub(crate) struct RxState {
    /// The last QP this port's datagrams reached.
    memo: QpMemo,
    /// Whom the IPv4 identification solver runs for.
    gate: roce_transport::SolverGate,
}

/// The right to feed a port's datagrams to its QPs: its `rx_lock`, held.
/// The receive counters of the datagram path (`rx_datagrams` to
/// `rx_unknown_qpn`, [`Feeding::count`]) are written only with it, so by
/// one thread at a time: each is added with a load and a store, not a
/// locked read-modify-write (three of those per datagram saved on a
/// ping-pong's path). Counters a drive also writes (`add_transport`) stay
/// atomic additions.
pub(crate) struct Feeding<'p> {
    port: &'p PortShared,
    /// The lock, and what it guards.
    rx: parking_lot::MutexGuard<'p, RxState>,
}

impl<'p> Feeding<'p> {
    pub(crate) fn port(&self) -> &'p PortShared {
        self.port
    }

    /// The last QP this port's datagrams reached ([`QpMap::find`]) and
    /// the identification solver's gate, together (the receive stage's
    /// lookup borrows the one while the stage holds the other).
    pub(crate) fn rx_state(&mut self) -> (&mut QpMemo, &mut roce_transport::SolverGate) {
        let rx = &mut *self.rx;
        (&mut rx.memo, &mut rx.gate)
    }

    /// Adds `n` to the counter `which` picks.
    pub(crate) fn count(&self, which: impl FnOnce(&AtomicCounters) -> &AtomicU64, n: u64) {
        if n != 0 {
            let c = which(&self.port.counters);
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }
}

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
    pub(crate) fn is_empty(&self) -> bool {
        self.summary.load(Ordering::Acquire) == NONE_HELD
    }

    /// Whether nothing is held but (at most) QP `qpn`'s ACK on socket
    /// `sock` (one load; no lock).
    fn only(&self, sock: usize, qpn: u32) -> bool {
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
    fn hold(&self, qpn: u32, sock: usize, to: SocketAddr, ep: Endpoints, headers: roce::Headers) {
        let held = HeldAck {
            qpn,
            sock,
            to,
            ep,
            headers,
        };
        let mut list = self.list.lock();
        match list.iter_mut().find(|h| h.qpn == qpn) {
            Some(old) => *old = held,
            None => list.push(held),
        }
        self.publish(&list);
    }

    /// Encodes the ACKs held for socket `sock` that `pick` selects into
    /// `bytes`/`msgs` and forgets them; returns how many were taken and
    /// how many of those failed to encode (dropped).
    fn take_for(
        &self,
        sock: usize,
        pick: impl Fn(u32) -> bool,
        bytes: &mut Vec<u8>,
        msgs: &mut Vec<(SocketAddr, usize, usize)>,
    ) -> (usize, u64) {
        if self.is_empty() {
            return (0, 0);
        }
        let (mut taken, mut failed) = (0, 0);
        let mut list = self.list.lock();
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
        self.publish(&list);
        (taken, failed)
    }

    /// The socket indexes that have ACKs held.
    fn sockets(&self) -> Vec<usize> {
        let list = self.list.lock();
        let mut s: Vec<usize> = list.iter().map(|h| h.sock).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// A socket other than `sock` with an ACK held, if any (no allocation:
    /// a batch asks this on every send while its own QP's ACK is held).
    fn other_socket(&self, sock: usize) -> Option<usize> {
        self.list.lock().iter().map(|h| h.sock).find(|&s| s != sock)
    }
}

std::thread_local! {
    /// Set while a polling thread makes progress (`driver::progress`): the
    /// positive ACKs its drives produce are held ([`HeldAcks`]).
    static HOLDING_ACKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's positive ACKs held back ([`HeldAcks`]).
pub(crate) fn holding_acks<R>(f: impl FnOnce() -> R) -> R {
    let before = HOLDING_ACKS.replace(true);
    let r = f();
    HOLDING_ACKS.set(before);
    r
}

/// Appends `pkt` encoded for the flow `ep` to `bytes`; returns where it
/// starts and its length, or None (and `bytes` as it was) if it does not
/// encode.
fn encode_onto(bytes: &mut Vec<u8>, pkt: &Packet<'_>, ep: &Endpoints) -> Option<(usize, usize)> {
    let start = bytes.len();
    bytes.resize(start + pkt.encoded_len(), 0);
    match pkt.encode_into(ep, &mut bytes[start..]) {
        Ok(n) => {
            bytes.truncate(start + n);
            Some((start, n))
        }
        Err(_) => {
            bytes.truncate(start);
            None
        }
    }
}

/// Whether `pkt` is a plain positive acknowledgement (may be held).
fn is_positive_ack(pkt: &Packet<'_>) -> bool {
    pkt.headers.bth.opcode == roce::Opcode::RcAck
        && matches!(
            pkt.headers.aeth.map(|a| a.syndrome),
            Some(roce::Syndrome::Ack { .. })
        )
}

/// Most packets one `sendmmsg` carries.
pub(crate) const TX_BATCH: usize = 32;

/// Encoded datagrams back to back, and (destination, start, length) of
/// each.
type Encoded = (Vec<u8>, Vec<(SocketAddr, usize, usize)>);

std::thread_local! {
    /// Each sending thread's encoding buffers, reused batch after batch
    /// (no allocation and no zeroing of a fresh buffer per packet).
    static TX_SCRATCH: std::cell::RefCell<Encoded> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Packets being encoded for one source socket (see [`PortShared::batch`]).
pub(crate) struct TxBatch<'p> {
    port: &'p PortShared,
    socket: &'p UdpSocket,
    /// Which of the port's send sockets `socket` is ([`PortShared::batch`]).
    sock: usize,
    /// The QP whose packets these are (its ACKs replace each other while
    /// held).
    qpn: u32,
    from: SocketAddr,
    /// The encoded datagrams back to back, and (destination, start, len)
    /// of each: taken from the thread's scratch, given back at drop.
    bytes: Vec<u8>,
    msgs: Vec<(SocketAddr, usize, usize)>,
}

impl<'p> TxBatch<'p> {
    /// The port it sends from.
    pub(crate) fn port(&self) -> &'p PortShared {
        self.port
    }

    /// Encodes `pkt` for the flow to `to`; sends the batch when full.
    pub(crate) fn push(&mut self, to: SocketAddr, pkt: &Packet<'_>) {
        let c = &self.port.counters;
        let Ok(ep) = Endpoints::new(self.from, to) else {
            c.add(&c.tx_errors, 1);
            return;
        };
        if HOLDING_ACKS.get() && is_positive_ack(pkt) && pkt.payload.is_empty() {
            self.port
                .held
                .hold(self.qpn, self.sock, to, ep, pkt.headers);
            return;
        }
        self.scratch();
        match encode_onto(&mut self.bytes, pkt, &ep) {
            Some((start, n)) => self.msgs.push((to, start, n)),
            None => c.add(&c.tx_errors, 1),
        }
        if self.msgs.len() >= TX_BATCH {
            self.flush();
        }
    }

    /// Takes the thread's reusable buffers if this batch has none yet.
    fn scratch(&mut self) {
        if self.msgs.is_empty() && self.bytes.capacity() == 0 {
            TX_SCRATCH.with_borrow_mut(|(b, m)| {
                std::mem::swap(&mut self.bytes, b);
                std::mem::swap(&mut self.msgs, m);
            });
            self.bytes.clear();
            self.msgs.clear();
        }
    }

    /// Sends what is encoded. ACKs held for other QPs of the port go
    /// before it; this QP's own stays held (it leaves at the poller's next
    /// progress, after the answer this batch may carry: [`HeldAcks`]).
    pub(crate) fn flush(&mut self) {
        if !self.msgs.is_empty() {
            self.send();
        }
    }

    /// Sends what is encoded, the ACKs held for other QPs of the port
    /// first.
    fn send(&mut self) {
        if !self.port.held.only(self.sock, self.qpn) {
            // A packet of another QP (a DREQ on QP1) must not overtake the
            // ACK of a request the application already saw complete: held
            // ACKs on other sockets go first by their own sockets, those of
            // other QPs on this one lead this batch.
            while let Some(sock) = self.port.held.other_socket(self.sock) {
                self.port.send_held_on(sock);
            }
            self.scratch();
            let qpn = self.qpn;
            let (first, failed) =
                self.port
                    .held
                    .take_for(self.sock, |q| q != qpn, &mut self.bytes, &mut self.msgs);
            self.port
                .counters
                .add(&self.port.counters.tx_errors, failed);
            self.msgs.rotate_right(first);
        }
        if self.msgs.is_empty() {
            return;
        }
        let c = &self.port.counters;
        let mut sent = 0;
        // One packet (an ACK, a ping-pong's SEND) goes by `send_to` below:
        // `sendmmsg` would only add the four header vectors' allocations.
        #[cfg(target_os = "linux")]
        if self.msgs.len() > 1 {
            use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
            let addrs: Vec<SocketAddrAny> =
                self.msgs.iter().map(|m| SocketAddrAny::from(m.0)).collect();
            let iovs: Vec<[std::io::IoSlice<'_>; 1]> = self
                .msgs
                .iter()
                .map(|&(_, at, n)| [std::io::IoSlice::new(&self.bytes[at..at + n])])
                .collect();
            let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = (0..self.msgs.len())
                .map(|_| SendAncillaryBuffer::default())
                .collect();
            let mut hdrs: Vec<MMsgHdr<'_>> = addrs
                .iter()
                .zip(&iovs)
                .zip(controls.iter_mut())
                .map(|((a, iov), ctl)| MMsgHdr::new_with_addr(a, iov, ctl))
                .collect();
            // A short count means the rest could not go now (a full socket
            // buffer): they are sent one by one below, as before.
            while sent < hdrs.len() {
                match sendmmsg(self.socket, &mut hdrs[sent..], SendFlags::empty()) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => sent += k,
                }
            }
        }
        for &(_, _, n) in &self.msgs[..sent] {
            c.add(&c.tx_packets, 1);
            c.add(&c.tx_bytes, n as u64);
        }
        for &(to, at, n) in &self.msgs[sent..] {
            match send_one(self.socket, &self.bytes[at..at + n], to) {
                Ok(_) => {
                    c.add(&c.tx_packets, 1);
                    c.add(&c.tx_bytes, n as u64);
                }
                Err(_) => c.add(&c.tx_errors, 1),
            }
        }
        self.msgs.clear();
        self.bytes.clear();
    }
}

/// One datagram to `to`. On Linux a plain `sendto` system call (rustix):
/// glibc's wrapper, which `std` calls, also marks a thread-cancellation
/// point around it, a cost on every packet this provider sends alone.
fn send_one(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) -> std::io::Result<usize> {
    #[cfg(target_os = "linux")]
    return rustix::net::sendto(socket, bytes, rustix::net::SendFlags::empty(), &to)
        .map_err(std::io::Error::from);
    #[cfg(not(target_os = "linux"))]
    socket.send_to(bytes, to)
}

impl Drop for TxBatch<'_> {
    fn drop(&mut self) {
        if self.bytes.capacity() == 0 && self.msgs.capacity() == 0 {
            return; // nothing was encoded (an ACK held, a drive with nothing to send)
        }
        self.flush();
        let (bytes, msgs) = (
            std::mem::take(&mut self.bytes),
            std::mem::take(&mut self.msgs),
        );
        // Give the buffers back for the thread's next batch (a nested
        // batch, if any, keeps its own).
        let _ = TX_SCRATCH.try_with(|cell| {
            if let Ok(mut slot) = cell.try_borrow_mut() {
                if slot.0.capacity() < bytes.capacity() {
                    *slot = (bytes, msgs);
                }
            }
        });
    }
}

impl PortShared {
    /// A batch of packets leaving from the source port QP `qpn` uses:
    /// encoded as they are pushed, sent with one `sendmmsg` per
    /// [`TX_BATCH`] packets (and at [`TxBatch::flush`] or drop).
    pub(crate) fn batch(&self, qpn: u32) -> TxBatch<'_> {
        let sock = match self.tx.len() {
            0 => 0,
            n => qpn as usize % n,
        };
        self.batch_on(sock, qpn)
    }

    /// A batch on send socket `sock` (an index `batch` gave).
    fn batch_on(&self, sock: usize, qpn: u32) -> TxBatch<'_> {
        let (socket, from) = match self.tx.get(sock) {
            Some((s, a)) => (s, *a),
            None => (&self.socket, self.local),
        };
        TxBatch {
            port: self,
            socket,
            sock,
            qpn,
            from,
            bytes: Vec::new(),
            msgs: Vec::new(),
        }
    }
    /// The right to feed this port's datagrams, waiting for it.
    pub(crate) fn feeding(&self) -> Feeding<'_> {
        Feeding {
            port: self,
            rx: self.rx_lock.lock(),
        }
    }

    /// The right to feed this port's datagrams, if nobody holds it.
    pub(crate) fn try_feeding(&self) -> Option<Feeding<'_>> {
        Some(Feeding {
            port: self,
            rx: self.rx_lock.try_lock()?,
        })
    }

    /// Sends every ACK held on this port ([`HeldAcks`]).
    pub(crate) fn flush_held(&self) {
        if self.held.is_empty() {
            return;
        }
        for sock in self.held.sockets() {
            self.send_held_on(sock);
        }
    }

    /// Sends the ACKs held for send socket `sock`.
    fn send_held_on(&self, sock: usize) {
        let mut b = self.batch_on(sock, u32::MAX);
        b.scratch();
        let (_, failed) = self
            .held
            .take_for(sock, |_| true, &mut b.bytes, &mut b.msgs);
        self.counters.add(&self.counters.tx_errors, failed);
        b.send();
    }

    fn attr(&self) -> PortAttr {
        PortAttr {
            port_num: self.num,
            state: PortState::Active,
            lid: 0,
            lmc: 0,
            sm_lid: 0,
            gid_table: vec![self.gid],
            pkey_table: vec![provider::DEFAULT_PKEY],
            active_mtu: self.cfg.mtu,
            max_mtu: self.cfg.mtu,
            link_layer: LinkLayer::Ethernet,
        }
    }
}

/// What every object of a device shares: attributes, ports, MRs, QPs.
pub(crate) struct DevShared {
    pub(crate) id: u64,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortShared>,
    pub(crate) mrs: MrTable,
    pub(crate) qps: QpMap,
    next_qpn: AtomicU32,
    /// When the device opened ([`monotonic_ns`]).
    base: u64,
    /// Whether applications busy-poll the device's CQs: while they do the
    /// receive threads leave the sockets to them (`driver::run_port`).
    polls: PollWatch,
    pub(crate) directory: Arc<Directory>,
    pub(crate) timers: Timers,
    /// PDs, CQs, SRQs and AVs that exist now (against their limits).
    usage: [Arc<AtomicU32>; 4],
}

/// Which limit a [`Charge`] counts against.
#[derive(Clone, Copy)]
enum Kind {
    Pd = 0,
    Cq = 1,
    Srq = 2,
    Av = 3,
}

/// An object's place in its device's limit, given back on drop.
struct Charge(Arc<AtomicU32>);

impl Drop for Charge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Charge")
    }
}

impl DevShared {
    /// Take one place of `kind`'s limit (`InsufficientResources` when
    /// none is left).
    fn charge(&self, kind: Kind) -> Result<Charge> {
        let (max, what) = match kind {
            Kind::Pd => (self.attr.max_pd, "max_pd"),
            Kind::Cq => (self.attr.max_cq, "max_cq"),
            Kind::Srq => (self.attr.max_srq, "max_srq"),
            Kind::Av => (self.attr.max_av, "max_av"),
        };
        let c = &self.usage[kind as usize];
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .map_err(|_| {
            Error::insufficient_resources(format!("{what} reached: the device allows {max}"))
        })?;
        Ok(Charge(c.clone()))
    }

    /// Monotonic time since the device opened.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(monotonic_ns().saturating_sub(self.base))
    }

    /// An application is polling one of the device's CQs now.
    ///
    ///
    /// Only a run of [`BUSY_POLL_STREAK`] polls that found nothing, each
    /// close behind the one before ([`BUSY_POLL_GAP`]), marks the device as
    /// busy-polled: an application spinning on its CQ does that all the
    /// time, while a consumer woken by a completion (the CM agent on QP1,
    /// which polls its receive and send CQs once each per round; an async
    /// CQ stream) drains its CQs and stops after a poll or two. Counting
    /// those made the receive threads nap after every CM message, and the
    /// next MAD waited out the nap (`ibal perf conn-rate --transport udp`:
    /// ~650 of ~700 us per connect).
    ///
    /// Nor do the polls of the provider's own threads
    /// ([`crate::driver::on_provider_thread`]).
    ///
    /// `took`: when the poll's progress fed its first datagram, if it took
    /// any. The gap to the poll before is measured up to then, not to the
    /// poll's end: a poll that drained a stranger's flood (up to
    /// `DRAIN_BATCHES` batches, ~100 us) is still a busy poll, and counting
    /// its length made the receive threads take the port back from a
    /// flooded poller (`perf send-lat --flood`: medians of 68 us instead
    /// of 30-38 in some runs).
    pub(crate) fn note_poll(&self, found: usize, took: Option<Duration>) {
        // Only empty polls count (no clock read for the others).
        if found > 0 || crate::driver::on_provider_thread() {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let began = took.map_or(now, |t| (t.as_nanos() as u64).min(now));
        self.polls.note(began, now, found);
    }

    /// Whether an application polled within `window`.
    pub(crate) fn polled_within(&self, window: Duration) -> bool {
        let now = self.now().as_nanos() as u64;
        self.polls.busy_within(now, window)
    }

    /// Port `n` (1-based).
    pub(crate) fn port(&self, n: u8) -> Option<&PortShared> {
        (n as usize).checked_sub(1).and_then(|i| self.ports.get(i))
    }

    /// The limits the provider-neutral value checks use
    /// (`qp_state::check_av`, `qp_state::check_modify_values`): one P_Key
    /// and one GID per port, the port's MTU, GID routing only.
    pub(crate) fn with_limits<R>(&self, f: impl FnOnce(&DeviceLimits<'_>) -> R) -> R {
        let ports: Vec<PortLimits> = self
            .ports
            .iter()
            .map(|p| PortLimits {
                pkeys: 1,
                gids: 1,
                mtu: p.cfg.mtu,
                gid_only: true,
            })
            .collect();
        f(&DeviceLimits {
            ports: &ports,
            max_qp_rd_atomic: self.attr.max_qp_rd_atomic,
            max_qp_init_rd_atomic: self.attr.max_qp_init_rd_atomic,
        })
    }

    /// An address vector must name a port of the device and carry a GRH
    /// (RoCE routes by GID only) within the field widths.
    pub(crate) fn check_av(&self, av: &AvAttr, what: &str) -> Result<()> {
        self.with_limits(|l| provider::qp_state::check_av(av, l, what))
    }
}

/// The RoCEv2-over-UDP provider: a configured list of devices.
///
/// Every device it opens publishes each port's GID and bound UDP address
/// in a directory the provider's devices share; a destination GID found
/// there is sent to that address, any other to the GID's IP address at
/// the port's `peer_udp_port` (4791 by default). So devices of one
/// provider reach each other even on one host with ephemeral UDP ports,
/// and real peers are reached on 4791. [`RoceProvider::add_peer`] adds
/// entries by hand.
pub struct RoceProvider {
    devices: Vec<DeviceConfig>,
    directory: Arc<Directory>,
    open: Arc<Mutex<HashSet<u64>>>,
}

impl std::fmt::Debug for RoceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceProvider")
            .field("devices", &self.devices)
            .finish()
    }
}

impl RoceProvider {
    /// A provider offering these devices.
    pub fn new(devices: Vec<DeviceConfig>) -> RoceProvider {
        RoceProvider {
            devices,
            directory: Arc::new(Directory::default()),
            open: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Send datagrams for `gid` to `addr` (instead of the GID's IP at the
    /// port's `peer_udp_port`).
    pub fn add_peer(&self, gid: Gid, addr: SocketAddr) {
        self.directory.set(gid, addr);
    }

    /// Where datagrams for `gid` go now: the bound address of an open
    /// device's port with that GID, a peer added by hand, or the GID's IP
    /// at UDP 4791. (A device opened with UDP port 0 is found here.)
    pub fn address_of(&self, gid: &Gid) -> SocketAddr {
        self.directory.resolve(gid, ROCE_PORT)
    }
}

impl Provider for RoceProvider {
    type Device = RoceDevice;

    fn name(&self) -> &str {
        "roce"
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        self.devices
            .iter()
            .map(|d| DeviceInfo {
                name: d.name.clone(),
                node_guid: d.node_guid,
            })
            .collect()
    }

    fn open(&self, node_guid: u64) -> Result<RoceDevice> {
        let cfg = self
            .devices
            .iter()
            .find(|d| d.node_guid == node_guid)
            .ok_or_else(|| Error::NotFound(format!("RoCE device {node_guid:#x}").into()))?;
        // A device (this one, or another on the same fixed UDP port) whose
        // last handle just dropped may still be being reaped.
        let addrs: Vec<SocketAddr> = cfg.ports.iter().map(|p| p.addr).collect();
        shutdown::wait_closed(&addrs, shutdown::owner_of(&self.open), node_guid);
        if !self.open.lock().insert(node_guid) {
            return Err(Error::busy(format!(
                "RoCE device {node_guid:#x} is already open"
            )));
        }
        RoceDevice::open(cfg, self.directory.clone(), self.open.clone()).inspect_err(|_| {
            self.open.lock().remove(&node_guid);
        })
    }
}

/// An open RoCEv2 device: its ports' sockets and receive threads, and its
/// verbs objects. Cloning gives another handle to the same device (as the
/// object layer's device enum needs); dropping the last handle stops and
/// joins the threads; objects still
/// alive then keep their memory but see no more traffic.
#[derive(Clone)]
pub struct RoceDevice {
    shared: Arc<DevShared>,
    /// Shared by the handles; its drop (the last handle's) stops the
    /// driver.
    _life: Arc<Running>,
}

/// The driver of an open device: what stops it.
struct Running {
    /// Taken by the drop (the reaper holds it last).
    shared: Option<Arc<DevShared>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    open: Arc<Mutex<HashSet<u64>>>,
    closed: Arc<Closed>,
}

impl RoceDevice {
    /// Identifies this device among the open devices of the process: two
    /// handles to one device answer the same. Stable while any handle to
    /// the device lives.
    pub fn instance_key(&self) -> usize {
        Arc::as_ptr(&self.shared) as *const () as usize
    }
}

impl std::fmt::Debug for RoceDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceDevice")
            .field("name", &self.shared.attr.name)
            .field(
                "node_guid",
                &format_args!("{:#x}", self.shared.attr.node_guid),
            )
            .field(
                "ports",
                &self
                    .shared
                    .ports
                    .iter()
                    .map(|p| p.local)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RoceDevice {
    fn open(
        cfg: &DeviceConfig,
        directory: Arc<Directory>,
        open: Arc<Mutex<HashSet<u64>>>,
    ) -> Result<RoceDevice> {
        if cfg.ports.is_empty() || cfg.ports.len() > 254 {
            return Err(Error::invalid_parameter(format!(
                "device {:#x}: {} ports (1..=254)",
                cfg.node_guid,
                cfg.ports.len()
            )));
        }
        let mut ports = Vec::with_capacity(cfg.ports.len());
        for (i, pc) in cfg.ports.iter().enumerate() {
            if pc.addr.ip().is_unspecified() || pc.addr.ip().is_multicast() {
                return Err(Error::invalid_parameter(format!(
                    "port {}: {} is not a unicast address (it is the port's GID)",
                    i + 1,
                    pc.addr.ip()
                )));
            }
            let socket = UdpSocket::bind(pc.addr).map_err(|e| {
                Error::insufficient_resources(format!("port {}: bind {}: {e}", i + 1, pc.addr))
            })?;
            no_fragments(&socket).map_err(|e| {
                Error::insufficient_resources(format!("port {}: IP_MTU_DISCOVER: {e}", i + 1))
            })?;
            socket
                .set_read_timeout(Some(RECV_TIMEOUT))
                .map_err(|e| Error::insufficient_resources(format!("port {}: {e}", i + 1)))?;
            // A full send window (128 PSNs of up to 4 KiB) arrives back to
            // back; the default receive buffer (~208 KiB) holds about 50
            // such packets and drops the rest, each drop costing a
            // retransmission. Ask for room for several windows (the kernel
            // caps it at net.core.rmem_max; a smaller buffer still works).
            let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(SOCKET_BUFFER);
            let local = socket
                .local_addr()
                .map_err(|e| Error::insufficient_resources(format!("port {}: {e}", i + 1)))?;
            let tx = source_sockets(local, pc.source_ports, cfg.node_guid);
            ports.push(PortShared {
                num: i as u8 + 1,
                cfg: *pc,
                socket,
                tx,
                local,
                gid: gid_of(local.ip()),
                counters: AtomicCounters::default(),
                view: roce_transport::Port {
                    num: i as u8 + 1,
                    local,
                    mtu: pc.mtu,
                },
                rx_lock: Mutex::new(RxState::default()),
                held: HeldAcks::default(),
            });
        }
        let attr = DeviceAttr {
            name: cfg.name.clone(),
            node_guid: cfg.node_guid,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            num_ports: ports.len() as u8,
            max_qp: 16 * 1024,
            max_qp_wr: 16 * 1024,
            max_sge: 32,
            max_cq: 16 * 1024,
            max_cqe: 64 * 1024,
            max_mr: 64 * 1024,
            max_mr_size: u64::from(u32::MAX),
            max_pd: 16 * 1024,
            max_srq: 4 * 1024,
            max_srq_wr: 16 * 1024,
            max_av: 64 * 1024,
            max_qp_rd_atomic: 16,
            max_qp_init_rd_atomic: 16,
            atomic_cap: AtomicCap::Hca,
            max_msg_size: roce_transport::MAX_MSG,
        };
        let mrs = MrTable::new(attr.max_mr as usize);
        // QP numbers start at a random point (not 2 on every device),
        // unless the configuration names one.
        let first_qpn = cfg
            .first_qpn
            .unwrap_or_else(|| crate::keys::KeyGen::new().next_u32())
            & QPN_MASK;
        let shared = Arc::new(DevShared {
            id: new_identity(),
            attr,
            ports,
            mrs,
            qps: QpMap::new(),
            next_qpn: AtomicU32::new(first_qpn),
            base: monotonic_ns(),
            polls: PollWatch::default(),
            directory,
            timers: Timers::default(),
            usage: Default::default(),
        });
        for p in &shared.ports {
            shared.directory.set(p.gid, p.local);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(move || {
                crate::driver::mark_provider_thread();
                f()
            })
        };
        let mut failed = None;
        let (dev, flag) = (shared.clone(), stop.clone());
        match spawn(
            format!("roce-{}-timer", cfg.name),
            Box::new(move || run_timers(dev, flag)),
        ) {
            Ok(h) => {
                shared.timers.set_thread(h.thread().clone());
                threads.push(h);
            }
            Err(e) => failed = Some(e),
        }
        for idx in 0..shared.ports.len() {
            if failed.is_some() {
                break;
            }
            let (dev, flag) = (shared.clone(), stop.clone());
            match spawn(
                format!("roce-{}-p{}", cfg.name, idx + 1),
                Box::new(move || run_port(dev, idx, flag)),
            ) {
                Ok(h) => threads.push(h),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            stop_driver(&shared, &stop, threads);
            return Err(Error::insufficient_resources(format!("driver thread: {e}")));
        }
        Ok(RoceDevice {
            shared: shared.clone(),
            _life: Arc::new(Running {
                shared: Some(shared),
                stop,
                threads: Mutex::new(threads),
                open,
                closed: Arc::default(),
            }),
        })
    }

    /// A watch on this device's shutdown, which starts when its last
    /// handle drops: its threads are joined by a reaper thread, never by
    /// the thread that dropped it ([`CloseWatch`]).
    pub fn close_watch(&self) -> CloseWatch {
        CloseWatch(self._life.closed.clone())
    }

    /// Node GUID.
    pub fn node_guid(&self) -> u64 {
        self.shared.attr.node_guid
    }

    /// The address port `port`'s socket is bound to (with the real UDP
    /// port when the configuration asked for port 0).
    pub fn local_addr(&self, port: u8) -> Option<SocketAddr> {
        self.shared.port(port).map(|p| p.local)
    }

    /// Port `port`'s packet counters: traffic, and drops and NAKs by
    /// reason.
    pub fn port_counters(&self, port: u8) -> Option<PortCounters> {
        self.shared.port(port).map(|p| p.counters.snapshot())
    }

    /// QPs that exist now.
    pub fn qp_count(&self) -> usize {
        self.shared.qps.read().len()
    }

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
            filter: al::sync::ArcCell::new(al::sync::Arc::new(crate::qp::filter_of(
                &self.shared,
                qpn,
                &fresh_attr(qpn, qp_type, init.caps, init.sq_sig_all, port),
            ))),
        });
        self.shared.qps.change(|qps| {
            if qps.len() >= self.shared.attr.max_qp as usize {
                return Err(Error::insufficient_resources(format!(
                    "max_qp reached: the device allows {} QPs",
                    self.shared.attr.max_qp
                )));
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

/// Stop the driver threads of `shared` and join them (a device whose
/// opening failed: on the opening thread, which may wait).
fn stop_driver(shared: &DevShared, stop: &AtomicBool, threads: Vec<JoinHandle<()>>) {
    signal_stop(shared, stop);
    join_all(threads);
}

impl Drop for Running {
    /// The last handle is gone, on whatever thread: the threads are told
    /// to stop, and a reaper joins them (`shutdown`).
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
        shutdown::reap(
            Reap {
                shared,
                threads,
                open: self.open.clone(),
                closed: self.closed.clone(),
            },
            &self.stop,
        );
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct RocePd {
    id: u64,
    device: u64,
    _charge: Charge,
}

/// A completion queue.
pub struct RoceCq {
    inner: Arc<CqInner>,
    _charge: Charge,
}

impl std::fmt::Debug for RoceCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceCq")
            .field("len", &self.inner.len())
            .field("lost", &self.inner.lost())
            .finish()
    }
}

/// A memory region. Dropping it deregisters it: when the drop returns,
/// the provider no longer touches the memory.
pub struct RoceMr {
    inner: Arc<MrInner>,
    dev: Arc<DevShared>,
}

impl std::fmt::Debug for RoceMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceMr")
            .field("iova", &format_args!("{:#x}", self.inner.iova))
            .field("len", &self.inner.len)
            .field("access", &self.inner.access)
            .finish()
    }
}

impl Drop for RoceMr {
    fn drop(&mut self) {
        self.dev.mrs.remove(self.inner.key);
        self.inner.mem.in_flight.remove_span(self.inner.key);
        self.inner.mem.invalidate();
    }
}

/// A shared receive queue.
pub struct RoceSrq {
    inner: Arc<SrqInner>,
    _charge: Charge,
}

impl std::fmt::Debug for RoceSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceSrq")
            .field("len", &self.inner.q.lock().wrs.len())
            .finish()
    }
}

/// An address vector (always with a GRH).
#[derive(Debug)]
pub struct RoceAv {
    pub(crate) attr: AvAttr,
    pub(crate) pd: u64,
    _charge: Charge,
}

/// A queue pair. Dropping it destroys it (outstanding work is discarded
/// without completions).
pub struct RoceQp {
    inner: Arc<QpInner>,
}

impl std::fmt::Debug for RoceQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceQp")
            .field("qpn", &self.inner.qpn)
            .field("type", &self.inner.qp_type)
            .finish()
    }
}

impl Drop for RoceQp {
    fn drop(&mut self) {
        self.inner.dev.qps.change(|qps| qps.remove(&self.inner.key));
        self.inner.destroy();
    }
}

/// Up to `n` send sockets on `local`'s IP, on UDP ports in
/// 0xC000..=0xFFFF spread by a hash of the device and the socket's index
/// (a port another socket holds is skipped; fewer sockets is fine).
fn source_sockets(local: SocketAddr, n: u8, salt: u64) -> Vec<(UdpSocket, SocketAddr)> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..u64::from(n) {
        for attempt in 0..8u64 {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, local, i, attempt).hash(&mut h);
            let port = 0xC000 | (h.finish() as u16 & 0x3fff);
            let addr = SocketAddr::new(local.ip(), port);
            if let Ok(s) = UdpSocket::bind(addr) {
                let _ = socket2::SockRef::from(&s).set_send_buffer_size(SOCKET_BUFFER);
                if no_fragments(&s).is_err() {
                    continue;
                }
                out.push((s, addr));
                break;
            }
        }
    }
    out
}

/// Receive and send buffer size asked of the kernel for each socket.
const SOCKET_BUFFER: usize = 4 << 20;
/// IPv4 sockets: `IP_MTU_DISCOVER = IP_PMTUDISC_DO`. The kernel then sets
/// DF and never fragments, and (`ip_select_ident_segs`) writes IPv4
/// identification 0 on an unconnected socket: the value the ICRC was
/// computed with (`roce::Endpoints::new`). With the default
/// (`IP_PMTUDISC_WANT`) Linux writes a hashed, per-packet identification
/// and every real RoCEv2 receiver (rxe, NICs) drops our packets for a bad
/// ICRC. A datagram above the route's MTU now fails to send (counted in
/// `tx_errors`) instead of leaving in fragments no RoCE receiver accepts.
fn no_fragments(socket: &UdpSocket) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    if socket.local_addr()?.is_ipv4() {
        use rustix::net::sockopt::{set_ip_mtu_discover, Ipv4PathMtuDiscovery};
        set_ip_mtu_discover(socket, Ipv4PathMtuDiscovery::DO)?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
    Ok(())
}

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
                "CQ capacity {} must be 1..={max}",
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
                "SRQ sizes {init:?} out of range (max_wr 1..={}, max_sge <= {})",
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
        let qpn = loop {
            let n = self.shared.next_qpn.fetch_add(1, Ordering::Relaxed) & QPN_MASK;
            if n > 1 && !self.shared.qps.read().contains_key(&n) {
                break n;
            }
        };
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

#[cfg(test)]
mod held_ack_tests {
    use super::*;

    #[test]
    fn only_a_run_of_close_empty_polls_counts_as_busy_polling() {
        let us = |n: u64| n * 1000;
        let w = PollWatch::default();
        let window = Duration::from_micros(200);
        // A consumer woken every 100 us that polls its two CQs (the CM
        // agent's round), and one that drains with completions first.
        for round in 1..200u64 {
            let t = us(100 * round);
            w.note(t, t, 3);
            w.note(t + 1, t + 1, 0);
            w.note(t + 2, t + 2, 0);
            assert!(!w.busy_within(t + 3, window), "round {round}");
        }
        // A spinning application: empty polls microseconds apart.
        let t0 = us(100_000);
        for k in 0..BUSY_POLL_STREAK as u64 {
            w.note(t0 + us(k), t0 + us(k), 0);
        }
        assert!(w.busy_within(t0 + us(20), window));
        assert!(
            !w.busy_within(t0 + us(300), window),
            "busy ends with the polling"
        );
        // A spinning application whose polls each drain a flood for 100 us
        // (they start 2 us after the one before ended): busy-polling.
        let w = PollWatch::default();
        let t1 = us(500_000);
        for k in 0..BUSY_POLL_STREAK as u64 {
            let began = t1 + us(102 * k);
            w.note(began, began + us(100), 0);
        }
        assert!(w.busy_within(t1 + us(102 * BUSY_POLL_STREAK as u64), window));
        // The same polls measured end to end would not have counted.
        let w = PollWatch::default();
        for k in 0..BUSY_POLL_STREAK as u64 {
            let end = t1 + us(102 * k) + us(100);
            w.note(end, end, 0);
        }
        assert!(!w.busy_within(t1 + us(102 * BUSY_POLL_STREAK as u64), window));
    }

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
        assert_eq!(held.sockets(), vec![0, 1]);
        assert_eq!(held.other_socket(0), Some(1));
        assert_eq!(held.other_socket(1), Some(0));
        let (mut bytes, mut msgs) = (Vec::new(), Vec::new());
        assert_eq!(held.take_for(0, |_| true, &mut bytes, &mut msgs), (1, 0));
        let newest = encoded(ack(7, 2));
        assert_eq!(msgs, vec![(to, 0, newest.len())]);
        assert_eq!(
            bytes, newest,
            "only the newest ACK of QP 7 goes, encoded as sent"
        );
        assert!(!held.is_empty(), "socket 1's ACK stays");
        assert_eq!(held.take_for(1, |q| q != 8, &mut bytes, &mut msgs), (0, 0));
        held.take_for(1, |q| q == 8, &mut bytes, &mut msgs);
        assert_eq!(&bytes[newest.len()..], &encoded(ack(8, 3))[..]);
        let decoded = Packet::decode(&bytes[newest.len()..], &ep).unwrap();
        assert_eq!(decoded.headers.bth.psn, 3, "a valid packet, ICRC included");
        assert!(held.is_empty());
    }
}

#[cfg(test)]
mod qp_memo_tests {
    use super::*;
    use provider::{CqInit, QpCaps, QpInit};

    #[test]
    fn a_memo_follows_every_change_of_the_qp_map() {
        let port = PortConfig::new("127.0.0.1:0".parse().unwrap());
        let d = RoceProvider::new(vec![DeviceConfig::new("memo", 1, vec![port])])
            .open(1)
            .unwrap();
        let pd = d.alloc_pd().unwrap();
        let cq = d
            .create_cq(CqInit {
                capacity: 16,
                ..CqInit::default()
            })
            .unwrap();
        let init = QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        let (a, b) = (
            d.create_qp(&pd, &init).unwrap(),
            d.create_qp(&pd, &init).unwrap(),
        );
        let (map, key) = (&d.shared.qps, a.inner.key);
        let mut memo = QpMemo::default();
        let found = |memo: &mut QpMemo| map.find(key, memo);
        assert!(Arc::ptr_eq(&found(&mut memo).unwrap(), &a.inner));
        assert!(
            Arc::ptr_eq(&found(&mut memo).unwrap(), &a.inner),
            "from the memo"
        );
        // The key names another QP while the first is still alive (as the
        // GSI key does when a port's QP1 is made again): a memo made
        // before the change must not match.
        map.change(|m| m.insert(key, b.inner.clone()));
        assert!(Arc::ptr_eq(&found(&mut memo).unwrap(), &b.inner));
        map.change(|m| m.remove(&key));
        assert!(found(&mut memo).is_none(), "removed, though alive");
    }
}
