//! Caller-managed memory: the only module of the crate with `unsafe` code.
//!
//! A [`RawRegion`] is a pointer and a length the caller vouches for (see
//! [`RawRegion::new`]). The provider accesses it only through
//! `RawMemory::with_shared` and `with_exclusive`, which hold the region's
//! own reader-writer lock while the bytes are accessed (as a slice, or by
//! volatile copies when a device maps them: `shared.rs`) and refuse once
//! the region is invalidated (the MR was deregistered or dropped).
//! Invalidation takes the write lock, so when it returns no provider access
//! is in progress and none can start: after deregistration the caller owns
//! the memory again.
#![allow(unsafe_code)]

use al::sync::{Arc, RwLock};
use al::{Error, Result};

use super::shared::{Exclusive, Shared};
use super::{Memory, Store};

/// Caller-managed memory ready to be registered (zero copy).
///
/// Built by the unsafe [`RawRegion::new`]; registering it (for example with
/// `SoftPd::register_region`) is safe because the contract was accepted
/// here. One region backs exactly one MR.
pub struct RawRegion {
    pub(crate) mem: Arc<Memory>,
}

impl std::fmt::Debug for RawRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRegion")
            .field("len", &self.mem.len())
            .finish()
    }
}

impl RawRegion {
    /// Describe `len` bytes at `ptr` for registration.
    ///
    /// `ptr` must not be null and `len` must be between 1 and `isize::MAX`
    /// (otherwise `InvalidParameter`).
    ///
    /// # Safety
    ///
    /// From this call until the MR registered from this region is
    /// deregistered (or dropped) -- or until this `RawRegion` is dropped if
    /// it is never registered -- the caller guarantees that:
    ///
    /// 1. `ptr..ptr+len` is one live allocation, valid for reads and writes,
    ///    and is not freed, moved or unmapped;
    /// 2. nothing else accesses those bytes while the provider may: the
    ///    provider may read or write them at any time while the MR is
    ///    registered and (a) a local work request naming its lkey is
    ///    outstanding, or (b) remote access rights were granted and a peer
    ///    holds the rkey, or (c) a method of the MR (`read`/`write`) runs.
    ///    Accessing the bytes in that window through any other pointer or
    ///    reference is a data race (undefined behaviour). Reading them
    ///    after the completion of the last local work request, when no
    ///    remote access was granted, is fine; the MR's own `read`/`write`
    ///    methods are always fine;
    /// 3. the range does not overlap another live `RawRegion` (each region
    ///    has its own lock, so two overlapping regions could be written at
    ///    once).
    ///
    /// Deregistration is the hand-back point: when `deregister_mr` returns
    /// (or the MR is dropped), the provider has stopped touching the memory
    /// for good.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<RawRegion> {
        if ptr.is_null() {
            return Err(Error::invalid_parameter("raw region pointer is null"));
        }
        if len == 0 || len > isize::MAX as usize {
            return Err(Error::invalid_parameter(format!(
                "raw region length {len} must be between 1 and isize::MAX"
            )));
        }
        Ok(RawRegion {
            mem: Arc::new(Memory::new(Store::Raw(RawMemory {
                ptr,
                len,
                valid: RwLock::new(true),
            }))),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Always false (a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for RawRegion {
    fn drop(&mut self) {
        // A registered region's memory now belongs to its MR (which shares
        // `mem` and invalidates it on deregistration); an unregistered one
        // must stop here so the contract window closes with the region.
        if Arc::strong_count(&self.mem) == 1 {
            self.mem.invalidate();
        }
    }
}

/// The provider side of a raw region.
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
    /// False once invalidated; the lock also serialises provider access.
    valid: RwLock<bool>,
}

// SAFETY: the pointer is only dereferenced inside `with_shared` and
// `with_exclusive` under `valid`'s lock, and the `RawRegion::new` contract makes the memory valid
// from any thread and free of other accesses for the region's life, so
// sending or sharing the descriptor between threads cannot create a data
// race the lock does not already exclude.
unsafe impl Send for RawMemory {}
// SAFETY: see `Send` above; shared access goes through the lock.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The region's address, used as the MR's iova.
    pub fn base_addr(&self) -> u64 {
        self.ptr as usize as u64
    }

    /// Run `f` on the bytes under the region's read lock; `None` once
    /// invalidated. `device(true)` when a device maps them (copies are
    /// volatile, never sliced).
    pub(super) fn with_shared<R>(
        &self,
        device: impl FnOnce() -> bool,
        f: impl FnOnce(Shared<'_>) -> R,
    ) -> Option<R> {
        let valid = self.valid.read();
        if !*valid {
            return None;
        }
        // SAFETY: `valid` is true and we hold its read lock, so the region
        // has not been deregistered and cannot be until we return; by the
        // `RawRegion::new` contract `ptr..ptr+len` is one live allocation
        // (non-null, len <= isize::MAX) that nothing outside this lock
        // accesses except a device the region is registered with, which
        // `device()` (read under the lock, after any mapping made before
        // took effect) reports; inside the lock only reads happen while
        // the read lock is held. The view does not escape `f`.
        Some(f(unsafe { Shared::new(self.ptr, self.len, device()) }))
    }

    /// As [`RawMemory::with_shared`], under the write lock.
    pub(super) fn with_exclusive<R>(
        &self,
        device: impl FnOnce() -> bool,
        f: impl FnOnce(Exclusive<'_>) -> R,
    ) -> Option<R> {
        let valid = self.valid.write();
        if !*valid {
            return None;
        }
        // SAFETY: as in `with_shared`, and the write lock makes this the
        // only Rust access.
        Some(f(unsafe { Exclusive::new(self.ptr, self.len, device()) }))
    }

    /// Stop all further access; when this returns none is in progress.
    pub fn invalidate(&self) {
        *self.valid.write() = false;
    }
}
