//! The CM agent: the I/O shell that runs one sans-IO [`Endpoint`] for one
//! port of one device.
//!
//! [`CmAgent`] owns the port's GSI QP (QP1), its two CQs, a pool of receive
//! buffers (GRH area + 256-byte MAD each) and a pool of send buffers, both
//! in provider-registered memory, and a cache of address vectors (one per
//! peer port). It feeds every received MAD to the endpoint, sends every MAD
//! the endpoint produces as a UD SEND to QP1 of the peer (Q_Key `GSI_QKEY`,
//! the configured P_Key index), fires the endpoint's timers and delivers its
//! events.
//!
//! It runs in one of two modes:
//!
//! * **poll mode** (the default after [`CmAgent::new`]): nothing happens
//!   until the caller calls [`CmAgent::poll`] with the current time. Time
//!   is whatever the caller says, so tests are deterministic.
//! * **thread mode** ([`CmAgent::spawn`]): a background thread waits for a
//!   receive completion (CQ completion hook) or the next timer deadline and
//!   then does what `poll` does, with a monotonic clock mapped to [`Nanos`].
//!
//! User calls ([`CmAgent::listen`], [`CmAgent::connect`], ...) are thin
//! wrappers: they lock the endpoint, make the call with the agent's current
//! time, send the resulting MADs and release the lock before any event is
//! delivered.
//!
//! Events go to a registered sink ([`CmAgent::set_event_sink`]) or, with no
//! sink, wait in a queue the caller drains ([`CmAgent::next_event`]). They
//! are delivered in the order the endpoint produced them, never while the
//! endpoint lock is held; a sink may call back into the agent.
//!
//! `docs/cm-agent.md` describes threads, locks, pools and time in detail.

mod io;
mod wait;

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use al::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use al::sync::{Arc, Mutex, MutexGuard};
use al::{Error, Result};
use hca::provider::Device;

use crate::proto::{
    ConnId, ConnectParams, Disposition, Endpoint, EndpointConfig, Event, IdKey, LapParams,
    LocalPort, Nanos, PeerAddr, ProtoError, SidrParams, SidrReplyParams, State, Transmit,
};
use crate::wire::{ApStatus, RejectReason, Rep};

use io::Io;
use wait::Signal;

/// Where events go: called once per event, in order, with no agent lock
/// held. It may call any agent method, but must not own the agent: what it
/// needs of the agent for an event it cannot place, it asks for in its
/// [`Delivery`] answer, so no reference cycle and no `Weak` is needed.
///
/// (A `std` `Arc` of a closure: loom's `Arc` cannot hold a `dyn Fn`, and an
/// immutable closure box carries no state the modelled races are about.)
pub type EventSink = std::sync::Arc<dyn Fn(Event) -> Delivery + Send + Sync>;

/// What an [`EventSink`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Taken (or deliberately dropped).
    Taken,
    /// A connection or SIDR request that nobody will answer (its listener
    /// is going): the agent rejects it at once (REJ with reason
    /// NoResources) rather than leave the peer to time out.
    Refuse(ConnId),
}

/// Settings of one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// P_Key index every MAD is sent with (and QP1's own index).
    pub pkey_index: u16,
    /// Receive buffers posted on QP1.
    pub recv_buffers: u32,
    /// Send buffers (the most MADs in flight before the rest wait).
    pub send_buffers: u32,
    /// Overrides the comm id key ([`EndpointConfig::id_key`]), which is
    /// otherwise drawn from the operating system for every agent, so that
    /// no two agents (of one port, one process or two processes with the
    /// same CA GUID) share ids, and no id tells a stranger anything about
    /// another. For reproducible tests only: a known key makes every id
    /// predictable.
    pub id_key: Option<IdKey>,
    /// Overrides [`EndpointConfig::max_ceps`].
    pub max_ceps: Option<u32>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            pkey_index: 0,
            // The Linux MAD layer's QP1 queue sizes. A burst of REQs (many
            // connects at once) lands in the receive queue before the agent
            // runs; with 64 buffers a 64-connection burst plus the
            // responses in flight overflowed it and cost CM retries.
            recv_buffers: 512,
            send_buffers: 128,
            id_key: None,
            max_ceps: None,
        }
    }
}

