//! Verbs providers for ibal: the provider interface the object layer calls,
//! and the embedded soft provider.
//!
//! * [`provider`]: the provider-neutral interface ([`provider::Provider`],
//!   [`provider::Device`]) and its data types: device and port attributes,
//!   work requests, completions, QP attributes.
//! * [`qp_state`]: the IBTA QP state machine as pure functions (reused by
//!   the `qp` crate).
//! * [`buffer`]: memory an MR can name: provider-owned
//!   [`RegisteredBuffer`]s (safe), and caller-managed [`RawRegion`]s (the
//!   crate's only `unsafe` API).
//! * [`soft`]: software HCAs on an in-process fabric, with fault injection.
//! * [`verbs`]: the verbs objects (CA, PD, CQ, MR, SRQ, AV) in the AL
//!   handle tables, with the common lifecycle.
//!
//! Design notes: `docs/soft-provider.md`.
#![deny(unsafe_code)]
#![cfg_attr(not(ibal_loom), deny(missing_docs))]

pub mod buffer;
pub mod erf;
pub mod packet;
pub mod provider;
pub mod qp_state;
pub mod soft;
pub mod verbs;

pub use buffer::{RawRegion, RegisteredBuffer};
pub use provider::*;
pub use soft::{
    Fabric, FabricStats, FaultConfig, HcaConfig, HcaLimits, HcaUsage, PortConfig, SoftAv, SoftCq,
    SoftHca, SoftMr, SoftPd, SoftProvider, SoftQp, SoftSrq,
};
