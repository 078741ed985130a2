//! The user's calls: listen, connect, accept, reject, MRA, RTU,
//! "communication established", disconnect and its reply, LAP and APR,
//! SIDR, and destroy in every state. Each checks the CEP's state and
//! that what it would send encodes before anything changes.

use super::outgoing::{info_area, unsupported_req};
use super::{Conn, Endpoint, Listener};
use crate::proto::{
    response_wait_nanos, ConnId, ConnectParams, LapParams, Nanos, PeerAddr, ProtoError, SidrParams,
    SidrReplyParams, State, DEFAULT_BACKLOG,
};
use crate::wire::{
    ApStatus, Apr, CmMad, CmMessage, Lap, MessageMraed, MessageRejected, Mra, PrivateData,
    RejectReason, Rep, Rtu, SidrRep, SidrReq, SidrStatus,
};

fn wrong_state(conn: &Conn, call: &'static str) -> ProtoError {
    ProtoError::WrongState {
        conn: ConnId(conn.id),
        state: conn.state,
        call,
    }
}

/// Checks that a message can be encoded, so that everything queued for
/// transmission is valid.
fn check_encodes(message: impl Into<CmMessage>) -> Result<(), ProtoError> {
    crate::wire::validate(&CmMad::new(0, message))?;
    Ok(())
}

impl Endpoint {
    /// The CEP for a user call: allocated and not destroyed.
    fn user_conn(&self, conn: ConnId) -> Result<&Conn, ProtoError> {
        let c = self
            .conns
            .get(conn.0)
            .ok_or(ProtoError::UnknownConn(conn))?;
        if c.destroyed {
            return Err(ProtoError::Destroyed(conn));
        }
        Ok(c)
    }

    fn alloc(&mut self, make: impl FnOnce(u32) -> Conn) -> Result<u32, ProtoError> {
        self.conns.insert_with(make).ok_or(ProtoError::NoFreeIds)
    }

    /// Starts listening for REQ and SIDR_REQ with `service_id`. The returned
    /// CEP is in LISTEN; [`Endpoint::cancel_listen`] or
    /// [`Endpoint::destroy`] ends it.
    pub fn listen(&mut self, service_id: u64) -> Result<ConnId, ProtoError> {
        if self.listeners.contains_key(&service_id) {
            return Err(ProtoError::ServiceIdInUse(service_id));
        }
        let id = self.alloc(|id| {
            let mut c = Conn::new(id, State::Listen, PeerAddr::default());
            c.service_id = service_id;
            c
        })?;
        let listener = Listener {
            id,
            backlog: DEFAULT_BACKLOG,
            queued: 0,
        };
        self.listeners.insert(service_id, listener);
        Ok(ConnId(id))
    }

    /// Sets how many requests `listener` holds that the user has not
    /// answered yet (accept, reject, MRA does not count, destroy) before it
    /// refuses new ones: a REQ over the backlog gets REJ "no resources"
    /// (reason 3) and a SIDR_REQ a SIDR_REP "no QP", at once and without a
    /// CEP. At least 1; [`DEFAULT_BACKLOG`] until set. Lowering it below
    /// the requests already held refuses only new ones.
    ///
    /// [`DEFAULT_BACKLOG`]: crate::proto::DEFAULT_BACKLOG
    pub fn set_backlog(&mut self, listener: ConnId, backlog: u32) -> Result<(), ProtoError> {
        if backlog == 0 {
            return Err(ProtoError::InvalidParam(
                "a listen's backlog must be at least 1",
            ));
        }
        let c = self.user_conn(listener)?;
        if c.state != State::Listen {
            return Err(wrong_state(c, "set_backlog"));
        }
        let service_id = c.service_id;
        if let Some(l) = self.listeners.get_mut(&service_id) {
            l.backlog = backlog;
        }
        Ok(())
    }

    /// The requests `listener` holds unanswered, and its backlog.
    pub fn backlog(&self, listener: ConnId) -> Option<(u32, u32)> {
        let c = self.conns.get(listener.0)?;
        let l = self.listeners.get(&c.service_id)?;
        (l.id == listener.0).then_some((l.queued, l.backlog))
    }

