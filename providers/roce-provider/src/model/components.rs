//! What `loom-tests/tests/roce_components.rs` drives: the production
//! completion queue (`cq::CqInner`), the QP map with its memo through a
//! real feeding lock (`qp_map`, `feed`), and a real port's held ACKs and
//! send batches (`held_acks`, `tx_batch`), each behind a thin wrapper that
//! calls the crate's own code and nothing else.

use std::net::SocketAddr;

use al::sync::Arc;
use provider::{AsyncHook, CompletionHook, CqArm, Wc};

use crate::cq::{CqInner, Deferred};
use crate::feed::{FeedLock, Feeding};
use crate::held_acks::holding_acks;
use crate::port::PortShared;
use crate::qp_map::{QpMap, QpMemo};
use crate::PortConfig;

/// A completion queue: `cq::CqInner` itself.
pub struct Cq(CqInner);

impl Cq {
    /// A CQ of `capacity` completions with these hooks.
    pub fn new(
        capacity: usize,
        on_completion: Option<CompletionHook>,
        on_async: Option<AsyncHook>,
    ) -> Cq {
        Cq(CqInner::new(0, capacity, on_completion, on_async))
    }

    /// Pushes `wc` as a QP's drive does: under the CQ's lock, the hooks it
    /// calls for collected and run once no lock is held.
    pub fn push(&self, wc: Wc) {
        let mut d = Deferred::default();
        self.0.push(wc, &mut d);
        d.run();
    }

    /// Polls up to `out.len()` completions (`poll_cq`).
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.0.poll(out)
    }

    /// Arms the CQ (`req_notify_cq`).
    pub fn arm(&self, arm: CqArm) {
        self.0.arm(arm)
    }

    /// Completions queued (under the lock).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no completion is queued (under the lock).
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Completions lost to overflow so far.
    pub fn lost(&self) -> u64 {
        self.0.lost()
    }
}

/// The device's QPs by key (`qp_map::QpMap`), over a model's QP type.
pub struct Qps<Q>(QpMap<Q>);

impl<Q> Default for Qps<Q> {
    fn default() -> Self {
        Qps(QpMap::new())
    }
}

impl<Q> Qps<Q> {
    /// Puts `qp` under `key` (creating a QP, or replacing one as the GSI
    /// key's QP1 is replaced); returns the QP it replaced.
    pub fn insert(&self, key: u32, qp: Arc<Q>) -> Option<Arc<Q>> {
        self.0.change(|m| m.insert(key, qp))
    }

    /// Removes `key`'s QP (destroying a QP); returns it.
    pub fn remove(&self, key: u32) -> Option<Arc<Q>> {
        self.0.change(|m| m.remove(&key))
    }

    /// The QP with `key`, through `memo` (`QpMap::find`).
    pub fn find(&self, key: u32, memo: &mut Memo<Q>) -> Option<Arc<Q>> {
        self.0.find(key, &mut memo.0)
    }
}

/// A memo of the last QP found (`qp_map::QpMemo`), held by a model
/// thread itself rather than by a feeding lock.
pub struct Memo<Q>(QpMemo<Q>);

impl<Q> Default for Memo<Q> {
    fn default() -> Self {
        Memo(QpMemo::default())
    }
}

/// A port bound on loopback (`port::PortShared`, sockets and all), its
/// feeding lock (`feed::FeedLock`, whose memo finds QPs in a [`Qps`]),
/// and its held ACKs and send batches (`held_acks`, `tx_batch`).
pub struct Port<Q> {
    port: PortShared,
    feed: FeedLock<Q>,
}

