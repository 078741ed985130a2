//! Connection endpoints (CEPs) and listens as access-layer objects.
//!
//! This is the user-facing connection manager: `listen`, `connect`,
//! `accept`, `rtu`, `reject`, `mra`, `disconnect`, `disconnect_reply`,
//! `lap`, `apr`, SIDR, and destroy through `al.destroy`. Underneath, one
//! [`CmAgent`] per device port (shared by every AL instance of the process)
//! runs the protocol on QP1.
//!
//! * A CEP is a top-level object of its AL (AL close reclaims it after its
//!   teardown sent the REJ or DREQ its state calls for).
//! * A CEP is bound to its QP only through the QP's [`qp::CidSlot`], with
//!   the protocol of [`qp::cid`]: connecting or accepting on a bound
//!   QP fails (`AlreadyConnected`, or `QpInTimewait` while the old
//!   connection is in timewait) and leaks nothing; connect or accept racing
//!   QP destroy has one winner and the loser's CEP is destroyed; QP destroy
//!   destroys the bound CEP; when a connection ends (rejected, timed out,
//!   disconnected and out of timewait) the CEP is unbound and destroyed.
//! * Events reach the user on the AL executor, in order per CEP, with a
//!   reference to the CEP held across the callback. Protocol reactions that
//!   touch the QP (passive side to RTS when established, QP to ERR when the
//!   connection ends) run in the same job, just before the callback.
//!
//! Lock order: CEP state -> port routes -> (agent endpoint, executor queue).
//! The agent delivers events with none of its locks held; the event sink
//! takes only the routes lock, and never calls the agent while holding it.

use std::fmt;

use al::fast_hash::{id_map, IdMap};
use al::sync::{Arc, Mutex};
use al::{create, post_callback, AlInstance, Error, Handle, Kind, Obj, Object, RawHandle, Result};
use hca::provider::{Access, AvAttr, Mtu, QpModify, QpState};
use hca::verbs::{Ca, Dev};
use qp::{CidState, Qp};

use crate::agent::{AgentConfig, CmAgent, EventSink};
use crate::proto::{
    ConnId, ConnectParams, Event, LapParams, PeerAddr, SidrParams, SidrReplyParams,
};
use crate::wire::{ApStatus, PathInfo, PrivateData, RejectReason, Rep, Req, TransportType};
use qp::cid as binding;

/// Called on the AL executor for every event of a CEP.
pub type CmHandler = std::sync::Arc<dyn Fn(Handle<Cep>, &Event) + Send + Sync>;
/// Called on the AL executor when a REQ (or SIDR_REQ) matches a listen: the
/// new CEP (in REQ_RCVD) and the event that created it. Answer with
/// [`accept`], [`reject`] or [`mra`] (or [`sidr_reply`]).
pub type ListenHandler = std::sync::Arc<dyn Fn(Handle<Listen>, Handle<Cep>, &Event) + Send + Sync>;

// ------------------------------------------------------------ port agents --

/// The CM of one device port: its agent and the table that routes the
/// agent's events to CEP and listen objects.
pub struct PortCm {
    key: (usize, u8),
    drive: CmDrive,
    agent: CmAgent<Dev>,
    routes: std::sync::Arc<Routes>,
}

#[derive(Clone, Copy, Debug)]
enum Route {
    Cep(Handle<Cep>),
    Listen(Handle<Listen>),
}

/// ConnId -> object, plus events that arrived before their CEP registered.
#[derive(Default)]
struct Routes {
    inner: Mutex<RouteTable>,
    /// The port these routes belong to, set once it exists: refusing a
    /// request must reach the agent even when its listen is already out of
    /// the handle table (a listen destroy removes it before its teardown
    /// cancels the listen in the agent).
    port: std::sync::OnceLock<std::sync::Weak<PortCm>>,
}

#[derive(Default)]
struct RouteTable {
    routes: IdMap<ConnId, Route>,
    /// Events for a connection whose `connect` has not returned yet (the
    /// peer can answer before the caller records the id). Delivered, in
    /// order, by the registration.
    parked: IdMap<ConnId, Vec<Event>>,
}

struct Registry {
    /// Keyed by (device instance, port): ours, so the id hash (every
    /// connect and every passive CEP looks its port up here).
    ports: IdMap<(usize, u8), (std::sync::Arc<PortCm>, usize)>,
    /// Ports whose agent is shutting down: a new agent for the port must
    /// wait, because the old one still holds the port's QP1.
    closing: std::collections::HashSet<(usize, u8)>,
}

struct RegistryCell {
    registry: Mutex<Registry>,
    /// Signalled when a port's shutdown finishes.
    closed: al::sync::Condvar,
}

fn registry() -> &'static RegistryCell {
    al::global! {
        static REGISTRY: RegistryCell = RegistryCell {
            registry: Mutex::new(Registry {
                ports: id_map(),
                closing: Default::default(),
            }),
            closed: al::sync::Condvar::new(),
        };
    }
    &REGISTRY
}

