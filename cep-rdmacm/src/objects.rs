//! The rdma_cm-backed CEP and listen objects (feature `rdma`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use al::sync::{Arc, Mutex};
use al::{create, post_callback, AlInstance, Error, Handle, Kind, Obj, Object, RawHandle, Result};
use hca::any::{AnyDevice, AnyQp};
use hca::verbs::Ca;
use provider::{Access, QpModify, QpState};
use qp::cid as binding;
use qp::Qp;
use rdma_provider::cm::{CmEventKind, ConnParam};
use rdma_provider::{CmEvent, CmHook, CmId, QpEvent};

use super::translate::{self, Phase, Reaction, Step};
use cep::cm::{AcceptReply, ConnectRequest};
use cep::ip::IpConnect;
use cep::proto::{ConnId, Event, PeerAddr};
use cep::wire::ip_cm::{self, PortSpace};
use cep::wire::RejectReason;

/// Called on the AL executor for every event of an rdma_cm-backed CEP.
pub type RdmaCmHandler = std::sync::Arc<dyn Fn(Handle<RdmaCep>, &Event) + Send + Sync>;
/// Called on the AL executor when a REQ reaches a listen: the new CEP and
/// [`Event::ConnectRequest`]. Answer with [`accept`] or [`reject`].
pub type RdmaListenHandler =
    std::sync::Arc<dyn Fn(Handle<RdmaListen>, Handle<RdmaCep>, &Event) + Send + Sync>;

/// How long address and route resolution may take (ms), as rping and
/// perftest ask.
pub const RESOLVE_TIMEOUT_MS: i32 = 2000;

fn next_conn() -> ConnId {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    ConnId::from_comm_id(NEXT.fetch_add(1, Ordering::Relaxed))
}

fn rdma_ca(ca: &Obj<Ca>) -> Result<()> {
    match ca.device() {
        AnyDevice::Rdma(_) => Ok(()),
        _ => Err(Error::invalid_parameter(
            "rdma_cm-backed CEPs need a CA of the rdma provider; on the soft and RoCEv2 \
             providers use the project's CM (cep::ip::connect, cep::ip::listen)",
        )),
    }
}

/// The id's device must be the CA's (rdma_cm picks the device that
/// routes to the address).
fn same_device(ca: &Obj<Ca>, id: &CmId) -> Result<()> {
    let want = ca.attr().node_guid;
    match id.device() {
        Some((guid, _)) if guid == want => Ok(()),
        Some((guid, name)) => Err(Error::invalid_parameter(format!(
            "the address resolves to device {name} (node GUID {guid:#018x}), not the QP's CA \
             ({} {want:#018x})",
            ca.attr().name
        ))),
        None => Err(Error::invalid_state("the rdma_cm id has no device yet")),
    }
}

/// While `qp` is bound to the connection of `id`, its
/// `QpEvent::CommEstablished` (a packet arrived in RTR before the RTU)
/// goes to `rdma_notify`, as librdmacm asks of an id without a QP: the
/// kernel's CM then completes the connection (and `ESTABLISHED` follows)
/// even if the RTU was lost. The hook holds the id weakly; it runs on the
/// device's event thread.
fn watch_comm_est(qp: &Obj<Qp>, id: &std::sync::Arc<CmId>) {
    if let (AnyDevice::Rdma(dev), AnyQp::Rdma(q)) = (qp.device(), qp.provider()) {
        let id = std::sync::Arc::downgrade(id);
        dev.set_qp_event_hook(
            q,
            Some(std::sync::Arc::new(move |e| {
                if e == QpEvent::CommEstablished {
                    if let Some(id) = id.upgrade() {
                        let _ = id.notify_comm_est();
                    }
                }
            })),
        );
    }
}

/// The QP leaves its connection: no more `rdma_notify` for it.
fn unwatch(qp: &Obj<Qp>) {
    if let (AnyDevice::Rdma(dev), AnyQp::Rdma(q)) = (qp.device(), qp.provider()) {
        dev.set_qp_event_hook(q, None);
    }
}

// ------------------------------------------------------------------- CEPs --

struct CepState {
    id: Option<std::sync::Arc<CmId>>,
    qp: Option<Arc<Obj<Qp>>>,
    phase: Phase,
    closed: bool,
    accepting: bool,
    /// What `rdma_connect` sends (active side, until sent).
    connect: Option<ConnParam>,
    access: Access,
    /// Why the connection ended, when a local failure ended it.
    error: Option<Error>,
    released: bool,
}

