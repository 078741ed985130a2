//! Replays every committed fuzz corpus entry and crash artifact through the
//! same checks the fuzz targets run, on stable, without libFuzzer.

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
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
    let n = replay("mad_codec", ibal_testkit::fuzzing::mad_codec);
    assert!(n > 0, "the mad_codec seed corpus is missing");
}

#[test]
fn handle_table_corpus_replays_clean() {
    let n = replay("handle_table", ibal_testkit::fuzzing::handle_table);
    assert!(n > 0, "the handle_table seed corpus is missing");
}

#[test]
fn ip_cm_header_corpus_replays_clean() {
    let n = replay("ip_cm_header", cep::wire::ip_cm::fuzz_check);
    assert!(n > 0, "the ip_cm_header seed corpus is missing");
}

#[test]
fn cm_protocol_corpus_replays_clean() {
    let n = replay("cm_protocol", ibal_testkit::fuzzing::cm_protocol);
    assert!(n > 0, "the cm_protocol seed corpus is missing");
}

/// A short stable-toolchain sweep of random inputs through the CM harness
/// (libFuzzer explores far more; this keeps the harness itself honest).
#[test]
fn cm_protocol_survives_random_inputs() {
    sweep(
        0x2545_f491_4f6c_dd1d,
        300,
        0,
        600,
        ibal_testkit::fuzzing::cm_protocol,
    );
}

/// `runs` xorshift-generated inputs of `min_len + (x % span)` bytes each,
/// from `seed`, through `harness`.
fn sweep(seed: u64, runs: usize, min_len: usize, span: u64, harness: fn(&[u8])) {
    let mut x = seed;
    for _ in 0..runs {
        let len = min_len + (x % span) as usize;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        harness(&data);
    }
}

#[test]
fn ib_capture_corpus_replays_clean() {
    let n = replay("ib_capture", ibal_testkit::fuzzing::ib_capture);
    assert!(n > 0, "the ib_capture seed corpus is missing");
}

/// Random byte strings of up to 700 bytes.
#[test]
fn ib_capture_survives_random_inputs() {
    sweep(
        0x51f1_5eed_0ca9_7e11,
        2000,
        0,
        700,
        ibal_testkit::fuzzing::ib_capture,
    );
}

#[test]
fn al_api_corpus_replays_clean() {
    let n = replay("al_api", ibal_testkit::fuzzing::al_api);
    assert!(n > 0, "the al_api seed corpus is missing");
}

/// A short stable-toolchain sweep of random inputs through the AL/CM API
/// harness.
#[test]
fn al_api_survives_random_inputs() {
    sweep(
        0x9e37_79b9_7f4a_7c15,
        40,
        2,
        120,
        ibal_testkit::fuzzing::al_api,
    );
}

/// Rewrites the seed corpora: `cargo test -p ibal-testkit --test fuzz_corpus
/// -- --ignored`. Seeds are one well-formed MAD of every CM message (plus a
/// few malformed ones), and a few handle-table operation scripts.
#[test]
#[ignore]
fn regenerate_seed_corpora() {
    use cep::wire::{self, CmMad, CmMessage};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
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
    // al_api: byte 0 faults (2 bits each: drop, dup, reorder, delay, x5%),
    // byte 1 fault seed, then (op, arg) pairs; op % 24 is the call, op / 24
    // picks the AL. Calls: 0 open AL, 1 close AL, 2 open CA (+CM), 4 PD,
    // 5 CQ, 6 QP, 7 destroy QP, 3 close CA, 10 listen, 12 connect,
    // 13 accept, 16 rtu, 17 disconnect, 18 DREP, 21 wait, 22 foreign handle.
    let api_dir = root.join("al_api");
    std::fs::create_dir_all(&api_dir).unwrap();
    let setup: Vec<[u8; 2]> = vec![
        [0, 0],  // open AL
        [2, 0],  // CA on HCA 0, CM attached
        [2, 1],  // CA on HCA 1, CM attached
        [4, 0],  // PD on CA 0
        [4, 1],  // PD on CA 1
        [5, 0],  // CQ on CA 0
        [5, 1],  // CQ on CA 1
        [6, 0],  // RC QP on HCA 0
        [6, 1],  // RC QP on HCA 1
        [10, 1], // listen on HCA 1, service 0
    ];
    let connect = vec![[12, 0x50], [21, 7]]; // QP 0 -> HCA 1 service 0; wait for the REQ
    let accept = vec![[13, 0], [21, 7], [16, 0], [21, 7]]; // accept on QP 1; RTU
    let disconnect = vec![[17, 1], [21, 7], [18, 0], [21, 0x87]];
    let script = |faults: u8, parts: &[&[[u8; 2]]]| -> Vec<u8> {
        let mut v = vec![faults, 1];
        for p in parts {
            v.extend(p.iter().flatten());
        }
        v
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "handshake",
            script(0, &[&setup, &connect, &accept, &disconnect]),
        ),
        (
            "handshake-lossy",
            script(
                0x56,
                &[&setup, &connect, &accept, &[[21, 0x87]], &disconnect],
            ),
        ),
        (
            "close-al-mid-connection",
            script(0, &[&setup, &connect, &accept, &[[1, 0], [0, 0], [2, 0]]]),
        ),
        (
            "close-ca-cascade",
            script(0x15, &[&setup, &connect, &accept, &[[3, 0], [21, 0x87]]]),
        ),
        (
            "destroy-qp-while-connecting",
            script(0, &[&setup, &[[12, 0x50], [7, 0], [21, 0x87], [13, 0]]]),
        ),
        (
            "two-als",
            script(
                0x05,
                &[
                    &setup,
                    &[[0, 0], [2 + 24, 0], [4 + 24, 0], [5 + 24, 0], [6 + 24, 0]],
                    &[
                        [12 + 24, 0x50],
                        [21, 7],
                        [13, 0],
                        [21, 7],
                        [22, 0],
                        [22 + 24, 0],
                    ],
                    &[[16 + 24, 0], [21, 7], [1, 1]],
                ],
            ),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(api_dir.join(format!("seed-{name}")), bytes).unwrap();
    }

    // ib_capture: one packet with a GRH and immediate data, alone (the
    // captured ping-pong seed, five CM MADs as packets, is written by the
    // command's `cargo test -p ibal-cli --test fuzz_seed_capture --
    // --ignored`).
    let capture_dir = root.join("ib_capture");
    std::fs::create_dir_all(&capture_dir).unwrap();
    let packet = ibal::verbs::packet::UdPacket {
        vl: 0,
        sl: 2,
        dlid: 7,
        slid: 9,
        grh: Some(ibal::verbs::packet::Grh {
            traffic_class: 3,
            flow_label: 0x12345,
            hop_limit: 64,
            sgid: [0xfe; 16],
            dgid: [0x80; 16],
        }),
        solicited: true,
        pkey: 0x8001,
        dest_qpn: 0x42,
        psn: 77,
        qkey: 0x1111_2222,
        src_qpn: 0x43,
        immediate: Some(5),
        payload: b"a datagram of some length".to_vec(),
    };
    std::fs::write(
        capture_dir.join("seed-grh-immediate.packet"),
        packet.encode().unwrap(),
    )
    .unwrap();
}