/// How a port's CM agent is driven. Chosen by whoever attaches the port
/// first ([`attach_ca_with`]); it holds until the last user of the port is
/// gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CmDrive {
    /// An agent thread per port wakes on every received MAD and timer.
    /// Nothing to do for the application; each MAD costs a thread wake-up.
    #[default]
    Thread,
    /// No agent thread: the application calls [`poll`] (as it polls its
    /// CQs) and every received MAD is handled on that thread. With an AL in
    /// [`al::ExecutorMode::Manual`], a connection can be set up with no
    /// thread hand-off at all. Retries and timewait advance only while the
    /// port is polled.
    Poll,
}

/// A counted use of a port's CM; the last use shuts the agent down.
struct PortUse(std::sync::Arc<PortCm>);

impl PortUse {
    /// A use of `port`'s CM, starting its agent if it has none. `drive`
    /// `None` takes the port as it is (a new one is threaded); `Some` must
    /// match how the port already runs.
    fn acquire(ca: &Obj<Ca>, port: u8, drive: Option<CmDrive>) -> Result<PortUse> {
        let key = (ca.device().instance_key(), port);
        let cell = registry();
        let mut reg = cell.registry.lock();
        while reg.closing.contains(&key) {
            cell.closed.wait(&mut reg);
        }
        if let Some((pcm, users)) = reg.ports.get_mut(&key) {
            if drive.is_some_and(|d| d != pcm.drive) {
                return Err(Error::InvalidSetting(
                    format!(
                        "port {port}'s CM already runs in {:?} mode; detach it everywhere first",
                        pcm.drive
                    )
                    .into(),
                ));
            }
            *users += 1;
            return Ok(PortUse(pcm.clone()));
        }
        let drive = drive.unwrap_or_default();
        let agent = CmAgent::new(ca.device().clone(), port, AgentConfig::default())?;
        let routes = std::sync::Arc::new(Routes::default());
        let sink_routes = routes.clone();
        let sink: EventSink = std::sync::Arc::new(move |ev| deliver(&sink_routes, ev));
        agent.set_event_sink(Some(sink));
        match drive {
            CmDrive::Thread => agent.spawn()?,
            // Under loom time stands still (timers never fire), so every
            // explored execution sees the same clock.
            #[cfg(not(ibal_loom))]
            CmDrive::Poll => agent.use_monotonic_clock()?,
            #[cfg(ibal_loom)]
            CmDrive::Poll => {}
        }
        let pcm = std::sync::Arc::new(PortCm {
            key,
            drive,
            agent,
            routes,
        });
        let _ = pcm.routes.port.set(std::sync::Arc::downgrade(&pcm));
        reg.ports.insert(key, (pcm.clone(), 1));
        Ok(PortUse(pcm))
    }
}

impl Clone for PortUse {
    fn clone(&self) -> Self {
        let mut reg = registry().registry.lock();
        if let Some((_, users)) = reg.ports.get_mut(&self.0.key) {
            *users += 1;
        }
        PortUse(self.0.clone())
    }
}

impl Drop for PortUse {
    fn drop(&mut self) {
        let cell = registry();
        let mut reg = cell.registry.lock();
        let last = match reg.ports.get_mut(&self.0.key) {
            Some((_, users)) => {
                *users -= 1;
                *users == 0
            }
            None => false,
        };
        if !last {
            return;
        }
        reg.ports.remove(&self.0.key);
        reg.closing.insert(self.0.key);
        drop(reg);
        // Off the registry lock: shutting down may join the agent thread,
        // whose event sink can take the registry lock.
        self.0.agent.shutdown();
        cell.registry.lock().closing.remove(&self.0.key);
        cell.closed.notify_all();
    }
}

/// What routing decided to do once the routes lock is released: these
/// call the agent or destroy a CEP (whose teardown takes the routes lock).
enum After {
    /// Refuse a request whose listen is gone or closing.
    Refuse(Handle<Listen>, ConnId),
    /// End a request whose listen was cancelled after it was routed.
    DestroyCep(Handle<Cep>),
}

impl After {
    fn run(self, routes: &Routes) {
        match self {
            After::Refuse(listen, conn) => refuse(routes, listen, conn),
            After::DestroyCep(cep) => destroy_cep(cep.raw()),
        }
    }
}

/// The agent's event sink: route each event to its object, in order.
fn deliver(routes: &Routes, ev: Event) {
    let after = {
        let mut table = routes.inner.lock();
        route_event(&mut table, ev)
    };
    if let Some(after) = after {
        after.run(routes);
    }
}

/// The routing key of an event: a request names the new connection but
/// belongs to its listener.
fn route_key(ev: &Event) -> ConnId {
    match ev {
        Event::ConnectRequest { listener, .. } | Event::SidrRequest { listener, .. } => *listener,
        other => other.conn(),
    }
}

