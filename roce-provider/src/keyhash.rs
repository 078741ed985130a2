//! The hash of the provider's per-packet lookup tables (QPN -> QP, key ->
//! MR, GID -> UDP address): each 64-bit word of the key through a
//! multiply-xorshift finalizer, about a dozen instructions for a `u32`
//! where std's SipHash-1-3 took ~110, and the GID ~230 (callgrind over
//! `ibal perf send-lat --transport udp`: ~2,300 instructions of hashing
//! per round trip, about a tenth of the provider's work).
//!
//! SipHash's keyed hashing guards a table whose *keys* an attacker
//! chooses. Here a datagram from the network only looks keys up; the
//! tables hold what this process inserted (QPNs it assigned, L/R_Keys
//! drawn at random by `keys.rs`, GIDs the application configured), so a
//! stranger cannot fill a bucket, only probe one of its short chains.

use std::hash::{BuildHasher, Hasher};

/// Builds [`KeyHasher`]s (use as `HashMap<K, V, KeyHash>`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyHash;

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// The running state: each word is xored in and the state goes through
/// MurmurHash3's 64-bit finalizer (two multiplies, three shifts), so
/// every input bit reaches every output bit. (A bare multiply, as
/// Fx-style hashers do, carries a change only upwards: GIDs that differ
/// in one byte collided, see the test below.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl KeyHasher {
    fn mix(&mut self, word: u64) {
        let mut h = self.0 ^ word;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        self.0 = h;
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn hash<T: std::hash::Hash>(v: &T) -> u64 {
        KeyHash.hash_one(v)
    }

    /// Keys that differ only in their high bits (QPNs a base apart, keys
    /// with the same index and another generation) still land in
    /// different buckets of a small table, and carry different tags.
    #[test]
    fn keys_spread_over_low_bits_and_tags() {
        for (step, n) in [
            (1u32, 256u32),
            (1 << 8, 256),
            (1 << 16, 256),
            (1 << 24, 256),
        ] {
            let keys: Vec<u32> = (0..n)
                .map(|i| 0x1234_5678u32.wrapping_add(i * step))
                .collect();
            let buckets: HashSet<u64> = keys.iter().map(|k| hash(k) & 1023).collect();
            let tags: HashSet<u64> = keys.iter().map(|k| hash(k) >> 57).collect();
            assert!(
                buckets.len() > 150,
                "step {step:#x}: {} buckets",
                buckets.len()
            );
            assert!(tags.len() > 64, "step {step:#x}: {} tags", tags.len());
        }
    }

    #[test]
    fn gids_that_differ_in_one_byte_hash_differently() {
        let base = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        let mut seen = HashSet::new();
        for at in 0..16 {
            for v in 0..=255u8 {
                let mut g = base;
                g[at] ^= v;
                seen.insert(hash(&g));
            }
        }
        // Each (position, value) pair gives one GID; v = 0 is the base.
        assert_eq!(seen.len(), 16 * 255 + 1);
    }
}
