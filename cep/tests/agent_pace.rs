//! The request window through two poll-mode CM agents on the soft fabric
//! (`docs/cm-agent.md`, "Bursts"): 20,000 connections disconnected at once
//! send exactly 20,000 DREQs, none is retried and QP1 drops nothing for
//! lack of a receive buffer. The control without a window (as before)
//! shows what the test catches: the soft fabric delivers every MAD into
//! the peer's QP1 inside `post_send`, so a burst beyond its 4096 receive
//! buffers is dropped unseen and the DREQs are sent again at their
//! response timeout, into a full queue again.

#[path = "agent_common.rs"]
mod common;

use cep::agent::AgentConfig;
use cep::proto::{ConnId, Event, IdKey, Nanos, State, DEFAULT_REQUEST_WINDOW};
use common::*;
use soft_provider::Fabric;

const CONNECTIONS: u32 = 20_000;
/// Connected this many at a time (below the 4096 receive buffers), so the
/// connects do not overflow QP1 in the control either.
const BATCH: u32 = 2_000;

/// Polls both agents at `now`, answering what the tests need (accept, RTU,
/// DREP), until a round receives nothing and brings no event. (The callers
/// check the endpoints' invariants once a phase: each check visits every
/// CEP, 40,000 here.)
fn settle(now: Nanos, a: &Agent, b: &Agent) {
    for _ in 0..10_000 {
        let received = a.poll(now).unwrap().received + b.poll(now).unwrap().received;
        let (ea, eb) = (a.drain_events(), b.drain_events());
        if received == 0 && ea.is_empty() && eb.is_empty() {
            return;
        }
        for e in &ea {
            if let Event::ReplyReceived { conn, .. } = e {
                a.send_rtu(*conn, &[]).unwrap();
            }
        }
        for e in &eb {
            match e {
                Event::ConnectRequest { conn, req, .. } => {
                    b.accept(*conn, rep_for(req.local_qpn + 0x10_0000)).unwrap()
                }
                Event::DisconnectRequest { conn, .. } => b.disconnect_reply(*conn, &[]).unwrap(),
                _ => {}
            }
        }
    }
    panic!("the agents did not settle");
}

fn check(a: &Agent, b: &Agent) {
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

/// Two agents with the given window and `CONNECTIONS` established
/// connections from A to B.
fn established(window: u32) -> (Fabric, Agent, Agent, Vec<ConnId>) {
    let config = |guid| AgentConfig {
        id_key: Some(IdKey::fixed(guid, 0x1d)),
        request_window: window,
        ..AgentConfig::default()
    };
    let (f, a, b) = pair_with(config(GUID_A), config(GUID_B));
    b.listen(SVC).unwrap();
    let mut conns = Vec::new();
    for batch in 0..CONNECTIONS / BATCH {
        for i in 0..BATCH {
            let qpn = 0x100 + batch * BATCH + i;
            conns.push(a.connect(connect_params(&a, &b, SVC, qpn)).unwrap());
        }
        settle(Nanos(0), &a, &b);
    }
    check(&a, &b);
    for &c in &conns {
        assert_eq!(a.state(c), Some(State::Established));
    }
    assert_eq!(f.stats().dropped_no_recv, 0, "the connects overflowed QP1");
    (f, a, b, conns)
}

#[test]
fn twenty_thousand_disconnects_at_once_send_each_dreq_once() {
    let (f, a, b, conns) = established(DEFAULT_REQUEST_WINDOW);
    let (a0, b0) = (a.stats(), b.stats());
    for &c in &conns {
        a.disconnect(c, &[]).unwrap();
        assert_eq!(a.state(c), Some(State::DreqSent));
    }
    let s = a.stats();
    assert_eq!(
        s.mads_sent - a0.mads_sent,
        u64::from(DEFAULT_REQUEST_WINDOW)
    );
    assert_eq!(s.requests_in_flight, DEFAULT_REQUEST_WINDOW);
    check(&a, &b);
    settle(Nanos(0), &a, &b);
    check(&a, &b);
    let (a1, b1) = (a.stats(), b.stats());
    eprintln!(
        "window {DEFAULT_REQUEST_WINDOW}: A sent {} DREQs, B sent {} DREPs, \
         {} requests waited for the window, fabric {:?}",
        a1.mads_sent - a0.mads_sent,
        b1.mads_sent - b0.mads_sent,
        a1.requests_queued - a0.requests_queued,
        f.stats()
    );
    assert_eq!(f.stats().dropped_no_recv, 0, "QP1 dropped MADs");
    assert_eq!(a1.mads_sent - a0.mads_sent, u64::from(CONNECTIONS));
    assert_eq!(b1.mads_sent - b0.mads_sent, u64::from(CONNECTIONS));
    assert_eq!(a1.resends, a0.resends, "nothing was sent again");
    assert_eq!(
        a1.requests_queued - a0.requests_queued,
        u64::from(CONNECTIONS - DEFAULT_REQUEST_WINDOW)
    );
    assert_eq!((a1.requests_waiting, a1.requests_in_flight), (0, 0));
    for &c in &conns {
        assert_eq!(a.state(c), Some(State::Timewait));
    }
    // Past every TIMEWAIT: nothing is left but B's listener.
    settle(Nanos(1_000 * MS), &a, &b);
    check(&a, &b);
    assert_eq!(a.stats().allocated_ids, 0);
    assert_eq!(b.stats().allocated_ids, 1);
    assert_eq!(
        a.stats().mads_sent,
        a1.mads_sent,
        "no retry after the DREPs"
    );
}

/// The control: with no window (`u32::MAX`) the same burst overflows B's
/// 4096 receive buffers, and the DREQs lost are sent again.
#[test]
fn without_a_window_the_burst_overflows_qp1() {
    let t = std::time::Instant::now();
    let (f, a, b, conns) = established(u32::MAX);
    eprintln!("established {:?}", t.elapsed());
    let a0 = a.stats();
    for &c in &conns {
        a.disconnect(c, &[]).unwrap();
    }
    eprintln!("disconnected {:?}", t.elapsed());
    let dropped = f.stats().dropped_no_recv;
    assert_eq!(dropped, u64::from(CONNECTIONS) - 4096, "{:?}", f.stats());
    // Run the retries out: each response wait (25 ms) resends what was
    // lost; after four sends the rest time out.
    let mut now = Nanos(0);
    for _ in 0..40 {
        settle(now, &a, &b);
        now = now.saturating_add(5 * MS);
    }
    check(&a, &b);
    eprintln!("settled {:?}", t.elapsed());
    let a1 = a.stats();
    eprintln!(
        "no window: A sent {} DREQs ({} resent), fabric {:?}",
        a1.mads_sent - a0.mads_sent,
        a1.resends.other - a0.resends.other,
        f.stats()
    );
    assert!(a1.resends.other > a0.resends.other);
    assert!(a1.mads_sent - a0.mads_sent > u64::from(CONNECTIONS));
}
