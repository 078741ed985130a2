//! Stale connections, MADs for unknown comm ids, and "communication
//! established" before the RTU.

use super::*;

// ---------------------------------------------------------------------------
// Stale connections, unknown ids, communication established
// ---------------------------------------------------------------------------

#[test]
fn stale_connection_rejects_new_and_disconnects_old() {
    let (mut sim, _a, b) = connected();
    // A reboots: same CA GUID, same QPN, new comm ids.
    sim.eps[0] = Endpoint::new(EndpointConfig {
        id_key: IdKey::fixed(0x5555, 0x5555),
        first_tid: 99 << 32,
        ..config(0)
    });
    let a2 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    assert!(matches!(
        sim.events(0, a2).first(),
        Some(Event::Rejected {
            reason: RejectReason::StaleConnection,
            ..
        })
    ));
    let bev = sim.events(1, b);
    assert!(bev
        .iter()
        .any(|e| matches!(e, Event::StaleConnection { .. })));
    // The old connection was disconnected; the rebooted A answered the DREQ
    // for the unknown comm id with a DREP.
    assert!(bev.iter().any(|e| matches!(
        e,
        Event::Disconnected {
            cause: DisconnectCause::DrepReceived,
            ..
        }
    )));
    assert_eq!(sim.eps[1].live_connections(), 1, "old conn in TIMEWAIT");
    sim.run(&mut auto);
    // After timewait, the same QPN connects fine.
    let a3 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    assert_eq!(sim.eps[0].state(a3), Some(State::Established));
    sim.finish();
}

#[test]
fn stale_rep_is_rejected() {
    // A connects a second time and B answers the new REQ with the QPN of
    // the first connection's REP: A must reject the REP as stale and
    // disconnect the old connection.
    let (mut sim, a, _b) = connected();
    let a2 = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x12))
        .unwrap();
    sim.pump(&mut noop);
    let b2 = sim
        .log
        .iter()
        .rev()
        .find_map(|(_, s, e)| match e {
            Event::ConnectRequest { conn, .. } if *s == 1 => Some(*conn),
            _ => None,
        })
        .unwrap();
    // Same QPN as the first connection's REP (0x8011).
    sim.eps[1].accept(sim.now, b2, rep_for(0x8011)).unwrap();
    sim.pump(&mut auto);
    assert!(sim.events(0, a2).iter().any(|e| matches!(
        e,
        Event::Rejected {
            reason: RejectReason::StaleConnection,
            origin: RejectOrigin::Local,
            ..
        }
    )));
    assert!(sim
        .events(0, a)
        .iter()
        .any(|e| matches!(e, Event::StaleConnection { .. })));
    sim.finish();
}

#[test]
fn garbage_datagrams_are_dropped() {
    let mut ep = Endpoint::new(config(1));
    assert!(ep.handle_datagram(Nanos(0), addr(0), &[0u8; 10]).is_err());
    let mut bytes = wire::encode(&CmMad::new(1, wire::Rtu::default())).unwrap();
    assert!(matches!(
        ep.handle_datagram(Nanos(0), addr(0), &bytes),
        Ok(Disposition::Ignored(_))
    ));
    bytes[2] = 1; // ClassVersion 1
    assert!(ep.handle_datagram(Nanos(0), addr(0), &bytes).is_err());
    assert_eq!(ep.poll_transmit(), None);
    ep.check_invariants().unwrap();
}

#[test]
fn dreq_for_unknown_comm_id_gets_drep() {
    let mut ep = Endpoint::new(config(1));
    let dreq = wire::Dreq {
        local_comm_id: 0x1234,
        remote_comm_id: 0x0055_0007,
        remote_qpn_eecn: 9,
        private_data: PrivateData::zeroed(),
    };
    assert_eq!(
        ep.handle_mad(Nanos(5), addr(0), CmMad::new(77, dreq)),
        Disposition::Answered
    );
    let tx = ep.poll_transmit().unwrap();
    assert_eq!(tx.to, addr(0));
    assert_eq!(tx.conn, None);
    assert_eq!(tx.mad.transaction_id, 77);
    match tx.mad.message {
        CmMessage::Drep(d) => {
            assert_eq!(d.local_comm_id, 0x0055_0007);
            assert_eq!(d.remote_comm_id, 0x1234);
        }
        m => panic!("unexpected {m:?}"),
    }
    assert_eq!(ep.allocated_ids(), 0);
    ep.check_invariants().unwrap();
}

