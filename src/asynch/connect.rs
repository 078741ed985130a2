//! [`Connect`] (active side) and [`Accept`] (passive side): futures that
//! resolve once the connection is established.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use al::sync::Arc;
use al::{AlInstance, Error, Handle, Kind, Result};
use cep::cm::{self, AcceptReply, Cep, ConnectRequest};
use cep::wire::PrivateData;
use qp::Qp;

use super::conn::Connection;
use super::conn_shared::{active_handler, ConnShared};
use super::listen_shared::Passive;

/// Where a connect or accept stands, seen by its future: established,
/// failed, or still waiting (the waker is then registered, under the same
/// lock the handler takes, so no wake-up is lost).
fn outcome(shared: &ConnShared, cx: &Context<'_>) -> Option<Result<(), (Error, bool)>> {
    let mut st = shared.lock();
    if st.established {
        return Some(Ok(()));
    }
    if let Some(e) = st.failed.take() {
        return Some(Err((e, st.cm_ends)));
    }
    ConnShared::park(&mut st, cx);
    None
}

/// Destroy a CEP whose future gave up on it (non-blocking; the teardown
/// sends the REJ or DREQ its state calls for). A CEP already gone is fine.
fn abandon(al: &AlInstance, cep: Handle<Cep>) {
    let _ = al.destroy(cep, None);
}

/// Connect a QP through the CM and wait until the connection is
/// established. Made by
/// [`connect_async`](super::AsyncQpMethods::connect_async).
///
/// The first poll sends the REQ (the errors of
/// [`cm::connect`](crate::cm::connect), such as a bad parameter or
/// [`Error::AlreadyConnected`], come out of that poll). When the REP
/// arrives the CEP's handler sends the RTU (with
/// [`Connect::rtu_private_data`]), and the future resolves on ESTABLISHED.
///
/// It fails with:
/// * [`Error::RemoteError`] when the peer rejects the REQ; the text names
///   the [`RejectReason`](crate::cm::wire::RejectReason) and its code, e.g.
///   `connection rejected by the peer: ConsumerReject (REJ reason 28) of
///   the Req`;
/// * [`Error::Timeout`] when the REQ ran out of retries unanswered;
/// * [`Error::Canceled`] when the CEP was destroyed meanwhile (QP destroy,
///   AL close).
///
/// After a REJ or a timeout the CM releases the CEP itself after timewait
/// (until then the QP cannot connect again: [`Error::QpInTimewait`]).
/// Dropping the future before it resolves destroys the CEP, which sends
/// the peer a REJ.
pub struct Connect {
    al: Arc<AlInstance>,
    qp: Handle<Qp>,
    /// The request, until the first poll sends it.
    request: Option<ConnectRequest>,
    shared: Arc<ConnShared>,
    /// The CEP, from the first poll until the future resolves.
    cep: Option<Handle<Cep>>,
}

impl Connect {
    pub(super) fn new(al: &Arc<AlInstance>, qp: Handle<Qp>, request: &ConnectRequest) -> Self {
        Connect {
            al: al.clone(),
            qp,
            request: Some(request.clone()),
            shared: Arc::new(ConnShared::default()),
            cep: None,
        }
    }

    /// Private data of the RTU sent when the REP arrives (up to 224
    /// bytes; a longer one fails the connect).
    pub fn rtu_private_data(self, data: &[u8]) -> Self {
        self.shared.lock().rtu_data = data.to_vec();
        self
    }
}

