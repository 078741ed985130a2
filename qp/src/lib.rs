//! Queue pairs: the QP object over the verbs layer, and its
//! connection-id slot.
//!
//! * [`qp`]: the QP object (a child of its PD, bound to its CQs and SRQ),
//!   its state transitions and work-request front end.
//! * [`cid`]: the [`CidSlot`], the one atomic word through which connect,
//!   accept and destroy agree on the QP's connection endpoint.
// Every public item is documented. Checked in the normal build: under
// `--cfg ibal_loom`, `al::sync` swaps in the model checker's types.
#![cfg_attr(not(ibal_loom), deny(missing_docs))]
#![forbid(unsafe_code)]

pub mod cid;
pub mod qp;
mod trace;

pub use cid::{CidSlot, CidState};
pub use qp::{create_qp, modify_qp, post_recv, post_send, query_qp, Qp, QpCreate};
