//! The one synchronisation shim of the project.
//!
//! Every crate takes `Arc`, atomics, locks, the arc-swap cell, `UnsafeCell`,
//! thread-locals and process-wide lazily built values from here and from
//! nowhere else. A normal build maps them to `std`, `parking_lot` and
//! `arc-swap`; a build with `RUSTFLAGS="--cfg ibal_loom"` maps them to
//! [loom](https://docs.rs/loom) types, so the loom models in `loom-tests/`
//! check the production code itself rather than a copy of it.
//!
//! The cfg name is the project's own (`ibal_loom`, not `loom`) so that
//! dependencies which also understand `cfg(loom)` are not switched with us.
//!
//! The API is the common subset of both worlds: locks do not poison
//! (`lock()` returns the guard directly, as parking_lot does), `UnsafeCell`
//! hands out tracked pointer guards (as loom does), and [`ArcCell`] has a
//! `load` that returns a guard dereferencing to the current `Arc`.

#[cfg(not(ibal_loom))]
mod imp {
    pub use std::sync::Arc;

    /// Atomic integer and pointer types.
    pub mod atomic {
        pub use std::sync::atomic::{
            fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
        };
    }

    /// A mutual-exclusion lock that does not poison.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);
    /// Guard of [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// An unlocked mutex holding `value`.
        pub fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }
        /// Lock, waiting for the holder if any.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
        /// The lock if it is free now (`None` if held, by this thread too).
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }
        /// The value, consuming the mutex.
        pub fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    /// A reader-writer lock that does not poison.
    #[derive(Debug, Default)]
    pub struct RwLock<T>(parking_lot::RwLock<T>);
    /// Shared guard of [`RwLock`].
    pub type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
    /// Exclusive guard of [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        /// An unlocked lock holding `value`.
        pub fn new(value: T) -> Self {
            RwLock(parking_lot::RwLock::new(value))
        }
        /// Lock for reading (shared).
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }
        /// Lock for writing (exclusive).
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        /// A condition variable nobody waits on.
        pub fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }
        /// Release `guard`'s lock, wait for a notification, lock again.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            self.0.wait(guard);
        }
        /// Wait at most `timeout`; returns whether it timed out.
        pub fn wait_timeout<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            timeout: std::time::Duration,
        ) -> bool {
            self.0.wait_for(guard, timeout).timed_out()
        }
        /// Wake every waiter.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
        /// Wake one waiter.
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    /// When a bounded wait gives up. `None` inside means no limit (a
    /// timeout too large for the clock).
    #[derive(Clone, Copy, Debug)]
    pub struct Deadline(Option<std::time::Instant>);

    impl Deadline {
        /// `timeout` from now.
        pub fn after(timeout: std::time::Duration) -> Deadline {
            Deadline(std::time::Instant::now().checked_add(timeout))
        }
        /// A deadline that never passes.
        pub fn never() -> Deadline {
            Deadline(None)
        }
        /// Time left: `None` for no limit, zero once the deadline has passed.
        pub fn remaining(&self) -> Option<std::time::Duration> {
            self.0
                .map(|at| at.saturating_duration_since(std::time::Instant::now()))
        }
    }

    /// A cell holding an `Arc` that readers load without taking a lock.
    pub struct ArcCell<T>(arc_swap::ArcSwap<T>);
    /// What [`ArcCell::load`] returns: dereferences to the `Arc` current at load time.
    pub type ArcCellGuard<T> = arc_swap::Guard<Arc<T>>;

    impl<T> ArcCell<T> {
        /// A cell holding `value`.
        pub fn new(value: Arc<T>) -> Self {
            ArcCell(arc_swap::ArcSwap::new(value))
        }
        /// The current value, without a lock or a reference count update.
        pub fn load(&self) -> ArcCellGuard<T> {
            self.0.load()
        }
        /// The current value as an owned `Arc`.
        pub fn load_full(&self) -> Arc<T> {
            self.0.load_full()
        }
        /// Replace the value.
        pub fn store(&self, value: Arc<T>) {
            self.0.store(value)
        }
        /// Replace the value, returning the old one.
        pub fn swap(&self, value: Arc<T>) -> Arc<T> {
            self.0.swap(value)
        }
    }

    /// Interior mutability whose accesses loom can track.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// A cell holding `value`.
        pub const fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }
        /// A shared-access pointer; under loom the read counts as in progress
        /// for as long as the returned guard lives.
        #[inline(always)]
        pub fn get(&self) -> ConstPtr<T> {
            ConstPtr(self.0.get())
        }
        /// An exclusive-access pointer; under loom the write counts as in
        /// progress for as long as the returned guard lives.
        #[inline(always)]
        pub fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// See [`UnsafeCell::get`].
    #[derive(Debug)]
    pub struct ConstPtr<T>(*const T);
    impl<T> ConstPtr<T> {
        /// # Safety
        /// As dereferencing `*const T`: no exclusive access may overlap the
        /// returned reference's life, and the cell must outlive it.
        #[inline(always)]
        pub unsafe fn deref(&self) -> &T {
            // SAFETY: forwarded to the caller (see the function's contract).
            unsafe { &*self.0 }
        }
    }

    /// See [`UnsafeCell::get_mut`].
    #[derive(Debug)]
    pub struct MutPtr<T>(*mut T);
    impl<T> MutPtr<T> {
        /// # Safety
        /// As dereferencing `*mut T`: no other access may overlap the
        /// returned reference's life, and the cell must outlive it.
        #[inline(always)]
        #[allow(clippy::mut_from_ref)]
        pub unsafe fn deref(&self) -> &mut T {
            // SAFETY: forwarded to the caller (see the function's contract).
            unsafe { &mut *self.0 }
        }
    }

    /// Threads (real ones in a normal build).
    pub mod thread {
        pub use std::thread::{
            current, park, park_timeout, sleep, spawn, yield_now, Builder, JoinHandle, Thread,
        };
    }

    /// A weak reference to an [`Arc`]'s value (std's). loom's `Arc` has no
    /// weak count, so this exists in the normal build only: code that keeps
    /// a `Weak` says under `cfg(ibal_loom)` what it does instead.
    pub use std::sync::Weak;

    /// A cell written once (std's `OnceLock`; under loom a flag and a cell
    /// the model checker tracks).
    pub use std::sync::OnceLock;

    /// A hint to use inside a spin loop; under loom it yields to the model
    /// scheduler so a spinning thread cannot starve the one it waits for.
    #[inline(always)]
    pub fn spin_hint() {
        std::hint::spin_loop();
    }

    /// A process-wide value built on first use (`std::sync::LazyLock`, or
    /// loom's per-execution lazy static under the model checker).
    #[macro_export]
    macro_rules! global {
        ($(#[$attr:meta])* static $name:ident : $ty:ty = $init:expr;) => {
            $(#[$attr])* static $name: ::std::sync::LazyLock<$ty> =
                ::std::sync::LazyLock::new(|| $init);
        };
    }

    /// A thread-local value (std's, or loom's per-model-thread one).
    #[macro_export]
    macro_rules! thread_local_value {
        ($(#[$attr:meta])* $vis:vis static $name:ident : $ty:ty = const $init:block;) => {
            ::std::thread_local! { $(#[$attr])* $vis static $name: $ty = const $init; }
        };
        ($(#[$attr:meta])* $vis:vis static $name:ident : $ty:ty = $init:expr;) => {
            ::std::thread_local! { $(#[$attr])* $vis static $name: $ty = $init; }
        };
    }
}

#[cfg(ibal_loom)]
mod imp {
    pub use loom::sync::Arc;

    /// Atomic integer and pointer types.
    pub mod atomic {
        pub use loom::sync::atomic::{
            fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
        };
    }

    /// A mutual-exclusion lock that does not poison.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            // A poisoned lock means a model thread panicked: the model fails anyway.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// The lock if it is free now (`None` if held).
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// A reader-writer lock that does not poison.
    #[derive(Debug, Default)]
    pub struct RwLock<T>(loom::sync::RwLock<T>);
    pub type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        pub fn wait<'a, T>(&self, guard: &mut MutexGuard<'a, T>) {
            // loom's condvar consumes and returns the guard; swap it through a
            // temporary so callers keep parking_lot's `&mut guard` signature.
            replace_with_guard(guard, |g| self.0.wait(g).unwrap_or_else(|e| e.into_inner()));
        }
        /// loom has no clock: a timed wait is a wait that may also return
        /// spuriously, which is all a correct caller may assume anyway.
        pub fn wait_timeout<'a, T>(
            &self,
            guard: &mut MutexGuard<'a, T>,
            timeout: std::time::Duration,
        ) -> bool {
            let mut timed_out = false;
            replace_with_guard(guard, |g| {
                let (g, r) = self
                    .0
                    .wait_timeout(g, timeout)
                    .unwrap_or_else(|e| e.into_inner());
                timed_out = r.timed_out();
                g
            });
            timed_out
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    fn replace_with_guard<'a, T>(
        slot: &mut MutexGuard<'a, T>,
        f: impl FnOnce(MutexGuard<'a, T>) -> MutexGuard<'a, T>,
    ) {
        // SAFETY: the guard is read out and a guard is written back before
        // anything else can observe `slot`; `f` does not unwind in a model
        // that passes (a loom failure aborts the whole execution anyway).
        unsafe {
            let g = std::ptr::read(slot);
            std::ptr::write(slot, f(g));
        }
    }

    /// loom has no clock, and a model must not depend on one: under the
    /// model checker every deadline is "never", so a bounded wait is the
    /// unbounded wait it bounds (a model that would wait forever is reported
    /// by loom as a deadlock instead).
    #[derive(Clone, Copy, Debug)]
    pub struct Deadline;

    impl Deadline {
        pub fn after(_timeout: std::time::Duration) -> Deadline {
            Deadline
        }
        pub fn never() -> Deadline {
            Deadline
        }
        pub fn remaining(&self) -> Option<std::time::Duration> {
            None
        }
    }

    /// Under loom the lock-free cell becomes a lock around an `Arc`.
    pub struct ArcCell<T>(loom::sync::Mutex<Arc<T>>);
    pub type ArcCellGuard<T> = Arc<T>;

    impl<T> ArcCell<T> {
        pub fn new(value: Arc<T>) -> Self {
            ArcCell(loom::sync::Mutex::new(value))
        }
        pub fn load(&self) -> ArcCellGuard<T> {
            self.0.lock().unwrap().clone()
        }
        pub fn load_full(&self) -> Arc<T> {
            self.0.lock().unwrap().clone()
        }
        pub fn store(&self, value: Arc<T>) {
            *self.0.lock().unwrap() = value;
        }
        pub fn swap(&self, value: Arc<T>) -> Arc<T> {
            std::mem::replace(&mut *self.0.lock().unwrap(), value)
        }
    }

    /// Interior mutability whose accesses loom tracks.
    #[derive(Debug)]
    pub struct UnsafeCell<T>(loom::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub fn new(value: T) -> Self {
            UnsafeCell(loom::cell::UnsafeCell::new(value))
        }
        #[track_caller]
        pub fn get(&self) -> ConstPtr<T> {
            self.0.get()
        }
        #[track_caller]
        pub fn get_mut(&self) -> MutPtr<T> {
            self.0.get_mut()
        }
    }

    pub use loom::cell::{ConstPtr, MutPtr};

    /// Threads (loom's model threads).
    pub mod thread {
        pub use loom::thread::{current, park, spawn, yield_now, Builder, JoinHandle, Thread};

        /// loom has no clock: a timed park is a park that returned at once,
        /// spuriously, which its contract allows (the caller re-checks its
        /// condition and parks again); a yield lets the model run the others.
        pub fn park_timeout(_timeout: std::time::Duration) {
            loom::thread::yield_now();
        }

        /// loom has no clock: a sleep is a yield to the other model threads.
        pub fn sleep(_duration: std::time::Duration) {
            loom::thread::yield_now();
        }
    }

    /// A cell written once. loom has no `OnceLock`: this one publishes the
    /// value with a release store of a flag the model checker tracks, and
    /// serialises writers with a lock.
    pub struct OnceLock<T> {
        set: loom::sync::atomic::AtomicBool,
        writer: loom::sync::Mutex<()>,
        value: std::cell::UnsafeCell<Option<T>>,
    }

    // SAFETY: the value is written once, under `writer`, before `set` is
    // stored with release; readers read it only after loading `set` with
    // acquire. So a `&OnceLock<T>` shared between threads gives each a `&T`
    // (needs `T: Sync`) and the value may have been made on another thread
    // (needs `T: Send`), as for std's `OnceLock`.
    unsafe impl<T: Send + Sync> Sync for OnceLock<T> {}
    // SAFETY: moving the cell moves the value (`T: Send`).
    unsafe impl<T: Send> Send for OnceLock<T> {}

    impl<T> Default for OnceLock<T> {
        fn default() -> Self {
            Self::new()
        }
    }

    impl<T> OnceLock<T> {
        pub fn new() -> Self {
            OnceLock {
                set: loom::sync::atomic::AtomicBool::new(false),
                writer: loom::sync::Mutex::new(()),
                value: std::cell::UnsafeCell::new(None),
            }
        }
        pub fn get(&self) -> Option<&T> {
            if self.set.load(loom::sync::atomic::Ordering::Acquire) {
                // SAFETY: `set` is stored (release) only after the value was
                // written, and the value is never written again.
                unsafe { (*self.value.get()).as_ref() }
            } else {
                None
            }
        }
        /// Stores `value` unless a value is there: `Err(value)` then.
        pub fn set(&self, value: T) -> Result<(), T> {
            let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            if self.set.load(loom::sync::atomic::Ordering::Acquire) {
                return Err(value);
            }
            // SAFETY: writers are serialised by `writer` and no reader reads
            // before `set` is true, which happens below.
            unsafe { *self.value.get() = Some(value) };
            self.set.store(true, loom::sync::atomic::Ordering::Release);
            Ok(())
        }
        pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
            if let Some(v) = self.get() {
                return v;
            }
            let _ = self.set(f());
            self.get().expect("set above")
        }
    }

    /// Yield to the model scheduler inside a spin loop.
    #[inline(always)]
    pub fn spin_hint() {
        loom::thread::yield_now();
    }

    /// A process-wide value built on first use; per execution under loom.
    #[macro_export]
    macro_rules! global {
        ($(#[$attr:meta])* static $name:ident : $ty:ty = $init:expr;) => {
            $crate::sync::__loom::lazy_static! { $(#[$attr])* static ref $name: $ty = $init; }
        };
    }

    /// A thread-local value, one per loom model thread.
    #[macro_export]
    macro_rules! thread_local_value {
        ($(#[$attr:meta])* $vis:vis static $name:ident : $ty:ty = const $init:block;) => {
            $crate::sync::__loom::thread_local! { $(#[$attr])* $vis static $name: $ty = $init; }
        };
        ($(#[$attr:meta])* $vis:vis static $name:ident : $ty:ty = $init:expr;) => {
            $crate::sync::__loom::thread_local! { $(#[$attr])* $vis static $name: $ty = $init; }
        };
    }

    #[doc(hidden)]
    pub use loom as __loom;
}

pub use imp::*;

/// `UnsafeCell` and its pointer guards.
pub mod cell {
    pub use super::imp::{ConstPtr, MutPtr, UnsafeCell};
}