/// Counters of one agent ([`CmAgent::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// MADs posted on QP1.
    pub mads_sent: u64,
    /// MADs that arrived on QP1 (including the malformed and ignored ones).
    /// MADs failing the P_Key or Q_Key check never arrive: the provider
    /// drops and counts them (soft: `Fabric::stats().dropped_pkey` and
    /// `dropped_qkey`).
    pub mads_received: u64,
    /// Arrived but did not decode as a CM MAD (dropped).
    pub dropped_malformed: u64,
    /// Decoded, but the endpoint ignored them (`Disposition::Ignored`).
    pub ignored: u64,
    /// Named one of this agent's connections (by its comm id, or its
    /// remote comm id, QPN and CA GUID) but came from another address than
    /// the connection's peer (on RoCE its GID, on InfiniBand its LID and
    /// GID): handled as naming no connection, so nothing changed and the
    /// sender learnt nothing ([`Endpoint::not_from_peer`]). Linux's CM has
    /// no such check. Some of these are also counted in `ignored`.
    pub not_from_peer: u64,
    /// MADs that could not be encoded or posted, or whose send completed in
    /// error (each is lost; the CM retries).
    pub send_errors: u64,
    /// Receive completions in error (including flushes at shutdown).
    pub recv_errors: u64,
    /// MADs waiting for a free send buffer.
    pub send_backlog: usize,
    /// Sends posted and not yet completed.
    pub sends_outstanding: usize,
    /// Connection CEPs in the endpoint ([`Endpoint::live_connections`]).
    pub live_connections: usize,
    /// Local comm ids allocated ([`Endpoint::allocated_ids`]).
    pub allocated_ids: usize,
    /// Thread mode: rounds served inline by the thread that delivered a
    /// MAD, instead of by a woken agent thread.
    pub served_inline: u64,
}

impl AgentStats {
    /// MADs the agent dropped after they reached QP1 (malformed).
    pub fn dropped(&self) -> u64 {
        self.dropped_malformed
    }
}

/// What one [`CmAgent::poll`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    /// MADs taken from QP1 and handed to the endpoint.
    pub received: usize,
    /// Whether due timers were fired.
    pub timers_fired: bool,
    /// The endpoint's next deadline after this poll.
    pub next_timeout: Option<Nanos>,
}

/// The agent's notion of time.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// Poll mode: the latest time given to `poll`.
    Manual(Nanos),
    /// Thread mode: `base` plus the time elapsed since `origin`.
    Monotonic { origin: Instant, base: Nanos },
}