    /// Stops a listener and frees its id
    /// ([`Event::Released`]). CEPs it created
    /// live on.
    ///
    /// [`Event::Released`]: crate::proto::Event::Released
    pub fn cancel_listen(&mut self, listener: ConnId) -> Result<(), ProtoError> {
        let c = self.user_conn(listener)?;
        if c.state != State::Listen {
            return Err(wrong_state(c, "cancel_listen"));
        }
        self.free(listener.0);
        Ok(())
    }

    /// Sends a REQ. The CEP is in REQ_SENT and retries every
    /// `2 * PacketLifeTime + RemoteCMResponseTimeout` up to MaxCMRetries
    /// times. While [`EndpointConfig::request_window`] requests await their
    /// answer the REQ waits in line (the CEP is in REQ_SENT all the same).
    ///
    /// [`EndpointConfig::request_window`]: crate::proto::EndpointConfig::request_window
    pub fn connect(&mut self, now: Nanos, params: ConnectParams) -> Result<ConnId, ProtoError> {
        let mut req = params.req;
        req.local_ca_guid = self.config.local_ca_guid;
        check_encodes(req)?;
        // What a peer (this CM included) must reject is refused here, so it
        // is never sent: a 4-bit path MTU outside 1..=5 names no MTU.
        match unsupported_req(&req) {
            Some(RejectReason::InvalidMtu) => {
                return Err(ProtoError::InvalidParam(
                    "the REQ's path MTU code must be 1..=5 (256..4096 bytes)",
                ))
            }
            Some(_) => {
                return Err(ProtoError::InvalidParam(
                    "the REQ's transport service type is not offered",
                ))
            }
            None => {}
        }
        let tid = self.alloc_tid();
        let id = self.alloc(|id| {
            let mut c = Conn::new(id, State::ReqSent, params.peer);
            c.service_id = req.service_id;
            c.local_qpn = req.local_qpn;
            c.tid = tid;
            c.packet_life_time = params.packet_life_time;
            c.peer_response_timeout = req.remote_cm_response_timeout;
            c.max_retries = req.max_cm_retries;
            c
        })?;
        req.local_comm_id = id;
        self.send_request(now, id, State::ReqSent, CmMad::new(tid, req));
        Ok(ConnId(id))
    }

