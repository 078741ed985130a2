//! Sans-IO IBTA connection-manager protocol core (IBTA Vol 1, chapter 12).
//!
//! This module holds the CM state machines and nothing else: no threads, no
//! clock, no sockets, no locks. It is driven entirely by its caller, in the
//! style of `quinn-proto`:
//!
//! * **Inputs**: received MADs ([`Endpoint::handle_mad`]), user calls
//!   ([`Endpoint::listen`], [`Endpoint::connect`], [`Endpoint::accept`],
//!   [`Endpoint::disconnect`], ...) and the passage of time
//!   ([`Endpoint::handle_timeout`]). Every input carries the current time as
//!   a [`Nanos`] value chosen by the caller.
//! * **Outputs**: MADs to send ([`Endpoint::poll_transmit`]), the next
//!   deadline at which [`Endpoint::handle_timeout`] must be called
//!   ([`Endpoint::next_timeout`]) and events for the user
//!   ([`Endpoint::poll_event`]).
//!
//! The same inputs always give the same outputs, so the core can be fuzzed
//! and simulated with a fake clock (see the tests in `tests.rs`).
//!
//! An [`Endpoint`] corresponds to one CM agent (one port / CA). It owns the
//! connection table (keyed by local communication id), the listen table
//! (service id to listener), the remote-id table (remote comm id + remote CA
//! GUID, for duplicate detection), the remote-QPN table (remote QPN + remote
//! CA GUID, for stale-connection detection), the SIDR duplicate table and the
//! timewait list. `docs/cm-protocol.md` has the state diagram, the timer
//! formulas and the event model.
//!
//! ```
//! use cep::proto::{ConnectParams, Endpoint, EndpointConfig, Event, Nanos, PeerAddr};
//! use cep::wire::Req;
//!
//! let a_addr = PeerAddr { lid: 1, gid: [0; 16] };
//! let b_addr = PeerAddr { lid: 2, gid: [0; 16] };
//! let mut a = Endpoint::new(EndpointConfig::new(0xA));
//! let mut b = Endpoint::new(EndpointConfig::new(0xB));
//! let now = Nanos(0);
//!
//! b.listen(0x1000).unwrap();
//! let req = Req { service_id: 0x1000, local_qpn: 0x11, max_cm_retries: 3, path_mtu: 5, ..Req::default() };
//! let conn = a.connect(now, ConnectParams::new(b_addr, req)).unwrap();
//! let tx = a.poll_transmit().unwrap();
//! b.handle_mad(now, a_addr, tx.mad);
//! assert!(matches!(b.poll_event(), Some(Event::ConnectRequest { .. })));
//! # let _ = conn;
//! ```

mod endpoint;
mod ids;

#[cfg(test)]
mod tests;

use core::fmt;

use crate::wire::{
    ApStatus, Apr, CmMad, Drep, Dreq, Lap, MessageMraed, MessageRejected, PathInfo, Rej,
    RejectReason, Rep, Req, SidrRep, SidrReq, SidrStatus, WireError, INFO_LEN,
};

pub use crate::keyed::IdKey;
pub use endpoint::Endpoint;

/// A point in time, in nanoseconds since an origin the caller picks.
///
/// The core never reads a clock; every entry point takes the current time
/// and deadlines are reported in the same unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The caller's time origin.
    pub const ZERO: Self = Self(0);

    /// `self + ns`, saturating at `u64::MAX`.
    pub const fn saturating_add(self, ns: u64) -> Self {
        Self(self.0.saturating_add(ns))
    }

    /// Nanoseconds since the caller's origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// A connection endpoint (CEP): a connection, a listener or a SIDR exchange.
///
/// The value is the local communication id this endpoint uses on the wire
/// (for SIDR, the RequestID): a slot of the endpoint's table and a
/// generation of that slot (advanced every time the slot is reused, so a
/// stale id does not name a new connection), under a keyed permutation
/// ([`EndpointConfig::id_key`]), so that without the key an id reveals
/// nothing about any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub(crate) u32);

