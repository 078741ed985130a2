//! Numbers a stranger cannot predict: SipHash-2-4 as a keyed
//! pseudo-random function, keys drawn from the operating system, the keyed
//! permutation that turns the comm id slab's internal ids into the ids
//! that go on the wire, and connections' starting PSNs.
//!
//! Why: a comm id or a PSN that can be predicted lets anyone who can reach
//! the port forge messages for a connection (`docs/security.md, "The CM"`). Each
//! value here is a function of a counter or a slot under a secret 128-bit
//! key, so values seen on the wire say nothing about the next one without
//! the key, and two agents (or processes) with the same CA GUID share
//! nothing.
//!
//! SipHash-2-4 is written out here (a few lines) rather than taken from
//! `std`, whose keyed `SipHasher` is deprecated and whose `RandomState`
//! cannot be given a key (the sans-IO endpoint must be reproducible under a
//! key its caller chooses). The tests check it against the reference
//! vector of the SipHash paper and against `std`'s implementation.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;

/// A 128-bit secret key for the comm id permutation.
///
/// [`IdKey::random`] draws one from the operating system (every agent
/// does); [`IdKey::fixed`] makes a reproducible one for simulations and
/// tests. `Debug` does not print the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdKey([u64; 2]);

impl IdKey {
    /// A key drawn from the operating system's random source.
    pub fn random() -> IdKey {
        IdKey(os_key())
    }

    /// A reproducible key (simulations, fuzzing, tests): whoever knows
    /// `k0` and `k1` can predict every id.
    pub const fn fixed(k0: u64, k1: u64) -> IdKey {
        IdKey([k0, k1])
    }
}

impl fmt::Debug for IdKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdKey(..)")
    }
}

