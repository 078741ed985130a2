//! Stopping an open device without waiting where nothing may wait.
//!
//! The last handle of a device can drop anywhere: on an application
//! thread, on the AL's executor inside a callback (the CA's teardown), or
//! on one of the device's own receive or timer threads, in a completion
//! hook or a CM callback served inline there. Joining the device's
//! threads from those would wait below the top (`docs/ownership.md`,
//! "Callbacks and blocking"): a receive thread would wait for the others
//! while they may be running a callback that waits for it, or for a lock
//! the dropping thread holds. So the drop only *signals* the threads to
//! stop ([`signal_stop`]) and hands the joins to a reaper thread of its
//! own ([`reap`]), which then gives the ports' addresses and the device's
//! GUID back and closes the sockets (when no object of the device is left
//! holding them).
//!
//! A reopen right after close (the same fixed UDP port, the same device)
//! must not fail for a reaper that has not finished: opening waits for
//! the reaping of a device with the same addresses or the same GUID of
//! the same provider ([`wait_closed`], bounded by [`REOPEN_WAIT`]). Its
//! end is also visible to the application through [`CloseWatch`].

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::thread::JoinHandle;
use al::sync::Arc;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use al::sync::{Condvar, Mutex};

use crate::provider_threads::on_provider_thread;
use crate::qp::Dev;

/// Longest an open waits for the reaping of the device it would replace.
pub(crate) const REOPEN_WAIT: Duration = Duration::from_secs(5);

/// How a device's shutdown ended, shared by its reaper and its watchers.
#[derive(Default)]
pub(crate) struct Closed {
    /// The name of the thread that joined the device's threads, once done.
    joined_by: Mutex<Option<String>>,
    done: Condvar,
}

impl Closed {
    fn finish(&self, by: String) {
        *self.joined_by.lock() = Some(by);
        self.done.notify_all();
    }

    /// Waits until the shutdown is done or `timeout` passes; the name of
    /// the thread that joined, if done.
    fn wait(&self, timeout: Option<Duration>) -> Option<String> {
        let end = timeout.map_or_else(al::sync::Deadline::never, al::sync::Deadline::after);
        let mut by = self.joined_by.lock();
        while by.is_none() {
            let left = end.remaining();
            if left.is_some_and(|l| l.is_zero()) {
                break;
            }
            match left {
                Some(l) => {
                    self.done.wait_timeout(&mut by, l);
                }
                None => self.done.wait(&mut by),
            }
        }
        by.clone()
    }
}

/// A watch on a device's shutdown ([`crate::RoceDevice::close_watch`]):
/// after the last handle dropped, a reaper thread joins the device's
/// receive and timer threads, removes its ports from the provider's
/// directory, lets the provider open it again and drops its shared state
/// (its sockets close with it unless an object of the device, such as a
/// QP the application kept, still holds them).
#[derive(Clone)]
pub struct CloseWatch(pub(crate) Arc<Closed>);

impl std::fmt::Debug for CloseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloseWatch")
            .field("joined_by", &*self.0.joined_by.lock())
            .finish()
    }
}

impl CloseWatch {
    /// Waits up to `timeout` for the shutdown to finish; the name of the
    /// thread that joined the device's threads (a `roce-<name>-reaper`,
    /// never one of the device's own), or None if not finished yet.
    pub fn wait(&self, timeout: Duration) -> Option<String> {
        self.0.wait(Some(timeout))
    }
}

/// A device being reaped: what opening waits for.
struct Closing {
    /// Its ports' bound addresses.
    addrs: Vec<SocketAddr>,
    /// The provider's set of open GUIDs (identifies the provider) and the
    /// device's GUID in it.
    owner: usize,
    guid: u64,
    closed: Arc<Closed>,
}

al::global! {
    /// Every device of the process whose reaper has not finished.
    static CLOSING: Mutex<Vec<Closing>> = Mutex::new(Vec::new());
}

/// The identity of a provider's set of open GUIDs.
pub(crate) fn owner_of(open: &Arc<Mutex<HashSet<u64>>>) -> usize {
    Arc::as_ptr(open) as *const () as usize
}

