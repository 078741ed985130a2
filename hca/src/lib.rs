//! The embedded soft provider and the verbs object layer of ibal.
//!
//! * [`provider`], [`qp_state`], [`buffer`]: the provider interface, from
//!   the `provider` crate (re-exported under the paths it had when it lived
//!   here).
//! * [`soft`]: software HCAs on an in-process fabric, with fault injection.
//! * [`any`]: the device enum the object layer drives, over every
//!   built-in provider.
//! * [`verbs`]: the verbs objects (CA, PD, CQ, MR, SRQ, AV) in the AL
//!   handle tables, with the common lifecycle.
//!
//! Design notes: `docs/soft-provider.md`.
#![deny(unsafe_code)]
#![cfg_attr(not(ibal_loom), deny(missing_docs))]

pub mod any;
pub mod erf;
pub mod packet;
pub mod soft;
pub mod verbs;

/// The provider interface (crate `provider`), under its old path.
pub mod provider {
    pub use ::provider::*;
}
pub use ::provider::{buffer, qp_state};
pub use buffer::{RawRegion, RegisteredBuffer};
pub use provider::*;
pub use soft::{
    Fabric, FabricStats, FaultConfig, HcaConfig, HcaLimits, HcaUsage, PortConfig, SoftAv, SoftCq,
    SoftHca, SoftMr, SoftPd, SoftProvider, SoftQp, SoftSrq,
};