/// Route one event with the routes lock held (the caller's `table`).
/// Returns what to do once the lock is released.
fn route_event(table: &mut RouteTable, ev: Event) -> Option<After> {
    let key = route_key(&ev);
    match table.routes.get(&key).copied() {
        Some(Route::Cep(cep)) => {
            if matches!(ev, Event::Released { .. }) {
                table.routes.remove(&key);
            }
            dispatch_cep(cep, ev);
            None
        }
        Some(Route::Listen(listen)) => match ev {
            Event::ConnectRequest { conn: new, .. } | Event::SidrRequest { conn: new, .. } => {
                match new_passive_cep(listen, new) {
                    Some(cep) => {
                        table.routes.insert(new, Route::Cep(cep));
                        dispatch_request(listen, cep, ev)
                    }
                    // The listen is gone or its AL is closing.
                    None => Some(After::Refuse(listen, new)),
                }
            }
            Event::Released { .. } => {
                table.routes.remove(&key);
                None
            }
            _ => None,
        },
        None => {
            // Not registered (yet). The end of a connection nobody holds is
            // dropped; anything else waits for its registration.
            if !matches!(ev, Event::Released { .. } | Event::TimewaitExited { .. }) {
                table.parked.entry(key).or_default().push(ev);
            } else {
                table.parked.remove(&key);
            }
            None
        }
    }
}

/// Record `key -> route` and route, in order, what arrived before. The
/// agent must not be called with the routes lock held (it may deliver
/// events on the calling thread, into `deliver`, which takes that lock), so
/// registrations happen after the agent call that produced the id.
fn register(routes: &Routes, key: ConnId, route: Route) {
    let after: Vec<After> = {
        let mut table = routes.inner.lock();
        table.routes.insert(key, route);
        let parked = table.parked.remove(&key).unwrap_or_default();
        parked
            .into_iter()
            .filter_map(|ev| route_event(&mut table, ev))
            .collect()
    };
    for a in after {
        a.run(routes);
    }
}

fn refuse(routes: &Routes, listen: Handle<Listen>, conn: ConnId) {
    #[cfg(not(ibal_mutant = "refuse_through_listen"))]
    let port = {
        let _ = listen;
        routes.port.get().and_then(std::sync::Weak::upgrade)
    };
    // MUTANT (loom-tests/run.sh --mutants): the agent reached through the
    // listen, which a destroy has already taken out of the table: the
    // request is left in REQ_RCVD, unanswered.
    #[cfg(ibal_mutant = "refuse_through_listen")]
    let port = {
        let _ = routes;
        Listen::table()
            .get(listen.raw())
            .ok()
            .map(|l| l.port.0.clone())
    };
    if let Some(port) = port {
        let _ = port.agent.reject(conn, RejectReason::NoResources, &[], &[]);
    }
}

fn new_passive_cep(listen: Handle<Listen>, conn: ConnId) -> Option<Handle<Cep>> {
    let l = Listen::table().get(listen.raw()).ok()?.to_arc();
    if l.core().is_destroying() {
        return None;
    }
    let obj = create(l.al(), None, |_| {
        Ok(Cep {
            port: l.port.clone(),
            handler: l.cep_handler.clone(),
            state: Mutex::new(CepState {
                conn: Some(conn),
                passive: true,
                ..CepState::default()
            }),
        })
    })
    .ok()?;
    Some(obj.handle())
}

fn dispatch_request(listen: Handle<Listen>, cep: Handle<Cep>, ev: Event) -> Option<After> {
    let Ok(l) = Listen::table().get(listen.raw()) else {
        // The listen was cancelled between routing and now: nobody will
        // answer this request, so end it (the CEP's teardown sends the
        // REJ) rather than leave the peer to time out.
        #[cfg(not(ibal_mutant = "listen_cancel_leaks_request"))]
        return Some(After::DestroyCep(cep));
        // MUTANT (loom-tests/run.sh --mutants): the request of a cancelled
        // listen dropped without ending its CEP (no REJ, the CEP leaks).
        #[cfg(ibal_mutant = "listen_cancel_leaks_request")]
        return {
            let _ = After::DestroyCep(cep);
            None
        };
    };
    let l = l.to_arc();
    // Remember the REQ on the CEP (accept derives the QP attributes from it).
    // Taking a CEP's state lock under the routes lock inverts the usual
    // order, but this CEP was created just now under that same lock and no
    // one else can name it yet.
    if let (Event::ConnectRequest { req, peer, .. }, Ok(c)) = (&ev, Cep::table().get(cep.raw())) {
        let mut st = c.state.lock();
        st.req = Some(**req);
        st.peer = Some(*peer);
    }
    post_callback(&l, move |l| {
        if l.core().is_destroying() {
            // Cancelled while this request waited for the executor.
            // (MUTANT listen_cancel_drops_queued_request: dropped without
            // ending its CEP.)
            #[cfg(not(ibal_mutant = "listen_cancel_drops_queued_request"))]
            destroy_cep(cep.raw());
            return;
        }
        (l.on_request)(l.handle(), cep, &ev)
    });
    None
}

