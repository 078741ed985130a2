//! CEPs backed by librdmacm, for CAs of the `rdma` provider (real
//! InfiniBand HCAs, RoCE NICs, Linux rxe/siw), where QP1 belongs to the
//! kernel and the project's own CM agent cannot run.
//!
//! The rdma_cm ids are created **without a QP**: `rdma_connect` and
//! `rdma_accept` name the ibal QP by number (`conn_param.qp_num`), and the
//! CEP moves the QP itself with the attributes `rdma_init_qp_attr` gives,
//! as a CM-only CEP's consumer does (`docs/cm.md`). So the QP stays the
//! provider's ibal QP, bound to its CEP through the same CID slot, and
//! the object model is unchanged:
//!
//! * `RdmaCep` and `RdmaListen` are objects of their AL's handle
//!   table (kinds `RDMA_CEP` and `RDMA_LISTEN`), destroyed without blocking, with one
//!   destroy callback, and reclaimed by AL close (their teardown destroys
//!   the rdma_cm id: the kernel sends the REJ or DREQ the state calls
//!   for);
//! * `connect` and `accept` bind the CEP into the QP's CID slot with
//!   `qp::cid` (connect or accept on a bound QP fails and leaks nothing,
//!   QP destroy destroys the bound CEP, `Released` unbinds it);
//! * the application hears the same `Event`s as from the project's CM,
//!   on the AL executor, in order, one at a time, `Released` last.
//!
//! Addressing is by IP as in [`cep::ip`]: `connect` takes the same
//! `IpConnect`, `listen` the same address and port space, and a
//! listener reads a request with [`cep::ip::request_info`]. What differs
//! from the project's CM (no MRA, LAP, SIDR, CM-only use, choice of REJ
//! reason or RTU private data; rdma_cm's own timers) is listed in
//! `docs/rdma-provider.md`, "Connections".
//!
//! [`translate`] is the device-free half (states and event translation),
//! compiled without the `rdma` feature too.
//!
//! This is a crate of its own, above `cep` and beside it, so that the
//! connection manager depends on the object layer only and names no
//! provider: only these CEPs know the `rdma` provider (and its rdma_cm
//! ids). The facade's `rdma` feature turns on this crate's (`ibal::rdma::cm`
//! re-exports it).

// Every public item is documented (as in `cep`: under `--cfg ibal_loom`,
// `al::sync` swaps in the model checker's types).
#![cfg_attr(not(ibal_loom), deny(missing_docs))]
#![forbid(unsafe_code)]

pub mod translate;

#[cfg(feature = "rdma")]
mod objects;
#[cfg(feature = "rdma")]
pub use objects::*;
