//! Memory regions of the soft provider: the key table and bounds checks.

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::{Arc, RwLock};
use al::{Error, Result};
use slab::Slab;

use crate::identity::Identity;
use crate::queues::{Posted, RecvEntries, SharedPosted};
use provider::buffer::for_providers::{Lease, Memory};
use provider::{Access, Sge};

/// A registered region as the data path sees it.
pub(crate) struct MrInner {
    pub(crate) key: u32,
    pub(crate) pd: Identity,
    pub(crate) access: Access,
    pub(crate) iova: u64,
    pub(crate) len: usize,
    pub(crate) mem: Arc<Memory>,
    /// Offset of the MR's first byte in `mem`.
    pub(crate) mem_off: usize,
    /// Set (under the table's write lock) when the MR leaves the table, so
    /// a holder of an `Arc` (the batched send path's cache) can tell that
    /// its key no longer names it.
    pub(crate) deregistered: AtomicBool,
}

impl MrInner {
    /// The lease an SGE naming this MR takes, if its range lies inside.
    pub(crate) fn lease_of(&self, sge: &Sge) -> Option<Lease> {
        let len = sge.length as usize;
        if len == 0 || sge.lkey != self.key {
            return None;
        }
        let start = self.locate(sge.addr, len)?;
        Some(Lease {
            key: self.key,
            start,
            end: start + len,
        })
    }

    /// The offset in `mem` of `len` bytes at `addr`, if they lie inside
    /// the MR.
    #[inline]
    pub(crate) fn locate(&self, addr: u64, len: usize) -> Option<usize> {
        let off = addr.checked_sub(self.iova)?;
        let end = off.checked_add(len as u64)?;
        if end > self.len as u64 {
            return None;
        }
        Some(self.mem_off + off as usize)
    }
}

/// Per-HCA table of MRs by key. A key is `(slot + 1) << shift | tag`: the
/// slot takes the fewest bits that hold the table's maximum, the tag all
/// the others. Tags come from one counter shared by every table of the
/// process, so a stale key misses (the tag changed) and, as far as 32 bits
/// allow, a key of another device does not name an MR here: two fresh
/// devices used to hand out the very same keys, so an lkey or rkey of the
/// wrong device silently named a look-alike MR of the right one (issue 12).
/// A key is still a per-device name, as on hardware: what protects memory
/// is that it is looked up only in the device's own table and must name an
/// MR of the QP's PD, whose identity is unique across devices.
pub(crate) struct MrTable {
    slots: RwLock<Slab<Arc<MrInner>>>,
    shift: u32,
    max: usize,
}

/// The largest MR count a table can key: the slot needs at least 8 tag
/// bits beside it.
pub(crate) const MAX_MRS: u32 = (1 << 24) - 1;

fn next_tag() -> u32 {
    // A plain std atomic, also under loom: a static cannot hold a loom
    // atomic, and the tag only needs to differ from recent ones.
    al::global! {
        static NEXT: al::sync::atomic::AtomicU32 = al::sync::atomic::AtomicU32::new(0x5a);
    }
    NEXT.fetch_add(1, al::sync::atomic::Ordering::Relaxed)
}

impl MrTable {
    /// A table of at most `max` MRs (clamped to [`MAX_MRS`]).
    pub(crate) fn new(max: u32) -> MrTable {
        let max = max.min(MAX_MRS);
        let slot_bits = (32 - max.leading_zeros()).max(1);
        MrTable {
            slots: RwLock::new(Slab::new()),
            shift: 32 - slot_bits,
            max: max as usize,
        }
    }

    pub(crate) fn insert(&self, make: impl FnOnce(u32) -> MrInner) -> Result<Arc<MrInner>> {
        let mut slots = self.slots.write();
        if slots.len() >= self.max {
            return Err(Error::insufficient_resources(format!(
                "max_mr reached: the HCA allows {} MRs",
                self.max
            )));
        }
        let entry = slots.vacant_entry();
        let tag = next_tag() & ((1 << self.shift) - 1);
        // slot + 1 <= max < 2^slot_bits, so this does not overflow.
        let key = ((entry.key() as u32 + 1) << self.shift) | tag;
        let mr = Arc::new(make(key));
        entry.insert(mr.clone());
        Ok(mr)
    }

