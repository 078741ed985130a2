//! `--status SECS`: a running `ibal pingpong --listen` and its `--connect`
//! peer print snapshots of their objects on stderr (JSON lines with
//! `--json`, `rdma res show`-style lines without), while stdout keeps the
//! run's report; `ibal stress --status` prints every AL of the run.

mod common;

use std::time::Duration;

use common::Proc;

fn s(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn a_listener_and_its_peer_print_their_objects_while_connected() {
    let mut listener = Proc::ibal(
        "listener",
        &s(&[
            "pingpong",
            "--listen",
            "127.0.0.93:7471",
            "--udp-port",
            "25931",
            "--peer-udp-port",
            "25932",
            "--timeout",
            "20",
            "--status",
            "0.1",
            "--json",
        ]),
    );
    // Waiting: the listen is there, as a JSON line.
    let line = listener.wait_line("\"kind\":\"listen\"", Duration::from_secs(20));
    assert!(line.starts_with("{\"al\":\"AL#"), "{line}");
    assert!(line.ends_with("]}"), "{line}");
    assert!(line.contains("\"service-id\":\"0x1061d2f\""), "{line}");

    let mut client = Proc::ibal(
        "client",
        &s(&[
            "pingpong",
            "--connect",
            "127.0.0.93:7471",
            "--local",
            "127.0.0.94",
            "--udp-port",
            "25932",
            "--peer-udp-port",
            "25931",
            "--iterations",
            "50",
            "--hold",
            "1",
            "--status",
            "0.1",
        ]),
    );
    // Connected: the client's CEP line, and the listener's JSON with its
    // passive CEP and QP.
    let cep = client.wait_line("state ESTABLISHED", Duration::from_secs(20));
    assert!(cep.starts_with("cep CEP#"), "{cep}");
    for word in [
        "side active",
        "peer-ip 127.0.0.93",
        "lcomm-id 0x",
        "rcomm-id 0x",
        "qp QP#",
    ] {
        assert!(cep.contains(word), "{word}: {cep}");
    }
    let qp = client.wait_line("qp QP#", Duration::from_secs(5));
    assert!(qp.contains("type RC state RTS"), "{qp}");
    let json = listener.wait_line("\"state\":\"ESTABLISHED\"", Duration::from_secs(20));
    assert!(json.contains("\"side\":\"passive\""), "{json}");
    assert!(json.contains("\"peer-ip\":\"127.0.0.94\""), "{json}");

    let client = client.finish(Duration::from_secs(30));
    let listener = listener.finish(Duration::from_secs(30));
    assert!(client.success(), "{}", client.log());
    assert!(listener.success(), "{}", listener.log());
    // stdout is the report alone.
    assert!(
        listener
            .stdout
            .trim()
            .starts_with("{\"command\":\"pingpong\"")
            && listener.stdout.trim().lines().count() == 1,
        "{}",
        listener.log()
    );
}

#[test]
fn stress_status_prints_every_al_of_the_run() {
    let out = std::process::Command::new(common::BIN)
        .args([
            "stress",
            "--seconds",
            "0.6",
            "--threads",
            "1",
            "--population",
            "4",
            "--status",
            "0.1",
            "--json",
        ])
        .output()
        .expect("ibal runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("{\"al\":"))
        .collect();
    assert!(!lines.is_empty(), "{stderr}");
    // The population's connections: established CEPs in some snapshot.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"state\":\"ESTABLISHED\"")),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).trim().starts_with('{'));
}

#[test]
fn status_is_refused_where_it_cannot_run() {
    for args in [
        &["pingpong", "--status", "1"][..],
        &["pingpong", "--listen", "127.0.0.93", "--status", "0"][..],
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .output()
            .expect("ibal runs");
        assert!(!out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--status"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Whether `pid` catches SIGUSR1 (`SigCgt` in /proc, bit 10 - 1).
fn catches_sigusr1(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (10 - 1)) != 0)
}

#[test]
fn sigusr1_prints_a_snapshot_of_a_waiting_listener() {
    let mut listener = Proc::ibal(
        "listener",
        &s(&[
            "pingpong",
            "--listen",
            "127.0.0.97:7471",
            "--udp-port",
            "25971",
            "--timeout",
            "15",
        ]),
    );
    let pid = listener.child.id();
    // The handler is in before the signal is sent (unhandled, it ends the
    // process).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !catches_sigusr1(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never caught SIGUSR1"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..2 {
        let kill = std::process::Command::new("kill")
            .args(["-USR1", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(kill.success());
        let line = listener.wait_line("listen listen#", Duration::from_secs(10));
        assert!(line.contains("service-id 0x1061d2f"), "{line}");
    }
    listener.kill();
    listener.finish(Duration::from_secs(10));
}
