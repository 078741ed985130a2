//! `destroy()` in every state sends what the state calls for.

use super::*;

// ---------------------------------------------------------------------------
// destroy() in every state
// ---------------------------------------------------------------------------

/// Drives a fresh pair until the CEP on `side` is in `target`. Returns the
/// sim and that CEP.
fn reach(target: State, side: usize) -> (Sim, ConnId) {
    let mut sim = Sim::new(3);
    sim.eps[1].listen(SVC).unwrap();
    if target == State::Listen {
        let l = sim.eps[side].listen(SVC + 1).unwrap();
        return (sim, l);
    }
    if matches!(target, State::SidrReqSent | State::SidrReqRcvd) {
        let s = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
        if target == State::SidrReqSent {
            return (sim, s);
        }
        sim.pump(&mut noop);
        let c = sim
            .log
            .iter()
            .find_map(|(_, _, e)| match e {
                Event::SidrRequest { conn, .. } => Some(*conn),
                _ => None,
            })
            .unwrap();
        return (sim, c);
    }
    let a = sim.eps[0]
        .connect(sim.now, connect_params(1, SVC, 0x11))
        .unwrap();
    let mut b = None;
    type Act = fn(&mut Sim, ConnId, ConnId);
    let acts: [Act; 12] = [
        |_, _, _| {},
        |s, _, b| s.eps[1].send_mra(s.now, b, 20, &[]).unwrap(),
        |s, _, b| s.eps[1].accept(s.now, b, rep_for(0x22)).unwrap(),
        |s, a, _| s.eps[0].send_mra(s.now, a, 20, &[]).unwrap(),
        |s, a, _| s.eps[0].send_rtu(a, &[]).unwrap(),
        |s, a, _| s.eps[0].lap(s.now, a, alt_path()).unwrap(),
        |s, _, b| s.eps[1].send_mra(s.now, b, 20, &[]).unwrap(),
        |s, _, b| s.eps[1].apr(b, ApStatus::Success, &[], &[]).unwrap(),
        |s, a, _| s.eps[0].disconnect(s.now, a, &[]).unwrap(),
        |_, _, _| {},
        |s, _, b| s.eps[1].disconnect_reply(s.now, b, &[]).unwrap(),
        |_, _, _| {},
    ];
    for act in acts {
        if let Some(bc) = b {
            act(&mut sim, a, bc);
        }
        for pumped in [false, true] {
            if pumped {
                sim.pump(&mut noop);
                if b.is_none() {
                    b = Some(sim.first_conn_request(1));
                }
            }
            let conn = if side == 0 { Some(a) } else { b };
            if let Some(c) = conn {
                if sim.eps[side].state(c) == Some(target) {
                    sim.collect(&mut noop);
                    return (sim, c);
                }
            }
        }
    }
    panic!("could not reach {target} on side {side}");
}

#[test]
fn destroy_in_every_state_sends_the_right_message() {
    use wire::MessageRejected as M;
    use RejectReason as R;
    // (state, side, expected message: kind + REJ reason/message)
    #[derive(Debug)]
    enum Want {
        Nothing,
        Rej(R, M),
        Kind(&'static str),
    }
    let cases = [
        (State::Listen, 1, Want::Nothing, false),
        (State::ReqSent, 0, Want::Rej(R::Timeout, M::Other), true),
        (State::MraReqRcvd, 0, Want::Rej(R::Timeout, M::Other), true),
        (
            State::ReqRcvd,
            1,
            Want::Rej(R::ConsumerReject, M::Req),
            true,
        ),
        (
            State::MraReqSent,
            1,
            Want::Rej(R::ConsumerReject, M::Req),
            true,
        ),
        (
            State::RepSent,
            1,
            Want::Rej(R::ConsumerReject, M::Other),
            true,
        ),
        (
            State::MraRepRcvd,
            1,
            Want::Rej(R::ConsumerReject, M::Other),
            true,
        ),
        (
            State::RepRcvd,
            0,
            Want::Rej(R::ConsumerReject, M::Rep),
            true,
        ),
        (
            State::MraRepSent,
            0,
            Want::Rej(R::ConsumerReject, M::Rep),
            true,
        ),
        (State::Established, 0, Want::Kind("DREQ"), true),
        (State::Established, 1, Want::Kind("DREQ"), true),
        (State::LapSent, 0, Want::Kind("DREQ"), true),
        (State::LapRcvd, 1, Want::Kind("DREQ"), true),
        (State::MraLapSent, 1, Want::Kind("DREQ"), true),
        (State::MraLapRcvd, 0, Want::Kind("DREQ"), true),
        (State::DreqSent, 0, Want::Nothing, true),
        (State::DreqRcvd, 1, Want::Kind("DREP"), true),
        (State::Timewait, 1, Want::Nothing, true),
        (State::SidrReqSent, 0, Want::Nothing, false),
        (State::SidrReqRcvd, 1, Want::Kind("SIDR_REP"), false),
    ];
    for (state, side, want, timewait) in cases {
        let (mut sim, conn) = reach(state, side);
        sim.flush();
        let before = sim.sent.len();
        sim.eps[side].destroy(sim.now, conn).unwrap();
        assert_eq!(
            sim.eps[side]
                .destroy(sim.now, conn)
                .err()
                .map(|e| e.to_string()),
            Some(if timewait {
                format!("{conn}: connection endpoint was destroyed")
            } else {
                format!("{conn}: no such connection endpoint")
            }),
            "{state}"
        );
        sim.flush();
        let new: Vec<_> = sim.sent[before..]
            .iter()
            .filter(|(_, s, _)| *s == side)
            .map(|(_, _, m)| *m)
            .collect();
        match (&want, new.as_slice()) {
            (Want::Nothing, []) => {}
            (Want::Kind(k), [m]) if m.message_kind() == *k => {
                if let CmMessage::SidrRep(r) = m.message {
                    assert_eq!(r.status, SidrStatus::RejectedByServiceProvider);
                }
            }
            (Want::Rej(reason, message), [m]) => match m.message {
                CmMessage::Rej(r) => {
                    assert_eq!(
                        (r.reason, r.message_rejected),
                        (*reason, *message),
                        "{state}"
                    );
                }
                _ => panic!("{state}: expected REJ, sent {m:?}"),
            },
            _ => panic!("{state}: expected {want:?}, sent {new:?}"),
        }
        let after = sim.eps[side].state(conn);
        if timewait {
            assert_eq!(after, Some(State::Timewait), "{state}");
        } else {
            assert_eq!(after, None, "{state}");
        }
        // No events for a destroyed CEP except TimewaitExited/Released.
        let evs_before = sim.log.len();
        sim.run(&mut auto);
        for (_, s, e) in &sim.log[evs_before..] {
            if *s == side && e.conn() == conn {
                assert!(
                    matches!(e, Event::TimewaitExited { .. } | Event::Released { .. }),
                    "{state}: {e:?}"
                );
            }
        }
        sim.finish();
    }
}
