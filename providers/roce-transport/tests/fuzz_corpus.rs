//! Replays the committed `roce_transport` fuzz corpus and crash artifacts
//! (`fuzz/corpus/roce_transport`, `fuzz/artifacts/roce_transport`) through
//! the check the fuzz target runs, on stable, without libFuzzer, plus a
//! seeded random sweep so the check itself is exercised on every run.

use std::path::{Path, PathBuf};

use roce_transport::fuzzing::roce_transport;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Runs `check` on every file under `fuzz/corpus/<target>` and
/// `fuzz/artifacts/<target>`; fails if one panics or none is there.
fn replay(target: &str, check: impl Fn(&[u8]) + std::panic::RefUnwindSafe) {
    let mut count = 0;
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", path.display());
            count += 1;
        }
    }
    assert!(count > 0, "the {target} seed corpus is missing");
}

#[test]
fn roce_transport_corpus_replays_clean() {
    replay("roce_transport", |data| {
        roce_transport(data);
    });
}

/// splitmix64, for the sweep.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn random_inputs_hold_the_invariants() {
    let mut state = 0x7ea5_u64;
    for round in 0..200 {
        let len = 64 + (next(&mut state) % 1500) as usize;
        let data: Vec<u8> = (0..len).map(|_| next(&mut state) as u8).collect();
        let outcome = std::panic::catch_unwind(|| roce_transport(&data));
        assert!(outcome.is_ok(), "round {round}: input {data:02x?}");
    }
}

/// Inputs written op by op: the honest exchange, and each fault alone.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Op codes of the check (`op % 12`): 0 post send (kind, len u16),
    // 2 post receive, 3 pull, 4 deliver, 5 drop, 6 duplicate, 7 swap (i, j),
    // 8 corrupt (at u16, bit, resign), 9 inject (side, n, bytes), 10 tick.
    let sends: Vec<u8> = (0..7u8).flat_map(|kind| [0, kind, 0x10, 0x02, 2]).collect();
    let mut honest = vec![0x00];
    honest.extend(&sends);
    honest.extend([3, 4, 4, 4, 3, 4, 4, 4, 3, 4, 4, 4, 3]);
    let with = |head: u8, faults: &[u8]| {
        let mut v = vec![head];
        v.extend(&sends);
        v.push(3);
        v.extend_from_slice(faults);
        v
    };
    vec![
        ("seed-honest-rc-256", honest),
        ("seed-drop", with(0x01, &[5, 3, 5, 4, 10, 20, 3, 5])),
        ("seed-duplicate", with(0x02, &[6, 6, 4, 4, 4, 3, 6, 4, 4])),
        ("seed-reorder", with(0x03, &[7, 0, 3, 7, 1, 2, 4, 4, 4, 3])),
        ("seed-corrupt", with(0x05, &[8, 40, 0, 3, 0, 8, 9, 0, 1, 0])),
        ("seed-resigned", with(0x06, &[8, 40, 0, 3, 1, 4, 3])),
        (
            "seed-inject",
            with(
                0x07,
                &[
                    9, 1, 16, 0x04, 0x40, 0xff, 0xff, 0, 0, 0, 0x22, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
            ),
        ),
        ("seed-error", with(0x09, &[4, 11, 0xee, 1, 3, 4])),
        ("seed-uc", with(0x80, &[4, 4, 5, 4, 3])),
        ("seed-timer", with(0x3c, &[5, 5, 5, 10, 23, 3, 10, 23])),
    ]
}

#[test]
fn the_seeds_do_real_work() {
    // The honest run completes all seven kinds of message; each fault
    // seed still posts them all (four on UC) and completes every one
    // exactly once.
    for (name, bytes) in seeds() {
        let out = roce_transport(&bytes);
        // UC takes no READ or atomic: those fail at post.
        let kinds = if name == "seed-uc" { 4 } else { 7 };
        assert_eq!(out.sends, kinds, "{name}: {out:?}");
        if name == "seed-honest-rc-256" {
            assert_eq!(out.succeeded, 7, "{name}: {out:?}");
            assert_eq!(
                out.received, 3,
                "{name}: SEND, SEND and WRITE with immediate: {out:?}"
            );
        }
    }
}

#[test]
fn seeds_are_committed_as_generated() {
    let dir = fuzz_dir().join("corpus").join("roce_transport");
    for (name, bytes) in seeds() {
        let on_disk = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("seed {name} missing ({e}); regenerate with --ignored"));
        assert_eq!(on_disk, bytes, "seed {name} differs from seeds()");
    }
}

