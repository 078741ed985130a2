//! The check behind the `roce_transport` fuzz target (`fuzz/`), here so
//! that `cargo test` replays its corpus on stable
//! (`tests/fuzz_corpus.rs`), and (`mem.rs`) the in-memory [`TestMem`] the
//! transport's own tests use. Not part of the transport's interface: it panics when an
//! invariant breaks, which is how a fuzzer learns of a bug.
//!
//! The input drives two RC (or UC) transports joined by a wire the input
//! controls: post sends and receives, deliver, drop, duplicate and swap
//! packets, corrupt them (caught by the ICRC, or re-signed so the
//! transport sees them), inject packets decoded from raw input bytes,
//! move the clock, force a QP to ERR. Then the wire turns honest and
//! the pair runs until idle. Checked:
//!
//! * nothing panics, and no burst of transmits exceeds the window bound;
//! * every send completes exactly once, in order, within bounded fake
//!   time (success, or the error the retry limits give, then flushes);
//! * every receive completes at most once;
//! * when nothing forged reached a transport (no injected or re-signed
//!   packet), every successful message delivered exactly the bytes sent,
//!   and the receive side saw each SEND exactly once, in order.

mod mem;
pub mod receive;

pub use self::mem::{encode_transmit, Region, TestMem};

use std::collections::{HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use provider::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};
use roce::{Endpoints, IpHeader, Ipv4Header, Packet, ROCE_UDP_PORT};

use crate::{Config, Source, Transport, MAX_UNACKED_PSNS};

// -------------------------------------------------------------- input --

/// Reads the fuzzer's bytes; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

// ------------------------------------------------------------ the pair --

const REGION: usize = 1 << 15;
const SRC_VA: u64 = 0x10_0000;
const SINK_VA: u64 = 0x20_0000;
const RECV_VA: u64 = 0x30_0000;
const DST_VA: u64 = 0x40_0000;
/// Longest message the check posts.
const MAX_LEN: usize = 3000;
/// Receive buffers: one slot per receive queue entry, so that a message
/// that lands partly (its last packet lost) writes only its own slot.
const RECV_SLOT: usize = 3008;
const RECV_SLOTS: u64 = 64;
/// Most operations read from one input.
const MAX_OPS: usize = 4096;
/// Most packets on the wire; more are dropped (a wire has finite buffers).
const WIRE_CAP: usize = 1024;
/// Most packets one side may emit between two wire events: a full window
/// of requests and one response per request it holds.
const BURST_CAP: usize = 4 * MAX_UNACKED_PSNS as usize + 64;

/// What a posted send should have done, checked after the run.
#[derive(Debug, Clone, Copy)]
struct Posted {
    kind: u8,
    len: usize,
    /// Offset of the message in A's source (and B's destination) region.
    at: u64,
}

struct Side {
    t: Transport<()>,
    mem: TestMem,
    wcs: Vec<Wc>,
    addr: SocketAddr,
}

struct Packet2 {
    to: usize,
    bytes: Vec<u8>,
}

struct Pair {
    qp_type: QpType,
    sides: [Side; 2],
    /// The sends A accepted, by work request id.
    posted: Vec<Posted>,
    /// Receives posted to B.
    recvs_posted: u64,
    /// Successful receives B completed (checked as they complete).
    recv_ok: usize,
    wire: VecDeque<Packet2>,
    now: Duration,
    /// Whether a forged (injected or re-signed) packet reached a side.
    forged: bool,
    keys: Keys,
}

#[derive(Clone, Copy)]
struct Keys {
    src: u32,
    sink: u32,
    recv: u32,
    dst_r: u32,
}

