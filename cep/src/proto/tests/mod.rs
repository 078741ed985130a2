//! Simulated-pair tests: two endpoints, a fake clock and a network queue
//! between them with optional drop / duplicate / reorder (jitter) faults
//! driven by a seeded xorshift PRNG. `check_invariants` runs after every
//! step. Every MAD goes through `wire::encode` and `wire::decode`.
//!
//! This file is the harness; the tests are by topic beside it: `connect.rs`
//! (a whole connection, rejects), `retries.rs` (retries, MRA, duplicates),
//! `stale.rs` (stale connections, unknown ids, early "established"),
//! `lap.rs`, `sidr.rs`, `destroy.rs` (destroy in every state), `pacing.rs`
//! (the request window under bursts),
//! `robustness.rs` (wrong calls, random MADs, fault injection) and
//! `strangers.rs` (MADs for a connection from another port than its peer).

use std::collections::BTreeMap;

use super::*;
use crate::wire::{self, CmMessage, PathInfo, PrivateData};

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

const PLT: u8 = 10;
const RESP: u8 = 12;
const RETRIES: u8 = 3;
const TAD: u8 = 8;
const SVC: u64 = 0x1000_0000_0000_0001;
const LATENCY: u64 = 100_000;

fn addr(i: usize) -> PeerAddr {
    PeerAddr {
        lid: i as u16 + 1,
        gid: [i as u8 + 1; 16],
    }
}

fn guid(i: usize) -> u64 {
    0xA000 + i as u64
}

fn config(i: usize) -> EndpointConfig {
    EndpointConfig::new(guid(i))
}

fn req_for(service_id: u64, qpn: u32) -> Req {
    Req {
        service_id,
        local_qpn: qpn,
        local_qkey: 0x1111,
        starting_psn: 0x100,
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: RESP,
        local_cm_response_timeout: RESP,
        max_cm_retries: RETRIES,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 5,
        primary_path: PathInfo {
            local_lid: 1,
            remote_lid: 2,
            local_ack_timeout: PLT + 1,
            ..PathInfo::default()
        },
        ..Req::default()
    }
}

fn connect_params(to: usize, service_id: u64, qpn: u32) -> ConnectParams {
    ConnectParams::new(addr(to), req_for(service_id, qpn))
}

fn rep_for(qpn: u32) -> Rep {
    Rep {
        local_qpn: qpn,
        starting_psn: 0x200,
        target_ack_delay: TAD,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        ..Rep::default()
    }
}