#[test]
#[ignore]
fn regenerate_seed_corpus() {
    let dir = fuzz_dir().join("corpus").join("roce_transport");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

// ------------------------------------------------------- roce_receive --

use roce_transport::fuzzing::receive::roce_receive;

#[test]
fn roce_receive_corpus_replays_clean() {
    replay("roce_receive", |data| {
        roce_receive(data);
    });
}

#[test]
fn random_datagrams_hold_the_receive_invariants() {
    let mut state = 0x5eed_u64;
    for round in 0..2000 {
        let len = 24 + (next(&mut state) % 600) as usize;
        let data: Vec<u8> = (0..len).map(|_| next(&mut state) as u8).collect();
        let outcome = std::panic::catch_unwind(|| roce_receive(&data));
        assert!(outcome.is_ok(), "round {round}: input {data:02x?}");
    }
}

/// Receive-stage inputs written by hand: three QPs, then signed datagrams
/// that each QP takes, from its peer and from a stranger.
fn receive_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // QP filters (8 bytes): type | path<<6, state, port, P_Key variant,
    // Q_Key byte, QPN (3 bytes).
    let qps = [
        [0x00, 0, 0, 0, 0, 0, 0, 0x10], // RC, RTS, port 1, path to 10.0.0.2, QPN 0x12
        [0x82, 0, 0, 0, 0x12, 0, 0, 0x20], // UD, RTS, Q_Key 0x1200, QPN 0x22
        [0x03, 0, 0, 0, 0, 0, 0, 0],    // GSI (QPN 1)
    ];
    let head: Vec<u8> = qps.iter().flatten().copied().collect();
    // A record: flags (source 0..3 | 4 sign | 8 id 0x1234 (at index 0; 0
    // at a later one) | 0x10 truncated | 0x20 no source | GRO index 0, 1,
    // 7, 0x1234 << 6), time step, then the datagram's length and bytes.
    let record = |flags: u8, body: &[u8]| {
        let mut r = vec![flags, 1, body.len() as u8];
        r.extend_from_slice(body);
        r
    };
    let rc_send: Vec<u8> = [0x04, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 0]
        .into_iter()
        .chain(*b"hello world!")
        .collect();
    let ud_send: Vec<u8> = [0x64, 0x00, 0xff, 0xff, 0, 0, 0, 0x22, 0, 0, 0, 0]
        .into_iter()
        .chain([0, 0, 0x12, 0, 0, 0, 0, 5]) // DETH: Q_Key 0x1200, source QP 5
        .chain(*b"datagram")
        .collect();
    let gsi: Vec<u8> = [0x64, 0x00, 0xff, 0xff, 0, 0, 0, 0x01, 0, 0, 0, 0]
        .into_iter()
        .chain([0x80, 0x01, 0, 0, 0, 0, 0, 1])
        .chain([0x01; 24])
        .collect();
    let join = |records: &[Vec<u8>]| {
        let mut v = head.clone();
        for r in records {
            v.extend_from_slice(r);
        }
        v
    };
    vec![
        ("seed-peer-rc", join(&[record(4, &rc_send)])),
        ("seed-stranger-rc", join(&[record(4 | 2, &rc_send)])),
        ("seed-rxe-id-rc", join(&[record(4 | 8, &rc_send)])),
        (
            "seed-datagrams",
            join(&[record(4 | 2, &ud_send), record(4 | 1, &gsi)]),
        ),
        (
            "seed-gsi-first-contact",
            join(&(0..40).map(|_| record(4 | 8 | 2, &gsi)).collect::<Vec<_>>()),
        ),
        ("seed-truncated", join(&[record(4 | 0x10, &rc_send)])),
        (
            "seed-gso-segments-rc",
            join(&[record(4 | 0x40, &rc_send), record(4 | 0x80, &rc_send)]),
        ),
        (
            "seed-coalesced-plain-rc",
            join(&[record(4 | 8 | 0x80, &rc_send)]),
        ),
    ]
}

#[test]
fn the_receive_seeds_do_real_work() {
    let out = |name: &str| {
        let (_, bytes) = receive_seeds()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap();
        roce_receive(&bytes)
    };
    let reason = |o: &roce_transport::fuzzing::receive::ReceiveOutcome,
                  d: roce_transport::Discard| {
        o.discarded[roce_transport::Discard::ALL
            .iter()
            .position(|x| *x == d)
            .unwrap()]
    };
    assert_eq!(out("seed-peer-rc").accepted, 1);
    let stranger = out("seed-stranger-rc");
    assert_eq!(
        (
            stranger.accepted,
            reason(&stranger, roce_transport::Discard::WrongSource)
        ),
        (0, 1)
    );
    let rxe = out("seed-rxe-id-rc");
    assert_eq!((rxe.accepted, rxe.solved), (1, 1));
    assert_eq!(out("seed-datagrams").accepted, 2);
    // 40 MADs from an unknown source, each with an identification to solve:
    // the first-contact budget solves the first, which makes the source
    // known; every later one is solved as a known peer's.
    let gsi = out("seed-gsi-first-contact");
    assert_eq!((gsi.accepted, gsi.solved), (40, 40));
    assert_eq!(
        reason(&out("seed-truncated"), roce_transport::Discard::Oversized),
        1
    );
    // GSO segments 1 and 7 of a super-datagram, each signed for its own
    // identification: taken at their GRO index without the solver.
    let gso = out("seed-gso-segments-rc");
    assert_eq!((gso.accepted, gso.solved), (2, 0));
    // A plain datagram (identification 0) the kernel coalesced at index
    // 7: the connection's peer, so the solver finds 0.
    let plain = out("seed-coalesced-plain-rc");
    assert_eq!((plain.accepted, plain.solved), (1, 1));
}

#[test]
fn receive_seeds_are_committed_as_generated() {
    let dir = fuzz_dir().join("corpus").join("roce_receive");
    for (name, bytes) in receive_seeds() {
        let on_disk = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("seed {name} missing ({e}); regenerate with --ignored"));
        assert_eq!(on_disk, bytes, "seed {name} differs from receive_seeds()");
    }
}

#[test]
#[ignore]
fn regenerate_receive_seed_corpus() {
    let dir = fuzz_dir().join("corpus").join("roce_receive");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in receive_seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
