//! Local communication id allocator: a slab whose ids carry a generation
//! "modifier" in the upper bits, as IBAL did.
//!
//! An id is `index | modifier << INDEX_BITS`. Freed indices go to the back of
//! a FIFO free list and their modifier advances, so an id is not handed out
//! again until the index has been through every other free slot *and* its
//! modifier has wrapped (4095 generations). The modifier is never zero, so no
//! id is zero (zero means "unknown" in REJ and MRA RemoteCommID fields).

use std::collections::VecDeque;

/// Bits of an id that select the slot.
pub(crate) const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Largest modifier; modifiers run 1..=MODIFIER_MAX.
const MODIFIER_MAX: u32 = u32::MAX >> INDEX_BITS;

#[derive(Debug)]
struct Slot<T> {
    modifier: u32,
    value: Option<T>,
}

#[derive(Debug)]
pub(crate) struct IdSlab<T> {
    slots: Vec<Slot<T>>,
    free: VecDeque<u32>,
    len: usize,
    capacity: u32,
    seed: u32,
}

const fn compose(index: u32, modifier: u32) -> u32 {
    (index & INDEX_MASK) | (modifier << INDEX_BITS)
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
            slots: Vec::new(),
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
                let i = u32::try_from(self.slots.len()).ok()?;
                if i >= self.capacity {
                    return None;
                }
                let modifier = self.initial_modifier(i);
                self.slots.push(Slot {
                    modifier,
                    value: None,
                });
                i
            }
        };
        let slot = self.slots.get_mut(index as usize)?;
        let id = compose(index, slot.modifier);
        slot.value = Some(make(id));
        self.len += 1;
        Some(id)
    }

    fn slot_of(&self, id: u32) -> Option<&Slot<T>> {
        let slot = self.slots.get((id & INDEX_MASK) as usize)?;
        (slot.modifier == id >> INDEX_BITS).then_some(slot)
    }

    pub fn get(&self, id: u32) -> Option<&T> {
        self.slot_of(id)?.value.as_ref()
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        let slot = self.slots.get_mut((id & INDEX_MASK) as usize)?;
        if slot.modifier != id >> INDEX_BITS {
            return None;
        }
        slot.value.as_mut()
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        let index = id & INDEX_MASK;
        let slot = self.slots.get_mut(index as usize)?;
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
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let index = u32::try_from(i).ok()?;
            s.value.as_ref().map(|v| (compose(index, s.modifier), v))
        })
    }

    /// Checks the allocator's own bookkeeping.
    pub fn check(&self) -> Result<(), String> {
        let occupied = self.slots.iter().filter(|s| s.value.is_some()).count();
        if occupied != self.len {
            return Err(format!("slab len {} but {occupied} occupied", self.len));
        }
        if occupied + self.free.len() != self.slots.len() {
            return Err(format!(
                "slab: {occupied} occupied + {} free != {} slots",
                self.free.len(),
                self.slots.len()
            ));
        }
        let mut seen = vec![false; self.slots.len()];
        for &i in &self.free {
            match (self.slots.get(i as usize), seen.get_mut(i as usize)) {
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
        for (i, s) in self.slots.iter().enumerate() {
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