/// A connection endpoint backed by an rdma_cm id (no QP of its own).
pub struct RdmaCep {
    handler: RdmaCmHandler,
    conn: ConnId,
    state: Mutex<CepState>,
}

impl Object for RdmaCep {
    const KIND: Kind = Kind::RDMA_CEP;
    al::object_table!(RdmaCep);

    /// Close to new calls, destroy the rdma_cm id (the kernel sends the
    /// REJ or DREQ the state calls for; `rdma_destroy_id` waits only for
    /// the event thread to acknowledge an event of it it has fetched), and
    /// free the QP.
    fn teardown(obj: &Arc<Obj<Self>>) {
        let (id, qp) = {
            let mut st = obj.state.lock();
            st.closed = true;
            st.phase = Phase::Done;
            (st.id.take(), st.qp.take())
        };
        drop(id);
        if let Some(qp) = qp {
            unwatch(&qp);
            binding::release(qp.cid(), obj.core().handle(), |_| {});
            let _ = qp.modify(&QpModify::to(QpState::Err));
        }
    }
}

impl std::fmt::Debug for RdmaCep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock();
        f.debug_struct("RdmaCep")
            .field("conn", &self.conn)
            .field("phase", &st.phase)
            .field("bound", &st.qp.is_some())
            .finish()
    }
}

impl RdmaCep {
    /// Where the connection is.
    pub fn phase(&self) -> Phase {
        self.state.lock().phase
    }

    /// The error that ended the connection, when a local failure (an
    /// address that did not resolve, a QP that would not move, a call
    /// librdmacm refused) ended it: the application heard
    /// `Event::Rejected` with `RejectOrigin::Local`.
    pub fn error(&self) -> Option<Error> {
        self.state.lock().error.clone()
    }

    /// The local and peer addresses of the connection's route.
    pub fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        let id = self.state.lock().id.clone();
        id.map_or((None, None), |id| id.addrs())
    }

    fn id(&self) -> Result<std::sync::Arc<CmId>> {
        let st = self.state.lock();
        if st.closed {
            return Err(Error::invalid_state("the CEP is being destroyed"));
        }
        st.id
            .clone()
            .ok_or_else(|| Error::invalid_state("the CEP has no rdma_cm id"))
    }
}

fn destroy_cep(h: RawHandle) {
    let _ = al::destroy_raw(h);
}

/// The hook of a CEP's id: each event goes to the CEP's AL executor.
fn cep_hook(h: Handle<RdmaCep>) -> CmHook {
    std::sync::Arc::new(move |ev: CmEvent| {
        let Ok(c) = RdmaCep::table().get(h.raw()) else {
            // Destroyed meanwhile: its teardown destroyed the id.
            return;
        };
        let kind = ev.kind;
        post_callback(&c.to_arc(), move |c| on_event(c, &kind));
    })
}

/// One event of a CEP, on its AL executor: the reaction, the
/// application's callback, and the release when the connection is over.
fn on_event(c: &Arc<Obj<RdmaCep>>, kind: &CmEventKind) {
    let step = {
        let mut st = c.state.lock();
        if st.closed {
            return;
        }
        let step = translate::step(st.phase, c.conn, kind);
        st.phase = step.next;
        if let (true, Some(e)) = (step.release, kind.error()) {
            st.error = Some(e);
        }
        step
    };
    let reacted = match step.reaction {
        Reaction::None => Ok(()),
        Reaction::ResolveRoute => c.id().and_then(|id| id.resolve_route(RESOLVE_TIMEOUT_MS)),
        Reaction::Connect => connect_now(c),
        Reaction::QpToRts => qp_to(c, QpState::Rts),
        Reaction::QpToErr => {
            qp_err(c);
            Ok(())
        }
    };
    match reacted {
        Ok(()) => deliver(c, step),
        Err(e) => fail(c, e),
    }
}

fn deliver(c: &Arc<Obj<RdmaCep>>, step: Step) {
    if let Some(ev) = &step.event {
        (c.handler)(c.handle(), ev);
    }
    if step.release {
        release(c);
    }
}

/// A local failure ends the connection: QP to ERR, `Rejected` (local),
/// `Released`.
fn fail(c: &Arc<Obj<RdmaCep>>, e: Error) {
    let step = {
        let mut st = c.state.lock();
        if st.closed || st.phase == Phase::Done {
            return;
        }
        let step = translate::local_failure(st.phase, c.conn);
        st.phase = Phase::Done;
        st.error = Some(e);
        step
    };
    qp_err(c);
    deliver(c, step);
}

