//! Memory regions: the key table (random keys), the queues of posted
//! receives the in-flight check scans, and the transport's view of
//! memory ([`DevMem`], `roce_transport::Memory` over the table).

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::Arc;
use std::collections::{HashMap, VecDeque};

use al::sync::{Mutex, RwLock};
use al::{Error, Result};
use provider::buffer::for_providers::{Lease, Memory, PostedQueue};
use provider::{Access, Sge};
use roce_transport::{AtomicOp, MemError};

use crate::keys::KeyGen;

/// A registered region as the data path sees it.
pub(crate) struct MrInner {
    pub(crate) key: u32,
    pub(crate) pd: u64,
    pub(crate) access: Access,
    pub(crate) iova: u64,
    pub(crate) len: usize,
    // `al::sync` types: the shared memory machinery uses them (loom
    // models swap them for loom's).
    pub(crate) mem: al::sync::Arc<Memory>,
    /// Offset of the MR's first byte in `mem`.
    pub(crate) mem_off: usize,
    /// Set when the MR leaves the table.
    pub(crate) deregistered: al::sync::atomic::AtomicBool,
}

impl MrInner {
    /// The offset in `mem` of `len` bytes at `addr`, if they lie inside.
    pub(crate) fn locate(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.iova)?;
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some(self.mem_off + off as usize)
    }

    fn lease_of(&self, sge: &Sge) -> Option<Lease> {
        if sge.length == 0 || sge.lkey != self.key {
            return None;
        }
        let start = self.locate(sge.addr, u64::from(sge.length))?;
        Some(Lease {
            key: self.key,
            start,
            end: start + sge.length as usize,
        })
    }
}

/// The MRs of a device by key. Keys are random (never 0), so a key seen
/// on the wire says nothing about the others.
pub(crate) struct MrTable {
    map: RwLock<al::fast_hash::IdMap<u32, Arc<MrInner>>>,
    max: usize,
    keys: KeyGen,
}

impl MrTable {
    pub(crate) fn new(max: usize) -> MrTable {
        MrTable {
            map: RwLock::new(HashMap::default()),
            max,
            keys: KeyGen::new(),
        }
    }

    pub(crate) fn insert(&self, make: impl FnOnce(u32) -> MrInner) -> Result<Arc<MrInner>> {
        let mut map = self.map.write();
        if map.len() >= self.max {
            return Err(Error::insufficient_resources(format!(
                "max_mr reached: the device allows {} MRs",
                self.max
            )));
        }
        let key = loop {
            let k = self.keys.next_u32();
            if k != 0 && !map.contains_key(&k) {
                break k;
            }
        };
        let mr = Arc::new(make(key));
        map.insert(key, mr.clone());
        Ok(mr)
    }

    pub(crate) fn lookup(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map.read().get(&key).cloned()
    }

    pub(crate) fn remove(&self, key: u32) {
        if let Some(mr) = self.map.write().remove(&key) {
            mr.deregistered.store(true, Ordering::Release);
        }
    }

    /// Lease the bytes of a send held past its post (SQD); whether
    /// [`MrTable::release`] must be called when it leaves.
    pub(crate) fn hold(&self, sg: &[Sge]) -> bool {
        let mut held = false;
        for sge in sg {
            if let Some(mr) = self.lookup(sge.lkey) {
                if let Some(lease) = mr.lease_of(sge) {
                    held |= mr.mem.in_flight.hold(lease, &mr.deregistered);
                }
            }
        }
        held
    }

    /// Release what [`MrTable::hold`] took.
    pub(crate) fn release(&self, sg: &[Sge]) {
        for sge in sg {
            if let Some(mr) = self.lookup(sge.lkey) {
                if let Some(lease) = mr.lease_of(sge) {
                    mr.mem.in_flight.unhold(&lease);
                }
            }
        }
    }