fn dispatch_cep(cep: Handle<Cep>, ev: Event) {
    let Ok(c) = Cep::table().get(cep.raw()) else {
        // Destroyed meanwhile: its teardown already told the agent.
        return;
    };
    post_callback(&c.to_arc(), move |c| {
        c.react(&ev);
        (c.handler)(c.handle(), &ev);
        if matches!(ev, Event::Released { .. }) {
            Cep::finish(c);
        }
    });
}

// -------------------------------------------------------------- CM ports --

/// The connection manager attached to one port of an opened CA: while it
/// lives, the port answers CM MADs (a REQ for an unknown service gets a REJ,
/// a DREQ for an unknown connection a DREP), as every IB port must. A child
/// of its CA, so closing the CA (or the AL) detaches it.
pub struct CmPort {
    port: PortUse,
}

impl Object for CmPort {
    const KIND: Kind = Kind::CM_PORT;
    al::object_table!(CmPort);
}

impl CmPort {
    /// The port number.
    pub fn port(&self) -> u8 {
        self.port.0.agent.port()
    }
    /// The agent's counters.
    pub fn stats(&self) -> crate::agent::AgentStats {
        self.port.0.agent.stats()
    }
    /// How the port's agent is driven.
    pub fn drive(&self) -> CmDrive {
        self.port.0.drive
    }
}

impl fmt::Debug for CmPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmPort")
            .field("port", &self.port())
            .finish()
    }
}

/// Attach the connection manager to every port of `ca` (what opening a CA
/// through the `ibal` facade does). Returns one handle per port.
pub fn attach_ca(al: &Arc<AlInstance>, ca: Handle<Ca>) -> Result<Vec<Handle<CmPort>>> {
    let ca = al.resolve_live(ca)?;
    attach_ports(al, &ca, None)
}

/// [`attach_ca`] with the agents driven as `drive` says. A port already
/// attached (by any AL) in the other mode fails with `InvalidSetting`.
pub fn attach_ca_with(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    drive: CmDrive,
) -> Result<Vec<Handle<CmPort>>> {
    let ca = al.resolve_live(ca)?;
    attach_ports(al, &ca, Some(drive))
}

fn attach_ports(
    al: &Arc<AlInstance>,
    ca: &Arc<Obj<Ca>>,
    drive: Option<CmDrive>,
) -> Result<Vec<Handle<CmPort>>> {
    let mut ports = Vec::new();
    for port in 1..=ca.attr().num_ports {
        let port_use = PortUse::acquire(ca, port, drive)?;
        let obj = create(al, Some(ca.core()), |_| Ok(CmPort { port: port_use }))?;
        ports.push(obj.handle());
    }
    Ok(ports)
}

/// Serve `port`'s CM agent once on this thread: take every MAD QP1 has
/// received, run it through the protocol, send the answers, fire due
/// timers (retries, timewait), and route the events (callbacks still run
/// on the AL executor). This is how a [`CmDrive::Poll`] port makes
/// progress; on a threaded port it is allowed and only takes some of the
/// agent thread's work.
pub fn poll(al: &AlInstance, port: Handle<CmPort>) -> Result<crate::agent::PollOutcome> {
    let p = al.resolve_live(port)?;
    p.port.0.agent.serve()
}

// ---------------------------------------------------------------- listens --

/// A listen on a service id on one port.
pub struct Listen {
    port: PortUse,
    conn: ConnId,
    service_id: u64,
    on_request: ListenHandler,
    cep_handler: CmHandler,
}

impl Object for Listen {
    const KIND: Kind = Kind::LISTEN;
    al::object_table!(Listen);

    fn teardown(obj: &Arc<Obj<Self>>) {
        let _ = obj.port.0.agent.cancel_listen(obj.conn);
    }
}

impl Listen {
    /// The service id listened on.
    pub fn service_id(&self) -> u64 {
        self.service_id
    }
}

impl fmt::Debug for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listen")
            .field("service_id", &format_args!("{:#x}", self.service_id))
            .finish()
    }
}

