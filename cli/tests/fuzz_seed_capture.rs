//! Rewrites the `ib_capture` fuzz target's captured ping-pong seed, which
//! needs the command's ping-pong (`ibal-testkit`'s `tests/fuzz_corpus.rs`
//! writes the other seeds and replays them all). Ignored: run it on
//! purpose, `cargo test -p ibal-cli --test fuzz_seed_capture -- --ignored`.

use ibal_cli::pingpong::{run, PingPongConfig};

/// `fuzz/corpus/ib_capture/seed-pingpong.erf`: five CM MADs as packets.
#[test]
#[ignore]
fn regenerate_ib_capture_pingpong_seed() {
    let capture_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fuzz")
        .join("corpus")
        .join("ib_capture");
    std::fs::create_dir_all(&capture_dir).unwrap();
    let erf_path = capture_dir.join("seed-pingpong.erf");
    run(&PingPongConfig {
        iterations: 1,
        size: 8,
        capture: Some(erf_path),
    })
    .unwrap();
}
