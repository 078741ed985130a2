//! The timer thread of a device ([`run_timers`]): it sleeps
//! (`park_timeout`, microsecond precision) until the earliest entry of the
//! timer heap (`timers`), runs the transports whose deadline passed, and
//! sleeps again; with nothing armed it parks with no timeout. A QP that
//! sets a deadline earlier than the one the thread sleeps towards wakes it
//! (`Timers::arm`).
//!
//! The loop itself ([`run`]) is generic over the QPs it finds and what a
//! due one runs, so the loom models of `loom-tests/` drive this very loop
//! (and the same [`Timers`]) with a small QP of their own; the device's
//! instance is the real `QpInner` and its `on_timer`.

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::Arc;
use std::time::Duration;

use crate::qp::{Dev, QpInner};
use crate::timers::{Armed, Timers, NO_DEADLINE};

/// Shortest sleep of the timer thread (a deadline already passed again
/// right after its timer ran must not make the thread spin).
const MIN_SLEEP: Duration = Duration::from_micros(10);

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64
}

/// The timer thread of a device until `stop` is set.
pub(crate) fn run_timers(dev: Arc<Dev>, stop: Arc<AtomicBool>) {
    run(
        &dev.timers,
        || nanos(dev.now()),
        |key| dev.qps.read().get(&key).cloned(),
        |q: &QpInner| q.on_timer(),
        &stop,
    );
}

/// The timer loop until `stop` is set: each round takes the timer heap's
/// due entries (work in proportion to them, not to the QPs; `find` gives
/// the QP of a key, if it still exists), runs `fire` on the QPs whose
/// deadline passed at `now` (nanoseconds, the clock the deadlines count
/// in), arms the QPs again at their deadlines, and sleeps until the
/// earliest entry, or until woken if none. The thread running it must be
/// the one given to [`Timers::set_thread`].
pub fn run<Q: Armed>(
    timers: &Timers,
    now: impl Fn() -> u64,
    find: impl Fn(u32) -> Option<Arc<Q>>,
    fire: impl Fn(&Q),
    stop: &AtomicBool,
) {
    let mut due: Vec<Arc<Q>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // Working: any arming from here on wakes the next sleep at once
        // (it compares with this, not with the deadline of the sleep that
        // just ended).
        #[cfg(not(ibal_mutant = "timer_round_unplanned"))]
        timers.plan(NO_DEADLINE);
        crate::delay::point(crate::delay::Point::TimerWorking);
        let at = now();
        timers.take_due(at, &find, &mut due);
        for q in due.drain(..) {
            if q.deadline() <= at {
                // Counted first: what the timeout completes may be seen
                // (and the counter read) before `fire` returns.
                timers.note_fired();
                fire(&q);
            }
            // Whatever the drive published (or left as it was), the QP's
            // deadline is covered by an entry again.
            #[cfg(not(ibal_mutant = "timer_rearm_skipped"))]
            timers.rearm(&*q);
        }
        timers.compact(&find);
        let next = timers.next();
        timers.plan(next);
        crate::delay::point(crate::delay::Point::TimerPlanned);
        if next == NO_DEADLINE {
            al::sync::thread::park();
        } else {
            let left = Duration::from_nanos(next.saturating_sub(now()));
            al::sync::thread::park_timeout(left.max(MIN_SLEEP));
        }
        timers.note_wakeup();
    }
}
