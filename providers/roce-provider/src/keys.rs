//! Unpredictable numbers for memory keys: a counter run through SipHash
//! under keys the standard library draws from the operating system
//! (`RandomState`), so no dependency and no `unsafe`. A key seen on the
//! wire tells nothing about the next one without the hidden SipHash key.

use al::sync::atomic::{AtomicU64, Ordering};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A generator of unpredictable 32-bit values.
pub(crate) struct KeyGen {
    state: RandomState,
    counter: AtomicU64,
}

impl KeyGen {
    pub(crate) fn new() -> KeyGen {
        KeyGen {
            state: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    /// The next value.
    pub(crate) fn next_u32(&self) -> u32 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut h = self.state.build_hasher();
        h.write_u64(n);
        let v = h.finish();
        (v ^ (v >> 32)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_and_are_not_sequential() {
        let g = KeyGen::new();
        let v: Vec<u32> = (0..64).map(|_| g.next_u32()).collect();
        let mut sorted = v.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), v.len());
        let steps = v
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) == 1)
            .count();
        assert_eq!(steps, 0);
    }
}
