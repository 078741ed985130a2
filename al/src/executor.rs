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
    /// Thread mode: a job is running, on the worker or inline on a thread
    /// ending an [`InlineScope`]; nobody else may start one meanwhile.
    busy: bool,
    /// Times the worker thread woke from waiting for work.
    worker_wakeups: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled on every post and every completion: blocking callers
    /// wait here for progress.
    changed: Condvar,
    /// Signalled when the worker has a job to take (a post, a shutdown, an
    /// inline run that left jobs): apart from `changed`, so a job run
    /// inline does not wake an idle worker for nothing.
    work: Condvar,
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
                busy: false,
                worker_wakeups: 0,
            }),
            changed: Condvar::new(),
            work: Condvar::new(),
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
        if self.mode == ExecutorMode::Thread && inline::defer(&self.shared) {
            // The thread's InlineScope runs it (or wakes the worker) when
            // it ends.
            return;
        }
        self.shared.work.notify_one();
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

    /// Thread mode: how often the worker thread woke up to look for work
    /// (a wake-up that found the jobs run inline costs a thread switch
    /// for nothing).
    pub fn worker_wakeups(&self) -> u64 {
        self.shared.queue.lock().worker_wakeups
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
        self.shared.work.notify_one();
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
    q.busy = false;
    if outcome.is_err() {
        q.panicked += 1;
    }
    // A worker told to shut down while this job ran inline waits for the
    // claim to go before it can exit.
    let shutting_down = q.shutdown;
    drop(q);
    if shutting_down {
        shared.work.notify_one();
    }
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
        // A thread ending an InlineScope may be running a job: wait for it
        // (its end notifies), so jobs still run one at a time, in order.
        let job = if q.busy { None } else { q.jobs.pop_front() };
        if let Some(job) = job {
            q.busy = true;
            drop(q);
            run_job(&shared, job);
            q = shared.queue.lock();
        } else if q.shutdown && q.jobs.is_empty() && !q.busy {
            return;
        } else {
            shared.work.wait(&mut q);
            q.worker_wakeups += 1;
        }
    }
}

/// Callbacks run by the thread that produced them, when it can.
///
/// A thread-mode executor wakes its worker thread for every job: on the
/// CM's path that is one thread wake-up per message on top of the one
/// that delivered the datagram (`docs/benchmarks-history.md`, "Issue 15"). A
/// thread that produces callbacks at a point where it holds no lock (a
/// provider's receive thread after it fed and drove its QPs, a CM agent
/// thread after a round) opens an [`InlineScope`]: jobs posted on it
/// meanwhile are queued as always but the worker is not woken; when the
/// scope ends, the thread runs them itself if the executor is idle
/// (nothing running, on the worker or elsewhere), in queue order, at most
/// [`inline::MAX_JOBS`] per executor, and wakes the worker for whatever
/// is left; jobs those callbacks post join the scope the same way. The
/// executor's rules hold: one job at a time (the `busy` claim), in post
/// order (one queue), never nested in another callback (not from inside
/// one), blocking calls refused inside them (the thread is marked as on an
/// executor while a job runs).
pub mod inline {
    use super::Shared;
    use crate::sync::Arc;

    /// Most jobs one scope end runs per executor before it leaves the
    /// rest to the worker (the thread has its own work waiting).
    pub const MAX_JOBS: usize = 8;

    crate::thread_local_value! {
        static SCOPE: std::cell::RefCell<Option<Vec<Arc<Shared>>>> = std::cell::RefCell::new(None);
    }

