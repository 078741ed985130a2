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
            let data = std::fs::read(&path).unwrap();
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
}
