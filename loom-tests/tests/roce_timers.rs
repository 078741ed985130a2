//! The RoCEv2 provider's deadline protocol (issue 30): a QP's drive
//! publishes its transport's deadline (`Timers::publish`: not again when
//! unchanged, armed in the timer heap only when earlier than the entry it
//! counts on) while the device's timer thread takes the due entries,
//! fires the QPs whose deadline passed, re-arms them and goes to sleep
//! (`timer_thread::run`, the production loop, on the production `Timers`).
//!
//! The QP is the model's own ([`Qp`]): its deadline and `queued` words are
//! what `QpInner` has, its transport a small retransmit-then-RNR timer
//! under the QP's lock, and its fire hook does what `on_timer` does (the
//! transport's timeout under the QP's lock, then a drive). The model's
//! clock stands still until a model advances it; under loom
//! `park_timeout` is a yield, so the thread spins while a deadline is
//! pending and really sleeps only with nothing armed: a lost wake-up
//! leaves it parked while the model's main thread parks waiting for the
//! timeout, which loom reports as a deadlock.
#![cfg(ibal_loom)]

mod common;

use al::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use al::sync::thread::{self, JoinHandle};
use al::sync::{Arc, Condvar, Mutex};
use roce_provider::model::clock;
use roce_provider::model::timers::{self as timer, Armed, Timers, NO_DEADLINE};

/// The only QP's key.
const KEY: u32 = 7;

/// A QP's transport as far as its timers go: a retransmit deadline, then
/// (after that timeout) an RNR wait, then nothing.
struct Transport {
    /// False once the QP is destroyed (`QpCore::t` gone).
    alive: bool,
    /// The transport's deadline ([`NO_DEADLINE`]: none).
    at: u64,
    /// Timeouts run: 1 after the retransmit, 2 after the RNR wait.
    fired: u32,
    /// The RNR deadline the retransmit's timeout sets.
    rnr: u64,
}

/// The model's QP: the words the timers read, and its transport under its
/// lock.
struct Qp {
    deadline: AtomicU64,
    queued: AtomicU64,
    core: Mutex<Transport>,
}

impl Armed for Qp {
    fn key(&self) -> u32 {
        KEY
    }
    fn queued(&self) -> &AtomicU64 {
        &self.queued
    }
    fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::SeqCst)
    }
}

/// The device as the timer thread sees it.
struct Dev {
    timers: Timers,
    /// The QP map: the QP until its destroy takes it out.
    qps: Mutex<Option<Arc<Qp>>>,
    stop: AtomicBool,
    /// Notified (with the QP's lock) by every timeout run. (Not the main
    /// thread's park: loom's unpark would also end a `join` it is in.)
    ran: Condvar,
}

impl Dev {
    /// A drive of the QP: `change` moves its transport's deadline, then
    /// the deadline is published (with the QP's lock held, as
    /// `QpInner::drive`).
    fn drive(&self, qp: &Qp, change: impl FnOnce(&mut Transport)) {
        let mut t = qp.core.lock();
        change(&mut t);
        self.timers.publish(KEY, &qp.deadline, &qp.queued, t.at);
    }

    /// `on_timer`: the transport's timeout (if its deadline passed and it
    /// still exists), then a drive; wakes the model's main thread.
    fn on_timer(&self, qp: &Qp) {
        let now = clock::now_ns();
        self.drive(qp, |t| {
            if t.alive && t.at <= now {
                t.fired += 1;
                t.at = if t.fired == 1 { t.rnr } else { NO_DEADLINE };
            }
        });
        self.ran.notify_all();
    }

    /// `QpInner::destroy` after the QP left the map: the transport gone,
    /// the deadline reset and forgotten by the timers.
    fn destroy(&self) {
        let qp = self.qps.lock().take().expect("the QP");
        let mut t = qp.core.lock();
        t.alive = false;
        t.at = NO_DEADLINE;
        qp.deadline.store(NO_DEADLINE, Ordering::SeqCst);
        self.timers.forget(&qp.queued);
    }

    /// Timeouts the QP's transport ran.
    fn fired(&self, qp: &Qp) -> u32 {
        qp.core.lock().fired
    }

    /// Waits until the QP's transport ran `n` timeouts.
    fn wait_fired(&self, qp: &Qp, n: u32) {
        let mut t = qp.core.lock();
        while t.fired < n {
            self.ran.wait(&mut t);
        }
    }
}

