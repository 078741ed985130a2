//! The CM agent of `cep` on RoCEv2 ports against a stranger: a plain UDP
//! socket on 127.0.0.77 (neither peer; all of 127.0.0.0/8 is loopback)
//! sends RoCEv2 UD SEND-only packets with valid ICRCs to a victim's QP1
//! (Q_Key 0x80010000), each carrying the CM MAD the victim's peer would
//! send, with the right comm ids and QPN. None changes the connection (its
//! state stays, no event reaches the consumer, nothing is sent for it),
//! and each is counted in `AgentStats::not_from_peer`. The same MAD from a
//! socket bound to the peer's IP (another UDP port: the source port is
//! entropy and not checked) is acted on.
//!
//! Before the check (issue 26), a DREQ with the right comm ids from
//! 127.0.0.77 tore down an established connection, either side, and a REJ
//! ended a connection in setup.
//!
//! The agents run in poll mode with the clock standing still: no retry or
//! timewait fires, so every state seen is the one the MADs made.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cep::agent::{AgentConfig, CmAgent};
use cep::proto::{ConnId, ConnectParams, Event, Nanos, State};
use cep::wire::{
    CmMad, Drep, Dreq, Lap, MessageMraed, MessageRejected, Mra, PathInfo, Rej, RejectReason, Rep,
    Req, Rtu,
};
use provider::{Provider, GSI_QKEY};
use roce::{Bth, Deth, Endpoints, Headers, Opcode, Packet};
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};

type Agent = CmAgent<RoceDevice>;

const SVC: u64 = 0x1000_0000_0000_0077;
const A_IP: &str = "127.0.0.1";
const B_IP: &str = "127.0.0.2";
const STRANGER_IP: &str = "127.0.0.77";
const DEADLINE: Duration = Duration::from_secs(10);

/// Two agents in poll mode on RoCEv2 ports at 127.0.0.1 and 127.0.0.2.
struct World {
    a: Agent,
    b: Agent,
    /// Connections made so far: each gets its own QPNs, so none looks
    /// like a stale copy of another.
    made: u32,
}

/// One connection: its comm id and QPN on each side.
#[derive(Clone, Copy, Debug)]
struct Conn {
    a: ConnId,
    b: ConnId,
    qpn_a: u32,
    qpn_b: u32,
}

impl World {
    fn new() -> World {
        let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
        let p = RoceProvider::new(vec![
            DeviceConfig::new("a", 0xa0, vec![port(A_IP)]),
            DeviceConfig::new("b", 0xb0, vec![port(B_IP)]),
        ]);
        let a = CmAgent::new(p.open(0xa0).unwrap(), 1, AgentConfig::default()).unwrap();
        let b = CmAgent::new(p.open(0xb0).unwrap(), 1, AgentConfig::default()).unwrap();
        b.listen(SVC).unwrap();
        World { a, b, made: 0 }
    }

