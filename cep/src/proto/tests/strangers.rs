//! MADs for a live connection from a stranger: another port than the
//! connection's peer, carrying exactly the MAD the peer sends (right comm
//! ids, QPN, transaction id). Each is taken off the simulated network as
//! the peer sent it, handed to its target first from the stranger, which
//! changes nothing (same state, same timer, no event, nothing sent for the
//! connection, the `not_from_peer` counter moves), and then from the peer,
//! which is acted on (the positive control).

use super::*;

/// The stranger's port.
fn stranger() -> PeerAddr {
    addr(2)
}

/// Moves what both endpoints want to send onto the network and takes off
/// the last `kind` MAD side `from` sent.
fn intercept(sim: &mut Sim, from: usize, kind: &str) -> CmMad {
    sim.collect(&mut noop);
    sim.flush();
    let i = sim
        .net
        .iter()
        .rposition(|f| f.from == from && f.mad.message_kind() == kind)
        .unwrap_or_else(|| panic!("side {from} sent no {kind}"));
    sim.net.remove(i).mad
}

/// What side `to` did with `mad` from `from`: its disposition, events and
/// transmits, taken straight from the endpoint.
fn hand(
    sim: &mut Sim,
    to: usize,
    from: PeerAddr,
    mad: CmMad,
) -> (Disposition, Vec<Event>, Vec<Transmit>) {
    let ep = &mut sim.eps[to];
    let d = ep.handle_mad(sim.now, from, mad);
    ep.check_invariants().unwrap();
    let events = std::iter::from_fn(|| ep.poll_event()).collect();
    let sent = std::iter::from_fn(|| ep.poll_transmit()).collect();
    (d, events, sent)
}

/// `mad` from `from` (not `conn`'s peer) changes nothing about `conn` on
/// side `to`, is counted, and draws at most a stateless answer to its
/// sender (one that names only the ids it sent).
fn assert_ignored(sim: &mut Sim, to: usize, conn: ConnId, from: PeerAddr, mad: CmMad) {
    let ep = &sim.eps[to];
    let before = (ep.state(conn), ep.next_timeout(), ep.not_from_peer());
    let (d, events, sent) = hand(sim, to, from, mad);
    let ep = &sim.eps[to];
    let kind = mad.message_kind();
    assert_eq!(
        (ep.state(conn), ep.next_timeout()),
        (before.0, before.1),
        "{kind} from {from:?} moved {conn} ({d:?})"
    );
    assert_eq!(ep.not_from_peer(), before.2 + 1, "{kind} not counted");
    assert!(events.is_empty(), "{kind} from a stranger: {events:?}");
    for t in &sent {
        assert!(
            t.conn.is_none() && t.to == from,
            "{kind} from a stranger drew {t:?}"
        );
    }
}

/// The same MAD from the peer is acted on: `conn` ends in `state` (`None`:
/// released) and the first event is `event`.
fn assert_acted_on(
    sim: &mut Sim,
    to: usize,
    conn: ConnId,
    mad: CmMad,
    state: Option<State>,
    event: &str,
) {
    let (d, events, _) = hand(sim, to, addr(1 - to), mad);
    let kind = mad.message_kind();
    assert_eq!(
        sim.eps[to].state(conn),
        state,
        "{kind} from the peer ({d:?})"
    );
    assert_eq!(
        events.first().map(Event::name),
        Some(event),
        "{kind} from the peer: {events:?}"
    );
}

/// A passive side with a REQ received: A's CEP, B's CEP.
fn requested() -> (Sim, ConnId, ConnId) {
    let mut sim = Sim::new(5);
    sim.eps[1].listen(SVC).unwrap();
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    sim.pump(&mut noop);
    let b = sim.first_conn_request(1);
    (sim, a, b)
}

/// B accepted; A holds the REP (REP_RCVD), B waits for the RTU (REP_SENT).
fn replied() -> (Sim, ConnId, ConnId) {
    let (mut sim, a, b) = requested();
    sim.eps[1].accept(sim.now, b, rep_for(0x22)).unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[1].state(b), Some(State::RepSent));
    (sim, a, b)
}

