//! Starting PSNs a stranger cannot predict: the StartingPSN of the REQs a
//! bound connection sends, over many connects of the same QP and of a QP
//! whose number is one more, is not a function of the QPN, does not repeat
//! and shows no structure (each bit set in about half of them).
//! A PSN derived from the QPN (as it once was) fails every check.

use std::sync::{Arc as StdArc, Mutex as StdMutex};

use al::{Al, Handle};
use cep::cm::{self, Cep, CmHandler, ConnectRequest, ListenHandler};
use cep::proto::Event;
use cep::wire::RejectReason;
use qp::CidState;

mod cm_world;
use cm_world::{new_qp, provider, side, wait, SERVICE};

/// Connects each QP of `qps` in turn, `rounds` times, to a listen that
/// records each REQ's (local QPN, StartingPSN) and is then rejected.
#[test]
fn starting_psns_are_not_derived_from_the_qpn_or_each_other() {
    let al = Al::open().unwrap();
    let p = provider();
    let a = side(&al, &p, 0xa000);
    let b = side(&al, &p, 0xb000);
    type Seen = StdArc<StdMutex<Vec<(Handle<Cep>, u32, u32)>>>;
    let seen: Seen = StdArc::default();
    let s = seen.clone();
    let on_request: ListenHandler = StdArc::new(move |_l, cep, ev| {
        if let Event::ConnectRequest { req, .. } = ev {
            s.lock()
                .unwrap()
                .push((cep, req.local_qpn, req.starting_psn));
        }
    });
    let ignore: CmHandler = StdArc::new(|_, _| {});
    cm::listen(al.instance(), b.ca, 1, SERVICE, on_request, ignore.clone()).unwrap();
    let qps = [a.qp, new_qp(&al, a.pd, a.cq)];
    let rounds = 64;
    for _ in 0..rounds {
        for &qp in &qps {
            let before = seen.lock().unwrap().len();
            cm::connect(
                al.instance(),
                qp,
                // A short path lifetime: the rejected CEP's timewait,
                // which keeps the QP bound, lasts about a millisecond.
                &ConnectRequest::new(SERVICE, 2).local_ack_timeout(8),
                ignore.clone(),
            )
            .unwrap();
            wait("the REQ", || seen.lock().unwrap().len() > before);
            let passive = seen.lock().unwrap()[before].0;
            cm::reject(al.instance(), passive, RejectReason::ConsumerReject, &[]).unwrap();
            wait("the QP to be free again", || {
                al.resolve(qp).unwrap().cid().load() == CidState::Unbound
            });
        }
    }
    let seen = seen.lock().unwrap();
    let per_qp: Vec<Vec<(u32, u32)>> = (0..2)
        .map(|i| {
            seen.iter()
                .skip(i)
                .step_by(2)
                .map(|&(_, qpn, psn)| (qpn, psn))
                .collect()
        })
        .collect();
    assert_eq!(per_qp[0].len(), rounds);
    for (i, conns) in per_qp.iter().enumerate() {
        let psns: Vec<u32> = conns.iter().map(|&(_, psn)| psn).collect();
        assert!(psns.iter().all(|&p| p <= 0xff_ffff));
        let mut distinct = psns.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // 64 draws of 24 bits: a repeat has odds of about 1 in 8,000.
        assert!(
            distinct.len() + 1 >= psns.len(),
            "QP {i}: one QP started {} connections at {} PSNs",
            psns.len(),
            distinct.len()
        );
    }
    // Not a function of the QPN: neither the difference nor the xor of PSN
    // and QPN repeats (beyond chance) across connections of both QPs.
    let all: Vec<(u32, u32)> = per_qp.concat();
    assert_ne!(per_qp[0][0].0, per_qp[1][0].0, "two QPs");
    for (name, f) in [
        (
            "psn - qpn",
            (|q: u32, p: u32| p.wrapping_sub(q) & 0xff_ffff) as fn(u32, u32) -> u32,
        ),
        ("psn ^ qpn", |q, p| (p ^ q) & 0xff_ffff),
    ] {
        let mut v: Vec<u32> = all.iter().map(|&(q, p)| f(q, p)).collect();
        v.sort_unstable();
        v.dedup();
        assert!(v.len() + 2 >= all.len(), "{name} takes {} values", v.len());
    }
    // Each of the 24 bits set in about half of the 128 PSNs (6 sigma).
    for bit in 0..24 {
        let ones = all.iter().filter(|&&(_, p)| p >> bit & 1 == 1).count();
        assert!(ones.abs_diff(64) <= 34, "bit {bit} set in {ones} of 128");
    }
    drop(seen);
    wait("every CEP to go", || al.stats().live(al::Kind::CEP) == 0);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}
