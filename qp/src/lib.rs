//! Queue pairs: the QP object over the verbs layer, and its
//! connection-id slot.
//!
//! * [`qp`]: the QP object (a child of its PD, bound to its CQs and SRQ),
//!   its state transitions and work-request front end.
//! * [`cid`]: the [`CidSlot`], the one atomic word through which connect,
//!   accept and destroy agree on the QP's connection endpoint.
#![forbid(unsafe_code)]

pub mod cid;
pub mod qp;

pub use cid::{CidSlot, CidState};
pub use qp::{create_qp, modify_qp, post_recv, post_send, query_qp, Qp, QpCreate};
