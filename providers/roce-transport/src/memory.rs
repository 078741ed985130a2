//! The memory a transport reads and writes: a small trait the provider
//! implements over its registered memory regions.
//!
//! Local memory is named by scatter/gather lists of L_Keys ([`Sge`]);
//! remote requests name it by R_Key, virtual address and length. Every
//! method checks keys, bounds and rights and fails with a [`MemError`]
//! rather than touching memory it should not.

use provider::{Access, Sge, WcStatus};

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// The key names no region (or one of another protection domain).
    BadKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the right the access needs.
    NoAccess,
    /// The scatter list is shorter than the data.
    TooShort,
}

impl MemError {
    /// The completion status of a local access (an L_Key of this QP's work
    /// request) that failed this way.
    pub fn local_status(self) -> WcStatus {
        match self {
            MemError::TooShort => WcStatus::LocalLengthError,
            _ => WcStatus::LocalProtectionError,
        }
    }
}

/// The two 8-byte atomic operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Store `swap` if the target equals `compare`.
    CompareSwap {
        /// Compared with the target.
        compare: u64,
        /// Stored when equal.
        swap: u64,
    },
    /// Add `add` (wrapping).
    FetchAdd {
        /// The addend.
        add: u64,
    },
}

/// Registered memory as a transport sees it. The provider implements this
/// over its memory regions; tests use a map of byte vectors.
pub trait Memory {
    /// Checks that `sges` name local memory with the `need` rights (on top
    /// of local read) and returns their total length.
    fn check_local(&mut self, sges: &[Sge], need: Access) -> Result<u64, MemError>;

    /// A zeroed buffer of `len` bytes for one packet read from memory as it
    /// leaves (a long message's, a READ response's), which the packet's
    /// [`crate::Payload::Owned`] then carries to the driver. Default: a new
    /// allocation; a driver may hand out buffers of packets it has sent.
    fn packet_buffer(&mut self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    /// Copies `out.len()` bytes of the message `sges` describe, starting
    /// `offset` bytes into it, into `out`.
    fn gather(&mut self, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError>;

    /// Appends `len` bytes of the message `sges` describe, starting
    /// `offset` bytes into it, to `out` ([`Memory::gather`] without a
    /// buffer to zero first); on an error `out` is left as it was.
    fn gather_append(
        &mut self,
        sges: &[Sge],
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), MemError> {
        let start = out.len();
        out.resize(start + len, 0);
        let got = self.gather(sges, offset, &mut out[start..]);
        if got.is_err() {
            out.truncate(start);
        }
        got
    }

    /// Whether a leased message's packets may leave the transport as
    /// [`crate::Payload::Leased`], for the driver to read from memory
    /// straight into the datagram it encodes ([`crate::Leased::read_into`])
    /// rather than into a packet buffer the driver then copies again. The
    /// driver that says yes must read every such payload before it asks
    /// the transport for anything else, and report one it could not read
    /// ([`crate::Transport::leased_read_failed`]). Default: no.
    fn reads_as_encoded(&self) -> bool {
        false
    }

    /// Writes `data` into the message `sges` describe (which need
    /// LOCAL_WRITE), starting `offset` bytes into it. Fails with
    /// [`MemError::TooShort`] when the list ends first.
    fn scatter(&mut self, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), MemError>;

    /// Checks that `rkey` names a region granting `need` that holds
    /// `va .. va + len`.
    fn check_remote(&mut self, rkey: u32, va: u64, len: u64, need: Access) -> Result<(), MemError>;

    /// Writes `data` at `va` in the region of `rkey` (REMOTE_WRITE).
    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError>;

    /// Reads `out.len()` bytes at `va` in the region of `rkey` (REMOTE_READ).
    fn read_remote(&mut self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError>;

    /// Performs `op` on the 8 bytes at `va` in the region of `rkey`
    /// (REMOTE_ATOMIC; `va` is 8-byte aligned, the transport checked) and
    /// returns the value held before. The byte order of the target is the
    /// provider's (the host's, as hardware atomics use).
    fn atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Invalidates `rkey` (an incoming SEND with Invalidate).
    fn invalidate(&mut self, rkey: u32) -> Result<(), MemError>;

    /// Asks the memory to keep the bytes `sges` name for the transport
    /// until it gives them back ([`crate::Transport::poll_released`]), so
    /// that a long SEND or WRITE is read packet by packet as it is sent
    /// (and re-read for a retransmission) instead of copied whole at post.
    /// Returns whether it did; the default (`false`) keeps the copy at
    /// post. The memory should refuse the application's writes there
    /// meanwhile: the bytes are in flight, as on a hardware HCA.
    fn lease(&mut self, sges: &[Sge]) -> bool {
        let _ = sges;
        false
    }
}
