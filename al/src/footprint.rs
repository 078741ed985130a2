//! What the access layer itself holds for one live object: the sizes a
//! deployment is planned with (`docs/scale.md`) and `ibal perf scale`
//! compares with the resident memory it measures.
//!
//! Sizes are of the allocations as the system allocator makes them (glibc
//! rounds each request plus its 8-byte header up to 16 bytes, at least
//! 32), so they add up to what the process pays, not to `size_of`.

use crate::handle::RawHandle;
use crate::object::{Core, Obj, Object};
use std::mem::size_of;

/// One live object's bytes in the access layer, by where they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// The `Arc` allocation of the object and its body.
    pub object: usize,
    /// The `Arc` allocation of its [`Core`] (handle, parent, children,
    /// destroy callback).
    pub core: usize,
    /// Its slot in its type's handle table (one cache line).
    pub slot: usize,
    /// Its entry in its parent's child set (hashed; load factor 7/8).
    pub child_entry: usize,
}

impl Footprint {
    /// All of it.
    pub fn total(&self) -> usize {
        self.object + self.core + self.slot + self.child_entry
    }
}

/// The bytes a request of `n` bytes takes from the system allocator.
pub fn allocated(n: usize) -> usize {
    ((n + 8).div_ceil(16) * 16).max(32)
}

/// Bytes of an `Arc<T>`'s allocation (two counts and the value).
pub fn arc_bytes<T>() -> usize {
    allocated(2 * size_of::<usize>() + size_of::<T>())
}

/// The access layer's [`Footprint`] of an object of type `T` (every object
/// of a type costs the same here; what its body owns beyond its struct is
/// the body's own affair, e.g. `qp::Qp::footprint`).
pub fn footprint<T: Object>() -> Footprint {
    Footprint {
        object: arc_bytes::<Obj<T>>(),
        core: arc_bytes::<Core>(),
        slot: crate::table::slot_bytes::<Obj<T>>(),
        child_entry: (size_of::<(RawHandle, crate::children::DestroyFn)>() + 1) * 8 / 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_round_like_the_system_allocator() {
        assert_eq!(allocated(0), 32);
        assert_eq!(allocated(24), 32);
        assert_eq!(allocated(25), 48);
        assert_eq!(allocated(100), 112);
        assert_eq!(arc_bytes::<[u8; 48]>(), allocated(64));
    }
}
