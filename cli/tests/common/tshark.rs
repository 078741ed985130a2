//! tshark on lo for the capture tests (`capture_two_process.rs`,
//! `capture_cm_two_process.rs`): whether it can run here, and a capture of
//! two UDP ports while the test runs, read back decoded as InfiniBand.

use std::process::Command;
use std::time::Duration;

use super::Proc;

/// Why tshark is not usable here, if it is not.
pub fn missing() -> Option<String> {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("tshark --version failed: {:?}", o.status)),
        Err(e) => Some(format!("tshark is not installed ({e})")),
    }
}

/// Why tshark cannot capture on lo here (not root and dumpcap without
/// the capabilities, typically), if it cannot: a one-second probe.
pub fn cannot_capture(tag: &str) -> Option<String> {
    let file = std::env::temp_dir().join(format!("ibal-{tag}-{}-probe.pcapng", std::process::id()));
    let mut cmd = Command::new("tshark");
    cmd.args(["-q", "-i", "lo", "-c", "1", "-a", "duration:1", "-w"])
        .arg(&file);
    let d = Proc::spawn("tshark probe", cmd).finish(Duration::from_secs(15));
    let _ = std::fs::remove_file(&file);
    if d.success() {
        return None;
    }
    // tshark says much; keep what is about capturing.
    let said: Vec<&str> = d
        .stderr
        .lines()
        .filter(|l| l.contains("capture on") || l.contains("socket:"))
        .collect();
    Some(format!(
        "tshark cannot capture on lo ({:?}): {}",
        d.status,
        if said.is_empty() {
            d.stderr.lines().last().unwrap_or("").to_string()
        } else {
            said.join(" ")
        }
        .trim()
    ))
}

/// Captures lo (UDP to either of `ports`) while `run` goes, then reads the
/// capture back with both ports decoded as InfiniBand: one row per packet
/// with a BTH, `fields` in order, split at `sep` (tshark's `-E
/// separator`), with `read_opts` added to the read (e.g. `-E
/// occurrence=f`).
pub fn capture_rows(
    tag: &str,
    ports: (u16, u16),
    run: impl FnOnce(),
    read_opts: &[&str],
    fields: &[&str],
    sep: char,
) -> Vec<Vec<String>> {
    let file = std::env::temp_dir().join(format!("ibal-{tag}-{}.pcapng", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let filter = format!("udp dst port {} or udp dst port {}", ports.0, ports.1);
    let mut cmd = Command::new("tshark");
    cmd.args(["-q", "-i", "lo", "-f", &filter, "-a", "duration:50", "-w"])
        .arg(&file);
    let mut t = Proc::spawn("tshark", cmd);
    t.wait_line("Capturing on", Duration::from_secs(20));
    // dumpcap reports before its first read; give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    run();
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-INT", &t.child.id().to_string()])
        .status();
    let t = t.finish(Duration::from_secs(20));
    assert!(!t.killed, "tshark did not stop on SIGINT: {}", t.log());
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(&file);
    for p in [ports.0, ports.1] {
        cmd.args(["-d", &format!("udp.port=={p},infiniband")]);
    }
    cmd.args(["-Y", "infiniband.bth.opcode", "-T", "fields", "-E"])
        .arg(format!("separator={sep}"))
        .args(read_opts);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark -r");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "tshark -r: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let row: Vec<String> = l.split(sep).map(str::to_string).collect();
            assert_eq!(row.len(), fields.len(), "{l}");
            row
        })
        .collect()
}