/// Waits (up to [`REOPEN_WAIT`]) until no device that binds one of
/// `addrs` (fixed ports only: an ephemeral port never collides), or that
/// is device `guid` of provider `owner`, is being reaped. Returns whether
/// none is left.
pub(crate) fn wait_closed(addrs: &[SocketAddr], owner: usize, guid: u64) -> bool {
    let end = al::sync::Deadline::after(REOPEN_WAIT);
    loop {
        let pending = CLOSING
            .lock()
            .iter()
            .find(|c| {
                (c.owner == owner && c.guid == guid)
                    || addrs.iter().any(|a| a.port() != 0 && c.addrs.contains(a))
            })
            .map(|c| c.closed.clone());
        let Some(closed) = pending else {
            return true;
        };
        let left = end.remaining();
        if left.is_some_and(|l| l.is_zero()) {
            return false;
        }
        closed.wait(left);
    }
}

/// Tells the device's threads to stop and wakes them; waits for nothing.
pub(crate) fn signal_stop(shared: &Dev, stop: &AtomicBool) {
    for p in &shared.ports {
        p.flush_held();
    }
    stop.store(true, Ordering::Release);
    crate::delay::point(crate::delay::Point::StopSignalled);
    shared.timers.wake();
    for p in &shared.ports {
        // Wake the receive thread (it blocks with no timeout): an empty
        // datagram to its own socket; should that fail (no buffer), a
        // shutdown of the socket's receive side, which ends a blocked
        // receive on Linux (the call itself reports ENOTCONN on an
        // unconnected socket, after doing it).
        if p.socket.send_to(&[], p.local).is_err() {
            #[cfg(not(ibal_loom))]
            let _ = socket2::SockRef::from(&p.socket).shutdown(std::net::Shutdown::Read);
        }
    }
}

/// Joins `threads` (all but the calling thread: a hook on a device thread
/// may end the device; that thread then ends when the hook returns).
pub(crate) fn join_all(threads: Vec<JoinHandle<()>>) {
    let me = al::sync::thread::current().id();
    for h in threads {
        if h.thread().id() != me {
            let _ = h.join();
        }
    }
}

/// What a reaper finishes for a device whose last handle dropped.
pub(crate) struct Reap {
    pub(crate) shared: Arc<Dev>,
    pub(crate) threads: Vec<JoinHandle<()>>,
    pub(crate) open: Arc<Mutex<HashSet<u64>>>,
    pub(crate) closed: Arc<Closed>,
}

impl Reap {
    /// Joins the threads (or, with `join` false, leaves them to end by
    /// themselves), gives the ports and the GUID back, drops the shared
    /// state and tells the watchers.
    fn run(self, join: bool) {
        let Reap {
            shared,
            threads,
            open,
            closed,
        } = self;
        if join {
            join_all(threads);
        }
        for p in &shared.ports {
            shared.directory.remove(&p.gid, p.local);
        }
        let guid = shared.attr.node_guid;
        // The sockets close here unless an object of the device still
        // holds its shared state.
        drop(shared);
        open.lock().remove(&guid);
        CLOSING.lock().retain(|c| !Arc::ptr_eq(&c.closed, &closed));
        let by = al::sync::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        closed.finish(by);
    }
}

/// Stops the device `job` describes: signals its threads at once and
/// hands the joins and the rest to a reaper thread. If no thread can be
/// started (resources exhausted), the joins run here unless this is one of
/// the provider's threads or a callback; there the threads are left to
/// end by themselves (they were told to), unjoined.
pub(crate) fn reap(job: Reap, stop: &AtomicBool) {
    signal_stop(&job.shared, stop);
    CLOSING.lock().push(Closing {
        addrs: job.shared.ports.iter().map(|p| p.local).collect(),
        owner: owner_of(&job.open),
        guid: job.shared.attr.node_guid,
        closed: job.closed.clone(),
    });
    let name = format!("roce-{}-reaper", job.shared.attr.name);
    let slot = Arc::new(Mutex::new(Some(job)));
    let theirs = slot.clone();
    let spawned = al::sync::thread::Builder::new().name(name).spawn(move || {
        if let Some(job) = theirs.lock().take() {
            job.run(true);
        }
    });
    if spawned.is_err() {
        if let Some(job) = slot.lock().take() {
            job.run(!(on_provider_thread() || al::in_callback()));
        }
    }
}