    /// Accepts a connection request with a REP. `local_comm_id`,
    /// `remote_comm_id` and `local_ca_guid` are filled in. The CEP moves to
    /// REP_SENT and retries the REP until an RTU (or
    /// [`Endpoint::established`]).
    pub fn accept(&mut self, now: Nanos, conn: ConnId, rep: Rep) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(wrong_state(c, "accept"));
        }
        let rep = Rep {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            local_ca_guid: self.config.local_ca_guid,
            ..rep
        };
        check_encodes(rep)?;
        let mad = CmMad::new(c.tid, rep);
        if let Some(c) = self.conns.get_mut(conn.0) {
            c.local_qpn = rep.local_qpn;
            c.target_ack_delay = Some(rep.target_ack_delay);
            c.last_reply = Some(Box::new(mad));
        }
        self.send_request(now, conn.0, State::RepSent, mad);
        Ok(())
    }

    /// Rejects a REQ (in REQ_RCVD / MRA_REQ_SENT) or a REP (in REP_RCVD /
    /// MRA_REP_SENT). The CEP enters TIMEWAIT.
    pub fn reject(
        &mut self,
        now: Nanos,
        conn: ConnId,
        reason: RejectReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        let message = match c.state {
            State::ReqRcvd | State::MraReqSent => MessageRejected::Req,
            State::RepRcvd | State::MraRepSent => MessageRejected::Rep,
            _ => return Err(wrong_state(c, "reject")),
        };
        let pd = PrivateData::new(private_data)?;
        info_area(ari)?;
        let mad = self
            .build_rej(conn.0, reason, message, ari, pd)
            .ok_or(ProtoError::UnknownConn(conn))?;
        check_encodes(mad.message)?;
        self.cancel_timer(conn.0);
        self.send_reply(conn.0, mad);
        self.enter_timewait(now, conn.0);
        Ok(())
    }

    /// Sends an MRA for the REQ (REQ_RCVD), REP (REP_RCVD) or LAP (LAP_RCVD)
    /// just received, asking the peer to wait `service_timeout` longer.
    pub fn send_mra(
        &mut self,
        now: Nanos,
        conn: ConnId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        let (message, next) = match c.state {
            // MRA_REQ_SENT too: the CM may have sent one on its own (a
            // duplicate REQ, see `hold_requester`); the user's asks for
            // its own time.
            State::ReqRcvd | State::MraReqSent => (MessageMraed::Req, State::MraReqSent),
            State::RepRcvd => (MessageMraed::Rep, State::MraRepSent),
            State::LapRcvd => (MessageMraed::Lap, State::MraLapSent),
            _ => return Err(wrong_state(c, "send_mra")),
        };
        let tid = if message == MessageMraed::Lap {
            c.lap_tid
        } else {
            c.tid
        };
        let mra_wait =
            response_wait_nanos(c.packet_life_time, service_timeout).saturating_add(c.answer_wait);
        let mra = Mra {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            message_mraed: message,
            service_timeout,
            private_data: PrivateData::new(private_data)?,
        };
        check_encodes(mra)?;
        if next == State::MraReqSent {
            // The peer now waits the service timeout before it resumes its
            // REQ retries: the answer deadline moves out by as much.
            self.set_timer(conn.0, now.saturating_add(mra_wait));
        }
        self.set_state(conn.0, next);
        self.send_reply(conn.0, CmMad::new(tid, mra));
        Ok(())
    }

    /// Sends the RTU (active side, in REP_RCVD / MRA_REP_SENT): the
    /// connection is established.
    pub fn send_rtu(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(wrong_state(c, "send_rtu"));
        }
        let rtu = Rtu {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            private_data: PrivateData::new(private_data)?,
        };
        let mad = CmMad::new(c.tid, rtu);
        if private_data.iter().all(|&b| b == 0) {
            // Rebuilt from the ids if a duplicate REP asks for it again:
            // an established connection keeps no copy.
            self.send_for(conn.0, mad);
            if let Some(c) = self.conns.get_mut(conn.0) {
                c.last_reply = None;
                c.plain_rtu = true;
            }
        } else {
            self.send_reply(conn.0, mad);
        }
        self.become_established(conn.0);
        Ok(())
    }

    /// "Communication established": data arrived on the QP before the RTU
    /// (passive side, REP_SENT / MRA_REP_RCVD). Moves to ESTABLISHED as if
    /// the RTU had come.
    pub fn established(&mut self, conn: ConnId) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return Err(wrong_state(c, "established"));
        }
        self.become_established(conn.0);
        Ok(())
    }

    /// Sends a DREQ (ESTABLISHED or an alternate-path substate; an
    /// outstanding LAP is abandoned). The CEP retries in DREQ_SENT until a
    /// DREP (the DREQ waits in line while the request window is full), then
    /// [`Event::Disconnected`].
    ///
    /// [`Event::Disconnected`]: crate::proto::Event::Disconnected
    pub fn disconnect(
        &mut self,
        now: Nanos,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if !c.state.is_established() {
            return Err(wrong_state(c, "disconnect"));
        }
        let pd = PrivateData::new(private_data)?;
        self.start_disconnect(now, conn.0, pd);
        Ok(())
    }

    /// Answers a DREQ (DREQ_RCVD) with a DREP; the CEP enters TIMEWAIT.
    pub fn disconnect_reply(
        &mut self,
        now: Nanos,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if c.state != State::DreqRcvd {
            return Err(wrong_state(c, "disconnect_reply"));
        }
        let pd = PrivateData::new(private_data)?;
        if let Some(mad) = self.build_drep(conn.0, pd) {
            self.send_reply(conn.0, mad);
        }
        self.enter_timewait(now, conn.0);
        Ok(())
    }

    /// Proposes an alternate path (ESTABLISHED -> LAP_SENT), retried until
    /// an APR, an MRA or a REJ answers it.
    pub fn lap(&mut self, now: Nanos, conn: ConnId, params: LapParams) -> Result<(), ProtoError> {
        if !self.alternate_paths() {
            return Err(ProtoError::InvalidParam(
                "LAP: a RoCE port has no alternate paths to load (Linux's CM refuses LAP on RoCE too)",
            ));
        }
        let c = self.user_conn(conn)?;
        if c.state != State::Established {
            return Err(wrong_state(c, "lap"));
        }
        let lap = Lap {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn_eecn: c.remote_qpn,
            remote_cm_response_timeout: c.peer_response_timeout,
            alternate_path: params.alternate_path,
            private_data: params.private_data,
        };
        check_encodes(lap)?;
        let tid = self.alloc_tid();
        if let Some(c) = self.conns.get_mut(conn.0) {
            c.lap_tid = tid;
        }
        self.send_request(now, conn.0, State::LapSent, CmMad::new(tid, lap));
        Ok(())
    }

    /// Answers a LAP (LAP_RCVD / MRA_LAP_SENT) with an APR; back to
    /// ESTABLISHED.
    pub fn apr(
        &mut self,
        conn: ConnId,
        status: ApStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if !matches!(c.state, State::LapRcvd | State::MraLapSent) {
            return Err(wrong_state(c, "apr"));
        }
        let (additional_info, additional_info_length) = info_area(info)?;
        let apr = Apr {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            additional_info_length,
            ap_status: status,
            additional_info,
            private_data: PrivateData::new(private_data)?,
        };
        check_encodes(apr)?;
        let mad = CmMad::new(c.lap_tid, apr);
        self.set_state(conn.0, State::Established);
        self.send_reply(conn.0, mad);
        Ok(())
    }

    /// Sends a SIDR_REQ. The SIDR CEP retries every
    /// `2 * PacketLifeTime + timeout` up to `max_retries` times, then reports
    /// [`Event::Timeout`]; it is released after
    /// the reply or the timeout.
    ///
    /// [`Event::Timeout`]: crate::proto::Event::Timeout
    pub fn sidr_request(&mut self, now: Nanos, params: SidrParams) -> Result<ConnId, ProtoError> {
        let tid = self.alloc_tid();
        let id = self.alloc(|id| {
            let mut c = Conn::new(id, State::SidrReqSent, params.peer);
            c.service_id = params.service_id;
            c.tid = tid;
            c.packet_life_time = params.packet_life_time;
            c.peer_response_timeout = params.timeout;
            c.max_retries = params.max_retries;
            c
        })?;
        let req = SidrReq {
            request_id: id,
            pkey: params.pkey,
            service_id: params.service_id,
            private_data: params.private_data,
        };
        self.send_request(now, id, State::SidrReqSent, CmMad::new(tid, req));
        Ok(ConnId(id))
    }

    /// Answers a SIDR_REQ (SIDR_REQ_RCVD); the SIDR CEP is released.
    pub fn sidr_reply(&mut self, conn: ConnId, reply: SidrReplyParams) -> Result<(), ProtoError> {
        let c = self.user_conn(conn)?;
        if c.state != State::SidrReqRcvd {
            return Err(wrong_state(c, "sidr_reply"));
        }
        let rep = SidrRep {
            request_id: c.remote_comm_id,
            status: reply.status,
            additional_info_length: reply.additional_info_length,
            qpn: reply.qpn,
            service_id: c.service_id,
            qkey: reply.qkey,
            additional_info: reply.additional_info,
            private_data: reply.private_data,
        };
        check_encodes(rep)?;
        let mad = CmMad::new(c.tid, rep);
        self.send_for(conn.0, mad);
        self.free(conn.0);
        Ok(())
    }

    /// The user destroys a CEP. It sends what its state calls for and then
    /// waits out TIMEWAIT on its own (no more events except
    /// [`Event::TimewaitExited`] and
    /// [`Event::Released`]):
    ///
    /// | state | sent | next |
    /// |---|---|---|
    /// | LISTEN, SIDR_REQ_SENT | nothing | released |
    /// | SIDR_REQ_RCVD | SIDR_REP (rejected) | released |
    /// | REQ_SENT, the REQ waiting for the window | nothing | released |
    /// | REQ_SENT, MRA_REQ_RCVD | REJ(Timeout) | TIMEWAIT |
    /// | REQ_RCVD, MRA_REQ_SENT, REP_RCVD, MRA_REP_SENT, REP_SENT, MRA_REP_RCVD | REJ(ConsumerReject) | TIMEWAIT |
    /// | ESTABLISHED and LAP substates | DREQ (once) | TIMEWAIT |
    /// | DREQ_SENT, the DREQ waiting for the window | the DREQ (once) | TIMEWAIT |
    /// | DREQ_SENT | nothing | TIMEWAIT |
    /// | DREQ_RCVD | DREP | TIMEWAIT |
    /// | TIMEWAIT | nothing | TIMEWAIT |
    ///
    /// [`Event::TimewaitExited`]: crate::proto::Event::TimewaitExited
    /// [`Event::Released`]: crate::proto::Event::Released
    pub fn destroy(&mut self, now: Nanos, conn: ConnId) -> Result<(), ProtoError> {
        let state = self.user_conn(conn)?.state;
        let id = conn.0;
        if let Some(c) = self.conns.get_mut(id) {
            c.destroyed = true;
        }
        let rej = |ep: &mut Self, reason, message| {
            ep.reject_and_timewait(now, id, reason, message, PrivateData::zeroed());
        };
        match state {
            State::Listen | State::SidrReqSent => self.free(id),
            State::SidrReqRcvd => {
                if let Some(c) = self.conns.get(id) {
                    let rep = SidrRep {
                        request_id: c.remote_comm_id,
                        status: SidrStatus::RejectedByServiceProvider,
                        service_id: c.service_id,
                        ..SidrRep::default()
                    };
                    let mad = CmMad::new(c.tid, rep);
                    self.send_for(id, mad);
                }
                self.free(id);
            }
            State::ReqSent if self.is_waiting(id) => {
                // Never on the wire: nobody knows the id, no duplicate can
                // name it, so no REJ and no TIMEWAIT.
                self.free(id);
            }
            State::ReqSent | State::MraReqRcvd => {
                rej(self, RejectReason::Timeout, MessageRejected::Other);
            }
            State::ReqRcvd | State::MraReqSent => {
                rej(self, RejectReason::ConsumerReject, MessageRejected::Req);
            }
            State::RepRcvd | State::MraRepSent => {
                rej(self, RejectReason::ConsumerReject, MessageRejected::Rep);
            }
            State::RepSent | State::MraRepRcvd => {
                rej(self, RejectReason::ConsumerReject, MessageRejected::Other);
            }
            s if s.is_established() => {
                let tid = self.alloc_tid();
                self.cancel_timer(id);
                if let Some(mad) = self.build_dreq(id, tid, PrivateData::zeroed()) {
                    if let Some(c) = self.conns.get_mut(id) {
                        c.dreq_tid = tid;
                    }
                    self.send_for(id, mad);
                }
                self.enter_timewait(now, id);
            }
            State::DreqSent => {
                // A DREQ still waiting for the window has told the peer
                // nothing: it goes out once now, as from ESTABLISHED.
                let waiting = self.is_waiting(id);
                let dreq = self
                    .conns
                    .get(id)
                    .and_then(|c| c.resend.as_deref().copied());
                self.cancel_timer(id);
                if let Some(mad) = dreq.filter(|_| waiting) {
                    self.send_for(id, mad);
                }
                self.enter_timewait(now, id);
            }
            State::DreqRcvd => {
                if let Some(mad) = self.build_drep(id, PrivateData::zeroed()) {
                    self.send_reply(id, mad);
                }
                self.enter_timewait(now, id);
            }
            // TIMEWAIT (and, unreachably, the states matched above).
            _ => {}
        }
        // A request that gave up its place lets the next one go.
        self.pace(now);
        Ok(())
    }
}
