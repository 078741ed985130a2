//! The [`Endpoint`]: tables, per-CEP state machines, timers.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::ids::IdSlab;
use super::{
    answer_deadline_nanos, mra_wait_nanos, packet_life_time_from_ack_timeout, response_wait_nanos,
    timewait_nanos, ConnId, ConnectParams, DisconnectCause, Disposition, EndpointConfig, Event,
    LapParams, Nanos, PeerAddr, ProtoError, RejectOrigin, SidrParams, SidrReplyParams, State,
    TimedOut, Transmit, SIDR_ANSWER_DEADLINE_NANOS,
};
use crate::wire::{
    ApStatus, Apr, CmMad, CmMessage, Drep, Dreq, Lap, MessageMraed, MessageRejected, Mra,
    PrivateData, Rej, RejectReason, Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus, INFO_LEN,
};

/// Key of the remote-id and remote-QPN tables: (remote value, remote CA GUID).
type RemoteKey = (u32, u64);

/// One CEP.
#[derive(Clone, Debug)]
struct Conn {
    id: u32,
    state: State,
    /// The user destroyed it; only TIMEWAIT is left (events suppressed).
    destroyed: bool,
    peer: PeerAddr,
    service_id: u64,
    /// Comm id the peer uses (0 until known).
    remote_comm_id: u32,
    remote_ca_guid: u64,
    remote_qpn: u32,
    local_qpn: u32,
    /// Entry this CEP owns in the remote-id table.
    remote_key: Option<RemoteKey>,
    /// Entry this CEP owns in the remote-QPN table.
    qpn_key: Option<RemoteKey>,
    /// Entry this CEP owns in the SIDR duplicate table.
    sidr_key: Option<(u32, PeerAddr)>,
    /// Transaction id of the REQ (and so of REP, MRA, REJ, RTU).
    tid: u64,
    /// Transaction id of the current DREQ (sent or received).
    dreq_tid: u64,
    /// Transaction id of the current LAP (sent or received).
    lap_tid: u64,
    packet_life_time: u8,
    /// How long the peer may take to answer (CM timeout encoding).
    peer_response_timeout: u8,
    /// TargetACKDelay from the REP, once known.
    target_ack_delay: Option<u8>,
    max_retries: u8,
    retries_left: u8,
    /// Deadline of the one timer this CEP may have.
    timer: Option<Nanos>,
    /// The request being retried by the timer.
    resend: Option<CmMad>,
    /// The last answer sent, repeated when a duplicate request arrives.
    last_reply: Option<CmMad>,
    /// Passive side: how long the request may wait for the user's answer
    /// (see `answer_deadline_nanos`).
    answer_wait: u64,
}

impl Conn {
    fn new(id: u32, state: State, peer: PeerAddr) -> Self {
        Self {
            id,
            state,
            destroyed: false,
            peer,
            service_id: 0,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            remote_qpn: 0,
            local_qpn: 0,
            remote_key: None,
            qpn_key: None,
            sidr_key: None,
            tid: 0,
            dreq_tid: 0,
            lap_tid: 0,
            packet_life_time: 0,
            peer_response_timeout: 0,
            target_ack_delay: None,
            max_retries: 0,
            retries_left: 0,
            timer: None,
            resend: None,
            last_reply: None,
            answer_wait: 0,
        }
    }

    fn response_wait(&self) -> u64 {
        response_wait_nanos(self.packet_life_time, self.peer_response_timeout)
    }
}