impl ConnId {
    /// The id of a connection whose communication id another connection
    /// manager chose: the librdmacm-backed CEPs (crate `cep-rdmacm`) number
    /// theirs from a process-wide counter, and report their events with it.
    /// The agent's own ids come from its keyed table, never from here.
    pub const fn from_comm_id(comm_id: u32) -> Self {
        Self(comm_id)
    }

    /// The local communication id (or SIDR RequestID) used on the wire.
    pub const fn comm_id(self) -> u32 {
        self.0
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cep#{:#010x}", self.0)
    }
}

/// Where a MAD came from or goes to: the remote port, as far as the CM is
/// concerned. The layer above maps it to an address handle (QP1 on that
/// port). The core only compares addresses (for SIDR duplicate detection and
/// to find the target of a REJ that names no local comm id).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerAddr {
    /// LID of the remote port (source LID of a received MAD).
    pub lid: u16,
    /// GID of the remote port from the GRH; all zeros when there is none.
    pub gid: [u8; 16],
}

/// One MAD to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The port to send the MAD to (through its QP1).
    pub to: PeerAddr,
    /// The CEP this MAD belongs to; `None` for stateless answers (REJ for an
    /// unknown service, DREP for an unknown comm id, ...).
    pub conn: Option<ConnId>,
    /// The CM MAD itself, with its transaction id.
    pub mad: CmMad,
}

/// Per-connection CM state (IBTA Vol 1, 12.9.6 state diagrams).
///
/// There is no `Idle` variant: a comm id that is not in the table is idle.
/// The alternate-path states (`LapSent`, `LapRcvd`, `MraLapSent`,
/// `MraLapRcvd`) are substates of Established; [`State::is_established`] is
/// true for all five.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// A listener: waits for REQs and SIDR_REQs for its service id.
    Listen,
    /// Active side: REQ sent, waiting for REP (REQ retry timer armed).
    ReqSent,
    /// Passive side: REQ received, waiting for the user's accept, reject or MRA.
    ReqRcvd,
    /// Passive side: MRA sent for the REQ, waiting for the user's accept or reject.
    MraReqSent,
    /// Active side: the peer sent MRA for our REQ; waiting for REP on the MRA timer.
    MraReqRcvd,
    /// Passive side: REP sent, waiting for RTU (REP retry timer armed).
    RepSent,
    /// Active side: REP received, waiting for the user's RTU, reject or MRA.
    RepRcvd,
    /// Active side: MRA sent for the REP, waiting for the user's RTU or reject.
    MraRepSent,
    /// Passive side: the peer sent MRA for our REP; waiting for RTU on the MRA timer.
    MraRepRcvd,
    /// The connection is up on its current path.
    Established,
    /// Established, LAP sent: waiting for APR (LAP retry timer armed).
    LapSent,
    /// Established, LAP received: waiting for the user's APR or MRA.
    LapRcvd,
    /// Established, MRA sent for the peer's LAP: waiting for the user's APR.
    MraLapSent,
    /// Established, the peer sent MRA for our LAP: waiting for APR on the MRA timer.
    MraLapRcvd,
    /// DREQ sent, waiting for DREP (DREQ retry timer armed).
    DreqSent,
    /// DREQ received, waiting for the user to send DREP.
    DreqRcvd,
    /// The connection is over; the comm id stays reserved until the timewait
    /// timer expires, so late duplicates are still recognised.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP (SIDR_REQ retry timer armed).
    SidrReqSent,
    /// SIDR_REQ received by a listener, waiting for the user's SIDR_REP.
    SidrReqRcvd,
}

impl State {
    /// Established or one of its alternate-path substates.
    pub const fn is_established(self) -> bool {
        matches!(
            self,
            Self::Established | Self::LapSent | Self::LapRcvd | Self::MraLapSent | Self::MraLapRcvd
        )
    }

