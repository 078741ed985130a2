//! The [`Endpoint`]: the tables of every CEP on one port, the per-CEP
//! state, and the plumbing every part of the state machine uses (queueing
//! MADs and events, arming timers, entering TIMEWAIT, freeing an id).
//!
//! The state machine itself is one job per file, each an `impl Endpoint`
//! block over these tables:
//!
//! | file | job |
//! |---|---|
//! | `peers.rs` | who may speak for a connection (the peer's address, GID-routed ports) |
//! | `outgoing.rs` | what a CEP sends on its own account (REJ, DREQ, DREP, stale connections) and stateless REJs |
//! | `receive.rs` | each received MAD in each state |
//! | `timers.rs` | retries, answer deadlines, TIMEWAIT expiry |
//! | `pacing.rs` | the request window: requests wait in line while it is full |
//! | `window.rs` | where a CEP's request stands in the window (`Pacing`) |
//! | `calls.rs` | the user's calls (listen, connect, accept, ... destroy) |
//! | `invariants.rs` | the cross-table check tests and fuzzers run |
//! | `trace.rs` | what a `tracing` subscriber is told (`docs/tracing.md`) |

mod calls;
mod invariants;
mod outgoing;
mod pacing;
mod peers;
mod receive;
mod timers;
mod trace;
mod window;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::ids::IdSlab;
use crate::proto::{
    response_wait_nanos, timewait_nanos, ConnId, Disposition, EndpointConfig, Event, Nanos,
    PeerAddr, Resends, State, Transmit,
};
use crate::wire::CmMad;
use window::Pacing;

/// Key of the remote-id and remote-QPN tables: (remote value, remote CA GUID).
type RemoteKey = (u32, u64);

/// A listener: its CEP and its backlog, the requests (REQ or SIDR_REQ)
/// it took that the user has not answered yet.
#[derive(Clone, Copy, Debug)]
struct Listener {
    id: u32,
    /// Most unanswered requests; one more is refused at once (REJ "no
    /// resources", SIDR_REP "no QP") without a CEP.
    backlog: u32,
    /// Requests of this listener in REQ_RCVD, MRA_REQ_SENT or
    /// SIDR_REQ_RCVD (their `Conn::listener` is `id`).
    queued: u32,
}

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
    /// The request being retried by the timer. Boxed, as `last_reply`: a
    /// MAD is 264 bytes and most CEPs (established, idle) hold neither, so
    /// inline they were 528 of the 720 bytes of every CEP.
    resend: Option<Box<CmMad>>,
    /// The last answer sent, repeated when a duplicate request arrives.
    /// Not kept where nothing can ask for it again: the passive side's REP
    /// once the connection is established, an RTU without private data
    /// (`plain_rtu` rebuilds it).
    last_reply: Option<Box<CmMad>>,
    /// Active side: the RTU sent had no private data, so a duplicate REP
    /// is answered with one rebuilt from the ids instead of a stored copy.
    plain_rtu: bool,
    /// Passive side: how long the request may wait for the user's answer
    /// (see `answer_deadline_nanos`).
    answer_wait: u64,
    /// Passive side, until the user answers the request: the listener
    /// whose backlog it counts in (0: none).
    listener: u32,
    /// Whether its request waits for the window or holds a place in it
    /// (`pacing.rs`).
    pacing: Pacing,
}

