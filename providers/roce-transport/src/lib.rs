//! A sans-IO RoCEv2 transport core, one [`Transport`] per queue pair: the
//! requester, responder and completer state machines of IBTA vol. 1
//! chapter 9 for RC, UC and UD, driven by work requests, decoded packets
//! and "now is T", producing packets to send, a deadline and completions.
//!
//! No sockets, threads or clocks: the driver (a UDP provider) owns those,
//! as `quinn-proto` leaves them to `quinn`. Memory is reached through the
//! [`Memory`] trait the provider implements over its memory regions.
//!
//! A datagram reaches a transport only through the receive stage
//! ([`receive()`]: shape, destination QP on this port, opcode, state, keys,
//! the connection's addresses, ICRC), which touches no transport state.
//!
//! ```text
//! post_send / post_recv ─┐                       ┌─> poll_transmit(now) -> Transmit
//! handle_packet(now, ..) ├─> Transport (per QP) ─┼─> poll_timeout()    -> deadline
//! handle_timeout(now)    ┘                       └─> poll_completion() -> Wc
//! ```
//!
//! See `docs/roce-transport.md` for the state machines and the rules.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod completer;
mod config;
#[doc(hidden)]
pub mod fuzzing;
mod leased;
mod memory;
pub mod psn;
pub mod receive;
mod requester;
mod responder;
pub mod timers;
mod trace;
mod transport;
mod wqe;

pub use completer::RNR_RETRY_INFINITE;
pub use config::{Config, Error};
pub use leased::{Leased, LeasedEncodeError};
pub use memory::{AtomicOp, MemError, Memory};
pub use receive::{
    admit, pkey_match, receive, receive_segment, Accepted, Discard, PathGids, Port, QpFilter,
    SolverGate,
};
pub use requester::{
    max_unacked_psns, ACKREQ_EVERY, MAX_UNACKED_BYTES, MAX_UNACKED_PSNS, SEND_WINDOW_PSNS,
};
pub use responder::grh_bytes;
pub use transport::{Counters, Payload, Source, Transmit, Transport, LEASE_MIN};

/// Largest message (2^31 bytes, IBTA's limit for a RETH DMA length).
pub const MAX_MSG: u32 = 1 << 31;
