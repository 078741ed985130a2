//! [`Connection`], an established connection.

use std::fmt;

use al::sync::Arc;
use al::{AlInstance, Handle};
use cep::cm::{self, Cep};
use qp::Qp;

use super::conn_shared::ConnShared;
use super::disconnect::Disconnect;

/// An established connection, from [`Connect`](super::Connect) or
/// [`Accept`](super::Accept).
///
/// Its CEP answers a peer's DREQ by itself. [`Connection::disconnect`]
/// ends it and waits for the CEP to be released. Dropping it starts the
/// same disconnect without waiting (non-blocking; the CEP goes after
/// timewait); [`Connection::into_cep`] keeps the connection instead.
pub struct Connection {
    al: Arc<AlInstance>,
    cep: Option<Handle<Cep>>,
    qp: Handle<Qp>,
    shared: Arc<ConnShared>,
}

impl Connection {
    pub(super) fn new(
        al: Arc<AlInstance>,
        cep: Handle<Cep>,
        qp: Handle<Qp>,
        shared: Arc<ConnShared>,
    ) -> Self {
        Connection {
            al,
            cep: Some(cep),
            qp,
            shared,
        }
    }

    /// The connection's CEP.
    pub fn cep(&self) -> Handle<Cep> {
        self.cep.expect("invariant: set until into_cep or drop")
    }

    /// The connected QP.
    pub fn qp(&self) -> Handle<Qp> {
        self.qp
    }

    /// The peer's private data: the REP's on the active side, the REQ's on
    /// the passive side (the message's whole private data area, padding
    /// included: the wire carries no length).
    pub fn private_data(&self) -> Vec<u8> {
        self.shared.lock().peer_data.clone()
    }

    /// Whether a disconnect started (by either side) or the CEP is gone.
    pub fn is_disconnected(&self) -> bool {
        let st = self.shared.lock();
        st.disconnecting || st.released
    }

    /// Disconnect (DREQ with `private_data`, up to 220 bytes) and wait
    /// until the CEP is released: the peer answered (or the DREQ ran out of
    /// retries) and timewait is over. Nothing is sent until the future is
    /// first polled; if the peer disconnected first, the future only waits.
    pub fn disconnect(mut self, private_data: &[u8]) -> Disconnect {
        let cep = self
            .cep
            .take()
            .expect("invariant: set until into_cep or drop");
        Disconnect::new(self.al.clone(), cep, self.shared.clone(), private_data)
    }

    /// Stop managing the connection: dropping the returned handle does not
    /// disconnect. The CEP keeps answering a peer's DREQ, and is released
    /// by the CM when the connection ends (or destroyed by AL close).
    pub fn into_cep(mut self) -> Handle<Cep> {
        self.cep
            .take()
            .expect("invariant: set until into_cep or drop")
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(cep) = self.cep.take() {
            let st = self.shared.lock();
            let quiet = st.disconnecting || st.released;
            drop(st);
            if !quiet {
                // Non-blocking; a CEP already gone is not an error here.
                let _ = cm::disconnect(&self.al, cep, &[]);
            }
        }
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("cep", &self.cep)
            .field("qp", &self.qp)
            .finish()
    }
}
