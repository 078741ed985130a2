//! Replays every committed fuzz corpus entry and crash artifact through the
//! same checks the fuzz targets run, on stable, without libFuzzer.

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in [
        root.join("corpus").join(target),
        root.join("artifacts").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            // A file a running fuzzer removed meanwhile is not a failure.
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", path.display());
            count += 1;
        }
    }
    count
}

#[test]
fn mad_codec_corpus_replays_clean() {
    let n = replay("mad_codec", ibal::fuzzing::mad_codec);
    assert!(n > 0, "the mad_codec seed corpus is missing");
}

#[test]
fn handle_table_corpus_replays_clean() {
    let n = replay("handle_table", ibal::fuzzing::handle_table);
    assert!(n > 0, "the handle_table seed corpus is missing");
}

#[test]
fn cm_protocol_corpus_replays_clean() {
    let n = replay("cm_protocol", ibal::fuzzing::cm_protocol);
    assert!(n > 0, "the cm_protocol seed corpus is missing");
}

/// A short stable-toolchain sweep of random inputs through the CM harness
/// (libFuzzer explores far more; this keeps the harness itself honest).
#[test]
fn cm_protocol_survives_random_inputs() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let len = (x % 600) as usize;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        ibal::fuzzing::cm_protocol(&data);
    }
}

/// Rewrites the seed corpora: `cargo test --test fuzz_corpus -- --ignored`.
/// Seeds are one well-formed MAD of every CM message (plus a few malformed
/// ones), and a few handle-table operation scripts.
#[test]
#[ignore]
fn regenerate_seed_corpora() {
    use ibal::cep::wire::{self, CmMad, CmMessage};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus");
    let mad_dir = root.join("mad_codec");
    std::fs::create_dir_all(&mad_dir).unwrap();
    let messages: Vec<CmMessage> = vec![
        wire::Req::default().into(),
        wire::Mra::default().into(),
        wire::Rej::default().into(),
        wire::Rep::default().into(),
        wire::Rtu::default().into(),
        wire::Dreq::default().into(),
        wire::Drep::default().into(),
        wire::SidrReq::default().into(),
        wire::SidrRep::default().into(),
        wire::Lap::default().into(),
        wire::Apr::default().into(),
    ];
    for (i, m) in messages.into_iter().enumerate() {
        let kind = m.message_kind();
        let bytes = wire::encode(&CmMad::new(0x1000 + i as u64, m)).unwrap();
        std::fs::write(mad_dir.join(format!("seed-{kind}")), bytes).unwrap();
        let mut bad_version = bytes;
        bad_version[0] = 2;
        std::fs::write(
            mad_dir.join(format!("seed-{kind}-bad-version")),
            bad_version,
        )
        .unwrap();
        std::fs::write(mad_dir.join(format!("seed-{kind}-short")), &bytes[..100]).unwrap();
    }
    let table_dir = root.join("handle_table");
    std::fs::create_dir_all(&table_dir).unwrap();
    let scripts: [(&str, &[u8]); 4] = [
        ("insert-get-remove", &[0, 0, 1, 0, 2, 0, 1, 0]),
        (
            "hold-across-remove",
            &[0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 4, 0, 0, 0],
        ),
        (
            "fill-and-retire",
            &[
                0, 0, 2, 0, 0, 0, 2, 1, 0, 0, 2, 2, 0, 0, 2, 3, 0, 0, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                0, 0, 0, 0,
            ],
        ),
        ("forged", &[0, 0, 5, 0, 5, 0x10, 5, 0xff, 0, 0, 5, 1]),
    ];
    for (name, script) in scripts {
        std::fs::write(table_dir.join(format!("seed-{name}")), script).unwrap();
    }
    // cm_protocol: op byte = (kind << 1) | side, then an argument byte.
    // kinds: 0 listen, 1 connect, 2 accept, 5 rtu, 7 disconnect,
    // 8 disconnect reply, 9 destroy, 11 deliver, 13 drop, 15 clock.
    let cm_dir = root.join("cm_protocol");
    std::fs::create_dir_all(&cm_dir).unwrap();
    let op = |kind: u8, side: u8, arg: u8| [(kind << 1) | side, arg];
    let handshake: Vec<u8> = [
        op(0, 1, 0),   // B listens
        op(1, 0, 1),   // A connects
        op(11, 0, 0),  // deliver REQ to B
        op(2, 1, 1),   // B accepts the request
        op(11, 0, 0),  // deliver REP to A
        op(5, 0, 0),   // A sends RTU
        op(11, 0, 0),  // deliver RTU
        op(7, 0, 0),   // A disconnects
        op(11, 0, 0),  // deliver DREQ
        op(8, 1, 1),   // B replies
        op(11, 0, 0),  // deliver DREP
        op(15, 0, 30), // timewait passes
    ]
    .concat();
    std::fs::write(cm_dir.join("seed-handshake"), &handshake).unwrap();
    let lossy: Vec<u8> = [
        op(0, 1, 0),
        op(1, 0, 2),
        op(13, 0, 0),
        op(15, 0, 25),
        op(11, 0, 0),
        op(15, 0, 35),
    ]
    .concat();
    std::fs::write(cm_dir.join("seed-lost-req"), &lossy).unwrap();
    let no_listener: Vec<u8> = [op(1, 0, 3), op(11, 0, 0), op(11, 0, 0), op(15, 0, 36)].concat();
    std::fs::write(cm_dir.join("seed-no-listener"), &no_listener).unwrap();
}