impl Pair {
    fn new(qp_type: QpType, mtu: Mtu, retry: u8, timeout: u8) -> Pair {
        let cfg = |qpn, dest| {
            let mut c = Config::rc(qpn, dest);
            c.qp_type = qp_type;
            c.path_mtu = mtu;
            c.retry_cnt = retry;
            c.rnr_retry = retry;
            c.timeout = timeout;
            c.min_rnr_timer = 1;
            c.max_send_wr = 64;
            c.max_recv_wr = RECV_SLOTS as u32;
            c
        };
        let side = |c: Config, ip: [u8; 4]| Side {
            t: Transport::new(c).expect("a valid config"),
            mem: TestMem::default(),
            wcs: Vec::new(),
            addr: SocketAddr::from((Ipv4Addr::from(ip), 0xc000 | (c.qpn as u16 & 0x3fff))),
        };
        let mut a = side(cfg(0x11, 0x22), [192, 0, 2, 1]);
        let mut b = side(cfg(0x22, 0x11), [192, 0, 2, 2]);
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let (src, _) = a.mem.register(SRC_VA, REGION, Access::NONE);
        let (sink, _) = a.mem.register(SINK_VA, REGION, Access::LOCAL_WRITE);
        let (recv, _) = b.mem.register(
            RECV_VA,
            RECV_SLOT * RECV_SLOTS as usize,
            Access::LOCAL_WRITE,
        );
        let (_, dst_r) = b.mem.register(DST_VA, REGION, all);
        for (i, byte) in a.mem.region(src).bytes.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(31).wrapping_add(7);
        }
        for (i, byte) in b.mem.region(dst_r).bytes.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(17).wrapping_add(3);
        }
        Pair {
            qp_type,
            sides: [a, b],
            posted: Vec::new(),
            recvs_posted: 0,
            recv_ok: 0,
            wire: VecDeque::new(),
            now: Duration::from_secs(1),
            forged: false,
            keys: Keys {
                src,
                sink,
                recv,
                dst_r,
            },
        }
    }

    fn endpoints(&self, from: usize) -> Endpoints {
        let mut dst = self.sides[1 - from].addr;
        dst.set_port(ROCE_UDP_PORT);
        Endpoints::new(self.sides[from].addr, dst).expect("one family")
    }

    fn source(&self, from: usize) -> Source {
        let ep = self.endpoints(from);
        let Endpoints::V4(e) = ep else {
            unreachable!("the pair is IPv4")
        };
        Source {
            ip: IpHeader::V4(Ipv4Header {
                tos: 0,
                identification: e.identification,
                dont_fragment: e.dont_fragment,
                ttl: 64,
                src: *e.src.ip(),
                dst: *e.dst.ip(),
            }),
            src_port: e.src.port(),
            dst_port: e.dst.port(),
        }
    }

    /// Moves what both sides want to send onto the wire, and their
    /// completions into their lists.
    fn pull(&mut self) {
        for i in 0..2 {
            let ep = self.endpoints(i);
            let mut burst = 0;
            loop {
                let now = self.now;
                let s = &mut self.sides[i];
                let Some(tx) = s.t.poll_transmit(now, &mut s.mem) else {
                    break;
                };
                burst += 1;
                assert!(burst <= BURST_CAP, "side {i} emits packets without end");
                let Some(bytes) = encode_transmit(&mut s.t, &mut s.mem, &tx, &ep) else {
                    continue;
                };
                if self.wire.len() < WIRE_CAP {
                    self.wire.push_back(Packet2 { to: 1 - i, bytes });
                }
            }
            self.completions(i);
        }
    }

    /// Moves side `i`'s completions into its list, checking each
    /// receive of B the moment it completes (before a later message can
    /// reuse its slot).
    fn completions(&mut self, i: usize) {
        while let Some(wc) = self.sides[i].t.poll_completion() {
            if i == 1 {
                self.check_receive(&wc);
            }
            self.sides[i].wcs.push(wc);
        }
    }

    /// On RC, with nothing forged: B takes messages in PSN order, so its
    /// k-th successful receive is the k-th posted SEND or WRITE with
    /// immediate; its length, immediate and bytes must be that message's.
    fn check_receive(&mut self, wc: &Wc) {
        if wc.status != WcStatus::Success || self.forged || self.qp_type != QpType::Rc {
            return;
        }
        let k = self.recv_ok;
        self.recv_ok += 1;
        let (i, p) = self
            .posted
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, p)| consumes_receive(p.kind))
            .nth(k)
            .unwrap_or_else(|| panic!("receive {k} completed for no posted message"));
        assert_eq!(
            wc.byte_len as usize, p.len,
            "receive {k} (message {i}) length"
        );
        let imm = match p.kind {
            1 => Some(0xabc0_0000 | i as u32),
            3 => Some(i as u32),
            _ => None,
        };
        assert_eq!(wc.imm, imm, "receive {k} (message {i}) immediate");
        if p.kind <= 1 {
            let keys = self.keys;
            let sent = self.sides[0].mem.read(keys.src, SRC_VA + p.at, p.len);
            let got = self.sides[1]
                .mem
                .read(keys.recv, recv_slot(wc.wr_id), p.len);
            assert!(got == sent, "SEND {i} delivered different bytes");
        }
    }

    /// Posts one more receive to B; false when its queue is full.
    fn post_recv(&mut self) -> bool {
        let wr_id = 1000 + self.recvs_posted;
        let sge = [Sge {
            addr: recv_slot(wr_id),
            length: RECV_SLOT as u32,
            lkey: self.keys.recv,
        }];
        let wr = RecvWr {
            wr_id,
            sg_list: &sge,
        };
        let ok = self.sides[1].t.post_recv(&wr).is_ok();
        self.recvs_posted += u64::from(ok);
        ok
    }

    /// Hands `bytes` to side `to` as a packet from the other side; a
    /// packet the ICRC rejects is dropped as a driver would.
    fn deliver(&mut self, to: usize, bytes: &[u8], check_icrc: bool) {
        let ep = self.endpoints(1 - to);
        let decoded = if check_icrc {
            Packet::decode(bytes, &ep)
        } else {
            Packet::decode_without_icrc(bytes)
        };
        if let Ok(p) = decoded {
            let src = self.source(1 - to);
            let now = self.now;
            let s = &mut self.sides[to];
            s.t.handle_packet(now, &src, &p, &mut s.mem);
            self.completions(to);
        }
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        for s in &mut self.sides {
            s.t.handle_timeout(self.now);
        }
    }

    /// Runs with an honest wire until both sides are idle, or panics when
    /// that takes longer than the retry limits allow.
    fn settle(&mut self, limit: Duration) {
        let end = self.now + limit;
        loop {
            self.pull();
            if let Some(p) = self.wire.pop_front() {
                self.deliver(p.to, &p.bytes, true);
                continue;
            }
            let next = self.sides.iter().filter_map(|s| s.t.poll_timeout()).min();
            let Some(next) = next else { return };
            assert!(
                next <= end,
                "not idle {limit:?} after the faults ended (timer at {next:?})"
            );
            self.now = self.now.max(next);
            self.tick(Duration::ZERO);
        }
    }
}

