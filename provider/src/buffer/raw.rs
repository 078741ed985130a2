//! Caller-managed memory: with `region.rs`, `aligned.rs` and `shared.rs`,
//! the only modules of the crate with `unsafe` code.
//!
//! A [`RawRegion`](super::RawRegion) is a pointer and a length the caller
//! vouches for (see [`RawRegion::new`](super::RawRegion::new)). The provider accesses it only through
//! `RawMemory::with_shared` and `with_exclusive`, which hold the region's
//! own reader-writer lock while the bytes are accessed (as a slice, or by
//! volatile copies when a device maps them: `shared.rs`) and refuse once
//! the region is invalidated (the MR was deregistered or dropped).
//! Invalidation takes the write lock, so when it returns no provider access
//! is in progress and none can start: after deregistration the caller owns
//! the memory again.
#![allow(unsafe_code)]

use al::sync::RwLock;

use super::shared::{Exclusive, Shared};

/// The provider side of a raw region.
pub struct RawMemory {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    /// False once invalidated; the lock also serialises provider access.
    pub(super) valid: RwLock<bool>,
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
