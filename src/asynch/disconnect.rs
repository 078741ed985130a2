//! [`Disconnect`]: end a connection and wait until its CEP is released.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use al::sync::Arc;
use al::{AlInstance, Handle, Result};
use cep::cm::{self, Cep};
use cep::proto::State;

use super::conn_shared::ConnShared;

/// Disconnect and wait until the CEP is released. Made by
/// [`Connection::disconnect`](super::Connection::disconnect).
///
/// The first poll sends the DREQ, unless the connection is already ending
/// (the peer's DREQ came first, or the connection is gone): then it only
/// waits. The future resolves when the CEP's last event, `Released`, has
/// come: the peer answered with a DREP (or the DREQ ran out of retries,
/// or both sides sent DREQ) and timewait is over; right after it the CM
/// destroys the CEP and unbinds the QP. With the CM's defaults timewait is
/// a few hundred milliseconds. A CEP destroyed meanwhile (AL close, QP
/// destroy) also counts as released.
///
/// A DREQ the CM refuses (private data longer than 220 bytes) fails the
/// future with that error; the CEP is then destroyed, which still sends a
/// DREQ, so nothing is left behind.
///
/// Dropping the future does not stop the disconnect: the CM finishes it
/// and releases the CEP on its own.
pub struct Disconnect {
    al: Arc<AlInstance>,
    cep: Handle<Cep>,
    shared: Arc<ConnShared>,
    /// The DREQ's private data, until the first poll.
    private_data: Option<Vec<u8>>,
}

impl Disconnect {
    pub(super) fn new(
        al: Arc<AlInstance>,
        cep: Handle<Cep>,
        shared: Arc<ConnShared>,
        private_data: &[u8],
    ) -> Self {
        Disconnect {
            al,
            cep,
            shared,
            private_data: Some(private_data.to_vec()),
        }
    }

    /// Whether the connection is ending already, as far as the protocol
    /// knows (the handler may not have seen the event yet), or gone.
    fn ending(&self) -> bool {
        match self.al.resolve(self.cep) {
            Ok(c) => matches!(
                c.protocol_state(),
                None | Some(State::DreqSent | State::DreqRcvd | State::Timewait)
            ),
            Err(_) => true,
        }
    }
}

impl Future for Disconnect {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(data) = this.private_data.take() {
            let quiet = {
                let st = this.shared.lock();
                st.disconnecting || st.released
            };
            if !quiet {
                if let Err(e) = cm::disconnect(&this.al, this.cep, &data) {
                    // Lost a race with the peer's DREQ (or the CEP's end):
                    // nothing to send, only the release to wait for.
                    if !this.ending() {
                        // Refused (e.g. private data too long): nobody
                        // holds the connection any more, so end it anyway
                        // (the CEP's teardown sends the DREQ).
                        let _ = this.al.destroy(this.cep, None);
                        return Poll::Ready(Err(e));
                    }
                }
            }
        }
        let mut st = this.shared.lock();
        if st.released {
            return Poll::Ready(Ok(()));
        }
        ConnShared::park(&mut st, cx);
        drop(st);
        // A passive CEP shares its listen's handler, so its destroy by
        // someone else wakes nobody; a poll at least notices.
        if this.al.resolve(this.cep).is_err() {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl fmt::Debug for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Disconnect")
            .field("cep", &self.cep)
            .finish()
    }
}
