//! The passive side: [`AcceptReply`] (what a REP offers), [`accept`] on a
//! QP (bound, moved to INIT and RTR before the REP leaves) and
//! [`accept_unbound`] (CM-only), both by the one claim on the CEP and with
//! one rule for every way they fail; [`accept_attrs`] (what a CM-only
//! consumer moves its QP with before it accepts) and the REP they send.

use al::sync::Arc;
use al::{AlInstance, Error, Handle, Obj, Result};
use provider::{Access, QpState};
use qp::cid as binding;
use qp::{CidState, Qp};

use super::attrs::{
    check_init_port, check_transport, qp_to_init, restore_qp, spec_bounded, ConnectionAttrs,
    LocalQpAttrs, PathEnd,
};
use super::connect::ConnectRequest;
use super::objects::{bind_error, cep_destroyed, Cep};
use crate::proto::ConnId;
use crate::wire::{PrivateData, Rep, Req};

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

/// Builder-style setters: `AcceptReply::default().private_data(b"ok")`.
/// Values the IBTA bounds are checked by [`accept`] (refused, never
/// masked).
impl AcceptReply {
    /// RDMA READ/atomic requests accepted from the peer, and outstanding
    /// at it (each bounded by what the REQ offers).
    pub fn rdma_depth(mut self, responder_resources: u8, initiator_depth: u8) -> Self {
        self.responder_resources = responder_resources;
        self.initiator_depth = initiator_depth;
        self
    }
    /// RNR retries the peer should use towards us (at most 7).
    pub fn rnr_retry_count(mut self, count: u8) -> Self {
        self.rnr_retry_count = count;
        self
    }
    /// Target ACK delay (at most 31).
    pub fn target_ack_delay(mut self, delay: u8) -> Self {
        self.target_ack_delay = delay;
        self
    }
    /// Access rights the QP grants the peer.
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }
    /// Private data of the REP (up to 196 bytes).
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }
}

/// Accept the connection request of `cep` on `qp`: bind, move the QP to
/// INIT and RTR from the negotiated attributes, and send the REP. The QP
/// goes to RTS when the connection is established (RTU received). A QP
/// readied by [`ready_for_connection`] (INIT on the request's port, its
/// receives posted) keeps its receives: INIT -> INIT -> RTR, no RESET; an
/// INIT QP on another port is refused (`InvalidParameter`, nothing
/// changed).
///
/// [`ready_for_connection`]: super::ready_for_connection
///
/// # When accept fails
///
/// One rule for every way accept can lose (`docs/cm.md`, "Accept
/// outcomes"):
///
/// * `Err(e)` with `e.is_gone(Kind::CEP)` (`Destroying { kind: CEP, .. }`,
///   or `InvalidHandle` for `cep`):
///   the CEP is gone or going: destroyed by the user, by AL close, or by a
///   destroy of `qp` that took the binding during the call. Its destroy
///   sends the REJ the connection's state calls for.
/// * Any other error (a wrong side or state, another accept already made or
///   in progress, a QP that is gone, being destroyed, already connected or
///   of the wrong kind, a refused parameter): nothing changed. The CEP is
///   still waiting for an answer and may be accepted on another QP,
///   rejected or destroyed; `qp` is in the state it was in, and neither its
///   CID slot nor any other QP's binding was touched. (If the connection
///   ended meanwhile, by the peer's REJ or the answer deadline, the CEP's
///   handler hears of it as usual and the CEP goes.)
///
/// A request nobody answers is not kept forever: when the active side has
/// given up (its REQ retries, from the REQ's own timeouts), the CM rejects
/// it (REJ Timeout), the handler gets [`Event::Timeout`] with
/// [`TimedOut::Answer`], and the CEP goes.
///
/// [`Event::Timeout`]: crate::proto::Event::Timeout
/// [`TimedOut::Answer`]: crate::proto::TimedOut::Answer
pub fn accept(
    al: &AlInstance,
    cep: Handle<Cep>,
    qp: Handle<Qp>,
    reply: &AcceptReply,
) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let qp = al.resolve_live(qp)?;
    if qp.pd().ca().device().instance_key() != c.port.0.key.0 {
        return Err(Error::invalid_parameter(
            "the QP is on another device than the connection request",
        ));
    }
    let private_data = PrivateData::new(&reply.private_data)
        .map_err(|e| Error::invalid_parameter(e.to_string()))?;
    let (conn, req) = c.claim_for_accept().map_err(|e| {
        if c.core().is_destroying() {
            cep_destroyed(&c)
        } else {
            e
        }
    })?;
    let result = accept_claimed(&c, &qp, conn, &req, reply, private_data);
    c.state.lock().accepting = false;
    match result {
        Ok(()) => Ok(()),
        Err(_) if c.core().is_destroying() => Err(cep_destroyed(&c)),
        Err(e) => Err(bind_error(&qp, e)),
    }
}

