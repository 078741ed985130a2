//! The request window (`endpoint/pacing.rs`, `docs/cm-protocol.md`,
//! "Bursts"): a burst of disconnects or connects puts at most the window's
//! requests on the wire at once, the rest wait in order and go out as
//! answers come, each exactly once; a waiting request that ends (the CEP
//! destroyed, a DREQ from the peer, a DREQ replacing a LAP) leaves the line
//! unsent, and one that times out gives up its place.

use std::collections::BTreeSet;

use super::*;

/// A pair whose endpoints keep at most `window` requests on the wire.
fn paced(seed: u64, window: u32) -> Sim {
    let mut sim = Sim::new(seed);
    for (i, ep) in sim.eps.iter_mut().enumerate() {
        *ep = Endpoint::new(EndpointConfig {
            request_window: window,
            ..config(i)
        });
    }
    sim
}

/// MADs of `kind` side `from` has sent.
fn sent(sim: &Sim, from: usize, kind: &str) -> Vec<CmMad> {
    sim.sent
        .iter()
        .filter(|(_, s, m)| *s == from && m.message_kind() == kind)
        .map(|(_, _, m)| *m)
        .collect()
}

/// The local comm id a request names.
fn sender_id(mad: &CmMad) -> u32 {
    match mad.message {
        CmMessage::Req(m) => m.local_comm_id,
        CmMessage::Dreq(m) => m.local_comm_id,
        CmMessage::Lap(m) => m.local_comm_id,
        _ => panic!("not a request: {mad:?}"),
    }
}

/// Delivers every MAD (and the answers they bring) without firing timers,
/// answering events with `auto`, and after each delivery checks that side
/// 0 has at most `window` requests of `request` unanswered on the wire:
/// those it sent minus the `answers` that reached it. The endpoints'
/// invariants are checked every few hundred deliveries (each check visits
/// every CEP).
fn deliver_counting(sim: &mut Sim, window: usize, request: &str, answers: &[&str]) -> usize {
    let (mut answered, mut requests, mut seen) = (0, 0, 0);
    let mut most = 0;
    let mut n = 0u64;
    loop {
        for i in 0..2 {
            while let Some(ev) = sim.eps[i].poll_event() {
                auto(i, &mut sim.eps[i], sim.now, &ev);
                sim.log.push((sim.now, i, ev));
            }
        }
        sim.flush();
        let new = &sim.sent[seen..];
        requests += count(new, |(_, s, m)| *s == 0 && m.message_kind() == request);
        seen = sim.sent.len();
        let outstanding = requests - answered;
        assert!(
            outstanding <= window,
            "{outstanding} {request}s on the wire"
        );
        most = most.max(outstanding);
        let Some(i) = sim.next_flight() else { break };
        let f = &sim.net[i];
        if f.to == 0 && answers.contains(&f.mad.message_kind()) {
            answered += 1;
        }
        sim.deliver(i);
        n += 1;
        if n % 500 == 0 {
            sim.check();
        }
    }
    sim.check();
    most
}

/// 5,000 connections with a window of 64: the connects, then the
/// disconnects of all at once, each keep exactly 64 requests on the wire
/// until answers come; every REQ and DREQ goes out exactly once, nothing is
/// retried, and every connection ends in TIMEWAIT, then released.
#[test]
fn a_burst_of_disconnects_keeps_the_window() {
    const N: u32 = 5_000;
    const W: usize = 64;
    let mut sim = paced(1, W as u32);
    sim.eps[1].listen(SVC).unwrap();
    let mut conns = Vec::new();
    for i in 0..N {
        let c = sim.eps[0]
            .connect(sim.now, connect_params(1, SVC, 0x1000 + i))
            .unwrap();
        // The state moves at once; only the transmission waits.
        assert_eq!(sim.eps[0].state(c), Some(State::ReqSent));
        conns.push(c);
    }
    assert_eq!(sim.eps[0].requests_in_flight(), W as u32);
    assert_eq!(sim.eps[0].requests_waiting(), N as usize - W);
    assert_eq!(sim.eps[0].requests_queued(), u64::from(N) - W as u64);
    sim.check();
    let most = deliver_counting(&mut sim, W, "REQ", &["REP", "REJ"]);
    assert_eq!(most, W, "the window was used in full");
    for &c in &conns {
        assert_eq!(sim.eps[0].state(c), Some(State::Established));
    }
    let reqs = sent(&sim, 0, "REQ");
    let distinct: BTreeSet<u32> = reqs.iter().map(sender_id).collect();
    assert_eq!((reqs.len(), distinct.len()), (N as usize, N as usize));

    // Disconnect every connection at once.
    for &c in &conns {
        sim.eps[0].disconnect(sim.now, c, &[]).unwrap();
        assert_eq!(sim.eps[0].state(c), Some(State::DreqSent));
    }
    sim.flush();
    assert_eq!(sent(&sim, 0, "DREQ").len(), W, "only the window goes out");
    assert_eq!(sim.eps[0].requests_waiting(), N as usize - W);
    let most = deliver_counting(&mut sim, W, "DREQ", &["DREP"]);
    assert_eq!(most, W);
    let dreqs = sent(&sim, 0, "DREQ");
    let distinct: BTreeSet<u32> = dreqs.iter().map(sender_id).collect();
    assert_eq!((dreqs.len(), distinct.len()), (N as usize, N as usize));
    // In the order they were made.
    let order: Vec<u32> = dreqs.iter().map(sender_id).collect();
    let made: Vec<u32> = conns.iter().map(|c| c.0).collect();
    assert_eq!(order, made);
    assert_eq!(sent(&sim, 1, "DREP").len(), N as usize);
    for &c in &conns {
        assert_eq!(sim.eps[0].state(c), Some(State::Timewait));
    }
    let by_drep = count(&sim.log, |(_, s, e)| {
        *s == 0
            && matches!(
                e,
                Event::Disconnected {
                    cause: DisconnectCause::DrepReceived,
                    ..
                }
            )
    });
    assert_eq!(by_drep, N as usize);
    assert_eq!(sim.eps[0].resends(), Resends::default(), "nothing resent");
    assert_eq!(sim.eps[0].requests_queued(), 2 * (u64::from(N) - W as u64));
    assert_eq!(
        (
            sim.eps[0].requests_in_flight(),
            sim.eps[0].requests_waiting()
        ),
        (0, 0)
    );
    // Past every TIMEWAIT at once (a step per expiry would check the
    // invariants of thousands of CEPs thousands of times).
    sim.now = sim.now.saturating_add(1_000_000_000);
    for ep in &mut sim.eps {
        ep.handle_timeout(sim.now);
    }
    sim.finish();
}

