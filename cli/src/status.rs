//! `--status SECS` and SIGUSR1: the long-running modes (`pingpong
//! --listen/--connect`, `rping`, `stress`) print a snapshot of their
//! objects ([`al::AlInstance::snapshot`], in the shape of `rdma res show`;
//! with `--json`, one JSON object per line) every SECS seconds, and at
//! once when the process gets SIGUSR1 (`kill -USR1 PID`), on stderr, so
//! that stdout keeps the command's own report.
//!
//! A thread of its own does the printing: the mode's threads are never
//! held up, and a snapshot takes no lock they wait for. It stops when its
//! [`StatusPrinter`] is dropped, which each mode does before it closes its
//! AL. The signal handler only sets a flag the thread looks at every
//! [`SIGNAL_POLL`]; installing it is this crate's one `unsafe` call
//! (through `libc`, already in the build for the RoCEv2 provider).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use al::sync::Arc;
use al::{Al, AlInstance, Snapshot};

/// How often the printer looks for a SIGUSR1 that came.
pub const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// When and how to print.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatusConfig {
    /// Time between two snapshots (the first comes after one interval);
    /// `None`: only on request.
    pub every: Option<Duration>,
    /// One JSON object per snapshot and line instead of text.
    pub json: bool,
    /// Also print one at once when the process gets SIGUSR1 (installs the
    /// handler for the rest of the process's life; SIGUSR1 then no longer
    /// ends the process).
    pub on_signal: bool,
}

impl StatusConfig {
    /// The command line's: `--status SECS` (optional), `--json`, and
    /// SIGUSR1 always.
    pub fn from_flags(secs: Option<f64>, json: bool) -> Result<StatusConfig, String> {
        let every = match secs {
            None => None,
            Some(s) if s.is_finite() && (0.05..=86_400.0).contains(&s) => {
                Some(Duration::from_secs_f64(s))
            }
            Some(s) => return Err(format!("--status {s}: give seconds between 0.05 and 86400")),
        };
        Ok(StatusConfig {
            every,
            json,
            on_signal: true,
        })
    }
}

/// Set by the SIGUSR1 handler, taken by the printer thread.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_sigusr1(_signal: libc::c_int) {
    SIGNALLED.store(true, Ordering::Relaxed);
}

/// Catch SIGUSR1 from now on (once per process); whether it is caught.
fn catch_sigusr1() -> bool {
    static CAUGHT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAUGHT.get_or_init(|| {
        #[cfg(unix)]
        {
            let handler: extern "C" fn(libc::c_int) = on_sigusr1;
            // SAFETY: the handler only stores to a static atomic, which is
            // async-signal-safe, and never unwinds; `signal` replaces
            // SIGUSR1's disposition for the whole process, which is the
            // point, and nothing else in this tool handles SIGUSR1.
            let previous = unsafe { libc::signal(libc::SIGUSR1, handler as libc::sighandler_t) };
            previous != libc::SIG_ERR
        }
        #[cfg(not(unix))]
        false
    })
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
        let on_signal = cfg.is_some_and(|c| c.on_signal) && catch_sigusr1();
        let tick = match cfg.map(|c| c.every) {
            Some(Some(every)) if on_signal => every.min(SIGNAL_POLL),
            Some(Some(every)) => every,
            Some(None) if on_signal => SIGNAL_POLL,
            _ => {
                return StatusPrinter {
                    stop: None,
                    thread: None,
                }
            }
        };
        let cfg = cfg.expect("invariant: a tick means a config");
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ibal-status".into())
            .spawn(move || {
                let mut due = cfg.every.map(|every| Instant::now() + every);
                // A message or a hang-up both mean stop.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    let now = Instant::now();
                    let timed = due.is_some_and(|at| now >= at);
                    if timed {
                        due = cfg.every.map(|every| now + every);
                    }
                    let asked = on_signal && SIGNALLED.swap(false, Ordering::Relaxed);
                    if !(timed || asked) {
                        continue;
                    }
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
        let c = StatusConfig::from_flags(None, true).unwrap();
        assert_eq!((c.every, c.json, c.on_signal), (None, true, true));
        let c = StatusConfig::from_flags(Some(0.5), true).unwrap();
        assert_eq!(c.every, Some(Duration::from_millis(500)));
        assert!(StatusConfig::from_flags(Some(0.0), false).is_err());
        assert!(StatusConfig::from_flags(Some(f64::NAN), false).is_err());
    }

    #[test]
    fn a_printer_stops_when_dropped_and_lets_the_al_close() {
        let al = Al::open().unwrap();
        let printer = StatusPrinter::for_al(
            al.instance(),
            Some(StatusConfig {
                every: Some(Duration::from_millis(20)),
                json: true,
                on_signal: false,
            }),
        );
        std::thread::sleep(Duration::from_millis(70));
        drop(printer);
        assert!(al.close().unwrap().is_clean());
    }
}
