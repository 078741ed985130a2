//! A device's timers ([`Timers`]): the QPs' transport deadlines in a
//! binary heap, and what wakes the timer thread (`timer_thread::run`).
//!
//! The cost of a tick does not depend on how many QPs exist or are armed:
//! the thread pops the entries that are due, and nothing else. The heap
//! holds `(deadline, QP key)` entries, deleted lazily:
//!
//! * Each QP keeps `queued`, the deadline of the entry it counts on
//!   ([`NO_DEADLINE`]: none), written only under the heap's lock. A QP
//!   whose transport publishes a deadline pushes an entry only when the
//!   deadline is *earlier* than `queued` ([`Timers::arm`]). An RC send
//!   moves the retransmit deadline later with every packet: that common
//!   case is one atomic load and no lock.
//! * A popped entry whose deadline is not its QP's `queued` (or whose QP
//!   is gone) is stale and skipped. A current one clears `queued`; the
//!   thread then reads the QP's real deadline: due, the transport's
//!   timeout runs; later (it moved since the entry was pushed), or again
//!   after the timeout ran, it is armed anew ([`Timers::rearm`], which
//!   reads the deadline again under the heap's lock: a QP destroyed
//!   meanwhile, whose `forget` ran under that lock, is not covered again).
//! * So a QP has one current entry, plus a stale one per time its deadline
//!   moved *earlier* than the one it counted on. When stale entries
//!   outnumber current ones (`covering`) by [`COMPACT_SLACK`] and more,
//!   the timer thread drops them ([`Timers::compact`]): the heap never
//!   holds more than about twice the armed QPs, however often they re-arm
//!   or are destroyed with a deadline set.

use al::sync::atomic::{AtomicU64, Ordering};
use al::sync::thread::Thread;
use al::sync::{Arc, OnceLock};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use al::sync::Mutex;

/// No deadline.
pub const NO_DEADLINE: u64 = u64::MAX;

/// Stale entries the heap may hold beyond its current ones before the
/// timer thread drops them (and at most twice as many as current ones).
const COMPACT_SLACK: usize = 1024;

/// What the timers need of a QP: its key, its `queued` deadline (see the
/// module doc), and its real one.
pub trait Armed {
    /// The key the timer thread finds the QP by.
    fn key(&self) -> u32;
    /// The deadline of the heap entry this QP counts on.
    fn queued(&self) -> &AtomicU64;
    /// The transport's deadline now ([`NO_DEADLINE`]: none).
    fn deadline(&self) -> u64;
}

/// The heap and how many of its entries are current.
#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Reverse<(u64, u32)>>,
    /// QPs whose `queued` is set: each has one current entry.
    covering: usize,
}

/// The timer thread's counters ([`crate::RoceDevice::timer_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimerStats {
    /// Times the timer thread woke (a deadline, an arming earlier than
    /// the one it slept towards, a compaction, the device's close).
    pub wakeups: u64,
    /// Heap entries the thread examined: popped when due (current or
    /// stale) and looked at by a compaction. Proportional to the timers
    /// that came due, not to the QPs.
    pub checks: u64,
    /// Transport timeouts run (retransmit, RNR wait, ...).
    pub fired: u64,
    /// Entries in the heap now.
    pub entries: u64,
    /// QPs with a deadline in the heap now.
    pub armed: u64,
}

/// The timer thread's state, shared with the QPs that arm timers.
pub struct Timers {
    /// The deadline (ns from the device's base) the thread sleeps
    /// towards; [`NO_DEADLINE`] while it works (so any arming wakes it).
    planned: AtomicU64,
    thread: OnceLock<Thread>,
    heap: Mutex<Heap>,
    wakeups: AtomicU64,
    checks: AtomicU64,
    fired: AtomicU64,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            planned: AtomicU64::new(NO_DEADLINE),
            thread: OnceLock::new(),
            heap: Mutex::default(),
            wakeups: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            fired: AtomicU64::new(0),
        }
    }
}

impl Timers {
    /// The thread [`Timers::wake`] unparks (set once, before any QP can
    /// arm).
    pub fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    /// The timer thread sleeps towards `at` now ([`NO_DEADLINE`]: it
    /// works, or sleeps until woken).
    pub(crate) fn plan(&self, at: u64) {
        self.planned.store(at, Ordering::SeqCst);
    }