/// A CM agent: the tables and state machines of every CEP on one port.
///
/// See the [module documentation](super) and `docs/cm-protocol.md`.
#[derive(Debug)]
pub struct Endpoint {
    config: EndpointConfig,
    conns: IdSlab<Conn>,
    /// Service id -> listener.
    listeners: BTreeMap<u64, u32>,
    /// (remote comm id, remote CA GUID) -> local id. Entries live from the
    /// REQ (passive) or REP (active) until the id is freed.
    remote_ids: BTreeMap<RemoteKey, u32>,
    /// (remote QPN, remote CA GUID) -> local id. Entries live from the REQ
    /// (passive) or REP (active) until the CEP enters TIMEWAIT.
    remote_qpns: BTreeMap<RemoteKey, u32>,
    /// (SIDR RequestID, requester) -> local SIDR CEP, while in SIDR_REQ_RCVD.
    sidr_remote: BTreeMap<(u32, PeerAddr), u32>,
    /// CEPs in TIMEWAIT.
    timewait: BTreeSet<u32>,
    /// (deadline, id) for every armed timer.
    timers: BTreeSet<(Nanos, u32)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    next_tid: u64,
    /// MADs that named a connection but came from another address than its
    /// peer's (see `source_may_name`).
    not_from_peer: u64,
}

fn wrong_state(conn: &Conn, call: &'static str) -> ProtoError {
    ProtoError::WrongState {
        conn: ConnId(conn.id),
        state: conn.state,
        call,
    }
}

