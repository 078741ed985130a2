//! Service ID resolution: SIDR_REQ and SIDR_REP.

use super::*;

// ---------------------------------------------------------------------------
// SIDR
// ---------------------------------------------------------------------------

#[test]
fn sidr_request_reply() {
    let mut sim = Sim::new(1);
    let l = sim.eps[1].listen(SVC).unwrap();
    let s = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    assert_eq!(sim.eps[0].state(s), Some(State::SidrReqSent));
    sim.pump(&mut auto);
    let evs = sim.events(0, s);
    match evs.as_slice() {
        [Event::SidrReply { rep, .. }, Event::Released { .. }] => {
            assert_eq!(rep.status, SidrStatus::Success);
            assert_eq!(rep.qpn, 0x77);
            assert_eq!(rep.qkey, 0x1234);
            assert_eq!(rep.service_id, SVC);
        }
        e => panic!("unexpected {e:?}"),
    }
    assert!(sim.log.iter().any(|(_, side, e)| *side == 1
        && matches!(e, Event::SidrRequest { listener, req, .. }
            if *listener == l && &req.private_data[..3] == b"who")));
    assert_eq!(sim.eps[0].allocated_ids(), 0);
    assert_eq!(sim.eps[1].live_connections(), 0);
    sim.finish();
}

#[test]
fn sidr_without_listener() {
    let mut sim = Sim::new(1);
    let s = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    sim.pump(&mut auto);
    assert!(matches!(
        sim.events(0, s).first(),
        Some(Event::SidrReply { rep, .. }) if rep.status == SidrStatus::ServiceIdNotSupported
    ));
    sim.finish();
}

#[test]
fn sidr_timeout() {
    let mut sim = Sim::new(1);
    sim.drop_rule = Some(Box::new(|to, _| to == 1));
    let start = sim.now;
    let s = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    sim.run(&mut auto);
    assert_eq!(sim.sent_kinds(0), ["SIDR_REQ"; 3]);
    let (t, _, _) = sim
        .log
        .iter()
        .find(|(_, _, e)| matches!(e, Event::Timeout { .. }))
        .unwrap();
    assert_eq!(t.0, start.0 + 3 * wait());
    assert!(matches!(
        sim.events(0, s).as_slice(),
        [
            Event::Timeout {
                message: TimedOut::SidrReq,
                ..
            },
            Event::Released { .. }
        ]
    ));
    sim.finish();
}

#[test]
fn duplicate_sidr_req_is_ignored_while_pending() {
    let mut ep = Endpoint::new(config(1));
    ep.listen(SVC).unwrap();
    let req = wire::SidrReq {
        request_id: 5,
        service_id: SVC,
        ..wire::SidrReq::default()
    };
    let mad = CmMad::new(1, req);
    assert_eq!(ep.handle_mad(Nanos(1), addr(0), mad), Disposition::Handled);
    assert!(matches!(
        ep.handle_mad(Nanos(2), addr(0), mad),
        Disposition::Ignored(_)
    ));
    assert_eq!(ep.live_connections(), 1);
    ep.check_invariants().unwrap();
}