    /// States that always have exactly one timer armed (retry, MRA wait,
    /// timewait expiry); every other state has none.
    pub const fn has_timer(self) -> bool {
        matches!(
            self,
            Self::ReqSent
                | Self::ReqRcvd
                | Self::MraReqSent
                | Self::SidrReqRcvd
                | Self::MraReqRcvd
                | Self::RepSent
                | Self::MraRepRcvd
                | Self::LapSent
                | Self::MraLapRcvd
                | Self::DreqSent
                | Self::Timewait
                | Self::SidrReqSent
        )
    }

    /// Upper-case IBTA-style name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Listen => "LISTEN",
            Self::ReqSent => "REQ_SENT",
            Self::ReqRcvd => "REQ_RCVD",
            Self::MraReqSent => "MRA_REQ_SENT",
            Self::MraReqRcvd => "MRA_REQ_RCVD",
            Self::RepSent => "REP_SENT",
            Self::RepRcvd => "REP_RCVD",
            Self::MraRepSent => "MRA_REP_SENT",
            Self::MraRepRcvd => "MRA_REP_RCVD",
            Self::Established => "ESTABLISHED",
            Self::LapSent => "LAP_SENT",
            Self::LapRcvd => "LAP_RCVD",
            Self::MraLapSent => "MRA_LAP_SENT",
            Self::MraLapRcvd => "MRA_LAP_RCVD",
            Self::DreqSent => "DREQ_SENT",
            Self::DreqRcvd => "DREQ_RCVD",
            Self::Timewait => "TIMEWAIT",
            Self::SidrReqSent => "SIDR_REQ_SENT",
            Self::SidrReqRcvd => "SIDR_REQ_RCVD",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which request ran out of retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimedOut {
    /// No REP (active side); a REJ with reason Timeout was sent.
    Req,
    /// No RTU (passive side); a REJ with reason Timeout was sent.
    Rep,
    /// No APR; the connection stays established on its current path.
    Lap,
    /// No SIDR_REP; the SIDR CEP is released.
    SidrReq,
    /// Nobody answered the peer's REQ (or SIDR_REQ) before the peer's own
    /// retries ran out: the CM sent a REJ with reason Timeout (for a REQ)
    /// and the CEP is reclaimed. See [`answer_deadline_nanos`].
    Answer,
}

/// Who produced a REJ reported by [`Event::Rejected`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectOrigin {
    /// The peer sent it.
    Remote,
    /// This endpoint sent it on its own (for example a REP naming a stale
    /// QPN); the REJ as sent is in the event.
    Local,
}

/// How a disconnect initiated by this side ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DisconnectCause {
    /// The peer answered the DREQ with a DREP.
    DrepReceived,
    /// The DREQ was retried MaxCMRetries times without a DREP.
    DreqTimeout,
    /// Both sides sent DREQ; the peer's DREQ was answered with a DREP.
    SimultaneousDreq,
}