impl Future for Connect {
    type Output = Result<Connection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Connection>> {
        let this = self.get_mut();
        if let Some(request) = this.request.take() {
            let mut st = this.shared.lock();
            if let Err(e) = PrivateData::<224>::new(&st.rtu_data) {
                return Poll::Ready(Err(Error::invalid_parameter(format!("RTU {e}"))));
            }
            ConnShared::park(&mut st, cx);
            drop(st);
            let handler = active_handler(&this.al, &this.shared);
            match cm::connect(&this.al, this.qp, &request, handler) {
                Ok(cep) => this.cep = Some(cep),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let Some(cep) = this.cep else {
            return Poll::Ready(Err(Error::invalid_state(
                "this connect future already resolved",
            )));
        };
        match outcome(&this.shared, cx) {
            None => Poll::Pending,
            Some(Ok(())) => {
                this.cep = None;
                Poll::Ready(Ok(Connection::new(
                    this.al.clone(),
                    cep,
                    this.qp,
                    this.shared.clone(),
                )))
            }
            Some(Err((e, cm_ends))) => {
                this.cep = None;
                if !cm_ends {
                    abandon(&this.al, cep);
                }
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        if let Some(cep) = self.cep.take() {
            abandon(&self.al, cep);
        }
    }
}

impl fmt::Debug for Connect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connect")
            .field("qp", &self.qp)
            .field("cep", &self.cep)
            .finish()
    }
}

/// Accept a connection request on a QP and wait until the connection is
/// established (the peer's RTU arrived and the QP is in RTS). Made by
/// [`ConnectionRequest::accept`](super::ConnectionRequest::accept).
///
/// The first poll sends the REP ([`cm::accept`](crate::cm::accept)'s
/// errors come out of that poll; the CEP is then destroyed, which rejects
/// the request). It fails like [`Connect`]: [`Error::RemoteError`] with
/// the reason when the peer rejects the REP, [`Error::Timeout`] when no
/// RTU comes, [`Error::Canceled`] when the CEP goes meanwhile. Dropping it
/// before it resolves destroys the CEP, which sends the peer a REJ.
pub struct Accept {
    al: Arc<AlInstance>,
    cep: Option<Handle<Cep>>,
    qp: Handle<Qp>,
    /// The reply, until the first poll sends it.
    reply: Option<AcceptReply>,
    shared: Arc<ConnShared>,
    /// The listener's record of the CEP.
    passive: Passive,
}

impl Accept {
    pub(super) fn new(
        al: Arc<AlInstance>,
        cep: Handle<Cep>,
        qp: Handle<Qp>,
        reply: &AcceptReply,
        shared: Arc<ConnShared>,
        passive: Passive,
    ) -> Self {
        Accept {
            al,
            cep: Some(cep),
            qp,
            reply: Some(reply.clone()),
            shared,
            passive,
        }
    }
}

impl Future for Accept {
    type Output = Result<Connection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Connection>> {
        let this = self.get_mut();
        let Some(cep) = this.cep else {
            return Poll::Ready(Err(Error::invalid_state(
                "this accept future already resolved",
            )));
        };
        if let Some(reply) = this.reply.take() {
            ConnShared::park(&mut this.shared.lock(), cx);
            if let Err(e) = cm::accept(&this.al, cep, this.qp, &reply) {
                this.cep = None;
                // Unless the CEP is gone already, it still waits for an
                // answer: nobody else holds the request, so reject it.
                if e.is_gone(Kind::CEP) {
                    this.passive.forget(cep);
                } else {
                    this.passive.destroy(&this.al, cep);
                }
                return Poll::Ready(Err(e));
            }
        }
        match outcome(&this.shared, cx) {
            None => {
                // A passive CEP shares its listen's handler, so its destroy
                // by someone else wakes nobody; a poll at least notices.
                if this.al.resolve(cep).is_err() {
                    this.cep = None;
                    this.passive.forget(cep);
                    return Poll::Ready(Err(Error::Canceled(
                        "the connection endpoint was destroyed before the connection was \
                         established"
                            .into(),
                    )));
                }
                Poll::Pending
            }
            Some(Ok(())) => {
                this.cep = None;
                Poll::Ready(Ok(Connection::new(
                    this.al.clone(),
                    cep,
                    this.qp,
                    this.shared.clone(),
                )))
            }
            Some(Err((e, cm_ends))) => {
                this.cep = None;
                if !cm_ends {
                    this.passive.destroy(&this.al, cep);
                }
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Drop for Accept {
    fn drop(&mut self) {
        if let Some(cep) = self.cep.take() {
            self.passive.destroy(&self.al, cep);
        }
    }
}

impl fmt::Debug for Accept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accept")
            .field("cep", &self.cep)
            .field("qp", &self.qp)
            .finish()
    }
}
