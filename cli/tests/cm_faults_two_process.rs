//! `ibal pingpong --listen` / `--connect` (RC through the CM over RoCEv2,
//! rdma_cm addressing) between processes, with faults (issue 15, deliver
//! 7): many connections through `ibal relay` with 10% of each fault on the
//! CM MADs and the data alike, a peer SIGKILLed while connecting, while
//! connected and while disconnecting, a listener restarted on the same
//! address and port, and a peer restarted on the same CA GUID and QPN
//! (stale connection).
//!
//! Ports (used by no other test): 2601x/2602x (relay layout as in
//! `faults_two_process.rs`), 2603x (kills), 2604x (restart, stale QPN);
//! rdma_cm ports 7601-7604. The tests take one lock, so they never load the machine's
//! cores together; every process is bounded and killed on failure
//! (`common::Proc` kills on drop).

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{json_field, Done, Proc};

/// Longest any process may live here.
const BOUND: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether something is bound to UDP `ip:port` (`/proc/net/udp`).
fn udp_bound(ip: [u8; 4], port: u16) -> bool {
    let want = format!(
        "{:02X}{:02X}{:02X}{:02X}:{port:04X}",
        ip[3], ip[2], ip[1], ip[0]
    );
    std::fs::read_to_string("/proc/net/udp")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

/// `ibal pingpong --listen 127.0.0.1:CM` on UDP `udp`, sending to
/// `peer_udp`; returns once its RoCEv2 port is bound and its listen up.
fn listener(name: &str, cm: u16, udp: u16, peer_udp: u16, extra: &[&str]) -> Proc {
    assert!(
        !udp_bound([127, 0, 0, 1], udp),
        "UDP 127.0.0.1:{udp} is taken before the test"
    );
    let mut args = common::strings(&["pingpong", "--listen"]);
    args.push(format!("127.0.0.1:{cm}"));
    args.extend([
        "--udp-port".into(),
        udp.to_string(),
        "--peer-udp-port".into(),
        peer_udp.to_string(),
        "--json".into(),
    ]);
    args.extend(common::strings(extra));
    let p = Proc::ibal(name, &args);
    let t0 = Instant::now();
    while !udp_bound([127, 0, 0, 1], udp) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{name} never bound UDP {udp}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The CM attach and the listen follow the bind within milliseconds.
    std::thread::sleep(Duration::from_millis(200));
    p
}

/// `ibal pingpong --connect 127.0.0.1:CM --local 127.0.0.2`.
fn connector(name: &str, cm: u16, udp: u16, peer_udp: u16, extra: &[&str]) -> Proc {
    let mut args = common::strings(&["pingpong", "--connect"]);
    args.push(format!("127.0.0.1:{cm}"));
    args.extend(common::strings(&["--local", "127.0.0.2"]));
    args.extend([
        "--udp-port".into(),
        udp.to_string(),
        "--peer-udp-port".into(),
        peer_udp.to_string(),
        "--json".into(),
    ]);
    args.extend(common::strings(extra));
    Proc::ibal(name, &args)
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {}", p.name);
}

/// A successful side: exit 0, `n` connections of `iterations` round trips
/// in its JSON, nothing live at close.
fn assert_ok(d: &Done, n: usize, iterations: u32) {
    assert!(d.success(), "{}", d.log());
    let json = d.stdout.trim();
    assert_eq!(json_field(json, "live_after_close"), "0", "{}", d.log());
    assert_eq!(json.matches("\"peer\":").count(), n, "{}", d.log());
    assert_eq!(
        json.matches(&format!("\"iterations\":{iterations},"))
            .count(),
        n,
        "{}",
        d.log()
    );
}

/// A survivor: non-zero within `limit`, one of `reasons` in its error, and
/// its AL closed with nothing live.
fn assert_survivor(d: &Done, limit: Duration, reasons: &[&str]) {
    assert!(!d.killed, "not done within the bound: {}", d.log());
    assert!(!d.status.success(), "{}", d.log());
    assert!(d.took < limit, "took {:?}: {}", d.took, d.log());
    let err = d
        .stderr
        .lines()
        .find(|l| l.starts_with("ibal: "))
        .unwrap_or_else(|| panic!("no error line: {}", d.log()));
    assert!(
        reasons.iter().any(|r| err.contains(r)),
        "none of {reasons:?} in the error: {}",
        d.log()
    );
    assert!(
        err.contains("AL closed: no objects left live"),
        "the close is not reported clean: {}",
        d.log()
    );
    eprintln!("{} ended in {:.2} s: {err}", d.name, d.took.as_secs_f64());
}

/// The relay's counter `key` from its last stdout line.
fn relay_stat(d: &Done, key: &str) -> u64 {
    let at = d
        .stdout
        .find(&format!("{key}: "))
        .unwrap_or_else(|| panic!("no {key} in the relay's output: {}", d.log()));
    let rest = &d.stdout[at + key.len() + 2..];
    let end = rest.find([',', ' ', '}']).unwrap();
    rest[..end].parse().unwrap()
}

/// Connections through the relay: the listener (127.0.0.1:26011) serves
/// `--count 6`, a new connecting process (127.0.0.2:26012) runs 6 times;
/// every REQ, REP, RTU, DREQ, DREP and RC packet crosses the relay, which
/// drops, duplicates, reorders and delays 10% each. The LAN timers
/// (`cep::ip::LAN_TIMERS`: CM response 33.6 ms with 8 retries, ACK timeout
/// 67 ms) are far above the relay's worst lateness (2 ms of delay, 5 ms
/// held for reordering), so they need no change.
#[test]
fn connections_through_a_relay_with_ten_percent_of_each_fault() {
    let _g = serial();
    const N: usize = 6;
    const ITERS: u32 = 20;
    let (a, b, near_b, near_a) = (26011u16, 26012u16, 26021u16, 26022u16);
    let t0 = Instant::now();
    let mut relay = Proc::ibal(
        "relay",
        &common::strings(&[
            "relay",
            "--near-a",
            &format!("127.0.0.2:{near_a}"),
            "--near-b",
            &format!("127.0.0.1:{near_b}"),
            "--a",
            &format!("127.0.0.1:{a}"),
            "--b",
            &format!("127.0.0.2:{b}"),
            "--faults",
            "0.1",
            "--seed",
            "31",
            "--seconds",
            "100",
            "--idle-exit",
            "3",
        ]),
    );
    relay.wait_line("relay: ", Duration::from_secs(10));
    let l = listener(
        "listener",
        7601,
        a,
        near_a,
        &["--count", &N.to_string(), "--timeout", "20"],
    );
    let iters = ITERS.to_string();
    for k in 0..N {
        let c = connector(
            &format!("connecting side #{k}"),
            7601,
            b,
            near_b,
            &["--iterations", &iters, "--size", "3000", "--timeout", "20"],
        )
        .finish(BOUND);
        assert_ok(&c, 1, ITERS);
    }
    let l = l.finish(BOUND);
    assert_ok(&l, N, ITERS);
    let r = relay.finish(BOUND);
    assert!(r.success(), "{}", r.log());
    for key in ["dropped", "duplicated", "reordered", "delayed"] {
        assert!(relay_stat(&r, key) > 0, "no {key} datagram: {}", r.log());
    }
    eprintln!(
        "{N} connections of {ITERS} round trips through the relay in {:.1} s; relay: {}",
        t0.elapsed().as_secs_f64(),
        r.stdout.trim()
    );
}

const KILL_PORTS: (u16, u16) = (26031, 26032);

/// (a) The listener dies before it answers: it is stopped (SIGSTOP) so
/// the REQ waits in its socket, then SIGKILLed. The connecting side's REQ
/// retries run out: a timeout, non-zero exit, nothing leaked.
#[test]
fn listener_killed_while_connecting() {
    let _g = serial();
    let (lp, cp) = KILL_PORTS;
    let mut l = listener("listener", 7602, lp, cp, &["--timeout", "10"]);
    signal(&l, "-STOP");
    let c = connector("connecting side", 7602, cp, lp, &["--timeout", "10"]);
    std::thread::sleep(Duration::from_millis(100));
    l.kill();
    let c = c.finish(BOUND);
    drop(l.finish(BOUND));
    assert_survivor(
        &c,
        Duration::from_secs(15),
        &["no answer from 127.0.0.1:7602", "rejected", "refused"],
    );
}

/// (b) A peer dies mid ping-pong (1 s into 10^6 round trips): the
/// survivor's SEND ends with RetryExceeded (7 retries of 67 ms), or its
/// wait for the peer's SEND with `--timeout 4`.
fn killed_mid_transfer(kill_listener: bool) {
    let (lp, cp) = KILL_PORTS;
    let l = listener("listener", 7602, lp, cp, &["--timeout", "4"]);
    let c = connector(
        "connecting side",
        7602,
        cp,
        lp,
        &[
            "--iterations",
            "1000000",
            "--size",
            "1000",
            "--timeout",
            "4",
        ],
    );
    std::thread::sleep(Duration::from_millis(1000));
    let (mut victim, survivor) = if kill_listener { (l, c) } else { (c, l) };
    victim.kill();
    let d = survivor.finish(BOUND);
    drop(victim.finish(BOUND));
    assert_survivor(
        &d,
        Duration::from_secs(15),
        &["RetryExceeded", "stopped answering"],
    );
    // Mid-transfer: the failing iteration is not the first.
    assert!(!d.stderr.contains("iteration 0:"), "{}", d.log());
}

#[test]
fn peer_killed_while_connected() {
    let _g = serial();
    killed_mid_transfer(true);
    killed_mid_transfer(false);
}

/// (b') The connecting side dies while it holds an idle connection
/// (`--hold`, after the ping-pong, before its DREQ): the listener's wait
/// for the DREQ ends after `--timeout 3`, non-zero, clean.
#[test]
fn connecting_side_killed_while_holding_the_connection() {
    let _g = serial();
    let (lp, cp) = KILL_PORTS;
    let l = listener("listener", 7602, lp, cp, &["--timeout", "3"]);
    let mut c = connector(
        "connecting side",
        7602,
        cp,
        lp,
        &["--iterations", "10", "--timeout", "10", "--hold", "30"],
    );
    c.wait_line("holding the connection", Duration::from_secs(20));
    c.kill();
    let d = l.finish(BOUND);
    drop(c.finish(BOUND));
    assert_survivor(
        &d,
        Duration::from_secs(15),
        &["did not disconnect (DREQ never came)"],
    );
}

/// (c) The listener dies after the connecting side's DREQ reached it (it
/// holds before its DREP, `--hold`): the DREQ times out after the CM's
/// retries, and the connecting side, which checked every byte, still
/// exits 0, says the DREQ went unanswered, and leaks nothing.
#[test]
fn listener_killed_while_disconnecting() {
    let _g = serial();
    let (lp, cp) = KILL_PORTS;
    let mut l = listener(
        "listener",
        7602,
        lp,
        cp,
        &["--timeout", "10", "--hold", "30"],
    );
    let c = connector(
        "connecting side",
        7602,
        cp,
        lp,
        &["--iterations", "10", "--timeout", "10"],
    );
    l.wait_line("holding the connection", Duration::from_secs(20));
    l.kill();
    let d = c.finish(BOUND);
    drop(l.finish(BOUND));
    assert_ok(&d, 1, 10);
    assert!(d.stderr.contains("never answered our DREQ"), "{}", d.log());
    // 9 tries before the CM gives up on the DREQ (about 0.9 s measured:
    // each try waits the response timeout and the packet lifetime).
    let disc: f64 = json_field(d.stdout.trim(), "disconnect_us")
        .parse()
        .unwrap();
    assert!(disc > 250_000.0, "disconnected in {disc} us: {}", d.log());
    eprintln!("DREQ unanswered: disconnected in {:.0} ms", disc / 1000.0);
}

/// A listener killed (while connected) and started again on the same
/// address and ports: a new connecting process gets a working connection.
#[test]
fn a_restarted_listener_serves_new_connections() {
    let _g = serial();
    let (lp, cp) = (26041u16, 26042u16);
    let peer_qpn = |d: &Done| json_field(d.stdout.trim(), "peer_qpn").to_string();
    // 1: a clean connection; the listener stays for a second one.
    let l1 = listener(
        "listener 1",
        7603,
        lp,
        cp,
        &["--count", "2", "--timeout", "10"],
    );
    let c1 = connector("connecting side 1", 7603, cp, lp, &["--iterations", "50"]).finish(BOUND);
    assert_ok(&c1, 1, 50);
    // 2: the second connection; the listener is SIGKILLed mid-transfer.
    let c2 = connector(
        "connecting side 2",
        7603,
        cp,
        lp,
        &[
            "--iterations",
            "1000000",
            "--size",
            "1000",
            "--timeout",
            "4",
        ],
    );
    std::thread::sleep(Duration::from_millis(700));
    let mut l1 = l1;
    l1.kill();
    let c2 = c2.finish(BOUND);
    drop(l1.finish(BOUND));
    assert_survivor(
        &c2,
        Duration::from_secs(15),
        &["RetryExceeded", "stopped answering"],
    );
    // 3: a new listener on the same address and ports, a new connecting
    // process: both succeed.
    let l2 = listener(
        "listener 2",
        7603,
        lp,
        cp,
        &["--count", "2", "--timeout", "10"],
    );
    for k in 0..2 {
        let c3 = connector(
            &format!("connecting side 3.{k}"),
            7603,
            cp,
            lp,
            &["--iterations", "50"],
        )
        .finish(BOUND);
        assert_ok(&c3, 1, 50);
        eprintln!(
            "after the restart: listener QPN {} (before: {})",
            peer_qpn(&c3),
            peer_qpn(&c1)
        );
    }
    assert_ok(&l2.finish(BOUND), 2, 50);
}

/// A connecting process killed while connected and started again as a
/// restarted NIC would be: the same CA GUID and the same QP numbers
/// (`--guid`, `--first-qpn`). Its new REQ names the QPN of the connection
/// the listener still holds (idle, so nothing told the listener the peer
/// died): the listener's CM rejects the REQ as stale (REJ reason 10) and
/// ends the old connection (DREQ, unanswered, then released); a later try
/// of the restarted peer, on the same QPN, connects and runs. Before the
/// comm ids had a random start per process, the new REQ carried the old
/// comm id and was taken for a duplicate of the old REQ and ignored.
#[test]
fn a_peer_restarted_on_the_same_qpn_is_rejected_as_stale_and_the_old_connection_ends() {
    let _g = serial();
    let (lp, cp) = (26043u16, 26044u16);
    let l = listener(
        "listener",
        7604,
        lp,
        cp,
        &["--count", "2", "--timeout", "20"],
    );
    let same_nic = ["--guid", "0x24942414c50beef", "--first-qpn", "4660"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = same_nic.to_vec();
        v.extend_from_slice(extra);
        v
    };
    // 1: connected, ping-pong done, holding the connection: killed there.
    let c1 = connector(
        "connecting side 1",
        7604,
        cp,
        lp,
        &with(&["--iterations", "10", "--hold", "30"]),
    );
    let mut c1 = c1;
    c1.wait_line("holding the connection", Duration::from_secs(20));
    c1.kill();
    drop(c1.finish(BOUND));
    // 2: the same NIC again: its REQ names the held connection's QPN.
    let c2 = connector(
        "connecting side 2",
        7604,
        cp,
        lp,
        &with(&["--iterations", "10"]),
    )
    .finish(BOUND);
    assert_survivor(&c2, Duration::from_secs(10), &["StaleConnection"]);
    // 3: once the listener let the stale connection go (its DREQ retries
    // run out, ~1 s), the same QPN connects.
    let t0 = Instant::now();
    let c3 = loop {
        let c = connector(
            "connecting side 3",
            7604,
            cp,
            lp,
            &with(&["--iterations", "10"]),
        )
        .finish(BOUND);
        if c.success() || t0.elapsed() > Duration::from_secs(15) {
            break c;
        }
        assert!(c.stderr.contains("StaleConnection"), "{}", c.log());
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_ok(&c3, 1, 10);
    let l = l.finish(BOUND);
    assert_ok(&l, 2, 10);
    let json = l.stdout.trim();
    // Both connections came from QPN 4660; the first ended as stale.
    assert_eq!(json.matches("\"peer_qpn\":4660,").count(), 2, "{}", l.log());
    assert_eq!(json.matches("\"stale\":true").count(), 1, "{}", l.log());
    let first = json.find("\"stale\":true").unwrap();
    let second = json.find("\"stale\":false").unwrap();
    assert!(
        first < second,
        "the first connection is the stale one: {}",
        l.log()
    );
}