#[test]
fn dreq_for_an_established_connection_either_side() {
    for victim in [0, 1] {
        let (mut sim, a, b) = connected();
        let (own, peer) = if victim == 0 { (a, b) } else { (b, a) };
        sim.eps[1 - victim].disconnect(sim.now, peer, &[]).unwrap();
        let dreq = intercept(&mut sim, 1 - victim, "DREQ");
        assert_ignored(&mut sim, victim, own, stranger(), dreq);
        assert_eq!(sim.eps[victim].state(own), Some(State::Established));
        assert_acted_on(
            &mut sim,
            victim,
            own,
            dreq,
            Some(State::DreqRcvd),
            "DisconnectRequest",
        );
    }
}

#[test]
fn drep_for_a_disconnect_in_progress() {
    let (mut sim, a, b) = connected();
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    sim.pump(&mut noop);
    sim.eps[1].disconnect_reply(sim.now, b, &[]).unwrap();
    let drep = intercept(&mut sim, 1, "DREP");
    assert_ignored(&mut sim, 0, a, stranger(), drep);
    assert_eq!(sim.eps[0].state(a), Some(State::DreqSent));
    assert_acted_on(&mut sim, 0, a, drep, Some(State::Timewait), "Disconnected");
}

#[test]
fn rej_for_a_connection_in_setup_either_side() {
    // B refuses A's REQ: A waits in REQ_SENT.
    let (mut sim, a, b) = requested();
    sim.eps[1]
        .reject(sim.now, b, RejectReason::ConsumerReject, &[], &[])
        .unwrap();
    let rej = intercept(&mut sim, 1, "REJ");
    assert_ignored(&mut sim, 0, a, stranger(), rej);
    assert_acted_on(&mut sim, 0, a, rej, Some(State::Timewait), "Rejected");
    // A refuses B's REP: B waits in REP_SENT.
    let (mut sim, a, b) = replied();
    sim.eps[0]
        .reject(sim.now, a, RejectReason::ConsumerReject, &[], &[])
        .unwrap();
    let rej = intercept(&mut sim, 0, "REJ");
    assert_ignored(&mut sim, 1, b, stranger(), rej);
    assert_acted_on(&mut sim, 1, b, rej, Some(State::Timewait), "Rejected");
}

#[test]
fn rej_for_an_established_connection() {
    let (mut sim, a, b) = connected();
    // No call sends a REJ once established; the peer's REJ for the REP
    // (its ids, reason Other) is what a forger would send.
    let rej = CmMad::new(
        7,
        wire::Rej {
            local_comm_id: b.comm_id(),
            remote_comm_id: a.comm_id(),
            message_rejected: wire::MessageRejected::Other,
            reason: RejectReason::ConsumerReject,
            ..Default::default()
        },
    );
    assert_ignored(&mut sim, 0, a, stranger(), rej);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_acted_on(&mut sim, 0, a, rej, Some(State::Timewait), "Rejected");
}

/// A REJ that names only our comm id (LocalCommID 0, the form a CM with no
/// CEP for the connection sends) ends a connection only where it can be
/// the answer to our REP; an established connection needs both ids, even
/// from its peer's address (what a spoofer would use).
#[test]
fn rej_with_only_our_id_ends_only_a_rep_sent() {
    let stateless = |to: ConnId| {
        CmMad::new(
            7,
            wire::Rej {
                local_comm_id: 0,
                remote_comm_id: to.comm_id(),
                message_rejected: wire::MessageRejected::Rep,
                reason: RejectReason::InvalidCommId,
                ..Default::default()
            },
        )
    };
    let (mut sim, a, b) = connected();
    for (side, conn) in [(0, a), (1, b)] {
        let (d, events, sent) = hand(&mut sim, side, addr(1 - side), stateless(conn));
        assert_eq!(sim.eps[side].state(conn), Some(State::Established), "{d:?}");
        assert!(events.is_empty() && sent.is_empty(), "{events:?} {sent:?}");
    }
    let (mut sim, _a, b) = replied();
    assert_acted_on(
        &mut sim,
        1,
        b,
        stateless(b),
        Some(State::Timewait),
        "Rejected",
    );
}

