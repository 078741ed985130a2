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
//!   what the caller promises. Everything unsafe lives in the `raw`,
//!   `aligned` and `shared` submodules.
//!
//! Memory a device maps for DMA (an MR of the `rdma` provider:
//! [`for_providers::map_for_device`]) is written by the device outside
//! every lock, so no Rust reference ever spans it while it is mapped:
//! copies in and out are volatile, and closures that want a slice get one
//! over a private copy (`shared.rs`, `docs/memory.md`).
//!
//! Copies between two memories lock both in address order (the same memory
//! twice is one exclusive lock and `copy_within`), so two RDMA operations
//! moving data in opposite directions cannot deadlock.

mod aligned;
mod in_flight;
mod memory;
mod raw;
mod region;
mod shared;

use std::sync::atomic::Ordering;

use aligned::PageBytes;
pub use aligned::PAGE;

use al::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use al::{Error, Result};

use memory::Store;
pub use memory::{copy, LockedPair, Memory};
pub use region::RawRegion;

/// Provider-owned memory that can be registered as one or more MRs: the
/// safe form of registration.
///
/// The library owns the bytes (an allocation that starts on a 4 KiB page
/// boundary and never moves or resizes: a real device registers an MR
/// only at an iova with the same offset in its page as the bytes, so an
/// MR from `offset` wants an iova with `offset`'s page offset) and every MR registered over them keeps them alive, so they cannot be
/// freed or moved while registered, whatever the application drops.
/// Cloning shares the memory. Every access is bounds-checked and goes
/// through the buffer's lock, which the soft and RoCEv2 providers also take
/// while they move data in or out (local work requests and remote RDMA
/// alike), so no access is ever a data race.
///
/// **Registered with a device that moves the bytes itself** (an MR of the
/// `rdma` provider: the NIC writes receives, RDMA WRITEs and atomics by
/// DMA, outside any lock): from the registration until the last such MR is
/// deregistered, no reference into the bytes is ever made. [`read`](Self::read),
/// [`write`](Self::write), [`fill`](Self::fill) and [`to_vec`](Self::to_vec)
/// copy with volatile loads and stores; [`with`](Self::with) runs its
/// closure on a copy, and [`with_mut`](Self::with_mut) /
/// [`with_range_mut`](Self::with_range_mut) on a copy of which only the
/// bytes the closure changed are stored back. A read that overlaps a
/// remote WRITE (or a receive) landing at the same time may see any mix of
/// old and new bytes (torn data), and a byte the application stores while
/// the device writes it ends up with either value: a race on the values,
/// never undefined behaviour. The application's protocol with its peer (a
/// completion, a flag it polls) says when bytes are final, as in every
/// verbs API.
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
/// use provider::RegisteredBuffer;
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

    fn bytes(&self) -> &RwLock<PageBytes> {
        match &self.mem.store {
            Store::Owned(b) => b,
            Store::Raw(_) => unreachable!("a RegisteredBuffer is always owned memory"),
        }
    }

    /// The bytes under the read lock (device-safe when mapped).
    fn shared(&self) -> OwnedShared<'_> {
        OwnedShared {
            guard: self.bytes().read(),
            device: self.mem.device_mapped(),
        }
    }

    /// The bytes under the write lock (device-safe when mapped).
    fn exclusive(&self) -> OwnedExclusive<'_> {
        let guard = self.bytes().write();
        OwnedExclusive {
            device: self.mem.device_mapped(),
            guard,
        }
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
        self.shared().read(r.start, out);
        Ok(())
    }

    /// Copy `data` to `offset`. `ResourceBusy` (nothing written) if a
    /// posted work request still names any of those bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.range(offset, data.len())?;
        self.mem.in_flight.check_writable(r.start, r.end)?;
        self.exclusive().write(r.start, data);
        Ok(())
    }

    /// Fill the whole buffer with `byte`. `ResourceBusy` (nothing written)
    /// while any work request over the buffer is in flight.
    pub fn fill(&self, byte: u8) -> Result<()> {
        self.mem.in_flight.check_writable(0, self.len())?;
        self.exclusive().fill(byte);
        Ok(())
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.shared().read(0, &mut v);
        v
    }

    /// Run `f` on the contents with shared access (RDMA into the buffer by
    /// the soft and RoCEv2 providers waits until `f` returns). While a
    /// device maps the buffer, `f` sees a copy taken when it was called.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        self.shared().view(f)
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
    /// While a device maps the buffer, `f` works on a copy and only the
    /// bytes it changed are stored back.
    pub fn with_range_mut<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let r = self.range(offset, len)?;
        self.mem.in_flight.check_writable(r.start, r.end)?;
        Ok(self.exclusive().view_mut(r.start, len, f))
    }
}

/// A buffer's read guard with the device flag read under it.
struct OwnedShared<'b> {
    guard: RwLockReadGuard<'b, PageBytes>,
    device: bool,
}

impl OwnedShared<'_> {
    fn read(&self, at: usize, out: &mut [u8]) {
        self.guard.shared(self.device).read(at, out)
    }

    fn view<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        self.guard.shared(self.device).view(f)
    }
}

/// A buffer's write guard with the device flag read under it.
struct OwnedExclusive<'b> {
    guard: RwLockWriteGuard<'b, PageBytes>,
    device: bool,
}