/// A device with one QP whose transport has the deadline `at` (published
/// and armed) and sets `rnr` at its first timeout, and its timer thread.
fn device(at: u64, rnr: u64) -> (Arc<Dev>, Arc<Qp>, JoinHandle<()>) {
    let qp = Arc::new(Qp {
        deadline: AtomicU64::new(NO_DEADLINE),
        queued: AtomicU64::new(NO_DEADLINE),
        core: Mutex::new(Transport {
            alive: true,
            at: NO_DEADLINE,
            fired: 0,
            rnr,
        }),
    });
    let dev = Arc::new(Dev {
        timers: Timers::default(),
        qps: Mutex::new(Some(qp.clone())),
        stop: AtomicBool::new(false),
        ran: Condvar::new(),
    });
    dev.drive(&qp, |t| t.at = at);
    let d = dev.clone();
    let timer = thread::spawn(move || {
        timer::run(
            &d.timers,
            clock::now_ns,
            |key| {
                if key == KEY {
                    d.qps.lock().clone()
                } else {
                    None
                }
            },
            |q: &Qp| d.on_timer(q),
            &d.stop,
        )
    });
    // Before any arming the model does from another thread (as the device
    // sets it before any QP exists).
    dev.timers.set_thread(timer.thread().clone());
    (dev, qp, timer)
}

/// Stops the timer thread as the device's close does, and joins it.
fn stop(dev: &Dev, timer: JoinHandle<()>) {
    dev.stop.store(true, Ordering::Release);
    dev.timers.wake();
    timer.join().unwrap();
}

/// A QP's retransmit deadline is cancelled (an ACK) and a new one is
/// published while the timer thread takes the old entry and goes to sleep
/// with nothing left in the heap: the new deadline must wake it (the
/// thread plans `NO_DEADLINE` while it works, so an arming between its
/// read of the heap and its sleep compares with that), and fires once
/// the clock passes it. A lost wake-up: the thread parks for good, the
/// model's main thread waits for the timeout for good (deadlock).
#[test]
fn timer_new_deadline_vs_sleep() {
    common::model("timer_new_deadline_vs_sleep", || {
        let t0 = clock::now_ns();
        let (dev, qp, timer) = device(t0 + 10, NO_DEADLINE);
        let (d, q) = (dev.clone(), qp.clone());
        let driver = thread::spawn(move || {
            d.drive(&q, |t| t.at = NO_DEADLINE);
            clock::advance(10);
            d.drive(&q, |t| t.at = t0 + 20);
            clock::advance(10);
        });
        driver.join().unwrap();
        dev.wait_fired(&qp, 1);
        stop(&dev, timer);
        assert_eq!(dev.fired(&qp), 1, "the cancelled deadline never fires");
        let s = dev.timers.stats();
        assert_eq!((s.armed, s.entries), (0, 0), "{s:?}");
    });
}

/// The QP's retransmit entry is due while a drive moves its deadline
/// later (no push: the entry it counts on is earlier) and another drive
/// leaves it unchanged (nothing published): whichever way the timer
/// thread's take goes, the later deadline stays covered (the re-arm
/// after the take) and fires; its timeout sets an RNR wait, which fires
/// too. Every arming counted once: the armed count ends at 0.
#[test]
fn timer_unchanged_deadline_vs_take_then_rnr() {
    common::model("timer_unchanged_deadline_vs_take_then_rnr", || {
        let t0 = clock::now_ns();
        let (dev, qp, timer) = device(t0 + 10, t0 + 30);
        clock::advance(10);
        let (d, q) = (dev.clone(), qp.clone());
        let driver = thread::spawn(move || {
            // A packet sent: the retransmit timer restarts (if it did not
            // fire meanwhile).
            d.drive(&q, |t| {
                if t.fired == 0 {
                    t.at = t0 + 20;
                }
            });
            // A drive that changes nothing.
            d.drive(&q, |_| {});
        });
        driver.join().unwrap();
        clock::advance(10);
        dev.wait_fired(&qp, 1);
        clock::advance(10);
        dev.wait_fired(&qp, 2);
        stop(&dev, timer);
        assert_eq!(dev.fired(&qp), 2);
        let s = dev.timers.stats();
        assert_eq!((s.armed, s.entries), (0, 0), "{s:?}");
    });
}

/// The QP is destroyed (its deadline reset, `forget`) while the timer
/// thread takes its due entry, finds the deadline moved later and re-arms
/// it: the destroyed QP is never covered again, the armed count comes
/// back to 0, its entries are all stale, and no timeout runs.
#[test]
fn timer_destroy_vs_take_due() {
    common::model("timer_destroy_vs_take_due", || {
        let t0 = clock::now_ns();
        let (dev, qp, timer) = device(t0 + 10, NO_DEADLINE);
        // Later: covered by the entry at t0 + 10, nothing pushed.
        dev.drive(&qp, |t| t.at = t0 + 20);
        clock::advance(10);
        let d = dev.clone();
        let destroyer = thread::spawn(move || d.destroy());
        destroyer.join().unwrap();
        stop(&dev, timer);
        assert_eq!(dev.fired(&qp), 0);
        let s = dev.timers.stats();
        assert_eq!(s.armed, 0, "{s:?}");
        let mut due: Vec<Arc<Qp>> = Vec::new();
        dev.timers.take_due(NO_DEADLINE - 1, |_| None, &mut due);
        assert!(due.is_empty());
        let s = dev.timers.stats();
        assert_eq!((s.armed, s.entries), (0, 0), "{s:?}");
    });
}
