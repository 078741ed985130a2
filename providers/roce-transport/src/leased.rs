//! A packet's payload still in registered memory: what a leased message's
//! packet carries to a driver that reads it straight into the datagram it
//! encodes ([`crate::Memory::reads_as_encoded`]; a read that fails is
//! [`crate::Transport::leased_read_failed`]).

use provider::Sge;
use roce::{EncodeError, Endpoints, Headers};

use crate::memory::{MemError, Memory};
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

    /// Appends to `out` the UDP payload (BTH .. payload, pad, ICRC) of the
    /// packet with `headers` carrying these bytes, read from `mem` straight
    /// into `out` (`roce::encode_append_filled`), for the flow
    /// `endpoints`; returns its length. On an error `out` is left as it
    /// was: [`LeasedEncodeError::Memory`] is for the transport
    /// ([`crate::Transport::leased_read_failed`]).
    pub fn encode_append(
        &self,
        headers: Headers,
        endpoints: &Endpoints,
        mem: &mut impl Memory,
        out: &mut Vec<u8>,
    ) -> Result<usize, LeasedEncodeError> {
        roce::encode_append_filled(headers, self.len, endpoints, out, |out| {
            self.read_into(mem, out).map_err(LeasedEncodeError::Memory)
        })
    }
}

/// Why [`Leased::encode_append`] encoded nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasedEncodeError {
    /// The payload could not be read: its memory went away.
    Memory(MemError),
    /// The packet does not encode (its headers: a transport bug).
    Encode(EncodeError),
}

impl From<EncodeError> for LeasedEncodeError {
    fn from(e: EncodeError) -> LeasedEncodeError {
        LeasedEncodeError::Encode(e)
    }
}
