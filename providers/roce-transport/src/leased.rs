//! A packet's payload still in registered memory: what a leased message's
//! packet carries to a driver that reads it straight into the datagram it
//! encodes ([`crate::Memory::reads_as_encoded`]; a read that fails is
//! [`crate::Transport::leased_read_failed`]).

use provider::Sge;

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
}