    /// Register `queue` with the memory `sge` names (once per key seen).
    pub(crate) fn note_poster(&self, sge: &Sge, seen: &mut SeenKeys, queue: &Arc<Posted>) {
        if seen.contains(sge.lkey) {
            return;
        }
        if let Some(mr) = self.lookup(sge.lkey) {
            mr.mem.in_flight.add_queue(&SharedPosted(queue.clone()));
            seen.insert(sge.lkey);
        }
    }
}

/// A posted receive.
#[derive(Debug, Clone)]
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    /// Inline for one or two entries: no allocation per posted receive.
    pub(crate) sg: smallvec::SmallVec<[Sge; 2]>,
}

/// A queue of posted receives (a QP's or an SRQ's).
#[derive(Default)]
pub(crate) struct RecvList {
    pub(crate) wrs: VecDeque<RecvEntry>,
    pub(crate) seen: SeenKeys,
}

/// A receive queue shared with the memories it posts into (their
/// in-flight check scans it). It holds only its entries.
pub(crate) struct Posted {
    q: Mutex<RecvList>,
    closed: AtomicBool,
}

impl Posted {
    pub(crate) fn new() -> Arc<Posted> {
        Arc::new(Posted {
            q: Mutex::new(RecvList::default()),
            closed: AtomicBool::new(false),
        })
    }

    pub(crate) fn lock(&self) -> al::sync::MutexGuard<'_, RecvList> {
        self.q.lock()
    }

    /// The queue has ended: the memories forget it.
    pub(crate) fn close(&self) {
        self.q.lock().wrs.clear();
        self.closed.store(true, Ordering::Release);
    }
}

/// A [`Posted`] queue as a memory holds it.
pub(crate) struct SharedPosted(pub(crate) Arc<Posted>);

impl PostedQueue for SharedPosted {
    fn each_sge(&self, f: &mut dyn FnMut(&Sge)) {
        for e in &self.0.q.lock().wrs {
            e.sg.iter().for_each(&mut *f);
        }
    }
    fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }
    fn share(&self) -> Box<dyn PostedQueue> {
        Box::new(SharedPosted(self.0.clone()))
    }
    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

/// The last few keys a queue registered for.
#[derive(Debug, Default)]
pub(crate) struct SeenKeys {
    keys: [u32; 4],
    next: usize,
}

impl SeenKeys {
    fn contains(&self, key: u32) -> bool {
        key != 0 && self.keys.contains(&key)
    }
    fn insert(&mut self, key: u32) {
        self.keys[self.next] = key;
        self.next = (self.next + 1) % self.keys.len();
    }
}

/// The MR a QP's last memory access found (kept in the QP's core, under
/// its lock): a send's key check then its copy, the packets of a message
/// into one receive buffer, and the next message through the same MR
/// find it without the table (a lookup is a read lock and a reference
/// count: four atomic operations, and a hash). It is used only while the
/// MR is registered: [`MrTable::remove`] marks it deregistered, and a
/// marked MR is looked up again (and so not found). Holding it keeps
/// only its bookkeeping alive past a deregistration, until the QP's next
/// access or its end; its memory is invalidated as always.
#[derive(Default)]
pub(crate) struct MrCache(Option<Arc<MrInner>>);

/// The memory of one QP's protection domain as its transport sees it, for
/// the length of one call into the transport: every access finds the MR
/// (in the QP's [`MrCache`] or the table), checks the PD, the rights and
/// the bounds, then copies under the memory's lock.
pub(crate) struct DevMem<'a> {
    mrs: &'a MrTable,
    pd: u64,
    last: &'a mut MrCache,
}

