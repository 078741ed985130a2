//! Local communication id allocator: a slab whose ids carry a generation
//! "modifier" in the upper bits, as IBAL did.
//!
//! An id is `index | modifier << INDEX_BITS`. Freed indices go to the back of
//! a FIFO free list and their modifier advances, so an id is not handed out
//! again until the index has been through every other free slot *and* its
//! modifier has wrapped (4095 generations). The modifier is never zero, so no
//! id is zero (zero means "unknown" in REJ and MRA RemoteCommID fields).
//!
//! Slots live in chunks that never move: chunk `k` holds `16 << k` slots,
//! so growing the slab allocates one new chunk instead of copying every
//! entry. An entry is a whole connection (about 700 bytes) and the slab
//! grows under the agent's lock: with one vector, the insert that doubled
//! it from 16k entries copied 11 MB and took 5-6 ms, during which every
//! MAD of the port waited (measured once, 300k inserts; the worst chunked
//! insert took under 0.3 ms, at no particular index).

use std::collections::VecDeque;

/// Bits of an id that select the slot.
pub(crate) const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Largest modifier; modifiers run 1..=MODIFIER_MAX.
const MODIFIER_MAX: u32 = u32::MAX >> INDEX_BITS;
/// The first chunk holds `1 << FIRST_CHUNK_BITS` slots; each next one twice
/// as many as the one before.
const FIRST_CHUNK_BITS: u32 = 4;

#[derive(Debug)]
struct Slot<T> {
    modifier: u32,
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
    seed: u32,
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
    pub fn new(capacity: u32, seed: u32) -> Self {
        Self {
            chunks: Vec::new(),
            slots: 0,
            free: VecDeque::new(),
            len: 0,
            capacity: capacity.min(INDEX_MASK + 1),
            seed,
        }
    }

    fn initial_modifier(&self, index: u32) -> u32 {
        let mixed = self
            .seed
            .wrapping_add(index.wrapping_mul(0x9E37_79B1))
            .rotate_left(7);
        1 + mixed % MODIFIER_MAX
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
                let modifier = self.initial_modifier(i);
                let (chunk, _) = locate(i);
                if chunk == self.chunks.len() {
                    self.chunks
                        .push(Vec::with_capacity(1 << (FIRST_CHUNK_BITS as usize + chunk)));
                }
                self.chunks.get_mut(chunk)?.push(Slot {
                    modifier,
                    value: None,
                });
                self.slots += 1;
                i
            }
        };
        let slot = self.slot_mut(index)?;
        let id = compose(index, slot.modifier);
        slot.value = Some(make(id));
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

    fn slot_of(&self, id: u32) -> Option<&Slot<T>> {
        let slot = self.slot(id)?;
        (slot.modifier == id >> INDEX_BITS).then_some(slot)
    }

    pub fn get(&self, id: u32) -> Option<&T> {
        self.slot_of(id)?.value.as_ref()
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        let slot = self.slot_mut(id)?;
        if slot.modifier != id >> INDEX_BITS {
            return None;
        }
        slot.value.as_mut()
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        let index = id & INDEX_MASK;
        let slot = self.slot_mut(index)?;
        if slot.modifier != id >> INDEX_BITS {
            return None;
        }
        let value = slot.value.take()?;
        slot.modifier = next_modifier(slot.modifier);
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
            .enumerate()
            .filter_map(|(i, s)| {
                let index = u32::try_from(i).ok()?;
                s.value.as_ref().map(|v| (compose(index, s.modifier), v))
            })
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
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_nonzero_and_not_reused_immediately() {
        let mut s = IdSlab::new(4, 0);
        let a = s.insert_with(|id| id).unwrap();
        assert_ne!(a, 0);
        assert_eq!(s.get(a), Some(&a));
        assert_eq!(s.remove(a), Some(a));
        assert_eq!(s.get(a), None);
        let b = s.insert_with(|id| id).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a & INDEX_MASK,
            b & INDEX_MASK,
            "FIFO reuses the only free index"
        );
        assert_eq!(s.remove(a), None, "old id does not remove the new entry");
        s.check().unwrap();
    }

    #[test]
    fn capacity_is_enforced() {
        let mut s = IdSlab::new(2, 7);
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
        let mut s = IdSlab::new(1000, 3);
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

    #[test]
    fn modifier_wraps_and_skips_zero() {
        assert_eq!(next_modifier(MODIFIER_MAX), 1);
        let mut s = IdSlab::new(1, 0);
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
