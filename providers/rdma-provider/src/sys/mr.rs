//! Protection domains and memory regions (`ibv_alloc_pd`, `ibv_reg_mr`,
//! `ibv_dereg_mr`).

use al::sync::Arc;
use std::os::raw::c_void;
use std::ptr::NonNull;

use al::Result;
use provider::buffer::for_providers::{map_for_device, DeviceMapping, Memory};
use rdma_sys as ffi;

use super::device::{check, last_errno, Context};
use crate::convert::errno_error;

/// A protection domain (`ibv_alloc_pd`), deallocated on drop.
pub(crate) struct Pd {
    pub(super) pd: NonNull<ffi::ibv_pd>,
    freed: bool,
    _ctx: Arc<Context>,
}

// SAFETY: tied to no thread; freed by `dealloc(self)` or `Drop`
// (exclusive). `&Pd` only passes the pointer to thread-safe verbs
// (create CQ/QP/SRQ/AH, register MR).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub(crate) fn alloc(ctx: &Arc<Context>) -> Result<Pd> {
        // SAFETY: the context is open and stays so (the Arc).
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) };
        NonNull::new(pd)
            .map(|pd| Pd {
                pd,
                freed: false,
                _ctx: ctx.clone(),
            })
            .ok_or_else(|| errno_error("ibv_alloc_pd", last_errno()))
    }

    /// `ibv_dealloc_pd`, with its error. Every child holds an `Arc<Pd>`,
    /// so by the time this can be called none is left.
    pub(crate) fn dealloc(mut self) -> Result<()> {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once (`freed` stops
        // the drop from trying again after a success).
        let rc = unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
        check("ibv_dealloc_pd", rc)?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `dealloc`.
            let _ = unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
        }
    }
}

/// A memory region (`ibv_reg_mr_iova2`) over memory it keeps alive and
/// maps for the device, deregistered on drop.
pub(crate) struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    freed: bool,
    /// Keeps the memory alive and every access to it device-safe (no
    /// Rust reference into its bytes, volatile copies) until the device
    /// can no longer reach it: dropped after `ibv_dereg_mr`.
    mapping: Option<DeviceMapping>,
    _pd: Arc<Pd>,
}

// SAFETY: the `ibv_mr` is only read for its keys (written once by
// `ibv_reg_mr_iova2` before the pointer is ours, never changed after) and
// deregistered through `&mut self`/`self`, so moving it to another thread
// or reading the keys from several threads cannot race; libibverbs ties an
// MR to no thread.
unsafe impl Send for Mr {}
// SAFETY: as above: `&Mr` gives only the immutable keys.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes from `offset` of `mem` at `iova` with
    /// `access` (the `IBV_ACCESS_*` bits, which are [`provider::Access`]'s).
    ///
    /// The memory is first mapped for the device
    /// ([`map_for_device`]): from then on no access makes a Rust
    /// reference into its bytes, whatever the access flags (the device
    /// writes receives and READ responses with local write, and remote
    /// WRITEs and atomics with remote rights, at any moment). The address
    /// is the mapping's: an owned buffer's allocation (which never moves
    /// or resizes) or a raw region's base (which the `RawRegion::new`
    /// contract keeps valid until deregistration). The mapping (and with
    /// it the memory) is held until the MR is deregistered, so the bytes
    /// the device may DMA into stay allocated.
    pub(crate) fn register(
        pd: &Arc<Pd>,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Mr> {
        let total = mem.len();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(al::Error::invalid_parameter(format!(
                "range {offset}+{len} outside memory of {total} bytes"
            )));
        }
        let mapping = map_for_device(mem)
            .ok_or_else(|| al::Error::invalid_parameter("memory was invalidated"))?;
        let addr = mapping.addr() + offset;
        // The kernel maps an MR page by page and refuses (EINVAL) an iova
        // at another offset in its page than the address; say so plainly.
        let page = provider::buffer::PAGE as u64;
        if (addr as u64 ^ iova) % page != 0 {
            return Err(al::Error::invalid_parameter(format!(
                "iova {iova:#x} is at offset {:#x} in its page but the memory at offset \
                 {offset} is at {:#x}: a device maps an MR page by page, so both must match",
                iova % page,
                addr as u64 % page
            )));
        }
        // SAFETY: the PD is live (Arc); `addr..addr+len` lies inside `mem`
        // (checked above), which stays allocated at that address while the
        // MR lives (the mapping held in the MR keeps the `Arc<Memory>`;
        // owned memory is an allocation that never moves, raw memory is
        // the caller's promise), and no Rust reference into it exists from
        // the mapping on. The kernel pins the pages; NULL with errno on
        // failure.
        let mr = unsafe {
            ffi::ibv_reg_mr_iova2(pd.pd.as_ptr(), addr as *mut c_void, len, iova, access)
        };
        NonNull::new(mr)
            .map(|mr| Mr {
                mr,
                freed: false,
                mapping: Some(mapping),
                _pd: pd.clone(),
            })
            .ok_or_else(|| errno_error("ibv_reg_mr_iova2", last_errno()))
    }

    /// (lkey, rkey).
    pub(crate) fn keys(&self) -> (u32, u32) {
        // SAFETY: the MR is live; the keys are set at registration.
        unsafe { ((*self.mr.as_ptr()).lkey, (*self.mr.as_ptr()).rkey) }
    }

    /// The device no longer reaches the memory: end the mapping and, for a
    /// raw region, invalidate it.
    fn unmap(&mut self) {
        if let Some(m) = self.mapping.take() {
            let mem = m.memory().clone();
            drop(m);
            mem.invalidate();
        }
    }

    /// `ibv_dereg_mr`, with its error; a raw region is then invalidated.
    pub(crate) fn deregister(mut self) -> Result<()> {
        // SAFETY: registered by `ibv_reg_mr_iova2`, deregistered once.
        check("ibv_dereg_mr", unsafe {
            ffi::ibv_dereg_mr(self.mr.as_ptr())
        })?;
        self.freed = true;
        self.unmap();
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `deregister`.
            let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
            if rc != 0 {
                // The device may still reach the bytes: keep them alive
                // and device-safe for the rest of the process rather than
                // hand them back.
                std::mem::forget(self.mapping.take());
                return;
            }
        }
        self.unmap();
    }
}