/// `Released`, once, then unbind and destroy the CEP (whoever took the
/// binding destroys it: this, or a racing QP destroy).
fn release(c: &Arc<Obj<RdmaCep>>) {
    let qp = {
        let mut st = c.state.lock();
        if st.released || st.closed {
            return;
        }
        st.released = true;
        st.phase = Phase::Done;
        st.qp.clone()
    };
    (c.handler)(c.handle(), &Event::Released { conn: c.conn });
    let h = c.core().handle();
    let qp = qp.and_then(|q| {
        let mut st = c.state.lock();
        st.qp.take().map(|_| q)
    });
    match qp {
        Some(qp) => {
            unwatch(&qp);
            binding::release(qp.cid(), h, destroy_cep);
        }
        None => destroy_cep(h),
    }
}

fn qp_err(c: &Obj<RdmaCep>) {
    let qp = c.state.lock().qp.clone();
    if let Some(qp) = qp {
        let _ = qp.modify(&QpModify::to(QpState::Err));
    }
}

/// Moves the bound QP to `state` with `rdma_init_qp_attr`'s attributes.
fn qp_to(c: &Obj<RdmaCep>, state: QpState) -> Result<()> {
    let (qp, access) = {
        let st = c.state.lock();
        (st.qp.clone(), st.access)
    };
    let Some(qp) = qp else {
        return Err(Error::invalid_state("no QP is bound to this CEP"));
    };
    let m = c.id()?.init_qp_modify(state, access)?;
    qp.modify(&m)
}

/// Before rdma_cm's INIT attributes are applied: a QP readied for its
/// connection (`cep::cm::ready_for_connection`: INIT, receives posted) is
/// taken INIT -> INIT, which keeps its receives; any other state but RESET
/// goes through RESET, as before (`docs/cm.md`, "Receives before the
/// connection").
fn keep_receives_or_reset(qp: &Obj<Qp>) -> Result<()> {
    match qp.query()?.state {
        QpState::Reset | QpState::Init => Ok(()),
        _ => qp.modify(&QpModify::to(QpState::Reset)),
    }
}

/// Active side, route resolved: check the device, move the QP (RESET,
/// INIT), send the REQ.
fn connect_now(c: &Obj<RdmaCep>) -> Result<()> {
    let id = c.id()?;
    let (qp, param) = {
        let mut st = c.state.lock();
        (st.qp.clone(), st.connect.take())
    };
    let (Some(qp), Some(param)) = (qp, param) else {
        return Err(Error::invalid_state("no QP or request to connect"));
    };
    same_device(qp.pd().ca(), &id)?;
    keep_receives_or_reset(&qp)?;
    qp_to(c, QpState::Init)?;
    id.connect(&param)
}

/// Connects `qp` (RC) to `request.remote` through librdmacm: resolves the
/// address and route, moves the QP to INIT, sends the REQ (with
/// `request.private_data`, at most 56 bytes: rdma_cm's header takes the
/// rest), and returns the new CEP, bound to `qp` through its CID slot.
/// Events go to `handler` as for [`cep::ip::connect`]; on
/// [`Event::ReplyReceived`] call [`rtu`].
///
/// From `request`, rdma_cm takes the RDMA depths, the retry and RNR retry
/// counts and the private data; the CM timers, path MTU, port space
/// (always TCP) and source port are rdma_cm's own. The QP's CA must be
/// the device the kernel routes `request.remote` through.
pub fn connect(
    al: &std::sync::Arc<AlInstance>,
    qp: Handle<Qp>,
    request: &IpConnect,
    handler: RdmaCmHandler,
) -> Result<Handle<RdmaCep>> {
    let qp = al.resolve_live(qp)?;
    rdma_ca(qp.pd().ca())?;
    if request.space != PortSpace::Tcp {
        return Err(Error::Unsupported(
            "rdma_cm-backed CEPs use the TCP port space only".into(),
        ));
    }
    let param = ConnParam {
        private_data: request.private_data.clone(),
        responder_resources: request.rdma_depth.0,
        initiator_depth: request.rdma_depth.1,
        flow_control: true,
        retry_count: request.timers.retry_count,
        rnr_retry_count: request.timers.rnr_retry_count,
        srq: false,
        qp_num: qp.qpn(),
    };
    param.check("connect", rdma_provider::cm::private_data_len::CONNECT)?;
    let obj = create(al, None, |_| {
        Ok(RdmaCep {
            handler,
            conn: next_conn(),
            state: Mutex::new(CepState {
                id: None,
                qp: None,
                phase: Phase::AddrResolving,
                closed: false,
                accepting: false,
                connect: Some(param),
                access: ConnectRequest::new(0, 0).access,
                error: None,
                released: false,
            }),
        })
    })?;
    let h = obj.handle();
    let remote = request.remote;
    binding::bind_and_start(
        qp.cid(),
        h.raw(),
        || {
            let id = std::sync::Arc::new(CmId::create(cep_hook(h))?);
            {
                let mut st = obj.state.lock();
                if st.closed {
                    return Err(Error::Destroying {
                        kind: RdmaCep::KIND,
                        raw: h.raw().as_u64(),
                    });
                }
                st.id = Some(id.clone());
                st.qp = Some(qp.clone());
            }
            watch_comm_est(&qp, &id);
            id.resolve_addr(remote, RESOLVE_TIMEOUT_MS)
        },
        destroy_cep,
    )?;
    Ok(h)
}

