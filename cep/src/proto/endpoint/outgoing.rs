//! What a CEP sends on its own account, not as the direct answer to a
//! user call: REJs (for a CEP, or stateless for a REQ or REP that has
//! none), DREQ and DREP, the disconnect or reject of a connection a new
//! one made stale; and what a REQ may not ask for.

use super::Endpoint;
use crate::proto::{ConnId, Event, Nanos, PeerAddr, ProtoError, State};
use crate::wire::{
    CmMad, CmMessage, Drep, Dreq, MessageRejected, PrivateData, Rej, RejectReason, Req, INFO_LEN,
};

impl Endpoint {
    pub(super) fn build_rej(
        &self,
        id: u32,
        reason: RejectReason,
        message: MessageRejected,
        ari: &[u8],
        private_data: PrivateData<148>,
    ) -> Option<CmMad> {
        let c = self.conns.get(id)?;
        let (ari, len) = info_area(ari).ok()?;
        Some(CmMad::new(
            c.tid,
            Rej {
                local_comm_id: c.id,
                remote_comm_id: c.remote_comm_id,
                message_rejected: message,
                rejected_info_length: len,
                reason,
                ari,
                private_data,
            },
        ))
    }

    /// Sends a REJ for this CEP (remembered for duplicates) and enters
    /// TIMEWAIT. Returns the REJ sent.
    pub(super) fn reject_and_timewait(
        &mut self,
        now: Nanos,
        id: u32,
        reason: RejectReason,
        message: MessageRejected,
        private_data: PrivateData<148>,
    ) -> Option<Rej> {
        let guid = self.config.local_ca_guid.to_be_bytes();
        // IBTA: the ARI of a Timeout REJ is the rejecting CA's GUID.
        let ari: &[u8] = if reason == RejectReason::Timeout {
            &guid
        } else {
            &[]
        };
        let mad = self.build_rej(id, reason, message, ari, private_data);
        self.cancel_timer(id);
        let rej = mad.and_then(|mad| {
            self.send_reply(id, mad);
            match mad.message {
                CmMessage::Rej(r) => Some(r),
                _ => None,
            }
        });
        self.enter_timewait(now, id);
        rej
    }

    /// Stateless REJ answering a REQ that created no CEP.
    pub(super) fn stateless_rej(
        &mut self,
        to: PeerAddr,
        tid: u64,
        req: &Req,
        reason: RejectReason,
    ) {
        self.stateless_rej_ari(to, tid, req, reason, &[]);
    }

    /// A REJ for a REQ that got no CEP, with `ari` as its additional
    /// rejection information.
    pub(super) fn stateless_rej_ari(
        &mut self,
        to: PeerAddr,
        tid: u64,
        req: &Req,
        reason: RejectReason,
        ari: &[u8],
    ) {
        let rej = rej_without_cep(req.local_comm_id, MessageRejected::Req, reason, ari);
        self.send(to, None, CmMad::new(tid, rej));
    }

    pub(super) fn build_dreq(
        &self,
        id: u32,
        tid: u64,
        private_data: PrivateData<220>,
    ) -> Option<CmMad> {
        let c = self.conns.get(id)?;
        Some(CmMad::new(
            tid,
            Dreq {
                local_comm_id: c.id,
                remote_comm_id: c.remote_comm_id,
                remote_qpn_eecn: c.remote_qpn,
                private_data,
            },
        ))
    }

    pub(super) fn build_drep(&self, id: u32, private_data: PrivateData<224>) -> Option<CmMad> {
        let c = self.conns.get(id)?;
        Some(CmMad::new(
            c.dreq_tid,
            Drep {
                local_comm_id: c.id,
                remote_comm_id: c.remote_comm_id,
                private_data,
            },
        ))
    }

    /// Sends DREQ, moving to DREQ_SENT with the retry timer.
    pub(super) fn start_disconnect(&mut self, now: Nanos, id: u32, private_data: PrivateData<220>) {
        let tid = self.alloc_tid();
        if let Some(c) = self.conns.get_mut(id) {
            c.dreq_tid = tid;
        }
        self.cancel_timer(id);
        if let Some(mad) = self.build_dreq(id, tid, private_data) {
            self.send_request(now, id, State::DreqSent, mad);
        }
    }

    /// `old` was named by a new REQ/REP as using the same remote QPN: it is
    /// stale. Disconnect it if established, reject it if still connecting.
    pub(super) fn stale_old(&mut self, now: Nanos, old: u32) {
        let Some(state) = self.state(ConnId(old)) else {
            return;
        };
        self.emit(Event::StaleConnection { conn: ConnId(old) });
        if state.is_established() {
            self.start_disconnect(now, old, PrivateData::zeroed());
            return;
        }
        let message = match state {
            State::ReqRcvd | State::MraReqSent => MessageRejected::Req,
            State::RepRcvd | State::MraRepSent => MessageRejected::Rep,
            State::RepSent | State::MraRepRcvd => MessageRejected::Other,
            _ => return,
        };
        self.reject_and_timewait(
            now,
            old,
            RejectReason::StaleConnection,
            message,
            PrivateData::zeroed(),
        );
    }
}

pub(super) fn info_area(info: &[u8]) -> Result<([u8; INFO_LEN], u8), ProtoError> {
    if info.len() > INFO_LEN {
        return Err(ProtoError::InvalidParam(
            "additional information longer than 72 bytes",
        ));
    }
    let mut area = [0u8; INFO_LEN];
    for (d, s) in area.iter_mut().zip(info) {
        *d = *s;
    }
    // INFO_LEN is 72, so this cannot truncate.
    Ok((area, info.len() as u8))
}

/// A REJ answering a message that has no CEP here: our comm id is zero,
/// the sender's is `remote_comm_id`, `ari` the additional information.
pub(super) fn rej_without_cep(
    remote_comm_id: u32,
    message_rejected: MessageRejected,
    reason: RejectReason,
    ari: &[u8],
) -> Rej {
    let mut info = [0u8; crate::wire::INFO_LEN];
    let n = ari.len().min(info.len());
    info[..n].copy_from_slice(&ari[..n]);
    Rej {
        local_comm_id: 0,
        remote_comm_id,
        message_rejected,
        rejected_info_length: n as u8,
        reason,
        ari: info,
        ..Rej::default()
    }
}

/// What of a REQ this CM cannot honour, as the REJ reason the spec gives
/// for it (IBTA 12.6.7): the extended (XRC) transport and reliable
/// datagram are not offered, and a path MTU code outside 256..4096 bytes
/// (codes 1..=5) names no MTU.
pub(super) fn unsupported_req(req: &Req) -> Option<RejectReason> {
    if req.transport_service_type == crate::wire::TransportType::Extended {
        return Some(RejectReason::InvalidTransportType);
    }
    if !(1..=5).contains(&req.path_mtu) {
        return Some(RejectReason::InvalidMtu);
    }
    None
}
