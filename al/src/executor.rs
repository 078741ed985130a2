//! The callback executor of an AL instance.
//!
//! Every user callback (destroy callbacks, completion and async events, CM
//! events) is posted here as a job and run later, on the executor, with no
//! access-layer lock held. Jobs run one at a time in the order they were
//! posted, so each object's callbacks arrive in order; a job holds an `Arc`
//! to the object it reports on, so the object outlives its callbacks and its
//! destroy callback (posted when the last `Arc` drops) comes after all of
//! them.
//!
//! Two modes:
//! * [`ExecutorMode::Thread`] (the default): a dedicated thread per AL
//!   instance drains the queue.
//! * [`ExecutorMode::Manual`]: nothing runs until someone calls
//!   [`Executor::run_pending`] (or a blocking wait that drives it). Used by
//!   deterministic simulations and by the loom models.
//!
//! Code running on an executor is marked in a thread-local, so that blocking
//! calls (`*_sync`, AL close) made from a callback fail with
//! [`Error::WouldDeadlock`] instead of waiting for themselves.

use std::collections::VecDeque;
use std::fmt;

use crate::error::{Error, Result};
use crate::sync::{Arc, Condvar, Deadline, Mutex};

/// A unit of work for the executor.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// How an AL instance runs its callbacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecutorMode {
    /// A dedicated callback thread per AL instance.
    #[default]
    Thread,
    /// Callbacks run only when the application drives the executor.
    Manual,
}

crate::thread_local_value! {
    static ON_EXECUTOR: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// Whether the current thread is running a callback (or is an executor
/// thread). Blocking calls refuse to run here.
pub fn in_callback() -> bool {
    ON_EXECUTOR.with(|c| c.get())
}

/// Fail with [`Error::WouldDeadlock`] when called from a callback.
pub fn refuse_in_callback(what: &'static str) -> Result<()> {
    if in_callback() {
        Err(Error::WouldDeadlock(what.into()))
    } else {
        Ok(())
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs posted and not yet finished (queued plus running).
    pending: usize,
    /// Set when the owner goes away: the thread drains and exits.
    shutdown: bool,
    executed: u64,
    panicked: u64,
    /// Bumped on every post and completion; waiters compare it to know
    /// whether anything happened since they last looked.
    events: u64,
    /// A thread is draining a manual executor: others must not, or two
    /// callbacks (of one object, even) could run at once.
    draining: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled on every post and every completion: the worker waits for
    /// work, blocking callers wait for progress.
    changed: Condvar,
}

/// One AL instance's executor.
pub struct Executor {
    shared: Arc<Shared>,
    mode: ExecutorMode,
}

impl Executor {
    /// Start an executor; in thread mode this spawns its thread.
    pub fn new(mode: ExecutorMode, name: String) -> Result<Executor> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                pending: 0,
                shutdown: false,
                executed: 0,
                panicked: 0,
                events: 0,
                draining: false,
            }),
            changed: Condvar::new(),
        });
        if mode == ExecutorMode::Thread {
            spawn_worker(shared.clone(), name)?;
        }
        Ok(Executor { shared, mode })
    }

    /// The mode this executor runs in.
    pub fn mode(&self) -> ExecutorMode {
        self.mode
    }

    /// Queue a job. Never blocks on a callback and never runs one inline,
    /// so it is safe to call with locks held.
    pub fn post(&self, job: Job) {
        let mut q = self.shared.queue.lock();
        q.jobs.push_back(job);
        q.pending += 1;
        q.events += 1;
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Jobs posted and not yet finished.
    pub fn pending(&self) -> usize {
        self.shared.queue.lock().pending
    }

    /// (jobs run, jobs that panicked) so far.
    pub fn counts(&self) -> (u64, u64) {
        let q = self.shared.queue.lock();
        (q.executed, q.panicked)
    }

    /// Run queued jobs on the calling thread until the queue is empty and
    /// return how many ran. In thread mode this does nothing (the thread
    /// owns the queue); from inside a callback it does nothing either, so a
    /// callback never re-enters the executor.
    pub fn run_pending(&self) -> usize {
        if self.mode != ExecutorMode::Manual || in_callback() {
            return 0;
        }
        let mut ran = 0;
        {
            let mut q = self.shared.queue.lock();
            if q.draining && !cfg!(ibal_mutant = "executor_parallel_drain") {
                // Someone else is running callbacks; they will run ours too.
                return 0;
            }
            q.draining = true;
        }
        loop {
            let job = {
                let mut q = self.shared.queue.lock();
                let job = q.jobs.pop_front();
                if job.is_none() {
                    q.draining = false;
                }
                job
            };
            let Some(job) = job else { return ran };
            run_job(&self.shared, job);
            ran += 1;
        }
    }

    /// Block until `done()` holds, re-checking after every executor event.
    /// `done` must become true only through work the executor runs (a job)
    /// or that ends with a post (an object drop): those are the wake-ups.
    /// `done` is called with no executor lock held, so it may use the
    /// executor. In manual mode the waiting thread drives the executor.
    pub fn wait_until(&self, what: &'static str, done: impl FnMut() -> bool) -> Result<()> {
        self.wait_until_deadline(what, Deadline::never(), done)
            .map(|_| ())
    }

    /// [`wait_until`](Self::wait_until), giving up at `deadline`: `Ok(true)`
    /// once `done()` holds, `Ok(false)` if the deadline passed first. A job
    /// that never returns still blocks a manual-mode waiter (it runs on the
    /// waiting thread); in thread mode the wait ends at the deadline.
    pub fn wait_until_deadline(
        &self,
        what: &'static str,
        deadline: Deadline,
        mut done: impl FnMut() -> bool,
    ) -> Result<bool> {
        refuse_in_callback(what)?;
        loop {
            self.run_pending();
            let seen = self.shared.queue.lock().events;
            if done() {
                return Ok(true);
            }
            // Checked on every round, not only before sleeping: a stream of
            // events (a callback that keeps posting) must not keep us here.
            let left = deadline.remaining();
            if left.is_some_and(|left| left.is_zero()) {
                return Ok(false);
            }
            let mut q = self.shared.queue.lock();
            let runnable_here =
                self.mode == ExecutorMode::Manual && !q.jobs.is_empty() && !q.draining;
            if q.events != seen || runnable_here {
                continue;
            }
            match left {
                None => self.shared.changed.wait(&mut q),
                Some(left) => {
                    self.shared.changed.wait_timeout(&mut q, left);
                }
            }
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // A manual executor has no thread to finish its queue: whoever drops
        // it (the last owner of the AL instance) runs what is left, so the
        // last callbacks (the instance's own destroy callback) are not lost.
        self.run_pending();
        let mut q = self.shared.queue.lock();
        q.shutdown = true;
        drop(q);
        self.shared.changed.notify_all();
        // The worker is not joined: the last owner may be a job running on
        // the worker itself. It drains what is queued and exits.
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("mode", &self.mode)
            .field("pending", &self.pending())
            .finish()
    }
}

fn run_job(shared: &Shared, job: Job) {
    let was = ON_EXECUTOR.with(|c| c.replace(true));
    // A panicking callback must not take the executor (and every later
    // callback, and AL close) down with it: contain it and count it.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    ON_EXECUTOR.with(|c| c.set(was));
    let mut q = shared.queue.lock();
    q.pending -= 1;
    q.executed += 1;
    q.events += 1;
    if outcome.is_err() {
        q.panicked += 1;
    }
    drop(q);
    shared.changed.notify_all();
}

#[cfg(not(ibal_loom))]
fn spawn_worker(shared: Arc<Shared>, name: String) -> Result<()> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || worker(shared))
        .map(|_| ())
        .map_err(|e| Error::insufficient_resources(format!("cannot start callback thread: {e}")))
}

