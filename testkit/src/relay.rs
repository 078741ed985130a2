//! A UDP relay that drops, duplicates, reorders and delays datagrams
//! between two RoCEv2 endpoints: the faulty network of the fault tests
//! (the kernel here has no netem). `ibal relay` runs it between two
//! processes; tests run it on a thread.
//!
//! ```text
//!   A ──> near_a ══ relay ══ near_b ──> B      (and back)
//! ```
//!
//! A is told (`RoceProvider::add_peer`) that B's GID lives at `near_a`,
//! B that A's lives at `near_b`. A datagram arriving at `near_a` leaves
//! from `near_b` towards B's address, and the other way round. Because
//! the RoCEv2 ICRC covers the IP addresses and UDP ports, a relay that
//! changes them must sign the packet again for its new flow (as the
//! test's stand-in for a switch, not a NAT); a datagram that does not
//! decode as RoCEv2 is forwarded as it is (the receiver drops it). Each
//! side of the relay must be bound to the IP address of the end it stands
//! for (`near_a` to B's, `near_b` to A's; only the UDP port differs): a
//! connected QP takes packets only from its peer's address, and the UDP
//! source port is not checked.
//!
//! The fault decisions are a sans-IO core ([`Faults`]) with a seeded
//! generator, so a run is reproducible from its seed; the I/O loop is thin
//! and bounded in time and in datagrams.

use std::collections::BinaryHeap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibal::roce::wire::{Endpoints, Packet};

/// Fault probabilities (0.0..=1.0), each applied to every datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Lost.
    pub drop: f64,
    /// Delivered twice.
    pub duplicate: f64,
    /// Held back until the next datagram of its direction has gone.
    pub reorder: f64,
    /// Held for up to `max_delay`.
    pub delay: f64,
    /// Longest delay.
    pub max_delay: Duration,
    /// Generator seed.
    pub seed: u64,
}

impl FaultConfig {
    /// `p` of each fault, delays up to 2 ms.
    pub fn uniform(p: f64, seed: u64) -> FaultConfig {
        FaultConfig {
            drop: p,
            duplicate: p,
            reorder: p,
            delay: p,
            max_delay: Duration::from_millis(2),
            seed,
        }
    }
}

/// Which way a datagram travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// From A to B.
    AtoB,
    /// From B to A.
    BtoA,
}

/// What the relay did (each counter once per datagram or copy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Datagrams received.
    pub received: u64,
    /// Datagrams (and copies) sent on.
    pub forwarded: u64,
    /// Dropped by the fault plan.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Held back behind a later datagram.
    pub reordered: u64,
    /// Delayed.
    pub delayed: u64,
    /// Dropped because the relay's queue was full.
    pub overflow: u64,
}

/// One datagram waiting in the relay.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    at: Duration,
    seq: u64,
    dir: Dir,
    bytes: Vec<u8>,
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // A max-heap: the earliest (then the first queued) on top.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Most datagrams the relay holds; more are dropped (bounded memory).
pub const MAX_HELD: usize = 4096;

/// The fault plan: datagrams in with the time, datagrams due out.
#[derive(Debug)]
pub struct Faults {
    cfg: FaultConfig,
    rng: u64,
    seq: u64,
    queue: BinaryHeap<Held>,
    /// A datagram held for reordering, per direction: it goes right after
    /// the next datagram of its direction.
    behind: [Option<Vec<u8>>; 2],
    stats: RelayStats,
}

impl Faults {
    /// A plan with no datagram yet.
    pub fn new(cfg: FaultConfig) -> Faults {
        Faults {
            cfg,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            seq: 0,
            queue: BinaryHeap::new(),
            behind: [None, None],
            stats: RelayStats::default(),
        }
    }

    fn next(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        let x = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        p > 0.0 && x < p
    }

    fn push(&mut self, at: Duration, dir: Dir, bytes: Vec<u8>) {
        if self.queue.len() >= MAX_HELD {
            self.stats.overflow += 1;
            return;
        }
        self.seq += 1;
        self.queue.push(Held {
            at,
            seq: self.seq,
            dir,
            bytes,
        });
    }

