//! Connection endpoints (CEPs) and listens as access-layer objects.
//!
//! This is the user-facing connection manager: `listen`, `connect`,
//! `accept`, `rtu`, `reject`, `mra`, `disconnect`, `disconnect_reply`,
//! `lap`, `apr`, SIDR, and destroy through `al.destroy`. Underneath, one
//! [`CmAgent`] per device port (shared by every AL instance of the process)
//! runs the protocol on QP1.
//!
//! * A CEP is a top-level object of its AL (AL close reclaims it after its
//!   teardown sent the REJ or DREQ its state calls for).
//! * A CEP is bound to its QP only through the QP's [`qp::CidSlot`], with
//!   the protocol of [`qp::cid`]: connecting or accepting on a bound
//!   QP fails (`AlreadyConnected`, or `QpInTimewait` while the old
//!   connection is in timewait) and leaks nothing; connect or accept racing
//!   QP destroy has one winner and the loser's CEP is destroyed; QP destroy
//!   destroys the bound CEP; when a connection ends (rejected, timed out,
//!   disconnected and out of timewait) the CEP is unbound and destroyed.
//! * A CM-only CEP ([`connect_unbound`], [`accept_unbound`]) is bound to no
//!   QP: the consumer gives its QP's number and PSN as [`LocalQpAttrs`],
//!   moves the QP itself from [`ConnectionAttrs`] ([`accept_attrs`],
//!   [`connection_attrs`]), and moves it to ERR when the connection ends.
//!   The rest (events, RTU, disconnect, destroy, AL close) is the bound
//!   CEP's code (`docs/cm.md`, "CM-only CEPs").
//! * Events reach the user on the AL executor, in order per CEP, with a
//!   reference to the CEP held across the callback. Protocol reactions that
//!   touch the QP (passive side to RTS when established, QP to ERR when the
//!   connection ends) run in the same job, just before the callback.
//!
//! One job per file, layered (each imports only the ones above it):
//!
//! | file | job |
//! |---|---|
//! | `attrs.rs` | the QP attributes of a connection (RTR, RTS, [`LocalQpAttrs`], [`ConnectionAttrs`]), the IBTA bounds, the QP moves to INIT and back |
//! | `routes.rs` | the table from connection id to object |
//! | `port.rs` | the port agents of the process ([`PortCm`], [`CmDrive`]) |
//! | `objects.rs` | [`Cep`] and [`Listen`]: state, teardown, reactions |
//! | `dispatch.rs` | events from a port's agent to its objects |
//! | `attach.rs` | [`CmPort`]: a port's CM kept running, [`poll`] |
//! | `listen.rs` | [`listen`] |
//! | `connect.rs` | [`ConnectRequest`], [`connect`], [`connect_unbound`] |
//! | `accept.rs` | [`AcceptReply`], [`accept`], [`accept_unbound`], [`accept_attrs`] |
//! | `calls.rs` | [`rtu`], [`reject`], [`mra`], [`disconnect`], [`disconnect_reply`], [`lap`], [`apr`], [`connection_attrs`] |
//! | `sidr.rs` | [`sidr_request`], [`sidr_reply`] |
//! | `ready.rs` | [`ready_for_connection`]: a QP in INIT before its connection, receives posted first |
//!
//! The StartingPSN seed is [`starting_psn`] (`crate::keyed`).
//!
//! Lock order: CEP state -> port routes -> (agent endpoint, executor queue).
//! The agent delivers events with none of its locks held; the event sink
//! takes only the routes lock, and never calls the agent while holding it.
//!
//! [`CmAgent`]: crate::agent::CmAgent

mod accept;
mod attach;
mod attrs;
mod calls;
mod connect;
mod dispatch;
mod footprint;
mod listen;
mod objects;
mod port;
mod ready;
mod routes;
mod sidr;

pub use crate::keyed::starting_psn;
pub use accept::{accept, accept_attrs, accept_unbound, AcceptReply};
pub use attach::{attach_ca, attach_ca_with, poll, CmPort};
pub use attrs::{
    qp_to_init, restore_qp, rtr_attrs, rts_attrs, ConnectionAttrs, LocalQpAttrs, PathEnd,
};
pub use calls::{apr, connection_attrs, disconnect, disconnect_reply, lap, mra, reject, rtu};
pub use connect::{connect, connect_unbound, ConnectRequest};
pub use footprint::{cep_footprint, CepFootprint};
pub use listen::{listen, set_backlog};
pub use objects::{Cep, CmHandler, Listen, ListenHandler};
pub use port::{active_ports, CmDrive, PortCm};
pub use ready::{ready_for_connection, READY_ACCESS};
pub use sidr::{sidr_reply, sidr_request};