impl Clock {
    fn now(&self) -> Nanos {
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
struct Core<D: Device> {
    ep: Endpoint,
    /// `None` once shut down.
    io: Option<Io<D>>,
    clock: Clock,
    /// MADs produced by the endpoint, waiting for a send buffer.
    backlog: VecDeque<Transmit>,
    /// Thread mode: the time the agent thread will wake up at on its own
    /// (the endpoint's next deadline when the thread last served, `u64::MAX`
    /// for none), as recorded under this lock at the end of that round.
    /// `None`: not known (no thread, or a kick is pending), so callers kick.
    thread_wakes_at: Option<Nanos>,
    /// Rounds run by `serve_inline` (`AgentStats::served_inline`).
    served_inline: u64,
    /// MADs taken from QP1 in the current round; kept between rounds so a
    /// round allocates nothing.
    received: Vec<io::Received>,
    /// Set by `spawn`: an agent thread sleeps on `Shared::signal`. Without
    /// one (poll mode, busy polling with `serve`) nobody waits for a kick
    /// or a receive-CQ notification, so neither is armed nor sent.
    threaded: bool,
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
struct Events {
    queue: VecDeque<Event>,
    sink: Option<EventSink>,
    /// A thread is inside the delivery loop (see `Shared::deliver`).
    delivering: bool,
}

struct Shared<D: Device> {
    dev: D,
    port: u8,
    local: PeerAddr,
    /// The P_Key at `config.pkey_index`: the partition every MAD of this
    /// agent is sent in.
    pkey: u16,
    config: AgentConfig,
    core: Mutex<Core<D>>,
    events: Mutex<Events>,
    signal: Arc<Signal>,
    /// Set by `shutdown`. Whoever releases the core lock after it is set
    /// destroys QP1 (see `Shared::unlock`), so shutting down never waits
    /// for another thread.
    closing: AtomicBool,
    /// `ACTIVE`, `LINGERING` (no users left: the agent thread shuts the
    /// agent down once no connection is left in timewait, unless `revive`
    /// takes it back first) or `DONE`. See `CmAgent::linger`.
    linger: AtomicU8,
    /// Set by `spawn`: lets the completion hook serve the agent inline
    /// (`serve_inline`). The hook lives inside this agent's own CQ, so the
    /// strong reference it finds here is a cycle that `release_io` breaks
    /// by emptying the slot when QP1 and its CQs go.
    inline: InlineSlot<D>,
}

const ACTIVE: u8 = 0;
const LINGERING: u8 = 1;
const DONE: u8 = 2;

/// Where the completion hook finds its agent once it runs in thread mode.
type InlineSlot<D> = Arc<Mutex<Option<Arc<Shared<D>>>>>;

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

fn shut_down() -> Error {
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
    fn deliver(&self) {
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
    fn stop(&self) {
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
    fn unlock(&self, guard: MutexGuard<'_, Core<D>>) {
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
    fn release_io(&self, core: &mut Core<D>) {
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
    fn service(&self, now: Option<Nanos>, agent_thread: bool) -> Result<PollOutcome> {
        self.service_locked(self.core.lock(), now, agent_thread)
    }

    /// Thread mode, from QP1's receive completion hook, on whichever thread
    /// delivered the MAD: serve the agent right here if its core lock is
    /// free, instead of waking the agent thread (a thread wake-up per MAD
    /// is most of a threaded connect's time). Only `try_lock`: the
    /// delivering thread may hold this agent's core lock itself (the agent
    /// answering its own MAD) or another agent's, and must never wait for
    /// one. Returns false when the caller should kick the thread instead.
    fn serve_inline(&self) -> bool {
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
                    Err(_) => io.counters.malformed += 1,
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
    fn call<R>(
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

    fn with_core<R>(&self, f: impl FnOnce(&Core<D>) -> R) -> R {
        let guard: MutexGuard<'_, Core<D>> = self.core.lock();
        let r = f(&guard);
        self.unlock(guard);
        r
    }

    /// The agent thread: serve, then sleep until kicked or the next
    /// deadline, until stopped or shut down.
    fn run(&self, origin: Instant, base: Nanos) {
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

/// A CM agent: one [`Endpoint`] on QP1 of one port. See the
/// [module documentation](self).
///
/// Generic over the provider's [`Device`]; with the soft provider it is
/// `CmAgent<soft_provider::SoftHca>`. Dropping the agent shuts it down.
pub struct CmAgent<D: Device + 'static> {
    shared: Arc<Shared<D>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl<D: Device + 'static> fmt::Debug for CmAgent<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmAgent")
            .field("port", &self.shared.port)
            .field("local", &self.shared.local)
            .finish_non_exhaustive()
    }
}

impl<D: Device + 'static> CmAgent<D> {
    /// Creates the agent for `port` (1-based) of `dev`: QP1 with its CQs,
    /// in RTS, every receive buffer posted. The agent starts in poll mode
    /// at time zero. The endpoint's CA GUID is the device's node GUID.
    pub fn new(dev: D, port: u8, config: AgentConfig) -> Result<Self> {
        let attr = dev.query();
        let port_attr = dev.query_port(port)?;
        let gid = port_attr.gid_table.first().copied().unwrap_or([0; 16]);
        let Some(&pkey) = port_attr.pkey_table.get(usize::from(config.pkey_index)) else {
            return Err(Error::invalid_parameter(format!(
                "P_Key index {} is outside port {port}'s table",
                config.pkey_index
            )));
        };
        let mut ep_config = EndpointConfig::new(attr.node_guid);
        ep_config.id_key = config.id_key.unwrap_or_else(IdKey::random);
        if let Some(max) = config.max_ceps {
            ep_config.max_ceps = max;
        }
        ep_config.local_port = Some(LocalPort {
            lid: port_attr.lid,
            lmc: port_attr.lmc,
            gid,
        });
        let signal = Arc::new(Signal::new());
        let kick = signal.clone();
        let inline: InlineSlot<D> = Arc::new(Mutex::new(None));
        let hook_inline = inline.clone();
        let io = Io::new(
            &dev,
            port,
            config.pkey_index,
            config.recv_buffers,
            config.send_buffers,
            io::hook(move || {
                let shared = hook_inline.lock().clone();
                if shared.is_some_and(|s| s.serve_inline()) {
                    return;
                }
                kick.kick()
            }),
        )?;
        let shared = Arc::new(Shared {
            port,
            local: PeerAddr {
                lid: port_attr.lid,
                gid,
            },
            pkey,
            config,
            core: Mutex::new(Core {
                ep: Endpoint::new(ep_config),
                io: Some(io),
                clock: Clock::Manual(Nanos::ZERO),
                backlog: VecDeque::new(),
                thread_wakes_at: None,
                served_inline: 0,
                received: Vec::new(),
                threaded: false,
            }),
            events: Mutex::new(Events {
                queue: VecDeque::new(),
                sink: None,
                delivering: false,
            }),
            signal,
            closing: AtomicBool::new(false),
            linger: AtomicU8::new(ACTIVE),
            inline,
            dev,
        });
        Ok(Self {
            shared,
            thread: Mutex::new(None),
        })
    }

    /// This port's address: its LID and GID index 0. Peers connect to it.
    pub fn local_addr(&self) -> PeerAddr {
        self.shared.local
    }

    /// The P_Key at this agent's P_Key index (`AgentConfig::pkey_index`).
    pub fn pkey(&self) -> u16 {
        self.shared.pkey
    }

    /// The port number.
    pub fn port(&self) -> u8 {
        self.shared.port
    }

    /// The device the agent runs on.
    pub fn device(&self) -> &D {
        &self.shared.dev
    }

    /// The agent's current time: in poll mode the latest `poll` time, in
    /// thread mode the monotonic clock.
    pub fn now(&self) -> Nanos {
        self.shared.with_core(|c| c.clock.now())
    }

    // ------------------------------------------------------------------
    // Driving
    // ------------------------------------------------------------------

    /// Poll mode: processes every received MAD, fires the timers due at
    /// `now`, sends what resulted and delivers the events. `now` earlier
    /// than a previous one is treated as the previous one. Fails once the
    /// agent is shut down or in thread mode.
    pub fn poll(&self, now: Nanos) -> Result<PollOutcome> {
        self.shared.service(Some(now), false)
    }

    /// Serves the agent once on its own clock: what [`poll`](Self::poll)
    /// does, with "now" taken from the agent's clock instead of the caller.
    /// With the manual clock that is the latest `poll` time; after
    /// [`use_monotonic_clock`](Self::use_monotonic_clock) (or in thread
    /// mode) it is the real time. Safe alongside the agent thread: both
    /// serve under the endpoint lock, so a caller that polls a threaded
    /// agent only takes some of the thread's work. Fails once shut down.
    pub fn serve(&self) -> Result<PollOutcome> {
        self.shared.service(None, false)
    }

    /// Moves the clock from manual time to the monotonic clock (going on
    /// from the current manual time) without starting the agent thread:
    /// the caller drives the agent with [`serve`](Self::serve), and timers
    /// (retries, timewait) fire when a `serve` finds them due. This is the
    /// busy-polling mode: no thread hand-off anywhere on the MAD path.
    /// Idempotent; fails once shut down.
    pub fn use_monotonic_clock(&self) -> Result<()> {
        let mut core = self.shared.core.lock();
        if core.io.is_none() {
            return Err(shut_down());
        }
        if let Clock::Manual(base) = core.clock {
            core.clock = Clock::Monotonic {
                origin: Instant::now(),
                base,
            };
        }
        Ok(())
    }

    /// Switches to thread mode: starts the agent thread, which serves the
    /// agent until [`shutdown`](Self::shutdown) or drop. The clock goes on
    /// from the current (poll-mode) time. Fails if already started or shut
    /// down.
    pub fn spawn(&self) -> Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return Err(Error::invalid_state("the CM agent thread is running"));
        }
        let (origin, base) = {
            let mut core = self.shared.core.lock();
            if core.io.is_none() {
                return Err(shut_down());
            }
            let base = core.clock.now();
            let origin = Instant::now();
            core.clock = Clock::Monotonic { origin, base };
            core.threaded = true;
            (origin, base)
        };
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("cm-agent-port{}", self.shared.port))
            .spawn(move || shared.run(origin, base))
            .map_err(|e| Error::Other(format!("cannot start the CM agent thread: {e}").into()))?;
        *thread = Some(handle);
        // From now on a MAD arriving on QP1 is served by the thread that
        // delivered it when the agent is free, the agent thread otherwise.
        *self.shared.inline.lock() = Some(self.shared.clone());
        Ok(())
    }

    /// Whether [`spawn`](Self::spawn) started the agent thread.
    pub fn is_threaded(&self) -> bool {
        self.thread.lock().is_some()
    }

    /// Stops the agent without waiting for anything: the thread (if any)
    /// is told to stop and left to end on its own after its current round
    /// (it is never joined, so this may run anywhere: on the agent thread,
    /// in an event sink, on an AL executor, under a caller's lock). QP1 and
    /// every provider object are destroyed here if the agent is idle, or
    /// else by whichever thread holds the agent's lock, as it releases it;
    /// the sink is dropped with them. Events not delivered yet stay in the
    /// queue ([`next_event`](Self::next_event)). Idempotent.
    pub fn shutdown(&self) {
        self.shared.linger.store(DONE, Ordering::Release);
        drop(self.thread.lock().take());
        self.shared.stop();
    }

    /// The port's last user is gone. A threaded agent lingers: it keeps
    /// serving (answering duplicates, timing out timewait) and shuts itself
    /// down once no connection is left, unless [`revive`](Self::revive)
    /// takes it back first. Its comm ids stay reserved meanwhile, so a new
    /// user of the port cannot hand out an id a peer still holds in
    /// timewait. Returns `false` for a polled agent (nobody would drive
    /// its timewait): the caller shuts it down. Never waits.
    pub fn linger(&self) -> bool {
        if !self.shared.core.lock().threaded {
            return false;
        }
        let lingering = self
            .shared
            .linger
            .compare_exchange(ACTIVE, LINGERING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        // The thread checks at once whether anything is left.
        self.shared.signal.kick();
        lingering
    }

    /// Takes a lingering agent back into use. `false`: it already decided
    /// to shut down (or was never lingering); make a new one.
    pub fn revive(&self) -> bool {
        self.shared
            .linger
            .compare_exchange(LINGERING, ACTIVE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// After [`shutdown`](Self::shutdown): make sure QP1 is gone by the
    /// time this returns, taking the agent's lock if a thread still holds
    /// it (a bounded wait: no agent lock holder waits on anything but
    /// leaf locks). For the one caller that needs the port's QP1 back at
    /// once: a new agent on the same port.
    pub fn finish_shutdown(&self) {
        self.shutdown();
        let mut core = self.shared.core.lock();
        self.shared.release_io(&mut core);
    }

    /// Whether QP1 and the agent's provider objects are gone (a shutdown
    /// finished). Never waits: an agent whose lock is held reads as not
    /// released.
    pub fn qp1_released(&self) -> bool {
        self.shared.core.try_lock().is_some_and(|c| c.io.is_none())
    }

    /// Whether [`shutdown`](Self::shutdown) ran.
    pub fn is_shut_down(&self) -> bool {
        self.shared.closing.load(Ordering::SeqCst)
    }

    // ------------------------------------------------------------------
    // Events
    // ------------------------------------------------------------------

    /// Sets (or with `None` clears) the event sink. Events queued while
    /// there was none are delivered to the new sink at once, in order.
    pub fn set_event_sink(&self, sink: Option<EventSink>) {
        self.shared.events.lock().sink = sink;
        self.shared.deliver();
    }

    /// With no sink set: the oldest undelivered event.
    pub fn next_event(&self) -> Option<Event> {
        self.shared.events.lock().queue.pop_front()
    }

    /// With no sink set: every undelivered event, oldest first.
    pub fn drain_events(&self) -> Vec<Event> {
        self.shared.events.lock().queue.drain(..).collect()
    }

    // ------------------------------------------------------------------
    // Introspection
    // ------------------------------------------------------------------

    /// Counters and table sizes. Reaps completed sends first (sending
    /// reaps only when the pool runs dry), so `sends_outstanding` and
    /// `send_errors` are current.
    pub fn stats(&self) -> AgentStats {
        let send_buffers = self.shared.config.send_buffers;
        let mut guard = self.shared.core.lock();
        let c = &mut *guard;
        if let Some(io) = c.io.as_mut() {
            io.reclaim(&self.shared.dev);
        }
        let io =
            c.io.as_ref()
                .map(|io| (io.counters, io.sends_outstanding(send_buffers)));
        let (k, outstanding) = io.unwrap_or_default();
        let stats = AgentStats {
            mads_sent: k.sent,
            mads_received: k.received,
            dropped_malformed: k.malformed,
            ignored: k.ignored,
            not_from_peer: c.ep.not_from_peer(),
            send_errors: k.send_errors,
            recv_errors: k.recv_errors,
            send_backlog: c.backlog.len(),
            sends_outstanding: outstanding,
            live_connections: c.ep.live_connections(),
            allocated_ids: c.ep.allocated_ids(),
            served_inline: c.served_inline,
        };
        self.shared.unlock(guard);
        stats
    }

    /// The state of a CEP (`None`: not allocated).
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.shared.with_core(|c| c.ep.state(conn))
    }

    /// Every allocated CEP and its state.
    pub fn ceps(&self) -> Vec<(ConnId, State)> {
        self.shared.with_core(|c| c.ep.ceps())
    }

    /// The endpoint's next deadline.
    pub fn next_timeout(&self) -> Option<Nanos> {
        self.shared.with_core(|c| c.ep.next_timeout())
    }

    /// Runs the endpoint's table consistency checks.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.shared.with_core(|c| c.ep.check_invariants())
    }

    // ------------------------------------------------------------------
    // User calls (see `Endpoint` for each one's meaning)
    // ------------------------------------------------------------------

    /// Listens for REQs and SIDR_REQs to `service_id`.
    pub fn listen(&self, service_id: u64) -> Result<ConnId> {
        self.listen_published(service_id, |_| {})
    }

    /// [`listen`](Self::listen), calling `publish` with the listener's id
    /// before any REQ can be matched to it. `publish` runs under the
    /// agent's lock: it may take leaf locks, never call the agent.
    pub fn listen_published(
        &self,
        service_id: u64,
        publish: impl FnOnce(ConnId),
    ) -> Result<ConnId> {
        self.shared.call(|ep, _| {
            let id = ep.listen(service_id)?;
            publish(id);
            Ok(id)
        })
    }

    /// Stops listening.
    pub fn cancel_listen(&self, listener: ConnId) -> Result<()> {
        self.shared.call(|ep, _| ep.cancel_listen(listener))
    }

    /// Sends a REQ; returns the new CEP (its id is the local comm id).
    pub fn connect(&self, params: ConnectParams) -> Result<ConnId> {
        self.connect_published(params, |_| {})
    }

    /// [`connect`](Self::connect), calling `publish` with the new id before
    /// the REQ can leave, so whatever routes the id's events is in place
    /// before the peer can answer. `publish` runs under the agent's lock:
    /// it may take leaf locks, never call the agent.
    pub fn connect_published(
        &self,
        params: ConnectParams,
        publish: impl FnOnce(ConnId),
    ) -> Result<ConnId> {
        self.shared.call(|ep, now| {
            let id = ep.connect(now, params)?;
            publish(id);
            Ok(id)
        })
    }

    /// Answers a REQ with a REP.
    pub fn accept(&self, conn: ConnId, rep: Rep) -> Result<()> {
        self.shared.call(|ep, now| ep.accept(now, conn, rep))
    }

    /// Answers a REQ or REP with a REJ.
    pub fn reject(
        &self,
        conn: ConnId,
        reason: RejectReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<()> {
        self.shared
            .call(|ep, now| ep.reject(now, conn, reason, ari, private_data))
    }

    /// Sends an MRA for the REQ, REP or LAP just received.
    pub fn send_mra(&self, conn: ConnId, service_timeout: u8, private_data: &[u8]) -> Result<()> {
        self.shared
            .call(|ep, now| ep.send_mra(now, conn, service_timeout, private_data))
    }

    /// Sends the RTU (active side).
    pub fn send_rtu(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.shared.call(|ep, _| ep.send_rtu(conn, private_data))
    }

    /// "Communication established": data arrived before the RTU.
    pub fn established(&self, conn: ConnId) -> Result<()> {
        self.shared.call(|ep, _| ep.established(conn))
    }

    /// Sends a DREQ.
    pub fn disconnect(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.shared
            .call(|ep, now| ep.disconnect(now, conn, private_data))
    }

    /// Answers a DREQ with a DREP.
    pub fn disconnect_reply(&self, conn: ConnId, private_data: &[u8]) -> Result<()> {
        self.shared
            .call(|ep, now| ep.disconnect_reply(now, conn, private_data))
    }

    /// Proposes an alternate path (LAP).
    pub fn lap(&self, conn: ConnId, params: LapParams) -> Result<()> {
        self.shared.call(|ep, now| ep.lap(now, conn, params))
    }

    /// Answers a LAP with an APR.
    pub fn apr(
        &self,
        conn: ConnId,
        status: ApStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<()> {
        self.shared
            .call(|ep, _| ep.apr(conn, status, info, private_data))
    }

    /// Sends a SIDR_REQ; returns the SIDR CEP.
    pub fn sidr_request(&self, params: SidrParams) -> Result<ConnId> {
        self.sidr_request_published(params, |_| {})
    }

    /// [`sidr_request`](Self::sidr_request), calling `publish` with the new
    /// id before the SIDR_REQ can leave (see
    /// [`connect_published`](Self::connect_published)).
    pub fn sidr_request_published(
        &self,
        params: SidrParams,
        publish: impl FnOnce(ConnId),
    ) -> Result<ConnId> {
        self.shared.call(|ep, now| {
            let id = ep.sidr_request(now, params)?;
            publish(id);
            Ok(id)
        })
    }

    /// Answers a SIDR_REQ.
    pub fn sidr_reply(&self, conn: ConnId, reply: SidrReplyParams) -> Result<()> {
        self.shared.call(|ep, _| ep.sidr_reply(conn, reply))
    }

    /// The user is done with a CEP (see `Endpoint::destroy`); only
    /// `TimewaitExited` and `Released` follow.
    pub fn destroy(&self, conn: ConnId) -> Result<()> {
        self.shared.call(|ep, now| ep.destroy(now, conn))
    }
}

impl<D: Device + 'static> Drop for CmAgent<D> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