/// Number of seeds for the randomized tests: `PROTO_SEEDS` or `default`.
fn seeds(default: u64) -> u64 {
    std::env::var("PROTO_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn wait() -> u64 {
    response_wait_nanos(PLT, RESP)
}

type DropRule = Box<dyn FnMut(usize, &CmMad) -> bool>;
type Policy<'a> = &'a mut dyn FnMut(usize, &mut Endpoint, Nanos, &Event);

struct Flight {
    at: Nanos,
    seq: u64,
    to: usize,
    from: usize,
    mad: CmMad,
}

struct Sim {
    now: Nanos,
    eps: [Endpoint; 2],
    net: Vec<Flight>,
    rng: Rng,
    drop_pm: u64,
    dup_pm: u64,
    jitter: u64,
    drop_rule: Option<DropRule>,
    seq: u64,
    /// Every event: (time, side, event).
    log: Vec<(Nanos, usize, Event)>,
    /// Every MAD sent: (time, sender, MAD).
    sent: Vec<(Nanos, usize, CmMad)>,
    steps: u64,
}

fn noop(_: usize, _: &mut Endpoint, _: Nanos, _: &Event) {}

/// The cooperative user: accepts, sends RTU, answers DREQ, LAP and SIDR.
fn respond(ep: &mut Endpoint, now: Nanos, ev: &Event) -> Result<(), ProtoError> {
    match ev {
        Event::ConnectRequest { conn, req, .. } => {
            ep.accept(now, *conn, rep_for(0x8000 + req.local_qpn))
        }
        Event::ReplyReceived { conn, .. } => ep.send_rtu(*conn, b"rtu"),
        Event::DisconnectRequest { conn, .. } => ep.disconnect_reply(now, *conn, b"bye"),
        Event::LapReceived { conn, .. } => ep.apr(*conn, ApStatus::Success, &[], &[]),
        Event::SidrRequest { conn, .. } => {
            let reply = SidrReplyParams {
                qpn: 0x77,
                qkey: 0x1234,
                ..SidrReplyParams::default()
            };
            ep.sidr_reply(*conn, reply)
        }
        _ => Ok(()),
    }
}

/// [`respond`], insisting that every answer is valid: events are handled
/// as soon as they are queued, so the CEP must still be in the state the
/// event put it in.
fn auto(_: usize, ep: &mut Endpoint, now: Nanos, ev: &Event) {
    if let Err(e) = respond(ep, now, ev) {
        panic!("answering {ev:?}: {e}");
    }
}

/// [`respond`], tolerating CEPs that moved on (for tests that inject MADs
/// behind the harness's back, so events are handled late).
fn lenient(_: usize, ep: &mut Endpoint, now: Nanos, ev: &Event) {
    let _ = respond(ep, now, ev);
}

impl Sim {
    fn new(seed: u64) -> Self {
        Self {
            now: Nanos(1_000),
            eps: [Endpoint::new(config(0)), Endpoint::new(config(1))],
            net: Vec::new(),
            rng: Rng::new(seed),
            drop_pm: 0,
            dup_pm: 0,
            jitter: 0,
            drop_rule: None,
            seq: 0,
            log: Vec::new(),
            sent: Vec::new(),
            steps: 0,
        }
    }

    fn check(&self) {
        for (i, ep) in self.eps.iter().enumerate() {
            if let Err(e) = ep.check_invariants() {
                panic!("endpoint {i} at {}: {e}", self.now);
            }
        }
    }

    fn collect(&mut self, policy: Policy<'_>) {
        loop {
            let mut any = false;
            for i in 0..2 {
                while let Some(ev) = self.eps[i].poll_event() {
                    any = true;
                    policy(i, &mut self.eps[i], self.now, &ev);
                    self.log.push((self.now, i, ev));
                }
            }
            if !any {
                break;
            }
        }
        self.check();
    }

    fn flush(&mut self) {
        for from in 0..2 {
            while let Some(tx) = self.eps[from].poll_transmit() {
                let bytes = wire::encode(&tx.mad).expect("endpoint produced an unencodable MAD");
                let mad = wire::decode(&bytes).expect("decode");
                assert_eq!(mad, tx.mad);
                let Some(to) = (0..2).find(|&j| addr(j) == tx.to) else {
                    // Answers to a stranger (addr(2), which tests use as
                    // the source of MADs from neither side) leave the
                    // simulated network.
                    assert_eq!(tx.to, addr(2), "MAD to an unknown address");
                    self.sent.push((self.now, from, tx.mad));
                    continue;
                };
                self.sent.push((self.now, from, mad));
                if let Some(rule) = self.drop_rule.as_mut() {
                    if rule(to, &mad) {
                        continue;
                    }
                }
                if self.rng.chance(self.drop_pm) {
                    continue;
                }
                let copies = if self.rng.chance(self.dup_pm) { 2 } else { 1 };
                for _ in 0..copies {
                    let at = self
                        .now
                        .saturating_add(LATENCY + self.rng.below(self.jitter + 1));
                    self.seq += 1;
                    self.net.push(Flight {
                        at,
                        seq: self.seq,
                        to,
                        from,
                        mad,
                    });
                }
            }
        }
    }

    fn next_flight(&self) -> Option<usize> {
        self.net
            .iter()
            .enumerate()
            .min_by_key(|(_, f)| (f.at, f.seq))
            .map(|(i, _)| i)
    }

    fn deliver(&mut self, idx: usize) {
        let f = self.net.swap_remove(idx);
        self.now = self.now.max(f.at);
        self.eps[f.to].handle_mad(self.now, addr(f.from), f.mad);
    }

    /// One input (the earliest message or timer). False when nothing is left.
    fn step(&mut self, policy: Policy<'_>) -> bool {
        self.collect(policy);
        self.flush();
        let msg = self.next_flight().map(|i| (self.net[i].at, i));
        let timer = (0..2)
            .filter_map(|i| self.eps[i].next_timeout().map(|t| (t, i)))
            .min();
        match (msg, timer) {
            (None, None) => return false,
            (Some((at, i)), Some((t, _))) if at <= t => self.deliver(i),
            (Some((_, i)), None) => self.deliver(i),
            (_, Some((t, side))) => {
                self.now = self.now.max(t);
                self.eps[side].handle_timeout(self.now);
            }
        }
        self.steps += 1;
        assert!(self.steps < 2_000_000, "simulation does not converge");
        self.check();
        self.collect(policy);
        self.flush();
        true
    }

    /// Runs until no message is in flight and no timer is armed.
    fn run(&mut self, policy: Policy<'_>) {
        while self.step(policy) {}
    }

    /// Delivers messages (and their answers) until the network is empty,
    /// without firing timers.
    fn pump(&mut self, policy: Policy<'_>) {
        loop {
            self.collect(policy);
            self.flush();
            let Some(i) = self.next_flight() else { break };
            self.deliver(i);
            self.check();
        }
        self.collect(policy);
    }

    /// Runs every input due at or before `t`, then sets the clock to `t`.
    fn run_until(&mut self, t: Nanos, policy: Policy<'_>) {
        loop {
            self.collect(policy);
            self.flush();
            let msg = self.net.iter().map(|f| f.at).min();
            let timer = self.eps.iter().filter_map(|e| e.next_timeout()).min();
            let next = [msg, timer].into_iter().flatten().min();
            match next {
                Some(n) if n <= t => {
                    self.step(policy);
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
    }

    fn events(&self, side: usize, conn: ConnId) -> Vec<&Event> {
        self.log
            .iter()
            .filter(|(_, s, e)| *s == side && e.conn() == conn)
            .map(|(_, _, e)| e)
            .collect()
    }

    fn first_conn_request(&self, side: usize) -> ConnId {
        self.log
            .iter()
            .find_map(|(_, s, e)| match e {
                Event::ConnectRequest { conn, .. } if *s == side => Some(*conn),
                _ => None,
            })
            .expect("no ConnectRequest")
    }

    fn sent_kinds(&self, from: usize) -> Vec<&'static str> {
        self.sent
            .iter()
            .filter(|(_, s, _)| *s == from)
            .map(|(_, _, m)| m.message_kind())
            .collect()
    }

    fn last_sent(&self, from: usize) -> Option<CmMad> {
        self.sent
            .iter()
            .rev()
            .find(|(_, s, _)| *s == from)
            .map(|(_, _, m)| *m)
    }

    /// Cancels listeners, destroys what is left, runs every timer, and
    /// asserts that both endpoints end with no CEP and no id.
    fn finish(&mut self) {
        for i in 0..2 {
            for (id, st) in self.eps[i].ceps() {
                if st == State::Listen {
                    self.eps[i].cancel_listen(id).unwrap();
                } else if st != State::Timewait {
                    self.eps[i].destroy(self.now, id).unwrap();
                }
            }
        }
        self.run(&mut lenient);
        for i in 0..2 {
            assert_eq!(self.eps[i].live_connections(), 0, "side {i}");
            assert_eq!(self.eps[i].allocated_ids(), 0, "side {i}");
        }
    }
}

fn count<T>(v: &[T], f: impl Fn(&T) -> bool) -> usize {
    v.iter().filter(|x| f(x)).count()
}

/// A connected pair: A (side 0) connected to B (side 1).
fn connected() -> (Sim, ConnId, ConnId) {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    let b = sim.first_conn_request(1);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    (sim, a, b)
}

fn alt_path() -> LapParams {
    LapParams {
        alternate_path: PathInfo {
            local_lid: 7,
            remote_lid: 8,
            local_ack_timeout: PLT + 1,
            ..PathInfo::default()
        },
        private_data: PrivateData::new(b"alt").unwrap(),
    }
}

fn sidr_params(service_id: u64) -> SidrParams {
    SidrParams {
        peer: addr(1),
        service_id,
        pkey: 0xFFFF,
        timeout: RESP,
        packet_life_time: PLT,
        max_retries: 2,
        private_data: PrivateData::new(b"who").unwrap(),
    }
}

// ---------------------------------------------------------------------------
// Formulas
// ---------------------------------------------------------------------------

#[test]
fn timer_formulas() {
    let t = wire::cm_timeout_to_nanos;
    assert_eq!(response_wait_nanos(PLT, RESP), 2 * t(PLT) + t(RESP));
    assert_eq!(timewait_nanos(PLT, Some(TAD)), 2 * t(PLT) + t(TAD));
    assert_eq!(timewait_nanos(PLT, None), 2 * t(PLT));
    assert_eq!(mra_wait_nanos(PLT, 20), t(20) + 2 * t(PLT));
    assert_eq!(response_wait_nanos(60, 60), u64::MAX);
    assert_eq!(packet_life_time_from_ack_timeout(0), 0);
    assert_eq!(packet_life_time_from_ack_timeout(15), 14);
}

#[test]
fn errors_display() {
    let e = ProtoError::WrongState {
        conn: ConnId(0x0010_0001),
        state: State::ReqSent,
        call: "accept",
    };
    assert_eq!(
        e.to_string(),
        "cep#0x00100001: accept is not valid in state REQ_SENT"
    );
    assert!(ProtoError::NoFreeIds.to_string().contains("no free"));
    let w: ProtoError = wire::WireError::PrivateDataTooLong { max: 1, got: 2 }.into();
    assert!(std::error::Error::source(&w).is_some());
}

mod burst;
mod connect;
mod destroy;
mod lap;
mod pacing;
mod retries;
mod robustness;
mod sidr;
mod stale;

// ---------------------------------------------------------------------------
// MADs for a connection from another port than its peer
// ---------------------------------------------------------------------------

mod strangers;