impl OwnedExclusive<'_> {
    fn write(&mut self, at: usize, data: &[u8]) {
        self.guard.exclusive(self.device).write(at, data)
    }

    fn fill(&mut self, byte: u8) {
        self.guard.exclusive(self.device).fill(byte)
    }

    fn view_mut<R>(&mut self, at: usize, n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.guard.exclusive(self.device).view_mut(at, n, f)
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
    use super::{Ordering, Store};
    use al::sync::Arc;

    /// The memory behind a buffer.
    pub fn memory_of(buf: &super::RegisteredBuffer) -> &Arc<Memory> {
        &buf.mem
    }

    /// The memory behind a caller-managed region.
    pub fn region_memory(region: &super::RawRegion) -> &Arc<Memory> {
        &region.mem
    }

    /// A device's claim on a memory it reads and writes by DMA, outside
    /// every lock of ours (an MR of the `rdma` provider): while one lives,
    /// no access to the memory makes a Rust reference into its bytes
    /// (copies are volatile; closures get copies). Hold it until the
    /// device can no longer reach the bytes (after `ibv_dereg_mr`).
    pub struct DeviceMapping {
        mem: Arc<Memory>,
        addr: usize,
    }

    impl DeviceMapping {
        /// The address of the memory's first byte (what the device
        /// registers).
        pub fn addr(&self) -> usize {
            self.addr
        }

        /// The memory.
        pub fn memory(&self) -> &Arc<Memory> {
            &self.mem
        }
    }

    impl Drop for DeviceMapping {
        fn drop(&mut self) {
            self.mem.device_maps.fetch_sub(1, Ordering::Release);
        }
    }

    /// Map `mem` for a device (before registering it with the device):
    /// `None` when it is a raw region already invalidated. The count rises
    /// under the memory's write lock, so every access that starts after
    /// this returns takes the device-safe path, and none that used a
    /// reference is still running.
    pub fn map_for_device(mem: &Arc<Memory>) -> Option<DeviceMapping> {
        let raise = || {
            mem.device_maps.fetch_add(1, Ordering::AcqRel);
        };
        let addr = match &mem.store {
            Store::Owned(b) => {
                let g = b.write();
                raise();
                g.addr()
            }
            Store::Raw(r) => {
                r.with_exclusive(|| true, |_| raise())?;
                r.base_addr() as usize
            }
        };
        Some(DeviceMapping {
            mem: mem.clone(),
            addr,
        })
    }
}

#[cfg(all(test, not(ibal_loom)))]
mod tests {
    use super::for_providers::{copy, map_for_device, memory_of, LockedPair};
    use super::RegisteredBuffer;

    /// Unmapped, a closure gets the memory itself; mapped for a device, a
    /// copy at another address (no reference into bytes the device may
    /// write), and the memory itself again once the mapping is gone.
    #[test]
    fn while_a_device_maps_a_buffer_closures_get_a_copy_never_the_bytes() {
        let buf = RegisteredBuffer::from_vec(vec![1, 2, 3, 4]);
        let at = |b: &RegisteredBuffer| b.with(|s| s.as_ptr() as usize);
        let own = at(&buf);
        let map = map_for_device(memory_of(&buf)).unwrap();
        assert_eq!(
            map.addr(),
            own,
            "the device registers the buffer's own bytes"
        );
        assert_ne!(at(&buf), own, "with: a copy while mapped");
        let inside = buf.with_mut(|s| s.as_ptr() as usize).unwrap();
        assert_ne!(inside, own, "with_mut: a copy while mapped");
        assert_eq!(buf.to_vec(), [1, 2, 3, 4]);
        drop(map);
        assert_eq!(at(&buf), own);
    }

    /// What the device writes while a closure runs does not show through
    /// the closure's `&[u8]` (whose bytes may not change while it lives),
    /// is there afterwards, and survives a `with_mut` that did not touch
    /// that byte.
    #[test]
    #[allow(unsafe_code)]
    fn a_device_write_during_a_closure_never_changes_its_slice() {
        let buf = RegisteredBuffer::new(16);
        let map = map_for_device(memory_of(&buf)).unwrap();
        let dev = map.addr() as *mut u8;
        buf.with(|s| {
            // SAFETY: the mapping keeps the 16 bytes allocated; nothing in
            // Rust holds a reference into them (the slice is a copy).
            unsafe { dev.write_volatile(7) };
            assert_eq!(std::hint::black_box(s)[0], 0);
        });
        assert_eq!(buf.to_vec()[0], 7);
        buf.with_mut(|s| {
            // SAFETY: as above.
            unsafe { dev.add(1).write_volatile(8) };
            s[2] = 9;
        })
        .unwrap();
        assert_eq!(&buf.to_vec()[..3], &[7, 8, 9]);
        let mut out = [0; 3];
        buf.write(5, &[5, 6, 7]).unwrap();
        buf.read(5, &mut out).unwrap();
        assert_eq!(out, [5, 6, 7]);
        buf.fill(0xee).unwrap();
        assert!(buf.to_vec().iter().all(|&b| b == 0xee));
        drop(map);
    }

    /// The batched path's long-held slices are refused for mapped memory
    /// (it falls back to `copy`, which is volatile there and copies
    /// exactly).
    #[test]
    fn mapped_memory_takes_the_copy_path() {
        let a = RegisteredBuffer::from_vec((0..64).collect());
        let b = RegisteredBuffer::new(64);
        let (ma, mb) = (memory_of(&a), memory_of(&b));
        assert!(LockedPair::lock(ma, mb).is_some());
        let map = map_for_device(mb).unwrap();
        assert!(LockedPair::lock(ma, mb).is_none());
        assert!(LockedPair::lock(mb, mb).is_none());
        assert!(copy(ma, 3, mb, 5, 40));
        assert!(copy(mb, 5, mb, 1, 40));
        let got = b.to_vec();
        assert_eq!(&got[1..41], &(3..43).collect::<Vec<u8>>()[..]);
        drop(map);
        assert!(LockedPair::lock(ma, mb).is_some());
    }
}