/// Something the user of the endpoint must know about.
///
/// Every event names the CEP it concerns. Events for a CEP the user has
/// [destroyed](Endpoint::destroy) are suppressed, except
/// [`Event::TimewaitExited`] and [`Event::Released`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A REQ matched a listener: `conn` is a new CEP in REQ_RCVD. Answer with
    /// [`Endpoint::accept`], [`Endpoint::reject`] or [`Endpoint::send_mra`].
    ConnectRequest {
        /// The new passive-side CEP, in REQ_RCVD.
        conn: ConnId,
        /// The listener whose service id the REQ named.
        listener: ConnId,
        /// The port the REQ came from.
        peer: PeerAddr,
        /// The REQ as received.
        req: Box<Req>,
    },
    /// A REP answered our REQ (`conn` is in REP_RCVD). Answer with
    /// [`Endpoint::send_rtu`], [`Endpoint::reject`] or [`Endpoint::send_mra`].
    ReplyReceived {
        /// The active-side CEP, now in REP_RCVD.
        conn: ConnId,
        /// The REP as received.
        rep: Box<Rep>,
    },
    /// The peer acknowledged our message and asked for more time.
    MraReceived {
        /// The CEP whose request was acknowledged.
        conn: ConnId,
        /// Which of our messages the MRA covers (REQ, REP or LAP).
        message: MessageMraed,
        /// Extra time the peer asks for (CM timeout encoding).
        service_timeout: u8,
    },
    /// `conn` entered ESTABLISHED (RTU sent or received, or
    /// [`Endpoint::established`] called).
    Established {
        /// The CEP that is now ESTABLISHED.
        conn: ConnId,
    },
    /// A REJ ended the connection (or, with `message` `Other` while a LAP is
    /// outstanding, refused the alternate path only; the connection then
    /// stays established).
    Rejected {
        /// The CEP the REJ concerns.
        conn: ConnId,
        /// The REJ's reason code.
        reason: RejectReason,
        /// Which message the REJ refused (REQ, REP or Other).
        message: MessageRejected,
        /// Whether the peer or this endpoint produced the REJ.
        origin: RejectOrigin,
        /// The whole REJ (ARI, private data).
        rej: Box<Rej>,
    },
    /// The peer sent DREQ; answer with [`Endpoint::disconnect_reply`].
    DisconnectRequest {
        /// The CEP the peer disconnects, now in DREQ_RCVD.
        conn: ConnId,
        /// The DREQ as received.
        dreq: Box<Dreq>,
    },
    /// A disconnect this side started has finished; `conn` is in TIMEWAIT.
    Disconnected {
        /// The CEP that was disconnected.
        conn: ConnId,
        /// How the disconnect ended.
        cause: DisconnectCause,
        /// The peer's DREP, when one ended it ([`DisconnectCause::DrepReceived`]).
        drep: Option<Box<Drep>>,
    },
    /// A request ran out of retries.
    Timeout {
        /// The CEP whose request timed out.
        conn: ConnId,
        /// Which request timed out.
        message: TimedOut,
    },
    /// The peer proposes an alternate path; answer with [`Endpoint::apr`] or
    /// [`Endpoint::send_mra`].
    LapReceived {
        /// The CEP the LAP concerns, now in LAP_RCVD.
        conn: ConnId,
        /// The LAP as received, with the proposed alternate path.
        lap: Box<Lap>,
    },
    /// The answer to our LAP.
    AprReceived {
        /// The CEP that sent the LAP, back in ESTABLISHED.
        conn: ConnId,
        /// The APR's status: whether the alternate path was accepted.
        status: ApStatus,
        /// The APR as received.
        apr: Box<Apr>,
    },
    /// A SIDR_REQ matched a listener; answer with [`Endpoint::sidr_reply`].
    SidrRequest {
        /// The new SIDR CEP, in SIDR_REQ_RCVD.
        conn: ConnId,
        /// The listener whose service id the SIDR_REQ named.
        listener: ConnId,
        /// The port the SIDR_REQ came from.
        peer: PeerAddr,
        /// The SIDR_REQ as received.
        req: Box<SidrReq>,
    },
    /// The answer to our SIDR_REQ. The SIDR CEP is released right after.
    SidrReply {
        /// The SIDR CEP that sent the SIDR_REQ.
        conn: ConnId,
        /// The SIDR_REP as received (status, QPN, Q_Key).
        rep: Box<SidrRep>,
    },
    /// A REQ or REP from the peer named the remote QPN of `conn`, so `conn`
    /// is stale: it is being disconnected (DREQ) or rejected.
    StaleConnection {
        /// The stale CEP.
        conn: ConnId,
    },
    /// `conn` left TIMEWAIT; [`Event::Released`] follows.
    TimewaitExited {
        /// The CEP that left TIMEWAIT.
        conn: ConnId,
    },
    /// The comm id of `conn` was freed: the layer above can release the QP
    /// binding / CID slot. Emitted exactly once per CEP, last.
    Released {
        /// The CEP whose comm id was freed.
        conn: ConnId,
    },
}

