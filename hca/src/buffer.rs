//! Memory that a memory region (MR) can name.
//!
//! The provider never hands out references into registered memory that
//! could outlive a lock, and never touches it without checking bounds, so
//! safe code cannot cause undefined behaviour through an MR even while a
//! remote RDMA WRITE lands in it:
//!
//! * [`RegisteredBuffer`]: memory the provider owns (a `Box<[u8]>` inside a
//!   reader-writer lock). Applications read and write it through
//!   [`RegisteredBuffer::read`], [`RegisteredBuffer::write`],
//!   [`RegisteredBuffer::with`] and [`RegisteredBuffer::with_mut`]; the
//!   provider takes the same lock for every DMA-like copy. This is the safe
//!   default.
//! * [`RawRegion`]: caller-managed memory for zero-copy users, built by the
//!   one `unsafe fn` of the crate ([`RawRegion::new`]), whose contract says
//!   what the caller promises. Everything unsafe lives in the `raw`
//!   submodule.
//!
//! Copies between two memories lock both in address order (the same memory
//! twice is one exclusive lock and `copy_within`), so two RDMA operations
//! moving data in opposite directions cannot deadlock.

mod raw;

use al::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use al::{Error, Result};

pub(crate) use raw::RawMemory;
pub use raw::RawRegion;

/// Backing store of registered memory.
pub(crate) enum Memory {
    Owned(RwLock<Box<[u8]>>),
    Raw(RawMemory),
}

impl Memory {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Memory::Owned(b) => b.read().len(),
            Memory::Raw(r) => r.len(),
        }
    }

    /// Shared access; `None` once a raw region is invalidated.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match self {
            Memory::Owned(b) => Some(f(&b.read())),
            Memory::Raw(r) => r.with(f),
        }
    }

    /// Exclusive access; `None` once a raw region is invalidated.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match self {
            Memory::Owned(b) => Some(f(&mut b.write())),
            Memory::Raw(r) => r.with_mut(f),
        }
    }

    /// Stop all further access (raw regions; a no-op for owned memory).
    /// When this returns no access is in progress.
    pub(crate) fn invalidate(&self) {
        if let Memory::Raw(r) = self {
            r.invalidate();
        }
    }

    fn addr(&self) -> usize {
        self as *const Memory as usize
    }

    /// Whether `self` is locked before `other` when a copy holds both: the
    /// one order every two-memory lock follows (address order).
    fn locks_before(&self, other: &Memory) -> bool {
        self.addr() < other.addr()
    }
}

/// Copy `len` bytes from `src[so..]` to `dst[d_off..]`. Ranges must have
/// been bounds-checked (a wrong range panics, it cannot corrupt memory).
/// Returns false when a raw region was invalidated.
pub(crate) fn copy(src: &Memory, so: usize, dst: &Memory, d_off: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    if std::ptr::eq(src, dst) {
        return dst
            .with_mut(|d| d.copy_within(so..so + len, d_off))
            .is_some();
    }
    let run = |s: &[u8], d: &mut [u8]| d[d_off..d_off + len].copy_from_slice(&s[so..so + len]);
    if src.locks_before(dst) {
        src.with(|s| dst.with_mut(|d| run(s, d)))
            .flatten()
            .is_some()
    } else {
        dst.with_mut(|d| src.with(|s| run(s, d)))
            .flatten()
            .is_some()
    }
}

/// Two owned memories locked for a series of copies from the first into
/// the second (the batched send path holds them across a run), taken in
/// the order [`copy`] takes them; one write lock when they are the same.
pub(crate) enum LockedPair<'m> {
    Same(RwLockWriteGuard<'m, Box<[u8]>>),
    Two(
        RwLockReadGuard<'m, Box<[u8]>>,
        RwLockWriteGuard<'m, Box<[u8]>>,
    ),
}

impl<'m> LockedPair<'m> {
    /// Lock `src` and `dst`; `None` unless both are owned memory (raw
    /// regions are copied one request at a time by [`copy`]).
    pub(crate) fn lock(src: &'m Memory, dst: &'m Memory) -> Option<LockedPair<'m>> {
        let (Memory::Owned(s), Memory::Owned(d)) = (src, dst) else {
            return None;
        };
        Some(if std::ptr::eq(src, dst) {
            LockedPair::Same(d.write())
        } else if src.locks_before(dst) {
            let s = s.read();
            LockedPair::Two(s, d.write())
        } else {
            let d = d.write();
            LockedPair::Two(s.read(), d)
        })
    }

    /// Copy `len` bytes from `src[so..]` to `dst[d_off..]`. Ranges must have
    /// been bounds-checked (a wrong range panics, it cannot corrupt memory).
    #[inline]
    pub(crate) fn copy(&mut self, so: usize, d_off: usize, len: usize) {
        match self {
            LockedPair::Same(m) => m.copy_within(so..so + len, d_off),
            LockedPair::Two(s, d) => d[d_off..d_off + len].copy_from_slice(&s[so..so + len]),
        }
    }
}

/// Provider-owned memory that can be registered as one or more MRs.
///
/// Cloning shares the memory. Every access is bounds-checked and goes
/// through the buffer's lock, which the provider also takes while it moves
/// data in or out (local work requests and remote RDMA alike).
///
/// Do not post work requests from inside [`with`](Self::with) or
/// [`with_mut`](Self::with_mut) closures on the same buffer: the provider
/// would wait for the lock the closure holds.
#[derive(Clone)]
pub struct RegisteredBuffer {
    pub(crate) mem: Arc<Memory>,
}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("len", &self.len())
            .finish()
    }
}

impl RegisteredBuffer {
    /// A zero-filled buffer of `len` bytes.
    pub fn new(len: usize) -> RegisteredBuffer {
        RegisteredBuffer::from_vec(vec![0; len])
    }

    /// A buffer holding `data`.
    pub fn from_vec(data: Vec<u8>) -> RegisteredBuffer {
        RegisteredBuffer {
            mem: Arc::new(Memory::Owned(RwLock::new(data.into_boxed_slice()))),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len())
            .ok_or_else(|| {
                Error::invalid_parameter(format!(
                    "range {offset}+{len} outside buffer of {} bytes",
                    self.len()
                ))
            })?;
        Ok(offset..end)
    }

    /// Copy `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.range(offset, out.len())?;
        self.with(|b| out.copy_from_slice(&b[r]));
        Ok(())
    }

    /// Copy `data` to `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.range(offset, data.len())?;
        self.with_mut(|b| b[r].copy_from_slice(data));
        Ok(())
    }

    /// Fill the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) {
        self.with_mut(|b| b.fill(byte));
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }

    /// Run `f` on the contents with shared access (RDMA into the buffer
    /// waits until `f` returns).
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &*self.mem {
            Memory::Owned(b) => f(&b.read()),
            Memory::Raw(_) => unreachable!("a RegisteredBuffer is always owned memory"),
        }
    }

    /// Run `f` on the contents with exclusive access.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &*self.mem {
            Memory::Owned(b) => f(&mut b.write()),
            Memory::Raw(_) => unreachable!("a RegisteredBuffer is always owned memory"),
        }
    }
}
