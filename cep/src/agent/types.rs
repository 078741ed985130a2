//! The values the agent's API takes and gives: where events go
//! ([`EventSink`], [`Delivery`]), its settings ([`AgentConfig`]), its
//! counters ([`AgentStats`]) and what one poll did ([`PollOutcome`]).

use crate::proto::{ConnId, Event, IdKey, Nanos, Resends};

/// Where events go: called once per event, in order, with no agent lock
/// held. It may call any agent method, but must not own the agent: what it
/// needs of the agent for an event it cannot place, it asks for in its
/// [`Delivery`] answer, so no reference cycle and no `Weak` is needed.
///
/// (A `std` `Arc` of a closure: loom's `Arc` cannot hold a `dyn Fn`, and an
/// immutable closure box carries no state the modelled races are about.)
pub type EventSink = std::sync::Arc<dyn Fn(Event) -> Delivery + Send + Sync>;

/// What an [`EventSink`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Taken (or deliberately dropped).
    Taken,
    /// A connection or SIDR request that nobody will answer (its listener
    /// is going): the agent rejects it at once (REJ with reason
    /// NoResources) rather than leave the peer to time out.
    Refuse(ConnId),
}

/// Settings of one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// P_Key index every MAD is sent with (and QP1's own index).
    pub pkey_index: u16,
    /// Receive buffers posted on QP1.
    pub recv_buffers: u32,
    /// Send buffers (the most MADs in flight before the rest wait).
    pub send_buffers: u32,
    /// Overrides the comm id key ([`EndpointConfig::id_key`]), which is
    /// otherwise drawn from the operating system for every agent, so that
    /// no two agents (of one port, one process or two processes with the
    /// same CA GUID) share ids, and no id tells a stranger anything about
    /// another. For reproducible tests only: a known key makes every id
    /// predictable.
    ///
    /// [`EndpointConfig::id_key`]: crate::proto::EndpointConfig::id_key
    pub id_key: Option<IdKey>,
    /// Overrides [`EndpointConfig::max_ceps`].
    ///
    /// [`EndpointConfig::max_ceps`]: crate::proto::EndpointConfig::max_ceps
    pub max_ceps: Option<u32>,
    /// The most requests (REQ, DREQ, LAP, SIDR_REQ) on the wire at once
    /// awaiting their answer; more wait in the endpoint and go out as
    /// answers come ([`EndpointConfig::request_window`]). At least 1.
    ///
    /// [`EndpointConfig::request_window`]: crate::proto::EndpointConfig::request_window
    pub request_window: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            pkey_index: 0,
            // A burst of MADs lands in QP1's receive queue while the agent
            // is not running (its lock held by another thread, its thread
            // not scheduled), and what finds no buffer is dropped unseen:
            // 10,000 connects at once to one listen dropped 100-8,600
            // MADs with 512 buffers (Linux's MAD layer default) and none
            // with 4096 (tests/cm_burst.rs). 1.2 MB per port
            // (docs/cm-agent.md, "Bursts").
            recv_buffers: 4096,
            send_buffers: 128,
            id_key: None,
            max_ceps: None,
            // A quarter of a peer agent's receive buffers: four senders
            // bursting at once cannot overflow one receiver
            // (docs/cm-agent.md, "Bursts").
            request_window: crate::proto::DEFAULT_REQUEST_WINDOW,
        }
    }
}

/// Counters of one agent ([`CmAgent::stats`]).
///
/// [`CmAgent::stats`]: super::CmAgent::stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// MADs posted on QP1.
    pub mads_sent: u64,
    /// MADs that arrived on QP1 (including the malformed and ignored ones).
    /// MADs failing the P_Key or Q_Key check never arrive: the provider
    /// drops and counts them (soft: `Fabric::stats().dropped_pkey` and
    /// `dropped_qkey`).
    pub mads_received: u64,
    /// Arrived but did not decode as a CM MAD (dropped).
    pub dropped_malformed: u64,
    /// Decoded, but the endpoint ignored them (`Disposition::Ignored`).
    pub ignored: u64,
    /// Named one of this agent's connections (by its comm id, or its
    /// remote comm id, QPN and CA GUID) but came from another address than
    /// the connection's peer (on RoCE its GID, on InfiniBand its LID and
    /// GID): handled as naming no connection, so nothing changed and the
    /// sender learnt nothing ([`Endpoint::not_from_peer`]). Linux's CM has
    /// no such check. Some of these are also counted in `ignored`.
    ///
    /// [`Endpoint::not_from_peer`]: crate::proto::Endpoint::not_from_peer
    pub not_from_peer: u64,
    /// MADs that could not be encoded or posted, or whose send completed in
    /// error (each is lost; the CM retries).
    pub send_errors: u64,
    /// Receive completions in error (including flushes at shutdown).
    pub recv_errors: u64,
    /// MADs waiting for a free send buffer.
    pub send_backlog: usize,
    /// Sends posted and not yet completed.
    pub sends_outstanding: usize,
    /// Connection CEPs in the endpoint ([`Endpoint::live_connections`]).
    ///
    /// [`Endpoint::live_connections`]: crate::proto::Endpoint::live_connections
    pub live_connections: usize,
    /// Local comm ids allocated ([`Endpoint::allocated_ids`]).
    ///
    /// [`Endpoint::allocated_ids`]: crate::proto::Endpoint::allocated_ids
    pub allocated_ids: usize,
    /// Thread mode: rounds served inline by the thread that delivered a
    /// MAD, instead of by a woken agent thread.
    pub served_inline: u64,
    /// Thread mode: rounds the agent thread ran (woken by a kick or its
    /// next deadline). With nothing armed it sleeps until kicked: an idle
    /// agent adds none.
    pub thread_rounds: u64,
    /// Requests the endpoint sent again ([`Endpoint::resends`]): a burst
    /// the port absorbed and answered in time costs none.
    ///
    /// [`Endpoint::resends`]: crate::proto::Endpoint::resends
    pub resends: Resends,
    /// Requests that had to wait for the request window before they were
    /// sent ([`Endpoint::requests_queued`]): a burst larger than the window
    /// (100,000 disconnects at once) counts all but the window.
    ///
    /// [`Endpoint::requests_queued`]: crate::proto::Endpoint::requests_queued
    pub requests_queued: u64,
    /// Requests waiting for the window now.
    pub requests_waiting: usize,
    /// Requests on the wire awaiting their answer now (at most the window).
    pub requests_in_flight: u32,
}

impl AgentStats {
    /// MADs the agent dropped after they reached QP1 (malformed).
    pub fn dropped(&self) -> u64 {
        self.dropped_malformed
    }
}

/// What one [`CmAgent::poll`] did.
///
/// [`CmAgent::poll`]: super::CmAgent::poll
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    /// MADs taken from QP1 and handed to the endpoint.
    pub received: usize,
    /// Whether due timers were fired.
    pub timers_fired: bool,
    /// The endpoint's next deadline after this poll.
    pub next_timeout: Option<Nanos>,
}