impl Event {
    /// The variant's name, for logs and compact assertions.
    pub const fn name(&self) -> &'static str {
        match self {
            Event::ConnectRequest { .. } => "ConnectRequest",
            Event::ReplyReceived { .. } => "ReplyReceived",
            Event::MraReceived { .. } => "MraReceived",
            Event::Established { .. } => "Established",
            Event::Rejected { .. } => "Rejected",
            Event::DisconnectRequest { .. } => "DisconnectRequest",
            Event::Disconnected { .. } => "Disconnected",
            Event::Timeout { .. } => "Timeout",
            Event::LapReceived { .. } => "LapReceived",
            Event::AprReceived { .. } => "AprReceived",
            Event::SidrRequest { .. } => "SidrRequest",
            Event::SidrReply { .. } => "SidrReply",
            Event::StaleConnection { .. } => "StaleConnection",
            Event::TimewaitExited { .. } => "TimewaitExited",
            Event::Released { .. } => "Released",
        }
    }

    /// The CEP the event concerns.
    pub fn conn(&self) -> ConnId {
        match self {
            Self::ConnectRequest { conn, .. }
            | Self::ReplyReceived { conn, .. }
            | Self::MraReceived { conn, .. }
            | Self::Established { conn }
            | Self::Rejected { conn, .. }
            | Self::DisconnectRequest { conn, .. }
            | Self::Disconnected { conn, .. }
            | Self::Timeout { conn, .. }
            | Self::LapReceived { conn, .. }
            | Self::AprReceived { conn, .. }
            | Self::SidrRequest { conn, .. }
            | Self::SidrReply { conn, .. }
            | Self::StaleConnection { conn }
            | Self::TimewaitExited { conn }
            | Self::Released { conn } => *conn,
        }
    }
}

/// Requests an [`Endpoint`] sent again because their answer did not come
/// within the response wait (or an MRA's wait ran out), by kind. A burst
/// the passive side absorbs costs none; a REQ it dropped, or a request
/// its consumer is slow to answer, costs one each (then an MRA holds the
/// requester: `docs/cm-protocol.md`, "Bursts").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resends {
    /// REQs sent again.
    pub req: u64,
    /// REPs sent again.
    pub rep: u64,
    /// DREQs, LAPs and SIDR_REQs sent again.
    pub other: u64,
    /// The most times any one request was sent again.
    pub most_for_one_request: u8,
}

impl Resends {
    /// One more resend of a request in `state` (its retry state), the
    /// `used`-th of that request.
    pub(crate) fn count(&mut self, state: State, used: u8) {
        match state {
            State::ReqSent => self.req += 1,
            State::RepSent => self.rep += 1,
            _ => self.other += 1,
        }
        self.most_for_one_request = self.most_for_one_request.max(used);
    }
}

/// What [`Endpoint::handle_mad`] did with a MAD. Informational: the
/// observable effects are the transmits and events it queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// The MAD changed the state of a CEP (and may have queued events or
    /// MADs).
    Handled,
    /// The MAD was answered without changing any state (duplicate, unknown
    /// service, DREQ for an unknown comm id, ...).
    Answered,
    /// The MAD was dropped; the string says why.
    Ignored(&'static str),
}

