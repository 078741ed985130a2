//! Local communication id allocator: a slab whose slots carry a generation
//! "modifier", as IBAL's did, behind a keyed permutation.
//!
//! A slot's internal id is `index | modifier << INDEX_BITS`. Freed indices go
//! to the back of a FIFO free list and their modifier advances, so an
//! internal id is not handed out again until the index has been through
//! every other free slot *and* its modifier has wrapped (4095 generations).
//! The modifier is never zero, so no internal id is zero.
//!
//! The id that names the slot everywhere else (the `ConnId`, the comm id on
//! the wire) is the internal id under the endpoint's keyed permutation
//! ([`IdCipher`]): distinct internal ids give distinct ids, none is zero
//! (zero means "unknown" in REJ and MRA comm id fields), and without the key
//! an id says nothing about any other: not its index, not its modifier,
//! not the next id. Looking an id up inverts the permutation and then
//! checks the slot's index and modifier, so a stale or forged id finds
//! nothing. A small direct-mapped table remembers which slot recent ids
//! name, so the common lookup costs a compare instead of the ten hash
//! rounds of the inverse.
//!
//! Slots live in chunks that never move: chunk `k` holds `16 << k` slots,
//! so growing the slab allocates one new chunk instead of copying every
//! entry. An entry is a whole connection (about 700 bytes then, 208 now)
//! and the slab grows under the agent's lock: with one vector, the insert
//! that doubled it from 16k entries copied 11 MB and took 5-6 ms, during which every
//! MAD of the port waited (measured once, 300k inserts; the worst chunked
//! insert took under 0.3 ms, at no particular index).

use std::collections::VecDeque;

use crate::keyed::{IdCipher, IdKey};

/// Bits of an internal id that select the slot.
pub(crate) const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Largest modifier; modifiers run 1..=MODIFIER_MAX.
const MODIFIER_MAX: u32 = u32::MAX >> INDEX_BITS;
/// The first chunk holds `1 << FIRST_CHUNK_BITS` slots; each next one twice
/// as many as the one before.
const FIRST_CHUNK_BITS: u32 = 4;
/// Entries of the id -> slot hint table (16 KiB): the ids of up to this
/// many live CEPs are found without inverting the permutation.
const HINT_BITS: u32 = 12;
/// A hint entry that names no slot.
const NO_HINT: u32 = u32::MAX;

#[derive(Debug)]
struct Slot<T> {
    modifier: u32,
    /// The slot's current id: `compose(index, modifier)` under the cipher.
    id: u32,
    value: Option<T>,
}

#[derive(Debug)]
pub(crate) struct IdSlab<T> {
    /// Chunk `k` has room for `1 << (FIRST_CHUNK_BITS + k)` slots and is
    /// never reallocated: only the last one is not full.
    chunks: Vec<Vec<Slot<T>>>,
    /// Slots created so far (indices `0..slots`).
    slots: u32,
    free: VecDeque<u32>,
    len: usize,
    capacity: u32,
    cipher: IdCipher,
    /// `hints[id & (hints.len() - 1)]`: the index of the slot that last got an id
    /// with these low bits (a hint only: checked against the slot's id).
    hints: Box<[u32]>,
}

/// Bytes of one slot of an [`IdSlab`] of `T` (one allocated id).
pub(crate) fn slot_bytes<T>() -> usize {
    std::mem::size_of::<Slot<T>>()
}

const fn compose(index: u32, modifier: u32) -> u32 {
    (index & INDEX_MASK) | (modifier << INDEX_BITS)
}

/// Chunk and position of slot `index` (below `1 << INDEX_BITS`).
const fn locate(index: u32) -> (usize, usize) {
    let j = index + (1 << FIRST_CHUNK_BITS);
    let log = 31 - j.leading_zeros();
    let chunk = log - FIRST_CHUNK_BITS;
    (chunk as usize, (j - (1 << log)) as usize)
}

const fn next_modifier(m: u32) -> u32 {
    if m >= MODIFIER_MAX {
        1
    } else {
        m + 1
    }
}

impl<T> IdSlab<T> {
    /// A slab of at most `capacity` ids (and at most `2^20`), whose ids
    /// are its internal ids under the permutation keyed by `key`.
    pub fn new(capacity: u32, key: IdKey) -> Self {
        Self {
            chunks: Vec::new(),
            slots: 0,
            free: VecDeque::new(),
            len: 0,
            capacity: capacity.min(INDEX_MASK + 1),
            cipher: IdCipher::new(key),
            hints: vec![NO_HINT; 1 << HINT_BITS].into_boxed_slice(),
        }
    }

