//! Received MADs: what each of the eleven messages does in each state
//! (IBTA chapter 12's state tables; `docs/cm-protocol.md`, "Received
//! messages, by state"). Never panics: every message in every state is
//! handled, answered or ignored, and a MAD that names a connection but does
//! not come from its peer is handled as naming none.

use super::outgoing::{rej_without_cep, unsupported_req};
use super::window::Pacing;
use super::{trace, Conn, Endpoint};
use crate::proto::{
    answer_deadline_nanos, mra_wait_nanos, packet_life_time_from_ack_timeout, ConnId,
    DisconnectCause, Disposition, Event, Nanos, PeerAddr, RejectOrigin, State,
    SIDR_ANSWER_DEADLINE_NANOS,
};
use crate::wire::{
    ApStatus, Apr, CmMad, CmMessage, Drep, Dreq, Lap, MessageMraed, MessageRejected, Mra,
    PrivateData, Rej, RejectReason, Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus,
};

/// The smallest CM timeout code whose time (4.096 us x 2^t) is at least
/// `nanos` (31 at most).
fn covering_timeout(nanos: u64) -> u8 {
    (0..31u8)
        .find(|&t| crate::wire::cm_timeout_to_nanos(t) >= nanos)
        .unwrap_or(31)
}

impl Endpoint {
    /// Processes one received MAD. Never panics; every message in every
    /// state is either handled, answered or ignored.
    pub fn handle_mad(&mut self, now: Nanos, from: PeerAddr, mad: CmMad) -> Disposition {
        let tid = mad.transaction_id;
        trace::mad_received(from, &mad);
        let attr = mad.message_kind();
        let disposition = match mad.message {
            CmMessage::Req(m) => self.on_req(now, from, tid, m),
            CmMessage::Mra(m) => self.on_mra(now, from, m),
            CmMessage::Rej(m) => self.on_rej(now, from, m),
            CmMessage::Rep(m) => self.on_rep(now, from, tid, m),
            CmMessage::Rtu(m) => self.on_rtu(from, m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, tid, m),
            CmMessage::Drep(m) => self.on_drep(now, from, m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, from, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(from, m),
            CmMessage::Lap(m) => self.on_lap(from, tid, m),
            CmMessage::Apr(m) => self.on_apr(from, tid, m),
        };
        if let Disposition::Ignored(why) = disposition {
            trace::mad_ignored(from, attr, why);
        }
        // What the MAD ended (an answer, a REJ, a DREQ) makes room in the
        // window for requests waiting in line.
        self.pace(now);
        disposition
    }

    /// Decodes a received 256-byte MAD and processes it. A MAD that does
    /// not decode is dropped (`Ignored`); the decode error is returned for
    /// logging through `Err`.
    pub fn handle_datagram(
        &mut self,
        now: Nanos,
        from: PeerAddr,
        bytes: &[u8],
    ) -> Result<Disposition, crate::wire::WireError> {
        match crate::wire::decode(bytes) {
            Ok(mad) => Ok(self.handle_mad(now, from, mad)),
            Err(e @ crate::wire::WireError::BadClassVersion(_)) => {
                self.reject_class_version(from, bytes);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// A REQ of a CM class version we do not speak gets REJ "invalid class
    /// version", with the highest version we support in the ARI (IBTA
    /// 12.6.7.1), so the peer can retry at that version instead of timing
    /// out. Anything else of an unknown version is dropped.
    fn reject_class_version(&mut self, from: PeerAddr, bytes: &[u8]) {
        let field = |at: usize, n: usize| bytes.get(at..at + n);
        let is_cm = bytes.len() == crate::wire::MAD_LEN
            && bytes[0] == crate::wire::BASE_VERSION
            && bytes[1] == crate::wire::MGMT_CLASS_CM
            && field(16, 2) == Some(&crate::wire::attr::REQ.to_be_bytes()[..]);
        let (Some(tid), Some(comm)) = (field(8, 8), field(24, 4)) else {
            return;
        };
        if !is_cm {
            return;
        }
        let tid = u64::from_be_bytes(tid.try_into().unwrap_or([0; 8]));
        let remote_comm_id = u32::from_be_bytes(comm.try_into().unwrap_or([0; 4]));
        let mut ari = [0u8; crate::wire::INFO_LEN];
        ari[0] = crate::wire::CM_CLASS_VERSION;
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id,
            message_rejected: MessageRejected::Req,
            rejected_info_length: 1,
            reason: RejectReason::InvalidClassVersion,
            ari,
            ..Rej::default()
        };
        self.send(from, None, CmMad::new(tid, rej));
    }

    fn on_req(&mut self, now: Nanos, from: PeerAddr, tid: u64, req: Req) -> Disposition {
        let remote_key = (req.local_comm_id, req.local_ca_guid);
        if let Some(&id) = self.remote_ids.get(&remote_key) {
            if !self.came_from_peer(id, from) {
                // Another port claims a live connection's comm id and CA
                // GUID: it is not that connection's peer repeating its REQ,
                // and it cannot have a second connection under the same ids.
                self.not_from_peer += 1;
                return Disposition::Ignored("REQ names a connection of another port");
            }
            return self.on_dup_req(now, id, from, tid, &req);
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.stateless_rej(from, tid, &req, RejectReason::InvalidServiceId);
            return Disposition::Answered;
        };
        if listener.queued >= listener.backlog {
            // The consumer is this far behind: refuse at once, with the
            // reason IBTA gives for a passive side out of resources, rather
            // than hold more than it can answer in time (the requester
            // would retry, then time out).
            self.stateless_rej(from, tid, &req, RejectReason::NoResources);
            return Disposition::Answered;
        }
        if let Some(reason) = unsupported_req(&req) {
            self.stateless_rej(from, tid, &req, reason);
            return Disposition::Answered;
        }
        if let Some((reason, ari)) = self.wrong_primary_port(&req) {
            self.stateless_rej_ari(from, tid, &req, reason, &ari);
            return Disposition::Answered;
        }
        let qpn_key = (req.local_qpn, req.local_ca_guid);
        if let Some(&old) = self.remote_qpns.get(&qpn_key) {
            self.stateless_rej(from, tid, &req, RejectReason::StaleConnection);
            if !self.came_from_peer(old, from) {
                // A REQ from another port that names the remote QPN and CA
                // GUID of a live connection: both are on the wire for
                // anyone to copy, so it does not prove that connection
                // stale; the connection stays.
                self.not_from_peer += 1;
                return Disposition::Answered;
            }
            self.stale_old(now, old);
            return Disposition::Handled;
        }
        let made = self.conns.insert_with(|id| {
            let mut c = Conn::new(id, State::ReqRcvd, from);
            c.service_id = req.service_id;
            c.remote_comm_id = req.local_comm_id;
            c.remote_ca_guid = req.local_ca_guid;
            c.remote_qpn = req.local_qpn;
            c.tid = tid;
            c.packet_life_time =
                packet_life_time_from_ack_timeout(req.primary_path.local_ack_timeout);
            c.peer_response_timeout = req.local_cm_response_timeout;
            c.max_retries = req.max_cm_retries;
            c.listener = listener.id;
            c
        });
        let Some(id) = made else {
            self.stateless_rej(from, tid, &req, RejectReason::NoResources);
            return Disposition::Answered;
        };
        self.queue_on(req.service_id);
        self.register_remote(id, remote_key, qpn_key);
        let plt = packet_life_time_from_ack_timeout(req.primary_path.local_ack_timeout);
        let deadline =
            answer_deadline_nanos(plt, req.remote_cm_response_timeout, req.max_cm_retries);
        if let Some(c) = self.conns.get_mut(id) {
            c.answer_wait = deadline;
        }
        self.set_timer(id, now.saturating_add(deadline));
        self.emit(Event::ConnectRequest {
            conn: ConnId(id),
            listener: ConnId(listener.id),
            peer: from,
            req: Box::new(req),
        });
        Disposition::Handled
    }

    /// The REJ reason and ARI for a REQ whose primary path's remote end is
    /// not this port (see [`EndpointConfig::local_port`]). The GID is only
    /// compared when the path is routed (not subnet-local) and names one,
    /// since then it is what addresses the port.
    fn wrong_primary_port(&self, req: &Req) -> Option<(RejectReason, Vec<u8>)> {
        let port = self.config.local_port?;
        let path = &req.primary_path;
        if !port.owns_lid(path.remote_lid) {
            return Some((
                RejectReason::InvalidPrimaryLid,
                port.lid.to_be_bytes().to_vec(),
            ));
        }
        if !path.subnet_local && path.remote_gid != [0; 16] && path.remote_gid != port.gid {
            return Some((RejectReason::InvalidPrimaryGid, port.gid.to_vec()));
        }
        None
    }

    /// One more request counts in the backlog of the listener for
    /// `service_id` (the one that just took it).
    fn queue_on(&mut self, service_id: u64) {
        if let Some(l) = self.listeners.get_mut(&service_id) {
            l.queued += 1;
        }
    }

    /// A REQ came again while its request waits for the user: the
    /// requester's response wait ran out and it will keep resending every
    /// wait until its retries are spent (a retry storm when thousands of
    /// requests wait behind a slow consumer). Answer with an MRA whose
    /// service timeout covers what is left of this request's answer
    /// deadline, so the requester waits quietly until then; duplicates that
    /// still come get the same MRA again (MRA_REQ_SENT). The deadline does
    /// not move: the user did not ask for more time.
    fn hold_requester(&mut self, now: Nanos, id: u32) -> Disposition {
        let Some(c) = self.conns.get(id) else {
            return Disposition::Ignored("duplicate REQ for a vanished CEP");
        };
        let left = c.timer.map_or(0, |t| t.0.saturating_sub(now.0));
        let mra = Mra {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            message_mraed: MessageMraed::Req,
            service_timeout: covering_timeout(left),
            private_data: PrivateData::zeroed(),
        };
        let mad = CmMad::new(c.tid, mra);
        self.set_state(id, State::MraReqSent);
        self.send_reply(id, mad);
        Disposition::Answered
    }

    fn on_dup_req(
        &mut self,
        now: Nanos,
        id: u32,
        from: PeerAddr,
        tid: u64,
        req: &Req,
    ) -> Disposition {
        let Some(state) = self.state(ConnId(id)) else {
            return Disposition::Ignored("duplicate REQ for a vanished CEP");
        };
        match state {
            State::ReqRcvd => self.hold_requester(now, id),
            State::MraReqSent => self.resend_reply(id, "MRA"),
            State::RepSent | State::MraRepRcvd => self.resend_reply(id, "REP"),
            State::Timewait => {
                if self.resend_reply(id, "REJ") == Disposition::Answered {
                    Disposition::Answered
                } else {
                    self.stateless_rej(from, tid, req, RejectReason::StaleConnection);
                    Disposition::Answered
                }
            }
            _ => Disposition::Ignored("duplicate REQ"),
        }
    }

    fn on_rep(&mut self, now: Nanos, from: PeerAddr, tid: u64, rep: Rep) -> Disposition {
        let Some(c) = self.lookup(from, rep.remote_comm_id, rep.local_comm_id) else {
            // The passive side would resend this REP until it times out;
            // tell it now that nothing here waits for it (IBTA reason 6, or
            // 7 when the id is ours but bound to another remote instance;
            // never 7 to a sender that is not the id's peer, which must not
            // learn that the id is live).
            let reason = if self.came_from_peer(rep.remote_comm_id, from) {
                RejectReason::InvalidCommInstance
            } else {
                RejectReason::InvalidCommId
            };
            let rej = rej_without_cep(rep.local_comm_id, MessageRejected::Rep, reason, &[]);
            self.send(from, None, CmMad::new(tid, rej));
            return Disposition::Answered;
        };
        let id = c.id;
        if c.pacing == Pacing::Waiting {
            return Disposition::Ignored("REP for a REQ not sent yet");
        }
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::RepRcvd => return Disposition::Ignored("duplicate REP"),
            State::MraRepSent => return self.resend_reply(id, "MRA"),
            s if s.is_established() => return self.resend_reply(id, "RTU"),
            State::Timewait => return self.resend_reply(id, "REJ"),
            _ => return Disposition::Ignored("REP in a state that expects none"),
        }
        let remote_key = (rep.local_comm_id, rep.local_ca_guid);
        let qpn_key = (rep.local_qpn, rep.local_ca_guid);
        if let Some(c) = self.conns.get_mut(id) {
            c.remote_comm_id = rep.local_comm_id;
            c.remote_ca_guid = rep.local_ca_guid;
            c.remote_qpn = rep.local_qpn;
            c.target_ack_delay = Some(rep.target_ack_delay);
        }
        let dup_remote = self.remote_ids.get(&remote_key).copied();
        let stale = self.remote_qpns.get(&qpn_key).copied();
        if dup_remote.is_some() || stale.is_some() {
            let rej = self.reject_and_timewait(
                now,
                id,
                RejectReason::StaleConnection,
                MessageRejected::Rep,
                PrivateData::zeroed(),
            );
            if let Some(rej) = rej {
                self.emit(Event::Rejected {
                    conn: ConnId(id),
                    reason: rej.reason,
                    message: rej.message_rejected,
                    origin: RejectOrigin::Local,
                    rej: Box::new(rej),
                });
            }
            if let Some(old) = stale {
                // Only the old connection's own peer can make it stale
                // (see `on_req`).
                if self.came_from_peer(old, from) {
                    self.stale_old(now, old);
                } else {
                    self.not_from_peer += 1;
                }
            }
            return Disposition::Handled;
        }
        self.register_remote(id, remote_key, qpn_key);
        self.cancel_timer(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.resend = None;
            c.enter(State::RepRcvd);
        }
        self.emit(Event::ReplyReceived {
            conn: ConnId(id),
            rep: Box::new(rep),
        });
        Disposition::Handled
    }

    fn on_rtu(&mut self, from: PeerAddr, rtu: Rtu) -> Disposition {
        let Some(c) = self.lookup(from, rtu.remote_comm_id, rtu.local_comm_id) else {
            return Disposition::Ignored("RTU for an unknown comm id");
        };
        let id = c.id;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return Disposition::Ignored("RTU in a state that expects none");
        }
        self.become_established(id);
        Disposition::Handled
    }

    fn on_mra(&mut self, now: Nanos, from: PeerAddr, mra: Mra) -> Disposition {
        let Some(c) = self.lookup(from, mra.remote_comm_id, mra.local_comm_id) else {
            return Disposition::Ignored("MRA for an unknown comm id");
        };
        let id = c.id;
        if c.pacing == Pacing::Waiting {
            return Disposition::Ignored("MRA for a request not sent yet");
        }
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent | State::MraReqRcvd, MessageMraed::Req) => State::MraReqRcvd,
            (State::RepSent | State::MraRepRcvd, MessageMraed::Rep) => State::MraRepRcvd,
            (State::LapSent | State::MraLapRcvd, MessageMraed::Lap) => State::MraLapRcvd,
            _ => return Disposition::Ignored("MRA does not match the state"),
        };
        let first = c.state != next;
        let wait = mra_wait_nanos(c.packet_life_time, mra.service_timeout);
        self.set_state(id, next);
        self.set_timer(id, now.saturating_add(wait));
        if first {
            self.emit(Event::MraReceived {
                conn: ConnId(id),
                message: mra.message_mraed,
                service_timeout: mra.service_timeout,
            });
        }
        Disposition::Handled
    }

    /// Finds the CEP a REJ is meant for. A REJ answering a REQ may carry
    /// RemoteCommID 0 only when the sender is the active side timing out
    /// before it learnt our id; then the (sender id, sender GUID from the
    /// Timeout ARI) pair, or failing that the sender id, finds it. Every
    /// way, only the connection's peer can name it (`source_may_name`).
    fn find_rejected(&mut self, from: PeerAddr, rej: &Rej) -> Option<u32> {
        if rej.remote_comm_id != 0 {
            if !self.source_may_name(rej.remote_comm_id, from) {
                return None;
            }
            let c = self.conns.get(rej.remote_comm_id)?;
            // A stateless REJ (LocalCommID 0: the sender has no CEP for
            // this connection) names only our id. The one such REJ a CEP
            // that knows its peer's id can get answers our REP (REJ
            // "invalid comm ID": the active side gave up or never asked);
            // taking it in any other state would let a REJ that guessed
            // only our id (from the peer's address: a spoofer) end an
            // established connection, where a guess must hit both ids.
            let answers_our_rep =
                rej.local_comm_id == 0 && matches!(c.state, State::RepSent | State::MraRepRcvd);
            let remote_matches =
                c.remote_comm_id == 0 || c.remote_comm_id == rej.local_comm_id || answers_our_rep;
            return remote_matches.then_some(c.id);
        }
        if rej.local_comm_id == 0 {
            return None;
        }
        let mut found = None;
        if rej.reason == RejectReason::Timeout {
            if let Ok(guid) = <[u8; 8]>::try_from(rej.ari_bytes().get(..8).unwrap_or(&[])) {
                let key = (rej.local_comm_id, u64::from_be_bytes(guid));
                found = self
                    .remote_ids
                    .get(&key)
                    .copied()
                    .filter(|&id| self.came_from_peer(id, from));
            }
        }
        if found.is_none() {
            let mut named = self
                .remote_ids
                .range((rej.local_comm_id, 0)..=(rej.local_comm_id, u64::MAX))
                .map(|(_, &id)| id)
                .peekable();
            let any = named.peek().is_some();
            found = named.find(|&id| self.came_from_peer(id, from));
            if found.is_none() && any {
                self.not_from_peer += 1;
            }
        }
        // Only an active side that never got our REP can send it: once a
        // REP told it our id it names it, so a REJ that guessed only its
        // sender's id (from a spoofer) cannot end a connection further on.
        found.filter(|&id| {
            self.conns.get(id).is_some_and(|c| {
                matches!(
                    c.state,
                    State::ReqRcvd | State::MraReqSent | State::RepSent | State::MraRepRcvd
                )
            })
        })
    }

    fn on_rej(&mut self, now: Nanos, from: PeerAddr, rej: Rej) -> Disposition {
        let Some(id) = self.find_rejected(from, &rej) else {
            return Disposition::Ignored("REJ for an unknown comm id");
        };
        let Some(state) = self.state(ConnId(id)) else {
            return Disposition::Ignored("REJ for an unknown comm id");
        };
        // A REJ cannot answer a REQ or LAP that was never sent (nobody
        // knows a waiting REQ's id); a REJ of a connection whose DREQ
        // waits is the peer's own and ends it as in DREQ_SENT.
        let answers_waiting = state == State::ReqSent
            || (state == State::LapSent && rej.message_rejected == MessageRejected::Other);
        if answers_waiting && self.is_waiting(id) {
            return Disposition::Ignored("REJ for a request not sent yet");
        }
        let event = |conn| Event::Rejected {
            conn,
            reason: rej.reason,
            message: rej.message_rejected,
            origin: RejectOrigin::Remote,
            rej: Box::new(rej),
        };
        match state {
            State::Listen | State::SidrReqSent | State::SidrReqRcvd | State::Timewait => {
                Disposition::Ignored("REJ in a state that takes none")
            }
            State::LapSent | State::MraLapRcvd
                if rej.message_rejected == MessageRejected::Other =>
            {
                // The peer refused the LAP; the connection itself goes on.
                self.cancel_timer(id);
                if let Some(c) = self.conns.get_mut(id) {
                    c.resend = None;
                    c.enter(State::Established);
                }
                self.emit(event(ConnId(id)));
                Disposition::Handled
            }
            _ => {
                self.cancel_timer(id);
                self.emit(event(ConnId(id)));
                self.enter_timewait(now, id);
                Disposition::Handled
            }
        }
    }

    fn on_dreq(&mut self, now: Nanos, from: PeerAddr, tid: u64, dreq: Dreq) -> Disposition {
        let found = if self.source_may_name(dreq.remote_comm_id, from) {
            self.conns
                .get(dreq.remote_comm_id)
                .filter(|c| c.remote_comm_id == dreq.local_comm_id && c.state != State::Listen)
                .map(|c| (c.id, c.state, c.local_qpn))
        } else {
            None
        };
        let Some((id, state, local_qpn)) = found else {
            // IBTA: a DREQ for an unknown comm id is answered with a DREP so
            // the sender can leave DREQ_SENT.
            let drep = Drep {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: PrivateData::zeroed(),
            };
            self.send(from, None, CmMad::new(tid, drep));
            return Disposition::Answered;
        };
        if dreq.remote_qpn_eecn != local_qpn {
            return Disposition::Ignored("DREQ names another QPN");
        }
        match state {
            s if s.is_established() || matches!(s, State::RepSent | State::MraRepRcvd) => {
                self.cancel_timer(id);
                if let Some(c) = self.conns.get_mut(id) {
                    c.dreq_tid = tid;
                    c.resend = None;
                    c.enter(State::DreqRcvd);
                }
                self.emit(Event::DisconnectRequest {
                    conn: ConnId(id),
                    dreq: Box::new(dreq),
                });
                Disposition::Handled
            }
            State::DreqSent => {
                self.cancel_timer(id);
                if let Some(c) = self.conns.get_mut(id) {
                    c.dreq_tid = tid;
                }
                if let Some(mad) = self.build_drep(id, PrivateData::zeroed()) {
                    self.send_reply(id, mad);
                }
                self.emit(Event::Disconnected {
                    conn: ConnId(id),
                    cause: DisconnectCause::SimultaneousDreq,
                    drep: None,
                });
                self.enter_timewait(now, id);
                Disposition::Handled
            }
            State::Timewait => {
                if let Some(c) = self.conns.get_mut(id) {
                    c.dreq_tid = tid;
                }
                if let Some(mad) = self.build_drep(id, PrivateData::zeroed()) {
                    self.send_for(id, mad);
                }
                Disposition::Answered
            }
            State::DreqRcvd => Disposition::Ignored("duplicate DREQ"),
            _ => Disposition::Ignored("DREQ before the connection was established"),
        }
    }

    fn on_drep(&mut self, now: Nanos, from: PeerAddr, drep: Drep) -> Disposition {
        let Some(c) = self.lookup(from, drep.remote_comm_id, drep.local_comm_id) else {
            return Disposition::Ignored("DREP for an unknown comm id");
        };
        let id = c.id;
        if c.state != State::DreqSent {
            return Disposition::Ignored("DREP in a state that expects none");
        }
        if c.pacing == Pacing::Waiting {
            return Disposition::Ignored("DREP for a DREQ not sent yet");
        }
        self.cancel_timer(id);
        self.emit(Event::Disconnected {
            conn: ConnId(id),
            cause: DisconnectCause::DrepReceived,
            drep: Some(Box::new(drep)),
        });
        self.enter_timewait(now, id);
        Disposition::Handled
    }

    fn on_lap(&mut self, from: PeerAddr, tid: u64, lap: Lap) -> Disposition {
        let alternate_paths = self.alternate_paths();
        let Some(c) = self.lookup(from, lap.remote_comm_id, lap.local_comm_id) else {
            return Disposition::Ignored("LAP for an unknown comm id");
        };
        let id = c.id;
        if lap.remote_qpn_eecn != c.local_qpn {
            return Disposition::Ignored("LAP names another QPN");
        }
        match c.state {
            State::Established if tid == c.lap_tid && c.lap_tid != 0 => {
                self.resend_reply(id, "APR")
            }
            State::Established if !alternate_paths => {
                // RoCE: no alternate path can be loaded. The APR says so
                // (status 2, "unsupported") and the connection stays as it
                // is; a duplicate LAP gets the same APR again (above).
                let apr = Apr {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    additional_info_length: 0,
                    ap_status: ApStatus::Unsupported,
                    additional_info: [0; 72],
                    private_data: PrivateData::zeroed(),
                };
                if let Some(c) = self.conns.get_mut(id) {
                    c.lap_tid = tid;
                }
                self.send_reply(id, CmMad::new(tid, apr));
                Disposition::Handled
            }
            State::Established => {
                if let Some(c) = self.conns.get_mut(id) {
                    c.lap_tid = tid;
                    c.enter(State::LapRcvd);
                }
                self.emit(Event::LapReceived {
                    conn: ConnId(id),
                    lap: Box::new(lap),
                });
                Disposition::Handled
            }
            State::MraLapSent => self.resend_reply(id, "MRA"),
            State::LapRcvd => Disposition::Ignored("duplicate LAP"),
            _ => Disposition::Ignored("LAP in a state that takes none"),
        }
    }

    fn on_apr(&mut self, from: PeerAddr, tid: u64, apr: Apr) -> Disposition {
        let Some(c) = self.lookup(from, apr.remote_comm_id, apr.local_comm_id) else {
            return Disposition::Ignored("APR for an unknown comm id");
        };
        let id = c.id;
        if !matches!(c.state, State::LapSent | State::MraLapRcvd) || tid != c.lap_tid {
            return Disposition::Ignored("APR matches no outstanding LAP");
        }
        if c.pacing == Pacing::Waiting {
            return Disposition::Ignored("APR for a LAP not sent yet");
        }
        self.cancel_timer(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.resend = None;
            c.enter(State::Established);
        }
        self.emit(Event::AprReceived {
            conn: ConnId(id),
            status: apr.ap_status,
            apr: Box::new(apr),
        });
        Disposition::Handled
    }

    fn on_sidr_req(&mut self, now: Nanos, from: PeerAddr, tid: u64, req: SidrReq) -> Disposition {
        let key = (req.request_id, from);
        if self.sidr_remote.contains_key(&key) {
            return Disposition::Ignored("duplicate SIDR_REQ");
        }
        let stateless = |status| SidrRep {
            request_id: req.request_id,
            status,
            service_id: req.service_id,
            ..SidrRep::default()
        };
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            let rep = stateless(SidrStatus::ServiceIdNotSupported);
            self.send(from, None, CmMad::new(tid, rep));
            return Disposition::Answered;
        };
        let made = if listener.queued >= listener.backlog {
            // Over the backlog: answered as when no id is free.
            None
        } else {
            self.conns.insert_with(|id| {
                let mut c = Conn::new(id, State::SidrReqRcvd, from);
                c.service_id = req.service_id;
                c.remote_comm_id = req.request_id;
                c.tid = tid;
                c.sidr_key = Some(key);
                c.answer_wait = SIDR_ANSWER_DEADLINE_NANOS;
                c.listener = listener.id;
                c
            })
        };
        let Some(id) = made else {
            let rep = stateless(SidrStatus::NoQp);
            self.send(from, None, CmMad::new(tid, rep));
            return Disposition::Answered;
        };
        self.queue_on(req.service_id);
        self.sidr_remote.insert(key, id);
        self.set_timer(id, now.saturating_add(SIDR_ANSWER_DEADLINE_NANOS));
        self.emit(Event::SidrRequest {
            conn: ConnId(id),
            listener: ConnId(listener.id),
            peer: from,
            req: Box::new(req),
        });
        Disposition::Handled
    }

    fn on_sidr_rep(&mut self, from: PeerAddr, rep: SidrRep) -> Disposition {
        if !self.source_may_name(rep.request_id, from) {
            return Disposition::Ignored("SIDR_REP not from where the SIDR_REQ went");
        }
        match self.conns.get(rep.request_id) {
            Some(c) if c.state == State::SidrReqSent && c.pacing != Pacing::Waiting => {}
            _ => return Disposition::Ignored("SIDR_REP matches no outstanding SIDR_REQ"),
        }
        self.emit(Event::SidrReply {
            conn: ConnId(rep.request_id),
            rep: Box::new(rep),
        });
        self.free(rep.request_id);
        Disposition::Handled
    }
}
