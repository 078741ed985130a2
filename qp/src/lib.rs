//! Queue pairs: the QP object, the IBTA QP state machine and the
//! connection-id slot.
//!
//! Today this crate holds the [`cid::CidSlot`]; the QP object arrives with
//! the verbs layer.
#![forbid(unsafe_code)]

pub mod cid;

pub use cid::{CidSlot, CidState};
