//! Many requests at once on one listener: the backlog refuses what the
//! user cannot take, and a request the user is slow to answer costs the
//! requester one resend, then an MRA holds it (`docs/cm-protocol.md`,
//! "Bursts").

use super::*;

/// The passive side's requests, in arrival order.
fn requests(sim: &Sim) -> Vec<ConnId> {
    sim.log
        .iter()
        .filter_map(|(_, s, e)| match e {
            Event::ConnectRequest { conn, .. } if *s == 1 => Some(*conn),
            _ => None,
        })
        .collect()
}

fn rejected_no_resources(sim: &Sim) -> usize {
    count(&sim.log, |(_, s, e)| {
        *s == 0
            && matches!(
                e,
                Event::Rejected {
                    reason: RejectReason::NoResources,
                    origin: RejectOrigin::Remote,
                    ..
                }
            )
    })
}

#[test]
fn backlog_refuses_requests_over_it_and_takes_more_as_they_are_answered() {
    let mut sim = Sim::new(1);
    let l = sim.eps[1].listen(SVC).unwrap();
    assert_eq!(sim.eps[1].backlog(l), Some((0, DEFAULT_BACKLOG)));
    assert!(sim.eps[1].set_backlog(l, 0).is_err(), "a backlog of 0");
    sim.eps[1].set_backlog(l, 3).unwrap();
    for i in 0..5 {
        sim.eps[0]
            .connect(sim.now, connect_params(1, SVC, 0x100 + i))
            .unwrap();
    }
    sim.pump(&mut noop);
    // Three wait for the user; two were refused at once, with no CEP.
    assert_eq!(requests(&sim).len(), 3);
    assert_eq!(sim.eps[1].backlog(l), Some((3, 3)));
    assert_eq!(sim.eps[1].live_connections(), 3);
    assert_eq!(rejected_no_resources(&sim), 2);
    // Answering one (accept; reject and destroy alike) makes room for one.
    let first = requests(&sim)[0];
    sim.eps[1].accept(sim.now, first, rep_for(0x900)).unwrap();
    let second = requests(&sim)[1];
    sim.eps[1]
        .reject(sim.now, second, RejectReason::ConsumerReject, &[], &[])
        .unwrap();
    assert_eq!(sim.eps[1].backlog(l), Some((1, 3)));
    for i in 0..3 {
        sim.eps[0]
            .connect(sim.now, connect_params(1, SVC, 0x200 + i))
            .unwrap();
    }
    sim.pump(&mut noop);
    assert_eq!(requests(&sim).len(), 5);
    assert_eq!(rejected_no_resources(&sim), 3);
    assert_eq!(sim.eps[1].backlog(l), Some((3, 3)));
    // A request whose listener is cancelled no longer counts anywhere; a
    // new listener for the service starts empty.
    sim.eps[1].cancel_listen(l).unwrap();
    let l2 = sim.eps[1].listen(SVC).unwrap();
    assert_eq!(sim.eps[1].backlog(l2), Some((0, DEFAULT_BACKLOG)));
    sim.eps[1].destroy(sim.now, requests(&sim)[2]).unwrap();
    assert_eq!(sim.eps[1].backlog(l2), Some((0, DEFAULT_BACKLOG)));
    sim.check();
    sim.run(&mut lenient);
    sim.finish();
}

#[test]
fn sidr_requests_count_in_the_backlog_too() {
    let mut sim = Sim::new(2);
    let l = sim.eps[1].listen(SVC).unwrap();
    sim.eps[1].set_backlog(l, 1).unwrap();
    sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    let b = sim.eps[0].sidr_request(sim.now, sidr_params(SVC)).unwrap();
    sim.pump(&mut noop);
    assert_eq!(sim.eps[1].backlog(l), Some((1, 1)));
    let refused = sim.events(0, b);
    assert!(
        refused.iter().any(|e| matches!(
            e,
            Event::SidrReply { rep, .. } if rep.status == SidrStatus::NoQp
        )),
        "{refused:?}"
    );
    sim.run(&mut lenient);
    sim.finish();
}

/// Ten requests wait on a user who answers only after three and a half
/// response waits: each REQ is sent once more when its first wait runs
/// out, the passive side answers that duplicate with an MRA covering the
/// answer deadline, and nothing more is sent until the user accepts. With
/// the duplicate ignored, every REQ would be sent again at every wait
/// (three times each here).
#[test]
fn a_slow_consumer_costs_each_request_one_resend() {
    let mut sim = Sim::new(3);
    sim.eps[1].listen(SVC).unwrap();
    for i in 0..10 {
        sim.eps[0]
            .connect(sim.now, connect_params(1, SVC, 0x100 + i))
            .unwrap();
    }
    let late = sim.now.saturating_add(wait() * 7 / 2);
    sim.run_until(late, &mut noop);
    let kinds = sim.sent_kinds(0);
    assert_eq!(count(&kinds, |k| *k == "REQ"), 20, "{kinds:?}");
    assert_eq!(count(&sim.sent_kinds(1), |k| *k == "MRA"), 10);
    let resent = sim.eps[0].resends();
    assert_eq!((resent.req, resent.most_for_one_request), (10, 1));
    for b in requests(&sim) {
        assert_eq!(sim.eps[1].state(b), Some(State::MraReqSent));
        sim.eps[1]
            .accept(sim.now, b, rep_for(0x8000 + b.0 % 0x1000))
            .unwrap();
    }
    sim.run(&mut auto);
    let established = count(&sim.log, |(_, s, e)| {
        *s == 0 && matches!(e, Event::Established { .. })
    });
    assert_eq!(established, 10);
    assert_eq!(sim.eps[0].resends().req, 10);
    sim.finish();
}
