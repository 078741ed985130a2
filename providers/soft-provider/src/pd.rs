//! Protection domains and memory regions of a soft HCA.

use crate::hca_core::{Charge, HcaCore};
use crate::identity::Identity;
use crate::mr::MrInner;
use al::sync::atomic::AtomicBool;
use al::sync::Arc;
use al::{Error, Result};
use provider::buffer::for_providers::{memory_of, region_memory, Memory, Span};
use provider::buffer::{RawRegion, RegisteredBuffer};
use provider::{Access, Sge};

/// A protection domain.
pub struct SoftPd {
    /// Its place in the HCA's `max_pd`.
    pub(crate) _charge: Charge,
    /// Unique across devices, so an SRQ, AV or MR that carries it cannot
    /// belong to a PD of another device.
    pub(crate) id: Identity,
    pub(crate) core: Arc<HcaCore>,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPd").field("id", &self.id).finish()
    }
}

fn check_access(access: Access) -> Result<()> {
    if access.undefined_bits() != 0 {
        return Err(Error::invalid_parameter(format!(
            "access {:#x} has bits that name no right ({:#x})",
            access.bits(),
            access.undefined_bits()
        )));
    }
    if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(Error::invalid_parameter(
            "remote write or atomic access requires local write (IBTA 10.6.3.1)",
        ));
    }
    Ok(())
}

impl SoftPd {
    /// Register the whole buffer; the MR's iova is 0.
    pub fn register(&self, buf: &RegisteredBuffer, access: Access) -> Result<SoftMr> {
        self.register_range(buf, 0, buf.len(), 0, access)
    }

    /// Register `len` bytes of `buf` from `offset`; addresses in work
    /// requests are `iova + offset_in_mr`.
    pub fn register_range(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        check_access(access)?;
        if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
            return Err(Error::invalid_parameter(format!(
                "MR range {offset}+{len} outside the {}-byte buffer",
                buf.len()
            )));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::invalid_parameter("iova + len overflows"));
        }
        self.insert(memory_of(buf).clone(), offset, len, iova, access)
    }

    /// Register caller-managed memory; the MR's iova is the pointer value.
    /// The contract was accepted by [`RawRegion::new`].
    pub fn register_region(&self, region: RawRegion, access: Access) -> Result<SoftMr> {
        check_access(access)?;
        let len = region.len();
        let mem = region_memory(&region).clone();
        let iova = mem.raw_addr().unwrap_or(0);
        self.insert(mem, 0, len, iova, access)
    }

    fn insert(
        &self,
        mem: Arc<Memory>,
        mem_off: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<SoftMr> {
        let pd = self.id;
        let inner = self.core.mrs.insert(|key| MrInner {
            key,
            pd,
            access,
            iova,
            len,
            mem,
            mem_off,
            deregistered: AtomicBool::new(false),
        })?;
        inner.mem.in_flight.add_span(Span {
            key: inner.key,
            iova: inner.iova,
            off: inner.mem_off,
            len: inner.len,
        });
        Ok(SoftMr {
            inner,
            core: self.core.clone(),
        })
    }
}

/// A memory region. Dropping it deregisters it: when the drop returns, the
/// provider no longer touches the memory.
pub struct SoftMr {
    inner: Arc<MrInner>,
    core: Arc<HcaCore>,
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftMr")
            .field("key", &format_args!("{:#x}", self.inner.key))
            .field("iova", &format_args!("{:#x}", self.inner.iova))
            .field("len", &self.inner.len)
            .field("access", &self.inner.access)
            .finish()
    }
}

impl SoftMr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.key
    }
    /// Remote key (the same value in the soft provider).
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }
    /// Address of the MR's first byte in work requests.
    pub fn iova(&self) -> u64 {
        self.inner.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the MR is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// An SGE for `len` bytes at `offset` in this MR.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.inner.iova + offset,
            length: len,
            lkey: self.inner.key,
        }
    }

    fn range(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(e) if e <= self.inner.len => Ok(self.inner.mem_off + offset),
            _ => Err(Error::invalid_parameter(format!(
                "range {offset}+{len} outside the {}-byte MR",
                self.inner.len
            ))),
        }
    }

    /// Copy bytes out of the MR (offset relative to the MR's start).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let at = self.range(offset, out.len())?;
        self.inner
            .mem
            .with(|m| out.copy_from_slice(&m[at..at + out.len()]))
            .ok_or_else(|| Error::invalid_state("the MR was deregistered"))
    }

    /// Copy bytes into the MR (offset relative to the MR's start).
    /// `ResourceBusy` (nothing written) if a posted work request still
    /// names any of those bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let at = self.range(offset, data.len())?;
        self.inner
            .mem
            .in_flight
            .check_writable(at, at + data.len())?;
        self.inner
            .mem
            .with_mut(|m| m[at..at + data.len()].copy_from_slice(data))
            .ok_or_else(|| Error::invalid_state("the MR was deregistered"))
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.core.mrs.remove(self.inner.key);
        // Its queued requests can no longer reach the bytes (their key
        // names nothing now): the application may write them again.
        self.inner.mem.in_flight.remove_span(self.inner.key);
        self.inner.mem.invalidate();
    }
}