fn info_area(info: &[u8]) -> Result<([u8; INFO_LEN], u8), ProtoError> {
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

/// Checks that a message can be encoded, so that everything queued for
/// transmission is valid.
fn check_encodes(message: impl Into<CmMessage>) -> Result<(), ProtoError> {
    crate::wire::validate(&CmMad::new(0, message))?;
    Ok(())
}

impl Endpoint {
    /// An endpoint with empty tables, configured by `config`.
    pub fn new(config: EndpointConfig) -> Self {
        Self {
            conns: IdSlab::new(config.max_ceps, config.id_key),
            listeners: BTreeMap::new(),
            remote_ids: BTreeMap::new(),
            remote_qpns: BTreeMap::new(),
            sidr_remote: BTreeMap::new(),
            timewait: BTreeSet::new(),
            timers: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            next_tid: config.first_tid,
            not_from_peer: 0,
            config,
        }
    }

    /// The settings this endpoint was created with.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    // -----------------------------------------------------------------------
    // Outputs
    // -----------------------------------------------------------------------

    /// The next MAD to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event for the user, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest armed deadline: call [`Endpoint::handle_timeout`] then.
    pub fn next_timeout(&self) -> Option<Nanos> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// The state of a CEP, `None` if the id is not allocated.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(conn.0).map(|c| c.state)
    }

    /// Number of allocated CEPs that are not listeners.
    pub fn live_connections(&self) -> usize {
        self.conns
            .iter()
            .filter(|(_, c)| c.state != State::Listen)
            .count()
    }

    /// Number of allocated ids (listeners included).
    pub fn allocated_ids(&self) -> usize {
        self.conns.len()
    }

    /// MADs that named one of this endpoint's connections (by its comm id,
    /// its remote comm id and CA GUID, or its remote QPN and CA GUID) but
    /// came from an address other than the connection's peer. Each was
    /// handled as if it named no connection: no state changed, no event,
    /// and no answer but the stateless one a MAD naming nothing gets.
    pub fn not_from_peer(&self) -> u64 {
        self.not_from_peer
    }

    /// Every allocated CEP with its state, in id order of the slots.
    pub fn ceps(&self) -> Vec<(ConnId, State)> {
        self.conns
            .iter()
            .map(|(id, c)| (ConnId(id), c.state))
            .collect()
    }

    // -----------------------------------------------------------------------
    // Internal helpers
    // -----------------------------------------------------------------------

    fn alloc_tid(&mut self) -> u64 {
        let t = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        t
    }

    fn send(&mut self, to: PeerAddr, conn: Option<u32>, mad: CmMad) {
        self.transmits.push_back(Transmit {
            to,
            conn: conn.map(ConnId),
            mad,
        });
    }

    /// Sends a message on behalf of a CEP to its peer.
    fn send_for(&mut self, id: u32, mad: CmMad) {
        if let Some(peer) = self.conns.get(id).map(|c| c.peer) {
            self.send(peer, Some(id), mad);
        }
    }

    /// Queues an event unless the CEP was destroyed by the user.
    fn emit(&mut self, event: Event) {
        let always = matches!(event, Event::TimewaitExited { .. } | Event::Released { .. });
        let destroyed = self.conns.get(event.conn().0).is_some_and(|c| c.destroyed);
        if always || !destroyed {
            self.events.push_back(event);
        }
    }

    fn set_timer(&mut self, id: u32, at: Nanos) {
        if let Some(c) = self.conns.get_mut(id) {
            if let Some(old) = c.timer.replace(at) {
                self.timers.remove(&(old, id));
            }
            self.timers.insert((at, id));
        }
    }

    fn cancel_timer(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(id) {
            if let Some(old) = c.timer.take() {
                self.timers.remove(&(old, id));
            }
        }
    }

    fn set_state(&mut self, id: u32, state: State) {
        if let Some(c) = self.conns.get_mut(id) {
            c.state = state;
        }
    }

    /// Sends `mad` as the request this CEP retries, arming the retry timer
    /// with a fresh retry budget.
    fn send_request(&mut self, now: Nanos, id: u32, state: State, mad: CmMad) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.state = state;
        c.resend = Some(mad);
        c.retries_left = c.max_retries;
        let at = now.saturating_add(c.response_wait());
        self.set_timer(id, at);
        self.send_for(id, mad);
    }

    /// Sends `mad` as an answer that duplicates of the request repeat.
    fn send_reply(&mut self, id: u32, mad: CmMad) {
        if let Some(c) = self.conns.get_mut(id) {
            c.last_reply = Some(mad);
        }
        self.send_for(id, mad);
    }

    /// Resends the last answer if it is of the given kind.
    fn resend_reply(&mut self, id: u32, kind: &str) -> Disposition {
        match self.conns.get(id).and_then(|c| c.last_reply) {
            Some(mad) if mad.message_kind() == kind => {
                self.send_for(id, mad);
                Disposition::Answered
            }
            _ => Disposition::Ignored("duplicate request, nothing to repeat"),
        }
    }

    fn register_remote(&mut self, id: u32, remote_id: RemoteKey, qpn: RemoteKey) {
        self.remote_ids.insert(remote_id, id);
        self.remote_qpns.insert(qpn, id);
        if let Some(c) = self.conns.get_mut(id) {
            c.remote_key = Some(remote_id);
            c.qpn_key = Some(qpn);
        }
    }

    /// Enters TIMEWAIT: the QP is no longer connected (its remote-QPN entry
    /// goes), the id stays reserved until the timer fires.
    fn enter_timewait(&mut self, now: Nanos, id: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.state = State::Timewait;
        c.resend = None;
        let qpn_key = c.qpn_key.take();
        let wait = timewait_nanos(c.packet_life_time, c.target_ack_delay);
        if let Some(k) = qpn_key {
            self.remote_qpns.remove(&k);
        }
        self.timewait.insert(id);
        self.set_timer(id, now.saturating_add(wait));
    }

    /// Frees the id: removes the CEP from every table.
    fn free(&mut self, id: u32) {
        self.cancel_timer(id);
        let Some(c) = self.conns.remove(id) else {
            return;
        };
        if let Some(k) = c.remote_key {
            self.remote_ids.remove(&k);
        }
        if let Some(k) = c.qpn_key {
            self.remote_qpns.remove(&k);
        }
        if let Some(k) = c.sidr_key {
            self.sidr_remote.remove(&k);
        }
        if c.state == State::Listen {
            self.listeners.remove(&c.service_id);
        }
        if self.timewait.remove(&id) {
            self.events
                .push_back(Event::TimewaitExited { conn: ConnId(id) });
        }
        self.events.push_back(Event::Released { conn: ConnId(id) });
    }

    fn build_rej(
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
    fn reject_and_timewait(
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
    fn stateless_rej(&mut self, to: PeerAddr, tid: u64, req: &Req, reason: RejectReason) {
        self.stateless_rej_ari(to, tid, req, reason, &[]);
    }

    /// A REJ for a REQ that got no CEP, with `ari` as its additional
    /// rejection information.
    fn stateless_rej_ari(
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

    fn build_dreq(&self, id: u32, tid: u64, private_data: PrivateData<220>) -> Option<CmMad> {
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

    fn build_drep(&self, id: u32, private_data: PrivateData<224>) -> Option<CmMad> {
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
    fn start_disconnect(&mut self, now: Nanos, id: u32, private_data: PrivateData<220>) {
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
    fn stale_old(&mut self, now: Nanos, old: u32) {
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

    /// Whether this port is routed by GID only (RoCE: LID 0), where LIDs
    /// mean nothing and no alternate path can be loaded.
    fn gid_routed(&self) -> bool {
        matches!(self.config.local_port, Some(p) if p.lid == 0)
    }

    /// Whether a MAD from `from` may come from `peer`, the port a
    /// connection talks to: on a GID-routed port the source GID (on RoCEv2
    /// the packet's IP source) must be the peer's; elsewhere the source LID
    /// must be, and the GIDs too when both the MAD (its GRH) and the peer
    /// carry one. The port, not the QP or UDP port: the UDP source port is
    /// entropy.
    fn is_peer(&self, peer: &PeerAddr, from: &PeerAddr) -> bool {
        const NO_GID: [u8; 16] = [0; 16];
        if self.gid_routed() {
            return from.gid == peer.gid;
        }
        from.lid == peer.lid && (from.gid == NO_GID || peer.gid == NO_GID || from.gid == peer.gid)
    }

    /// Whether `from` may speak for the CEP our comm id `local` names:
    /// anyone for an id that names nothing or a listener (the MAD finds no
    /// connection there anyway), only the peer for any other CEP. A MAD
    /// from anyone else is counted, and the caller handles it as naming no
    /// CEP, so its sender learns nothing, not even whether the id is live.
    /// (Linux's CM matches by comm id alone.)
    fn source_may_name(&mut self, local: u32, from: PeerAddr) -> bool {
        let Some(c) = self.conns.get(local) else {
            return true;
        };
        if c.state == State::Listen || self.is_peer(&c.peer, &from) {
            return true;
        }
        self.not_from_peer += 1;
        false
    }

    /// Whether the CEP `id` exists and a MAD from `from` came from its peer.
    fn came_from_peer(&self, id: u32, from: PeerAddr) -> bool {
        self.conns
            .get(id)
            .is_some_and(|c| self.is_peer(&c.peer, &from))
    }

    /// Looks up a CEP by the local id a message names, if the sender may
    /// name it (`source_may_name`), and checks the sender's comm id against
    /// what we know (an unknown remote id always matches).
    fn lookup(&mut self, from: PeerAddr, local: u32, remote: u32) -> Option<&Conn> {
        if !self.source_may_name(local, from) {
            return None;
        }
        let c = self.conns.get(local)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == remote).then_some(c)
    }

    // -----------------------------------------------------------------------
    // Received MADs
    // -----------------------------------------------------------------------

    /// Processes one received MAD. Never panics; every message in every
    /// state is either handled, answered or ignored.
    pub fn handle_mad(&mut self, now: Nanos, from: PeerAddr, mad: CmMad) -> Disposition {
        let tid = mad.transaction_id;
        match mad.message {
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
        }
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
            return self.on_dup_req(id, from, tid, &req);
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.stateless_rej(from, tid, &req, RejectReason::InvalidServiceId);
            return Disposition::Answered;
        };
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
            c
        });
        let Some(id) = made else {
            self.stateless_rej(from, tid, &req, RejectReason::NoResources);
            return Disposition::Answered;
        };
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
            listener: ConnId(listener),
            peer: from,
            req: Box::new(req),
        });
        Disposition::Handled
    }

    fn on_dup_req(&mut self, id: u32, from: PeerAddr, tid: u64, req: &Req) -> Disposition {
        let Some(state) = self.state(ConnId(id)) else {
            return Disposition::Ignored("duplicate REQ for a vanished CEP");
        };
        match state {
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
            c.state = State::RepRcvd;
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

    fn become_established(&mut self, id: u32) {
        self.cancel_timer(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.resend = None;
            c.state = State::Established;
        }
        self.emit(Event::Established { conn: ConnId(id) });
    }

    fn on_mra(&mut self, now: Nanos, from: PeerAddr, mra: Mra) -> Disposition {
        let Some(c) = self.lookup(from, mra.remote_comm_id, mra.local_comm_id) else {
            return Disposition::Ignored("MRA for an unknown comm id");
        };
        let id = c.id;
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
                    c.state = State::Established;
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
                    c.state = State::DreqRcvd;
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
        self.cancel_timer(id);
        self.emit(Event::Disconnected {
            conn: ConnId(id),
            cause: DisconnectCause::DrepReceived,
            drep: Some(Box::new(drep)),
        });
        self.enter_timewait(now, id);
        Disposition::Handled
    }

    /// The configuration, for tests that change the port afterwards.
    #[cfg(test)]
    pub(super) fn config_mut(&mut self) -> &mut EndpointConfig {
        &mut self.config
    }

    /// Whether this endpoint's port can load alternate paths (LAP/APR):
    /// not a RoCE port (LID 0, routed by GID only).
    fn alternate_paths(&self) -> bool {
        !self.gid_routed()
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
                    c.state = State::LapRcvd;
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
        self.cancel_timer(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.resend = None;
            c.state = State::Established;
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
        let made = self.conns.insert_with(|id| {
            let mut c = Conn::new(id, State::SidrReqRcvd, from);
            c.service_id = req.service_id;
            c.remote_comm_id = req.request_id;
            c.tid = tid;
            c.sidr_key = Some(key);
            c.answer_wait = SIDR_ANSWER_DEADLINE_NANOS;
            c
        });
        let Some(id) = made else {
            let rep = stateless(SidrStatus::NoQp);
            self.send(from, None, CmMad::new(tid, rep));
            return Disposition::Answered;
        };
        self.sidr_remote.insert(key, id);
        self.set_timer(id, now.saturating_add(SIDR_ANSWER_DEADLINE_NANOS));
        self.emit(Event::SidrRequest {
            conn: ConnId(id),
            listener: ConnId(listener),
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
            Some(c) if c.state == State::SidrReqSent => {}
            _ => return Disposition::Ignored("SIDR_REP matches no outstanding SIDR_REQ"),
        }
        self.emit(Event::SidrReply {
            conn: ConnId(rep.request_id),
            rep: Box::new(rep),
        });
        self.free(rep.request_id);
        Disposition::Handled
    }

    // -----------------------------------------------------------------------
    // Timers
    // -----------------------------------------------------------------------

    /// Fires every timer whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, id));
            if let Some(c) = self.conns.get_mut(id) {
                c.timer = None;
            }
            self.on_timer(now, id);
        }
    }

    /// Resends the request being retried if retries are left. Returns false
    /// when the retries are exhausted.
    fn retry(&mut self, now: Nanos, id: u32, state: State) -> bool {
        let Some(c) = self.conns.get_mut(id) else {
            return true;
        };
        let Some(mad) = c.resend else {
            return false;
        };
        if c.retries_left == 0 {
            return false;
        }
        c.retries_left -= 1;
        c.state = state;
        let at = now.saturating_add(c.response_wait());
        self.set_timer(id, at);
        self.send_for(id, mad);
        true
    }

    fn on_timer(&mut self, now: Nanos, id: u32) {
        let Some(state) = self.state(ConnId(id)) else {
            return;
        };
        let retry_state = match state {
            State::ReqRcvd | State::MraReqSent | State::SidrReqRcvd => {
                self.answer_timed_out(now, id, state);
                return;
            }
            State::ReqSent | State::MraReqRcvd => State::ReqSent,
            State::RepSent | State::MraRepRcvd => State::RepSent,
            State::LapSent | State::MraLapRcvd => State::LapSent,
            State::DreqSent | State::SidrReqSent => state,
            State::Timewait => {
                self.free(id);
                return;
            }
            // No other state arms a timer (check_invariants); nothing to do.
            _ => return,
        };
        if self.retry(now, id, retry_state) {
            return;
        }
        // Retries exhausted.
        let conn = ConnId(id);
        match retry_state {
            State::ReqSent | State::RepSent => {
                let message = if retry_state == State::ReqSent {
                    TimedOut::Req
                } else {
                    TimedOut::Rep
                };
                self.emit(Event::Timeout { conn, message });
                self.reject_and_timewait(
                    now,
                    id,
                    RejectReason::Timeout,
                    MessageRejected::Other,
                    PrivateData::zeroed(),
                );
            }
            State::LapSent => {
                if let Some(c) = self.conns.get_mut(id) {
                    c.resend = None;
                    c.state = State::Established;
                }
                self.emit(Event::Timeout {
                    conn,
                    message: TimedOut::Lap,
                });
            }
            State::DreqSent => {
                self.emit(Event::Disconnected {
                    conn,
                    cause: DisconnectCause::DreqTimeout,
                    drep: None,
                });
                self.enter_timewait(now, id);
            }
            _ => {
                self.emit(Event::Timeout {
                    conn,
                    message: TimedOut::SidrReq,
                });
                self.free(id);
            }
        }
    }

    /// A received request nobody answered in time (the peer has given up):
    /// REJ(Timeout) and TIMEWAIT for a REQ; a SIDR CEP is simply freed (a
    /// SIDR requester needs no answer to stop).
    fn answer_timed_out(&mut self, now: Nanos, id: u32, state: State) {
        let conn = ConnId(id);
        self.emit(Event::Timeout {
            conn,
            message: TimedOut::Answer,
        });
        if state == State::SidrReqRcvd {
            self.free(id);
        } else {
            self.reject_and_timewait(
                now,
                id,
                RejectReason::Timeout,
                MessageRejected::Req,
                PrivateData::zeroed(),
            );
        }
    }

    // -----------------------------------------------------------------------
    // User calls
    // -----------------------------------------------------------------------

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
        self.listeners.insert(service_id, id);
        Ok(ConnId(id))
    }

    /// Stops a listener and frees its id ([`Event::Released`]). CEPs it
    /// created live on.
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
    /// times.
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
            c.last_reply = Some(mad);
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
            State::ReqRcvd => (MessageMraed::Req, State::MraReqSent),
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
        self.send_reply(conn.0, mad);
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
    /// DREP, then [`Event::Disconnected`].
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
    /// [`Event::Timeout`]; it is released after the reply or the timeout.
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
    /// [`Event::TimewaitExited`] and [`Event::Released`]):
    ///
    /// | state | sent | next |
    /// |---|---|---|
    /// | LISTEN, SIDR_REQ_SENT | nothing | released |
    /// | SIDR_REQ_RCVD | SIDR_REP (rejected) | released |
    /// | REQ_SENT, MRA_REQ_RCVD | REJ(Timeout) | TIMEWAIT |
    /// | REQ_RCVD, MRA_REQ_SENT, REP_RCVD, MRA_REP_SENT, REP_SENT, MRA_REP_RCVD | REJ(ConsumerReject) | TIMEWAIT |
    /// | ESTABLISHED and LAP substates | DREQ (once) | TIMEWAIT |
    /// | DREQ_SENT | nothing | TIMEWAIT |
    /// | DREQ_RCVD | DREP | TIMEWAIT |
    /// | TIMEWAIT | nothing | TIMEWAIT |
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
                self.cancel_timer(id);
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
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Invariants
    // -----------------------------------------------------------------------

    /// Checks that the tables agree with each other and with the CEP states:
    /// every table entry names a live CEP in a state that belongs in that
    /// table and that owns the entry; no comm id is used twice; a timer is
    /// armed exactly for the states that need one. For tests and fuzzers.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conns.check()?;
        let mut armed = 0usize;
        for (id, c) in self.conns.iter() {
            let name = ConnId(id);
            if c.id != id {
                return Err(format!("{name}: stored id {:#x}", c.id));
            }
            if c.state.has_timer() != c.timer.is_some() {
                return Err(format!("{name}: state {} but timer {:?}", c.state, c.timer));
            }
            if let Some(t) = c.timer {
                armed += 1;
                if !self.timers.contains(&(t, id)) {
                    return Err(format!("{name}: timer {t} not in the timer set"));
                }
            }
            if c.destroyed && c.state != State::Timewait {
                return Err(format!("{name}: destroyed but in {}", c.state));
            }
            if (c.state == State::Timewait) != self.timewait.contains(&id) {
                return Err(format!("{name}: {} vs timewait list", c.state));
            }
            if (c.state == State::Listen) != (self.listeners.get(&c.service_id) == Some(&id)) {
                return Err(format!("{name}: {} vs listen table", c.state));
            }
            if let Some(k) = c.remote_key {
                if self.remote_ids.get(&k) != Some(&id) {
                    return Err(format!("{name}: remote id {k:x?} not registered"));
                }
            }
            if let Some(k) = c.qpn_key {
                if self.remote_qpns.get(&k) != Some(&id) {
                    return Err(format!("{name}: remote QPN {k:x?} not registered"));
                }
                if c.state == State::Timewait {
                    return Err(format!("{name}: remote QPN kept in TIMEWAIT"));
                }
            }
            if let Some(k) = c.sidr_key {
                if self.sidr_remote.get(&k) != Some(&id) || c.state != State::SidrReqRcvd {
                    return Err(format!("{name}: SIDR key {k:x?} in {}", c.state));
                }
            }
            let needs_remote = matches!(
                c.state,
                State::ReqRcvd
                    | State::MraReqSent
                    | State::RepSent
                    | State::MraRepRcvd
                    | State::RepRcvd
                    | State::MraRepSent
                    | State::DreqSent
                    | State::DreqRcvd
            ) || c.state.is_established();
            if needs_remote && (c.remote_key.is_none() || c.qpn_key.is_none()) {
                return Err(format!("{name}: {} without remote tables", c.state));
            }
            if matches!(c.state, State::ReqSent | State::MraReqRcvd)
                && (c.remote_key.is_some() || c.qpn_key.is_some())
            {
                return Err(format!("{name}: {} with remote entries", c.state));
            }
        }
        if armed != self.timers.len() {
            return Err(format!(
                "{} timers armed but {armed} CEPs own one",
                self.timers.len()
            ));
        }
        for (&sid, &id) in &self.listeners {
            match self.conns.get(id) {
                Some(c) if c.state == State::Listen && c.service_id == sid => {}
                _ => return Err(format!("listen entry {sid:#x} -> {id:#x} is stale")),
            }
        }
        for (k, &id) in &self.remote_ids {
            match self.conns.get(id) {
                Some(c) if c.remote_key == Some(*k) => {}
                _ => return Err(format!("remote id entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for (k, &id) in &self.remote_qpns {
            match self.conns.get(id) {
                Some(c) if c.qpn_key == Some(*k) => {}
                _ => return Err(format!("remote QPN entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for (k, &id) in &self.sidr_remote {
            match self.conns.get(id) {
                Some(c) if c.sidr_key == Some(*k) => {}
                _ => return Err(format!("SIDR entry {k:x?} -> {id:#x} is stale")),
            }
        }
        for &id in &self.timewait {
            if self.conns.get(id).map(|c| c.state) != Some(State::Timewait) {
                return Err(format!("timewait entry {id:#x} is not in TIMEWAIT"));
            }
        }
        Ok(())
    }
}

/// A REJ answering a message that has no CEP here: our comm id is zero,
/// the sender's is `remote_comm_id`, `ari` the additional information.
fn rej_without_cep(
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
fn unsupported_req(req: &Req) -> Option<RejectReason> {
    if req.transport_service_type == crate::wire::TransportType::Extended {
        return Some(RejectReason::InvalidTransportType);
    }
    if !(1..=5).contains(&req.path_mtu) {
        return Some(RejectReason::InvalidMtu);
    }
    None
}
