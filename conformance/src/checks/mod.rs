//! The checks, one `pub fn name<F: Fixture>(f: &F)` each. Every check
//! builds what it needs from a fresh fixture, verifies data byte for byte
//! and the completion fields, and waits only through the fixture's bounded
//! waits.

pub mod datagram;
pub mod errors;
pub mod flush;
pub mod objects;
pub mod ops;
pub mod qp_state;
