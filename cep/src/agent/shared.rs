//! What the agent's handle, its thread and QP1's completion hook share
//! ([`Shared`]): the endpoint with its I/O under the core lock, the event
//! queue, the wake-up signal and the shutdown and linger flags; and the
//! one service round all three run (receive, fire timers, send, collect
//! events, deliver them with no lock held), the user-call wrapper, and the
//! agent thread's loop.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use al::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use al::sync::{Arc, Mutex, MutexGuard};
use al::{Error, Result};
use provider::Device;

use super::io::{self, Io};
use super::types::{AgentConfig, Delivery, EventSink, PollOutcome};
use super::wait::Signal;
use crate::proto::{Disposition, Endpoint, Event, Nanos, PeerAddr, ProtoError, Transmit};
use crate::wire::RejectReason;

/// The agent's notion of time.
#[derive(Clone, Copy, Debug)]
pub(super) enum Clock {
    /// Poll mode: the latest time given to `poll`.
    Manual(Nanos),
    /// Thread mode: `base` plus the time elapsed since `origin`.
    Monotonic { origin: Instant, base: Nanos },
}

impl Clock {
    pub(super) fn now(&self) -> Nanos {
        match *self {
            Clock::Manual(n) => n,
            Clock::Monotonic { origin, base } => {
                let ns = u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
                base.saturating_add(ns)
            }
        }
    }
}

/// Everything guarded by the core (endpoint) lock.
pub(super) struct Core<D: Device> {
    pub(super) ep: Endpoint,
    /// `None` once shut down.
    pub(super) io: Option<Io<D>>,
    pub(super) clock: Clock,
    /// MADs produced by the endpoint, waiting for a send buffer.
    pub(super) backlog: VecDeque<Transmit>,
    /// Thread mode: the time the agent thread will wake up at on its own
    /// (the endpoint's next deadline when the thread last served, `u64::MAX`
    /// for none), as recorded under this lock at the end of that round.
    /// `None`: not known (no thread, or a kick is pending), so callers kick.
    pub(super) thread_wakes_at: Option<Nanos>,
    /// Rounds run by `serve_inline` (`AgentStats::served_inline`).
    pub(super) served_inline: u64,
    /// Rounds run by the agent thread (`AgentStats::thread_rounds`).
    pub(super) thread_rounds: u64,
    /// MADs taken from QP1 in the current round; kept between rounds so a
    /// round allocates nothing.
    pub(super) received: Vec<io::Received>,
    /// Set by `spawn`: an agent thread sleeps on `Shared::signal`. Without
    /// one (poll mode, busy polling with `serve`) nobody waits for a kick
    /// or a receive-CQ notification, so neither is armed nor sent.
    pub(super) threaded: bool,
}

impl<D: Device> Core<D> {
    /// Whether a change made under the core lock needs the agent thread
    /// woken: a send is waiting for a buffer, or the endpoint's next
    /// deadline is earlier than the one the thread sleeps until. A user
    /// call that cancels a timer (RTU, DREP...) or adds a later one does
    /// not cost the agent thread a wake-up. Clears the record when it says
    /// yes (the woken thread records anew).
    fn take_kick(&mut self) -> bool {
        let kick = match self.thread_wakes_at {
            None => true,
            Some(at) => !self.backlog.is_empty() || self.ep.next_timeout().is_some_and(|t| t < at),
        };
        if kick {
            self.thread_wakes_at = None;
        }
        kick
    }
}

/// Events waiting for delivery.
pub(super) struct Events {
    pub(super) queue: VecDeque<Event>,
    pub(super) sink: Option<EventSink>,
    /// A thread is inside the delivery loop (see `Shared::deliver`).
    pub(super) delivering: bool,
}

