//! A whole connection (REQ, REP, RTU, DREQ, DREP, timewait) and the
//! rejects of a request or reply.

use super::*;

// ---------------------------------------------------------------------------
// Connect / disconnect / timewait
// ---------------------------------------------------------------------------

#[test]
fn full_connect_disconnect_and_timewait() {
    let mut sim = Sim::new(1);
    let listener = sim.eps[1].listen(SVC).unwrap();
    assert_eq!(sim.eps[1].listen(SVC), Err(ProtoError::ServiceIdInUse(SVC)));
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    assert_eq!(sim.eps[0].state(a), Some(State::ReqSent));
    sim.pump(&mut auto);
    let b = sim.first_conn_request(1);
    assert_eq!(sim.sent_kinds(0), ["REQ", "RTU"]);
    assert_eq!(sim.sent_kinds(1), ["REP"]);

    // REQ contents reached the listener; the REP came back with our ids.
    match sim.events(1, b)[0] {
        Event::ConnectRequest {
            listener: l,
            req,
            peer,
            ..
        } => {
            assert_eq!(*l, listener);
            assert_eq!(*peer, addr(0));
            assert_eq!(req.local_comm_id, a.comm_id());
            assert_eq!(req.local_ca_guid, guid(0));
            assert_eq!(req.local_qpn, 0x11);
        }
        e => panic!("unexpected {e:?}"),
    }
    match sim.events(0, a)[0] {
        Event::ReplyReceived { rep, .. } => {
            assert_eq!(rep.local_comm_id, b.comm_id());
            assert_eq!(rep.remote_comm_id, a.comm_id());
            assert_eq!(rep.local_qpn, 0x8011);
        }
        e => panic!("unexpected {e:?}"),
    }
    assert!(matches!(sim.events(0, a)[1], Event::Established { .. }));
    assert!(matches!(sim.events(1, b)[1], Event::Established { .. }));
    // Established states arm no timers.
    assert_eq!(sim.eps[0].next_timeout(), None);
    assert_eq!(sim.eps[1].next_timeout(), None);

    // Disconnect from A.
    sim.eps[0].disconnect(sim.now, a, b"bye").unwrap();
    assert_eq!(sim.eps[0].state(a), Some(State::DreqSent));
    sim.pump(&mut auto);
    assert_eq!(sim.eps[0].state(a), Some(State::Timewait));
    assert_eq!(sim.eps[1].state(b), Some(State::Timewait));
    let drep_at = sim.now;
    match sim.events(1, b)[2] {
        Event::DisconnectRequest { dreq, .. } => {
            assert_eq!(&dreq.private_data[..3], b"bye");
            assert_eq!(dreq.remote_qpn_eecn, 0x8011);
        }
        e => panic!("unexpected {e:?}"),
    }
    match sim.events(0, a)[2] {
        Event::Disconnected { cause, drep, .. } => {
            assert_eq!(*cause, DisconnectCause::DrepReceived);
            assert_eq!(&drep.as_ref().unwrap().private_data[..3], b"bye");
        }
        e => panic!("unexpected {e:?}"),
    }
    // Timewait lasts 2 * PLT + TargetACKDelay.
    assert_eq!(
        sim.eps[0].next_timeout(),
        Some(drep_at.saturating_add(timewait_nanos(PLT, Some(TAD))))
    );
    sim.run(&mut auto);
    let tail: Vec<_> = sim.events(0, a).into_iter().skip(3).cloned().collect();
    assert_eq!(
        tail,
        [
            Event::TimewaitExited { conn: a },
            Event::Released { conn: a }
        ]
    );
    assert_eq!(sim.eps[0].allocated_ids(), 0);
    assert_eq!(sim.eps[1].live_connections(), 0);
    assert_eq!(sim.eps[1].allocated_ids(), 1, "listener remains");
    assert_eq!(
        sim.eps[0].disconnect(sim.now, a, &[]),
        Err(ProtoError::UnknownConn(a))
    );
    sim.finish();
}

#[test]
fn passive_side_disconnects() {
    let (mut sim, a, b) = connected();
    sim.eps[1].disconnect(sim.now, b, &[]).unwrap();
    sim.pump(&mut auto);
    assert!(sim
        .events(0, a)
        .iter()
        .any(|e| matches!(e, Event::DisconnectRequest { .. })));
    assert!(sim.events(1, b).iter().any(|e| matches!(
        e,
        Event::Disconnected {
            cause: DisconnectCause::DrepReceived,
            ..
        }
    )));
    sim.finish();
}

