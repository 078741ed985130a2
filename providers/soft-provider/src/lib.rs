//! The soft provider: software HCAs on an in-process [`Fabric`], one of
//! the providers beneath the object layer (crate `hca` drives it through
//! its device enum, as it drives the RoCEv2 and rdma providers).
//!
//! * [`Fabric`] holds any number of [`SoftHca`]s (node GUID, ports, LIDs,
//!   GIDs, P_Keys from [`HcaConfig`]) and routes packets between their QPs
//!   by LID, or by GID when the address vector has a GRH.
//! * Delivery is synchronous: `post_send` performs the responder's work on
//!   the caller's thread, copying once from the source MR to the
//!   destination MR. RC is reliable and in order by construction; PSNs are
//!   still tracked and checked.
//! * With fault injection on ([`Fabric::set_faults`]), datagram (UD, GSI)
//!   and UC packets are queued and delivered by [`Fabric::progress`], with
//!   deterministic drop, duplicate, reorder and delay. RC is never subject
//!   to faults (the reliable model documented in `docs/soft-provider.md`).
//! * An RC send that meets an empty receive queue gets an RNR NAK and is
//!   retried on each `Fabric::progress` call, `rnr_retry` times (7 means
//!   forever), then completes with `RnrRetryExceeded`.
//! * A list of plain RC SENDs or RDMA WRITEs posted in one call runs as one
//!   batch (`fast.rs`): per-call work once, per-request work only the
//!   checks, the copy and the completions; anything else falls back to the
//!   general path request by request.
//!
//! The soft types also implement [`provider::Device`] and
//! [`provider::Provider`] ([`SoftProvider`]).
//!
//! [`packet`] is the wire form of the fabric's datagrams for capture tools
//! and [`erf`] writes them as an ERF file Wireshark reads.
//!
//! Design notes: `docs/soft-provider.md`.
#![deny(unsafe_code)]
#![cfg_attr(not(ibal_loom), deny(missing_docs))]

// Bottom to top: each module imports only modules listed before it.
mod config;
mod deferred;
mod identity;
mod stats;
mod trace;

mod cq;
mod queues;

mod mr;

mod hca_core;

mod qp;

mod node;

mod respond;

mod engine;

mod retry;

mod fast;

mod hca;

mod handles;
mod pd;
mod qp_handle;

mod device;

mod fabric;

pub mod erf;
pub mod packet;

pub use config::{CaptureTap, FaultConfig, HcaConfig, HcaLimits, PortConfig};
pub use device::SoftProvider;
pub use fabric::Fabric;
pub use handles::{SoftAv, SoftCq, SoftSrq};
pub use hca::SoftHca;
pub use hca_core::HcaUsage;
pub use pd::{SoftMr, SoftPd};
pub use qp_handle::SoftQp;
pub use stats::FabricStats;
