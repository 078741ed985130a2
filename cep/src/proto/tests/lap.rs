//! Alternate paths: LAP and APR, and the RoCE port that refuses them.

use super::*;

// ---------------------------------------------------------------------------
// LAP / APR
// ---------------------------------------------------------------------------

#[test]
fn lap_apr() {
    let (mut sim, a, b) = connected();
    sim.eps[0].lap(sim.now, a, alt_path()).unwrap();
    assert_eq!(sim.eps[0].state(a), Some(State::LapSent));
    sim.pump(&mut noop);
    assert_eq!(sim.eps[1].state(b), Some(State::LapRcvd));
    match sim.events(1, b).last().unwrap() {
        Event::LapReceived { lap, .. } => {
            assert_eq!(lap.alternate_path.local_lid, 7);
            assert_eq!(lap.remote_qpn_eecn, 0x8011);
        }
        e => panic!("unexpected {e:?}"),
    }
    sim.eps[1].send_mra(sim.now, b, 20, &[]).unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[0].state(a), Some(State::MraLapRcvd));
    sim.run_until(sim.now.saturating_add(10 * wait()), &mut noop);
    assert_eq!(count(&sim.sent_kinds(0), |k| *k == "LAP"), 1);
    sim.eps[1].apr(b, ApStatus::Success, &[1], b"ok").unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    match sim.events(0, a).last().unwrap() {
        Event::AprReceived { status, apr, .. } => {
            assert_eq!(*status, ApStatus::Success);
            assert_eq!(apr.additional_info_bytes(), &[1]);
        }
        e => panic!("unexpected {e:?}"),
    }
    // A duplicate of the answered LAP gets the APR again.
    let lap = sim
        .sent
        .iter()
        .find(|(_, _, m)| m.message_kind() == "LAP")
        .unwrap()
        .2;
    assert_eq!(
        sim.eps[1].handle_mad(sim.now, addr(0), lap),
        Disposition::Answered
    );
    assert_eq!(
        sim.eps[1].poll_transmit().unwrap().mad.message_kind(),
        "APR"
    );
    sim.finish();
}

#[test]
fn roce_ports_refuse_lap_and_answer_one_with_apr_unsupported() {
    let (mut sim, a, b) = connected();
    let roce = Some(LocalPort {
        lid: 0,
        lmc: 0,
        gid: [7; 16],
    });
    // Our own LAP on a RoCE port: refused before anything is sent.
    sim.eps[0].config_mut().local_port = roce;
    assert!(matches!(
        sim.eps[0].lap(sim.now, a, alt_path()),
        Err(ProtoError::InvalidParam(_))
    ));
    assert_eq!(count(&sim.sent_kinds(0), |k| *k == "LAP"), 0);
    // A peer's LAP to a RoCE port: APR "unsupported", no LapReceived, and
    // the connection stays established on both sides.
    sim.eps[0].config_mut().local_port = None;
    sim.eps[1].config_mut().local_port = roce;
    sim.eps[0].lap(sim.now, a, alt_path()).unwrap();
    sim.pump(&mut noop);
    assert!(!sim
        .events(1, b)
        .iter()
        .any(|e| matches!(e, Event::LapReceived { .. })));
    match sim.events(0, a).last().unwrap() {
        Event::AprReceived { status, .. } => assert_eq!(*status, ApStatus::Unsupported),
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
}

#[test]
fn lap_timeout_keeps_connection() {
    let (mut sim, a, b) = connected();
    sim.drop_rule = Some(Box::new(|_, m| m.message_kind() == "LAP"));
    sim.eps[0].lap(sim.now, a, alt_path()).unwrap();
    sim.run(&mut auto);
    assert_eq!(
        count(&sim.sent_kinds(0), |k| *k == "LAP"),
        1 + RETRIES as usize
    );
    assert!(matches!(
        sim.events(0, a).last(),
        Some(Event::Timeout {
            message: TimedOut::Lap,
            ..
        })
    ));
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    sim.finish();
}
