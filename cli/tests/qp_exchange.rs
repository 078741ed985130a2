//! `ibal qp-exchange` as two processes on one host: the built binary runs
//! twice, one side on 127.0.0.1 and the other on 127.0.0.2 (distinct GIDs),
//! each with its own UDP port, and the TCP side channel on an ephemeral
//! port the server prints. RC, RC with RDMA WRITEs, UD; then the errors a
//! user meets (unreachable peer, a bad message, a silent peer). Every child
//! is killed after a bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ibal");
const BOUND: Duration = Duration::from_secs(60);

/// Wait for `child` at most `BOUND`, killing it after that.
fn finish(mut child: Child) -> Output {
    let t0 = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if t0.elapsed() > BOUND {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Start the server side; return it and the TCP port it listens on (read
/// from its "listening on" line on stderr; the rest of stderr is kept).
fn server(args: &[&str]) -> (Child, u16, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args([
            "qp-exchange",
            "--listen",
            "127.0.0.1:0",
            "--local",
            "127.0.0.1",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not print its listening address");
        };
        if let Some(addr) = line.strip_prefix("qp-exchange: listening on ") {
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            return (child, port, rx);
        }
    }
}

fn client(port: u16, args: &[&str]) -> Child {
    Command::new(BIN)
        .args(["qp-exchange", "--connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--local", "127.0.0.2"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the client")
}

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + key.len() + 3..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"')
}

/// Both sides with `extra`, server UDP `sport`, client UDP `cport`; both
/// must succeed and report `iters` checked messages (and WRITEs).
fn pair(sport: u16, cport: u16, extra: &[&str], iters: u32, writes: bool) {
    let (sp, cp, n) = (sport.to_string(), cport.to_string(), iters.to_string());
    let mut sargs = vec!["--udp-port", &sp, "--peer-udp-port", &cp, "--iters", &n];
    sargs.extend_from_slice(extra);
    sargs.push("--json");
    let (srv, tcp, srv_err) = server(&sargs);
    let mut cargs = vec!["--udp-port", &cp, "--peer-udp-port", &sp, "--iters", &n];
    cargs.extend_from_slice(extra);
    cargs.push("--json");
    let cli = finish(client(tcp, &cargs));
    let srv = finish(srv);
    let srv_log: Vec<String> = srv_err.try_iter().collect();
    for (who, out, log) in [
        (
            "client",
            &cli,
            String::from_utf8_lossy(&cli.stderr).to_string(),
        ),
        ("server", &srv, srv_log.join("\n")),
    ] {
        assert!(
            out.status.success(),
            "{who} failed ({:?}); stderr:\n{log}",
            out.status
        );
        let json = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(json_field(&json, "peer"), "ibal", "{who}: {json}");
        assert_eq!(json_field(&json, "messages_checked"), n, "{who}: {json}");
        assert_eq!(json_field(&json, "iters"), n, "{who}: {json}");
        assert_eq!(json_field(&json, "clean"), "true", "{who}: {json}");
        let w = if writes { n.as_str() } else { "0" };
        assert_eq!(json_field(&json, "writes_checked"), w, "{who}: {json}");
    }
}

#[test]
fn rc_two_processes() {
    pair(25101, 25102, &["--mode", "rc"], 300, false);
}

#[test]
fn rc_write_two_processes() {
    pair(
        25103,
        25104,
        &["--mode", "rc", "--write", "--size", "3000"],
        200,
        true,
    );
}

#[test]
fn ud_two_processes() {
    pair(
        25105,
        25106,
        &["--mode", "ud", "--size", "1000"],
        300,
        false,
    );
}

fn failing(child: Child) -> String {
    let out = finish(child);
    assert!(!out.status.success(), "should have failed");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn unreachable_peer_is_reported() {
    // A port nobody listens on: bind one, note it, close it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = failing(client(port, &["--udp-port", "25111", "--timeout", "2"]));
    assert!(err.contains("unreachable"), "{err}");
}

#[test]
fn bad_message_is_reported() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let c = client(port, &["--udp-port", "25112", "--timeout", "5"]);
    let (mut s, _) = l.accept().unwrap();
    let mut msg = [0u8; 52];
    s.read_exact(&mut msg).unwrap();
    assert_eq!(msg[51], 0, "the client's message is NUL-terminated");
    assert_eq!(msg[4], b':');
    let mut garbage = [b'x'; 52];
    garbage[51] = 0;
    s.write_all(&garbage).unwrap();
    let err = failing(c);
    assert!(err.contains("bad message from the peer"), "{err}");
    assert!(err.contains("LID:QPN:PSN:GID"), "{err}");
}

#[test]
fn silent_peer_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t0 = Instant::now();
    let c = client(port, &["--udp-port", "25113", "--timeout", "1"]);
    let (_s, _) = l.accept().unwrap();
    let err = failing(c);
    assert!(err.contains("timed out"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[test]
fn write_needs_an_ibal_peer_with_write() {
    // One side with --write, the other without: both refuse, clearly.
    let (srv, tcp, _e) = server(&["--udp-port", "25114", "--peer-udp-port", "25115", "--write"]);
    let err = failing(client(
        tcp,
        &["--udp-port", "25115", "--peer-udp-port", "25114"],
    ));
    assert!(err.contains("--write must be given on both sides"), "{err}");
    let out = finish(srv);
    assert!(!out.status.success());
}

/// ibal against a side playing a plain ibv tool (`--plain`: no extension,
/// the socket closed after `done`, a 0x7b-filled buffer that echoes):
/// ibal must see EOF where the extension would be, fall back to the
/// tools' data rules (as a client its own messages echoed; as a server
/// 0x7b first, then its own previous message) and check every message.
fn against_plain(sport: u16, cport: u16, plain_is_server: bool, extra: &[&str]) {
    let iters = "150";
    let (sp, cp) = (sport.to_string(), cport.to_string());
    let mut sargs = vec![
        "--udp-port",
        &sp,
        "--peer-udp-port",
        &cp,
        "--iters",
        iters,
        "--json",
    ];
    let mut cargs = vec![
        "--udp-port",
        &cp,
        "--peer-udp-port",
        &sp,
        "--iters",
        iters,
        "--json",
    ];
    sargs.extend_from_slice(extra);
    cargs.extend_from_slice(extra);
    if plain_is_server {
        sargs.push("--plain");
    } else {
        cargs.push("--plain");
    }
    let (srv, tcp, srv_err) = server(&sargs);
    let cli = finish(client(tcp, &cargs));
    let srv = finish(srv);
    let srv_log = srv_err.try_iter().collect::<Vec<_>>().join("\n");
    let cli_log = String::from_utf8_lossy(&cli.stderr).to_string();
    assert!(srv.status.success(), "server failed; stderr:\n{srv_log}");
    assert!(cli.status.success(), "client failed; stderr:\n{cli_log}");
    let ibal = if plain_is_server { &cli } else { &srv };
    let json = String::from_utf8_lossy(&ibal.stdout).to_string();
    assert_eq!(json_field(&json, "peer"), "ibv", "{json}");
    assert_eq!(json_field(&json, "messages_checked"), iters, "{json}");
    assert_eq!(json_field(&json, "clean"), "true", "{json}");
}

#[test]
fn rc_client_against_a_plain_server() {
    against_plain(25121, 25122, true, &["--mode", "rc"]);
}

#[test]
fn rc_server_against_a_plain_client() {
    against_plain(25123, 25124, false, &["--mode", "rc"]);
}

#[test]
fn ud_client_against_a_plain_server() {
    against_plain(25125, 25126, true, &["--mode", "ud", "--size", "512"]);
}

#[test]
fn ud_server_against_a_plain_client() {
    against_plain(25127, 25128, false, &["--mode", "ud", "--size", "512"]);
}

#[test]
fn a_peer_that_never_acknowledges_is_reported() {
    // The side channel answers like a tool, but nothing listens on the
    // UDP port the address leads to: the RC SEND runs out of retries.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let c = client(
        port,
        &[
            "--udp-port",
            "25131",
            "--peer-udp-port",
            "25132",
            "--timeout",
            "10",
        ],
    );
    let (mut s, _) = l.accept().unwrap();
    let mut msg = [0u8; 52];
    s.read_exact(&mut msg).unwrap();
    let mut reply = [0u8; 52];
    reply[..51].copy_from_slice(b"0000:000123:000000:00000000000000000000ffff7f000001");
    s.write_all(&reply).unwrap();
    let mut done = [0u8; 5];
    s.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done\0");
    drop(s);
    let err = failing(c);
    assert!(err.contains("RetryExceeded"), "{err}");
    assert!(err.contains("never acknowledged"), "{err}");
}

/// `--rdma-bulk`: the client RDMA WRITEs 2 MiB into the server's buffer and
/// RDMA READs 2 MiB back (2048 packets each way at MTU 1024); both sides
/// check the data and report it.
#[test]
fn rdma_bulk_two_processes() {
    let (srv, tcp, srv_err) = server(&[
        "--udp-port",
        "25141",
        "--peer-udp-port",
        "25142",
        "--rdma-bulk",
        "2M",
        "--json",
    ]);
    let cli = finish(client(
        tcp,
        &[
            "--udp-port",
            "25142",
            "--peer-udp-port",
            "25141",
            "--rdma-bulk",
            "2M",
            "--json",
        ],
    ));
    let srv = finish(srv);
    let srv_log: Vec<String> = srv_err.try_iter().collect();
    for (who, out, log) in [
        (
            "client",
            &cli,
            String::from_utf8_lossy(&cli.stderr).to_string(),
        ),
        ("server", &srv, srv_log.join("\n")),
    ] {
        assert!(
            out.status.success(),
            "{who} failed ({:?}); stderr:\n{log}",
            out.status
        );
        let json = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(json_field(&json, "size"), "2097152", "{who}: {json}");
        assert_eq!(json_field(&json, "packets"), "2048", "{who}: {json}");
        assert_eq!(json_field(&json, "checked"), "2097152", "{who}: {json}");
        assert_eq!(
            json_field(&json, "verdict"),
            "ibal-qpx/1 bulk-verdict ok checked=2097152",
            "{who}: {json}"
        );
        assert_eq!(json_field(&json, "clean"), "true", "{who}: {json}");
    }
    let log = String::from_utf8_lossy(&cli.stderr);
    assert!(log.contains("RDMA READ completed"), "{log}");
}

/// `--rdma-bulk` needs the same mode and size on both sides, and says so.
#[test]
fn rdma_bulk_needs_a_bulk_peer_of_the_same_size() {
    let (srv, tcp, _e) = server(&[
        "--udp-port",
        "25143",
        "--peer-udp-port",
        "25144",
        "--rdma-bulk",
        "64K",
        "--timeout",
        "5",
    ]);
    let err = failing(client(
        tcp,
        &[
            "--udp-port",
            "25144",
            "--peer-udp-port",
            "25143",
            "--rdma-bulk",
            "128K",
            "--timeout",
            "5",
        ],
    ));
    assert!(
        err.contains("the peer runs mode=rc bulk=65536") && err.contains("--rdma-bulk 131072"),
        "{err}"
    );
    let _ = finish(srv);
    let (srv, tcp, _e) = server(&[
        "--udp-port",
        "25145",
        "--peer-udp-port",
        "25146",
        "--timeout",
        "5",
    ]);
    let err = failing(client(
        tcp,
        &[
            "--udp-port",
            "25146",
            "--peer-udp-port",
            "25145",
            "--rdma-bulk",
            "64K",
            "--timeout",
            "5",
        ],
    ));
    assert!(err.contains("the peer runs mode=rc bulk=0"), "{err}");
    let _ = finish(srv);
}
