//! Memory regions in byte vectors ([`TestMem`]): the [`Memory`] of the
//! transport's tests and of the fuzz checks.

use provider::{Access, Sge};

use roce::Endpoints;

use crate::{AtomicOp, LeasedEncodeError, MemError, Memory, Payload, Transmit, Transport};

/// One registered region of a [`TestMem`].
#[derive(Debug, Clone)]
pub struct Region {
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// First virtual address.
    pub va: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Rights.
    pub access: Access,
}

/// Memory regions in byte vectors: the [`Memory`] of tests and fuzzing.
#[derive(Debug, Clone, Default)]
pub struct TestMem {
    /// The regions, in registration order.
    pub regions: Vec<Region>,
    /// Grant leases ([`Memory::lease`]): long sends are then gathered
    /// packet by packet as they are sent.
    pub leasing: bool,
    /// The gather lists leased and not yet given back.
    pub leased: Vec<Vec<Sge>>,
    /// Leased packets leave as [`crate::Payload::Leased`], read as they
    /// are encoded ([`encode_transmit`]), as the RoCEv2 provider's do.
    pub read_as_encoded: bool,
}

/// The UDP payload of `tx` for `ep`, a leased payload read from `mem` as
/// it is encoded, as the RoCEv2 provider's driver does; a read that fails
/// is reported to `t` ([`Transport::leased_read_failed`]) and gives
/// `None`. Panics if the transport built a packet that does not encode
/// (a bug: test use only).
pub fn encode_transmit<R: Clone>(
    t: &mut Transport<R>,
    mem: &mut TestMem,
    tx: &Transmit<R>,
    ep: &Endpoints,
) -> Option<Vec<u8>> {
    let Payload::Leased(l) = &tx.payload else {
        return Some(tx.packet().encode(ep).expect("a transmit encodes"));
    };
    let mut out = Vec::new();
    match l.encode_append(tx.headers, ep, mem, &mut out) {
        Ok(_) => Some(out),
        Err(LeasedEncodeError::Memory(e)) => {
            t.leased_read_failed(tx, e);
            None
        }
        Err(LeasedEncodeError::Encode(e)) => panic!("a transmit encodes: {e}"),
    }
}

impl TestMem {
    /// Registers `len` bytes at `va`; returns (lkey, rkey).
    pub fn register(&mut self, va: u64, len: usize, access: Access) -> (u32, u32) {
        let i = self.regions.len() as u32;
        let (lkey, rkey) = (0x1000 + i, 0x8000 + i * 7);
        self.regions.push(Region {
            lkey,
            rkey,
            va,
            bytes: vec![0; len],
            access,
        });
        (lkey, rkey)
    }
    /// The region of a key (panics if none: test use only).
    pub fn region(&mut self, key: u32) -> &mut Region {
        self.regions
            .iter_mut()
            .find(|r| r.lkey == key || r.rkey == key)
            .expect("region")
    }
    /// Copies `len` bytes at `va` of the region of `key`.
    pub fn read(&mut self, key: u32, va: u64, len: usize) -> Vec<u8> {
        let r = self.region(key);
        let at = (va - r.va) as usize;
        r.bytes[at..at + len].to_vec()
    }
    /// Writes `data` at `va` of the region of `key`.
    pub fn write(&mut self, key: u32, va: u64, data: &[u8]) {
        let r = self.region(key);
        let at = (va - r.va) as usize;
        r.bytes[at..at + data.len()].copy_from_slice(data);
    }
    fn by_lkey(&mut self, lkey: u32) -> Result<&mut Region, MemError> {
        self.regions
            .iter_mut()
            .find(|r| r.lkey == lkey)
            .ok_or(MemError::BadKey)
    }
    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(&mut Region, usize), MemError> {
        let r = self
            .regions
            .iter_mut()
            .find(|r| r.rkey == rkey)
            .ok_or(MemError::BadKey)?;
        if !r.access.contains(need) {
            return Err(MemError::NoAccess);
        }
        let end = va.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if va < r.va || end > r.va + r.bytes.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        let at = (va - r.va) as usize;
        Ok((r, at))
    }
    /// Checks one SGE against its region.
    fn local(&mut self, s: &Sge, need: Access) -> Result<&mut Region, MemError> {
        let r = self.by_lkey(s.lkey)?;
        if !r.access.contains(need) {
            return Err(MemError::NoAccess);
        }
        let end = s.addr.checked_add(u64::from(s.length));
        if s.addr < r.va || end.is_none_or(|e| e > r.va + r.bytes.len() as u64) {
            return Err(MemError::OutOfBounds);
        }
        Ok(r)
    }
    /// Walks the SGEs from `offset`, calling `f(region bytes, position in
    /// the data)` for `len` bytes.
    fn walk(
        &mut self,
        sges: &[Sge],
        mut offset: u64,
        len: usize,
        need: Access,
        mut f: impl FnMut(&mut [u8], usize),
    ) -> Result<(), MemError> {
        let mut done = 0usize;
        for s in sges {
            if done == len {
                break;
            }
            if offset >= u64::from(s.length) {
                offset -= u64::from(s.length);
                continue;
            }
            let r = self.local(s, need)?;
            let start = (s.addr - r.va + offset) as usize;
            let n = ((u64::from(s.length) - offset) as usize).min(len - done);
            f(&mut r.bytes[start..start + n], done);
            done += n;
            offset = 0;
        }
        if done < len {
            return Err(MemError::TooShort);
        }
        Ok(())
    }
}

