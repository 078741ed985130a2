//! The verbs object layer of ibal, above every provider.
//!
//! * [`any`]: the device enum the object layer drives, over every
//!   built-in provider.
//! * [`verbs`]: the verbs objects (CA, PD, CQ, MR, SRQ, AV) in the AL
//!   handle tables, with the common lifecycle.
//!
//! The providers sit beneath this crate, side by side (`providers/`):
//! it knows each only through [`any`]. Design notes: `docs/architecture.md`.
#![deny(unsafe_code)]
#![cfg_attr(not(ibal_loom), deny(missing_docs))]

pub mod any;
pub mod verbs;