    /// Where `id`'s hint lives.
    fn hint_at(&self, id: u32) -> usize {
        (id as usize) & (self.hints.len() - 1)
    }

    /// Keeps at least one hint per slot: a table smaller than the slots
    /// misses for most ids (at a million CEPs, all but 1 in 256), and each
    /// miss pays the inverse permutation (ten SipHash rounds): a connect
    /// then cost more the more connections there were (`perf scale`). The
    /// table doubles when the slots outgrow it and is refilled from the
    /// slots (hints are only hints: a lost one costs one permutation), so
    /// its cost per id stays one `u32` and O(1) amortized.
    fn grow_hints(&mut self) {
        if (self.slots as usize) <= self.hints.len() {
            return;
        }
        let size = (self.slots as usize).next_power_of_two();
        let mut hints = vec![NO_HINT; size].into_boxed_slice();
        for (index, slot) in self.chunks.iter().flatten().enumerate() {
            if slot.value.is_some() {
                hints[(slot.id as usize) & (size - 1)] = index as u32;
            }
        }
        self.hints = hints;
    }

    /// Allocates an id and stores `make(id)` under it.
    pub fn insert_with(&mut self, make: impl FnOnce(u32) -> T) -> Option<u32> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = self.slots;
                if i >= self.capacity {
                    return None;
                }
                let (chunk, _) = locate(i);
                if chunk == self.chunks.len() {
                    self.chunks
                        .push(Vec::with_capacity(1 << (FIRST_CHUNK_BITS as usize + chunk)));
                }
                let id = self.cipher.encrypt(compose(i, 1));
                self.chunks.get_mut(chunk)?.push(Slot {
                    modifier: 1,
                    id,
                    value: None,
                });
                self.slots += 1;
                self.grow_hints();
                i
            }
        };
        let slot = self.slot_mut(index)?;
        let id = slot.id;
        slot.value = Some(make(id));
        let at = self.hint_at(id);
        if let Some(hint) = self.hints.get_mut(at) {
            *hint = index;
        }
        self.len += 1;
        Some(id)
    }

    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let (chunk, at) = locate(index & INDEX_MASK);
        self.chunks.get(chunk)?.get(at)
    }

    fn slot_mut(&mut self, index: u32) -> Option<&mut Slot<T>> {
        let (chunk, at) = locate(index & INDEX_MASK);
        self.chunks.get_mut(chunk)?.get_mut(at)
    }

    /// The index of the slot `id` names now, if any: the hint if it is
    /// right, else the inverse permutation and the slot's modifier check.
    fn index_of(&self, id: u32) -> Option<u32> {
        let hint = self.hints.get(self.hint_at(id)).copied().unwrap_or(NO_HINT);
        if hint < self.slots && self.slot(hint).is_some_and(|s| s.id == id) {
            return Some(hint);
        }
        let internal = self.cipher.decrypt(id)?;
        let index = internal & INDEX_MASK;
        let slot = self.slot(index).filter(|_| index < self.slots)?;
        (slot.modifier == internal >> INDEX_BITS).then_some(index)
    }

    pub fn get(&self, id: u32) -> Option<&T> {
        let index = self.index_of(id)?;
        self.slot(index)?.value.as_ref()
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        let index = self.index_of(id)?;
        self.slot_mut(index)?.value.as_mut()
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        let index = self.index_of(id)?;
        let cipher = self.cipher;
        let slot = self.slot_mut(index)?;
        let value = slot.value.take()?;
        slot.modifier = next_modifier(slot.modifier);
        slot.id = cipher.encrypt(compose(index, slot.modifier));
        self.free.push_back(index);
        self.len -= 1;
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> + '_ {
        self.chunks
            .iter()
            .flatten()
            .filter_map(|s| s.value.as_ref().map(|v| (s.id, v)))
    }

    /// Checks the allocator's own bookkeeping.
    pub fn check(&self) -> Result<(), String> {
        let slots = self.slots as usize;
        for (k, chunk) in self.chunks.iter().enumerate() {
            let room = 1usize << (FIRST_CHUNK_BITS as usize + k);
            let full = k + 1 < self.chunks.len();
            if chunk.capacity() < room || chunk.len() > room || (full && chunk.len() != room) {
                return Err(format!(
                    "chunk {k}: {} of {} slots used, room {room}",
                    chunk.len(),
                    chunk.capacity()
                ));
            }
        }
        let created: usize = self.chunks.iter().map(Vec::len).sum();
        if created != slots {
            return Err(format!("slab counts {slots} slots but holds {created}"));
        }
        let occupied = self
            .chunks
            .iter()
            .flatten()
            .filter(|s| s.value.is_some())
            .count();
        if occupied != self.len {
            return Err(format!("slab len {} but {occupied} occupied", self.len));
        }
        if occupied + self.free.len() != slots {
            return Err(format!(
                "slab: {occupied} occupied + {} free != {slots} slots",
                self.free.len(),
            ));
        }
        let mut seen = vec![false; slots];
        for &i in &self.free {
            match (
                self.slot(i).filter(|_| i < self.slots),
                seen.get_mut(i as usize),
            ) {
                (Some(s), Some(flag)) => {
                    if s.value.is_some() {
                        return Err(format!("free index {i} is occupied"));
                    }
                    if *flag {
                        return Err(format!("index {i} twice on the free list"));
                    }
                    *flag = true;
                }
                _ => return Err(format!("free index {i} out of range")),
            }
        }
        for (i, s) in self.chunks.iter().flatten().enumerate() {
            if s.modifier == 0 || s.modifier > MODIFIER_MAX {
                return Err(format!("slot {i} has modifier {}", s.modifier));
            }
            let index = u32::try_from(i).map_err(|_| format!("slot {i} past u32"))?;
            if s.id == 0 || s.id != self.cipher.encrypt(compose(index, s.modifier)) {
                return Err(format!("slot {i} holds id {:#x} for its modifier", s.id));
            }
            if self.index_of(s.id) != Some(index) {
                return Err(format!("id {:#x} does not find slot {i}", s.id));
            }
        }
        if let Some(h) = self
            .hints
            .iter()
            .find(|&&h| h != NO_HINT && h >= self.slots)
        {
            return Err(format!("hint {h} names no slot"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> IdKey {
        IdKey::fixed(k, k.rotate_left(32) ^ 0x5a5a)
    }

    /// The internal id behind `id`.
    fn internal<T>(s: &IdSlab<T>, id: u32) -> u32 {
        s.cipher.decrypt(id).unwrap()
    }

    #[test]
    fn ids_are_nonzero_and_not_reused_immediately() {
        let mut s = IdSlab::new(4, key(0));
        let a = s.insert_with(|id| id).unwrap();
        assert_ne!(a, 0);
        assert_eq!(s.get(a), Some(&a));
        assert_eq!(s.remove(a), Some(a));
        assert_eq!(s.get(a), None);
        let b = s.insert_with(|id| id).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            internal(&s, a) & INDEX_MASK,
            internal(&s, b) & INDEX_MASK,
            "FIFO reuses the only free index"
        );
        assert_eq!(s.remove(a), None, "old id does not remove the new entry");
        assert_eq!(s.get(0), None);
        s.check().unwrap();
    }

    #[test]
    fn capacity_is_enforced() {
        let mut s = IdSlab::new(2, key(7));
        let a = s.insert_with(|_| ()).unwrap();
        s.insert_with(|_| ()).unwrap();
        assert!(s.insert_with(|_| ()).is_none());
        s.remove(a).unwrap();
        assert!(s.insert_with(|_| ()).is_some());
        assert_eq!(s.len(), 2);
        s.check().unwrap();
    }

    #[test]
    fn chunks_double_and_never_move() {
        for (index, want) in [
            (0, (0, 0)),
            (15, (0, 15)),
            (16, (1, 0)),
            (47, (1, 31)),
            (48, (2, 0)),
            (INDEX_MASK, (16, (INDEX_MASK + 16 - (1 << 20)) as usize)),
        ] {
            assert_eq!(locate(index), want, "index {index}");
        }
        let mut s = IdSlab::new(1000, key(3));
        let first = s.insert_with(|id| id).unwrap();
        let at = s.get(first).unwrap() as *const u32;
        let ids: Vec<u32> = (0..999).map(|_| s.insert_with(|id| id).unwrap()).collect();
        assert!(s.insert_with(|id| id).is_none(), "capacity 1000");
        assert_eq!(
            s.get(first).unwrap() as *const u32,
            at,
            "growing moved an entry"
        );
        for &id in &ids {
            assert_eq!(s.get(id), Some(&id));
        }
        assert_eq!(s.iter().count(), 1000);
        assert!(
            s.iter().all(|(id, v)| id == *v),
            "iter pairs ids and values"
        );
        s.check().unwrap();
        for &id in ids.iter().step_by(3) {
            assert_eq!(s.remove(id), Some(id));
        }
        s.check().unwrap();
    }

    /// More live ids than hint entries: ids whose hint another id took are
    /// found through the inverse permutation; stale ids, ids of another
    /// key and made-up ids find nothing.
    #[test]
    fn the_hints_grow_with_the_slots_so_most_lookups_skip_the_permutation() {
        let mut s: IdSlab<u32> = IdSlab::new(1 << 20, key(9));
        let ids: Vec<u32> = (0..1u32 << 16)
            .map(|i| s.insert_with(|_| i).unwrap())
            .collect();
        assert!(s.hints.len() >= s.slots as usize, "{} hints", s.hints.len());
        let hinted = ids
            .iter()
            .enumerate()
            .filter(|&(i, &id)| s.hints[s.hint_at(id)] == i as u32)
            .count();
        // One hint per slot: a random id keeps its hint with probability
        // (1 - 1/e) or so; a fixed 4,096-entry table would keep 1 in 16.
        assert!(hinted * 2 > ids.len(), "{hinted} of {} hinted", ids.len());
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(s.get(id), Some(&(i as u32)));
        }
        s.check().unwrap();
    }

    #[test]
    fn lookups_past_the_hints_and_forged_ids() {
        let n = 3 << HINT_BITS;
        let mut s = IdSlab::new(n, key(11));
        let ids: Vec<u32> = (0..n).map(|_| s.insert_with(|id| id).unwrap()).collect();
        for &id in &ids {
            assert_eq!(s.get(id), Some(&id));
        }
        s.check().unwrap();
        let freed: Vec<u32> = ids.iter().copied().step_by(2).collect();
        for &id in &freed {
            assert_eq!(s.remove(id), Some(id));
        }
        let again: Vec<u32> = (0..freed.len())
            .map(|_| s.insert_with(|id| id).unwrap())
            .collect();
        for &id in &freed {
            assert_eq!(s.get(id), None, "stale id {id:#x} found an entry");
        }
        for &id in &again {
            assert_eq!(s.get(id), Some(&id));
        }
        let other = IdSlab::<()>::new(n, key(12));
        let foreign = (0..n).map(|i| other.cipher.encrypt(compose(i, 1)));
        let made_up = (1..=50_000u32).map(|i| i.wrapping_mul(0x9E37_79B1));
        let live: std::collections::HashSet<u32> = s.iter().map(|(id, _)| id).collect();
        for id in foreign.chain(made_up).filter(|id| !live.contains(id)) {
            assert_eq!(s.get(id), None, "forged id {id:#x} found an entry");
        }
        s.check().unwrap();
    }

    /// One slot used over and over (a listener started and stopped): the
    /// internal ids step by exactly `1 << 20`, the ids do not. Every bit
    /// is set in about half of them, consecutive ids differ in about half
    /// their bits, and no difference repeats more than chance allows. A
    /// slab under another key hands out other ids.
    #[test]
    fn reused_slots_give_ids_without_structure() {
        let n = 2048usize;
        let cycle = |k| {
            let mut s = IdSlab::new(4, key(k));
            (0..n)
                .map(|_| {
                    let id = s.insert_with(|_| ()).unwrap();
                    s.remove(id).unwrap();
                    id
                })
                .collect::<Vec<u32>>()
        };
        let ids = cycle(21);
        for bit in 0..32 {
            let ones = ids.iter().filter(|&&id| id >> bit & 1 == 1).count();
            // Mean n/2 = 1024, standard deviation about 23: +-150 is 6.5 sigma.
            assert!(
                (874..=1174).contains(&ones),
                "bit {bit} set in {ones} of {n}"
            );
        }
        let flips: u32 = ids.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).sum();
        let mean = f64::from(flips) / (n - 1) as f64;
        assert!((15.0..=17.0).contains(&mean), "{mean} bits flip per step");
        let mut steps: Vec<u32> = ids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        steps.sort_unstable();
        steps.dedup();
        assert!(steps.len() > n - 8, "only {} distinct steps", steps.len());
        let other = cycle(22);
        let same = ids.iter().zip(&other).filter(|(a, b)| a == b).count();
        assert_eq!(same, 0, "two keys gave {same} equal ids");
    }

    #[test]
    fn modifier_wraps_and_skips_zero() {
        assert_eq!(next_modifier(MODIFIER_MAX), 1);
        let mut s = IdSlab::new(1, key(0));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..MODIFIER_MAX {
            let id = s.insert_with(|_| ()).unwrap();
            assert_ne!(id, 0);
            assert!(seen.insert(id), "id {id:#x} reused before wrap");
            s.remove(id).unwrap();
        }
        assert_eq!(seen.len() as u32, MODIFIER_MAX);
    }
}
