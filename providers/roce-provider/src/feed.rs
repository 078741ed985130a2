//! The right to feed a port's datagrams to its QPs ([`Feeding`]): one
//! thread at a time per port, the receive thread or a poller making
//! progress, so one port's packets are never fed out of order.

use al::sync::atomic::{AtomicU64, Ordering};

use al::sync::{Mutex, MutexGuard};

use crate::counters::AtomicCounters;
use crate::port::PortShared;
use crate::qp_map::QpMemo;

/// A port's feeding lock (one per port, `DevShared::feed_locks`): held by
/// whoever is taking datagrams off the port's socket and feeding them to
/// QPs (the port's receive thread, or a poller making progress), so two
/// threads never feed one port's packets concurrently (which could
/// reorder them). Taken as a [`Feeding`]. `Q`: the QP type
/// (`qp::QpInner`).
pub(crate) struct FeedLock<Q> {
    rx: Mutex<RxState<Q>>,
    #[cfg(ibal_loom)]
    gate: loom_gate::Gate,
}

/// What the feeder of a port's datagrams keeps between them.
struct RxState<Q> {
    /// The last QP this port's datagrams reached.
    memo: QpMemo<Q>,
    /// Whom the IPv4 identification solver runs for.
    gate: roce_transport::SolverGate,
}

impl<Q> Default for FeedLock<Q> {
    fn default() -> Self {
        FeedLock {
            rx: Mutex::new(RxState {
                memo: QpMemo::default(),
                gate: roce_transport::SolverGate::default(),
            }),
            #[cfg(ibal_loom)]
            gate: loom_gate::Gate::default(),
        }
    }
}

impl<Q> FeedLock<Q> {
    /// The right to feed `port`'s datagrams (this lock is `port`'s),
    /// waiting for it.
    pub(crate) fn feeding<'p>(&'p self, port: &'p PortShared) -> Feeding<'p, Q> {
        Feeding {
            #[cfg(ibal_loom)]
            _gate: self.gate.enter(),
            port,
            rx: self.rx.lock(),
        }
    }

    /// The right to feed `port`'s datagrams, if nobody holds it.
    pub(crate) fn try_feeding<'p>(&'p self, port: &'p PortShared) -> Option<Feeding<'p, Q>> {
        #[cfg(ibal_loom)]
        let _gate = self.gate.try_enter()?;
        Some(Feeding {
            #[cfg(ibal_loom)]
            _gate,
            port,
            rx: self.rx.try_lock()?,
        })
    }
}

/// The right to feed a port's datagrams to its QPs: its [`FeedLock`], held.
/// The receive counters of the datagram path (`rx_datagrams` to
/// `rx_unknown_qpn`, [`Feeding::count`]) are written only with it, so by
/// one thread at a time: each is added with a load and a store, not a
/// locked read-modify-write (three of those per datagram saved on a
/// ping-pong's path). Counters a drive also writes (`add_transport`) stay
/// atomic additions.
pub(crate) struct Feeding<'p, Q> {
    port: &'p PortShared,
    /// The lock, and what it guards.
    rx: MutexGuard<'p, RxState<Q>>,
    /// Under loom, the lock's right to be taken (released after `rx`).
    #[cfg(ibal_loom)]
    _gate: loom_gate::Entered<'p>,
}

/// See `qp_map::MemoRef`: under loom the memo is strong, and is
/// forgotten with the feeding lock.
#[cfg(ibal_loom)]
impl<Q> Drop for Feeding<'_, Q> {
    fn drop(&mut self) {
        self.rx.memo = QpMemo::default();
    }
}

impl<'p, Q> Feeding<'p, Q> {
    pub(crate) fn port(&self) -> &'p PortShared {
        self.port
    }

    /// The last QP this port's datagrams reached (`QpMap::find`) and
    /// the identification solver's gate, together (the receive stage's
    /// lookup borrows the one while the stage holds the other).
    pub(crate) fn rx_state(&mut self) -> (&mut QpMemo<Q>, &mut roce_transport::SolverGate) {
        let rx = &mut *self.rx;
        (&mut rx.memo, &mut rx.gate)
    }

    /// Adds `n` to the counter `which` picks.
    pub(crate) fn count(&self, which: impl FnOnce(&AtomicCounters) -> &AtomicU64, n: u64) {
        if n != 0 {
            let c = which(&self.port.counters);
            crate::delay::point(crate::delay::Point::FeedCount);
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }
}

/// Under loom only: who may take a port's feeding lock. loom's
/// `Mutex::try_lock` can block the trying thread until the lock is
/// released when another thread takes the lock during the try
/// (tokio-rs/loom#376): a poller's try would then wait out a receive
/// thread that holds the feeding lock across a blocking receive, a
/// deadlock the real lock never has. So under loom the lock is taken
/// through this gate (a flag under a short-held lock, waited for on a
/// condition variable), whose try never waits for a holder; the feeding
/// lock itself is then only ever taken by the gate's holder, uncontended.
#[cfg(ibal_loom)]
mod loom_gate {
    use al::sync::{Condvar, Mutex};

    #[derive(Default)]
    pub(super) struct Gate {
        held: Mutex<bool>,
        freed: Condvar,
    }

    /// The gate, held.
    pub(super) struct Entered<'g>(&'g Gate);

    impl Gate {
        pub(super) fn enter(&self) -> Entered<'_> {
            let mut held = self.held.lock();
            while *held {
                self.freed.wait(&mut held);
            }
            *held = true;
            Entered(self)
        }

        pub(super) fn try_enter(&self) -> Option<Entered<'_>> {
            let mut held = self.held.lock();
            if *held {
                return None;
            }
            *held = true;
            Some(Entered(self))
        }
    }

    impl Drop for Entered<'_> {
        fn drop(&mut self) {
            *self.0.held.lock() = false;
            self.0.freed.notify_all();
        }
    }
}