/// Active side, after the reply: move the QP to RTR and RTS with
/// `rdma_init_qp_attr`'s attributes and send the RTU (`rdma_establish`).
/// `Event::Established` follows. rdma_cm's RTU carries no private data:
/// non-empty `private_data` is refused.
pub fn rtu(al: &AlInstance, cep: Handle<RdmaCep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    if !private_data.is_empty() {
        return Err(Error::Unsupported(
            "rdma_establish sends an RTU without private data".into(),
        ));
    }
    if c.phase() != Phase::ReplyReceived {
        return Err(Error::invalid_state(format!(
            "rtu answers a received reply; the CEP is in {:?}",
            c.phase()
        )));
    }
    qp_to(&c, QpState::Rtr)?;
    qp_to(&c, QpState::Rts)?;
    let id = c.id()?;
    // The state lock is held until rdma_establish returns. The phase is
    // Established before the RTU leaves (the peer's first DREQ may follow
    // it at once, and its event must find the connection established), and
    // the Established callback is queued before it (so it precedes any
    // event the peer's answer causes) but takes the lock first: it runs
    // only once the RTU's fate is known, and is dropped if it failed.
    // rdma_establish writes to the rdma_cm device and calls none of our
    // code, so nothing waits on this lock for longer than that call.
    let mut st = c.state.lock();
    if st.closed {
        return Err(Error::invalid_state("the CEP is being destroyed"));
    }
    if st.phase != Phase::ReplyReceived {
        return Err(Error::invalid_state(format!(
            "rtu answers a received reply; the CEP is in {:?}",
            st.phase
        )));
    }
    st.phase = Phase::Established;
    let conn = c.conn;
    post_callback(&c, move |c| {
        let st = c.state.lock();
        let live = !st.closed && st.phase != Phase::ReplyReceived;
        drop(st);
        if live {
            (c.handler)(c.handle(), &Event::Established { conn });
        }
    });
    if let Err(e) = id.establish() {
        st.phase = Phase::ReplyReceived;
        return Err(e);
    }
    Ok(())
}