impl<Q> Port<Q> {
    /// Port 1 bound on 127.0.0.1 (an ephemeral UDP port), with
    /// `source_ports` send sockets besides it (0: it sends from its own).
    pub fn bind(source_ports: u8) -> Port<Q> {
        let pc = PortConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))).source_ports(source_ports);
        Port {
            port: PortShared::bind(1, &pc, 0x10c0).expect("bind a loopback port"),
            feed: FeedLock::default(),
        }
    }

    /// Takes the port's feeding lock (`feed::FeedLock::feeding`), given up
    /// when the [`Fed`] is dropped (`feed::Feeding`'s drop).
    pub fn feeding(&self) -> Fed<'_, Q> {
        Fed(self.feed.feeding(&self.port))
    }

    /// Which of the port's send sockets QP `qpn` sends on.
    pub fn socket_of(&self, qpn: u32) -> usize {
        // As `PortShared::batch` picks it.
        match self.port.tx.len() {
            0 => 0,
            n => qpn as usize % n,
        }
    }

    /// QP `qpn`'s positive ACK of `psn` to `to`, sent by a polling thread
    /// (`held_acks::holding_acks` around a batch): held.
    pub fn ack_while_polling(&self, qpn: u32, psn: u32, to: SocketAddr) {
        holding_acks(|| {
            let mut b = self.port.batch(qpn);
            b.push(to, &packet(ack(qpn, psn)));
        });
    }

    /// QP `qpn`'s SEND of `psn` to `to` (an application's answer): a
    /// batch pushed and flushed, the held ACKs of other QPs leading it.
    pub fn send(&self, qpn: u32, psn: u32, to: SocketAddr) {
        let mut b = self.port.batch(qpn);
        b.push(
            to,
            &packet(roce::Headers::new(roce::Bth::new(
                roce::Opcode::RcSendOnly,
                qpn,
                psn,
            ))),
        );
        b.flush();
    }

    /// Sends every held ACK (`PortShared::flush_held`: a poller's next
    /// progress, a turn of the receive thread).
    pub fn flush_held(&self) {
        self.port.flush_held();
    }

    /// `HeldAcks::is_empty` (one load).
    pub fn nothing_held(&self) -> bool {
        self.port.held.is_empty()
    }

    /// `HeldAcks::only` (one load): nothing held but QP `qpn`'s ACK on
    /// socket `sock`.
    pub fn only_held(&self, sock: usize, qpn: u32) -> bool {
        self.port.held.only(sock, qpn)
    }

    /// The sockets with ACKs held (under the list's lock).
    pub fn held_sockets(&self) -> Vec<usize> {
        self.port.held.lock().sockets()
    }
}

fn ack(qpn: u32, psn: u32) -> roce::Headers {
    let mut h = roce::Headers::new(roce::Bth::new(roce::Opcode::RcAck, qpn, psn));
    h.aeth = Some(roce::Aeth {
        syndrome: roce::Syndrome::Ack { credits: 31 },
        msn: psn,
    });
    h
}

fn packet(headers: roce::Headers) -> roce::Packet<'static> {
    roce::Packet {
        headers,
        payload: &[],
    }
}

/// What a packet the port sent was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Its BTH's QPN (the model's QPs send to a peer QP of their own
    /// number).
    pub qpn: u32,
    /// A positive ACK (else a SEND).
    pub ack: bool,
    /// Its PSN.
    pub psn: u32,
}

/// A port's feeding lock, held ([`Port::feeding`]).
pub struct Fed<'p, Q>(Feeding<'p, Q>);

impl<Q> Fed<'_, Q> {
    /// Finds a datagram's QP, `key`'s, in `qps` through the feeding
    /// lock's memo, as the receive stage does (`driver`).
    pub fn find(&mut self, qps: &Qps<Q>, key: u32) -> Option<Arc<Q>> {
        let (memo, _gate) = self.0.rx_state();
        qps.0.find(key, memo)
    }
}

/// The peer: a socket of the model's loopback network (`fake_net`, where
/// the ports' sockets are under loom) that receives what the ports send,
/// in the order they sent it (a datagram is queued to its receiver within
/// the sending call).
pub struct Wire(crate::fake_net::UdpSocket);

impl Wire {
    /// A socket on 127.0.0.1 (an ephemeral UDP port).
    pub fn bind() -> Wire {
        let s = crate::fake_net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind the wire");
        Wire(s)
    }

    /// Where to send to reach it.
    pub fn addr(&self) -> SocketAddr {
        self.0.local_addr().expect("the wire's address")
    }

    /// Everything received so far, in order.
    pub fn received(&self) -> Vec<Sent> {
        let mut out = Vec::new();
        while let Some((buf, _)) = self.0.take(false) {
            let p = roce::Packet::decode_without_icrc(&buf).expect("a RoCEv2 packet");
            out.push(Sent {
                qpn: p.headers.bth.dest_qp,
                ack: p.headers.bth.opcode == roce::Opcode::RcAck,
                psn: p.headers.bth.psn,
            });
        }
        out
    }
}