/// Settings of one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The local CA GUID, sent in REQ and REP and used in REJ(Timeout) ARI.
    pub local_ca_guid: u64,
    /// Keys the permutation that turns table slots into comm ids. Secret:
    /// whoever has it can predict every id. A [`CmAgent`](crate::agent::CmAgent)
    /// draws one from the operating system ([`IdKey::random`]).
    pub id_key: IdKey,
    /// Maximum number of simultaneously allocated CEPs (at most 2^20).
    pub max_ceps: u32,
    /// First transaction id; each request gets the next one.
    pub first_tid: u64,
    /// The port this endpoint answers for. When set, a REQ whose primary
    /// path names another port is refused: REJ "invalid primary LID"
    /// (reason 13, ARI: this port's LID) or "invalid primary GID" (12, ARI:
    /// this port's GID), so the active side learns the address to use
    /// instead of building a connection that sends to the wrong port.
    pub local_port: Option<LocalPort>,
    /// The most requests (REQ, DREQ, LAP, SIDR_REQ) on the wire at once
    /// awaiting their answer; more wait in the endpoint, in order, and go
    /// out as answers come or requests end ([`DEFAULT_REQUEST_WINDOW`] by
    /// default; 0 is taken as 1). `docs/cm-protocol.md`, "Bursts".
    pub request_window: u32,
}

/// A port's addresses, for checking the primary path of incoming REQs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalPort {
    /// Base LID (0 on RoCE ports, where only the GID is checked).
    pub lid: u16,
    /// LID mask control: the port answers to `lid .. lid + 2^lmc`.
    pub lmc: u8,
    /// GID index 0.
    pub gid: [u8; 16],
}

impl LocalPort {
    /// Whether `lid` addresses this port (the permissive LID 0xFFFF does).
    pub fn owns_lid(&self, lid: u16) -> bool {
        if self.lid == 0 || lid == 0xFFFF {
            return true;
        }
        let span = 1u32 << self.lmc.min(7);
        (u32::from(self.lid)..u32::from(self.lid) + span).contains(&u32::from(lid))
    }
}

impl EndpointConfig {
    /// Settings for the CA `local_ca_guid`: the largest CEP table, no port
    /// check, and a first transaction id and comm id key derived from the
    /// GUID. Reproducible, for simulations, fuzzing and tests: anyone who
    /// knows the GUID can predict the ids, so a CM that faces a network
    /// sets [`id_key`](Self::id_key) to [`IdKey::random`] (the agent does).
    pub const fn new(local_ca_guid: u64) -> Self {
        Self {
            local_ca_guid,
            id_key: IdKey::fixed(local_ca_guid, !local_ca_guid),
            max_ceps: 1 << ids::INDEX_BITS,
            first_tid: local_ca_guid << 32,
            local_port: None,
            request_window: DEFAULT_REQUEST_WINDOW,
        }
    }
}

/// Arguments of [`Endpoint::connect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Where to send the REQ.
    pub peer: PeerAddr,
    /// The REQ to send. `local_comm_id` and `local_ca_guid` are filled in by
    /// the endpoint. `remote_cm_response_timeout` and `max_cm_retries` also
    /// drive the retry timer.
    pub req: Req,
    /// PacketLifeTime of the primary path (CM timeout encoding).
    pub packet_life_time: u8,
}

impl ConnectParams {
    /// Params with a PacketLifeTime derived from the primary path's local ACK
    /// timeout (see [`packet_life_time_from_ack_timeout`]).
    pub fn new(peer: PeerAddr, req: Req) -> Self {
        Self {
            peer,
            packet_life_time: packet_life_time_from_ack_timeout(req.primary_path.local_ack_timeout),
            req,
        }
    }
}

/// Arguments of [`Endpoint::lap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LapParams {
    /// The proposed alternate path, sent in the LAP.
    pub alternate_path: PathInfo,
    /// Private data carried by the LAP.
    pub private_data: crate::wire::PrivateData<168>,
}

impl LapParams {
    /// A LAP proposing `alternate_path`, with no private data.
    pub fn new(alternate_path: PathInfo) -> LapParams {
        LapParams {
            alternate_path,
            private_data: crate::wire::PrivateData::default(),
        }
    }

