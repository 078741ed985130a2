//! The verbs provider interface of ibal: what the object layer calls and
//! every provider implements, with no provider in it.
//!
//! * The crate root: the provider-neutral interface ([`Provider`],
//!   [`Device`]) and its data types: device and port attributes, work
//!   requests, completions, QP attributes.
//! * [`qp_state`]: the IBTA QP state machine as pure functions (reused by
//!   the `qp` crate and by every provider).
//! * [`buffer`]: memory an MR can name: provider-owned
//!   [`RegisteredBuffer`]s (safe) and caller-managed [`RawRegion`]s (the
//!   crate's only `unsafe` API), and, for providers only, the access,
//!   copy and in-flight machinery behind them ([`buffer::for_providers`]).
//! * [`trace`]: how QPNs and GIDs read in the library's `tracing` events.
//!
//! Providers live beside this crate (the soft provider in `hca`), so that
//! a provider never depends on another and the object layer can choose
//! among them (`docs/verbs.md`).
#![deny(unsafe_code)]
#![cfg_attr(not(ibal_loom), deny(missing_docs))]

mod attrs;
pub mod buffer;
mod device;
mod grh;
mod qp_attr;
pub mod qp_state;
pub mod trace;
mod work;

pub use attrs::*;
pub use buffer::{RawRegion, RegisteredBuffer};
pub use device::*;
pub use grh::ReceivedHeader;
pub use qp_attr::*;
pub use work::*;