    /// Publishes `at` as the deadline of the QP `key` (`deadline`, whose
    /// heap entry is `queued`), arming it if it changed. Called with the
    /// QP's lock held: every writer of `deadline` holds it, so the value
    /// read is the last one written; an unchanged deadline (a drive after
    /// a SEND taken, most drives) was published and covered in the heap
    /// by the drive that set it: no store (a locked exchange) again. A
    /// later one (a retransmit timer moved by a packet sent) is covered
    /// by the entry already there: one load, no lock ([`Timers::arm`]).
    #[inline]
    pub fn publish(&self, key: u32, deadline: &AtomicU64, queued: &AtomicU64, at: u64) {
        if deadline.load(Ordering::Relaxed) != at {
            // SeqCst, against the timer thread's clearing of `queued` and
            // its read of the deadline (see `arm`).
            #[cfg(not(ibal_mutant = "timer_publish_relaxed"))]
            deadline.store(at, Ordering::SeqCst);
            // MUTANT (loom-tests/run.sh --mutants): "the deadline is
            // written under the QP's lock", but the timer thread reads it
            // without that lock.
            #[cfg(ibal_mutant = "timer_publish_relaxed")]
            deadline.store(at, Ordering::Relaxed);
            if at != NO_DEADLINE {
                self.arm(key, queued, at);
            }
        }
    }

    /// The QP `key` (whose `queued` is `queued`) has the deadline `at`:
    /// make sure an entry at or before it is in the heap. Lock-free when
    /// one is (the deadline moved later); called with the QP's lock held,
    /// after `at` was published as its deadline.
    #[inline]
    pub(crate) fn arm(&self, key: u32, queued: &AtomicU64, at: u64) {
        // SeqCst, against the timer thread's clearing of `queued` and its
        // read of the deadline: one of the two sees the other's write.
        if at < queued.load(Ordering::SeqCst) {
            crate::delay::point(crate::delay::Point::TimerArmChecked);
            self.push(key, queued, || at);
        }
    }

    /// Pushes an entry at `at()` (read under the heap's lock) unless the
    /// QP's `queued` covers it.
    #[inline(never)]
    fn push(&self, key: u32, queued: &AtomicU64, at: impl Fn() -> u64) {
        // MUTANT (loom-tests/run.sh --mutants): `queued` read before the
        // lock, as the caller did, and trusted.
        #[cfg(ibal_mutant = "timer_arm_no_recheck")]
        let q = queued.load(Ordering::SeqCst);
        let (at, compact) = {
            let mut h = self.heap.lock();
            let at = at();
            // Again under the lock: the timer thread may have taken (and
            // cleared) the entry, or another arming pushed, since the
            // caller's read.
            #[cfg(not(ibal_mutant = "timer_arm_no_recheck"))]
            let q = queued.load(Ordering::SeqCst);
            if at >= q {
                return;
            }
            if q == NO_DEADLINE {
                h.covering += 1;
            }
            h.entries.push(Reverse((at, key)));
            queued.store(at, Ordering::SeqCst);
            (at, needs_compaction(&h))
        };
        // MUTANT (loom-tests/run.sh --mutants): an earlier deadline does
        // not wake the thread (only a compaction does).
        #[cfg(ibal_mutant = "timer_wake_skipped")]
        let at = NO_DEADLINE.max(at);
        if at < self.planned.load(Ordering::SeqCst) || compact {
            self.wake();
        }
    }

    /// A QP is gone: it counts on no entry any more (its entries are
    /// stale from now on).
    pub fn forget(&self, queued: &AtomicU64) {
        #[cfg(not(ibal_mutant = "timer_forget_unlocked"))]
        {
            let mut h = self.heap.lock();
            if queued.swap(NO_DEADLINE, Ordering::SeqCst) != NO_DEADLINE {
                h.covering -= 1;
            }
        }
        // MUTANT (loom-tests/run.sh --mutants): `queued` cleared outside
        // the heap's lock, the count updated under it.
        #[cfg(ibal_mutant = "timer_forget_unlocked")]
        if queued.swap(NO_DEADLINE, Ordering::SeqCst) != NO_DEADLINE {
            let mut h = self.heap.lock();
            h.covering = h.covering.wrapping_sub(1);
        }
    }