    fn agent(&self, side: Side) -> &Agent {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// A connects; B's agent sees the REQ. Returns the connection in
    /// REQ_SENT / REQ_RCVD.
    fn request(&mut self) -> Conn {
        self.made += 1;
        let qpn_a = 0x100 + self.made;
        let qpn_b = 0x200 + self.made;
        let req = Req {
            service_id: SVC,
            local_qpn: qpn_a,
            starting_psn: 0x100,
            responder_resources: 4,
            initiator_depth: 4,
            remote_cm_response_timeout: 12,
            local_cm_response_timeout: 12,
            max_cm_retries: 3,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            primary_path: PathInfo {
                local_gid: self.a.local_addr().gid,
                remote_gid: self.b.local_addr().gid,
                hop_limit: 64,
                local_ack_timeout: 11,
                ..PathInfo::default()
            },
            ..Req::default()
        };
        let a = self
            .a
            .connect(ConnectParams::new(self.b.local_addr(), req))
            .unwrap();
        let ev = wait_event(
            &self.b,
            "the REQ",
            |e| matches!(e, Event::ConnectRequest { req, .. } if req.local_comm_id == a.comm_id()),
        );
        let Event::ConnectRequest { conn: b, .. } = ev else {
            unreachable!()
        };
        Conn { a, b, qpn_a, qpn_b }
    }

    /// B accepted and A took the REP: REP_RCVD / REP_SENT.
    fn replied(&mut self) -> Conn {
        let c = self.request();
        let rep = Rep {
            local_qpn: c.qpn_b,
            starting_psn: 0x200,
            target_ack_delay: 8,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            ..Rep::default()
        };
        self.b.accept(c.b, rep).unwrap();
        wait_event(
            &self.a,
            "the REP",
            |e| matches!(e, Event::ReplyReceived { conn, .. } if *conn == c.a),
        );
        c
    }

    /// Both sides ESTABLISHED.
    fn established(&mut self) -> Conn {
        let c = self.replied();
        self.a.send_rtu(c.a, &[]).unwrap();
        wait_event(&self.b, "the RTU", |e| {
            *e == Event::Established { conn: c.b }
        });
        self.a.drain_events();
        c
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// Polls `agent` (clock standing still) until it has an event `f` takes;
/// drops the others.
fn wait_event(agent: &Agent, what: &str, f: impl Fn(&Event) -> bool) -> Event {
    let end = Instant::now() + DEADLINE;
    loop {
        agent.poll(Nanos::ZERO).unwrap();
        agent.check_invariants().unwrap();
        if let Some(e) = agent.drain_events().into_iter().find(|e| f(e)) {
            return e;
        }
        assert!(Instant::now() < end, "no {what} within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Polls `agent` until it has taken `n` more MADs than `before` from QP1.
fn wait_received(agent: &Agent, before: u64, n: u64) {
    let end = Instant::now() + DEADLINE;
    while agent.stats().mads_received < before + n {
        agent.poll(Nanos::ZERO).unwrap();
        assert!(
            Instant::now() < end,
            "the MAD did not arrive: {:?}",
            agent.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A socket that sends CM MADs to QP1 as RoCEv2 UD SEND-only packets.
struct Sender(UdpSocket);

impl Sender {
    fn bind(ip: &str) -> Sender {
        Sender(UdpSocket::bind((ip, 0)).unwrap())
    }

    fn send(&self, to: &Agent, mad: &CmMad) {
        let target = to.device().local_addr(1).unwrap();
        let endpoints = Endpoints::new(self.0.local_addr().unwrap(), target).unwrap();
        let mut headers = Headers::new(Bth::new(Opcode::UdSendOnly, 1, 0));
        headers.deth = Some(Deth {
            qkey: GSI_QKEY,
            src_qp: 1,
        });
        let bytes = Packet::new(headers, &mad.encode().unwrap())
            .encode(&endpoints)
            .unwrap();
        self.0.send_to(&bytes, target).unwrap();
    }
}

/// `mad` from the stranger to `victim` changes nothing about `conn`: same
/// state, no event, nothing sent for it (`answered`: one stateless answer
/// to the stranger, as an unknown id gets), counted.
fn assert_ignored(w: &World, victim: Side, conn: ConnId, mad: &CmMad, answered: bool) {
    let agent = w.agent(victim);
    let (state, before) = (agent.state(conn), agent.stats());
    Sender::bind(STRANGER_IP).send(agent, mad);
    wait_received(agent, before.mads_received, 1);
    let after = agent.stats();
    let kind = mad.message_kind();
    assert_eq!(agent.state(conn), state, "{kind} from the stranger");
    assert_eq!(agent.drain_events(), vec![], "{kind} from the stranger");
    assert_eq!(
        after.not_from_peer,
        before.not_from_peer + 1,
        "{kind} not counted"
    );
    assert_eq!(
        after.mads_sent,
        before.mads_sent + u64::from(answered),
        "{kind} from the stranger drew MADs"
    );
}

/// The same `mad` from the peer's IP (a socket of its own, another UDP
/// port) is acted on: `conn` ends in `state` with an event `f` takes.
fn assert_acted_on(
    w: &World,
    victim: Side,
    conn: ConnId,
    mad: &CmMad,
    state: State,
    f: impl Fn(&Event) -> bool,
) {
    let (agent, peer_ip) = match victim {
        Side::A => (&w.a, B_IP),
        Side::B => (&w.b, A_IP),
    };
    Sender::bind(peer_ip).send(agent, mad);
    let kind = mad.message_kind();
    wait_event(agent, kind, f);
    assert_eq!(agent.state(conn), Some(state), "{kind} from the peer's IP");
}

fn dreq(from: ConnId, to: ConnId, to_qpn: u32) -> CmMad {
    CmMad::new(
        0x77,
        Dreq {
            local_comm_id: from.comm_id(),
            remote_comm_id: to.comm_id(),
            remote_qpn_eecn: to_qpn,
            ..Dreq::default()
        },
    )
}

fn rej(from: ConnId, to: ConnId, message: MessageRejected) -> CmMad {
    CmMad::new(
        0x77,
        Rej {
            local_comm_id: from.comm_id(),
            remote_comm_id: to.comm_id(),
            message_rejected: message,
            reason: RejectReason::ConsumerReject,
            ..Rej::default()
        },
    )
}

#[test]
fn a_strangers_dreq_leaves_an_established_connection_either_side() {
    let mut w = World::new();
    let c = w.established();
    let to_b = dreq(c.a, c.b, c.qpn_b);
    assert_ignored(&w, Side::B, c.b, &to_b, true);
    let to_a = dreq(c.b, c.a, c.qpn_a);
    assert_ignored(&w, Side::A, c.a, &to_a, true);
    assert_eq!(
        (w.a.state(c.a), w.b.state(c.b)),
        (Some(State::Established), Some(State::Established))
    );
    assert_acted_on(
        &w,
        Side::B,
        c.b,
        &to_b,
        State::DreqRcvd,
        |e| matches!(e, Event::DisconnectRequest { conn, .. } if *conn == c.b),
    );
    let c = w.established();
    assert_acted_on(
        &w,
        Side::A,
        c.a,
        &dreq(c.b, c.a, c.qpn_a),
        State::DreqRcvd,
        |e| matches!(e, Event::DisconnectRequest { conn, .. } if *conn == c.a),
    );
}

#[test]
fn a_strangers_rej_leaves_a_connection_in_setup() {
    let mut w = World::new();
    // A in REQ_SENT: B's REJ of the REQ.
    let c = w.request();
    let to_a = rej(c.b, c.a, MessageRejected::Req);
    assert_ignored(&w, Side::A, c.a, &to_a, false);
    assert_eq!(w.a.state(c.a), Some(State::ReqSent));
    // B in REP_SENT: A's REJ of the REP.
    let d = w.replied();
    let to_b = rej(d.a, d.b, MessageRejected::Rep);
    assert_ignored(&w, Side::B, d.b, &to_b, false);
    assert_eq!(w.b.state(d.b), Some(State::RepSent));
    assert_acted_on(
        &w,
        Side::A,
        c.a,
        &to_a,
        State::Timewait,
        |e| matches!(e, Event::Rejected { conn, .. } if *conn == c.a),
    );
    assert_acted_on(
        &w,
        Side::B,
        d.b,
        &to_b,
        State::Timewait,
        |e| matches!(e, Event::Rejected { conn, .. } if *conn == d.b),
    );
}

#[test]
fn a_strangers_rep_and_mra_leave_a_req_sent() {
    let mut w = World::new();
    let c = w.request();
    let mra = CmMad::new(
        0x77,
        Mra {
            local_comm_id: c.b.comm_id(),
            remote_comm_id: c.a.comm_id(),
            message_mraed: MessageMraed::Req,
            service_timeout: 20,
            ..Mra::default()
        },
    );
    assert_ignored(&w, Side::A, c.a, &mra, false);
    let rep = CmMad::new(
        0x77,
        Rep {
            local_comm_id: c.b.comm_id(),
            remote_comm_id: c.a.comm_id(),
            local_ca_guid: 0xb0,
            local_qpn: c.qpn_b,
            starting_psn: 0x200,
            rnr_retry_count: 7,
            ..Rep::default()
        },
    );
    // A REP for no connection of the sender's is answered (REJ "invalid
    // comm ID", to the stranger), as any REP for an unknown id is.
    assert_ignored(&w, Side::A, c.a, &rep, true);
    assert_eq!(w.a.state(c.a), Some(State::ReqSent));
    assert_acted_on(
        &w,
        Side::A,
        c.a,
        &mra,
        State::MraReqRcvd,
        |e| matches!(e, Event::MraReceived { conn, .. } if *conn == c.a),
    );
    assert_acted_on(
        &w,
        Side::A,
        c.a,
        &rep,
        State::RepRcvd,
        |e| matches!(e, Event::ReplyReceived { conn, .. } if *conn == c.a),
    );
}

#[test]
fn a_strangers_rtu_leaves_a_rep_sent() {
    let mut w = World::new();
    let c = w.replied();
    let rtu = CmMad::new(
        0x77,
        Rtu {
            local_comm_id: c.a.comm_id(),
            remote_comm_id: c.b.comm_id(),
            ..Rtu::default()
        },
    );
    assert_ignored(&w, Side::B, c.b, &rtu, false);
    assert_eq!(w.b.state(c.b), Some(State::RepSent));
    assert_acted_on(&w, Side::B, c.b, &rtu, State::Established, |e| {
        *e == Event::Established { conn: c.b }
    });
}

#[test]
fn a_strangers_drep_leaves_a_dreq_sent() {
    let mut w = World::new();
    let c = w.established();
    w.a.disconnect(c.a, &[]).unwrap();
    wait_event(
        &w.b,
        "the DREQ",
        |e| matches!(e, Event::DisconnectRequest { conn, .. } if *conn == c.b),
    );
    let drep = CmMad::new(
        0x77,
        Drep {
            local_comm_id: c.b.comm_id(),
            remote_comm_id: c.a.comm_id(),
            ..Drep::default()
        },
    );
    assert_ignored(&w, Side::A, c.a, &drep, false);
    assert_eq!(w.a.state(c.a), Some(State::DreqSent));
    assert_acted_on(
        &w,
        Side::A,
        c.a,
        &drep,
        State::Timewait,
        |e| matches!(e, Event::Disconnected { conn, .. } if *conn == c.a),
    );
}

/// On RoCE a LAP is answered with APR "unsupported" and the connection
/// stays as it is; a stranger's LAP draws no APR (which would carry the
/// connection's comm ids) and is counted.
#[test]
fn a_strangers_lap_draws_no_apr() {
    let mut w = World::new();
    let c = w.established();
    let lap = CmMad::new(
        0x77,
        Lap {
            local_comm_id: c.a.comm_id(),
            remote_comm_id: c.b.comm_id(),
            remote_qpn_eecn: c.qpn_b,
            ..Lap::default()
        },
    );
    assert_ignored(&w, Side::B, c.b, &lap, false);
    let (sent, received) = (w.b.stats().mads_sent, w.b.stats().mads_received);
    let a_received = w.a.stats().mads_received;
    Sender::bind(A_IP).send(&w.b, &lap);
    wait_received(&w.b, received, 1);
    assert_eq!(
        w.b.stats().mads_sent,
        sent + 1,
        "the peer's LAP got its APR"
    );
    assert_eq!(w.b.state(c.b), Some(State::Established));
    // The APR went to A, the peer (which has no LAP outstanding and
    // ignores it), not to the socket the LAP came from.
    wait_received(&w.a, a_received, 1);
    assert_eq!(w.b.stats().not_from_peer, 1);
}