/// Listen for REQs (and SIDR_REQs) for `service_id` on `port` of `ca`.
/// `on_request` gets each new CEP; `handler` gets the CEP's later events.
/// Cancel with `al.destroy(listen, ..)`.
pub fn listen(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    port: u8,
    service_id: u64,
    on_request: ListenHandler,
    handler: CmHandler,
) -> Result<Handle<Listen>> {
    let ca = al.resolve_live(ca)?;
    let port_use = PortUse::acquire(&ca, port, None)?;
    let routes = port_use.0.routes.clone();
    let conn = port_use.0.agent.listen(service_id)?;
    let obj = create(al, None, |_| {
        Ok(Listen {
            port: port_use.clone(),
            conn,
            service_id,
            on_request,
            cep_handler: handler,
        })
    });
    match obj {
        Ok(obj) => {
            // Requests that beat this registration were parked under the
            // listener's id; registering routes them now, in order.
            register(&routes, conn, Route::Listen(obj.handle()));
            Ok(obj.handle())
        }
        Err(e) => {
            let _ = port_use.0.agent.cancel_listen(conn);
            Err(e)
        }
    }
}

// ------------------------------------------------------------------- CEPs --

#[derive(Default)]
struct CepState {
    /// The protocol's id for this connection, once known.
    conn: Option<ConnId>,
    /// Set by teardown: nothing may start on this CEP any more.
    closed: bool,
    passive: bool,
    /// The QP bound to this CEP (its CID slot names this CEP).
    qp: Option<Arc<Obj<Qp>>>,
    req: Option<Req>,
    rep: Option<Rep>,
    peer: Option<PeerAddr>,
    port: u8,
}

/// A connection endpoint.
pub struct Cep {
    port: PortUse,
    handler: CmHandler,
    state: Mutex<CepState>,
}

impl Object for Cep {
    const KIND: Kind = Kind::CEP;
    al::object_table!(Cep);

    /// Close the CEP to new calls, tell the agent (which sends the REJ or
    /// DREQ the connection's state calls for and keeps the id through
    /// timewait), forget the route, and free the QP.
    fn teardown(obj: &Arc<Obj<Self>>) {
        let (conn, qp) = {
            let mut st = obj.state.lock();
            st.closed = true;
            (st.conn.take(), st.qp.take())
        };
        if let Some(conn) = conn {
            obj.port.0.routes.inner.lock().routes.remove(&conn);
            let _ = obj.port.0.agent.destroy(conn);
        }
        if let Some(qp) = qp {
            // We are being destroyed already: only the binding goes.
            binding::release(qp.cid(), obj.core().handle(), |_| {});
            let _ = qp.modify(&QpModify::to(QpState::Err));
        }
    }
}

impl fmt::Debug for Cep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("Cep")
            .field("conn", &st.conn)
            .field("passive", &st.passive)
            .field("bound", &st.qp.is_some())
            .finish()
    }
}

impl Cep {
    /// The protocol state of the connection, if it still has one.
    pub fn protocol_state(&self) -> Option<crate::proto::State> {
        let conn = self.state.lock().conn?;
        self.port.0.agent.state(conn)
    }

    fn conn(&self) -> Result<ConnId> {
        let st = self.state.lock();
        if st.closed {
            return Err(Error::invalid_state("the CEP is being destroyed"));
        }
        st.conn
            .ok_or_else(|| Error::invalid_state("the CEP has no connection"))
    }

    /// Protocol reactions that touch the QP, before the user sees the event.
    fn react(&self, ev: &Event) {
        if let Event::ReplyReceived { rep, .. } = ev {
            self.state.lock().rep = Some(**rep);
        }
        let qp = self.state.lock().qp.clone();
        let Some(qp) = qp else { return };
        match ev {
            Event::Established { .. } => {
                let st = self.state.lock();
                if st.passive {
                    if let (Some(req), Some(rep)) = (st.req, st.rep) {
                        let _ = qp.modify(&rts_attrs(
                            rep.starting_psn,
                            &req,
                            req.rnr_retry_count,
                            rep.initiator_depth.min(req.responder_resources),
                        ));
                    }
                }
            }
            Event::Rejected { .. }
            | Event::Timeout { .. }
            | Event::DisconnectRequest { .. }
            | Event::Disconnected { .. }
            | Event::StaleConnection { .. } => {
                let _ = qp.modify(&QpModify::to(QpState::Err));
            }
            _ => {}
        }
    }

    /// The connection is over: free the QP and destroy this CEP. Whoever
    /// took the binding (this, or a racing QP destroy) destroys the CEP.
    fn finish(this: &Obj<Self>) {
        let h = this.core().handle();
        let qp = this.state.lock().qp.take();
        match qp {
            Some(qp) => {
                binding::release(qp.cid(), h, destroy_cep);
            }
            None => destroy_cep(h),
        }
    }
}

fn destroy_cep(h: RawHandle) {
    let _ = al::destroy_raw(h);
}

