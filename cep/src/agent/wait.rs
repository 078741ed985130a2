//! The agent thread's wake-up signal: "a completion arrived / a user call
//! changed the timers" or "stop", with an optional deadline.
//!
//! A leaf lock: nothing else is ever taken while it is held.

use al::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

#[derive(Debug, Default)]
struct State {
    /// Sticky: set by `kick`, cleared when `wait` returns.
    kicked: bool,
    /// Set once by `stop`; never cleared.
    stopped: bool,
}

/// A sticky wake-up flag with a stop bit.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    state: Mutex<State>,
    cv: Condvar,
}

impl Signal {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Wake the waiter (or make its next `wait` return at once).
    pub(crate) fn kick(&self) {
        self.lock().kicked = true;
        self.cv.notify_all();
    }

    /// Ask the waiter to stop; `wait` returns `false` from now on.
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.cv.notify_all();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Block until kicked, stopped or `deadline` (if any) has passed.
    /// Returns `false` when stopped.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> bool {
        let mut s = self.lock();
        loop {
            if s.stopped {
                return false;
            }
            if s.kicked {
                s.kicked = false;
                return true;
            }
            match deadline {
                None => self.cv.wait(&mut s),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return true;
                    }
                    self.cv.wait_timeout(&mut s, d - now);
                }
            }
        }
    }
}
