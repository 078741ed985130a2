//! Connection endpoint (CEP) support for the ibal connection manager.
//!
//! [`wire`] is the CM MAD codec: the eleven IBTA chapter 12 messages as typed
//! values, with validating, panic-free encode and decode.

#![forbid(unsafe_code)]

pub mod agent;
pub mod cm;
pub mod proto;
pub mod wire;
