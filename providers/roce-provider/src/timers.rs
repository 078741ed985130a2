//! What wakes a device's timer thread ([`Timers`]): the deadline it sleeps
//! towards, which a QP arming an earlier one compares against. The
//! thread itself is `driver::run_timers`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

/// No deadline.
pub(crate) const NO_DEADLINE: u64 = u64::MAX;

/// The timer thread's state, shared with the QPs that arm timers.
#[derive(Default)]
pub(crate) struct Timers {
    /// The deadline (ns from the device's base) the thread sleeps
    /// towards; [`NO_DEADLINE`] while it scans (so any arming wakes it).
    planned: AtomicU64,
    thread: OnceLock<Thread>,
}

impl Timers {
    pub(crate) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    /// The timer thread sleeps towards `at` now ([`NO_DEADLINE`]: it
    /// scans the QPs).
    pub(crate) fn plan(&self, at: u64) {
        self.planned.store(at, Ordering::SeqCst);
    }

    /// A QP's transport now has a deadline `at`: wake the timer thread if
    /// it sleeps towards a later one.
    pub(crate) fn armed(&self, at: u64) {
        if at < self.planned.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    pub(crate) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}
