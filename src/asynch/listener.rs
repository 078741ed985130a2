//! [`Listener`]: a listen as a [`Stream`] of [`ConnectionRequest`]s.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::stream::{FusedStream, Stream};

use al::sync::Arc;
use al::{AlInstance, Handle, Result};
use cep::cm::{self, AcceptReply, Cep, CmHandler, Listen, ListenHandler};
use cep::proto::{Event, PeerAddr, SidrReplyParams};
use cep::wire::{RejectReason, SidrStatus};
use hca::verbs::Ca;
use qp::Qp;

use super::conn_shared::ConnShared;
use super::connect::Accept;
use super::listen_shared::{ListenShared, Passive};
use super::wake::park;

/// Held only by the listen's request handler, so it drops with the listen
/// object (destroyed by the stream's drop, the application or AL close):
/// the stream ends.
struct ListenGone(Arc<ListenShared>);

impl Drop for ListenGone {
    fn drop(&mut self) {
        self.0.wake(|st| st.gone = true);
    }
}

/// Held only by the CEP handler the listen's CEPs share, so it drops when
/// the listen and every one of its CEPs are gone (AL close at the latest):
/// whatever still waits on one of them is woken and finds it gone.
struct ConnsGone(Arc<ListenShared>);

impl Drop for ConnsGone {
    fn drop(&mut self) {
        let conns: Vec<_> = self.0.state.lock().conns.drain().collect();
        for (_, conn) in conns {
            conn.gone();
        }
    }
}

/// Listen on a service id; the connection requests come as a stream. Made
/// by [`listen_async`](super::AsyncCaMethods::listen_async).
///
/// Each REQ for the service becomes a [`ConnectionRequest`]: the new CEP
/// and the request, to [accept](ConnectionRequest::accept) or
/// [reject](ConnectionRequest::reject). Requests wait in the stream (the
/// CM's answer deadline still applies: one left too long is rejected with
/// a timeout by the CM). A SIDR request to the service is answered
/// "service id not supported": this listener serves connections.
///
/// The stream ends when the listen object is destroyed (by the
/// application or AL close). Dropping the stream stops listening: the
/// listen is destroyed and the requests it had queued are rejected
/// (their CEPs destroyed). Requests already handed out, and their
/// connections, are not affected.
pub struct Listener {
    al: Arc<AlInstance>,
    listen: Handle<Listen>,
    shared: Arc<ListenShared>,
}

impl Listener {
    pub(super) fn start(
        al: &Arc<AlInstance>,
        ca: Handle<Ca>,
        port: u8,
        service_id: u64,
    ) -> Result<Self> {
        let shared = Arc::new(ListenShared::default());
        let on_request = request_handler(al, ListenGone(shared.clone()));
        let handler = cep_handler(al, ConnsGone(shared.clone()));
        let listen = cm::listen(al, ca, port, service_id, on_request, handler)?;
        Ok(Listener {
            al: al.clone(),
            listen,
            shared,
        })
    }

    /// The listen's handle.
    pub fn handle(&self) -> Handle<Listen> {
        self.listen
    }
}

/// Queue each request for the stream (or refuse it once the stream is
/// dropped); answer a SIDR request at once.
fn request_handler(al: &Arc<AlInstance>, gone: ListenGone) -> ListenHandler {
    let al = al.clone();
    std::sync::Arc::new(move |_listen, cep, ev| {
        let shared = &gone.0;
        let peer_data = match ev {
            Event::ConnectRequest { req, .. } => req.private_data.as_bytes().to_vec(),
            _ => {
                let reply = SidrReplyParams {
                    status: SidrStatus::ServiceIdNotSupported,
                    ..SidrReplyParams::default()
                };
                if cm::sidr_reply(&al, cep, reply).is_err() {
                    let _ = al.destroy(cep, None);
                }
                return;
            }
        };
        let conn = Arc::new(ConnShared::default());
        conn.lock().peer_data = peer_data;
        let mut refused = false;
        shared.wake(|st| {
            if st.closed {
                refused = true;
            } else {
                st.conns.insert(cep, conn.clone());
                st.queue.push_back((cep, conn, ev.clone()));
            }
        });
        if refused {
            let _ = al.destroy(cep, None);
        }
    })
}

/// The handler every CEP of the listen shares: route each event to its
/// connection's state.
fn cep_handler(al: &Arc<AlInstance>, gone: ConnsGone) -> CmHandler {
    let al = al.clone();
    std::sync::Arc::new(move |cep, ev| {
        let shared = &gone.0;
        let Some(conn) = shared.conn(cep) else { return };
        conn.on_event(&al, cep, ev);
        if let Event::Released { .. } = ev {
            shared.state.lock().conns.remove(&cep);
        }
    })
}

