//! Connection endpoint (CEP) support for the ibal connection manager.
//!
//! [`wire`] is the CM MAD codec: the eleven IBTA chapter 12 messages as typed
//! values, with validating, panic-free encode and decode.

// Every public item is documented. Checked in the normal build: under
// `--cfg ibal_loom`, `al::sync` swaps in the model checker's types.
#![cfg_attr(not(ibal_loom), deny(missing_docs))]
#![forbid(unsafe_code)]

pub mod agent;
pub mod cm;
pub mod ip;
mod keyed;
pub mod proto;
pub mod wire;