pub(super) struct Shared<D: Device> {
    pub(super) dev: D,
    pub(super) port: u8,
    pub(super) local: PeerAddr,
    /// The P_Key at `config.pkey_index`: the partition every MAD of this
    /// agent is sent in.
    pub(super) pkey: u16,
    pub(super) config: AgentConfig,
    pub(super) core: Mutex<Core<D>>,
    pub(super) events: Mutex<Events>,
    pub(super) signal: Arc<Signal>,
    /// Set by `shutdown`. Whoever releases the core lock after it is set
    /// destroys QP1 (see `Shared::unlock`), so shutting down never waits
    /// for another thread.
    pub(super) closing: AtomicBool,
    /// `ACTIVE`, `LINGERING` (no users left: the agent thread shuts the
    /// agent down once no connection is left in timewait, unless `revive`
    /// takes it back first) or `DONE`. See `CmAgent::linger`.
    pub(super) linger: AtomicU8,
    /// Set by `spawn`: lets the completion hook serve the agent inline
    /// (`serve_inline`). The hook lives inside this agent's own CQ, so the
    /// strong reference it finds here is a cycle that `release_io` breaks
    /// by emptying the slot when QP1 and its CQs go.
    pub(super) inline: InlineSlot<D>,
}

pub(super) const ACTIVE: u8 = 0;

pub(super) const LINGERING: u8 = 1;

pub(super) const DONE: u8 = 2;

/// Where the completion hook finds its agent once it runs in thread mode.
pub(super) type InlineSlot<D> = Arc<Mutex<Option<Arc<Shared<D>>>>>;

/// Resets `Events::delivering` even if a sink panics.
struct DeliveringGuard<'a>(&'a Mutex<Events>);

impl Drop for DeliveringGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().delivering = false;
    }
}

fn proto_error(e: ProtoError) -> Error {
    let text = e.to_string();
    match e {
        ProtoError::UnknownConn(_) => Error::NotFound(text.into()),
        ProtoError::Destroyed(_) | ProtoError::WrongState { .. } => {
            Error::InvalidState(text.into())
        }
        ProtoError::ServiceIdInUse(_) => Error::InvalidSetting(text.into()),
        ProtoError::NoFreeIds => Error::InsufficientResources(text.into()),
        ProtoError::Wire(_) | ProtoError::InvalidParam(_) => Error::InvalidParameter(text.into()),
    }
}

pub(super) fn shut_down() -> Error {
    Error::invalid_state("the CM agent is shut down")
}

impl<D: Device> Shared<D> {
    /// Moves the endpoint's transmits to the backlog and sends what the
    /// send pool allows; moves its events to the event queue. Core lock
    /// held; the events lock is taken inside it (lock order core -> events).
    fn flush(&self, core: &mut Core<D>) {
        while let Some(t) = core.ep.poll_transmit() {
            core.backlog.push_back(t);
        }
        if let Some(io) = core.io.as_mut() {
            io.send(&self.dev, &mut core.backlog);
        }
        let mut first = core.ep.poll_event();
        if first.is_some() {
            let mut ev = self.events.lock();
            while let Some(e) = first.take().or_else(|| core.ep.poll_event()) {
                ev.queue.push_back(e);
            }
        }
    }

    /// Delivers queued events to the sink, in order, with no lock held.
    /// Only one thread delivers at a time; a thread that finds another
    /// (or itself, further up the stack) delivering leaves the events to
    /// it, so events are never reordered and a sink may call the agent.
    pub(super) fn deliver(&self) {
        {
            let mut ev = self.events.lock();
            if ev.delivering || ev.sink.is_none() || ev.queue.is_empty() {
                return;
            }
            ev.delivering = true;
        }
        let _guard = DeliveringGuard(&self.events);
        loop {
            let (event, sink) = {
                let mut ev = self.events.lock();
                let Some(sink) = ev.sink.clone() else {
                    return;
                };
                let Some(event) = ev.queue.pop_front() else {
                    return;
                };
                (event, sink)
            };
            if let Delivery::Refuse(conn) = sink(event) {
                // Our own `deliver` inside `call` returns at once (this
                // thread is delivering); the REJ's events, if any, are
                // delivered by this loop. A SIDR request cannot be
                // rejected with a REJ: destroying it sends the SIDR_REP
                // (rejected) and frees it, where `reject` would fail and
                // leave it to the ~21 s answer deadline.
                let _ = self.call(|ep, now| match ep.state(conn) {
                    Some(crate::proto::State::SidrReqRcvd) => ep.destroy(now, conn),
                    _ => ep.reject(now, conn, RejectReason::NoResources, &[], &[]),
                });
            }
        }
    }

