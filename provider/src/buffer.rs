//! Memory that a memory region (MR) can name.
//!
//! The provider never hands out references into registered memory that
//! could outlive a lock, and never touches it without checking bounds, so
//! safe code cannot cause undefined behaviour through an MR even while a
//! remote RDMA WRITE lands in it:
//!
//! * [`RegisteredBuffer`]: memory the provider owns (page-aligned bytes inside a
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

mod aligned;
mod in_flight;
mod raw;

use aligned::PageBytes;
pub use aligned::PAGE;

use al::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use al::{Error, Result};

use in_flight::InFlight;
use raw::RawMemory;
pub use raw::RawRegion;

/// Registered memory: its bytes, and what posted work requests still
/// name of them ([`InFlight`]).
pub struct Memory {
    store: Store,
    /// What posted work requests still name of it.
    pub in_flight: InFlight,
}

/// Where the bytes are.
enum Store {
    Owned(RwLock<PageBytes>),
    Raw(RawMemory),
}

impl Memory {
    fn new(store: Store) -> Memory {
        Memory {
            store,
            in_flight: InFlight::default(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Owned(b) => b.read().len(),
            Store::Raw(r) => r.len(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's own address for raw memory (its iova), `None` for
    /// owned memory.
    pub fn raw_addr(&self) -> Option<u64> {
        match &self.store {
            Store::Owned(_) => None,
            Store::Raw(r) => Some(r.base_addr()),
        }
    }

    /// Shared access; `None` once a raw region is invalidated.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match &self.store {
            Store::Owned(b) => Some(f(&b.read())),
            Store::Raw(r) => r.with(f),
        }
    }

    /// Exclusive access; `None` once a raw region is invalidated.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match &self.store {
            Store::Owned(b) => Some(f(&mut b.write())),
            Store::Raw(r) => r.with_mut(f),
        }
    }

