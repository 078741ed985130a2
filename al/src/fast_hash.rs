//! A cheap hasher for maps keyed by identifiers this process hands out
//! (QPNs, LIDs, GIDs of configured ports, local comm ids).
//!
//! The standard `HashMap` hashes with SipHash, which resists keys chosen by
//! an attacker to collide, at some hundred instructions per lookup. The
//! soft fabric looks up a QP and a port on every packet and the CM routes
//! every event by id, and none of those keys is chosen by a peer: they are
//! allocated here. For such keys a multiply-rotate hash is enough and
//! several times cheaper. Keys a remote peer controls (remote comm ids,
//! remote QPNs in the CM tables) must not use it; those tables stay ordered
//! maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate hasher over the key's words (the FxHash scheme).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

/// An odd constant with well-spread bits (2^64 / golden ratio).
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and a tag from the
        // top seven: fold the well-mixed high half into the low half.
        self.0 ^ (self.0 >> 32)
    }
}

/// `BuildHasher` for [`IdHasher`].
pub type IdBuildHasher = BuildHasherDefault<IdHasher>;

/// A `HashMap` keyed by locally allocated identifiers; see the module docs.
pub type IdMap<K, V> = HashMap<K, V, IdBuildHasher>;

/// An empty [`IdMap`].
pub fn id_map<K, V>() -> IdMap<K, V> {
    HashMap::with_hasher(IdBuildHasher::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_spread_over_buckets_and_tags() {
        let b = IdBuildHasher::default();
        // Low 10 bits (bucket of a 1024-slot table) and top 7 bits (tag).
        let low: HashSet<u64> = (0u32..1024).map(|i| b.hash_one(i) & 1023).collect();
        let top: HashSet<u64> = (0u32..1024).map(|i| b.hash_one(i) >> 57).collect();
        assert!(low.len() > 600, "{} distinct low-bit buckets", low.len());
        assert!(top.len() > 100, "{} distinct tags", top.len());
    }

    #[test]
    fn a_map_works_for_tuple_and_byte_keys() {
        let mut m: IdMap<(usize, u8), u32> = id_map();
        let mut g: IdMap<[u8; 16], u32> = id_map();
        for i in 0..1000u32 {
            m.insert((i as usize, (i % 3) as u8), i);
            let mut gid = [0u8; 16];
            gid[15] = i as u8;
            gid[14] = (i >> 8) as u8;
            g.insert(gid, i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(g.len(), 1000);
        assert_eq!(m.get(&(999, 0)), Some(&999));
        assert_eq!(m.get(&(999, 1)), None);
    }
}