impl Memory for TestMem {
    fn check_local(&mut self, sges: &[Sge], need: Access) -> Result<u64, MemError> {
        let mut total = 0u64;
        for s in sges {
            self.local(s, need)?;
            total += u64::from(s.length);
        }
        Ok(total)
    }
    fn gather(&mut self, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        let len = out.len();
        self.walk(sges, offset, len, Access::NONE, |b, at| {
            out[at..at + b.len()].copy_from_slice(b)
        })
    }
    fn scatter(&mut self, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), MemError> {
        self.walk(sges, offset, data.len(), Access::LOCAL_WRITE, |b, at| {
            let n = b.len();
            b.copy_from_slice(&data[at..at + n])
        })
    }
    fn check_remote(&mut self, rkey: u32, va: u64, len: u64, need: Access) -> Result<(), MemError> {
        self.remote(rkey, va, len, need).map(|_| ())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError> {
        let (r, at) = self.remote(rkey, va, data.len() as u64, Access::REMOTE_WRITE)?;
        r.bytes[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read_remote(&mut self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError> {
        let (r, at) = self.remote(rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        out.copy_from_slice(&r.bytes[at..at + out.len()]);
        Ok(())
    }
    fn atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        let (r, at) = self.remote(rkey, va, 8, Access::REMOTE_ATOMIC)?;
        let cell: &mut [u8] = &mut r.bytes[at..at + 8];
        let mut old = [0u8; 8];
        old.copy_from_slice(cell);
        let old = u64::from_ne_bytes(old);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } if old == compare => swap,
            AtomicOp::CompareSwap { .. } => old,
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        Ok(old)
    }
    fn invalidate(&mut self, _rkey: u32) -> Result<(), MemError> {
        Ok(())
    }
    fn reads_as_encoded(&self) -> bool {
        self.read_as_encoded
    }
    fn lease(&mut self, sges: &[Sge]) -> bool {
        if self.leasing {
            self.leased.push(sges.to_vec());
        }
        self.leasing
    }
}

impl TestMem {
    /// Takes back a lease the transport released (panics if it was not
    /// held: test use only).
    pub fn release(&mut self, sges: &[Sge]) {
        let i = self
            .leased
            .iter()
            .position(|l| l == sges)
            .expect("a lease the memory gave");
        self.leased.swap_remove(i);
    }
}