/// Without a window (as before) the same burst puts every DREQ on the wire
/// at once: the control that shows the test above measures the window.
#[test]
fn an_unbounded_window_sends_the_whole_burst_at_once() {
    let mut sim = paced(2, u32::MAX);
    sim.eps[1].listen(SVC).unwrap();
    let conns: Vec<ConnId> = (0..300)
        .map(|i| {
            sim.eps[0]
                .connect(sim.now, connect_params(1, SVC, 0x1000 + i))
                .unwrap()
        })
        .collect();
    sim.flush();
    assert_eq!(sent(&sim, 0, "REQ").len(), 300);
    assert_eq!(sim.eps[0].requests_queued(), 0);
    sim.pump(&mut auto);
    for &c in &conns {
        sim.eps[0].disconnect(sim.now, c, &[]).unwrap();
    }
    sim.flush();
    assert_eq!(sent(&sim, 0, "DREQ").len(), 300);
    sim.run(&mut lenient);
    sim.finish();
}

/// The peer's DREQ for a connection whose own DREQ still waits: handled as
/// DREQ_SENT + DREQ received (DREP, TIMEWAIT, `SimultaneousDreq`); the
/// waiting DREQ leaves the line and is never sent.
#[test]
fn a_dreq_from_the_peer_ends_a_waiting_dreq_unsent() {
    let mut sim = paced(3, 1);
    sim.eps[1].listen(SVC).unwrap();
    let a1 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let a2 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x12))
        .unwrap();
    sim.pump(&mut auto);
    let b2 = sim
        .log
        .iter()
        .filter_map(|(_, s, e)| match e {
            Event::ConnectRequest { conn, .. } if *s == 1 => Some(*conn),
            _ => None,
        })
        .nth(1)
        .unwrap();
    sim.eps[0].disconnect(sim.now, a1, &[]).unwrap();
    sim.eps[0].disconnect(sim.now, a2, &[]).unwrap();
    assert_eq!(sim.eps[0].requests_waiting(), 1);
    // B disconnects the second connection too; its DREQ reaches A while
    // A's own DREQ for it still waits behind the first.
    sim.eps[1].disconnect(sim.now, b2, &[]).unwrap();
    sim.check();
    sim.pump(&mut auto);
    let simultaneous = sim.events(0, a2);
    assert!(
        simultaneous.iter().any(|e| matches!(
            e,
            Event::Disconnected {
                cause: DisconnectCause::SimultaneousDreq,
                ..
            }
        )),
        "{simultaneous:?}"
    );
    let dreqs: Vec<u32> = sent(&sim, 0, "DREQ").iter().map(sender_id).collect();
    assert_eq!(dreqs, vec![a1.0], "A's DREQ for the second never went out");
    // B's DREQ got its DREP; both connections end in TIMEWAIT on both sides.
    assert!(sim.events(1, b2).iter().any(|e| matches!(
        e,
        Event::Disconnected {
            cause: DisconnectCause::DrepReceived,
            ..
        }
    )));
    for (side, c) in [(0, a1), (0, a2), (1, b2)] {
        assert_eq!(sim.eps[side].state(c), Some(State::Timewait), "{c}");
    }
    assert_eq!(sim.eps[0].resends(), Resends::default());
    sim.run(&mut lenient);
    sim.finish();
}

