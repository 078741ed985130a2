//! [`RawRegion`]: caller-managed memory ready to be registered, the safe
//! handle over a [`RawMemory`] whose contract the caller accepted in the
//! one `unsafe fn` of the crate.
#![allow(unsafe_code)]

use al::sync::{Arc, RwLock};
use al::{Error, Result};

use super::memory::{Memory, Store};
use super::raw::RawMemory;

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