    /// A datagram arrived at `now`.
    pub fn on_datagram(&mut self, now: Duration, dir: Dir, bytes: Vec<u8>) {
        self.stats.received += 1;
        if self.chance(self.cfg.drop) {
            self.stats.dropped += 1;
            return;
        }
        let slot = dir as usize;
        if self.behind[slot].is_none() && self.chance(self.cfg.reorder) {
            self.stats.reordered += 1;
            self.behind[slot] = Some(bytes);
            return;
        }
        let copies = if self.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = if self.chance(self.cfg.delay) {
                self.stats.delayed += 1;
                let max = self.cfg.max_delay.as_nanos().max(1) as u64;
                now + Duration::from_nanos(self.next() % max)
            } else {
                now
            };
            self.push(at, dir, bytes.clone());
        }
        if let Some(held) = self.behind[slot].take() {
            self.push(now, dir, held);
        }
    }

    /// The next datagram due at `now`, if any.
    pub fn poll_due(&mut self, now: Duration) -> Option<(Dir, Vec<u8>)> {
        if self.queue.peek().is_some_and(|h| h.at <= now) {
            let h = self.queue.pop()?;
            self.stats.forwarded += 1;
            return Some((h.dir, h.bytes));
        }
        None
    }

    /// When the next held datagram is due.
    pub fn next_due(&self) -> Option<Duration> {
        self.queue.peek().map(|h| h.at)
    }

    /// Releases datagrams held for reordering whose successor never came
    /// (called when the relay has been idle a while).
    pub fn release_held(&mut self, now: Duration) {
        for slot in 0..2 {
            if let Some(bytes) = self.behind[slot].take() {
                let dir = if slot == 0 { Dir::AtoB } else { Dir::BtoA };
                self.push(now, dir, bytes);
            }
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> RelayStats {
        self.stats
    }
}

/// Where the relay listens and forwards.
#[derive(Debug, Clone, Copy)]
pub struct RelayConfig {
    /// Where A sends (the relay's socket facing A).
    pub near_a: SocketAddr,
    /// Where B sends.
    pub near_b: SocketAddr,
    /// A's RoCEv2 port (its receiving socket).
    pub a: SocketAddr,
    /// B's RoCEv2 port.
    pub b: SocketAddr,
    /// The fault plan.
    pub faults: FaultConfig,
    /// The relay stops after this long ...
    pub max_time: Duration,
    /// ... or after this many datagrams received.
    pub max_datagrams: u64,
}

/// A relay running on its own thread.
pub struct RelayHandle {
    stop: Arc<AtomicBool>,
    /// When set, everything is dropped (a dead link or a dead peer).
    cut: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<std::io::Result<RelayStats>>>,
    /// The bound addresses (as asked, with real ports for port 0).
    pub near_a: SocketAddr,
    /// See [`RelayHandle::near_a`].
    pub near_b: SocketAddr,
}

impl RelayHandle {
    /// Drop every datagram from now on (`true`) or relay again.
    pub fn cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
    }
    /// Datagrams received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
    /// Stops the relay and returns its counters.
    pub fn stop(mut self) -> std::io::Result<RelayStats> {
        self.finish()
    }
    fn finish(&mut self) -> std::io::Result<RelayStats> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| std::io::Error::other("the relay thread panicked"))?,
            None => Ok(RelayStats::default()),
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Binds the relay's sockets and starts it on a thread.
pub fn spawn(cfg: RelayConfig) -> std::io::Result<RelayHandle> {
    let sock_a = UdpSocket::bind(cfg.near_a)?;
    let sock_b = UdpSocket::bind(cfg.near_b)?;
    for s in [&sock_a, &sock_b] {
        s.set_nonblocking(true)?;
        let _ = socket2::SockRef::from(s).set_recv_buffer_size(4 << 20);
    }
    let (near_a, near_b) = (sock_a.local_addr()?, sock_b.local_addr()?);
    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let thread = {
        let (stop, cut, received) = (stop.clone(), cut.clone(), received.clone());
        std::thread::Builder::new()
            .name("ibal-relay".into())
            .spawn(move || run(cfg, sock_a, sock_b, &stop, &cut, &received))?
    };
    Ok(RelayHandle {
        stop,
        cut,
        received,
        thread: Some(thread),
        near_a,
        near_b,
    })
}

