//! The calls on a connection once it exists: the active side's [`rtu`],
//! [`reject`], [`mra`], [`disconnect`] and [`disconnect_reply`], [`lap`]
//! and [`apr`], and [`connection_attrs`] (what each end's QP is moved
//! with). Each goes to the port's agent by the CEP's connection id.

use al::{AlInstance, Error, Handle, Result};

use super::attrs::{ConnectionAttrs, PathEnd};
use super::objects::Cep;
use crate::proto::{LapParams, State};
use crate::wire::{ApStatus, RejectReason};

/// Active side, after the reply: move the QP to RTR and RTS from the REP,
/// and send the RTU. A CM-only CEP ([`connect_unbound`]) only sends the
/// RTU: its caller moves its own QP first ([`connection_attrs`]).
///
/// [`connect_unbound`]: super::connect_unbound
pub fn rtu(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?.to_arc();
    let conn = c.conn()?;
    let (qp, req, port, cm_only, passive) = {
        let st = c.state.lock();
        (st.qp.clone(), st.req, st.port, st.cm_only, st.passive)
    };
    let Some(req) = req.filter(|_| !passive && (qp.is_some() || cm_only)) else {
        return Err(Error::invalid_state(
            "rtu answers the reply of an active CEP (bound by connect, or connect_unbound)",
        ));
    };
    let rep = match c.port.0.agent.state(conn) {
        Some(State::RepRcvd) | Some(State::MraRepSent) => c
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
    if let Some(qp) = qp {
        let attrs = ConnectionAttrs::negotiated(port, PathEnd::Active, &req, &rep);
        qp.modify(&attrs.rtr())?;
        qp.modify(&attrs.rts())?;
    }
    c.port
        .0
        .agent
        .send_rtu(conn, private_data)
        .map_err(connection_over)
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
    c.port
        .0
        .agent
        .reject(conn, reason, &[], private_data)
        .map_err(connection_over)
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
    c.port
        .0
        .agent
        .send_mra(conn, service_timeout, private_data)
        .map_err(connection_over)
}

/// Start a disconnect (DREQ).
pub fn disconnect(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port
        .0
        .agent
        .disconnect(conn, private_data)
        .map_err(connection_over)
}

/// Answer the peer's DREQ (DREP).
pub fn disconnect_reply(al: &AlInstance, cep: Handle<Cep>, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port
        .0
        .agent
        .disconnect_reply(conn, private_data)
        .map_err(connection_over)
}

/// Propose an alternate path (LAP).
pub fn lap(al: &AlInstance, cep: Handle<Cep>, params: LapParams) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port.0.agent.lap(conn, params).map_err(connection_over)
}

/// Answer the peer's LAP (APR).
pub fn apr(al: &AlInstance, cep: Handle<Cep>, status: ApStatus, private_data: &[u8]) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port
        .0
        .agent
        .apr(conn, status, &[], private_data)
        .map_err(connection_over)
}

/// The attributes of `cep`'s end of the connection, from its REQ and REP:
/// on the active side once the REP is in (inside the
/// [`Event::ReplyReceived`] callback and after), on the passive side once
/// it accepted. Works on bound and CM-only CEPs; a CM-only consumer moves
/// its QP with [`ConnectionAttrs::rtr`] and [`ConnectionAttrs::rts`].
///
/// [`Event::ReplyReceived`]: crate::proto::Event::ReplyReceived
pub fn connection_attrs(al: &AlInstance, cep: Handle<Cep>) -> Result<ConnectionAttrs> {
    let c = al.resolve(cep)?;
    let port = c.port.0.agent.port();
    let st = c.state.lock();
    let (Some(req), Some(rep)) = (st.req, st.rep) else {
        return Err(Error::invalid_state(
            "the connection has no REQ and REP yet (active side: after ReplyReceived; \
             passive side: after accept)",
        ));
    };
    let end = if st.passive {
        PathEnd::Passive
    } else {
        PathEnd::Active
    };
    Ok(ConnectionAttrs::negotiated(port, end, &req, &rep))
}

/// The agent forgets a connection as soon as it ends (rejected, timed out,
/// out of timewait), and the CEP object goes only when its `Released` job
/// runs on the executor. A call in between names a CEP whose connection is
/// over: that is `InvalidState`, as for a CEP with no connection
/// (`Cep::conn`), not the agent's `NotFound` for an id it never had.
pub(super) fn connection_over(e: Error) -> Error {
    match e {
        Error::NotFound(why) => Error::invalid_state(format!("the connection has ended ({why})")),
        e => e,
    }
}