    /// Stops the agent without waiting: see [`CmAgent::shutdown`].
    pub(super) fn stop(&self) {
        self.signal.stop();
        self.closing.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if let Some(mut core) = self.core.try_lock() {
            self.release_io(&mut core);
        }
    }

    /// Releases the core lock; if a shutdown was asked meanwhile and the
    /// lock is free, finishes it (destroys QP1). The releaser and
    /// `CmAgent::shutdown` each look at the other's side after a SeqCst
    /// fence, so at least one of them sees both the flag and a free lock.
    pub(super) fn unlock(&self, guard: MutexGuard<'_, Core<D>>) {
        drop(guard);
        fence(Ordering::SeqCst);
        if self.closing.load(Ordering::Relaxed) {
            if let Some(mut core) = self.core.try_lock() {
                self.release_io(&mut core);
            }
        }
    }

    /// The end of a shutdown, core lock held: destroy QP1, its CQs and
    /// buffers, and drop the sink and the completion hook's reference.
    pub(super) fn release_io(&self, core: &mut Core<D>) {
        let Some(io) = core.io.take() else {
            return;
        };
        io.destroy(&self.dev);
        self.events.lock().sink = None;
        self.inline.lock().take();
    }

    /// The body of `poll` and of one agent-thread round: receive, fire due
    /// timers, send, collect events; then deliver them unlocked.
    /// `agent_thread`: called by the agent thread's loop, which sleeps
    /// until the returned `next_timeout` afterwards.
    pub(super) fn service(&self, now: Option<Nanos>, agent_thread: bool) -> Result<PollOutcome> {
        self.service_locked(self.core.lock(), now, agent_thread)
    }

    /// Thread mode, from QP1's receive completion hook, on whichever thread
    /// delivered the MAD: serve the agent right here if its core lock is
    /// free, instead of waking the agent thread (a thread wake-up per MAD
    /// is most of a threaded connect's time). Only `try_lock`: the
    /// delivering thread may hold this agent's core lock itself (the agent
    /// answering its own MAD) or another agent's, and must never wait for
    /// one. Returns false when the caller should kick the thread instead.
    pub(super) fn serve_inline(&self) -> bool {
        if self.signal.is_stopped() {
            return false;
        }
        let Some(mut guard) = self.core.try_lock() else {
            return false;
        };
        guard.served_inline += 1;
        self.service_locked(guard, None, false).is_ok()
    }