/// The datagram `bytes`, signed again for the flow `from -> to` when it is
/// a RoCEv2 packet; as it is otherwise.
fn resign(bytes: &[u8], from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let Ok(ep) = Endpoints::new(from, to) else {
        return bytes.to_vec();
    };
    match Packet::decode_without_icrc(bytes) {
        Ok(p) => p.encode(&ep).unwrap_or_else(|_| bytes.to_vec()),
        Err(_) => bytes.to_vec(),
    }
}

fn run(
    cfg: RelayConfig,
    sock_a: UdpSocket,
    sock_b: UdpSocket,
    stop: &AtomicBool,
    cut: &AtomicBool,
    received: &AtomicU64,
) -> std::io::Result<RelayStats> {
    let start = Instant::now();
    let mut faults = Faults::new(cfg.faults);
    let mut buf = vec![0u8; 65536];
    let (near_a, near_b) = (sock_a.local_addr()?, sock_b.local_addr()?);
    let mut idle_since = Instant::now();
    while !stop.load(Ordering::SeqCst)
        && start.elapsed() < cfg.max_time
        && received.load(Ordering::Relaxed) < cfg.max_datagrams
    {
        let now = start.elapsed();
        let mut busy = false;
        for (sock, dir) in [(&sock_a, Dir::AtoB), (&sock_b, Dir::BtoA)] {
            // A bounded batch per socket per turn.
            for _ in 0..64 {
                match sock.recv_from(&mut buf) {
                    Ok((n, _from)) => {
                        busy = true;
                        received.fetch_add(1, Ordering::Relaxed);
                        if !cut.load(Ordering::SeqCst) {
                            faults.on_datagram(now, dir, buf[..n].to_vec());
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(e),
                }
            }
        }
        while let Some((dir, bytes)) = faults.poll_due(start.elapsed()) {
            busy = true;
            let (sock, from, to) = match dir {
                Dir::AtoB => (&sock_b, near_b, cfg.b),
                Dir::BtoA => (&sock_a, near_a, cfg.a),
            };
            let _ = sock.send_to(&resign(&bytes, from, to), to);
        }
        if busy {
            idle_since = Instant::now();
        } else {
            if idle_since.elapsed() > Duration::from_millis(5) {
                faults.release_held(start.elapsed());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(faults.stats())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_honest_plan_forwards_in_order() {
        let mut f = Faults::new(FaultConfig::uniform(0.0, 1));
        for i in 0..10u8 {
            f.on_datagram(Duration::ZERO, Dir::AtoB, vec![i]);
        }
        let out: Vec<u8> = std::iter::from_fn(|| f.poll_due(Duration::ZERO))
            .map(|(_, b)| b[0])
            .collect();
        assert_eq!(out, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn faults_happen_at_about_their_rate_and_nothing_is_lost_but_drops() {
        let mut f = Faults::new(FaultConfig::uniform(0.1, 7));
        let n = 20_000u64;
        let mut out = 0u64;
        for i in 0..n {
            let now = Duration::from_micros(i * 100);
            f.on_datagram(now, Dir::AtoB, vec![0]);
            while f.poll_due(now).is_some() {
                out += 1;
            }
        }
        f.release_held(Duration::from_secs(10));
        while f.poll_due(Duration::from_secs(10)).is_some() {
            out += 1;
        }
        let s = f.stats();
        for (what, v) in [
            ("drop", s.dropped),
            ("dup", s.duplicated),
            ("reorder", s.reordered),
            ("delay", s.delayed),
        ] {
            // 10% of the datagrams that reach each decision, give or take.
            assert!((1000..=2600).contains(&v), "{what}: {v} of {n}");
        }
        assert_eq!(out, n - s.dropped + s.duplicated, "{s:?}");
        assert_eq!(s.overflow, 0);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut f = Faults::new(FaultConfig {
            delay: 1.0,
            max_delay: Duration::from_secs(100),
            ..FaultConfig::uniform(0.0, 3)
        });
        for _ in 0..(MAX_HELD as u64 + 100) {
            f.on_datagram(Duration::ZERO, Dir::BtoA, vec![1; 100]);
        }
        assert_eq!(f.stats().overflow, 100);
    }
}