/// Destroying CEPs whose requests wait: a waiting REQ was never on the
/// wire, so it is freed at once with no REJ (nobody knows its id); a
/// waiting DREQ has told the peer nothing, so it goes out once, as from
/// ESTABLISHED. The others keep their order and each is sent once.
#[test]
fn destroying_waiting_requests() {
    let mut sim = paced(4, 2);
    sim.eps[1].listen(SVC).unwrap();
    let a: Vec<ConnId> = (0..5)
        .map(|i| {
            sim.eps[0]
                .connect(sim.now, connect_params(1, SVC, 0x100 + i))
                .unwrap()
        })
        .collect();
    sim.flush();
    assert_eq!(sent(&sim, 0, "REQ").len(), 2);
    // The fourth waits: destroyed, it is released at once, with no REJ.
    sim.eps[0].destroy(sim.now, a[3]).unwrap();
    assert_eq!(sim.eps[0].state(a[3]), None);
    assert!(matches!(
        sim.eps[0].poll_event(),
        Some(Event::Released { conn }) if conn == a[3]
    ));
    // The first is on the wire: REJ(Timeout) and TIMEWAIT as before, and
    // its place goes to the third.
    sim.eps[0].destroy(sim.now, a[0]).unwrap();
    sim.flush();
    assert_eq!(sent(&sim, 0, "REJ").len(), 1);
    let reqs: Vec<u32> = sent(&sim, 0, "REQ").iter().map(sender_id).collect();
    assert_eq!(reqs, vec![a[0].0, a[1].0, a[2].0]);
    sim.check();
    sim.pump(&mut auto);
    let reqs: Vec<u32> = sent(&sim, 0, "REQ").iter().map(sender_id).collect();
    assert_eq!(reqs, vec![a[0].0, a[1].0, a[2].0, a[4].0]);
    for c in [a[1], a[2], a[4]] {
        assert_eq!(sim.eps[0].state(c), Some(State::Established), "{c}");
    }

    // Now three disconnects with a window of 2: the third waits, and
    // destroyed it sends its DREQ once and enters TIMEWAIT.
    for c in [a[1], a[2], a[4]] {
        sim.eps[0].disconnect(sim.now, c, &[]).unwrap();
    }
    sim.flush();
    assert_eq!(sent(&sim, 0, "DREQ").len(), 2);
    sim.eps[0].destroy(sim.now, a[4]).unwrap();
    assert_eq!(sim.eps[0].state(a[4]), Some(State::Timewait));
    sim.flush();
    let dreqs: Vec<u32> = sent(&sim, 0, "DREQ").iter().map(sender_id).collect();
    assert_eq!(dreqs, vec![a[1].0, a[2].0, a[4].0]);
    sim.check();
    sim.pump(&mut auto);
    assert_eq!(sent(&sim, 0, "DREQ").len(), 3, "each DREQ once");
    sim.run(&mut lenient);
    sim.finish();
}

/// A LAP waiting for the window, replaced by a DREQ (`disconnect`), leaves
/// the line unsent; the DREQ waits in its turn.
#[test]
fn a_dreq_replaces_a_waiting_lap() {
    let mut sim = paced(5, 1);
    sim.eps[1].listen(SVC).unwrap();
    let a1 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let a2 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x12))
        .unwrap();
    sim.pump(&mut auto);
    sim.eps[0].disconnect(sim.now, a1, &[]).unwrap();
    sim.eps[0].lap(sim.now, a2, alt_path()).unwrap();
    assert_eq!(sim.eps[0].state(a2), Some(State::LapSent));
    sim.eps[0].disconnect(sim.now, a2, &[]).unwrap();
    assert_eq!(sim.eps[0].requests_waiting(), 1);
    sim.check();
    sim.pump(&mut auto);
    assert!(sent(&sim, 0, "LAP").is_empty(), "the LAP never went out");
    let dreqs: Vec<u32> = sent(&sim, 0, "DREQ").iter().map(sender_id).collect();
    assert_eq!(dreqs, vec![a1.0, a2.0]);
    sim.run(&mut lenient);
    sim.finish();
}

/// A request that runs out of retries gives up its place: with a window
/// of 1 and a peer that never answers, the second REQ goes out only when
/// the first has timed out.
#[test]
fn a_timed_out_request_gives_up_its_place() {
    let mut sim = paced(6, 1);
    sim.drop_rule = Some(Box::new(|to, _| to == 1));
    let a1 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let a2 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x12))
        .unwrap();
    sim.run(&mut lenient);
    let times = |id: ConnId| -> Vec<Nanos> {
        sim.sent
            .iter()
            .filter(|(_, s, m)| *s == 0 && m.message_kind() == "REQ" && sender_id(m) == id.0)
            .map(|(t, _, _)| *t)
            .collect()
    };
    let (first, second) = (times(a1), times(a2));
    assert_eq!(first.len(), 1 + usize::from(RETRIES));
    assert_eq!(second.len(), 1 + usize::from(RETRIES));
    assert!(
        second[0] >= first[first.len() - 1].saturating_add(wait()),
        "the second REQ went out at {} before the first timed out",
        second[0]
    );
    for c in [a1, a2] {
        assert!(sim.events(0, c).iter().any(|e| matches!(
            e,
            Event::Timeout {
                message: TimedOut::Req,
                ..
            }
        )));
    }
    sim.finish();
}
