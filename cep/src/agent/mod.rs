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
//!
//! One job per file: this one is the agent's handle ([`CmAgent`]: creation,
//! modes, shutdown and lingering, the user calls); `types.rs` the values
//! its API takes and gives; `shared.rs` the state its handle, thread and
//! completion hook share, and the one service round they all run (receive,
//! timers, send, deliver); `io.rs` QP1 and its buffer pools; `wait.rs` the
//! agent thread's wake-up signal.

mod io;
mod shared;
mod types;
mod wait;

use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

use al::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use al::sync::{Arc, Mutex};
use al::{Error, Result};
use provider::Device;

use crate::proto::{
    ConnId, ConnectParams, Endpoint, EndpointConfig, Event, IdKey, LapParams, LocalPort, Nanos,
    PeerAddr, SidrParams, SidrReplyParams, State,
};
use crate::wire::{ApStatus, RejectReason, Rep};

use io::Io;
use shared::{shut_down, Clock, Core, Events, InlineSlot, Shared, ACTIVE, DONE, LINGERING};
pub use types::{AgentConfig, AgentStats, Delivery, EventSink, PollOutcome};
use wait::Signal;

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
        if config.request_window == 0 {
            return Err(Error::invalid_parameter(
                "the CM request window must be at least 1",
            ));
        }
        let mut ep_config = EndpointConfig::new(attr.node_guid);
        ep_config.request_window = config.request_window;
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
                thread_rounds: 0,
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
            thread_rounds: c.thread_rounds,
            resends: c.ep.resends(),
            requests_queued: c.ep.requests_queued(),
            requests_waiting: c.ep.requests_waiting(),
            requests_in_flight: c.ep.requests_in_flight(),
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

    /// Sets how many unanswered requests `listener` holds before it refuses
    /// more ([`Endpoint::set_backlog`](crate::proto::Endpoint::set_backlog)).
    pub fn set_backlog(&self, listener: ConnId, backlog: u32) -> Result<()> {
        self.shared.call(|ep, _| ep.set_backlog(listener, backlog))
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
