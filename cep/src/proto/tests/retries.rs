//! Retries, MRA and duplicates: the timers and what a repeated message
//! draws.

use super::*;

// ---------------------------------------------------------------------------
// Retries, MRA, duplicates
// ---------------------------------------------------------------------------

#[test]
fn req_retries_then_timeout() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    sim.drop_rule = Some(Box::new(|to, _| to == 1));
    let start = sim.now;
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    assert_eq!(
        sim.eps[0].next_timeout(),
        Some(start.saturating_add(wait()))
    );
    sim.run(&mut noop);
    assert_eq!(sim.sent_kinds(0), ["REQ", "REQ", "REQ", "REQ", "REJ"]);
    let (t, _, _) = sim
        .log
        .iter()
        .find(|(_, _, e)| matches!(e, Event::Timeout { .. }))
        .unwrap();
    assert_eq!(t.0, start.0 + (1 + RETRIES as u64) * wait());
    match sim.last_sent(0).unwrap().message {
        CmMessage::Rej(r) => {
            assert_eq!(r.reason, RejectReason::Timeout);
            assert_eq!(r.ari_bytes(), &guid(0).to_be_bytes());
        }
        m => panic!("unexpected {m:?}"),
    }
    let evs = sim.events(0, a);
    assert!(matches!(
        evs.as_slice(),
        [
            Event::Timeout {
                message: TimedOut::Req,
                ..
            },
            Event::TimewaitExited { .. },
            Event::Released { .. }
        ]
    ));
    sim.finish();
}

#[test]
fn rep_retries_then_timeout_rejects_active_side() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    // Drop every RTU (so REP retries), then deliver the final REJ.
    sim.drop_rule = Some(Box::new(|_, m| m.message_kind() == "RTU"));
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.run(&mut auto);
    let b = sim.first_conn_request(1);
    assert_eq!(
        count(&sim.sent_kinds(1), |k| *k == "REP"),
        1 + RETRIES as usize
    );
    assert!(sim.events(1, b).iter().any(|e| matches!(
        e,
        Event::Timeout {
            message: TimedOut::Rep,
            ..
        }
    )));
    // A was established, got the REJ(Timeout) and left.
    assert!(sim.events(0, a).iter().any(|e| matches!(
        e,
        Event::Rejected {
            reason: RejectReason::Timeout,
            ..
        }
    )));
    sim.finish();
}

#[test]
fn mra_extends_the_timeout() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    let service_timeout = 20; // ~4.3 s, far beyond the REQ wait
    sim.eps[1]
        .send_mra(sim.now, b, service_timeout, b"wait")
        .unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[0].state(a), Some(State::MraReqRcvd));
    assert!(matches!(
        sim.events(0, a).as_slice(),
        [Event::MraReceived {
            message: wire::MessageMraed::Req,
            service_timeout: 20,
            ..
        }]
    ));
    let deadline = sim.now.saturating_add(mra_wait_nanos(PLT, service_timeout));
    assert_eq!(sim.eps[0].next_timeout(), Some(deadline));
    // Well past the normal REQ retry time: no retry.
    sim.run_until(sim.now.saturating_add(10 * wait()), &mut noop);
    assert_eq!(sim.sent_kinds(0), ["REQ"]);
    sim.eps[1].accept(sim.now, b, rep_for(0x22)).unwrap();
    sim.pump(&mut auto);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    sim.finish();
}

#[test]
fn mra_expiry_resends_req_and_duplicate_req_gets_mra() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    sim.eps[1].send_mra(sim.now, b, 1, &[]).unwrap();
    // Past one MRA wait (plus the trip of the MRA) but before the retries
    // run out.
    let mra_wait = mra_wait_nanos(PLT, 1);
    sim.run_until(sim.now.saturating_add(mra_wait + 3 * LATENCY), &mut noop);
    // The REQ was retried after the MRA wait; B answered with the MRA again.
    let kinds = sim.sent_kinds(1);
    assert!(count(&kinds, |k| *k == "MRA") >= 2, "{kinds:?}");
    assert_eq!(sim.eps[1].live_connections(), 1);
    sim.run(&mut noop);
    assert!(sim.events(0, a).iter().any(|e| matches!(
        e,
        Event::Timeout {
            message: TimedOut::Req,
            ..
        }
    )));
    sim.finish();
}