#[test]
fn simultaneous_disconnect() {
    let (mut sim, a, b) = connected();
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    sim.eps[1].disconnect(sim.now, b, &[]).unwrap();
    sim.pump(&mut auto);
    for (side, conn) in [(0, a), (1, b)] {
        assert_eq!(sim.eps[side].state(conn), Some(State::Timewait));
        assert!(sim.events(side, conn).iter().any(|e| matches!(
            e,
            Event::Disconnected {
                cause: DisconnectCause::SimultaneousDreq,
                ..
            }
        )));
    }
    sim.finish();
}

#[test]
fn dreq_retries_then_timeout() {
    let (mut sim, a, _) = connected();
    sim.drop_rule = Some(Box::new(|to, _| to == 1));
    let start = sim.sent.len();
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    sim.run_until(Nanos(u64::MAX / 2), &mut noop);
    let dreqs = count(&sim.sent[start..], |(_, s, m)| {
        *s == 0 && m.message_kind() == "DREQ"
    });
    assert_eq!(dreqs, 1 + RETRIES as usize);
    assert!(sim.events(0, a).iter().any(|e| matches!(
        e,
        Event::Disconnected {
            cause: DisconnectCause::DreqTimeout,
            ..
        }
    )));
    assert_eq!(sim.eps[0].allocated_ids(), 0);
    // B is still established (its peer vanished); finish() disconnects it:
    // A answers the DREQ for the unknown id with a DREP.
    sim.drop_rule = None;
    sim.finish();
}

// ---------------------------------------------------------------------------
// Rejects
// ---------------------------------------------------------------------------

#[test]
fn consumer_reject_with_private_data() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    assert_eq!(
        sim.eps[1].send_rtu(b, &[]),
        Err(ProtoError::WrongState {
            conn: b,
            state: State::ReqRcvd,
            call: "send_rtu"
        })
    );
    assert!(matches!(
        sim.eps[1].reject(sim.now, b, RejectReason::ConsumerReject, &[], &[0; 149]),
        Err(ProtoError::Wire(_))
    ));
    sim.eps[1]
        .reject(sim.now, b, RejectReason::ConsumerReject, &[1, 2], b"nope")
        .unwrap();
    assert_eq!(sim.eps[1].state(b), Some(State::Timewait));
    sim.pump(&mut noop);
    match sim.events(0, a).as_slice() {
        [Event::Rejected {
            reason,
            message,
            origin,
            rej,
            ..
        }] => {
            assert_eq!(*reason, RejectReason::ConsumerReject);
            assert_eq!(*message, wire::MessageRejected::Req);
            assert_eq!(*origin, RejectOrigin::Remote);
            assert_eq!(&rej.private_data[..4], b"nope");
            assert_eq!(rej.ari_bytes(), &[1, 2]);
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(sim.eps[0].state(a), Some(State::Timewait));
    // A duplicate REQ arriving late gets the same REJ again.
    let req = sim
        .sent
        .iter()
        .find(|(_, _, m)| m.message_kind() == "REQ")
        .unwrap()
        .2;
    assert_eq!(
        sim.eps[1].handle_mad(sim.now, addr(0), req),
        Disposition::Answered
    );
    let again = sim.eps[1].poll_transmit().unwrap();
    assert!(
        matches!(again.mad.message, CmMessage::Rej(r) if r.reason == RejectReason::ConsumerReject)
    );
    sim.run(&mut noop);
    sim.finish();
}

#[test]
fn no_listener_rejects_with_invalid_service_id() {
    let mut sim = Sim::new(1);
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    assert!(matches!(
        sim.events(0, a).as_slice(),
        [Event::Rejected {
            reason: RejectReason::InvalidServiceId,
            origin: RejectOrigin::Remote,
            ..
        }]
    ));
    assert_eq!(sim.eps[1].allocated_ids(), 0, "stateless answer");
    sim.finish();
}

#[test]
fn every_reject_reason_surfaces_typed() {
    for code in 1..=34u16 {
        let reason = RejectReason::from_code(code);
        let mut sim = Sim::new(1);
        sim.eps[1].listen(SVC).unwrap();
        let a = sim.eps[0]
            .connect(sim.now, connect_params(1, SVC, 0x11))
            .unwrap();
        sim.pump(&mut noop);
        let b = sim.first_conn_request(1);
        sim.eps[1].reject(sim.now, b, reason, &[], &[]).unwrap();
        sim.pump(&mut noop);
        assert!(
            sim.events(0, a)
                .iter()
                .any(|e| matches!(e, Event::Rejected { reason: r, .. } if *r == reason)),
            "{reason:?}"
        );
        sim.finish();
    }
}