/// The body of [`accept`], with the CEP claimed (no other accept runs).
fn accept_claimed(
    c: &Obj<Cep>,
    qp: &Arc<Obj<Qp>>,
    conn: ConnId,
    req: &Req,
    reply: &AcceptReply,
    private_data: PrivateData<196>,
) -> Result<()> {
    check_transport(req, qp.qp_type())?;
    // A QP bound to another connection is refused as connect refuses it
    // (`AlreadyConnected`, or `QpInTimewait` by `bind_error`), before its
    // state (RTS, most likely) is looked at.
    if let CidState::Bound(_) = qp.cid().load() {
        return Err(Error::AlreadyConnected);
    }
    let before = qp.query()?;
    if !matches!(before.state, QpState::Reset | QpState::Init | QpState::Err) {
        return Err(Error::invalid_state(format!(
            "accept needs a QP in RESET, INIT or ERR, not {:?}",
            before.state
        )));
    }
    let port = c.port.0.agent.port();
    check_init_port(&before, port)?;
    let rep = build_rep(req, &LocalQpAttrs::of(qp, "accept")?, reply, private_data)?;
    let rtr = ConnectionAttrs::negotiated(port, PathEnd::Passive, req, &rep).rtr();
    let start = || {
        qp_to_init(qp, port, reply.access)?;
        qp.modify(&rtr)?;
        let mut st = c.state.lock();
        if st.closed {
            return Err(cep_destroyed(c));
        }
        st.qp = Some(qp.clone());
        st.rep = Some(rep);
        drop(st);
        c.port.0.agent.accept(conn, rep).inspect_err(|_| {
            let mut st = c.state.lock();
            st.qp = None;
            st.rep = None;
        })
    };
    // A lost bind destroys nothing: the CEP stays answerable.
    let h = c.core().handle();
    binding::bind(qp.cid(), h)?;
    start().map_err(|e| {
        restore_qp(qp, &before);
        if binding::release(qp.cid(), h, |_| {}) {
            e
        } else {
            // A destroy of the QP took the binding after our bind: it owns
            // the CEP now and destroys it (the rule's "CEP gone" outcome),
            // even if it has not got that far yet.
            cep_destroyed(c)
        }
    })
}