impl Conn {
    fn new(id: u32, state: State, peer: PeerAddr) -> Self {
        trace::state_change(id, peer, None, Some(state));
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
            plain_rtu: false,
            answer_wait: 0,
            listener: 0,
            pacing: Pacing::Off,
        }
    }

    /// Moves the CEP to `state`; a change is traced (`trace.rs`).
    fn enter(&mut self, state: State) {
        if self.state != state {
            trace::state_change(self.id, self.peer, Some(self.state), Some(state));
        }
        self.state = state;
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
    listeners: BTreeMap<u64, Listener>,
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
    /// Requests sent again by their retry timer.
    resends: Resends,
    /// Requests waiting for room in the window, oldest first:
    /// (`line_key`, local id).
    waiting: BTreeSet<(u64, u32)>,
    /// Requests on the wire awaiting their answer (`Pacing::OnWire`).
    in_flight: u32,
    /// Requests that have had to wait for the window.
    requests_queued: u64,
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
            resends: Resends::default(),
            waiting: BTreeSet::new(),
            in_flight: 0,
            requests_queued: 0,
            config,
        }
    }

    /// Bytes an established connection costs the endpoint: its slot in the
    /// id table and its entries in the remote-id and remote-QPN maps
    /// (B-tree entries counted at a 2/3 node fill, the average of random
    /// inserts). `docs/scale.md` sums it with the CEP object's.
    pub fn connection_bytes() -> usize {
        let entry = std::mem::size_of::<(RemoteKey, u32)>() * 3 / 2;
        super::ids::slot_bytes::<Conn>() + 2 * entry
    }

    /// The settings this endpoint was created with.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

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

    /// Number of allocated CEPs that are not listeners. O(1): every
    /// listener is in the listen table and every entry there is a listener
    /// (`check_invariants`), so this is a difference of two lengths, not a
    /// walk over the CEPs (the agent asks for it in every `stats()` and a
    /// lingering agent thread after every round).
    pub fn live_connections(&self) -> usize {
        self.conns.len() - self.listeners.len()
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

    /// Requests sent again by their retry timer, by kind, and the most
    /// resends any one request needed.
    pub fn resends(&self) -> Resends {
        self.resends
    }

    /// Every allocated CEP with its state, in id order of the slots.
    pub fn ceps(&self) -> Vec<(ConnId, State)> {
        self.conns
            .iter()
            .map(|(id, c)| (ConnId(id), c.state))
            .collect()
    }

    /// The configuration, for tests that change the port afterwards.
    #[cfg(test)]
    pub(super) fn config_mut(&mut self) -> &mut EndpointConfig {
        &mut self.config
    }

    // The plumbing every part of the state machine (the files beside this
    // one) uses: transaction ids, queueing MADs and events, timers, the
    // tables, TIMEWAIT and freeing an id.

    fn alloc_tid(&mut self) -> u64 {
        let t = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        t
    }

    fn send(&mut self, to: PeerAddr, conn: Option<u32>, mad: CmMad) {
        trace::mad_sent(to, conn, &mad);
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
        let conn = self.conns.get(event.conn().0);
        trace::event(&event, conn.map(|c| c.peer));
        let always = matches!(event, Event::TimewaitExited { .. } | Event::Released { .. });
        let destroyed = conn.is_some_and(|c| c.destroyed);
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

    /// Stops the CEP's timer. A request's retry timer stops exactly when
    /// the request ends (answered, rejected, replaced, the CEP moving on),
    /// so its place in the window, or in line, goes too.
    fn cancel_timer(&mut self, id: u32) {
        self.end_request(id);
        if let Some(c) = self.conns.get_mut(id) {
            if let Some(old) = c.timer.take() {
                self.timers.remove(&(old, id));
            }
        }
    }

    fn set_state(&mut self, id: u32, state: State) {
        if let Some(c) = self.conns.get_mut(id) {
            c.enter(state);
        }
    }

    /// Sends `mad` as the request this CEP retries, arming the retry timer
    /// with a fresh retry budget. Every request but a REP is paced: it
    /// waits in line while the window is full (`pacing.rs`).
    fn send_request(&mut self, now: Nanos, id: u32, state: State, mad: CmMad) {
        self.dequeue(id);
        self.end_request(id);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.enter(state);
        c.resend = Some(Box::new(mad));
        c.retries_left = c.max_retries;
        let at = now.saturating_add(c.response_wait());
        if window::is_paced(state) {
            self.send_paced(now, id);
            return;
        }
        self.set_timer(id, at);
        self.send_for(id, mad);
    }

    /// Sends `mad` as an answer that duplicates of the request repeat.
    fn send_reply(&mut self, id: u32, mad: CmMad) {
        if let Some(c) = self.conns.get_mut(id) {
            c.last_reply = Some(Box::new(mad));
            c.plain_rtu = false;
        }
        self.send_for(id, mad);
    }

    /// Resends the last answer if it is of the given kind.
    fn resend_reply(&mut self, id: u32, kind: &str) -> Disposition {
        let Some(c) = self.conns.get(id) else {
            return Disposition::Ignored("duplicate request, nothing to repeat");
        };
        let mad = match c.last_reply.as_deref() {
            Some(mad) => Some(*mad),
            None if c.plain_rtu => Some(CmMad::new(
                c.tid,
                crate::wire::Rtu {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: crate::wire::PrivateData::zeroed(),
                },
            )),
            None => None,
        };
        match mad {
            Some(mad) if mad.message_kind() == kind => {
                self.send_for(id, mad);
                Disposition::Answered
            }
            _ => Disposition::Ignored("duplicate request, nothing to repeat"),
        }
    }

    /// A request left the states that wait for the user (answered,
    /// rejected, timed out, destroyed): its listener's backlog has room for
    /// one more. Called from every exit of those states: `send_request`
    /// (REP), `enter_timewait` and `free`.
    fn dequeue(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let listener = std::mem::take(&mut c.listener);
        if listener == 0 {
            return;
        }
        match self.listeners.get_mut(&c.service_id) {
            // The listener may be gone, or replaced by a new one for the
            // service: only its own requests count in its backlog.
            Some(l) if l.id == listener => l.queued -= 1,
            _ => {}
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
        self.dequeue(id);
        self.end_request(id);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.enter(State::Timewait);
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
        self.dequeue(id);
        let Some(c) = self.conns.remove(id) else {
            return;
        };
        trace::state_change(id, c.peer, Some(c.state), None);
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

    fn become_established(&mut self, id: u32) {
        self.cancel_timer(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.resend = None;
            c.enter(State::Established);
            // The passive side's REP: a duplicate REQ is ignored from now
            // on, so nothing will ask for it again.
            if c.last_reply
                .as_ref()
                .is_some_and(|m| m.message_kind() == "REP")
            {
                c.last_reply = None;
            }
        }
        self.emit(Event::Established { conn: ConnId(id) });
    }
}

#[cfg(test)]
mod size_tests {
    /// Every CEP of a port is one `Conn` in the slab: 720 bytes while the
    /// request being retried and the last answer were stored inline (two
    /// 264-byte MADs), 208 with them boxed and kept only while something
    /// can ask for them.
    #[test]
    fn a_cep_stays_small() {
        assert!(
            std::mem::size_of::<super::Conn>() <= 208,
            "Conn is {} bytes",
            std::mem::size_of::<super::Conn>()
        );
    }
}