/// Passive side: accept the request of `cep` on `qp` (RC): bind the CEP
/// into the QP's CID slot, move the QP to INIT and RTR with
/// `rdma_init_qp_attr`'s attributes, and send the REP (`rdma_accept` with
/// the QP's number, `reply`'s depths, RNR retry count and private data).
/// The QP moves to RTS when the RTU arrives (`Event::Established`).
///
/// Fails as [`cep::cm::accept`] does: a wrong state, a second accept, a
/// QP bound elsewhere or of another device change nothing (the request
/// may still be accepted, rejected or destroyed).
pub fn accept(
    al: &AlInstance,
    cep: Handle<RdmaCep>,
    qp: Handle<Qp>,
    reply: &AcceptReply,
) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let qp = al.resolve_live(qp)?;
    let id = c.id()?;
    same_device(qp.pd().ca(), &id)?;
    let param = ConnParam {
        private_data: reply.private_data.clone(),
        responder_resources: reply.responder_resources,
        initiator_depth: reply.initiator_depth,
        flow_control: true,
        retry_count: 0,
        rnr_retry_count: reply.rnr_retry_count,
        srq: false,
        qp_num: qp.qpn(),
    };
    param.check("accept", rdma_provider::cm::private_data_len::ACCEPT)?;
    let before = qp.query()?;
    if !matches!(before.state, QpState::Reset | QpState::Init | QpState::Err) {
        return Err(Error::invalid_state(format!(
            "accept needs a QP in RESET, INIT or ERR, not {:?}",
            before.state
        )));
    }
    {
        let mut st = c.state.lock();
        if st.phase != Phase::RequestReceived || st.accepting || st.qp.is_some() {
            return Err(Error::invalid_state(format!(
                "accept answers a request waiting for an answer; the CEP is in {:?}",
                st.phase
            )));
        }
        st.accepting = true;
    }
    let h = c.core().handle();
    let result = binding::bind(qp.cid(), h).and_then(|()| {
        let started = (|| {
            {
                let mut st = c.state.lock();
                if st.closed {
                    return Err(Error::Destroying {
                        kind: RdmaCep::KIND,
                        raw: h.as_u64(),
                    });
                }
                st.qp = Some(qp.clone());
                st.access = reply.access;
            }
            watch_comm_est(&qp, &id);
            keep_receives_or_reset(&qp)?;
            qp_to(&c, QpState::Init)?;
            qp_to(&c, QpState::Rtr)?;
            // Before the REP leaves: its RTU's event must find the CEP
            // accepted, whichever thread runs first.
            {
                let mut st = c.state.lock();
                if st.phase == Phase::RequestReceived {
                    st.phase = Phase::Accepted;
                }
            }
            id.accept(&param)
        })();
        started.map_err(|e| {
            {
                let mut st = c.state.lock();
                st.qp = None;
                if st.phase == Phase::Accepted {
                    st.phase = Phase::RequestReceived;
                }
            }
            unwatch(&qp);
            // As the project's accept: the QP is put back as it was.
            cep::cm::restore_qp(&qp, &before);
            if binding::release(qp.cid(), h, |_| {}) {
                e
            } else {
                Error::Destroying {
                    kind: RdmaCep::KIND,
                    raw: h.as_u64(),
                }
            }
        })
    });
    c.state.lock().accepting = false;
    result
}

/// Rejects the request (or reply) of `cep` with `private_data`
/// (`rdma_reject`; librdmacm always sends reason 28, consumer defined:
/// `reason` is not sent). `Released` follows.
pub fn reject(
    al: &AlInstance,
    cep: Handle<RdmaCep>,
    _reason: RejectReason,
    private_data: &[u8],
) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let phase = c.phase();
    if !matches!(phase, Phase::RequestReceived | Phase::ReplyReceived) {
        return Err(Error::invalid_state(format!(
            "reject answers a request or a reply; the CEP is in {phase:?}"
        )));
    }
    c.id()?.reject(private_data)?;
    c.state.lock().phase = Phase::Done;
    post_callback(&c, |c| {
        qp_err(c);
        release(c);
    });
    Ok(())
}

/// Starts a disconnect (DREQ, `rdma_disconnect`): the QP goes to ERR;
/// `Event::Disconnected` then `Released` follow when the DREP (or the
/// DREQ's timeout) comes. rdma_cm's DREQ carries no private data.
pub fn disconnect(al: &AlInstance, cep: Handle<RdmaCep>, _private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    {
        let mut st = c.state.lock();
        if st.phase != Phase::Established {
            return Err(Error::invalid_state(format!(
                "disconnect needs an established connection; the CEP is in {:?}",
                st.phase
            )));
        }
        st.phase = Phase::Disconnecting;
    }
    qp_err(&c);
    c.id()?.disconnect()
}

/// Answers the peer's DREQ (DREP, `rdma_disconnect`); `Released` follows.
pub fn disconnect_reply(al: &AlInstance, cep: Handle<RdmaCep>, _private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    if c.phase() != Phase::PeerDisconnecting {
        return Err(Error::invalid_state(format!(
            "disconnect_reply answers the peer's DREQ; the CEP is in {:?}",
            c.phase()
        )));
    }
    c.id()?.disconnect()?;
    c.state.lock().phase = Phase::Done;
    post_callback(&c, release);
    Ok(())
}

// ---------------------------------------------------------------- listens --

/// A listen on an IP address and port, backed by an rdma_cm id.
pub struct RdmaListen {
    id: Mutex<Option<std::sync::Arc<CmId>>>,
    addr: SocketAddr,
    space: PortSpace,
    ca_guid: u64,
    conn: ConnId,
    on_request: RdmaListenHandler,
    cep_handler: RdmaCmHandler,
}