    /// The same LAP carrying `data` (at most 168 bytes, else
    /// `InvalidParameter`).
    pub fn private_data(mut self, data: &[u8]) -> al::Result<LapParams> {
        self.private_data = crate::wire::PrivateData::new(data)?;
        Ok(self)
    }
}

/// Arguments of [`Endpoint::sidr_request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrParams {
    /// Where to send the SIDR_REQ.
    pub peer: PeerAddr,
    /// The service id to resolve.
    pub service_id: u64,
    /// The P_Key sent in the SIDR_REQ.
    pub pkey: u16,
    /// How long the responder may take (CM timeout encoding).
    pub timeout: u8,
    /// PacketLifeTime of the path to the peer (CM timeout encoding).
    pub packet_life_time: u8,
    /// How many times the SIDR_REQ is resent before a timeout.
    pub max_retries: u8,
    /// Private data carried by the SIDR_REQ.
    pub private_data: crate::wire::PrivateData<216>,
}

impl SidrParams {
    /// A SIDR request for `service_id` to `peer` with the usual settings:
    /// the default P_Key, a response timeout of 14 (about 67 ms), a packet
    /// lifetime of 10, three retries, no private data.
    pub fn new(service_id: u64, peer: PeerAddr) -> Self {
        SidrParams {
            peer,
            service_id,
            pkey: 0xffff,
            timeout: 14,
            packet_life_time: 10,
            max_retries: 3,
            private_data: Default::default(),
        }
    }
}

/// Arguments of [`Endpoint::sidr_reply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReplyParams {
    /// Outcome of the request (success, no such service, redirect, ...).
    pub status: SidrStatus,
    /// The UD QP that serves the service id (24 bits).
    pub qpn: u32,
    /// The Q_Key of that QP.
    pub qkey: u32,
    /// Meaningful bytes of the additional information.
    pub additional_info_length: u8,
    /// Additional information (redirection information for status `Redirect`).
    pub additional_info: [u8; INFO_LEN],
    /// Private data carried by the SIDR_REP.
    pub private_data: crate::wire::PrivateData<136>,
}

impl Default for SidrReplyParams {
    fn default() -> Self {
        Self {
            status: SidrStatus::Success,
            qpn: 0,
            qkey: 0,
            additional_info_length: 0,
            additional_info: [0; INFO_LEN],
            private_data: Default::default(),
        }
    }
}

/// The PacketLifeTime a passive side assumes when all it has is the REQ:
/// the local ACK timeout is conventionally PacketLifeTime + 1 (twice the
/// lifetime), so the lifetime is one less.
pub const fn packet_life_time_from_ack_timeout(ack_timeout: u8) -> u8 {
    ack_timeout.saturating_sub(1)
}

/// How long a request waits for its answer:
/// `2 * PacketLifeTime + ResponseTimeout`, in nanoseconds.
pub const fn response_wait_nanos(packet_life_time: u8, response_timeout: u8) -> u64 {
    use crate::wire::cm_timeout_to_nanos;
    cm_timeout_to_nanos(packet_life_time)
        .saturating_mul(2)
        .saturating_add(cm_timeout_to_nanos(response_timeout))
}

/// How long a received REQ may wait for the user's answer (accept, reject
/// or MRA) before the CM reclaims it: the time the active side keeps
/// retrying the REQ, `MaxCMRetries + 1` waits of `2 * PacketLifeTime +
/// RemoteCMResponseTimeout`, plus one more wait so a REP sent at the last
/// moment is not cut short. After that the active side has given up, so an
/// accept could only produce a REP nobody takes.
pub const fn answer_deadline_nanos(
    packet_life_time: u8,
    response_timeout: u8,
    max_retries: u8,
) -> u64 {
    response_wait_nanos(packet_life_time, response_timeout).saturating_mul(max_retries as u64 + 2)
}

