//! The CM's access-layer objects: [`Cep`] (a connection endpoint, bound to
//! its QP through the QP's CID slot, or CM-only) and [`Listen`], what each
//! holds, their teardown (the REJ or DREQ the state calls for, the route
//! and the binding dropped), and the reactions to events that touch a
//! bound QP before the handler runs. The calls that create and drive them
//! are in the files beside this one; `dispatch.rs` hands them the events.

use std::fmt;

use al::sync::{Arc, Mutex};
use al::{Error, Handle, Kind, Obj, Object, RawHandle, Result};
use provider::{QpModify, QpState};
use qp::cid as binding;
use qp::{CidState, Qp};

use super::attrs::{ConnectionAttrs, PathEnd};
use super::port::PortUse;
use crate::proto::{ConnId, Event, PeerAddr, State};
use crate::wire::{Rep, Req};

/// Called on the AL executor for every event of a CEP.
pub type CmHandler = std::sync::Arc<dyn Fn(Handle<Cep>, &Event) + Send + Sync>;

/// Called on the AL executor when a REQ (or SIDR_REQ) matches a listen: the
/// new CEP (in REQ_RCVD) and the event that created it. Answer with
/// [`accept`], [`reject`] or [`mra`]
/// (or [`sidr_reply`]).
///
/// [`accept`]: super::accept
/// [`reject`]: super::reject
/// [`mra`]: super::mra
/// [`sidr_reply`]: super::sidr_reply
pub type ListenHandler = std::sync::Arc<dyn Fn(Handle<Listen>, Handle<Cep>, &Event) + Send + Sync>;

/// A listen on a service id on one port.
pub struct Listen {
    pub(super) port: PortUse,
    /// The listener's id in the agent, once `listen` got it. Written by
    /// `listen` and taken by teardown under this lock, so a listen
    /// destroyed while it starts (AL close) is cancelled exactly once.
    pub(super) conn: Mutex<Option<ConnId>>,
    pub(super) service_id: u64,
    pub(super) on_request: ListenHandler,
    pub(super) cep_handler: CmHandler,
}

impl Object for Listen {
    const KIND: Kind = Kind::LISTEN;
    al::object_table!(Listen);

    fn teardown(obj: &Arc<Obj<Self>>) {
        if let Some(conn) = obj.conn.lock().take() {
            let _ = obj.port.0.agent.cancel_listen(conn);
        }
    }

    /// `service-id 0x.. port N lcomm-id 0x..` (no id: not listening yet,
    /// or cancelled).
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.hex("service-id", obj.service_id)
            .num("port", obj.port.0.agent.port());
        if let Some(conn) = *obj.conn.lock() {
            out.hex("lcomm-id", conn.comm_id());
        }
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

#[derive(Default)]
pub(super) struct CepState {
    /// The protocol's id for this connection, once known.
    pub(super) conn: Option<ConnId>,
    /// Set by teardown: nothing may start on this CEP any more.
    pub(super) closed: bool,
    pub(super) passive: bool,
    /// An accept holds this CEP (see `Cep::claim_for_accept`).
    pub(super) accepting: bool,
    /// The QP bound to this CEP (its CID slot names this CEP).
    pub(super) qp: Option<Arc<Obj<Qp>>>,
    /// A CM-only CEP: the consumer owns its QP, which the CEP never
    /// names or touches (`connect_unbound`, `accept_unbound`).
    pub(super) cm_only: bool,
    pub(super) req: Option<Req>,
    pub(super) rep: Option<Rep>,
    pub(super) peer: Option<PeerAddr>,
    pub(super) port: u8,
}

/// A connection endpoint.
pub struct Cep {
    pub(super) port: PortUse,
    pub(super) handler: CmHandler,
    pub(super) state: Mutex<CepState>,
}

impl Object for Cep {
    const KIND: Kind = Kind::CEP;
    al::object_table!(Cep);