    /// Pops the entries due at `now`; the QPs of the current ones (found
    /// by `find`) go to `out`, their `queued` cleared.
    pub fn take_due<Q: Armed>(
        &self,
        now: u64,
        find: impl Fn(u32) -> Option<Arc<Q>>,
        out: &mut Vec<Arc<Q>>,
    ) {
        let mut checks = 0;
        let mut h = self.heap.lock();
        while let Some(&Reverse((at, key))) = h.entries.peek() {
            if at > now {
                break;
            }
            h.entries.pop();
            checks += 1;
            let Some(q) = find(key) else { continue };
            if q.queued().load(Ordering::SeqCst) != at {
                continue;
            }
            q.queued().store(NO_DEADLINE, Ordering::SeqCst);
            h.covering -= 1;
            out.push(q);
        }
        drop(h);
        self.checks.fetch_add(checks, Ordering::Relaxed);
    }

    /// A QP [`Timers::take_due`] gave out, after its timeout ran (or not,
    /// if its deadline had moved): armed again at its deadline, if any.
    ///
    /// Unlike a drive's arming, this one runs without the QP's lock: a
    /// destroy may reset the deadline and `forget` the QP between the read
    /// of the deadline and the push. The push reads the deadline again
    /// under the heap's lock (which `forget` takes after the reset), so a
    /// destroyed QP is never covered again: its entry would be dropped
    /// unfound and the armed count would never come back down.
    pub(crate) fn rearm<Q: Armed>(&self, q: &Q) {
        let at = q.deadline();
        if at != NO_DEADLINE && at < q.queued().load(Ordering::SeqCst) {
            #[cfg(not(ibal_mutant = "timer_rearm_unchecked"))]
            self.push(q.key(), q.queued(), || q.deadline());
            // MUTANT (loom-tests/run.sh --mutants): the deadline read
            // before the lock is pushed.
            #[cfg(ibal_mutant = "timer_rearm_unchecked")]
            self.push(q.key(), q.queued(), || at);
        }
    }