    /// MRs registered now.
    pub(crate) fn len(&self) -> usize {
        self.slots.read().len()
    }

    #[inline]
    fn slot(&self, key: u32) -> Option<usize> {
        Some((key >> self.shift).checked_sub(1)? as usize)
    }

    #[inline]
    pub(crate) fn lookup(&self, key: u32) -> Option<Arc<MrInner>> {
        let idx = self.slot(key)?;
        let slots = self.slots.read();
        let mr = slots.get(idx)?;
        (mr.key == key).then(|| mr.clone())
    }

    /// Lease the bytes of a send that is held in its send queue past its
    /// post (behind an RNR NAK, or posted in SQD): each SGE whose key names
    /// a registered MR and whose range lies inside it. Returns whether
    /// [`MrTable::release`] must be called when it leaves the queue.
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

    /// Release what [`MrTable::hold`] took for `sg`. An SGE whose key
    /// names no MR now needs nothing: deregistration dropped its leases.
    pub(crate) fn release(&self, sg: &[Sge]) {
        for sge in sg {
            if let Some(mr) = self.lookup(sge.lkey) {
                if let Some(lease) = mr.lease_of(sge) {
                    mr.mem.in_flight.unhold(&lease);
                }
            }
        }
    }

    /// Register `queue` with the memory of the MR that `sge` names, so its
    /// queued requests count as in flight there. `seen` remembers the
    /// last few keys the queue registered for, so a post costs a compare.
    #[inline]
    pub(crate) fn note_poster<Q: RecvEntries>(
        &self,
        sge: &Sge,
        seen: &mut SeenKeys,
        queue: &Arc<Posted<Q>>,
    ) {
        if !seen.contains(sge.lkey) {
            self.note_poster_slow(sge.lkey, seen, queue);
        }
    }

    #[cold]
    fn note_poster_slow<Q: RecvEntries>(
        &self,
        key: u32,
        seen: &mut SeenKeys,
        queue: &Arc<Posted<Q>>,
    ) {
        if let Some(mr) = self.lookup(key) {
            mr.mem.in_flight.add_queue(&SharedPosted(queue.clone()));
            seen.insert(key);
        }
    }

    pub(crate) fn remove(&self, key: u32) {
        let Some(idx) = self.slot(key) else {
            return;
        };
        let mut slots = self.slots.write();
        if slots.get(idx).is_some_and(|m| m.key == key) {
            let mr = slots.remove(idx);
            mr.deregistered.store(true, Ordering::Release);
        }
    }
}

/// One resolved piece of a scatter/gather list: `len` bytes at `off` in the
/// MR's memory.
pub(crate) struct Seg {
    pub(crate) mr: Arc<MrInner>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

const INLINE: usize = 4;

/// A resolved scatter/gather list; up to four pieces without allocating.
pub(crate) struct SegList {
    inline: [Option<Seg>; INLINE],
    n: usize,
    heap: Vec<Seg>,
    pub(crate) total: usize,
}

impl SegList {
    pub(crate) fn new() -> SegList {
        SegList {
            inline: [None, None, None, None],
            n: 0,
            heap: Vec::new(),
            total: 0,
        }
    }

    pub(crate) fn one(seg: Seg) -> SegList {
        let mut l = SegList::new();
        l.push(seg);
        l
    }