    /// Close the CEP to new calls, tell the agent (which sends the REJ or
    /// DREQ the connection's state calls for and keeps the id through
    /// timewait), forget the route, and free the QP.
    fn teardown(obj: &Arc<Obj<Self>>) {
        let (conn, qp, cm_only) = {
            let mut st = obj.state.lock();
            st.closed = true;
            (st.conn.take(), st.qp.take(), st.cm_only)
        };
        if let Some(conn) = conn {
            obj.port.0.routes.inner.lock().remove(&conn);
            // MUTANT (loom-tests/run.sh --mutants): a CM-only CEP forgets
            // to end its connection (no REJ or DREQ; the agent keeps the
            // id, and the peer's QP is never told).
            let skip = cfg!(ibal_mutant = "cm_only_teardown_skips_agent") && cm_only;
            if !skip {
                let _ = obj.port.0.agent.destroy(conn);
            }
        }
        if let Some(qp) = qp {
            // We are being destroyed already: only the binding goes.
            binding::release(qp.cid(), obj.core().handle(), |_| {});
            tracing::debug!(target: "ibal::qp", qpn = %provider::trace::Hex(qp.qpn()), cep = conn.map(tracing::field::display), reason = "its CEP was destroyed", "QP moved to ERR");
            let _ = qp.modify(&QpModify::to(QpState::Err));
        }
    }

    /// `state ESTABLISHED side active port 1 lcomm-id 0x.. rcomm-id 0x..
    /// service-id 0x.. peer-lid N peer-gid .. peer-ip .. rqpn N qp QP#..`,
    /// from what the CEP holds and the agent's state of its connection
    /// (`IDLE`: none yet or any more; `CLOSED`: destroyed).
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        // Copied out so that the agent is asked with no CEP lock held.
        let (conn, closed, passive, cm_only, qp, req, rep, peer) = {
            let st = obj.state.lock();
            let qp = st.qp.as_ref().map(|q| q.core().handle());
            (
                st.conn, st.closed, st.passive, st.cm_only, qp, st.req, st.rep, st.peer,
            )
        };
        let state = conn.and_then(|c| obj.port.0.agent.state(c));
        out.text(
            "state",
            match state {
                Some(s) => s.name(),
                None if closed => "CLOSED",
                None => "IDLE",
            },
        )
        .text("side", if passive { "passive" } else { "active" })
        .num("port", obj.port.0.agent.port());
        // Ours is in the message we sent, the peer's in the one we got.
        let (sent_id, got_id, peer_qpn) = if passive {
            (
                rep.map(|r| r.local_comm_id),
                req.map(|r| r.local_comm_id),
                req.map(|r| r.local_qpn),
            )
        } else {
            (
                req.map(|r| r.local_comm_id),
                rep.map(|r| r.local_comm_id),
                rep.map(|r| r.local_qpn),
            )
        };
        if let Some(local) = conn.map(|c| c.comm_id()).or(sent_id) {
            out.hex("lcomm-id", local);
        }
        if let Some(remote) = got_id {
            out.hex("rcomm-id", remote);
        }
        if let Some(req) = req {
            out.hex("service-id", req.service_id);
        }
        if let Some(peer) = peer {
            describe_peer(&peer, out);
        }
        if let Some(rqpn) = peer_qpn {
            out.num("rqpn", rqpn);
        }
        if let Some(qp) = qp {
            out.handle("qp", qp);
        }
        if cm_only {
            out.flag("cm-only", true);
        }
    }
}

