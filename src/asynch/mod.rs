//! Futures and streams over the access layer's callbacks (feature `async`).
//!
//! Runtime-agnostic: nothing here spawns a thread or needs an executor of
//! its own. The AL's callbacks (a CQ's completion callback, a CEP's
//! [`CmHandler`](crate::cm::CmHandler), a listen's
//! [`ListenHandler`](crate::cm::ListenHandler)) fill a small shared state
//! and wake the task that waits on it; the task does the rest when it is
//! polled. Any executor works (`futures::executor::block_on`, smol, tokio,
//! ...), as long as the AL's own executor runs its callbacks: with
//! [`ExecutorMode::Thread`](crate::ExecutorMode::Thread) (the default) it
//! does so by itself; with `ExecutorMode::Manual` someone must call
//! `run_pending`, or nothing here ever wakes.
//!
//! | what | how | resolves / yields |
//! |---|---|---|
//! | [`AsyncCq`], [`CqStream`] | `ca.create_cq_async(&al, n)?`, then `cq.stream()?` | every [`Wc`](crate::verbs::Wc) in CQ order |
//! | [`Connect`] | `qp.connect_async(&al, &request).await` | a [`Connection`] once ESTABLISHED (the RTU is sent for you) |
//! | [`Listener`] | `ca.listen_async(&al, port, service)?` | one [`ConnectionRequest`] per REQ |
//! | [`Accept`] | `request.accept(qp, &reply).await` | a [`Connection`] once the RTU arrived |
//! | [`Disconnect`] | `connection.disconnect(b"bye").await` | `()` once the CEP is released (after timewait) |
//!
//! A REJ fails a connect or accept with [`Error::RemoteError`](crate::Error)
//! naming the reason (see [`Connect`]); a peer that never answers, with
//! [`Error::Timeout`](crate::Error).
//!
//! # Cancellation
//!
//! Dropping any of these cancels it and leaves nothing behind: a pending
//! [`Connect`] or [`Accept`] destroys its CEP (non-blocking; the teardown
//! sends the peer the REJ its state calls for), a [`ConnectionRequest`]
//! nobody answered is destroyed the same way, a dropped [`Listener`] stops
//! listening and refuses what it had queued, a dropped [`CqStream`]
//! unregisters its waker, and a dropped [`Connection`] starts a disconnect
//! (use [`Connection::into_cep`] to keep the connection past it). A dropped
//! [`Disconnect`] lets the CM finish on its own. `docs/async.md` has the
//! waker and arming rules.

use al::{AlInstance, Handle, Result};
use cep::cm::ConnectRequest;
use hca::verbs::Ca;
use qp::Qp;

use al::sync::Arc;

mod conn;
mod conn_shared;
mod connect;
mod cq;
mod disconnect;
mod listen_shared;
mod listener;
mod wake;

pub use conn::Connection;
pub use connect::{Accept, Connect};
pub use cq::{AsyncCq, CqStream};
pub use disconnect::Disconnect;
pub use listener::{ConnectionRequest, Listener};

/// The async calls of an open CA: a CQ that can be streamed, and a listen
/// that can be streamed.
pub trait AsyncCaMethods {
    /// A completion queue of `capacity` entries whose completion callback
    /// wakes a [`CqStream`] (see [`AsyncCq`]).
    fn create_cq_async(self, al: &Arc<AlInstance>, capacity: u32) -> Result<AsyncCq>;
    /// Listen for connection requests for `service_id` on `port`; the
    /// requests come as a [`Listener`] stream.
    fn listen_async(self, al: &Arc<AlInstance>, port: u8, service_id: u64) -> Result<Listener>;
}

impl AsyncCaMethods for Handle<Ca> {
    fn create_cq_async(self, al: &Arc<AlInstance>, capacity: u32) -> Result<AsyncCq> {
        AsyncCq::create(al, self, capacity)
    }
    fn listen_async(self, al: &Arc<AlInstance>, port: u8, service_id: u64) -> Result<Listener> {
        Listener::start(al, self, port, service_id)
    }
}

/// The async calls of a QP.
pub trait AsyncQpMethods {
    /// Connect (RC or UC) through the CM; the future resolves once the
    /// connection is established (see [`Connect`]). Nothing is sent until
    /// it is first polled.
    fn connect_async(self, al: &Arc<AlInstance>, request: &ConnectRequest) -> Connect;
}

impl AsyncQpMethods for Handle<Qp> {
    fn connect_async(self, al: &Arc<AlInstance>, request: &ConnectRequest) -> Connect {
        Connect::new(al, self, request)
    }
}
