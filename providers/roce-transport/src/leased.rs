//! A packet's payload still in registered memory: what a leased message's
//! packet carries to a driver that reads it straight into the datagram it
//! encodes ([`crate::Memory::reads_as_encoded`]), and what the transport
//! does when that read fails.

use provider::{QpType, Sge};

use crate::memory::{MemError, Memory};
use crate::psn;
use crate::transport::{Transmit, Transport};
use crate::wqe::SgList;

/// `len` bytes of a leased message (the gather list its work request
/// named), `offset` bytes into it: a packet's payload not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    sges: SgList,
    offset: u64,
    len: usize,
}

impl Leased {
    pub(crate) fn new(sges: &[Sge], offset: u64, len: usize) -> Leased {
        Leased {
            sges: sges.iter().copied().collect(),
            offset,
            len,
        }
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the payload, read from `mem`, to `out` (left as it was on
    /// an error: the memory went away since the work request was posted).
    pub fn read_into(&self, mem: &mut impl Memory, out: &mut Vec<u8>) -> Result<(), MemError> {
        mem.gather_append(&self.sges, self.offset, self.len, out)
    }
}

impl<R: Clone> Transport<R> {
    /// The driver could not read the payload of `tx` (a
    /// [`crate::Payload::Leased`] packet [`Transport::poll_transmit`] just
    /// gave it) from memory: its MR was deregistered in between. The
    /// packet did not leave; its work request fails as one whose memory
    /// went away before its packet was built does (with `e`'s local
    /// status when it reaches the head of the queue, the QP then in
    /// error), and nothing after it is sent.
    pub fn leased_read_failed(&mut self, tx: &Transmit<R>, e: MemError) {
        if self.cfg.qp_type != QpType::Rc {
            return; // never given out: a datagram QP completes at send
        }
        let p = tx.headers.bth.psn;
        let Some(i) = self
            .sq
            .wqes
            .iter()
            .position(|w| w.leased && !w.needs_response() && w.contains(p))
        else {
            return;
        };
        let w = &mut self.sq.wqes[i];
        w.failed.get_or_insert(e.local_status());
        // Back to the packet that did not leave, as if it had not been
        // built: the requester stops at a failed request.
        self.sq.tx_idx = i;
        self.sq.tx_pkt = psn::diff(p, w.first_psn) as u32;
    }
}
