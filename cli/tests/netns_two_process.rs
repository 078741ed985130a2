//! `ibal qp-exchange` between two network namespaces joined by a veth
//! pair (issue 14, deliver 8): a real (virtual) Ethernet link with its own
//! addresses, each side on the default RoCEv2 UDP port 4791 as two hosts
//! would be, RC with RDMA WRITEs and UD.
//!
//! Needs root, `ip`, `unshare` and `nsenter`; otherwise the test prints
//! why (`SKIPPED ...`) and passes without running. The namespaces are
//! anonymous, each held by `unshare --net -- cat` reading a pipe from the
//! test, not named ones (`ip netns add` makes a bind mount that outlives a
//! killed test): when the test ends, or panics, or is SIGKILLed, the pipe
//! closes, the holders exit and the namespaces go with their last process,
//! the veth with them. Nothing can be left behind longer than the
//! qp-exchange processes inside (bounded by their `--timeout`). The veth
//! (`qpx0` 10.77.0.1/24, `qpx1` 10.77.0.2/24) is created with both ends
//! already in their namespaces, so no interface of the host is created,
//! moved or changed; the test checks that no `qpx*` interface ever shows
//! among the host's.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{json_field, listening_port, Proc, BIN};

const BOUND: Duration = Duration::from_secs(60);

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Why the test cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    if euid() != Some(0) {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    for tool in ["ip", "unshare", "nsenter"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    None
}

/// An anonymous network namespace, alive as long as its holder: `unshare
/// --net -- cat` reading a pipe from this process. Dropping it (or this
/// process dying, even by SIGKILL: the pipe closes, `cat` reads EOF)
/// ends the holder, and the namespace, with whatever interfaces it has,
/// goes with the last process in it.
struct Netns {
    holder: Child,
}

impl Netns {
    fn new() -> Result<Netns, String> {
        let holder = Command::new("unshare")
            .args(["--net", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("unshare: {e}"))?;
        let mut ns = Netns { holder };
        // unshare(2) happens before the exec of cat, same pid: wait until
        // the pid's namespace is not ours any more.
        let ours = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = ns.holder.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = ns.holder.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!("unshare --net failed ({status:?}): {}", err.trim()));
            }
            match std::fs::read_link(ns.path()) {
                Ok(link) if link != ours => return Ok(ns),
                _ if Instant::now() > deadline => {
                    return Err("unshare --net did not make a namespace within 5 s".into())
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn pid(&self) -> String {
        self.holder.id().to_string()
    }

    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.id())
    }

    /// `nsenter --net=... PROGRAM` in this namespace.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path())).arg(program);
        cmd
    }

    fn ip(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command("ip")
            .args(args)
            .output()
            .map_err(|e| format!("nsenter ip: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "ip {} (in the namespace): {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        drop(self.holder.stdin.take());
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Two namespaces joined by a veth: `qpx0` 10.77.0.1/24 in a, `qpx1`
/// 10.77.0.2/24 in b. The pair is created with both ends already in their
/// namespaces (`ip link add qpx0 netns A type veth peer name qpx1 netns
/// B`), so it never exists in the host's.
struct Pair {
    a: Netns,
    b: Netns,
}

impl Pair {
    fn new() -> Result<Pair, String> {
        let (a, b) = (Netns::new()?, Netns::new()?);
        let (pa, pb) = (a.pid(), b.pid());
        ip(&[
            "link", "add", "qpx0", "netns", &pa, "type", "veth", "peer", "name", "qpx1", "netns",
            &pb,
        ])?;
        for (ns, dev, addr) in [(&a, "qpx0", "10.77.0.1/24"), (&b, "qpx1", "10.77.0.2/24")] {
            ns.ip(&["addr", "add", addr, "dev", dev])?;
            ns.ip(&["link", "set", dev, "up"])?;
            ns.ip(&["link", "set", "lo", "up"])?;
        }
        Ok(Pair { a, b })
    }
}

fn qpx(ns: &Netns, name: &str, args: &[&str]) -> Proc {
    let mut cmd = ns.command(BIN);
    cmd.arg("qp-exchange").args(args);
    Proc::spawn(name, cmd)
}

/// One exchange: a listens on 10.77.0.1, b connects from 10.77.0.2.
fn exchange(n: &Pair, extra: &[&str], iters: u32, writes: bool) {
    let it = iters.to_string();
    let mut common = vec!["--iters", &it, "--timeout", "20", "--json"];
    common.extend_from_slice(extra);
    let mut sargs = vec!["--listen", "10.77.0.1:0", "--local", "10.77.0.1"];
    sargs.extend_from_slice(&common);
    let mut a = qpx(&n.a, "a (10.77.0.1, server)", &sargs);
    let port = listening_port(&a.wait_line("listening on", Duration::from_secs(20)));
    let target = format!("10.77.0.1:{port}");
    let mut cargs = vec!["--connect", &target, "--local", "10.77.0.2"];
    cargs.extend_from_slice(&common);
    let b = qpx(&n.b, "b (10.77.0.2, client)", &cargs);
    let b = b.finish(BOUND);
    let a = a.finish(BOUND);
    for d in [&a, &b] {
        assert!(d.success(), "{extra:?}: {}", d.log());
        let json = d.stdout.trim();
        assert_eq!(json_field(json, "messages_checked"), it, "{}", d.log());
        let w = if writes { it.as_str() } else { "0" };
        assert_eq!(json_field(json, "writes_checked"), w, "{}", d.log());
        assert_eq!(json_field(json, "clean"), "true", "{}", d.log());
    }
    assert_eq!(
        json_field(a.stdout.trim(), "gid"),
        "::ffff:10.77.0.1",
        "{}",
        a.log()
    );
    eprintln!(
        "{extra:?}: {iters} round trips between the namespaces in {:.1} s",
        b.took.as_secs_f64()
    );
}

#[test]
fn qp_exchange_between_two_network_namespaces() {
    if let Some(why) = cannot_run() {
        eprintln!("SKIPPED qp_exchange_between_two_network_namespaces: {why}");
        return;
    }
    // The veth's ends never appear among the host's interfaces (other
    // users may add or remove theirs meanwhile, so only ours are checked).
    let host_has_ours = || {
        ip(&["-o", "link", "show"])
            .unwrap()
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .any(|n| n.trim().starts_with("qpx"))
    };
    assert!(!host_has_ours(), "the host already has a qpx* interface");
    let holders;
    {
        let n = match Pair::new() {
            Ok(n) => n,
            Err(e) => {
                // Dropping what was made removed it.
                eprintln!("SKIPPED qp_exchange_between_two_network_namespaces: {e}");
                return;
            }
        };
        holders = [n.a.pid(), n.b.pid()];
        assert!(!host_has_ours(), "a veth end is in the host's namespace");
        exchange(
            &n,
            &["--mode", "rc", "--write", "--size", "4096"],
            300,
            true,
        );
        exchange(&n, &["--mode", "ud", "--size", "1024"], 300, false);
    }
    for pid in holders {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the namespace holder {pid} is still there"
        );
    }
    assert!(!host_has_ours(), "a veth end is in the host's namespace");
}