fn ibta_mtu(code: u8) -> Mtu {
    match code {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

fn mtu_code(mtu: Mtu) -> u8 {
    match mtu {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

/// RTR attributes of a connected QP on `port` toward the peer port at
/// `dlid`, with the REQ's path MTU and what the peer sent: its QPN, its
/// starting PSN (our receive PSN), and the RDMA READ/atomic requests we
/// accept from it. [`accept`] (passive) and [`rtu`] (active) apply these.
pub fn rtr_attrs(
    port: u8,
    dlid: u16,
    req: &Req,
    dest_qpn: u32,
    rq_psn: u32,
    max_dest_rd_atomic: u8,
) -> QpModify {
    QpModify::to(QpState::Rtr)
        .av(AvAttr::lid(port, dlid))
        .path_mtu(ibta_mtu(req.path_mtu))
        .dest_qpn(dest_qpn)
        .rq_psn(rq_psn)
        .max_dest_rd_atomic(max_dest_rd_atomic)
        .min_rnr_timer(12)
}

/// RTS attributes of a connected QP: our starting PSN, the REQ's ACK
/// timeout and retry count, the RNR retries the peer asked for, and the
/// RDMA READ/atomic requests we may have outstanding. [`rtu`] (active) and
/// the passive side's RTU handling apply these.
pub fn rts_attrs(sq_psn: u32, req: &Req, rnr_retry: u8, max_rd_atomic: u8) -> QpModify {
    QpModify::to(QpState::Rts)
        .sq_psn(sq_psn)
        .timeout(req.primary_path.local_ack_timeout)
        .retry_cnt(req.retry_count)
        .rnr_retry(rnr_retry)
        .max_rd_atomic(max_rd_atomic)
}

/// Bring `qp` to INIT for a connection on `port` (from RESET or ERR), as
/// [`connect`] and [`accept`] do before they send.
pub fn qp_to_init(qp: &Obj<Qp>, port: u8, access: Access) -> Result<()> {
    let state = qp.query()?.state;
    if state == QpState::Init {
        return Ok(());
    }
    if state != QpState::Reset {
        qp.modify(&QpModify::to(QpState::Reset))?;
    }
    qp.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(port)
            .access(access),
    )
}

fn psn_seed(qpn: u32) -> u32 {
    // Any 24-bit value works; vary it per QP so reconnects differ.
    (qpn.wrapping_mul(0x9e37_79b9) ^ 0x5a5a5a) & 0xff_ffff
}

/// Why a bind on a QP failed, in the words the caller can act on.
fn bind_error(qp: &Obj<Qp>, e: Error) -> Error {
    if let (Error::AlreadyConnected, CidState::Bound(other)) = (&e, qp.cid().load()) {
        if let Ok(c) = Cep::table().get(other) {
            if c.protocol_state() == Some(crate::proto::State::Timewait) {
                return Error::QpInTimewait;
            }
        }
    }
    e
}

/// What [`connect`] sends.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    /// The service to connect to.
    pub service_id: u64,
    /// The local port.
    pub port: u8,
    /// The remote port's LID.
    pub remote_lid: u16,
    /// The remote port's GID, when routing by GID.
    pub remote_gid: Option<[u8; 16]>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDMA READ/atomic requests we accept from the peer.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries the peer should use towards us (7 = forever).
    pub rnr_retry_count: u8,
    /// CM response timeout (4.096 us x 2^t) for both sides.
    pub cm_response_timeout: u8,
    /// REQ retries.
    pub max_cm_retries: u8,
    /// Local ACK timeout (also the PacketLifeTime estimate).
    pub local_ack_timeout: u8,
    /// Access rights the QP grants the peer.
    pub access: Access,
    /// Up to 92 bytes.
    pub private_data: Vec<u8>,
}

impl ConnectRequest {
    /// A request with sensible defaults for `service_id` at `remote_lid`.
    pub fn new(service_id: u64, remote_lid: u16) -> Self {
        ConnectRequest {
            service_id,
            port: 1,
            remote_lid,
            remote_gid: None,
            path_mtu: Mtu::Mtu4096,
            responder_resources: 4,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
            cm_response_timeout: 16,
            max_cm_retries: 4,
            local_ack_timeout: 14,
            access: Access::LOCAL_WRITE
                .union(Access::REMOTE_WRITE)
                .union(Access::REMOTE_READ)
                .union(Access::REMOTE_ATOMIC),
            private_data: Vec::new(),
        }
    }
}

/// Connect `qp` (RC or UC): send a REQ and return the new CEP. Its events
/// (reply, reject, timeout, ...) go to `handler`; on the reply, call [`rtu`].
pub fn connect(
    al: &Arc<AlInstance>,
    qp: Handle<Qp>,
    request: &ConnectRequest,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    // The reference is taken before the CEP id is published, and held for
    // the whole call.
    let qp = al.resolve_live(qp)?;
    let transport = match qp.qp_type() {
        hca::QpType::Rc => TransportType::Rc,
        hca::QpType::Uc => TransportType::Uc,
        other => {
            return Err(Error::invalid_parameter(format!(
                "connect needs an RC or UC QP, not {other:?}"
            )))
        }
    };
    let port_use = PortUse::acquire(qp.pd().ca(), request.port, None)?;
    // The port's address and P_Key as its agent read them when it started
    // (P_Key index 0, `AgentConfig::default()`): no port query per REQ.
    let local = port_use.0.agent.local_addr();
    let pkey = port_use.0.agent.pkey();
    let req = Req {
        service_id: request.service_id,
        local_qpn: qp.qpn(),
        local_qkey: 0,
        starting_psn: psn_seed(qp.qpn()),
        responder_resources: request.responder_resources,
        initiator_depth: request.initiator_depth,
        remote_cm_response_timeout: request.cm_response_timeout,
        local_cm_response_timeout: request.cm_response_timeout,
        transport_service_type: transport,
        end_to_end_flow_control: false,
        retry_count: request.retry_count & 7,
        rnr_retry_count: request.rnr_retry_count & 7,
        max_cm_retries: request.max_cm_retries & 0xf,
        path_mtu: mtu_code(request.path_mtu),
        pkey,
        primary_path: PathInfo {
            local_lid: local.lid,
            remote_lid: request.remote_lid,
            local_gid: local.gid,
            remote_gid: request.remote_gid.unwrap_or([0; 16]),
            hop_limit: 0xff,
            subnet_local: request.remote_gid.is_none(),
            local_ack_timeout: request.local_ack_timeout & 0x1f,
            ..PathInfo::default()
        },
        private_data: PrivateData::new(&request.private_data)
            .map_err(|e| Error::invalid_parameter(e.to_string()))?,
        ..Req::default()
    };
    let peer = PeerAddr {
        lid: request.remote_lid,
        gid: request.remote_gid.unwrap_or([0; 16]),
    };
    let routes = port_use.0.routes.clone();
    let cep = create(al, None, |_| {
        Ok(Cep {
            port: port_use,
            handler,
            state: Mutex::new(CepState {
                port: request.port,
                ..CepState::default()
            }),
        })
    })?;
    let h = cep.handle();
    binding::bind_and_start(
        qp.cid(),
        h.raw(),
        || {
            qp_to_init(&qp, request.port, request.access)?;
            let mut st = cep.state.lock();
            if st.closed {
                return Err(cep
                    .core()
                    .check_live()
                    .err()
                    .unwrap_or(Error::invalid_state("the CEP was destroyed during connect")));
            }
            let conn = cep.port.0.agent.connect(ConnectParams::new(peer, req))?;
            st.conn = Some(conn);
            st.qp = Some(qp.clone());
            st.req = Some(req);
            st.peer = Some(peer);
            drop(st);
            register(&routes, conn, Route::Cep(h));
            Ok(())
        },
        destroy_cep,
    )
    .map_err(|e| bind_error(&qp, e))?;
    Ok(h)
}

/// What [`accept`] sends.
#[derive(Clone, Debug)]
pub struct AcceptReply {
    /// RDMA READ/atomic requests we accept from the peer (bounded by its
    /// initiator depth).
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we may have outstanding (bounded by its
    /// responder resources).
    pub initiator_depth: u8,
    /// RNR retries the peer should use towards us.
    pub rnr_retry_count: u8,
    /// Target ACK delay (timeout encoding).
    pub target_ack_delay: u8,
    /// Access rights the QP grants the peer.
    pub access: Access,
    /// Up to 196 bytes.
    pub private_data: Vec<u8>,
}

impl Default for AcceptReply {
    fn default() -> Self {
        AcceptReply {
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            target_ack_delay: 10,
            access: ConnectRequest::new(0, 0).access,
            private_data: Vec::new(),
        }
    }
}

/// Accept the connection request of `cep` on `qp`: bind, move the QP to
/// INIT and RTR from the negotiated attributes, and send the REP. The QP
/// goes to RTS when the connection is established (RTU received).
pub fn accept(
    al: &AlInstance,
    cep: Handle<Cep>,
    qp: Handle<Qp>,
    reply: &AcceptReply,
) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let qp = al.resolve_live(qp)?;
    let (req, port) = {
        let st = c.state.lock();
        let req = st
            .req
            .ok_or_else(|| Error::invalid_state("no connection request to accept on this CEP"))?;
        (req, c.port.0.agent.port())
    };
    let conn = c.conn()?;
    if qp.pd().ca().device().instance_key() != c.port.0.key.0 {
        return Err(Error::invalid_parameter(
            "the QP is on another device than the connection request",
        ));
    }
    let responder_resources = reply.responder_resources.min(req.initiator_depth);
    let initiator_depth = reply.initiator_depth.min(req.responder_resources);
    let rep = Rep {
        local_qpn: qp.qpn(),
        local_qkey: 0,
        starting_psn: psn_seed(qp.qpn()),
        responder_resources,
        initiator_depth,
        target_ack_delay: reply.target_ack_delay & 0x1f,
        end_to_end_flow_control: false,
        rnr_retry_count: reply.rnr_retry_count & 7,
        srq: qp.has_srq(),
        private_data: PrivateData::new(&reply.private_data)
            .map_err(|e| Error::invalid_parameter(e.to_string()))?,
        ..Rep::default()
    };
    let h = c.handle();
    let result = binding::bind_and_start(
        qp.cid(),
        h.raw(),
        || {
            qp_to_init(&qp, port, reply.access)?;
            qp.modify(&rtr_attrs(
                port,
                req.primary_path.local_lid,
                &req,
                req.local_qpn,
                req.starting_psn,
                responder_resources,
            ))?;
            let mut st = c.state.lock();
            if st.closed {
                return Err(Error::invalid_state("the CEP was destroyed during accept"));
            }
            st.qp = Some(qp.clone());
            st.rep = Some(rep);
            drop(st);
            c.port.0.agent.accept(conn, rep).inspect_err(|_| {
                c.state.lock().qp = None;
            })
        },
        |_| {},
    );
    match result {
        Ok(()) => Ok(()),
        Err(e @ Error::Destroying { .. }) => {
            // QP destroy won the race: this connection cannot go on.
            let _ = al.destroy(cep, None);
            Err(e)
        }
        Err(e) => Err(bind_error(&qp, e)),
    }
}

/// Active side, after the reply: move the QP to RTR and RTS from the REP,
/// and send the RTU.
pub fn rtu(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let conn = c.conn()?;
    let (qp, req, port) = {
        let st = c.state.lock();
        (st.qp.clone(), st.req, st.port)
    };
    let (Some(qp), Some(req)) = (qp, req) else {
        return Err(Error::invalid_state("the CEP has no bound QP and REQ"));
    };
    let rep = match c.port.0.agent.state(conn) {
        Some(crate::proto::State::RepRcvd) | Some(crate::proto::State::MraRepSent) => c
            .state
            .lock()
            .rep
            .ok_or_else(|| Error::invalid_state("no REP recorded"))?,
        other => {
            return Err(Error::invalid_state(format!(
                "rtu needs a received REP, the connection is in {other:?}"
            )))
        }
    };
    qp.modify(&rtr_attrs(
        port,
        req.primary_path.remote_lid,
        &req,
        rep.local_qpn,
        rep.starting_psn,
        rep.initiator_depth,
    ))?;
    qp.modify(&rts_attrs(
        req.starting_psn,
        &req,
        rep.rnr_retry_count,
        rep.responder_resources,
    ))?;
    c.port.0.agent.send_rtu(conn, private_data)
}

/// Reject the request or reply of `cep`.
pub fn reject(
    al: &AlInstance,
    cep: Handle<Cep>,
    reason: RejectReason,
    private_data: &[u8],
) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.reject(conn, reason, &[], private_data)
}

/// Acknowledge the peer's message and ask for more time.
pub fn mra(
    al: &AlInstance,
    cep: Handle<Cep>,
    service_timeout: u8,
    private_data: &[u8],
) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.send_mra(conn, service_timeout, private_data)
}