    pub(crate) fn push(&mut self, seg: Seg) {
        self.total += seg.len;
        if self.n < INLINE {
            self.inline[self.n] = Some(seg);
        } else {
            self.heap.push(seg);
        }
        self.n += 1;
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Seg> {
        self.inline[..self.n.min(INLINE)]
            .iter()
            .flatten()
            .chain(self.heap.iter())
    }
}

/// Resolve a local scatter/gather list: every element's key must name an
/// MR of `pd` with the rights in `need`, and its bytes must lie inside it.
pub(crate) fn resolve_local(
    table: &MrTable,
    pd: Identity,
    sges: &[Sge],
    need: Access,
) -> Option<SegList> {
    let mut list = SegList::new();
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        let mr = table.lookup(sge.lkey)?;
        if mr.pd != pd || !mr.access.contains(need) {
            return None;
        }
        let off = mr.locate(sge.addr, sge.length as usize)?;
        list.push(Seg {
            mr,
            off,
            len: sge.length as usize,
        });
    }
    Some(list)
}

/// Resolve a remote access: `len` bytes at `addr` under `rkey`.
pub(crate) fn resolve_remote(
    table: &MrTable,
    pd: Identity,
    rkey: u32,
    addr: u64,
    len: usize,
    need: Access,
) -> Option<Seg> {
    let mr = table.lookup(rkey)?;
    if mr.pd != pd || !mr.access.contains(need) {
        return None;
    }
    let off = mr.locate(addr, len)?;
    Some(Seg { mr, off, len })
}

/// Where message bytes come from.
#[derive(Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// Straight from the sender's memory (synchronous delivery: one copy).
    List(&'a SegList),
    /// From a queued packet.
    Bytes(&'a [u8]),
}

impl Payload<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::List(l) => l.total,
            Payload::Bytes(b) => b.len(),
        }
    }
}

/// Copy the whole payload into `dst`, starting `skip` bytes into it. The
/// caller checked `skip + payload.len() <= dst.total`. False when a raw
/// region vanished mid-way (bytes already copied stay inside their MRs).
pub(crate) fn scatter(src: Payload<'_>, dst: &SegList, skip: usize) -> bool {
    match src {
        Payload::Bytes(b) => {
            let mut pos = 0; // position in the destination list
            let mut done = 0; // bytes of `b` copied
            for d in dst.iter() {
                if done == b.len() {
                    break;
                }
                let start = skip.saturating_sub(pos).min(d.len);
                pos += d.len;
                let n = (d.len - start).min(b.len() - done);
                if n == 0 {
                    continue;
                }
                let ok =
                    d.mr.mem
                        .with_mut(|m| {
                            m[d.off + start..d.off + start + n].copy_from_slice(&b[done..done + n])
                        })
                        .is_some();
                if !ok {
                    return false;
                }
                done += n;
            }
            true
        }
        Payload::List(s) => copy_lists(s, dst, skip, s.total),
    }
}

/// Copy `len` bytes from the start of `src` into `dst` from `skip`.
pub(crate) fn copy_lists(src: &SegList, dst: &SegList, skip: usize, len: usize) -> bool {
    let mut si = src.iter();
    let mut di = dst.iter();
    let mut cur_s = si.next();
    let mut s_used = 0;
    // Skip into the destination.
    let mut cur_d = di.next();
    let mut d_used = skip;
    while let Some(d) = cur_d {
        if d_used < d.len {
            break;
        }
        d_used -= d.len;
        cur_d = di.next();
    }
    let mut left = len;
    while left > 0 {
        let (Some(s), Some(d)) = (cur_s, cur_d) else {
            break;
        };
        let n = (s.len - s_used).min(d.len - d_used).min(left);
        if !provider::buffer::for_providers::copy(
            &s.mr.mem,
            s.off + s_used,
            &d.mr.mem,
            d.off + d_used,
            n,
        ) {
            return false;
        }
        left -= n;
        s_used += n;
        d_used += n;
        if s_used == s.len {
            cur_s = si.next();
            s_used = 0;
        }
        if d_used == d.len {
            cur_d = di.next();
            d_used = 0;
        }
    }
    true
}

/// Copy a list's bytes into a new vector (queued packets).
pub(crate) fn gather(src: &SegList) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(src.total);
    for s in src.iter() {
        s.mr.mem
            .with(|m| v.extend_from_slice(&m[s.off..s.off + s.len]))?;
    }
    Some(v)
}

/// The last few MR keys a receive queue registered itself for (see
/// [`MrTable::note_poster`]); 0 is never a key.
#[derive(Debug, Default)]
pub(crate) struct SeenKeys {
    keys: [u32; 4],
    next: usize,
}

impl SeenKeys {
    #[inline]
    fn contains(&self, key: u32) -> bool {
        self.keys.contains(&key)
    }

    fn insert(&mut self, key: u32) {
        self.keys[self.next] = key;
        self.next = (self.next + 1) % self.keys.len();
    }
}
