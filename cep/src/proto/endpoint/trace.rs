//! What the state machine tells a `tracing` subscriber (`docs/tracing.md`):
//! each CEP's state changes, every MAD queued for sending and every MAD
//! received, what a MAD was ignored for, REJs with their reason, retries,
//! final timeouts and SIDR outcomes.
//!
//! `tracing` does no I/O of its own and keeps no state here, so the core
//! stays sans-IO and deterministic: with no subscriber each event is one
//! check of a global level, and its fields are never built.

use provider::trace::{Gid, Hex};
use tracing::Level;

use crate::proto::{ConnId, DisconnectCause, Event, PeerAddr, RejectOrigin, State};
use crate::wire::{CmMad, CmMessage, SidrStatus};

/// The comm ids a MAD carries, as its sender names them: (the sender's,
/// the receiver's); 0 where the message has none. A SIDR message's
/// RequestID is the requester's id.
fn comm_ids(m: &CmMessage) -> (u32, u32) {
    match m {
        CmMessage::Req(r) => (r.local_comm_id, 0),
        CmMessage::Mra(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rtu(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::SidrReq(r) => (r.request_id, 0),
        CmMessage::SidrRep(r) => (r.request_id, 0),
        CmMessage::Lap(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Apr(r) => (r.local_comm_id, r.remote_comm_id),
    }
}

/// The service id a REQ or SIDR_REQ asks for, as a field.
fn service_id(m: &CmMessage) -> Option<tracing::field::DisplayValue<Hex<u64>>> {
    match m {
        CmMessage::Req(r) => Some(tracing::field::display(Hex(r.service_id))),
        CmMessage::SidrReq(r) => Some(tracing::field::display(Hex(r.service_id))),
        _ => None,
    }
}

/// A CEP changed state (`None`: it does not exist, before it was made or
/// after its id was freed).
pub(super) fn state_change(id: u32, peer: PeerAddr, from: Option<State>, to: Option<State>) {
    tracing::debug!(
        target: "ibal::cm",
        cep = %ConnId(id),
        from = %from.map_or("IDLE", State::name),
        to = %to.map_or("IDLE", State::name),
        peer_gid = %Gid(peer.gid),
        peer_lid = peer.lid,
        "CEP state change"
    );
}

/// A MAD queued for sending; a REJ also at `info` with its reason.
pub(super) fn mad_sent(to: PeerAddr, conn: Option<u32>, mad: &CmMad) {
    if tracing::enabled!(target: "ibal::cm::mad", Level::DEBUG) {
        let (local, remote) = comm_ids(&mad.message);
        tracing::debug!(
            target: "ibal::cm::mad",
            attr = %mad.message_kind(),
            tid = %Hex(mad.transaction_id),
            cep = conn.map(|c| tracing::field::display(ConnId(c))),
            local_comm_id = %Hex(local),
            remote_comm_id = %Hex(remote),
            service_id = service_id(&mad.message),
            peer_gid = %Gid(to.gid),
            peer_lid = to.lid,
            "CM MAD sent"
        );
    }
    if let CmMessage::Rej(rej) = &mad.message {
        tracing::info!(
            target: "ibal::cm",
            cep = conn.map(|c| tracing::field::display(ConnId(c))),
            reason = ?rej.reason,
            reason_code = rej.reason.code(),
            message_rejected = ?rej.message_rejected,
            local_comm_id = %Hex(rej.local_comm_id),
            remote_comm_id = %Hex(rej.remote_comm_id),
            peer_gid = %Gid(to.gid),
            peer_lid = to.lid,
            "REJ sent"
        );
    }
    sidr_answered(to, mad);
}

/// A MAD received (before the state machine looks at it).
pub(super) fn mad_received(from: PeerAddr, mad: &CmMad) {
    if !tracing::enabled!(target: "ibal::cm::mad", Level::DEBUG) {
        return;
    }
    let (local, remote) = comm_ids(&mad.message);
    tracing::debug!(
        target: "ibal::cm::mad",
        attr = %mad.message_kind(),
        tid = %Hex(mad.transaction_id),
        local_comm_id = %Hex(local),
        remote_comm_id = %Hex(remote),
        service_id = service_id(&mad.message),
        peer_gid = %Gid(from.gid),
        peer_lid = from.lid,
        "CM MAD received"
    );
}

/// A received MAD changed nothing and got no answer.
pub(super) fn mad_ignored(from: PeerAddr, attr: &'static str, why: &'static str) {
    tracing::debug!(
        target: "ibal::cm::mad",
        attr = %attr,
        reason = why,
        peer_gid = %Gid(from.gid),
        peer_lid = from.lid,
        "CM MAD ignored"
    );
}

/// A request sent again by its retry timer (`retry` of `max`).
pub(super) fn resend(id: u32, peer: PeerAddr, attr: &'static str, retry: u8, max: u8) {
    tracing::debug!(
        target: "ibal::cm",
        cep = %ConnId(id),
        attr = %attr,
        retry,
        max_retries = max,
        peer_gid = %Gid(peer.gid),
        peer_lid = peer.lid,
        "CM request resent"
    );
}

/// The events a person wants to see without the whole MAD flow: REJs
/// received, final timeouts, disconnects that got no DREP, stale
/// connections, SIDR answers.
pub(super) fn event(e: &Event, peer: Option<PeerAddr>) {
    let peer = peer.unwrap_or_default();
    match e {
        Event::Rejected {
            conn,
            reason,
            message,
            origin: RejectOrigin::Remote,
            rej,
        } => tracing::info!(
            target: "ibal::cm",
            cep = %conn,
            reason = ?reason,
            reason_code = reason.code(),
            message_rejected = ?message,
            remote_comm_id = %Hex(rej.local_comm_id),
            peer_gid = %Gid(peer.gid),
            peer_lid = peer.lid,
            "REJ received"
        ),
        Event::Timeout { conn, message } => tracing::warn!(
            target: "ibal::cm",
            cep = %conn,
            request = ?message,
            peer_gid = %Gid(peer.gid),
            peer_lid = peer.lid,
            "CM request timed out"
        ),
        Event::Disconnected {
            conn,
            cause: DisconnectCause::DreqTimeout,
            ..
        } => tracing::warn!(
            target: "ibal::cm",
            cep = %conn,
            peer_gid = %Gid(peer.gid),
            peer_lid = peer.lid,
            "DREQ timed out, no DREP"
        ),
        Event::StaleConnection { conn } => tracing::info!(
            target: "ibal::cm",
            cep = %conn,
            peer_gid = %Gid(peer.gid),
            peer_lid = peer.lid,
            "stale connection"
        ),
        Event::SidrReply { conn, rep } => {
            if rep.status == SidrStatus::Success {
                tracing::debug!(
                    target: "ibal::cm",
                    cep = %conn,
                    service_id = %Hex(rep.service_id),
                    qpn = %Hex(rep.qpn),
                    qkey = %Hex(rep.qkey),
                    peer_gid = %Gid(peer.gid),
                    "SIDR resolved"
                );
            } else {
                tracing::info!(
                    target: "ibal::cm",
                    cep = %conn,
                    service_id = %Hex(rep.service_id),
                    status = ?rep.status,
                    status_code = rep.status.code(),
                    peer_gid = %Gid(peer.gid),
                    "SIDR refused"
                );
            }
        }
        _ => {}
    }
}

/// A SIDR_REP this endpoint sent: a refusal at `info`.
fn sidr_answered(to: PeerAddr, mad: &CmMad) {
    if let CmMessage::SidrRep(rep) = &mad.message {
        if rep.status != SidrStatus::Success {
            tracing::info!(
                target: "ibal::cm",
                request_id = %Hex(rep.request_id),
                service_id = %Hex(rep.service_id),
                status = ?rep.status,
                status_code = rep.status.code(),
                peer_gid = %Gid(to.gid),
                peer_lid = to.lid,
                "SIDR_REP refusal sent"
            );
        }
    }
}