/// Start a disconnect (DREQ).
pub fn disconnect(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.disconnect(conn, private_data)
}

/// Answer the peer's DREQ (DREP).
pub fn disconnect_reply(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.disconnect_reply(conn, private_data)
}

/// Propose an alternate path (LAP).
pub fn lap(al: &AlInstance, cep: Handle<Cep>, params: LapParams) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.lap(conn, params)
}

/// Answer the peer's LAP (APR).
pub fn apr(al: &AlInstance, cep: Handle<Cep>, status: ApStatus, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.apr(conn, status, &[], private_data)
}

/// Ask a UD service for its QP (SIDR_REQ) from `port` of `ca`; the answer
/// arrives as [`Event::SidrReply`] to `handler`, after which the CEP goes.
pub fn sidr_request(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    params: SidrParams,
    port: u8,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    let ca = al.resolve_live(ca)?;
    let port_use = PortUse::acquire(&ca, port, None)?;
    let routes = port_use.0.routes.clone();
    let cep = create(al, None, |_| {
        Ok(Cep {
            port: port_use,
            handler,
            state: Mutex::new(CepState {
                port,
                ..CepState::default()
            }),
        })
    })?;
    let h = cep.handle();
    let mut st = cep.state.lock();
    match cep.port.0.agent.sidr_request(params) {
        Ok(conn) => {
            st.conn = Some(conn);
            drop(st);
            register(&routes, conn, Route::Cep(h));
            Ok(h)
        }
        Err(e) => {
            drop(st);
            let _ = al.destroy(h, None);
            Err(e)
        }
    }
}

/// Answer a SIDR request (the CEP from the listen callback).
pub fn sidr_reply(al: &AlInstance, cep: Handle<Cep>, reply: SidrReplyParams) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.sidr_reply(conn, reply)
}

/// Agents running in this process (one per device port in use).
pub fn active_ports() -> usize {
    registry().registry.lock().ports.len()
}