    /// Counts a transport timeout run.
    pub(crate) fn note_fired(&self) {
        self.fired.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a wake-up of the timer thread.
    pub(crate) fn note_wakeup(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// The earliest entry's deadline ([`NO_DEADLINE`]: none).
    pub(crate) fn next(&self) -> u64 {
        self.heap
            .lock()
            .entries
            .peek()
            .map_or(NO_DEADLINE, |Reverse((at, _))| *at)
    }

    /// Drops the stale entries if they outnumber the current ones by
    /// [`COMPACT_SLACK`] and more (see the module doc).
    pub(crate) fn compact<Q: Armed>(&self, find: impl Fn(u32) -> Option<Arc<Q>>) {
        let mut h = self.heap.lock();
        if !needs_compaction(&h) {
            return;
        }
        let mut v = std::mem::take(&mut h.entries).into_vec();
        let examined = v.len() as u64;
        v.retain(|Reverse((at, key))| {
            find(*key).is_some_and(|q| q.queued().load(Ordering::SeqCst) == *at)
        });
        // A QP whose deadline came back to the value it had pushed before
        // has two equal entries: one is enough.
        v.sort_unstable();
        v.dedup();
        if v.capacity() > 4 * v.len().max(COMPACT_SLACK) {
            v.shrink_to(2 * v.len().max(COMPACT_SLACK));
        }
        h.entries = BinaryHeap::from(v);
        drop(h);
        self.checks.fetch_add(examined, Ordering::Relaxed);
    }

    /// The counters and the heap's sizes now.
    pub fn stats(&self) -> TimerStats {
        let (entries, armed) = {
            let h = self.heap.lock();
            (h.entries.len() as u64, h.covering as u64)
        };
        TimerStats {
            wakeups: self.wakeups.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            fired: self.fired.load(Ordering::Relaxed),
            entries,
            armed,
        }
    }

    /// Unparks the timer thread (the device's close; an earlier arming).
    pub fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

fn needs_compaction(h: &Heap) -> bool {
    h.entries.len() > 2 * h.covering + COMPACT_SLACK
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A QP as the timers see it.
    struct FakeQp {
        key: u32,
        queued: AtomicU64,
        deadline: AtomicU64,
    }

    impl Armed for FakeQp {
        fn key(&self) -> u32 {
            self.key
        }
        fn queued(&self) -> &AtomicU64 {
            &self.queued
        }
        fn deadline(&self) -> u64 {
            self.deadline.load(Ordering::SeqCst)
        }
    }

    fn qps(n: u32) -> HashMap<u32, Arc<FakeQp>> {
        (0..n)
            .map(|k| {
                let q = FakeQp {
                    key: k,
                    queued: AtomicU64::new(NO_DEADLINE),
                    deadline: AtomicU64::new(NO_DEADLINE),
                };
                (k, Arc::new(q))
            })
            .collect()
    }

    /// Publishes `at` as `q`'s deadline and arms it, as a drive does.
    fn set(t: &Timers, key: u32, q: &FakeQp, at: u64) {
        q.deadline.store(at, Ordering::SeqCst);
        t.arm(key, &q.queued, at);
    }

    /// One round of the timer thread at `now`: the QPs whose deadline
    /// passed (their timeout "runs": the deadline is cleared), the others
    /// re-armed.
    fn round(t: &Timers, map: &HashMap<u32, Arc<FakeQp>>, now: u64) -> Vec<u32> {
        let mut due = Vec::new();
        t.take_due(now, |k| map.get(&k).cloned(), &mut due);
        let mut fired = Vec::new();
        for q in due {
            let key = *map.iter().find(|(_, v)| Arc::ptr_eq(v, &q)).unwrap().0;
            if q.deadline() <= now {
                q.deadline.store(NO_DEADLINE, Ordering::SeqCst);
                fired.push(key);
            }
            t.rearm(&*q);
        }
        t.compact(|k| map.get(&k).cloned());
        fired.sort_unstable();
        fired
    }

    /// 20,000 armed QPs, 10 of them due: a round examines the due entries
    /// only, and 100 re-armings of every QP at later deadlines (an RC
    /// send's retransmit timer, per packet) push nothing. (The scan this
    /// replaced looked at every armed QP at every wake-up: 20,000 per
    /// round.)
    #[test]
    fn a_round_examines_the_due_entries_only_and_later_rearming_pushes_nothing() {
        let t = Timers::default();
        let map = qps(20_000);
        for (k, q) in &map {
            let at = if *k < 10 {
                1_000
            } else {
                1_000_000 + u64::from(*k)
            };
            set(&t, *k, q, at);
        }
        assert_eq!((t.stats().entries, t.stats().armed), (20_000, 20_000));
        for step in 1..=100u64 {
            for (k, q) in &map {
                if *k >= 10 {
                    set(&t, *k, q, 1_000_000 + u64::from(*k) + step);
                }
            }
        }
        assert_eq!(t.stats().entries, 20_000, "later deadlines push nothing");
        assert_eq!(round(&t, &map, 999), Vec::<u32>::new());
        assert_eq!(t.stats().checks, 0, "nothing due, nothing examined");
        assert_eq!(round(&t, &map, 1_000), (0..10).collect::<Vec<_>>());
        assert_eq!(t.stats().checks, 10);
        assert_eq!(t.next(), 1_000_010, "the earliest entry, pushed first");
        // Entries pushed before the deadlines moved: popped, found moved,
        // pushed again at the real deadline; each fires once.
        let fired = round(&t, &map, 1_000_020);
        assert!(fired.is_empty(), "{fired:?}");
        assert_eq!(t.stats().checks, 10 + 11);
        assert_eq!(round(&t, &map, 1_000_200), (10..=100).collect::<Vec<_>>());
        assert_eq!(t.stats().armed, 20_000 - 10 - 91);
    }

    /// A deadline moved earlier pushes an entry (and wakes the thread
    /// only if earlier than the one it sleeps towards); the stale entries
    /// of QPs that keep moving earlier, or that are destroyed, are
    /// dropped once they outnumber the current ones: the heap stays
    /// within twice the armed QPs plus the slack.
    #[test]
    fn stale_entries_are_skipped_and_compacted_so_the_heap_stays_bounded() {
        let t = Timers::default();
        let map = qps(100);
        for step in 0..200u64 {
            for (k, q) in &map {
                // Earlier every time: each arming pushes.
                set(&t, *k, q, 1_000_000 - step * 1_000 - u64::from(*k));
            }
            t.compact(|k| map.get(&k).cloned());
            let s = t.stats();
            assert!(s.entries <= 2 * s.armed + COMPACT_SLACK as u64, "{s:?}");
        }
        let s = t.stats();
        assert_eq!(s.armed, 100);
        // Destroyed with deadlines set: their entries are stale.
        for q in map.values() {
            t.forget(&q.queued);
        }
        assert_eq!(t.stats().armed, 0);
        let empty: HashMap<u32, Arc<FakeQp>> = HashMap::new();
        let mut due: Vec<Arc<FakeQp>> = Vec::new();
        t.take_due(u64::MAX - 1, |k| empty.get(&k).cloned(), &mut due);
        assert!(due.is_empty());
        assert_eq!(t.stats().entries, 0);
        assert_eq!(t.next(), NO_DEADLINE);
    }
}