#[cfg(ibal_loom)]
fn spawn_worker(shared: Arc<Shared>, _name: String) -> Result<()> {
    crate::sync::thread::spawn(move || worker(shared));
    Ok(())
}

fn worker(shared: Arc<Shared>) {
    ON_EXECUTOR.with(|c| c.set(true));
    let mut q = shared.queue.lock();
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            run_job(&shared, job);
            q = shared.queue.lock();
        } else if q.shutdown {
            return;
        } else {
            shared.changed.wait(&mut q);
        }
    }
}

#[cfg(all(test, not(ibal_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn thread_mode_runs_jobs_in_order_off_the_caller() {
        let ex = Executor::new(ExecutorMode::Thread, "test-exec".into()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..100 {
            let log = log.clone();
            ex.post(Box::new(move || {
                assert!(in_callback());
                log.lock().push(i);
            }));
        }
        ex.wait_until("test", || log.lock().len() == 100).unwrap();
        assert_eq!(*log.lock(), (0..100).collect::<Vec<_>>());
        assert!(!in_callback());
    }

    #[test]
    fn manual_mode_runs_only_when_driven() {
        let ex = Executor::new(ExecutorMode::Manual, "m".into()).unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        ex.post(Box::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert_eq!(ex.pending(), 1);
        assert_eq!(ex.run_pending(), 1);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(ex.pending(), 0);
    }

    #[test]
    fn a_panicking_callback_does_not_stop_the_executor() {
        let ex = Executor::new(ExecutorMode::Thread, "p".into()).unwrap();
        ex.post(Box::new(|| panic!("user callback bug")));
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        ex.post(Box::new(move || {
            d.store(1, Ordering::SeqCst);
        }));
        ex.wait_until("test", || done.load(Ordering::SeqCst) == 1)
            .unwrap();
        ex.wait_until("test", || ex.counts().1 == 1).unwrap();
    }

    #[test]
    fn blocking_from_a_callback_is_refused() {
        let ex = Arc::new(Executor::new(ExecutorMode::Thread, "r".into()).unwrap());
        let result = Arc::new(Mutex::new(None));
        let (ex2, r2) = (ex.clone(), result.clone());
        ex.post(Box::new(move || {
            *r2.lock() = Some(ex2.wait_until("nested wait", || true));
        }));
        ex.wait_until("test", || result.lock().is_some()).unwrap();
        let got = result.lock().take().unwrap();
        assert!(matches!(got, Err(Error::WouldDeadlock(_))), "{got:?}");
    }
}