/// How many requests a listener holds unanswered before it refuses more
/// ([`Endpoint::set_backlog`]): TCP's `somaxconn` on Linux. Each costs a
/// CEP (a few hundred bytes here, a CEP object and its event above) until
/// the user answers it; with the default timers a consumer accepting 5,000
/// requests a second answers a full backlog in under a second, well inside
/// a request's answer deadline (about 2 s).
pub const DEFAULT_BACKLOG: u32 = 4096;

/// How many requests an endpoint keeps on the wire at once awaiting their
/// answer ([`EndpointConfig::request_window`]): a quarter of the 4096
/// receive buffers a CM agent posts on QP1, so four senders that each fill
/// their window cannot overflow one receiver, even if it takes none of
/// their MADs until all have arrived. More requests wait in the endpoint
/// and go out as answers come (`docs/cm-protocol.md`, "Bursts").
pub const DEFAULT_REQUEST_WINDOW: u32 = 1024;

/// How long a received SIDR_REQ may wait for `sidr_reply`. A SIDR_REQ
/// carries no timeouts, so this is the deadline of a REQ with the
/// largest response timeout the CM itself uses (2^20 x 4.096 us, about
/// 4.3 s) and three retries: about 21 s.
pub const SIDR_ANSWER_DEADLINE_NANOS: u64 = answer_deadline_nanos(0, 20, 3);

/// How long a CEP stays in TIMEWAIT:
/// `2 * PacketLifeTime + TargetACKDelay` (the last term only when a REP
/// told us the TargetACKDelay), in nanoseconds.
pub const fn timewait_nanos(packet_life_time: u8, target_ack_delay: Option<u8>) -> u64 {
    use crate::wire::cm_timeout_to_nanos;
    let tad = match target_ack_delay {
        Some(t) => cm_timeout_to_nanos(t),
        None => 0,
    };
    cm_timeout_to_nanos(packet_life_time)
        .saturating_mul(2)
        .saturating_add(tad)
}

/// How long a request waits after an MRA:
/// `ServiceTimeout + 2 * PacketLifeTime`, in nanoseconds.
pub const fn mra_wait_nanos(packet_life_time: u8, service_timeout: u8) -> u64 {
    use crate::wire::cm_timeout_to_nanos;
    cm_timeout_to_nanos(service_timeout)
        .saturating_add(cm_timeout_to_nanos(packet_life_time).saturating_mul(2))
}

/// An invalid user call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// No CEP with this id (never allocated, or already released).
    UnknownConn(ConnId),
    /// The CEP was destroyed by the user; it only waits for timewait now.
    Destroyed(ConnId),
    /// The call is not valid in the CEP's current state.
    WrongState {
        /// The CEP the call named.
        conn: ConnId,
        /// The state the CEP was in.
        state: State,
        /// The name of the refused call.
        call: &'static str,
    },
    /// Another listener already owns this service id.
    ServiceIdInUse(u64),
    /// All [`EndpointConfig::max_ceps`] ids are allocated.
    NoFreeIds,
    /// A value given by the user does not fit the message (QPN wider than 24
    /// bits, private data too long, non-canonical reason code, ...).
    Wire(WireError),
    /// A parameter is invalid for another reason.
    InvalidParam(&'static str),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownConn(c) => write!(f, "{c}: no such connection endpoint"),
            Self::Destroyed(c) => write!(f, "{c}: connection endpoint was destroyed"),
            Self::WrongState { conn, state, call } => {
                write!(f, "{conn}: {call} is not valid in state {state}")
            }
            Self::ServiceIdInUse(s) => write!(f, "service id {s:#018x} already has a listener"),
            Self::NoFreeIds => write!(f, "no free local communication ids"),
            Self::Wire(e) => write!(f, "invalid message field: {e}"),
            Self::InvalidParam(p) => write!(f, "invalid parameter: {p}"),
        }
    }
}

impl std::error::Error for ProtoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Wire(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WireError> for ProtoError {
    fn from(e: WireError) -> Self {
        Self::Wire(e)
    }
}