/// What one run did, for tests that want to see the check do work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Sends posted (each completed exactly once).
    pub sends: usize,
    /// Of them, completed with success.
    pub succeeded: usize,
    /// Receive completions with success on the responder.
    pub received: usize,
    /// Whether a forged packet reached a side (data not checked).
    pub forged: bool,
}

/// `roce_transport`: see the module documentation.
pub fn roce_transport(data: &[u8]) -> Outcome {
    let mut input = Input(data);
    let head = input.u8();
    let qp_type = if head & 0x80 == 0 {
        QpType::Rc
    } else {
        QpType::Uc
    };
    let mtu = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu4096][usize::from(head & 3)];
    // Small retry counts and timers keep the fake time of a run short;
    // RNR retry 7 (infinite) is left out so that every run ends.
    let retry = (head >> 2) & 3;
    let timeout = 1 + ((head >> 4) & 3);
    let mut pair = Pair::new(qp_type, mtu, retry, timeout);
    let keys = pair.keys;

    let mut next_at = 0u64;
    let mut ops = 0;
    while !input.is_empty() && ops < MAX_OPS {
        ops += 1;
        match input.u8() % 12 {
            0 | 1 => {
                let kind = input.u8() % 7;
                let len = if kind >= 5 {
                    8
                } else {
                    usize::from(input.u16()) % (MAX_LEN + 1)
                };
                if next_at + len as u64 + 8 > REGION as u64 {
                    continue;
                }
                let at = next_at;
                next_at += (len as u64).div_ceil(8) * 8 + 8;
                let op = match kind {
                    0 => SendOp::Send,
                    1 => SendOp::SendImm(0xabc0_0000 | pair.posted.len() as u32),
                    2 => SendOp::Write {
                        remote_addr: DST_VA + at,
                        rkey: keys.dst_r,
                    },
                    3 => SendOp::WriteImm {
                        remote_addr: DST_VA + at,
                        rkey: keys.dst_r,
                        imm: pair.posted.len() as u32,
                    },
                    4 => SendOp::Read {
                        remote_addr: DST_VA + at,
                        rkey: keys.dst_r,
                    },
                    5 => SendOp::CompareSwap {
                        remote_addr: DST_VA + at,
                        rkey: keys.dst_r,
                        compare: 0,
                        swap: 1,
                    },
                    _ => SendOp::FetchAdd {
                        remote_addr: DST_VA + at,
                        rkey: keys.dst_r,
                        add: 1,
                    },
                };
                let lkey = if kind >= 4 { keys.sink } else { keys.src };
                let va = if kind >= 4 { SINK_VA } else { SRC_VA };
                let sge = [Sge {
                    addr: va + at,
                    length: len as u32,
                    lkey,
                }];
                let wr = SendWr::new(pair.posted.len() as u64, op, &sge);
                let s = &mut pair.sides[0];
                if s.t.post_send(&wr, &mut s.mem).is_ok() {
                    pair.posted.push(Posted { kind, len, at });
                }
            }
            2 => {
                pair.post_recv();
            }
            3 => pair.pull(),
            4 => {
                if let Some(p) = pair.wire.pop_front() {
                    pair.deliver(p.to, &p.bytes, true);
                }
            }
            5 => {
                pair.wire.pop_front();
            }
            6 => {
                if let Some(p) = pair.wire.front() {
                    if pair.wire.len() < WIRE_CAP {
                        let copy = Packet2 {
                            to: p.to,
                            bytes: p.bytes.clone(),
                        };
                        pair.wire.push_back(copy);
                    }
                }
            }
            7 => {
                let (i, j) = (usize::from(input.u8()), usize::from(input.u8()));
                let n = pair.wire.len();
                if n > 1 {
                    pair.wire.swap(i % n, j % n);
                }
            }
            8 => {
                // Corrupt one bit: with the ICRC checked it is dropped;
                // re-signed (decoded without the ICRC) it is a forgery.
                let (at, bit, resign) = (input.u16(), input.u8(), input.u8() & 1 == 1);
                if let Some(mut p) = pair.wire.pop_front() {
                    if !p.bytes.is_empty() {
                        let i = usize::from(at) % p.bytes.len();
                        p.bytes[i] ^= 1 << (bit % 8);
                    }
                    pair.forged |= resign;
                    pair.deliver(p.to, &p.bytes, !resign);
                }
            }
            9 => {
                let to = usize::from(input.u8() & 1);
                let n = usize::from(input.u8());
                let bytes = input.bytes(n).to_vec();
                pair.forged = true;
                pair.deliver(to, &bytes, false);
            }
            10 => {
                let exp = input.u8() % 24;
                pair.tick(Duration::from_nanos(1 << exp));
            }
            _ => {
                if input.u8() == 0xee {
                    let side = usize::from(input.u8() & 1);
                    pair.sides[side].t.set_error();
                    pair.forged = true; // data checks no longer apply
                }
            }
        }
    }

    // Enough receives for every SEND still to come, then an honest wire.
    let want = pair
        .posted
        .iter()
        .filter(|p| consumes_receive(p.kind))
        .count() as u64;
    while pair.recvs_posted < want && pair.post_recv() {}
    // Each try waits at most 4.096 us x 2^4 (timeout codes 1..=4) or an
    // RNR timer; with at most 3 retries per message, an hour is plenty.
    pair.settle(Duration::from_secs(3600));

    check_sends(&pair);
    check_receives(&mut pair);
    Outcome {
        sends: pair.posted.len(),
        succeeded: pair.sides[0]
            .wcs
            .iter()
            .filter(|w| w.opcode != WcOpcode::Recv && w.status == WcStatus::Success)
            .count(),
        received: pair.sides[1]
            .wcs
            .iter()
            .filter(|w| w.status == WcStatus::Success)
            .count(),
        forged: pair.forged,
    }
}