    /// Stop all further access (raw regions; a no-op for owned memory).
    /// When this returns no access is in progress.
    pub fn invalidate(&self) {
        if let Store::Raw(r) = &self.store {
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
pub fn copy(src: &Memory, so: usize, dst: &Memory, d_off: usize, len: usize) -> bool {
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
pub enum LockedPair<'m> {
    /// The same memory: one write lock.
    Same(RwLockWriteGuard<'m, PageBytes>),
    /// Two memories: the source read-locked, the destination write-locked.
    Two(
        RwLockReadGuard<'m, PageBytes>,
        RwLockWriteGuard<'m, PageBytes>,
    ),
}

impl<'m> LockedPair<'m> {
    /// Lock `src` and `dst`; `None` unless both are owned memory (raw
    /// regions are copied one request at a time by [`copy`]).
    pub fn lock(src: &'m Memory, dst: &'m Memory) -> Option<LockedPair<'m>> {
        let (Store::Owned(s), Store::Owned(d)) = (&src.store, &dst.store) else {
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
    pub fn copy(&mut self, so: usize, d_off: usize, len: usize) {
        match self {
            LockedPair::Same(m) => m.copy_within(so..so + len, d_off),
            LockedPair::Two(s, d) => d[d_off..d_off + len].copy_from_slice(&s[so..so + len]),
        }
    }
}

/// Provider-owned memory that can be registered as one or more MRs: the
/// safe form of registration.
///
/// The library owns the bytes (an allocation that starts on a 4 KiB page
/// boundary and never moves or resizes: a real device registers an MR
/// only at an iova with the same offset in its page as the bytes, so an
/// MR from `offset` wants an iova with `offset`'s page offset) and every MR registered over them keeps them alive, so they cannot be
/// freed or moved while registered, whatever the application drops.
/// Cloning shares the memory. Every access is bounds-checked and goes
/// through the buffer's lock, which the provider also takes while it moves
/// data in or out (local work requests and remote RDMA alike), so no access
/// is ever a data race.
///
/// **In flight.** From the post of a local work request until it finishes
/// (its completion, or its flush), the bytes it names are leased: the
/// mutating accessors ([`write`](Self::write), [`fill`](Self::fill),
/// [`with_mut`](Self::with_mut), [`with_range_mut`](Self::with_range_mut))
/// refuse a range that overlaps a lease with `ResourceBusy` and change
/// nothing. Reading is always allowed. Bytes a peer may write by RDMA (an
/// rkey with remote write access) are not leased: that access is the
/// application's protocol with its peer, as in every verbs API.
///
/// A borrowed view cannot outlive its closure, so safe code cannot keep a
/// slice into memory the HCA is about to write:
///
/// ```compile_fail
/// use hca::RegisteredBuffer;
/// let buf = RegisteredBuffer::new(64);
/// let escaped: &mut [u8] = buf.with_mut(|b| b).unwrap();
/// ```
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
            .field("in_flight", &self.in_flight())
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
            mem: Arc::new(Memory::new(Store::Owned(RwLock::new(
                PageBytes::from_slice(&data),
            )))),
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

    /// How many posted work requests still name bytes of this buffer.
    pub fn in_flight(&self) -> usize {
        self.mem.in_flight.count()
    }

    /// Whether a posted work request still names any of `len` bytes from
    /// `offset` (a write there would be refused).
    pub fn is_in_flight(&self, offset: usize, len: usize) -> bool {
        self.mem
            .in_flight
            .overlapping(offset, offset.saturating_add(len))
            .is_some()
    }

    /// Copy `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.range(offset, out.len())?;
        self.with(|b| out.copy_from_slice(&b[r]));
        Ok(())
    }

    /// Copy `data` to `offset`. `ResourceBusy` (nothing written) if a
    /// posted work request still names any of those bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.with_range_mut(offset, data.len(), |b| b.copy_from_slice(data))
    }

    /// Fill the whole buffer with `byte`. `ResourceBusy` (nothing written)
    /// while any work request over the buffer is in flight.
    pub fn fill(&self, byte: u8) -> Result<()> {
        self.with_mut(|b| b.fill(byte))
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }

    /// Run `f` on the contents with shared access (RDMA into the buffer
    /// waits until `f` returns).
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &self.mem.store {
            Store::Owned(b) => f(&b.read()),
            Store::Raw(_) => unreachable!("a RegisteredBuffer is always owned memory"),
        }
    }

    /// Run `f` on the whole contents with exclusive access. `ResourceBusy`
    /// (and `f` does not run) while any work request over the buffer is
    /// in flight; [`with_range_mut`](Self::with_range_mut) takes only the
    /// bytes it needs.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.with_range_mut(0, self.len(), f)
    }

    /// Run `f` on `len` bytes from `offset` with exclusive access.
    /// `ResourceBusy` (and `f` does not run) if a posted work request still
    /// names any of them; `InvalidParameter` if the range is outside.
    pub fn with_range_mut<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let r = self.range(offset, len)?;
        self.mem.in_flight.check_writable(r.start, r.end)?;
        match &self.mem.store {
            Store::Owned(b) => Ok(f(&mut b.write()[r])),
            Store::Raw(_) => unreachable!("a RegisteredBuffer is always owned memory"),
        }
    }
}

/// What providers need of registered memory: its bytes, copies between
/// memories, and the in-flight record. Not for applications: the facade
/// does not re-export this module, so a program using `ibal` cannot name
/// it (`docs/memory.md`).
#[doc(hidden)]
pub mod for_providers {
    pub use super::in_flight::{InFlight, Lease, PostedQueue, Span};
    pub use super::raw::RawMemory;
    pub use super::{copy, LockedPair, Memory};
    use al::sync::Arc;

    /// The memory behind a buffer.
    pub fn memory_of(buf: &super::RegisteredBuffer) -> &Arc<Memory> {
        &buf.mem
    }

    /// The memory behind a caller-managed region.
    pub fn region_memory(region: &super::RawRegion) -> &Arc<Memory> {
        &region.mem
    }
}