/// A CM-only accept: answer the connection request of `cep` for a QP the
/// caller owns (`local` says what the REP carries from it) and send the
/// REP. Nothing is bound. Before calling it, move the QP to INIT and RTR
/// with [`accept_attrs`] (same `local` and `reply`): the peer may send as
/// soon as the REP is in. On [`Event::Established`] move it to RTS
/// ([`ConnectionAttrs::rts`]); on `Rejected`, `Timeout`,
/// `DisconnectRequest`, `Disconnected`, `StaleConnection`, and when the
/// CEP is destroyed, to ERR: the CEP never touches it.
///
/// Fails as [`accept`] does, by the same claim: `e.is_gone(Kind::CEP)`
/// means the CEP is gone or going; any other error changes nothing (the
/// request is still waiting, and may be accepted, bound or CM-only,
/// rejected or destroyed). A request accepted CM-only cannot be accepted
/// again, on a QP or CM-only.
///
/// [`Event::Established`]: crate::proto::Event::Established
pub fn accept_unbound(
    al: &AlInstance,
    cep: Handle<Cep>,
    local: &LocalQpAttrs,
    reply: &AcceptReply,
) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let local = local.checked("accept_unbound")?;
    let private_data = PrivateData::new(&reply.private_data)
        .map_err(|e| Error::invalid_parameter(e.to_string()))?;
    let (conn, req) = c.claim_for_accept().map_err(|e| {
        if c.core().is_destroying() {
            cep_destroyed(&c)
        } else {
            e
        }
    })?;
    let result = accept_unbound_claimed(&c, conn, &req, &local, reply, private_data);
    c.state.lock().accepting = false;
    match result {
        Ok(()) => Ok(()),
        Err(_) if c.core().is_destroying() => Err(cep_destroyed(&c)),
        Err(e) => Err(e),
    }
}

/// The body of [`accept_unbound`], with the CEP claimed: [`accept_claimed`]
/// with no QP to bind or move.
fn accept_unbound_claimed(
    c: &Obj<Cep>,
    conn: ConnId,
    req: &Req,
    local: &LocalQpAttrs,
    reply: &AcceptReply,
    private_data: PrivateData<196>,
) -> Result<()> {
    check_transport(req, local.qp_type)?;
    let rep = build_rep(req, local, reply, private_data)?;
    let mut st = c.state.lock();
    if st.closed {
        return Err(cep_destroyed(c));
    }
    st.cm_only = true;
    st.rep = Some(rep);
    drop(st);
    c.port.0.agent.accept(conn, rep).inspect_err(|_| {
        let mut st = c.state.lock();
        st.cm_only = false;
        st.rep = None;
    })
}

/// The attributes the passive side's QP must have before a CM-only
/// [`accept_unbound`] with the same `local` and `reply` sends its REP: move
/// the QP to INIT and [`ConnectionAttrs::rtr`] first, so the peer's first
/// packets after its RTU find it ready. Computes what `accept_unbound` will
/// send; changes nothing.
pub fn accept_attrs(
    al: &AlInstance,
    cep: Handle<Cep>,
    local: &LocalQpAttrs,
    reply: &AcceptReply,
) -> Result<ConnectionAttrs> {
    let c = al.resolve(cep)?;
    let local = local.checked("accept_attrs")?;
    let (req, passive) = {
        let st = c.state.lock();
        (st.req, st.passive)
    };
    let Some(req) = req.filter(|_| passive) else {
        return Err(Error::invalid_state(
            "accept_attrs needs the passive CEP of a connection request",
        ));
    };
    check_transport(&req, local.qp_type)?;
    let rep = build_rep(&req, &local, reply, PrivateData::default())?;
    Ok(ConnectionAttrs::negotiated(
        c.port.0.agent.port(),
        PathEnd::Passive,
        &req,
        &rep,
    ))
}

/// The REP a passive side sends for `req` from `local` and `reply` (bound
/// and CM-only alike).
fn build_rep(
    req: &Req,
    local: &LocalQpAttrs,
    reply: &AcceptReply,
    private_data: PrivateData<196>,
) -> Result<Rep> {
    Ok(Rep {
        local_qpn: local.qpn,
        local_qkey: 0,
        starting_psn: local.starting_psn,
        responder_resources: reply.responder_resources.min(req.initiator_depth),
        initiator_depth: reply.initiator_depth.min(req.responder_resources),
        target_ack_delay: spec_bounded("target_ack_delay", reply.target_ack_delay, 31)?,
        end_to_end_flow_control: local.end_to_end_flow_control,
        rnr_retry_count: spec_bounded("rnr_retry_count", reply.rnr_retry_count, 7)?,
        srq: local.srq,
        private_data,
        ..Rep::default()
    })
}
