//! Test harness: an in-memory `Memory`, and a seeded "network" that moves
//! encoded packets between two transports under a fake clock, dropping,
//! duplicating, delaying (so reordering) and corrupting them.
#![allow(dead_code)]

pub mod workload;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use provider::Wc;
use roce::{Endpoints, IpHeader, Ipv4Header, Packet};
use roce_transport::fuzzing::encode_transmit;
use roce_transport::{Config, Source, Transport};

pub use roce_transport::fuzzing::TestMem;

/// splitmix64.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        (self.next() % 1000) < u64::from(per_mille)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Fault rates, per mille, applied to every packet in both directions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub drop: u32,
    pub duplicate: u32,
    /// Extra delay of up to `max_delay` (reorders).
    pub delay: u32,
    pub corrupt: u32,
    pub max_delay: Duration,
}

impl Faults {
    pub fn all(per_mille: u32) -> Faults {
        Faults {
            drop: per_mille,
            duplicate: per_mille,
            delay: per_mille,
            corrupt: per_mille,
            max_delay: Duration::from_micros(200),
        }
    }
}

pub struct Side {
    pub t: Transport<()>,
    pub mem: TestMem,
    pub wcs: Vec<Wc>,
    pub addr: SocketAddr,
}

struct InFlight {
    at: Duration,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
}

/// A per-packet filter: (sending side, its packet index, packet) -> keep.
pub type Script = Box<dyn FnMut(usize, u64, &Packet<'_>) -> bool>;

/// Two transports joined by a faulty wire.
pub struct Net {
    pub now: Duration,
    pub sides: [Side; 2],
    wire: Vec<InFlight>,
    seq: u64,
    pub rng: Rng,
    pub faults: Faults,
    /// Drop everything from this side (a dead path).
    pub cut: [bool; 2],
    pub latency: Duration,
    pub sent: u64,
    pub corrupted: u64,
    /// A script: called on each encoded packet (side, packet index from
    /// that side); return false to drop it.
    pub script: Option<Script>,
    count: [u64; 2],
}

impl Net {
    pub fn new(a: Config, b: Config, seed: u64) -> Net {
        let side = |cfg: Config, ip: [u8; 4]| Side {
            t: Transport::new(cfg).expect("config"),
            mem: TestMem::default(),
            wcs: Vec::new(),
            addr: SocketAddr::from((Ipv4Addr::from(ip), 0xc000 + (cfg.qpn as u16 & 0x3fff))),
        };
        Net {
            now: Duration::from_secs(1),
            sides: [side(a, [10, 0, 0, 1]), side(b, [10, 0, 0, 2])],
            wire: Vec::new(),
            seq: 0,
            rng: Rng(seed),
            faults: Faults::default(),
            cut: [false; 2],
            latency: Duration::from_micros(5),
            sent: 0,
            corrupted: 0,
            script: None,
            count: [0; 2],
        }
    }

    /// The pair of an RC connection: QPNs 0x11 and 0x22.
    pub fn rc_pair(mtu: provider::Mtu, seed: u64) -> Net {
        let mut a = Config::rc(0x11, 0x22);
        let mut b = Config::rc(0x22, 0x11);
        a.path_mtu = mtu;
        b.path_mtu = mtu;
        Net::new(a, b, seed)
    }

    fn endpoints(&self, from: usize) -> Endpoints {
        let mut dst = self.sides[1 - from].addr;
        dst.set_port(roce::ROCE_UDP_PORT);
        Endpoints::new(self.sides[from].addr, dst).expect("v4")
    }

    fn send_all(&mut self) {
        for i in 0..2 {
            let ep = self.endpoints(i);
            loop {
                let now = self.now;
                let s = &mut self.sides[i];
                let Some(tx) = s.t.poll_transmit(now, &mut s.mem) else {
                    break;
                };
                let Some(mut bytes) = encode_transmit(&mut s.t, &mut s.mem, &tx, &ep) else {
                    continue; // its memory went away: not sent
                };
                self.sent += 1;
                self.count[i] += 1;
                if self.cut[i] {
                    continue;
                }
                if let Some(script) = self.script.as_mut() {
                    if !script(i, self.count[i] - 1, &tx.packet()) {
                        continue;
                    }
                }
                let f = self.faults;
                if self.rng.chance(f.drop) {
                    continue;
                }
                if self.rng.chance(f.corrupt) {
                    let at = self.rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << self.rng.below(8);
                    self.corrupted += 1;
                }
                let copies = if self.rng.chance(f.duplicate) { 2 } else { 1 };
                for _ in 0..copies {
                    let extra = if self.rng.chance(f.delay) {
                        Duration::from_nanos(self.rng.below(f.max_delay.as_nanos() as u64 + 1))
                    } else {
                        Duration::ZERO
                    };
                    self.seq += 1;
                    self.wire.push(InFlight {
                        at: now_plus(self.now, self.latency + extra),
                        seq: self.seq,
                        to: 1 - i,
                        bytes: bytes.clone(),
                    });
                }
            }
            let s = &mut self.sides[i];
            while let Some(sg) = s.t.poll_released() {
                s.mem.release(&sg);
            }
            while let Some(wc) = s.t.poll_completion() {
                s.wcs.push(wc);
            }
        }
    }

    /// Delivers what is due; returns whether anything was.
    fn deliver(&mut self) -> bool {
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.wire.len() {
            if self.wire[i].at <= now {
                due.push(self.wire.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| (p.at, p.seq));
        let any = !due.is_empty();
        for p in due {
            let ep = self.endpoints(1 - p.to);
            let Ok(pkt) = Packet::decode(&p.bytes, &ep) else {
                continue; // corrupted: the ICRC check drops it
            };
            let src = source(&ep);
            let s = &mut self.sides[p.to];
            s.t.handle_packet(now, &src, &pkt, &mut s.mem);
        }
        any
    }

    /// Runs until `done` holds, nothing is left to do, or `limit` of fake
    /// time passes. Returns whether `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.send_all();
            if done(self) {
                return true;
            }
            if self.deliver() {
                continue;
            }
            let mut next: Option<Duration> = self.wire.iter().map(|p| p.at).min();
            for s in &self.sides {
                if let Some(t) = s.t.poll_timeout() {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
            let Some(next) = next else { return done(self) };
            if next > end {
                return done(self);
            }
            self.now = self.now.max(next);
            for s in &mut self.sides {
                s.t.handle_timeout(self.now);
            }
        }
    }

    /// Runs until idle (or `limit`).
    pub fn run(&mut self, limit: Duration) {
        self.run_until(limit, |_| false);
    }
}

fn now_plus(now: Duration, d: Duration) -> Duration {
    now + d
}

/// The `Source` of a packet of flow `ep`.
pub fn source(ep: &Endpoints) -> Source {
    match ep {
        Endpoints::V4(e) => Source {
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
        },
        Endpoints::V6(e) => Source {
            ip: IpHeader::V6(roce::Ipv6Header {
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                src: *e.src.ip(),
                dst: *e.dst.ip(),
            }),
            src_port: e.src.port(),
            dst_port: e.dst.port(),
        },
    }
}

/// A deterministic byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}
