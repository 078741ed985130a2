//! Helpers for the tests that run `ibal` as separate processes
//! (`faults_two_process.rs`, `netns_two_process.rs`,
//! `capture_two_process.rs`, `capture_cm_two_process.rs`, ...; `tshark`
//! for the capture tests): spawn with stderr collected line by line on
//! a thread, wait for a line, finish within a bound (killed after it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod tshark;

pub const BIN: &str = env!("CARGO_BIN_EXE_ibal");

/// A child process whose stderr lines arrive on `lines` (and are kept in
/// `seen` once looked at) and whose stdout is read at the end.
pub struct Proc {
    pub name: String,
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

/// What a process left behind.
pub struct Done {
    pub name: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From `Proc::spawn` to its exit.
    pub took: Duration,
    /// Whether it had to be killed after the bound.
    pub killed: bool,
}

impl Done {
    pub fn success(&self) -> bool {
        self.status.success() && !self.killed
    }
    /// Everything, for an assertion message.
    pub fn log(&self) -> String {
        format!(
            "--- {} ({:?}{}, {:.1} s) stdout:\n{}\n--- stderr:\n{}",
            self.name,
            self.status,
            if self.killed {
                ", killed after the bound"
            } else {
                ""
            },
            self.took.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

impl Proc {
    /// Starts `cmd` with piped stdout and stderr.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Proc {
            name: name.to_string(),
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// `ibal ARGS...`.
    pub fn ibal(name: &str, args: &[String]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        Proc::spawn(name, cmd)
    }

    /// Waits at most `limit` for a stderr line containing `needle`; returns it.
    /// Panics (after killing the child) when it does not come.
    pub fn wait_line(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let rest: Vec<String> = self.lines.try_iter().collect();
                    panic!(
                        "{}: no stderr line with {needle:?} within {limit:?}; stderr:\n{}\n{}",
                        self.name,
                        self.seen.join("\n"),
                        rest.join("\n")
                    );
                }
            }
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits at most `bound` (then kills) and collects the output.
    pub fn finish(mut self, bound: Duration) -> Done {
        let t0 = Instant::now();
        let mut killed = false;
        while self.child.try_wait().expect("try_wait").is_none() {
            if t0.elapsed() > bound {
                let _ = self.child.kill();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = self.child.wait().expect("wait");
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        // The reader thread ends at EOF, which came with the exit.
        let mut lines = std::mem::take(&mut self.seen);
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            lines.push(l);
        }
        Done {
            name: std::mem::take(&mut self.name),
            status,
            stdout,
            stderr: lines.join("\n"),
            took: t0.elapsed(),
            killed,
        }
    }
}

impl Drop for Proc {
    /// A test that panics half-way leaves no process behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `"key":value` out of a flat JSON object (value without quotes).
pub fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + key.len() + 3..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"')
}

/// `"outer":{..."key":value...}` out of the report (one level of nesting).
pub fn json_nested<'a>(json: &'a str, outer: &str, key: &str) -> &'a str {
    let at = json
        .find(&format!("\"{outer}\":{{"))
        .unwrap_or_else(|| panic!("no {outer} in {json}"));
    let inner = &json[at..];
    let end = inner.find('}').unwrap();
    json_field(&inner[..=end], key)
}

/// The TCP port out of `qp-exchange: listening on IP:PORT`.
pub fn listening_port(line: &str) -> u16 {
    line.rsplit(':').next().unwrap().trim().parse().unwrap()
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}
