//! Whether an application busy-polls a device's CQs ([`PollWatch`]): the
//! receive threads step aside while it does (`driver::run_port`).

use al::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// [`BUSY_POLL_STREAK`] empty polls of a device's CQs, each this close
/// behind the one before, mean an application busy-polls
/// (`DevShared::note_poll`).
const BUSY_POLL_GAP: Duration = Duration::from_micros(50);
const BUSY_POLL_STREAK: u32 = 16;

/// Tells an application that busy-polls a device's CQs from consumers
/// that poll when woken.
///
/// Only a run of [`BUSY_POLL_STREAK`] polls that found nothing, each
/// close behind the one before ([`BUSY_POLL_GAP`]), marks the device as
/// busy-polled: an application spinning on its CQ does that all the time,
/// while a consumer woken by a completion (the CM agent on QP1, which polls
/// its receive and send CQs once each per round; an async CQ stream)
/// drains its CQs and stops after a poll or two. Counting every poll made
/// the receive threads nap after each CM message, and the next MAD waited
/// out the nap (`ibal perf conn-rate --transport udp`: ~650 of ~700 us per
/// connect).
#[derive(Default)]
pub(crate) struct PollWatch {
    /// When (ns from the device's base) the device was last busy-polled.
    busy_at: AtomicU64,
    /// When a poll last found a CQ empty, and how many did in a row.
    last_empty: AtomicU64,
    streak: AtomicU32,
}

impl PollWatch {
    /// A poll at `now` found `found` completions.
    ///
    /// Loads and stores, not read-modify-writes (two locked instructions
    /// on every empty poll): pollers of one device racing here may lose
    /// a step of each other's streak, which delays the receive threads'
    /// stepping aside by a poll or two; a lone poller counts exactly.
    /// The poll's gap to the one before runs to `began` (when it started
    /// its real work, at the latest `now`, its end).
    #[inline]
    pub(crate) fn note(&self, began: u64, now: u64, found: usize) {
        if found > 0 {
            return;
        }
        let before = self.last_empty.load(Ordering::Relaxed);
        self.last_empty.store(now, Ordering::Relaxed);
        let streak = if began.saturating_sub(before) < BUSY_POLL_GAP.as_nanos() as u64 {
            let s = self.streak.load(Ordering::Relaxed).saturating_add(1);
            self.streak.store(s, Ordering::Relaxed);
            s
        } else {
            self.streak.store(1, Ordering::Relaxed);
            1
        };
        if streak >= BUSY_POLL_STREAK {
            self.busy_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether the device was busy-polled within `window` of `now`.
    pub(crate) fn busy_within(&self, now: u64, window: Duration) -> bool {
        let at = self.busy_at.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) < window.as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_run_of_close_empty_polls_counts_as_busy_polling() {
        let us = |n: u64| n * 1000;
        let w = PollWatch::default();
        let window = Duration::from_micros(200);
        // A consumer woken every 100 us that polls its two CQs (the CM
        // agent's round), and one that drains with completions first.
        for round in 1..200u64 {
            let t = us(100 * round);
            w.note(t, t, 3);
            w.note(t + 1, t + 1, 0);
            w.note(t + 2, t + 2, 0);
            assert!(!w.busy_within(t + 3, window), "round {round}");
        }
        // A spinning application: empty polls microseconds apart.
        let t0 = us(100_000);
        for k in 0..BUSY_POLL_STREAK as u64 {
            w.note(t0 + us(k), t0 + us(k), 0);
        }
        assert!(w.busy_within(t0 + us(20), window));
        assert!(
            !w.busy_within(t0 + us(300), window),
            "busy ends with the polling"
        );
        // A spinning application whose polls each drain a flood for 100 us
        // (they start 2 us after the one before ended): busy-polling.
        let w = PollWatch::default();
        let t1 = us(500_000);
        for k in 0..BUSY_POLL_STREAK as u64 {
            let began = t1 + us(102 * k);
            w.note(began, began + us(100), 0);
        }
        assert!(w.busy_within(t1 + us(102 * BUSY_POLL_STREAK as u64), window));
        // The same polls measured end to end would not have counted.
        let w = PollWatch::default();
        for k in 0..BUSY_POLL_STREAK as u64 {
            let end = t1 + us(102 * k) + us(100);
            w.note(end, end, 0);
        }
        assert!(!w.busy_within(t1 + us(102 * BUSY_POLL_STREAK as u64), window));
    }
}
