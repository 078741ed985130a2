//! `ibal -v` and `RUST_LOG` (docs/tracing.md): the help describes `-v`,
//! `-vv` prints the library's debug events (the CM's state changes) on
//! stderr and nothing on stdout that was not there before, and without
//! `-v` or `RUST_LOG` no event is printed.

use std::process::{Command, Output};

fn ibal(args: &[&str], rust_log: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ibal"));
    c.args(args).env_remove("RUST_LOG");
    if let Some(v) = rust_log {
        c.env("RUST_LOG", v);
    }
    let out = c.output().expect("the ibal binary runs");
    assert!(
        out.status.success(),
        "ibal {args:?} exited with {:?}; stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const PINGPONG: [&str; 5] = ["pingpong", "--iterations", "5", "--size", "64"];

#[test]
fn help_describes_v_and_rust_log() {
    let help = text(&ibal(&["--help"], None).stdout);
    assert!(help.contains("-v, --verbose"), "{help}");
    assert!(help.contains("-vv debug"), "{help}");
    assert!(help.contains("RUST_LOG"), "{help}");
}

#[test]
fn vv_prints_cm_state_changes_on_stderr() {
    let mut args = vec!["-vv"];
    args.extend(PINGPONG);
    let out = ibal(&args, None);
    let err = text(&out.stderr);
    assert!(err.contains("ibal::cm: CEP state change"), "{err}");
    assert!(err.contains("to=ESTABLISHED"), "{err}");
    assert!(err.contains("ibal::cm::mad: CM MAD sent attr=REQ"), "{err}");
    assert!(
        !text(&out.stdout).contains("ibal::cm"),
        "events go to stderr"
    );
}

#[test]
fn v_alone_leaves_out_debug_events() {
    let mut args = vec!["-v"];
    args.extend(PINGPONG);
    let err = text(&ibal(&args, None).stderr);
    assert!(!err.contains("CEP state change"), "{err}");
}

#[test]
fn rust_log_alone_selects_a_target() {
    let err = text(&ibal(&PINGPONG, Some("ibal::cm::mad=debug")).stderr);
    assert!(err.contains("CM MAD received"), "{err}");
    assert!(
        !err.contains("CEP state change"),
        "only ibal::cm::mad: {err}"
    );
}

#[test]
fn without_v_or_rust_log_nothing_is_printed() {
    let err = text(&ibal(&PINGPONG, None).stderr);
    assert!(!err.contains("ibal::"), "{err}");
}