fn check_sends(pair: &Pair) {
    let (posted, qp_type) = (&pair.posted, pair.qp_type);
    let wcs: Vec<&Wc> = pair.sides[0]
        .wcs
        .iter()
        .filter(|w| w.opcode != WcOpcode::Recv)
        .collect();
    assert_eq!(
        wcs.len(),
        posted.len(),
        "every send completes exactly once: {wcs:?}"
    );
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(wc.wr_id, i as u64, "sends complete in order: {wcs:?}");
    }
    // After an error, the rest is flushed (or, on UC, failed locally).
    if qp_type == QpType::Rc {
        if let Some(first) = wcs.iter().position(|w| w.status != WcStatus::Success) {
            for w in &wcs[first + 1..] {
                assert_eq!(w.status, WcStatus::WrFlushError, "after an error: {wcs:?}");
            }
        }
    }
}

fn check_receives(pair: &mut Pair) {
    let mut seen = HashSet::new();
    for w in &pair.sides[1].wcs {
        assert!(seen.insert(w.wr_id), "receive {} completed twice", w.wr_id);
    }
    if pair.forged || pair.qp_type != QpType::Rc {
        return;
    }
    // RC: every successful SEND or WRITE with immediate took its receive
    // (each was checked as it completed); B may have taken more, whose
    // ACKs never came back.
    let keys = pair.keys;
    let send_wcs: Vec<Wc> = pair.sides[0]
        .wcs
        .iter()
        .filter(|w| w.opcode != WcOpcode::Recv)
        .copied()
        .collect();
    let consuming: Vec<usize> = (0..pair.posted.len())
        .filter(|&i| consumes_receive(pair.posted[i].kind))
        .collect();
    let last_ok = consuming
        .iter()
        .rposition(|&i| send_wcs[i].status == WcStatus::Success);
    if let Some(k) = last_ok {
        assert!(
            pair.recv_ok > k,
            "{} messages that take a receive succeeded, {} receives completed",
            k + 1,
            pair.recv_ok
        );
    }
    for (i, p) in pair.posted.iter().enumerate() {
        if send_wcs[i].status != WcStatus::Success {
            continue;
        }
        let sent = pair.sides[0].mem.read(keys.src, SRC_VA + p.at, p.len);
        match p.kind {
            2 | 3 => {
                let got = pair.sides[1].mem.read(keys.dst_r, DST_VA + p.at, p.len);
                assert!(got == sent, "WRITE {i} landed different bytes");
            }
            4 => {
                let want = pair.sides[1].mem.read(keys.dst_r, DST_VA + p.at, p.len);
                let got = pair.sides[0].mem.read(keys.sink, SINK_VA + p.at, p.len);
                assert!(got == want, "READ {i} returned different bytes");
            }
            _ => {}
        }
    }
}

/// SEND, SEND with immediate and WRITE with immediate take a receive.
fn consumes_receive(kind: u8) -> bool {
    kind <= 1 || kind == 3
}

/// The receive buffer slot of receive `wr_id`.
fn recv_slot(wr_id: u64) -> u64 {
    RECV_VA + (wr_id - 1000) % RECV_SLOTS * RECV_SLOT as u64
}
