//! `--status SECS`: the long-running modes (`pingpong --listen`, `rping
//! -s`, `stress`) print a snapshot of their objects every SECS seconds
//! ([`al::AlInstance::snapshot`], in the shape of `rdma res show`; with
//! `--json`, one JSON object per line), on stderr, so that stdout keeps
//! the command's own report.
//!
//! A thread of its own does the printing: the mode's threads are never
//! held up, and a snapshot takes no lock they wait for. It stops when its
//! [`StatusPrinter`] is dropped, which each mode does before it closes its
//! AL. No signal (SIGUSR1) trigger: that needs `unsafe` FFI to install a
//! handler (no dependency here offers one), and the interval serves.

use std::io::Write as _;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use al::sync::Arc;
use al::{Al, AlInstance, Snapshot};

/// How often and how to print.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatusConfig {
    /// Time between two snapshots (the first comes after one interval).
    pub every: Duration,
    /// One JSON object per snapshot and line instead of text.
    pub json: bool,
}

impl StatusConfig {
    /// From `--status SECS` and `--json`: `None` without `--status`.
    pub fn from_flags(secs: Option<f64>, json: bool) -> Result<Option<StatusConfig>, String> {
        match secs {
            None => Ok(None),
            Some(s) if s.is_finite() && (0.05..=86_400.0).contains(&s) => Ok(Some(StatusConfig {
                every: Duration::from_secs_f64(s),
                json,
            })),
            Some(s) => Err(format!("--status {s}: give seconds between 0.05 and 86400")),
        }
    }
}

/// Whose objects to show.
enum Source {
    /// One AL instance.
    One(Arc<AlInstance>),
    /// Every AL instance open in the process ([`Al::snapshot_all`]).
    Process,
}

impl Source {
    fn take(&self) -> Vec<Snapshot> {
        match self {
            Source::One(al) => vec![al.snapshot()],
            Source::Process => Al::snapshot_all(),
        }
    }
}

/// A snapshot as printed: text (its lines, each ending in a newline, then
/// an empty line) or one JSON line.
pub fn render(snapshot: &Snapshot, json: bool) -> String {
    if json {
        format!("{}\n", snapshot.to_json())
    } else {
        format!("{snapshot}\n")
    }
}

/// Prints snapshots until dropped; see the module docs.
pub struct StatusPrinter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StatusPrinter {
    /// Print `al`'s objects as `cfg` says; with `None`, print nothing.
    pub fn for_al(al: &Arc<AlInstance>, cfg: Option<StatusConfig>) -> StatusPrinter {
        StatusPrinter::start(Source::One(al.clone()), cfg)
    }

    /// Print every AL instance of the process (one snapshot each, per
    /// interval); with `None`, print nothing.
    pub fn for_process(cfg: Option<StatusConfig>) -> StatusPrinter {
        StatusPrinter::start(Source::Process, cfg)
    }

    fn start(source: Source, cfg: Option<StatusConfig>) -> StatusPrinter {
        let Some(cfg) = cfg else {
            return StatusPrinter {
                stop: None,
                thread: None,
            };
        };
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ibal-status".into())
            .spawn(move || {
                // A message or a hang-up both mean stop.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(cfg.every) {
                    let text: String = source.take().iter().map(|s| render(s, cfg.json)).collect();
                    // stderr gone: nobody is reading; stop quietly.
                    if std::io::stderr().lock().write_all(text.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        match thread {
            Ok(thread) => StatusPrinter {
                stop: Some(stop),
                thread: Some(thread),
            },
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "ibal: no --status thread: {e}");
                StatusPrinter {
                    stop: None,
                    thread: None,
                }
            }
        }
    }
}

impl Drop for StatusPrinter {
    fn drop(&mut self) {
        // Hanging up wakes the thread; it holds its AL only until then.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked() {
        assert_eq!(StatusConfig::from_flags(None, true), Ok(None));
        let c = StatusConfig::from_flags(Some(0.5), true).unwrap().unwrap();
        assert_eq!(c.every, Duration::from_millis(500));
        assert!(c.json);
        assert!(StatusConfig::from_flags(Some(0.0), false).is_err());
        assert!(StatusConfig::from_flags(Some(f64::NAN), false).is_err());
    }

    #[test]
    fn a_printer_stops_when_dropped_and_lets_the_al_close() {
        let al = Al::open().unwrap();
        let printer = StatusPrinter::for_al(
            al.instance(),
            Some(StatusConfig {
                every: Duration::from_millis(20),
                json: true,
            }),
        );
        std::thread::sleep(Duration::from_millis(70));
        drop(printer);
        assert!(al.close().unwrap().is_clean());
    }
}
