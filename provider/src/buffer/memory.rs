//! Registered memory ([`Memory`]): where an MR's bytes are (provider-owned
//! pages or a caller's raw region), what posted work requests still name of
//! them, and copies between two memories, locked in address order.

use std::sync::atomic::{AtomicUsize, Ordering};

use al::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::aligned::PageBytes;
use super::in_flight::InFlight;
use super::raw::RawMemory;
use super::shared::{Exclusive, Shared};

/// Registered memory: its bytes, and what posted work requests still
/// name of them ([`InFlight`]).
pub struct Memory {
    pub(super) store: Store,
    len: usize,
    /// How many live device mappings ([`for_providers::DeviceMapping`])
    /// the memory has. Raised under the memory's write lock and read under
    /// its lock, so an access either sees it or finished before the device
    /// could touch the bytes. A `std` atomic even under loom: only the
    /// `rdma` provider (never in a loom model) changes it.
    pub(super) device_maps: AtomicUsize,
    /// What posted work requests still name of it.
    pub in_flight: InFlight,
}

/// Where the bytes are.
pub(super) enum Store {
    Owned(RwLock<PageBytes>),
    Raw(RawMemory),
}

impl Memory {
    pub(super) fn new(store: Store) -> Memory {
        let len = match &store {
            Store::Owned(b) => b.read().len(),
            Store::Raw(r) => r.len(),
        };
        Memory {
            store,
            len,
            device_maps: AtomicUsize::new(0),
            in_flight: InFlight::default(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's own address for raw memory (its iova), `None` for
    /// owned memory.
    pub fn raw_addr(&self) -> Option<u64> {
        match &self.store {
            Store::Owned(_) => None,
            Store::Raw(r) => Some(r.base_addr()),
        }
    }

    /// Whether a device maps the bytes now. Call with the memory's lock
    /// held (see `device_maps`).
    pub(super) fn device_mapped(&self) -> bool {
        self.device_maps.load(Ordering::Acquire) != 0
    }

    /// The bytes under the read lock; `None` once a raw region is
    /// invalidated.
    pub(super) fn shared<R>(&self, f: impl FnOnce(Shared<'_>) -> R) -> Option<R> {
        match &self.store {
            Store::Owned(b) => {
                let g = b.read();
                Some(f(g.shared(self.device_mapped())))
            }
            Store::Raw(r) => r.with_shared(|| self.device_mapped(), f),
        }
    }

    /// The bytes under the write lock; `None` once a raw region is
    /// invalidated.
    pub(super) fn exclusive<R>(&self, f: impl FnOnce(Exclusive<'_>) -> R) -> Option<R> {
        match &self.store {
            Store::Owned(b) => {
                let mut g = b.write();
                let device = self.device_mapped();
                Some(f(g.exclusive(device)))
            }
            Store::Raw(r) => r.with_exclusive(|| self.device_mapped(), f),
        }
    }

    /// Shared access; `None` once a raw region is invalidated. While a
    /// device maps the memory, `f` gets a copy of the bytes (read with
    /// volatile loads), not the bytes themselves.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.shared(|s| s.view(f))
    }

    /// Exclusive access; `None` once a raw region is invalidated. While a
    /// device maps the memory, `f` works on a copy and the bytes it changed
    /// (only those) are stored back with volatile stores.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let len = self.len;
        self.exclusive(|mut e| e.view_mut(0, len, f))
    }

    /// Stop all further access (raw regions; a no-op for owned memory).
    /// When this returns no access is in progress.
    pub fn invalidate(&self) {
        if let Store::Raw(r) = &self.store {
            r.invalidate();
        }
    }

    pub(super) fn addr(&self) -> usize {
        self as *const Memory as usize
    }

    /// Whether `self` is locked before `other` when a copy holds both: the
    /// one order every two-memory lock follows (address order).
    pub(super) fn locks_before(&self, other: &Memory) -> bool {
        self.addr() < other.addr()
    }
}

/// Copy `len` bytes from `src[so..]` to `dst[d_off..]`. Ranges must have
/// been bounds-checked (a wrong range panics, it cannot corrupt memory).
/// Returns false when a raw region was invalidated. Volatile when either
/// memory is mapped by a device.
pub fn copy(src: &Memory, so: usize, dst: &Memory, d_off: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    if std::ptr::eq(src, dst) {
        return dst
            .exclusive(|mut d| d.copy_within(so, d_off, len))
            .is_some();
    }
    let run = |s: Shared<'_>, mut d: Exclusive<'_>| super::shared::copy(&s, so, &mut d, d_off, len);
    if src.locks_before(dst) {
        src.shared(|s| dst.exclusive(|d| run(s, d)))
            .flatten()
            .is_some()
    } else {
        dst.exclusive(|d| src.shared(|s| run(s, d)))
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
    /// Lock `src` and `dst`; `None` unless both are owned memory that no
    /// device maps (raw regions and device-mapped memory are copied one
    /// request at a time by [`copy`]).
    pub fn lock(src: &'m Memory, dst: &'m Memory) -> Option<LockedPair<'m>> {
        let (Store::Owned(s), Store::Owned(d)) = (&src.store, &dst.store) else {
            return None;
        };
        let pair = if std::ptr::eq(src, dst) {
            LockedPair::Same(d.write())
        } else if src.locks_before(dst) {
            let s = s.read();
            LockedPair::Two(s, d.write())
        } else {
            let d = d.write();
            LockedPair::Two(s.read(), d)
        };
        // Under both locks: a mapping cannot appear while they are held.
        if src.device_mapped() || dst.device_mapped() {
            return None;
        }
        Some(pair)
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