/// `peer-lid N` (unless 0 with a GID: RoCE has no LIDs), `peer-gid ADDR`
/// (when the MAD had a GRH) and `peer-ip ADDR` (when the GID is an
/// IPv4-mapped address, as RoCEv2's are).
fn describe_peer(peer: &PeerAddr, out: &mut al::Attrs) {
    let has_gid = peer.gid != [0; 16];
    if peer.lid != 0 || !has_gid {
        out.num("peer-lid", peer.lid);
    }
    if has_gid {
        let gid = std::net::Ipv6Addr::from(peer.gid);
        out.text("peer-gid", gid.to_string());
        if let Some(v4) = gid.to_ipv4_mapped() {
            out.text("peer-ip", v4.to_string());
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
            .field("cm_only", &st.cm_only)
            .finish()
    }
}

impl Cep {
    /// Whether this is a CM-only CEP ([`connect_unbound`],
    /// or a request accepted with [`accept_unbound`]):
    /// no QP is bound to it, and the
    /// consumer moves its own QP.
    ///
    /// [`connect_unbound`]: super::connect_unbound
    /// [`accept_unbound`]: super::accept_unbound
    pub fn is_cm_only(&self) -> bool {
        self.state.lock().cm_only
    }

    /// The protocol state of the connection, if it still has one.
    pub fn protocol_state(&self) -> Option<State> {
        let conn = self.state.lock().conn?;
        self.port.0.agent.state(conn)
    }

    /// Check that this CEP can be accepted now and reserve it for one
    /// accept: the passive side of a REQ still waiting for an answer, not
    /// closed, not bound, not being accepted by another call. Nothing else
    /// changes until the accept's own QP is bound.
    pub(super) fn claim_for_accept(&self) -> Result<(ConnId, Req)> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Error::invalid_state("the CEP is being destroyed"));
        }
        // MUTANT (loom-tests/run.sh --mutants): the old accept checked
        // neither the side nor an accept already made, and overwrote the
        // CEP's QP before the protocol call (clearing it when that failed).
        #[cfg(not(ibal_mutant = "accept_unclaimed"))]
        {
            if !st.passive {
                return Err(Error::invalid_state(
                    "accept answers a request a listen handed over; this CEP is the active side",
                ));
            }
            if st.qp.is_some() || st.accepting {
                return Err(Error::invalid_state(
                    "this request is already accepted (or being accepted) on a QP",
                ));
            }
            if st.cm_only {
                return Err(Error::invalid_state(
                    "this request is already accepted CM-only (accept_unbound)",
                ));
            }
        }
        let (Some(conn), Some(req)) = (st.conn, st.req) else {
            return Err(Error::invalid_state(
                "no connection request to accept on this CEP (SIDR is answered with sidr_reply)",
            ));
        };
        match self.port.0.agent.state(conn) {
            Some(State::ReqRcvd | State::MraReqSent) => {}
            other => {
                return Err(Error::invalid_state(format!(
                    "accept needs a request waiting for an answer; the connection is in {other:?}"
                )))
            }
        }
        st.accepting = true;
        Ok((conn, req))
    }

    /// The connection's id, for a call on a CEP that is not being destroyed.
    pub(super) fn conn(&self) -> Result<ConnId> {
        let st = self.state.lock();
        if st.closed {
            return Err(Error::invalid_state("the CEP is being destroyed"));
        }
        st.conn
            .ok_or_else(|| Error::invalid_state("the CEP has no connection"))
    }

    /// Protocol reactions that touch the QP, before the user sees the event.
    pub(super) fn react(&self, ev: &Event) {
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
                        let port = self.port.0.agent.port();
                        let attrs = ConnectionAttrs::negotiated(port, PathEnd::Passive, &req, &rep);
                        let _ = qp.modify(&attrs.rts());
                    }
                }
            }
            Event::Rejected { .. } | Event::Timeout { .. } | Event::StaleConnection { .. } => {
                tracing::info!(target: "ibal::qp", qpn = %provider::trace::Hex(qp.qpn()), cep = %ev.conn(), reason = %ev.name(), "QP moved to ERR");
                let _ = qp.modify(&QpModify::to(QpState::Err));
            }
            Event::DisconnectRequest { .. } | Event::Disconnected { .. } => {
                tracing::debug!(target: "ibal::qp", qpn = %provider::trace::Hex(qp.qpn()), cep = %ev.conn(), reason = %ev.name(), "QP moved to ERR");
                let _ = qp.modify(&QpModify::to(QpState::Err));
            }
            _ => {}
        }
    }

    /// The connection is over: free the QP and destroy this CEP. Whoever
    /// took the binding (this, or a racing QP destroy) destroys the CEP.
    pub(super) fn finish(this: &Obj<Self>) {
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

/// Destroy a CEP by its raw handle (as the CID slot names it).
pub(super) fn destroy_cep(h: RawHandle) {
    let _ = al::destroy_raw(h);
}

/// The error of a call that found its CEP destroyed under it.
pub(super) fn cep_destroyed(cep: &Obj<Cep>) -> Error {
    Error::Destroying {
        kind: Kind::CEP,
        raw: cep.core().handle().as_u64(),
    }
}

/// Why a bind on a QP failed, in the words the caller can act on.
pub(super) fn bind_error(qp: &Obj<Qp>, e: Error) -> Error {
    if let (Error::AlreadyConnected, CidState::Bound(other)) = (&e, qp.cid().load()) {
        if let Ok(c) = Cep::table().get(other) {
            if c.protocol_state() == Some(State::Timewait) {
                return Error::QpInTimewait;
            }
        }
    }
    e
}