impl<'a> DevMem<'a> {
    pub(crate) fn new(mrs: &'a MrTable, pd: u64, last: &'a mut MrCache) -> DevMem<'a> {
        DevMem { mrs, pd, last }
    }

    fn mr(&mut self, key: u32, need: Access) -> std::result::Result<&MrInner, MemError> {
        let mr = match self.last.0.take() {
            Some(m) if m.key == key && !m.deregistered.load(Ordering::Acquire) => m,
            _ => self.mrs.lookup(key).ok_or(MemError::BadKey)?,
        };
        let mr = &**self.last.0.insert(mr);
        if mr.pd != self.pd {
            return Err(MemError::BadKey);
        }
        if !mr.access.contains(need) {
            return Err(MemError::NoAccess);
        }
        Ok(mr)
    }

    /// Walk `len` bytes of the message `sges` describe from `offset`,
    /// calling `f(mr, offset in mem, position in message, n)`.
    fn walk(
        &mut self,
        sges: &[Sge],
        mut offset: u64,
        len: usize,
        need: Access,
        mut f: impl FnMut(&MrInner, usize, usize, usize) -> bool,
    ) -> std::result::Result<(), MemError> {
        let mut done = 0usize;
        for s in sges {
            if done == len {
                break;
            }
            if s.length == 0 {
                continue;
            }
            if offset >= u64::from(s.length) {
                offset -= u64::from(s.length);
                continue;
            }
            let mr = self.mr(s.lkey, need)?;
            let base = mr
                .locate(s.addr, u64::from(s.length))
                .ok_or(MemError::OutOfBounds)?;
            let n = ((u64::from(s.length) - offset) as usize).min(len - done);
            if !f(mr, base + offset as usize, done, n) {
                return Err(MemError::BadKey);
            }
            done += n;
            offset = 0;
        }
        if done < len {
            return Err(MemError::TooShort);
        }
        Ok(())
    }

    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<(&MrInner, usize), MemError> {
        let mr = self.mr(rkey, need)?;
        let at = mr.locate(va, len).ok_or(MemError::OutOfBounds)?;
        Ok((mr, at))
    }
}