impl Object for RdmaListen {
    const KIND: Kind = Kind::RDMA_LISTEN;
    al::object_table!(RdmaListen);

    /// Destroys the listening id (requests already handed over stay).
    fn teardown(obj: &Arc<Obj<Self>>) {
        let id = obj.id.lock().take();
        drop(id);
    }
}

impl std::fmt::Debug for RdmaListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListen")
            .field("addr", &self.addr)
            .finish()
    }
}

impl RdmaListen {
    /// The address and port listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn listen_hook(h: Handle<RdmaListen>) -> CmHook {
    std::sync::Arc::new(move |ev: CmEvent| {
        let (CmEventKind::ConnectRequest(p), Some(new_id)) = (ev.kind, ev.new_id) else {
            return;
        };
        let Ok(l) = RdmaListen::table().get(h.raw()) else {
            // Gone: dropping the new id rejects the REQ.
            return;
        };
        let l = l.to_arc();
        if l.core().is_destroying() {
            return;
        }
        // A wildcard listen hears every device: only this CA's requests.
        if new_id.device().map(|d| d.0) != Some(l.ca_guid) {
            return;
        }
        // The new id's route runs from us (local) to the active side
        // (peer); the REQ's header names them the other way round.
        let (local, peer) = new_id.addrs();
        let src = peer.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let dst = local.unwrap_or(l.addr);
        let req = translate::req_of(&p, src, dst, l.space);
        let id = std::sync::Arc::new(new_id);
        let conn = next_conn();
        let Ok(obj) = create(l.al(), None, |_| {
            Ok(RdmaCep {
                handler: l.cep_handler.clone(),
                conn,
                state: Mutex::new(CepState {
                    id: Some(id.clone()),
                    qp: None,
                    phase: Phase::RequestReceived,
                    closed: false,
                    accepting: false,
                    connect: None,
                    access: AcceptReply::default().access,
                    error: None,
                    released: false,
                }),
            })
        }) else {
            return;
        };
        let cep = obj.handle();
        id.set_hook(cep_hook(cep));
        drop(id);
        let ev = Event::ConnectRequest {
            conn,
            listener: l.conn,
            peer: PeerAddr {
                lid: 0,
                gid: ip_cm::gid_of(src.ip().to_canonical()),
            },
            req: Box::new(req),
        };
        post_callback(&l, move |l| {
            if RdmaCep::table().get(cep.raw()).is_ok() {
                (l.on_request)(l.handle(), cep, &ev);
            }
        });
    })
}

/// Listens on `addr` (an address of `ca`'s device, or unspecified for any
/// of its addresses) in port space `space` (TCP only) through librdmacm.
/// Requests go to `on_request` ([`cep::ip::request_info`] reads their
/// addresses and user data), the accepted connections' events to
/// `handler`, as for [`cep::ip::listen`].
pub fn listen(
    al: &std::sync::Arc<AlInstance>,
    ca: Handle<Ca>,
    addr: SocketAddr,
    space: PortSpace,
    on_request: RdmaListenHandler,
    handler: RdmaCmHandler,
) -> Result<Handle<RdmaListen>> {
    let ca = al.resolve_live(ca)?;
    rdma_ca(&ca)?;
    if space != PortSpace::Tcp {
        return Err(Error::Unsupported(
            "rdma_cm-backed listens use the TCP port space only".into(),
        ));
    }
    let obj = create(al, None, |_| {
        Ok(RdmaListen {
            id: Mutex::new(None),
            addr,
            space,
            ca_guid: ca.attr().node_guid,
            conn: next_conn(),
            on_request,
            cep_handler: handler,
        })
    })?;
    let h = obj.handle();
    let started = (|| {
        let id = std::sync::Arc::new(CmId::create(listen_hook(h))?);
        id.listen(addr, 64)?;
        if !addr.ip().is_unspecified() {
            same_device(&ca, &id)?;
        }
        let mut slot = obj.id.lock();
        if obj.core().is_destroying() {
            return Err(Error::Destroying {
                kind: RdmaListen::KIND,
                raw: h.raw().as_u64(),
            });
        }
        *slot = Some(id);
        Ok(())
    })();
    match started {
        Ok(()) => Ok(h),
        Err(e) => {
            let _ = al.destroy(h, None);
            Err(e)
        }
    }
}
