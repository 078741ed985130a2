//! A cheap hasher for maps keyed by identifiers this process hands out
//! (QPNs, LIDs, GIDs of configured ports, local comm ids).
//!
//! The standard `HashMap` hashes with SipHash, which resists keys chosen by
//! an attacker to collide, at some hundred instructions per lookup. The
//! soft fabric looks up a QP and a port on every packet and the CM routes
//! every event by id, and none of those keys is chosen by a peer: they are
//! allocated here. For such keys a multiply-rotate hash is enough and
//! several times cheaper (a dozen instructions for a `u32` against ~110;
//! the RoCEv2 provider's QPN, MR key and GID lookups hashed ~2,300
//! instructions per ping-pong round trip with SipHash). A packet from the
//! network may look any key up, but cannot insert one, so it cannot fill a
//! bucket. Keys a remote peer controls (remote comm ids,
//! remote QPNs in the CM tables) must not use it; those tables stay ordered
//! maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Each word of the key xored into the state, which then goes through
/// MurmurHash3's 64-bit finalizer (two multiplies, three xor-shifts), so
/// every input bit reaches every output bit. The FxHash scheme this
/// replaced (rotate, xor, one multiply) carries a change only upwards:
/// GIDs that differ in one byte of their first half collided outright
/// (`one_byte_changes_never_collide`).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        let mut h = self.0 ^ word;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        self.0 = h;
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
        self.0
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

    /// Keys that differ only in their high bits (QPNs a base apart, MR
    /// keys with one index and another generation) land in different
    /// buckets of a small table and carry different tags.
    #[test]
    fn ids_apart_by_high_bits_spread_too() {
        let b = IdBuildHasher::default();
        for step in [1u32 << 8, 1 << 16, 1 << 24] {
            let keys: Vec<u32> = (0..256)
                .map(|i| 0x1234_5678u32.wrapping_add(i * step))
                .collect();
            let low: HashSet<u64> = keys.iter().map(|k| b.hash_one(k) & 1023).collect();
            let top: HashSet<u64> = keys.iter().map(|k| b.hash_one(k) >> 57).collect();
            assert!(low.len() > 150, "step {step:#x}: {} buckets", low.len());
            assert!(top.len() > 64, "step {step:#x}: {} tags", top.len());
        }
    }

    #[test]
    fn one_byte_changes_never_collide() {
        let b = IdBuildHasher::default();
        let base = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        let mut seen = HashSet::new();
        for at in 0..16 {
            for v in 0..=255u8 {
                let mut g = base;
                g[at] ^= v;
                seen.insert(b.hash_one(g));
            }
        }
        // Each (position, value) pair gives one GID; v = 0 is the base.
        assert_eq!(seen.len(), 16 * 255 + 1);
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