#[test]
fn duplicate_req_never_makes_a_second_connection() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.flush();
    let req = sim.net[0].mad;
    let now = sim.now;
    let b_ep = &mut sim.eps[1];
    assert_eq!(b_ep.handle_mad(now, addr(0), req), Disposition::Handled);
    // In REQ_RCVD a duplicate REQ (the requester is retrying: the user is
    // slow) gets an MRA covering the request's answer deadline.
    assert_eq!(b_ep.handle_mad(now, addr(0), req), Disposition::Answered);
    let held = b_ep.poll_transmit().unwrap();
    assert_eq!(held.mad.message_kind(), "MRA");
    assert_eq!(b_ep.live_connections(), 1);
    let Some(Event::ConnectRequest { conn: b, .. }) = b_ep.poll_event() else {
        panic!()
    };
    assert_eq!(b_ep.poll_event(), None);
    assert_eq!(b_ep.state(b), Some(State::MraReqSent));
    // The user may still ask for its own time; a duplicate REQ then
    // repeats the user's MRA.
    b_ep.send_mra(now, b, 18, &[]).unwrap();
    let mra = b_ep.poll_transmit().unwrap();
    assert_ne!(mra.mad, held.mad);
    assert_eq!(b_ep.handle_mad(now, addr(0), req), Disposition::Answered);
    assert_eq!(b_ep.poll_transmit().unwrap().mad, mra.mad);
    // In REP_SENT it repeats the REP.
    b_ep.accept(now, b, rep_for(0x22)).unwrap();
    let rep = b_ep.poll_transmit().unwrap();
    assert_eq!(b_ep.handle_mad(now, addr(0), req), Disposition::Answered);
    assert_eq!(b_ep.poll_transmit().unwrap().mad, rep.mad);
    assert_eq!(b_ep.live_connections(), 1);
    b_ep.check_invariants().unwrap();
    sim.net.clear();
    sim.run(&mut auto);
    sim.finish();
}

#[test]
fn duplicate_rep_repeats_rtu() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    sim.eps[1].accept(sim.now, b, rep_for(0x22)).unwrap();
    sim.flush();
    let rep = sim.net[0].mad;
    sim.pump(&mut noop);
    assert_eq!(sim.eps[0].state(a), Some(State::RepRcvd));
    // Duplicate REP while the user decides: ignored.
    assert!(matches!(
        sim.eps[0].handle_mad(sim.now, addr(1), rep),
        Disposition::Ignored(_)
    ));
    sim.eps[0].send_rtu(a, b"go").unwrap();
    let rtu = sim.eps[0].poll_transmit().unwrap();
    assert_eq!(
        sim.eps[0].handle_mad(sim.now, addr(1), rep),
        Disposition::Answered
    );
    assert_eq!(sim.eps[0].poll_transmit().unwrap().mad, rtu.mad);
    sim.eps[1].handle_mad(sim.now, addr(0), rtu.mad);
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    assert_eq!(
        count(&sim.log, |(_, s, e)| *s == 0
            && matches!(e, Event::ReplyReceived { .. })),
        1
    );
    sim.finish();
}

#[test]
fn mra_for_rep() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    sim.eps[1].accept(sim.now, b, rep_for(0x22)).unwrap();
    sim.pump(&mut noop);
    sim.eps[0].send_mra(sim.now, a, 20, &[]).unwrap();
    assert_eq!(sim.eps[0].state(a), Some(State::MraRepSent));
    sim.pump(&mut noop);
    assert_eq!(sim.eps[1].state(b), Some(State::MraRepRcvd));
    sim.run_until(sim.now.saturating_add(10 * wait()), &mut noop);
    assert_eq!(count(&sim.sent_kinds(1), |k| *k == "REP"), 1);
    sim.eps[0].send_rtu(a, &[]).unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    sim.finish();
}

/// An RTU without private data is not kept: a duplicate REP (the passive
/// side missed the RTU) gets one rebuilt from the ids, the same bytes.
#[test]
fn a_plain_rtu_is_rebuilt_for_a_duplicate_rep() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let mut plain = |_: usize, ep: &mut Endpoint, now: Nanos, ev: &Event| match ev {
        Event::ReplyReceived { conn, .. } => ep.send_rtu(*conn, &[]).unwrap(),
        _ => auto(0, ep, now, ev),
    };
    sim.run(&mut plain);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    let rtu = sim.last_sent(0).unwrap();
    assert_eq!(rtu.message_kind(), "RTU");
    let rep = sim
        .sent
        .iter()
        .find(|(_, s, m)| *s == 1 && m.message_kind() == "REP")
        .map(|(_, _, m)| *m)
        .unwrap();
    let now = sim.now;
    assert_eq!(
        sim.eps[0].handle_mad(now, addr(1), rep),
        Disposition::Answered
    );
    let again = sim.eps[0].poll_transmit().unwrap().mad;
    assert_eq!(again.encode().unwrap(), rtu.encode().unwrap());
    sim.finish();
}