/// 128 bits from the operating system: std seeds every `RandomState` from
/// the OS's random source (once per thread; a thread's later states differ
/// from its first in one key word), and SipHash under those hidden keys
/// turns two constants into values nobody without them can compute.
fn os_key() -> [u64; 2] {
    let state = RandomState::new();
    [
        state.hash_one(0x6b65_795f_6869_u64),
        state.hash_one(0x6b65_795f_6c6f_u64),
    ]
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

fn sip_init(key: [u64; 2]) -> [u64; 4] {
    [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ]
}

/// Absorbs one 64-bit message word (two compression rounds).
#[inline(always)]
fn sip_absorb(v: &mut [u64; 4], word: u64) {
    v[3] ^= word;
    sip_round(v);
    sip_round(v);
    v[0] ^= word;
}

/// The four finalization rounds.
#[inline(always)]
fn sip_finish(v: &mut [u64; 4]) -> u64 {
    v[2] ^= 0xff;
    for _ in 0..4 {
        sip_round(v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// SipHash-2-4 of the 8-byte message `m.to_le_bytes()` under `key`.
#[inline]
pub(crate) fn siphash24_u64(key: [u64; 2], m: u64) -> u64 {
    let mut v = sip_init(key);
    sip_absorb(&mut v, m);
    // The last block: no bytes left, the message length (8) on top.
    sip_absorb(&mut v, 8 << 56);
    sip_finish(&mut v)
}

/// SipHash-2-4 of any message (the reference form the tests check
/// [`siphash24_u64`] against).
#[cfg(test)]
fn siphash24(key: [u64; 2], msg: &[u8]) -> u64 {
    let mut v = sip_init(key);
    let mut words = msg.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        sip_absorb(&mut v, u64::from_le_bytes(b));
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    last[7] = msg.len() as u8;
    sip_absorb(&mut v, u64::from_le_bytes(last));
    sip_finish(&mut v)
}

/// Feistel rounds of the comm id permutation: as many as NIST's FF1
/// format-preserving cipher uses, well past the four a strong
/// pseudo-random permutation needs in theory, because the halves are only
/// 16 bits wide.
const ROUNDS: u64 = 10;

/// A keyed pseudo-random permutation of the nonzero 32-bit values: a
/// ten-round Feistel network over two 16-bit halves whose round function
/// is SipHash-2-4 of (round, half) under the key, restricted to nonzero
/// values by cycle walking (0 means "unknown" in REJ and MRA comm id
/// fields, so no id may be 0).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdCipher {
    key: [u64; 2],
}

impl fmt::Debug for IdCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdCipher(..)")
    }
}

impl IdCipher {
    pub(crate) const fn new(key: IdKey) -> IdCipher {
        IdCipher { key: key.0 }
    }

    #[inline]
    fn round(&self, round: u64, half: u16) -> u16 {
        siphash24_u64(self.key, round << 16 | u64::from(half)) as u16
    }

    /// The Feistel network over all of `u32`.
    fn forward(&self, x: u32) -> u32 {
        let (mut left, mut right) = ((x >> 16) as u16, x as u16);
        for r in 0..ROUNDS {
            let next = left ^ self.round(r, right);
            left = right;
            right = next;
        }
        u32::from(left) << 16 | u32::from(right)
    }

    fn backward(&self, y: u32) -> u32 {
        let (mut left, mut right) = ((y >> 16) as u16, y as u16);
        for r in (0..ROUNDS).rev() {
            let prev = right ^ self.round(r, left);
            right = left;
            left = prev;
        }
        u32::from(left) << 16 | u32::from(right)
    }

    /// The wire id of internal id `x` (nonzero; 0 is outside the domain
    /// and must not be passed). Never 0: the one `x` the network maps to 0
    /// walks on to where the network maps 0, which no nonzero `x` reaches.
    pub(crate) fn encrypt(&self, x: u32) -> u32 {
        debug_assert_ne!(x, 0, "internal ids are never 0");
        match self.forward(x) {
            0 => self.forward(0),
            y => y,
        }
    }

    /// The internal id whose wire id is `y`; `None` for 0, which is no
    /// wire id.
    pub(crate) fn decrypt(&self, y: u32) -> Option<u32> {
        if y == 0 {
            return None;
        }
        Some(match self.backward(y) {
            // `y` is where the network maps 0: it stands for the value
            // the network maps to 0 (see `encrypt`).
            0 => self.backward(0),
            x => x,
        })
    }
}

/// Keys and a counter for starting PSNs, one set per process.
struct PsnSource {
    key: [u64; 2],
    drawn: std::sync::atomic::AtomicU64,
}

/// A starting PSN (24 bits) for a new connection: SipHash-2-4 of a
/// process-wide counter under a key drawn from the operating system once
/// per process. Not a function of the QPN, the CA GUID or any earlier PSN:
/// a peer that saw every earlier PSN, of this process or another with the
/// same GUID, still has one chance in 2^24 of guessing the next.
///
/// Identity only, never synchronisation: plain std atomics even under loom.
pub fn starting_psn() -> u32 {
    static SOURCE: std::sync::OnceLock<PsnSource> = std::sync::OnceLock::new();
    let source = SOURCE.get_or_init(|| PsnSource {
        key: os_key(),
        drawn: std::sync::atomic::AtomicU64::new(0),
    });
    let n = source
        .drawn
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (siphash24_u64(source.key, n) as u32) & 0xff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SipHash paper's test vector: key 00..0f, message 00..0e.
    #[test]
    fn siphash_matches_the_reference_vector() {
        let key = [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(key, &msg), 0xa129_ca61_49be_45e5);
    }

    /// The same function as std's (deprecated) keyed SipHasher, which is
    /// SipHash-2-4, on messages of every length up to 24 bytes; and the
    /// one-word form agrees with the general one.
    #[test]
    #[allow(deprecated)]
    fn siphash_agrees_with_std_and_the_one_word_form() {
        use std::hash::Hasher;
        let mut x = 0x1234_5678_9abc_def0_u64;
        for len in 0..=24usize {
            for _ in 0..8 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = [x, x.rotate_left(17) ^ 0x55];
                let msg: Vec<u8> = (0..len)
                    .map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8)
                    .collect();
                let mut std_hasher = std::hash::SipHasher::new_with_keys(key[0], key[1]);
                std_hasher.write(&msg);
                assert_eq!(siphash24(key, &msg), std_hasher.finish(), "len {len}");
                assert_eq!(siphash24_u64(key, x), siphash24(key, &x.to_le_bytes()));
            }
        }
    }

    #[test]
    fn the_permutation_round_trips_and_never_gives_zero() {
        for k in 0..4u64 {
            let c = IdCipher::new(IdKey::fixed(k, !k));
            let mut x = 1u32;
            for _ in 0..20_000 {
                let y = c.encrypt(x);
                assert_ne!(y, 0);
                assert_eq!(c.decrypt(y), Some(x), "key {k}, id {x:#x}");
                x = x.wrapping_mul(2_654_435_761).wrapping_add(12345).max(1);
            }
            assert_eq!(c.decrypt(0), None);
        }
    }

    /// Cycle walking: the one nonzero value the network maps to 0 (under
    /// any key there is one, unless the network fixes 0) still gets a
    /// nonzero id, the network's image of 0, that decrypts back to it.
    #[test]
    fn the_value_the_network_sends_to_zero_walks_on() {
        let c = IdCipher::new(IdKey::fixed(7, 7));
        let x = c.backward(0);
        assert_ne!(x, 0, "with this key the network does not fix 0");
        assert_eq!(c.forward(x), 0);
        let y = c.encrypt(x);
        assert_eq!(y, c.forward(0));
        assert_ne!(y, 0);
        assert_eq!(c.decrypt(y), Some(x));
    }

    #[test]
    fn keys_make_different_permutations() {
        let a = IdCipher::new(IdKey::fixed(1, 2));
        let b = IdCipher::new(IdKey::fixed(1, 3));
        let same = (1..=1000u32)
            .filter(|&x| a.encrypt(x) == b.encrypt(x))
            .count();
        assert_eq!(same, 0);
        assert_ne!(IdKey::random(), IdKey::random());
        assert_eq!(format!("{:?}", IdKey::fixed(1, 2)), "IdKey(..)");
    }

    #[test]
    fn psns_are_24_bits_and_not_a_sequence() {
        let v: Vec<u32> = (0..256).map(|_| starting_psn()).collect();
        assert!(v.iter().all(|&p| p <= 0xff_ffff));
        let mut d: Vec<u32> = v.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        d.sort_unstable();
        d.dedup();
        assert!(d.len() > 250, "differences repeat: {}", d.len());
    }
}