al::thread_local_value! {
    /// A sending thread's packet buffer, given back once its packet was
    /// encoded ([`recycle_packet_buffer`]) and handed out for the next
    /// packet read from memory (`Memory::packet_buffer`): no allocation
    /// and free per packet of a long WRITE or READ response.
    static SPARE_PACKET: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Gives a sent packet's buffer back for the thread's next packet read
/// from memory (the larger of it and the one kept is kept).
pub(crate) fn recycle_packet_buffer(v: Vec<u8>) {
    let _ = SPARE_PACKET.try_with(|cell| {
        let kept = cell.take();
        cell.set(if v.capacity() > kept.capacity() {
            v
        } else {
            kept
        });
    });
}

/// A zeroed buffer of `len` bytes: the thread's recycled one if it has one.
fn take_packet_buffer(len: usize) -> Vec<u8> {
    let mut v = SPARE_PACKET.try_with(|c| c.take()).unwrap_or_default();
    v.clear();
    v.resize(len, 0);
    v
}

impl roce_transport::Memory for DevMem<'_> {
    fn packet_buffer(&mut self, len: usize) -> Vec<u8> {
        take_packet_buffer(len)
    }

    fn check_local(&mut self, sges: &[Sge], need: Access) -> std::result::Result<u64, MemError> {
        let mut total = 0u64;
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let mr = self.mr(s.lkey, need)?;
            mr.locate(s.addr, u64::from(s.length))
                .ok_or(MemError::OutOfBounds)?;
            total += u64::from(s.length);
        }
        Ok(total)
    }

    fn gather(
        &mut self,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemError> {
        let len = out.len();
        self.walk(sges, offset, len, Access::NONE, |mr, at, pos, n| {
            mr.mem
                .with(|m| out[pos..pos + n].copy_from_slice(&m[at..at + n]))
                .is_some()
        })
    }

    fn gather_append(
        &mut self,
        sges: &[Sge],
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), MemError> {
        // Straight from the region into the datagram buffer being
        // encoded: no zeroed room first, no packet buffer between.
        let start = out.len();
        let read = self.walk(sges, offset, len, Access::NONE, |mr, at, _, n| {
            mr.mem
                .with(|m| out.extend_from_slice(&m[at..at + n]))
                .is_some()
        });
        if read.is_err() {
            out.truncate(start);
        }
        read
    }

    /// Yes: the driver reads each packet of a leased message into the
    /// datagram as `QpInner::transmit` encodes it.
    fn reads_as_encoded(&self) -> bool {
        true
    }

    fn scatter(
        &mut self,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemError> {
        // Check the whole range first: a message too long for the buffer,
        // or one that meets a bad key part way, writes nothing. A message
        // inside one SGE needs no separate pass: its key and bounds are
        // checked before its only copy.
        let inside_one = match sges {
            [s] => offset
                .checked_add(data.len() as u64)
                .is_some_and(|end| end <= u64::from(s.length)),
            _ => false,
        };
        if !inside_one {
            self.walk(
                sges,
                offset,
                data.len(),
                Access::LOCAL_WRITE,
                |_, _, _, _| true,
            )?;
        }
        self.walk(
            sges,
            offset,
            data.len(),
            Access::LOCAL_WRITE,
            |mr, at, pos, n| {
                mr.mem
                    .with_mut(|m| m[at..at + n].copy_from_slice(&data[pos..pos + n]))
                    .is_some()
            },
        )
    }

    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<(), MemError> {
        self.remote(rkey, va, len, need).map(|_| ())
    }

    fn write_remote(
        &mut self,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemError> {
        let (mr, at) = self.remote(rkey, va, data.len() as u64, Access::REMOTE_WRITE)?;
        mr.mem
            .with_mut(|m| m[at..at + data.len()].copy_from_slice(data))
            .ok_or(MemError::BadKey)
    }

    fn read_remote(
        &mut self,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemError> {
        let (mr, at) = self.remote(rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        mr.mem
            .with(|m| out.copy_from_slice(&m[at..at + out.len()]))
            .ok_or(MemError::BadKey)
    }

    fn atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> std::result::Result<u64, MemError> {
        let (mr, at) = self.remote(rkey, va, 8, Access::REMOTE_ATOMIC)?;
        mr.mem
            .with_mut(|m| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&m[at..at + 8]);
                let old = u64::from_ne_bytes(b);
                let new = match op {
                    AtomicOp::CompareSwap { compare, swap } => {
                        if old == compare {
                            swap
                        } else {
                            old
                        }
                    }
                    AtomicOp::FetchAdd { add } => old.wrapping_add(add),
                };
                m[at..at + 8].copy_from_slice(&new.to_ne_bytes());
                old
            })
            .ok_or(MemError::BadKey)
    }

    /// A long SEND or WRITE is read from its MRs as it is sent: its
    /// bytes are in flight (writes there refused) until the transport
    /// gives them back (`QpInner::drive` releases them).
    fn lease(&mut self, sges: &[Sge]) -> bool {
        self.mrs.hold(sges)
    }

    fn invalidate(&mut self, _rkey: u32) -> std::result::Result<(), MemError> {
        // Memory windows and invalidation are not implemented: a SEND
        // with Invalidate is refused (NAK invalid request).
        Err(MemError::BadKey)
    }
}

#[cfg(test)]
mod packet_buffer_tests {
    use super::*;

    /// A recycled packet buffer comes back for the next packet zeroed to
    /// its length, with its room kept (no allocation); the larger of two
    /// is kept.
    #[test]
    fn a_recycled_packet_buffer_is_reused_zeroed() {
        recycle_packet_buffer(vec![7u8; 5000]);
        recycle_packet_buffer(vec![9u8; 10]);
        let v = take_packet_buffer(100);
        assert_eq!(v, vec![0u8; 100]);
        assert!(v.capacity() >= 5000, "the larger buffer was kept");
        // Taken: the next one is new.
        assert!(take_packet_buffer(100).capacity() < 5000);
    }
}
