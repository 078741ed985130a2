//! `ibal perf scale`: N RC connections established through the CM and
//! held, as a server holds its clients', and what they cost.
//!
//! Two ends (`end`): the active one connects (`active`), the listening
//! one creates a QP for each request in its listen callback and accepts
//! (`passive`). Both run in this process (`--processes 1`: two soft HCAs,
//! or two RoCEv2 devices on 127.0.0.1 and 127.0.0.2), or the listener runs
//! as a second `ibal` process over RoCEv2 on loopback (`--processes 2`,
//! `peer` and `listener`).
//!
//! The run (`run`):
//! 1. connects the first connection alone and measures a 64-byte SEND
//!    ping-pong on it (busy-polled at both ends) with N = 1;
//! 2. reads the resident memory of both processes, connects the other N - 1
//!    with at most `--in-flight` connects outstanding (each stamped from its
//!    `connect` call to its active `Established` event), and reads it again;
//! 3. measures the CPU time both processes use over `--idle` seconds with
//!    everything held, then the same ping-pong with N connections;
//! 4. disconnects all (DREQ to DREP) and closes both ALs, which must leave
//!    nothing live; or, with `--kill-listener`, kill -9s the listener and
//!    posts one SEND on every connection, each of which must end with an
//!    error within the transport's retry bound, then closes.
//!
//! Reported ([`report`]): connect latency and rate by decile of N (in
//! connect order), resident bytes per connection end, live objects by
//! kind, idle CPU, the two ping-pongs and their ratio, the teardown times
//! and what was left live. [`measure`] reads memory and CPU time.

mod active;
pub mod config;
mod end;
mod listener;
pub mod measure;
mod passive;
mod peer;
pub mod report;
mod run;

pub use config::{ScaleConfig, ScaleTransport};
pub use listener::run_listener;
pub use peer::{PeerClose, PeerReport};
pub use report::{Decile, KillReport, ScaleReport};
pub use run::run_scale;