    /// Called by `post` after queueing: whether this thread has an open
    /// scope, which then owes `shared`'s worker its wake-up.
    pub(super) fn defer(shared: &Arc<Shared>) -> bool {
        SCOPE.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => match s.as_mut() {
                Some(list) => {
                    if !list.iter().any(|x| Arc::ptr_eq(x, shared)) {
                        list.push(shared.clone());
                    }
                    true
                }
                None => false,
            },
            Err(_) => false,
        })
    }

    /// An open scope on this thread (see the module). Nested scopes join
    /// the outer one, whose end runs the jobs. Dropped without
    /// [`InlineScope::run`], it only wakes the workers it owes.
    #[must_use = "end the scope with run() where the thread holds no lock"]
    pub struct InlineScope {
        outer: bool,
    }

    impl InlineScope {
        /// Opens a scope (or joins the thread's open one).
        pub fn enter() -> InlineScope {
            let outer = SCOPE.with(|s| {
                let mut s = s.borrow_mut();
                if s.is_some() {
                    return false;
                }
                *s = Some(Vec::new());
                true
            });
            InlineScope { outer }
        }

        /// Ends the scope where the thread holds no lock (a callback may
        /// call anything): runs the jobs posted meanwhile if their
        /// executor is idle, wakes its worker for the rest.
        ///
        /// The scope stays open while its jobs run, so the jobs those
        /// callbacks post (an `rtu` in a CM callback produces the next
        /// event) join it too, and run here after them instead of waking
        /// the worker for nothing (it would find this thread running them):
        /// at most [`MAX_JOBS`] per executor for the whole scope.
        pub fn run(self) {
            if !self.outer {
                return;
            }
            let inside_callback = super::in_callback();
            // (executor, jobs run here so far)
            let mut ran: Vec<(Arc<Shared>, usize)> = Vec::new();
            loop {
                let list = SCOPE.with(|s| s.borrow_mut().as_mut().map(std::mem::take));
                let Some(list) = list.filter(|l| !l.is_empty()) else {
                    break;
                };
                for shared in list {
                    if inside_callback {
                        wake(&shared);
                        continue;
                    }
                    let i = match ran.iter().position(|(x, _)| Arc::ptr_eq(x, &shared)) {
                        Some(i) => i,
                        None => {
                            ran.push((shared, 0));
                            ran.len() - 1
                        }
                    };
                    let (shared, used) = &mut ran[i];
                    let (emptied, n) = run_some(shared, MAX_JOBS - *used);
                    *used += n;
                    if !emptied {
                        wake(shared);
                    }
                }
            }
            // Closes the scope (waking for anything posted since, though
            // the loop above left nothing).
            drop(self);
        }

        fn take(&mut self) -> Option<Vec<Arc<Shared>>> {
            if !self.outer {
                return None;
            }
            self.outer = false;
            SCOPE.with(|s| s.borrow_mut().take())
        }
    }

    impl Drop for InlineScope {
        fn drop(&mut self) {
            for shared in self.take().into_iter().flatten() {
                wake(&shared);
            }
        }
    }

    /// The post's wake-ups, owed by a scope that did not run its jobs.
    fn wake(shared: &Shared) {
        shared.work.notify_one();
        shared.changed.notify_all();
    }

    /// Runs queued jobs of `shared` while it is idle, up to `budget`;
    /// returns whether it left none queued, and how many it ran. If another
    /// thread runs one (busy), that one takes the rest: the worker loops
    /// until the queue is empty, and a scope ending runs or wakes.
    fn run_some(shared: &Shared, budget: usize) -> (bool, usize) {
        for ran in 0..budget {
            let job = {
                let mut q = shared.queue.lock();
                if q.busy {
                    // Its runner may be a scope that stops at MAX_JOBS:
                    // the worker must still hear of what is queued.
                    return (q.jobs.is_empty(), ran);
                }
                let Some(job) = q.jobs.pop_front() else {
                    return (true, ran);
                };
                q.busy = true;
                job
            };
            super::run_job(shared, job);
        }
        (shared.queue.lock().jobs.is_empty(), budget)
    }
}

