//! `ibal qp-exchange` between two network namespaces joined by a veth
//! pair (issue 14, deliver 8): a real (virtual) Ethernet link with its own
//! addresses, each side on the default RoCEv2 UDP port 4791 as two hosts
//! would be, RC with RDMA WRITEs and UD.
//!
//! Needs root and `ip netns`; otherwise the test prints why and passes
//! without running (a skip). The namespaces are `ibal-qpx-<pid>-a` and
//! `-b` with 10.77.0.1/24 and 10.77.0.2/24 on `qpx0`/`qpx1`; the veth is
//! created inside namespace a with its peer moved straight into b, so no
//! interface of the host is created, moved or changed (the test checks
//! that no `qpx*` interface ever shows among the host's). A guard deletes both
//! namespaces (which deletes the veth) when the test ends, panics
//! included, and a run first deletes namespaces left by a run whose
//! process is gone, a zombie or another program now (killed before its
//! guard ran).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{json_field, listening_port, Proc, BIN};

const PREFIX: &str = "ibal-qpx-";
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

fn namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Why the test cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    if euid() != Some(0) {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    if let Err(e) = ip(&["netns", "list"]) {
        return Some(format!("`ip netns` is unavailable: {e}"));
    }
    None
}

/// Whether `pid` is a live (not zombie) run of this test binary.
fn test_process_alive(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
    if state.starts_with('Z') || state.starts_with('X') {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("netns_two_process"))
        .unwrap_or(false)
}

/// Deletes namespaces of earlier runs whose process is gone.
fn remove_stale() {
    for ns in namespaces() {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if !test_process_alive(pid) {
            eprintln!("removing {ns}, left by process {pid} which is gone");
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

/// The two namespaces, deleted on drop.
struct Netns {
    a: String,
    b: String,
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let pid = std::process::id();
        let n = Netns {
            a: format!("{PREFIX}{pid}-a"),
            b: format!("{PREFIX}{pid}-b"),
        };
        // From here on, whatever fails, drop removes what exists.
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        ip(&[
            "-n", &n.a, "link", "add", "qpx0", "type", "veth", "peer", "name", "qpx1", "netns",
            &n.b,
        ])?;
        for (ns, dev, addr) in [
            (&n.a, "qpx0", "10.77.0.1/24"),
            (&n.b, "qpx1", "10.77.0.2/24"),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            if let Err(e) = ip(&["netns", "del", ns]) {
                if namespaces().contains(ns) {
                    eprintln!("could not remove namespace {ns}: {e}");
                }
            }
        }
    }
}

fn qpx(ns: &str, name: &str, args: &[&str]) -> Proc {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, BIN, "qp-exchange"])
        .args(args);
    Proc::spawn(name, cmd)
}

/// One exchange: a listens on 10.77.0.1, b connects from 10.77.0.2.
fn exchange(n: &Netns, extra: &[&str], iters: u32, writes: bool) {
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
    remove_stale();
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
    let (a_name, b_name);
    {
        let n = match Netns::create() {
            Ok(n) => n,
            Err(e) => {
                // Drop has removed whatever was made.
                eprintln!("SKIPPED qp_exchange_between_two_network_namespaces: {e}");
                return;
            }
        };
        (a_name, b_name) = (n.a.clone(), n.b.clone());
        assert!(!host_has_ours(), "a veth end is in the host's namespace");
        exchange(
            &n,
            &["--mode", "rc", "--write", "--size", "4096"],
            300,
            true,
        );
        exchange(&n, &["--mode", "ud", "--size", "1024"], 300, false);
    }
    let left = namespaces();
    assert!(
        !left.contains(&a_name) && !left.contains(&b_name),
        "namespaces left behind: {left:?}"
    );
    assert!(!host_has_ours(), "a veth end is in the host's namespace");
}
