//! The listening end as the active end sees it: in this process
//! ([`Peer::Local`]), or a second `ibal` process ([`Peer::Child`], `ibal
//! perf scale-listener`) driven over its stdin and stdout one line per
//! command: `echo N` (answered `ready` once the receives are posted, then
//! `echoed`), `report` (`report key=value ...`), `close` (`closed
//! key=value ...`). A line `error TEXT` answers a command that failed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Lines, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use super::config::QUEUE_DEPTH;
use super::measure::{cpu_time, rss_bytes};
use super::passive::Passive;
use crate::BenchResult;

/// What the listening end reports about itself.
#[derive(Debug, Clone, Default)]
pub struct PeerReport {
    /// Its process's resident memory (0 in one process: the active end's
    /// figure covers both).
    pub rss: u64,
    /// Its process's CPU time (0 in one process).
    pub cpu: Duration,
    pub accepted: u64,
    pub established: u64,
    pub disconnect_requests: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Live objects of its AL.
    pub live_objects: u64,
    /// Connections its CM agents hold.
    pub cm_connections: u64,
    /// MADs its CM agents sent.
    pub mads_sent: u64,
    /// Its QPs' footprint: (access layer, provider) bytes each.
    pub qp_footprint: (u64, u64),
}

/// How the listening end's AL close went.
#[derive(Debug, Clone, Default)]
pub struct PeerClose {
    pub took: Duration,
    /// Objects the close left live (0: clean).
    pub left_live: u64,
}

/// The listening end.
pub(crate) enum Peer {
    Local { passive: Passive, posted: bool },
    Child(ChildPeer),
}

/// A running echo.
pub(crate) enum EchoRun {
    Local(JoinHandle<BenchResult<()>>),
    Child,
}

impl Peer {
    /// Starts answering `iters` pings; returns once the receives are posted.
    pub(crate) fn echo(&mut self, iters: u32) -> BenchResult<EchoRun> {
        match self {
            Peer::Local { passive, posted } => {
                let echo = passive.echo()?;
                if !*posted {
                    echo.post_receives(QUEUE_DEPTH)?;
                    *posted = true;
                }
                Ok(EchoRun::Local(std::thread::spawn(move || echo.run(iters))))
            }
            Peer::Child(c) => {
                c.command(&format!("echo {iters}"), "ready")?;
                Ok(EchoRun::Child)
            }
        }
    }

    /// Waits for the echo to finish.
    pub(crate) fn echo_done(&mut self, run: EchoRun) -> BenchResult<()> {
        match (self, run) {
            (_, EchoRun::Local(h)) => h.join().map_err(|_| "the echo thread panicked")?,
            (Peer::Child(c), EchoRun::Child) => c.answer("echoed").map(|_| ()),
            (Peer::Local { .. }, EchoRun::Child) => Err("no echo runs".into()),
        }
    }

    pub(crate) fn report(&mut self) -> BenchResult<PeerReport> {
        match self {
            Peer::Local { passive, .. } => Ok(local_report(passive, false)),
            Peer::Child(c) => {
                let kv = c.command("report", "report")?;
                Ok(PeerReport {
                    rss: num(&kv, "rss")?,
                    cpu: Duration::from_nanos(num(&kv, "cpu_ns")?),
                    accepted: num(&kv, "accepted")?,
                    established: num(&kv, "established")?,
                    disconnect_requests: num(&kv, "disconnect_requests")?,
                    errors: num(&kv, "errors")?,
                    first_error: kv.get("first_error").map(|e| e.replace('\u{1f}', " ")),
                    live_objects: num(&kv, "live_objects")?,
                    cm_connections: num(&kv, "cm_connections")?,
                    mads_sent: num(&kv, "mads_sent")?,
                    qp_footprint: (num(&kv, "qp_al_bytes")?, num(&kv, "qp_provider_bytes")?),
                })
            }
        }
    }

    /// Closes the listening end's AL.
    pub(crate) fn close(self) -> BenchResult<PeerClose> {
        match self {
            Peer::Local { passive, .. } => {
                let (took, stats) = passive.end.close()?;
                Ok(PeerClose {
                    took,
                    left_live: stats.total_live() as u64,
                })
            }
            Peer::Child(mut c) => {
                let kv = c.command("close", "closed")?;
                let _ = c.process.wait();
                Ok(PeerClose {
                    took: Duration::from_nanos(num(&kv, "took_ns")?),
                    left_live: num(&kv, "left_live")?,
                })
            }
        }
    }