pub use inline::InlineScope;

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

    /// Which thread ran each job, in the order they ran.
    type RunLog = Arc<Mutex<Vec<(usize, std::thread::ThreadId)>>>;

    fn logging(log: &RunLog, i: usize) -> Job {
        let log = log.clone();
        Box::new(move || {
            assert!(in_callback());
            log.lock().push((i, std::thread::current().id()));
        })
    }

    #[test]
    fn a_scope_runs_its_jobs_on_its_thread_in_order_when_the_executor_is_idle() {
        let ex = Executor::new(ExecutorMode::Thread, "inline".into()).unwrap();
        let log: RunLog = Arc::new(Mutex::new(Vec::new()));
        let scope = InlineScope::enter();
        for i in 0..3 {
            ex.post(logging(&log, i));
        }
        // Nested scopes join the outer one.
        let inner = InlineScope::enter();
        ex.post(logging(&log, 3));
        inner.run();
        assert!(log.lock().is_empty(), "nothing runs before the scope ends");
        scope.run();
        let me = std::thread::current().id();
        assert_eq!(*log.lock(), (0..4).map(|i| (i, me)).collect::<Vec<_>>());
        assert_eq!(ex.pending(), 0);
        assert!(!in_callback());
    }

    #[test]
    fn a_scope_leaves_its_jobs_to_a_busy_worker_and_beyond_the_bound() {
        let ex = Executor::new(ExecutorMode::Thread, "busy".into()).unwrap();
        let log: RunLog = Arc::new(Mutex::new(Vec::new()));
        let (started, release) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s2, r2) = (started.clone(), release.clone());
        ex.post(Box::new(move || {
            s2.store(1, Ordering::SeqCst);
            while r2.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
        }));
        while started.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // The worker is running a job: the scope must not start another.
        let scope = InlineScope::enter();
        ex.post(logging(&log, 0));
        scope.run();
        assert!(log.lock().is_empty());
        release.store(1, Ordering::SeqCst);
        ex.wait_until("test", || log.lock().len() == 1).unwrap();
        let me = std::thread::current().id();
        assert_ne!(log.lock()[0].1, me, "the worker ran it");

        // More than MAX_JOBS: the first MAX_JOBS here, the rest on the
        // worker, all in order.
        log.lock().clear();
        let n = inline::MAX_JOBS + 5;
        let scope = InlineScope::enter();
        for i in 0..n {
            ex.post(logging(&log, i));
        }
        scope.run();
        ex.wait_until("test", || log.lock().len() == n).unwrap();
        let got = log.lock().clone();
        assert_eq!(
            got.iter().map(|e| e.0).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
        assert!(got[..inline::MAX_JOBS].iter().all(|e| e.1 == me));
    }

    #[test]
    fn a_scope_dropped_or_ended_in_a_callback_leaves_its_jobs_to_the_worker() {
        let ex = Arc::new(Executor::new(ExecutorMode::Thread, "drop".into()).unwrap());
        let log: RunLog = Arc::new(Mutex::new(Vec::new()));
        let scope = InlineScope::enter();
        ex.post(logging(&log, 0));
        drop(scope);
        ex.wait_until("test", || log.lock().len() == 1).unwrap();
        assert_ne!(log.lock()[0].1, std::thread::current().id());
        // A scope ended inside a callback never nests one callback in
        // another: the job waits for the worker.
        let (ex2, log2) = (ex.clone(), log.clone());
        ex.post(Box::new(move || {
            let scope = InlineScope::enter();
            ex2.post(logging(&log2, 1));
            scope.run();
            assert_eq!(log2.lock().len(), 1, "ran nested in this callback");
        }));
        ex.wait_until("test", || log.lock().len() == 2).unwrap();
        assert_eq!(ex.counts(), (3, 0));
    }

    #[test]
    fn jobs_posted_by_callbacks_run_inline_join_the_scope_without_waking_the_worker() {
        let ex = Arc::new(Executor::new(ExecutorMode::Thread, "chain".into()).unwrap());
        let log: RunLog = Arc::new(Mutex::new(Vec::new()));
        // Each job posts the next, up to 2 * MAX_JOBS: the first MAX_JOBS
        // run here, the rest on the worker, all in order.
        fn chained(ex: &Arc<Executor>, log: &RunLog, i: usize, last: usize) -> Job {
            let (ex, log) = (ex.clone(), log.clone());
            Box::new(move || {
                log.lock().push((i, std::thread::current().id()));
                if i < last {
                    ex.post(chained(&ex, &log, i + 1, last));
                }
            })
        }
        // The worker runs one job first, so it is surely waiting (a
        // notification sent before it first waits is not a wake-up).
        ex.post(Box::new(|| {}));
        ex.wait_until("test", || ex.pending() == 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let woken = ex.worker_wakeups();
        let scope = InlineScope::enter();
        ex.post(chained(&ex, &log, 0, 2));
        scope.run();
        let me = std::thread::current().id();
        assert_eq!(*log.lock(), (0..3).map(|i| (i, me)).collect::<Vec<_>>());
        // Give a needless wake-up time to show.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            ex.worker_wakeups(),
            woken,
            "the worker was woken for jobs run here"
        );

        log.lock().clear();
        let n = 2 * inline::MAX_JOBS;
        let scope = InlineScope::enter();
        ex.post(chained(&ex, &log, 0, n - 1));
        scope.run();
        ex.wait_until("test", || log.lock().len() == n).unwrap();
        let got = log.lock().clone();
        assert_eq!(
            got.iter().map(|e| e.0).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
        assert!(got[..inline::MAX_JOBS].iter().all(|e| e.1 == me));
        assert!(got[inline::MAX_JOBS..].iter().all(|e| e.1 != me));
        assert!(ex.worker_wakeups() > woken);
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