/// The active side timing out before it learnt B's id sends a REJ with
/// RemoteCommID 0 and its GUID in the ARI: B finds the connection by A's
/// comm id and GUID, and only A's port may end it that way.
#[test]
fn rej_that_names_only_the_senders_id() {
    let (mut sim, a, b) = requested();
    // B's MRA (it answers A's first duplicate REQ) is lost too, so A keeps
    // retrying.
    sim.drop_rule = Some(Box::new(|_, mad| {
        matches!(mad.message_kind(), "REJ" | "MRA")
    }));
    // A gives up after four waits (three retries); B would answer the REQ
    // with REJ(Timeout) itself after five.
    sim.run_until(sim.now.saturating_add(wait() * 9 / 2), &mut noop);
    assert!(
        matches!(sim.eps[0].state(a), None | Some(State::Timewait)),
        "A gave up"
    );
    let rej = sim
        .sent
        .iter()
        .find(|(_, s, m)| *s == 0 && m.message_kind() == "REJ")
        .map(|(_, _, m)| *m)
        .unwrap();
    match rej.message {
        CmMessage::Rej(r) => assert_eq!((r.remote_comm_id, r.reason), (0, RejectReason::Timeout)),
        m => panic!("{m:?}"),
    }
    assert_eq!(sim.eps[1].state(b), Some(State::MraReqSent));
    assert_ignored(&mut sim, 1, b, stranger(), rej);
    assert_acted_on(&mut sim, 1, b, rej, Some(State::Timewait), "Rejected");
}

/// The same REJ (RemoteCommID 0, A's id and GUID) for a connection A has
/// established: A knows B's id by then and would name it, so even from
/// A's address (a spoofer's choice) it ends nothing.
#[test]
fn rej_without_our_id_leaves_an_established_connection() {
    let (mut sim, a, b) = connected();
    let mut ari = [0u8; wire::INFO_LEN];
    ari[..8].copy_from_slice(&guid(0).to_be_bytes());
    let rej = CmMad::new(
        7,
        wire::Rej {
            local_comm_id: a.comm_id(),
            remote_comm_id: 0,
            message_rejected: wire::MessageRejected::Other,
            reason: RejectReason::Timeout,
            rejected_info_length: 8,
            ari,
            ..Default::default()
        },
    );
    let (d, events, sent) = hand(&mut sim, 1, addr(0), rej);
    assert_eq!(sim.eps[1].state(b), Some(State::Established), "{d:?}");
    assert!(events.is_empty() && sent.is_empty(), "{events:?} {sent:?}");
}

