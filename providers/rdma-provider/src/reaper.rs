//! Nothing below the top waits (`docs/ownership.md`, "Callbacks and
//! blocking"): teardown that waits for another thread — joining a
//! device's event thread, `rdma_destroy_id` (which waits until the CM
//! event thread has acknowledged the id's events) — never runs on a
//! provider thread (a device's `rdma-ev-*` thread, the `rdma-cm-ev`
//! thread) nor inside an AL callback. There it is handed to one
//! process-wide thread, `rdma-reaper`, started at the first hand-over;
//! anywhere else (the application's own thread) it runs at once, so a
//! plain drop still finishes its teardown before it returns.

use std::cell::Cell;
// The one std primitive left in the provider crates: `al::sync` has no
// channel (loom's differs in API). The reaper's hand-over is a plain
// queue to one thread that only runs jobs; the rdma provider is never
// built under the model checker (it needs libibverbs and a kernel device,
// and its threads wait in the kernel's event channels, which loom cannot
// model).
use std::sync::mpsc::{channel, Sender};

use al::sync::Mutex;

al::thread_local_value! {
    /// Set on the provider's own threads.
    static PROVIDER_THREAD: Cell<bool> = const { Cell::new(false) };
}
al::thread_local_value! {
    /// Waiting teardowns run inline on this thread so far.
    static INLINE_WAITS: Cell<u64> = const { Cell::new(0) };
}

type Job = Box<dyn FnOnce() + Send>;

/// Marks the calling thread as one of the provider's (event threads).
pub(crate) fn mark_provider_thread() {
    PROVIDER_THREAD.with(|p| p.set(true));
}

/// Whether the calling thread must not wait: a provider thread, or a
/// thread running an AL callback (or an AL executor thread).
pub fn must_not_wait() -> bool {
    PROVIDER_THREAD.with(Cell::get) || al::in_callback()
}

/// How many waiting teardowns (event-thread joins, `rdma_destroy_id`)
/// ran inline on the calling thread so far. A provider thread or a
/// callback never adds to it: tests read it around a drop to show where
/// the wait went.
pub fn waits_on_this_thread() -> u64 {
    INLINE_WAITS.with(Cell::get)
}

fn reaper() -> Option<Sender<Job>> {
    al::global! {
        static REAPER: Mutex<Option<Sender<Job>>> = Mutex::new(None);
    }
    let mut r = REAPER.lock();
    if let Some(tx) = r.as_ref() {
        return Some(tx.clone());
    }
    let (tx, rx) = channel::<Job>();
    al::sync::thread::Builder::new()
        .name("rdma-reaper".into())
        .spawn(move || {
            // Lives as long as the process (the sender stays in REAPER);
            // each job is a teardown that may wait, and nothing waits for
            // the reaper.
            while let Ok(job) = rx.recv() {
                job();
            }
        })
        .ok()?;
    *r = Some(tx.clone());
    Some(tx)
}

/// Runs `teardown` (which may wait for another thread) now, or, on a
/// provider thread or inside a callback, hands it to the reaper. If the
/// reaper cannot be started (no thread can be spawned), it runs here: a
/// rare wait rather than a leak.
pub(crate) fn teardown(teardown: impl FnOnce() + Send + 'static) {
    if must_not_wait() {
        let job: Job = Box::new(teardown);
        match reaper() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(e) => return run_inline(e.0),
            },
            None => return run_inline(job),
        }
    }
    run_inline(Box::new(teardown));
}

fn run_inline(job: Job) {
    INLINE_WAITS.with(|c| c.set(c.get() + 1));
    job();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// On an application thread the teardown runs at once, here; on a
    /// provider thread it runs on the reaper, and the provider thread's
    /// count of inline waits does not move.
    #[test]
    fn provider_threads_hand_teardown_to_the_reaper() {
        let (tx, rx) = mpsc::channel();
        let before = waits_on_this_thread();
        let t = tx.clone();
        teardown(move || {
            t.send(al::sync::thread::current().name().map(String::from))
                .unwrap()
        });
        assert_eq!(waits_on_this_thread(), before + 1);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            al::sync::thread::current().name().map(String::from)
        );
        std::thread::spawn(move || {
            mark_provider_thread();
            teardown(move || {
                tx.send(al::sync::thread::current().name().map(String::from))
                    .unwrap()
            });
            assert_eq!(waits_on_this_thread(), 0, "no wait on a provider thread");
        })
        .join()
        .unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap().as_deref(),
            Some("rdma-reaper")
        );
    }
}
