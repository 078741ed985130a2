//! Comm ids that reveal nothing: over many connect/disconnect cycles
//! between two polled agents on the soft fabric the ids show no structure,
//! and an agent started again on the same port (same CA GUID, same
//! history) hands out other ids. Before the keyed permutation an id was
//! `index | modifier << 20` seeded from the GUID: the cycles' ids stepped
//! by exactly `0x100000` and a restarted agent repeated its predecessor's.

#[path = "agent_common.rs"]
mod common;

use cep::agent::{AgentConfig, CmAgent};
use cep::proto::{ConnId, Event, Nanos, State};
use common::*;

/// One connection from `a` to `b`, established and disconnected, run to
/// the end of timewait (so both ids are freed and their slots reused by
/// the next cycle). Returns (active id, passive id).
fn cycle(a: &Agent, b: &Agent, now: &mut Nanos) -> (ConnId, ConnId) {
    let ca = a.connect(connect_params(a, b, SVC, 0x11)).unwrap();
    let ev = poll_all(*now, &[a, b]);
    let cb = match ev[1].as_slice() {
        [Event::ConnectRequest { conn, .. }] => *conn,
        other => panic!("expected the REQ, got {other:?}"),
    };
    b.accept(cb, rep_for(0x22)).unwrap();
    poll_all(*now, &[a, b]);
    a.send_rtu(ca, &[]).unwrap();
    poll_all(*now, &[a, b]);
    assert_eq!(b.state(cb), Some(State::Established));
    a.disconnect(ca, &[]).unwrap();
    poll_all(*now, &[a, b]);
    b.disconnect_reply(cb, &[]).unwrap();
    poll_all(*now, &[a, b]);
    // Past timewait (about 9.4 ms): both ids are released.
    *now = Nanos(now.0 + 20 * MS);
    poll_all(*now, &[a, b]);
    assert_eq!((a.state(ca), b.state(cb)), (None, None));
    (ca, cb)
}

/// Every bit set in about half of `ids`, consecutive ids differing in
/// about half their bits, and (almost) no step between consecutive ids
/// repeated. Bounds are six standard deviations or more from the mean.
fn assert_no_structure(what: &str, ids: &[u32]) {
    let n = ids.len();
    assert!(ids.iter().all(|&id| id != 0), "{what}: an id is 0");
    let half = n / 2;
    let slack = (3.0 * (n as f64).sqrt()) as usize; // 6 sigma
    for bit in 0..32 {
        let ones = ids.iter().filter(|&&id| id >> bit & 1 == 1).count();
        assert!(
            ones.abs_diff(half) <= slack,
            "{what}: bit {bit} set in {ones} of {n} ids"
        );
    }
    let flips: u32 = ids.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).sum();
    let mean = f64::from(flips) / (n - 1) as f64;
    assert!(
        (15.0..=17.0).contains(&mean),
        "{what}: consecutive ids differ in {mean} bits on average"
    );
    let mut steps: Vec<u32> = ids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    steps.sort_unstable();
    steps.dedup();
    assert!(
        steps.len() + 4 >= n - 1,
        "{what}: only {} distinct steps between {n} ids",
        steps.len()
    );
}

#[test]
fn ids_of_reconnecting_agents_show_no_structure() {
    // Keys from the OS, as every agent not told otherwise draws them.
    let (_f, a, b) = pair_with(AgentConfig::default(), AgentConfig::default());
    b.listen(SVC).unwrap();
    let mut now = Nanos(0);
    let (mut active, mut passive) = (Vec::new(), Vec::new());
    for _ in 0..512 {
        let (ca, cb) = cycle(&a, &b, &mut now);
        active.push(ca.comm_id());
        passive.push(cb.comm_id());
    }
    assert_no_structure("active side", &active);
    assert_no_structure("passive side", &passive);
}

/// The same device and port, so the same CA GUID, and the same history
/// (a listener, then one connection): an agent started again, as after a
/// process restart, hands out other ids than its predecessor.
#[test]
fn an_agent_started_again_with_the_same_guid_hands_out_other_ids() {
    let (_f, a, b) = pair_with(AgentConfig::default(), AgentConfig::default());
    let mut now = Nanos(0);
    let mut history = |b: &Agent| {
        let listener = b.listen(SVC).unwrap();
        let (_, cb) = cycle(&a, b, &mut now);
        b.cancel_listen(listener).unwrap();
        [listener.comm_id(), cb.comm_id()]
    };
    let first = history(&b);
    let dev = b.device().clone();
    b.finish_shutdown();
    drop(b);
    let again = CmAgent::new(dev, 1, AgentConfig::default()).unwrap();
    let second = history(&again);
    assert_ne!(first[0], second[0], "the listener ids repeat");
    assert_ne!(first[1], second[1], "the connection ids repeat");
}