    fn service_locked(
        &self,
        mut guard: MutexGuard<'_, Core<D>>,
        now: Option<Nanos>,
        agent_thread: bool,
    ) -> Result<PollOutcome> {
        let core = &mut *guard;
        let now = match (now, &mut core.clock) {
            (Some(n), Clock::Manual(t)) => {
                *t = (*t).max(n);
                *t
            }
            (Some(_), Clock::Monotonic { .. }) => {
                return Err(Error::invalid_state(
                    "poll(now) is for poll mode; the agent thread drives this agent",
                ))
            }
            (None, c) => c.now(),
        };
        let Some(io) = core.io.as_mut() else {
            return Err(shut_down());
        };
        let mut out = PollOutcome::default();
        let mads = &mut core.received;
        // Poll mode needs no notification: whoever polls comes back anyway.
        let mut armed = !core.threaded;
        loop {
            mads.clear();
            let more = io.receive(&self.dev, mads);
            for m in mads.iter() {
                match core.ep.handle_datagram(now, m.from, &m.mad[..m.len]) {
                    Err(e) => {
                        tracing::debug!(target: "ibal::cm::mad", error = %e, peer_gid = %provider::trace::Gid(m.from.gid), peer_lid = m.from.lid, "CM MAD malformed, dropped");
                        io.counters.malformed += 1;
                    }
                    Ok(Disposition::Ignored(_)) => io.counters.ignored += 1,
                    Ok(_) => {}
                }
            }
            out.received += mads.len();
            // A poll that did not fill its batch found the CQ empty after
            // what it took: another poll now would find nothing (a
            // provider may try its sockets for it: a system call before
            // this round's answer goes out). Whatever arrives later comes
            // with the next poll (poll mode) or the notification armed here.
            if !more {
                if armed {
                    break;
                }
                // Arm, then look once more: a completion that arrived
                // between the last poll and the arm is not missed.
                io.arm(&self.dev);
                armed = true;
            }
        }
        if core.ep.next_timeout().is_some_and(|t| t <= now) {
            core.ep.handle_timeout(now);
            out.timers_fired = true;
        }
        self.flush(core);
        out.next_timeout = core.ep.next_timeout();
        let threaded = core.threaded;
        let kick = if agent_thread {
            core.thread_rounds += 1;
            core.thread_wakes_at = Some(out.next_timeout.unwrap_or(Nanos(u64::MAX)));
            false
        } else {
            // Someone else served (cm::poll on a threaded port): it may
            // have armed a timer earlier than the thread's.
            threaded && core.take_kick()
        };
        self.unlock(guard);
        if kick {
            self.signal.kick();
        }
        self.deliver();
        Ok(out)
    }

    /// A user call: lock, call with the current time, flush, unlock, wake
    /// the agent thread if the call left it something to do sooner than it
    /// would wake on its own (`Core::take_kick`), deliver.
    pub(super) fn call<R>(
        &self,
        f: impl FnOnce(&mut Endpoint, Nanos) -> std::result::Result<R, ProtoError>,
    ) -> Result<R> {
        let mut guard = self.core.lock();
        let core = &mut *guard;
        if core.io.is_none() {
            return Err(shut_down());
        }
        let now = core.clock.now();
        let r = f(&mut core.ep, now).map_err(proto_error);
        self.flush(core);
        let kick = core.threaded && core.take_kick();
        self.unlock(guard);
        if kick {
            self.signal.kick();
        }
        self.deliver();
        r
    }

    pub(super) fn with_core<R>(&self, f: impl FnOnce(&Core<D>) -> R) -> R {
        let guard: MutexGuard<'_, Core<D>> = self.core.lock();
        let r = f(&guard);
        self.unlock(guard);
        r
    }

    /// The agent thread: serve, then sleep until kicked or the next
    /// deadline, until stopped or shut down.
    pub(super) fn run(&self, origin: Instant, base: Nanos) {
        while !self.signal.is_stopped() {
            // The round's callbacks run on this thread once it holds no
            // lock, if their executor is idle (`al::executor::inline`).
            let callbacks = al::executor::InlineScope::enter();
            let served = self.service(None, true);
            callbacks.run();
            let Ok(out) = served else {
                break;
            };
            if self.linger.load(Ordering::Acquire) == LINGERING
                && self.with_core(|c| c.ep.live_connections() == 0)
                && self
                    .linger
                    .compare_exchange(LINGERING, DONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // Nobody uses the port and its last timewait is over.
                self.stop();
                break;
            }
            let deadline = out.next_timeout.map(|t| {
                let ns = t.0.saturating_sub(base.0);
                origin
                    .checked_add(Duration::from_nanos(ns))
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
            });
            if !self.signal.wait(deadline) {
                break;
            }
        }
    }
}