#[test]
fn rep_and_mra_for_a_req_sent() {
    let (mut sim, a, b) = requested();
    sim.eps[1].send_mra(sim.now, b, 20, &[]).unwrap();
    let mra = intercept(&mut sim, 1, "MRA");
    assert_ignored(&mut sim, 0, a, stranger(), mra);
    assert_acted_on(&mut sim, 0, a, mra, Some(State::MraReqRcvd), "MraReceived");
    sim.eps[1].accept(sim.now, b, rep_for(0x22)).unwrap();
    let rep = intercept(&mut sim, 1, "REP");
    let (d, events, sent) = hand(&mut sim, 0, stranger(), rep);
    assert!(events.is_empty(), "{d:?} {events:?}");
    assert_eq!(sim.eps[0].state(a), Some(State::MraReqRcvd));
    // The answer a REP for no connection gets, to its sender only:
    // "invalid comm ID", never "invalid comm instance", which would tell
    // it that the id is live.
    match sent.as_slice() {
        [Transmit {
            to,
            conn: None,
            mad:
                CmMad {
                    message: CmMessage::Rej(r),
                    ..
                },
        }] => {
            assert_eq!(*to, stranger());
            assert_eq!(r.reason, RejectReason::InvalidCommId);
            assert_eq!((r.local_comm_id, r.remote_comm_id), (0, b.comm_id()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.eps[0].not_from_peer(), 2);
    assert_acted_on(&mut sim, 0, a, rep, Some(State::RepRcvd), "ReplyReceived");
}

#[test]
fn rtu_mra_and_dreq_for_a_rep_sent() {
    let (mut sim, a, b) = replied();
    sim.eps[0].send_mra(sim.now, a, 20, &[]).unwrap();
    let mra = intercept(&mut sim, 0, "MRA");
    assert_ignored(&mut sim, 1, b, stranger(), mra);
    assert_acted_on(&mut sim, 1, b, mra, Some(State::MraRepRcvd), "MraReceived");
    sim.eps[0].send_rtu(a, &[]).unwrap();
    let rtu = intercept(&mut sim, 0, "RTU");
    assert_ignored(&mut sim, 1, b, stranger(), rtu);
    // A DREQ in REP_SENT means the RTU was lost: it too is the peer's to send.
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    let dreq = intercept(&mut sim, 0, "DREQ");
    assert_ignored(&mut sim, 1, b, stranger(), dreq);
    assert_acted_on(&mut sim, 1, b, rtu, Some(State::Established), "Established");
}

#[test]
fn lap_and_apr() {
    let (mut sim, a, b) = connected();
    sim.eps[0].lap(sim.now, a, alt_path()).unwrap();
    let lap = intercept(&mut sim, 0, "LAP");
    assert_ignored(&mut sim, 1, b, stranger(), lap);
    assert_acted_on(&mut sim, 1, b, lap, Some(State::LapRcvd), "LapReceived");
    sim.eps[1].apr(b, ApStatus::Success, &[], &[]).unwrap();
    let apr = intercept(&mut sim, 1, "APR");
    assert_ignored(&mut sim, 0, a, stranger(), apr);
    assert_eq!(sim.eps[0].state(a), Some(State::LapSent));
    assert_acted_on(&mut sim, 0, a, apr, Some(State::Established), "AprReceived");
}

#[test]
fn sidr_rep_for_a_sidr_req_sent() {
    let mut sim = Sim::new(9);
    sim.eps[1].listen(SVC).unwrap();
    let s = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    sim.pump(&mut noop);
    let passive = sim
        .log
        .iter()
        .find_map(|(_, _, e)| match e {
            Event::SidrRequest { conn, .. } => Some(*conn),
            _ => None,
        })
        .unwrap();
    sim.eps[1]
        .sidr_reply(passive, SidrReplyParams::default())
        .unwrap();
    let rep = intercept(&mut sim, 1, "SIDR_REP");
    assert_ignored(&mut sim, 0, s, stranger(), rep);
    assert_acted_on(&mut sim, 0, s, rep, None, "SidrReply");
}

/// A connection in timewait answers its peer's repeated DREQ with its
/// DREP again; a stranger's copy draws nothing that carries the
/// connection's ids.
#[test]
fn dreq_in_timewait() {
    let (mut sim, a, b) = connected();
    sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
    let dreq = intercept(&mut sim, 0, "DREQ");
    hand(&mut sim, 1, addr(0), dreq);
    sim.eps[1].disconnect_reply(sim.now, b, &[]).unwrap();
    sim.flush();
    assert_eq!(sim.eps[1].state(b), Some(State::Timewait));
    assert_ignored(&mut sim, 1, b, stranger(), dreq);
    let (d, _, sent) = hand(&mut sim, 1, addr(0), dreq);
    assert_eq!(d, Disposition::Answered);
    assert!(
        matches!(sent.as_slice(), [t] if t.conn == Some(b) && t.to == addr(0)
            && t.mad.message_kind() == "DREP"),
        "{sent:?}"
    );
}

/// A's REQ repeated while B's REP is out gets the REP again; the same REQ
/// from another port gets nothing (no second connection either: the ids
/// are taken).
#[test]
fn duplicate_req_from_another_port() {
    let (mut sim, _a, b) = replied();
    let req = sim
        .sent
        .iter()
        .find(|(_, s, m)| *s == 0 && m.message_kind() == "REQ")
        .map(|(_, _, m)| *m)
        .unwrap();
    assert_ignored(&mut sim, 1, b, stranger(), req);
    assert_eq!(sim.eps[1].live_connections(), 1);
    let (_, _, sent) = hand(&mut sim, 1, addr(0), req);
    assert!(
        matches!(sent.as_slice(), [t] if t.conn == Some(b) && t.mad.message_kind() == "REP"),
        "{sent:?}"
    );
}

/// A REQ naming the remote QPN and CA GUID of a live connection makes it
/// stale only when it comes from that connection's peer: QPN and GUID are
/// on the wire for anyone to copy.
#[test]
fn stale_req_from_another_port() {
    let (mut sim, _a, b) = connected();
    // A restarted: same GUID, same QPN, other comm ids.
    let mut restarted = Endpoint::new(EndpointConfig {
        id_key: IdKey::fixed(0x5555, 0x5555),
        first_tid: 99 << 32,
        ..config(0)
    });
    restarted
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let req = restarted.poll_transmit().unwrap().mad;
    assert_ignored(&mut sim, 1, b, stranger(), req);
    assert_eq!(sim.eps[1].state(b), Some(State::Established));
    assert_acted_on(
        &mut sim,
        1,
        b,
        req,
        Some(State::DreqSent),
        "StaleConnection",
    );
}

/// A REP (from the port A sent its REQ to) that claims the QPN and CA GUID
/// of A's connection with another port: the new connection is refused, as
/// its identity collides, but the old one stays: its own peer never said
/// it was stale.
#[test]
fn stale_rep_from_another_port_spares_the_old_connection() {
    let (mut sim, a, _b) = connected();
    let mut params = connect_params(2, SVC, 0x12);
    params.peer = stranger();
    let c = sim.eps[0].connect(sim.now, params).unwrap();
    let req = match sim.eps[0].poll_transmit().unwrap().mad.message {
        CmMessage::Req(r) => r,
        m => panic!("{m:?}"),
    };
    // The stranger answers with B's GUID and B's QPN for A's connection.
    let rep = CmMad::new(
        1,
        Rep {
            local_comm_id: 0x5151_5151,
            remote_comm_id: req.local_comm_id,
            local_ca_guid: guid(1),
            ..rep_for(0x8011)
        },
    );
    let before = sim.eps[0].not_from_peer();
    let (_, events, sent) = hand(&mut sim, 0, stranger(), rep);
    assert_eq!(sim.eps[0].state(a), Some(State::Established));
    assert_eq!(sim.eps[0].state(c), Some(State::Timewait));
    assert!(
        events.iter().all(|e| e.conn() == c),
        "the old connection heard of it: {events:?}"
    );
    assert!(sent.iter().all(|t| t.to == stranger()), "{sent:?}");
    assert_eq!(sim.eps[0].not_from_peer(), before + 1);
}

/// On an InfiniBand port the source LID must be the peer's, and its GID
/// too when the MAD has a GRH; on a RoCE port (LID 0) only the GID counts.
#[test]
fn what_counts_as_the_peers_address() {
    let other_gid = [0x77; 16];
    for roce in [false, true] {
        let (mut sim, a, b) = if roce {
            let mut sim = Sim::new(1);
            for i in 0..2 {
                sim.eps[i].config_mut().local_port = Some(LocalPort {
                    lid: 0,
                    lmc: 0,
                    gid: addr(i).gid,
                });
            }
            sim.eps[1].listen(SVC).unwrap();
            let a = sim.eps[0]
                .connect(sim.now, connect_params(1, SVC, 0x11))
                .unwrap();
            sim.pump(&mut auto);
            let b = sim.first_conn_request(1);
            (sim, a, b)
        } else {
            connected()
        };
        assert_eq!(sim.eps[1].state(b), Some(State::Established));
        sim.eps[0].disconnect(sim.now, a, &[]).unwrap();
        let dreq = intercept(&mut sim, 0, "DREQ");
        let peer = addr(0);
        let spoofed_lid = PeerAddr {
            lid: peer.lid,
            gid: other_gid,
        };
        assert_ignored(&mut sim, 1, b, spoofed_lid, dreq);
        let no_grh = PeerAddr {
            lid: peer.lid,
            gid: [0; 16],
        };
        let other_lid = PeerAddr {
            lid: 0x99,
            gid: peer.gid,
        };
        if roce {
            // The GID is the address; the LID means nothing.
            assert_ignored(&mut sim, 1, b, no_grh, dreq);
            let (_, events, _) = hand(&mut sim, 1, other_lid, dreq);
            assert_eq!(events.first().map(Event::name), Some("DisconnectRequest"));
        } else {
            assert_ignored(&mut sim, 1, b, other_lid, dreq);
            // No GRH: the LID alone identifies the port.
            let (_, events, _) = hand(&mut sim, 1, no_grh, dreq);
            assert_eq!(events.first().map(Event::name), Some("DisconnectRequest"));
        }
        assert_eq!(sim.eps[1].state(b), Some(State::DreqRcvd));
    }
}