    /// kill -9 of the listening process.
    pub(crate) fn kill(self) -> BenchResult<()> {
        match self {
            Peer::Local { .. } => Err("the listener runs in this process".into()),
            Peer::Child(mut c) => {
                c.process
                    .kill()
                    .map_err(|e| format!("killing the listener: {e}"))?;
                let _ = c.process.wait();
                Ok(())
            }
        }
    }
}

/// The listening end's report on itself.
pub(crate) fn local_report(passive: &Passive, own_process: bool) -> PeerReport {
    let c = &passive.counts;
    PeerReport {
        rss: if own_process { rss_bytes() } else { 0 },
        cpu: if own_process {
            cpu_time()
        } else {
            Duration::ZERO
        },
        accepted: c.accepted.load(Ordering::Relaxed),
        established: c.established.load(Ordering::Relaxed),
        disconnect_requests: c.disconnect_requests.load(Ordering::Relaxed),
        errors: c.errors.load(Ordering::Relaxed),
        first_error: c.first_error.get().cloned(),
        live_objects: passive.end.stats().total_live() as u64,
        cm_connections: passive.end.cm_connections() as u64,
        mads_sent: passive.end.mads_sent(),
        qp_footprint: passive
            .qp_footprint()
            .map_or((0, 0), |(a, p)| (a as u64, p as u64)),
    }
}

/// The `report` line of [`local_report`].
pub(crate) fn report_line(r: &PeerReport) -> String {
    let mut line = format!(
        "report rss={} cpu_ns={} accepted={} established={} disconnect_requests={} errors={} live_objects={} cm_connections={} mads_sent={} qp_al_bytes={} qp_provider_bytes={}",
        r.rss,
        r.cpu.as_nanos(),
        r.accepted,
        r.established,
        r.disconnect_requests,
        r.errors,
        r.live_objects,
        r.cm_connections,
        r.mads_sent,
        r.qp_footprint.0,
        r.qp_footprint.1
    );
    if let Some(e) = &r.first_error {
        // One token: the line is split at spaces.
        line.push_str(&format!(" first_error={}", e.replace(' ', "\u{1f}")));
    }
    line
}

fn num(kv: &BTreeMap<String, String>, key: &str) -> BenchResult<u64> {
    kv.get(key)
        .ok_or_else(|| format!("the listener's answer has no {key}"))?
        .parse()
        .map_err(|e| format!("the listener's {key}: {e}"))
}

/// The listener as a second process.
pub(crate) struct ChildPeer {
    process: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Where its RoCEv2 port listens.
    pub(crate) addr: SocketAddr,
}

impl ChildPeer {
    /// Starts `exe perf scale-listener` on `bind`, whose peer is `peer`.
    pub(crate) fn spawn(
        exe: &Path,
        bind: IpAddr,
        peer: SocketAddr,
        connections: u32,
    ) -> BenchResult<ChildPeer> {
        let mut process = Command::new(exe)
            .args([
                "perf",
                "scale-listener",
                "--bind",
                &bind.to_string(),
                "--peer",
                &peer.to_string(),
                "--connections",
                &connections.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the listener process {}: {e}", exe.display()))?;
        let stdin = process.stdin.take().ok_or("the listener's stdin")?;
        let stdout = process.stdout.take().ok_or("the listener's stdout")?;
        let mut child = ChildPeer {
            process,
            stdin,
            lines: BufReader::new(stdout).lines(),
            addr: peer,
        };
        let kv = child.answer("listening")?;
        child.addr = kv
            .get("addr")
            .ok_or("the listener did not say where it listens")?
            .parse()
            .map_err(|e| format!("the listener's address: {e}"))?;
        Ok(child)
    }

    fn command(&mut self, line: &str, expect: &str) -> BenchResult<BTreeMap<String, String>> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to the listener: {e}"))?;
        self.answer(expect)
    }

    /// The next line, which must start with `expect`; its `key=value` words.
    fn answer(&mut self, expect: &str) -> BenchResult<BTreeMap<String, String>> {
        let line = match self.lines.next() {
            Some(Ok(l)) => l,
            Some(Err(e)) => return Err(format!("reading from the listener: {e}")),
            None => return Err("the listener process ended".into()),
        };
        let mut words = line.split(' ');
        match words.next() {
            Some(w) if w == expect => Ok(words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()),
            Some("error") => Err(format!("the listener: {}", &line[6.min(line.len())..])),
            _ => Err(format!("the listener said {line:?}, not {expect}")),
        }
    }
}

impl Drop for ChildPeer {
    fn drop(&mut self) {
        // A run that failed half-way must not leave the process behind.
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}