impl Stream for Listener {
    type Item = ConnectionRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ConnectionRequest>> {
        let this = self.get_mut();
        let mut st = this.shared.state.lock();
        if let Some((cep, conn, event)) = st.queue.pop_front() {
            return Poll::Ready(Some(ConnectionRequest {
                al: this.al.clone(),
                cep: Some(cep),
                shared: conn,
                event,
                passive: Passive(this.shared.clone()),
            }));
        }
        if st.gone {
            return Poll::Ready(None);
        }
        park(&mut st.waker, cx);
        Poll::Pending
    }
}

impl FusedStream for Listener {
    fn is_terminated(&self) -> bool {
        let st = self.shared.state.lock();
        st.gone && st.queue.is_empty()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let queued: Vec<_> = {
            let mut st = self.shared.state.lock();
            st.closed = true;
            st.waker = None;
            st.queue.drain(..).collect()
        };
        let passive = Passive(self.shared.clone());
        for (cep, _, _) in queued {
            passive.destroy(&self.al, cep);
        }
        // Non-blocking; a listen already gone (AL close) is fine.
        let _ = self.al.destroy(self.listen, None);
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Listener")
            .field("listen", &self.listen)
            .field("queued", &st.queue.len())
            .field("tracked", &st.conns.len())
            .finish()
    }
}

/// A connection request a [`Listener`] received: the new CEP (in REQ_RCVD)
/// and the request event. Accept it ([`ConnectionRequest::accept`]) or
/// reject it ([`ConnectionRequest::reject`]); dropping it rejects it (the
/// CEP is destroyed, and its teardown sends the REJ).
pub struct ConnectionRequest {
    al: Arc<AlInstance>,
    cep: Option<Handle<Cep>>,
    shared: Arc<ConnShared>,
    event: Event,
    passive: Passive,
}

impl ConnectionRequest {
    /// The new CEP.
    pub fn cep(&self) -> Handle<Cep> {
        self.cep.expect("invariant: set until consumed or dropped")
    }

    /// The request event ([`Event::ConnectRequest`]: the REQ as received,
    /// the peer's port, the listener's id).
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The REQ's private data (its whole 92-byte area, padding included:
    /// the wire carries no length).
    pub fn private_data(&self) -> &[u8] {
        match &self.event {
            Event::ConnectRequest { req, .. } => req.private_data.as_bytes(),
            _ => &[],
        }
    }

    /// The port the request came from.
    pub fn peer(&self) -> Option<PeerAddr> {
        match &self.event {
            Event::ConnectRequest { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// The service id the REQ named.
    pub fn service_id(&self) -> u64 {
        match &self.event {
            Event::ConnectRequest { req, .. } => req.service_id,
            _ => 0,
        }
    }

    /// Accept on `qp` and wait until the connection is established (see
    /// [`Accept`]). Nothing is sent until the future is first polled.
    pub fn accept(mut self, qp: Handle<Qp>, reply: &AcceptReply) -> Accept {
        let cep = self
            .cep
            .take()
            .expect("invariant: set until consumed or dropped");
        let passive = Passive(self.passive.0.clone());
        Accept::new(
            self.al.clone(),
            cep,
            qp,
            reply,
            self.shared.clone(),
            passive,
        )
    }

    /// Reject the request with `reason` (and up to 148 bytes of private
    /// data). The CM releases the CEP after timewait. If the CM refuses
    /// the REJ (e.g. the private data is too long, or the request already
    /// ended), the CEP is destroyed instead, which rejects it all the same,
    /// and the error is returned.
    pub fn reject(mut self, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        let cep = self
            .cep
            .take()
            .expect("invariant: set until consumed or dropped");
        cm::reject(&self.al, cep, reason, private_data)
            .inspect_err(|_| self.passive.destroy(&self.al, cep))
    }

    /// Take the CEP over: dropping the returned handle rejects nothing.
    /// Answer it with the prelude's calls (`cep.accept(&al, ..)`,
    /// `cep.reject(&al, ..)`); its events keep going to this listener's
    /// handler, which answers a DREQ and releases the CEP's state when the
    /// CM releases the CEP.
    pub fn into_cep(mut self) -> Handle<Cep> {
        self.cep
            .take()
            .expect("invariant: set until consumed or dropped")
    }
}

impl Drop for ConnectionRequest {
    fn drop(&mut self) {
        if let Some(cep) = self.cep.take() {
            // Non-blocking; a CEP already gone (the peer gave up, AL
            // close) is fine.
            self.passive.destroy(&self.al, cep);
        }
    }
}

impl fmt::Debug for ConnectionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionRequest")
            .field("cep", &self.cep)
            .field("service_id", &format_args!("{:#x}", self.service_id()))
            .finish()
    }
}