#[test]
fn rep_for_unknown_comm_id_gets_rej_invalid_comm_id() {
    let mut ep = Endpoint::new(config(1));
    let rep = Rep {
        local_comm_id: 0x0077_0003,
        remote_comm_id: 0x0001_2345,
        local_ca_guid: guid(0),
        ..rep_for(0x99)
    };
    assert_eq!(
        ep.handle_mad(Nanos(5), addr(0), CmMad::new(42, rep)),
        Disposition::Answered
    );
    let tx = ep.poll_transmit().unwrap();
    assert_eq!((tx.to, tx.conn, tx.mad.transaction_id), (addr(0), None, 42));
    match tx.mad.message {
        CmMessage::Rej(r) => {
            assert_eq!(r.reason, RejectReason::InvalidCommId);
            assert_eq!(r.message_rejected, MessageRejected::Rep);
            assert_eq!((r.local_comm_id, r.remote_comm_id), (0, 0x0077_0003));
        }
        m => panic!("unexpected {m:?}"),
    }
    assert_eq!(ep.poll_transmit(), None);
    assert_eq!(ep.allocated_ids(), 0);
    ep.check_invariants().unwrap();
}

/// The active side gave up on a connection (destroyed, out of timewait)
/// while the passive side's REP was on its way: the REP is answered with
/// REJ "invalid comm ID" and the passive side ends the connection at once
/// instead of resending the REP until its retries run out.
#[test]
fn a_rep_nobody_waits_for_ends_the_passive_side_at_once() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x21))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    // A forgets the connection before B answers, and the REJ its destroy
    // sends is lost on the way.
    sim.eps[0].destroy(sim.now, a).unwrap();
    while let Some(t) = sim.eps[0].poll_transmit() {
        assert!(matches!(t.mad.message, CmMessage::Rej(_)), "{t:?}");
    }
    let t = sim.now.saturating_add(wait());
    sim.run_until(t, &mut noop);
    assert_eq!(sim.eps[0].state(a), None, "A kept {a:?}");
    let sent_before = sim.sent_kinds(1).len();
    sim.eps[1].accept(sim.now, b, rep_for(0x8021)).unwrap();
    sim.pump(&mut noop);
    assert!(
        sim.events(1, b).iter().any(|e| matches!(
            e,
            Event::Rejected {
                reason: RejectReason::InvalidCommId,
                ..
            }
        )),
        "{:?}",
        sim.events(1, b)
    );
    // B sent its REP once, no retry.
    let reps = sim.sent_kinds(1)[sent_before..]
        .iter()
        .filter(|k| **k == "REP")
        .count();
    assert_eq!(reps, 1);
    sim.finish();
}

#[test]
fn established_before_rtu() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    sim.drop_rule = Some(Box::new(|_, m| m.message_kind() == "RTU"));
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    let b = sim.first_conn_request(1);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[1].state(b), Some(State::RepSent));
    // Data arrived on B's QP: the provider reports it.
    sim.eps[1].established(b).unwrap();
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    assert_eq!(sim.eps[1].next_timeout(), None, "REP retry cancelled");
    assert!(matches!(
        sim.eps[1].established(b),
        Err(ProtoError::WrongState { .. })
    ));
    sim.collect(&mut noop);
    assert!(sim
        .events(1, b)
        .iter()
        .any(|e| matches!(e, Event::Established { .. })));
    sim.run_until(sim.now.saturating_add(10 * wait()), &mut auto);
    assert_eq!(count(&sim.sent_kinds(1), |k| *k == "REP"), 1);
    sim.finish();
}

#[test]
fn dreq_while_rep_sent_means_the_rtu_was_lost() {
    let mut sim = Sim::new(1);
    sim.eps[1].listen(SVC).unwrap();
    sim.drop_rule = Some(Box::new(|_, m| m.message_kind() == "RTU"));
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut auto);
    let b = sim.first_conn_request(1);
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    sim.pump(&mut auto);
    assert!(sim
        .events(1, b)
        .iter()
        .any(|e| matches!(e, Event::DisconnectRequest { .. })));
    assert_eq!(sim.eps[0].state(a), Some(State::Timewait));
    sim.finish();
}
