//! The invariant CRC (IBTA vol. 1 §7.8.1 for InfiniBand; Annex A17 for
//! RoCEv2), computed as Linux rxe computes it
//! (`drivers/infiniband/sw/rxe/rxe_icrc.c`):
//!
//! 1. CRC-32 with the Ethernet polynomial 0x04C11DB7, bit-reflected
//!    (0xEDB88320), register seeded with ones;
//! 2. over 8 bytes of ones standing for the masked LRH an InfiniBand packet
//!    would have (which leaves the register at [`LRH_SEED`], rxe's seed);
//! 3. then the IP header and UDP header as received, with the variant
//!    fields set to ones: IPv4 TOS, TTL and header checksum; IPv6 traffic
//!    class, flow label and hop limit; the UDP checksum;
//! 4. then the BTH with its byte 4 (FECN, BECN, Resv6: the "Resv8a" byte)
//!    set to ones, and everything after it up to the ICRC: extension
//!    headers, payload, pad;
//! 5. the register complemented. That is the standard CRC-32 value of the
//!    whole masked byte string (as zlib's `crc32` gives it), and the wire
//!    carries it least significant byte first ([`to_wire`]).

use crate::ip::{IPV4_LEN, IPV6_LEN, UDP_LEN};
use crate::{DecodeError, EncodeError, Endpoints};

/// The CRC-32 register after 8 bytes of ones from the all-ones seed: the
/// seed rxe starts its ICRC with.
pub const LRH_SEED: u32 = 0xdebb_20e3;

const POLY: u32 = 0xedb8_8320;

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// Advances a reflected CRC-32 register over `bytes` (no initial or final
/// complement: the caller chooses both). Long inputs (payloads) go through
/// `crc32fast`, which folds with carry-less multiplication where the CPU
/// has it (several times the table's speed on a 4 KiB packet); short ones
/// (the headers) through the table.
pub fn crc32_update(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.len() < 16 {
        return crc32_update_sliced(crc, bytes);
    }
    // crc32fast keeps its state complemented: its "initial value" is the
    // complement of our register, and so is what it returns.
    let mut h = crc32fast::Hasher::new_with_initial(!crc);
    h.update(bytes);
    !h.finalize()
}

/// [`crc32_update`] by slicing-by-8 tables: eight bytes a step.
pub fn crc32_update_sliced(mut crc: u32, bytes: &[u8]) -> u32 {
    let t = &TABLES;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(b)) & 0xff) as usize];
    }
    crc
}

/// The standard CRC-32 (IEEE 802.3, zlib) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    !crc32_update(!0, bytes)
}

/// The ICRC as the wire carries it: least significant byte first (rxe
/// stores the complemented little-endian register as is).
pub fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

/// The ICRC a packet carries, from its last four bytes.
pub fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// Bytes of the BTH.
const BTH_LEN: usize = 12;

/// Continues from the register after the masked IP and UDP headers over
/// the BTH with its byte 4 masked and the rest, and complements. The BTH
/// goes through the table from a fixed 12-byte copy (one step and a short
/// tail, not three short runs): this is on every packet's path.
fn finish(crc: u32, bth_to_end: &[u8]) -> u32 {
    let (bth, rest) = match bth_to_end.split_first_chunk::<BTH_LEN>() {
        Some((bth, rest)) => (*bth, rest),
        // Shorter than a BTH: no packet, but the value is defined (masked
        // the same way if it reaches byte 4).
        None => {
            let mut short = [0u8; BTH_LEN];
            short[..bth_to_end.len()].copy_from_slice(bth_to_end);
            let n = bth_to_end.len();
            if n > 4 {
                short[4] = 0xff;
            }
            return !crc32_update(crc, &short[..n]);
        }
    };
    let mut bth = bth;
    bth[4] = 0xff; // FECN, BECN, Resv6
    !crc32_update(crc32_update(crc, &bth), rest)
}

/// The ICRC of a packet sent over `endpoints`: `bth_to_end` is the UDP
/// payload from the BTH up to, not including, the ICRC (so the UDP length
/// is `8 + bth_to_end.len() + 4`). Fails only if that exceeds the IP
/// length fields.
pub fn icrc(endpoints: &Endpoints, bth_to_end: &[u8]) -> Result<u32, EncodeError> {
    let crc = headers_register(endpoints, bth_to_end.len() + crate::ICRC_LEN)?;
    Ok(finish(crc, bth_to_end))
}

/// Flows and lengths whose header register a thread keeps
/// ([`headers_register`]).
const HEADER_MEMO: usize = 4;

/// A thread's memo of (flow, UDP payload length) -> CRC register after the
/// LRH seed and the masked IP and UDP headers.
type HeaderMemo = [Option<(Endpoints, usize, u32)>; HEADER_MEMO];

std::thread_local! {
    /// The last few flows' header registers, and the slot the next new
    /// one takes. A pure function's memo: a miss only costs the
    /// computation.
    static HEADER_MEMO_SLOTS: std::cell::RefCell<(HeaderMemo, usize)> =
        const { std::cell::RefCell::new(([None; HEADER_MEMO], 0)) };
}

/// The CRC register after the LRH seed and the masked IP and UDP headers
/// of a datagram of `endpoints` whose UDP payload is `udp_payload_len`
/// bytes. Those headers are the same for every packet of a flow of one
/// length (a ping-pong's SENDs, its ACKs): kept per thread for the last
/// [`HEADER_MEMO`] of them, they cost a compare instead of building the
/// headers and running the CRC over 28 or 48 bytes on every packet.
fn headers_register(endpoints: &Endpoints, udp_payload_len: usize) -> Result<u32, EncodeError> {
    // An IPv4 identification other than 0 (a GSO segment's: each has its
    // own) is the register of identification 0's headers, memoized, with
    // the identification's bits carried over the 22 header bytes after
    // them added in: a few XORs instead of a memo miss per segment.
    if let Endpoints::V4(v4) = endpoints {
        if v4.identification != 0 {
            let zero = Endpoints::V4(crate::V4Endpoints {
                identification: 0,
                ..*v4
            });
            let mut crc = headers_register(&zero, udp_payload_len)?;
            let mut id = v4.identification;
            while id != 0 {
                crc ^= HEADER_ID_BITS[id.trailing_zeros() as usize];
                id &= id - 1;
            }
            return Ok(crc);
        }
    }
    HEADER_MEMO_SLOTS.with_borrow_mut(|(memo, next)| {
        if let Some(&(_, _, crc)) = memo
            .iter()
            .flatten()
            .find(|(e, len, _)| *len == udp_payload_len && e == endpoints)
        {
            return Ok(crc);
        }
        let (head, n) = endpoints.masked_headers(udp_payload_len)?;
        let crc = crc32_update(LRH_SEED, &head[..n]);
        memo[*next] = Some((*endpoints, udp_payload_len, crc));
        *next = (*next + 1) % HEADER_MEMO;
        Ok(crc)
    })
}

/// The ICRC of a received packet from its raw IP and UDP headers as they
/// arrived (`ip_udp`: a 20-byte IPv4 header or a 40-byte IPv6 header, then
/// the 8-byte UDP header; the masked fields may hold anything) and the UDP
/// payload up to the ICRC.
pub fn icrc_over_headers(ip_udp: &[u8], bth_to_end: &[u8]) -> Result<u32, DecodeError> {
    let mut h = [0u8; IPV6_LEN + UDP_LEN];
    let version = ip_udp.first().map_or(0, |b| b >> 4);
    let n = match version {
        4 => IPV4_LEN + UDP_LEN,
        6 => IPV6_LEN + UDP_LEN,
        _ => {
            if ip_udp.is_empty() {
                return Err(DecodeError::Truncated {
                    what: "IP header",
                    need: 1,
                    have: 0,
                });
            }
            return Err(DecodeError::NotIp { version });
        }
    };
    if ip_udp.len() != n {
        return Err(DecodeError::LengthMismatch {
            field: "IP and UDP headers",
            claimed: ip_udp.len(),
            actual: n,
        });
    }
    h[..n].copy_from_slice(ip_udp);
    let udp = if version == 4 {
        h[1] = 0xff; // TOS
        h[8] = 0xff; // TTL
        h[10] = 0xff; // header checksum
        h[11] = 0xff;
        IPV4_LEN
    } else {
        h[0] |= 0x0f; // traffic class, high nibble
        h[1] = 0xff; // traffic class, low nibble; flow label
        h[2] = 0xff;
        h[3] = 0xff;
        h[7] = 0xff; // hop limit
        IPV6_LEN
    };
    h[udp + 6] = 0xff; // UDP checksum
    h[udp + 7] = 0xff;
    Ok(finish(crc32_update(LRH_SEED, &h[..n]), bth_to_end))
}

/// For each top byte, the table index whose entry has it (the reflected
/// CRC-32 table's entries have 256 distinct top bytes), to run the register
/// backwards.
const fn inverse_top() -> [u8; 256] {
    let mut inv = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        inv[(TABLES[0][i] >> 24) as usize] = i as u8;
        i += 1;
    }
    inv
}

static INV_TOP: [u8; 256] = inverse_top();

/// The register before `b` given the register after it.
#[cfg(test)]
fn crc32_unstep(after: u32, b: u8) -> u32 {
    let j = INV_TOP[(after >> 24) as usize];
    ((after ^ TABLES[0][j as usize]) << 8) | u32::from(j ^ b)
}

/// `a * b` modulo the CRC polynomial, both in the register's reflected
/// form (bit 31 is the coefficient of x^0). Advancing a register over one
/// zero bit is a multiplication by x, so over `n` zero bytes by x^(8n).
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// x^-1 modulo the polynomial, reflected: the register that one zero bit
/// takes to x^0 (`0x8000_0000`). Its low bit is set, so that step is
/// `(r >> 1) ^ POLY`, and `POLY`'s top bit cancels x^0's.
const X_INVERSE: u32 = ((0x8000_0000 ^ POLY) << 1) | 1;

/// `UNSHIFT[k]` = x^(-8 * 2^k): undoes a register's advance over 2^k zero
/// bytes. Sixteen entries cover any IPv4 datagram (at most 65,535 bytes).
const fn unshift_table() -> [u32; 16] {
    let mut x8 = X_INVERSE;
    let mut i = 0;
    while i < 3 {
        x8 = mul_mod(x8, x8);
        i += 1;
    }
    let mut t = [0u32; 16];
    t[0] = x8;
    let mut k = 1;
    while k < 16 {
        t[k] = mul_mod(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
}

static UNSHIFT: [u32; 16] = unshift_table();

/// The register that `n` zero bytes take to `r` (`n` below 65,536).
fn unshift(mut r: u32, n: usize) -> u32 {
    for (k, m) in UNSHIFT.iter().enumerate() {
        if n >> k & 1 != 0 {
            r = mul_mod(r, *m);
        }
    }
    r
}

/// `SHIFT[k]` = x^(8 * 2^k): advances a register over 2^k zero bytes.
const fn shift_table() -> [u32; 16] {
    // x^8, reflected (bit 31 is x^0).
    let mut t = [0u32; 16];
    t[0] = 1 << (31 - 8);
    let mut k = 1;
    while k < 16 {
        t[k] = mul_mod(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
}

static SHIFT: [u32; 16] = shift_table();

/// The register `r` becomes after `n` zero bytes (`n` below 65,536).
fn shift(mut r: u32, n: usize) -> u32 {
    for (k, m) in SHIFT.iter().enumerate() {
        if n >> k & 1 != 0 {
            r = mul_mod(r, *m);
        }
    }
    r
}

/// How the ICRC of an IPv4 packet changes with its identification, for
/// one packet length: what a sender needs to send packets it encoded for
/// identification 0 as the segments of one UDP GSO datagram, which the
/// kernel numbers 0, 1, 2, ... (DF set, unconnected socket; see
/// `docs/roce-wire.md`).
///
/// The CRC is affine, so changing the identification from `a` to `b`
/// changes the ICRC by a value that depends only on `a ^ b` and on how
/// many bytes follow the field; it is linear in `a ^ b`'s bits, so sixteen
/// registers (one per bit, computed once per length) give it for any
/// pair with a few XORs: no pass over the packet again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdentificationPatch {
    bth_to_end_len: usize,
    per_bit: [u32; 16],
}

impl Ipv4IdentificationPatch {
    /// The patch for packets whose UDP payload before the ICRC is
    /// `bth_to_end_len` bytes; `None` if no IPv4 datagram is that long.
    pub fn new(bth_to_end_len: usize) -> Option<Ipv4IdentificationPatch> {
        let after = AFTER_IPV4_ID.checked_add(bth_to_end_len)?;
        if after >> SHIFT.len() != 0 {
            return None;
        }
        // x^(8 * after): carrying a register over `after` zero bytes is a
        // multiplication by it (one per bit below, not a shift each).
        let carry = shift(1 << 31, after);
        let mut per_bit = [0u32; 16];
        for (bit, reg) in per_bit.iter_mut().enumerate() {
            let two = crc32_update_sliced(0, &(1u16 << bit).to_be_bytes());
            *reg = mul_mod(two, carry);
        }
        Some(Ipv4IdentificationPatch {
            bth_to_end_len,
            per_bit,
        })
    }

    /// The length (UDP payload before the ICRC) this patch is for.
    pub fn bth_to_end_len(&self) -> usize {
        self.bth_to_end_len
    }

    /// What to XOR into the ICRC computed for identification `from` to
    /// get the one for identification `to` (the same packet otherwise).
    pub fn delta(&self, from: u16, to: u16) -> u32 {
        let mut d = from ^ to;
        let mut out = 0;
        while d != 0 {
            out ^= self.per_bit[d.trailing_zeros() as usize];
            d &= d - 1;
        }
        out
    }

    /// Rewrites the ICRC at the end of `packet` (a whole UDP payload of
    /// the patch's length, ICRC included), computed for identification
    /// `from`, to the one for identification `to`. Returns false (and
    /// leaves it) if the packet is not of the patch's length.
    pub fn apply(&self, packet: &mut [u8], from: u16, to: u16) -> bool {
        if packet.len() != self.bth_to_end_len + crate::ICRC_LEN {
            return false;
        }
        let d = self.delta(from, to).to_le_bytes(); // the wire's byte order
        let tail = packet.len() - crate::ICRC_LEN;
        for (b, x) in packet[tail..].iter_mut().zip(d) {
            *b ^= x;
        }
        true
    }
}

/// The register one bit of the IPv4 identification adds to the register
/// after the masked IPv4 and UDP headers: bit `b`'s two bytes run through
/// the CRC from zero, then carried over the [`AFTER_IPV4_ID`] bytes that
/// follow the field.
const fn header_id_bits() -> [u32; 16] {
    let mut carry = 1u32 << 31; // x^0
    let mut i = 0;
    while i < AFTER_IPV4_ID {
        carry = mul_mod(carry, 1 << (31 - 8)); // times x^8: one zero byte
        i += 1;
    }
    let mut out = [0u32; 16];
    let mut b = 0;
    while b < 16 {
        let v = 1u16 << b;
        let mut crc = 0u32;
        let bytes = v.to_be_bytes();
        let mut j = 0;
        while j < 2 {
            crc ^= bytes[j] as u32;
            let mut k = 0;
            while k < 8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
                k += 1;
            }
            j += 1;
        }
        out[b] = mul_mod(crc, carry);
        b += 1;
    }
    out
}

static HEADER_ID_BITS: [u32; 16] = header_id_bits();

/// Bytes of the masked IPv4 and UDP headers after the identification
/// field (IPv4 bytes 6..20, then the UDP header).
const AFTER_IPV4_ID: usize = IPV4_LEN - 6 + UDP_LEN;

/// The IPv4 identification a received packet's sender used, if one makes
/// its ICRC right: `endpoints` as for [`icrc`] (its identification is
/// ignored), `bth_to_end` the UDP payload up to the ICRC and `carried` the
/// ICRC it carries.
///
/// Why: the identification enters the ICRC (only TOS, TTL and the header
/// checksum are masked), and Linux rxe, like most senders, writes a
/// per-packet value, which a UDP socket does not show its reader. A
/// receiver that already computed the ICRC for some identification
/// (its check failed) calls [`solve_ipv4_identification_from`] with that
/// value instead: no second pass over the packet.
pub fn solve_ipv4_identification(
    endpoints: &crate::V4Endpoints,
    bth_to_end: &[u8],
    carried: u32,
) -> Option<u16> {
    let computed = icrc(&Endpoints::V4(*endpoints), bth_to_end).ok()?;
    solve_ipv4_identification_from(
        computed,
        endpoints.identification,
        bth_to_end.len(),
        carried,
    )
}

/// [`solve_ipv4_identification`] from the ICRC `computed` for the packet
/// with identification `assumed` (a `bth_to_end_len`-byte UDP payload
/// before its ICRC): the identification that makes it `carried`, if any.
///
/// The CRC is affine: changing the identification by `d` changes the ICRC
/// by the register two bytes `d` make from zero, carried forward over the
/// `AFTER_IPV4_ID + bth_to_end_len` bytes that follow (a multiplication by
/// x^(8n)). So `carried ^ computed`, carried back by x^(-8n) (at most 16
/// multiplications modulo the polynomial, whatever the packet's length),
/// must be such a two-byte register; the two bytes are read off it with
/// the table's inverse. 16 of the 32 bits remain a check: a corrupted
/// packet passes with probability 2^-16 instead of 2^-32 (the UDP
/// checksum, which the kernel verifies, still covers the whole datagram).
/// Before this, the register was run backwards over every byte of the
/// packet (~5 ns a byte): a flood of bad-ICRC datagrams cost a second pass
/// over each.
pub fn solve_ipv4_identification_from(
    computed: u32,
    assumed: u16,
    bth_to_end_len: usize,
    carried: u32,
) -> Option<u16> {
    let after = AFTER_IPV4_ID.checked_add(bth_to_end_len)?;
    if after >> UNSHIFT.len() != 0 {
        return None;
    }
    // The register the two bytes of the difference made from zero.
    let two = unshift(carried ^ computed, after);
    // two = step(step(0, hi), lo), where step(c, b) = (c >> 8) ^ T[(c ^ b) & 0xff]:
    // the second step's table entry has the top byte of `two` (the first
    // step's register shifted right has none)...
    let j = INV_TOP[(two >> 24) as usize];
    let first_high = two ^ TABLES[0][j as usize]; // the first register >> 8
    if first_high >> 24 != 0 {
        return None;
    }
    // ... and the first step's register is T[hi], whose top byte names hi.
    let hi = INV_TOP[(first_high >> 16) as usize];
    let first = TABLES[0][hi as usize];
    if first >> 8 != first_high {
        return None;
    }
    let lo = j ^ first as u8;
    Some(u16::from_be_bytes([hi, lo]) ^ assumed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICRC without the thread's memo of header registers.
    fn icrc_unmemoized(ep: &Endpoints, bth_to_end: &[u8]) -> u32 {
        let (head, n) = ep
            .masked_headers(bth_to_end.len() + crate::ICRC_LEN)
            .unwrap();
        finish(crc32_update(LRH_SEED, &head[..n]), bth_to_end)
    }

    #[test]
    fn a_non_zero_identification_s_register_equals_the_headers_run_through() {
        let mut ep = Endpoints::new(
            "10.9.8.7:49999".parse().unwrap(),
            "10.1.1.1:4791".parse().unwrap(),
        )
        .unwrap();
        let body: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        for id in [1u16, 2, 5, 63, 64, 255, 256, 0x7fff, 0x8000, 0xffff, 0xbeef] {
            if let Endpoints::V4(v4) = &mut ep {
                v4.identification = id;
            }
            for len in [12, 40, 300] {
                assert_eq!(
                    icrc(&ep, &body[..len]).unwrap(),
                    icrc_unmemoized(&ep, &body[..len]),
                    "identification {id:#x}, {len} bytes"
                );
            }
        }
    }
    #[test]
    fn an_identification_patch_gives_the_icrc_computed_for_that_identification() {
        let src: std::net::SocketAddr = "10.1.2.3:49155".parse().unwrap();
        let dst: std::net::SocketAddr = "10.4.5.6:4791".parse().unwrap();
        let mut seed = 0x1234_5678u32;
        for len in [12usize, 13, 28, 60, 1036, 1052, 4108, 4124, 8000, 65_000] {
            let body: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) as u8
                })
                .collect();
            let patch = Ipv4IdentificationPatch::new(len).unwrap();
            assert_eq!(patch.bth_to_end_len(), len);
            let with = |id: u16| {
                let mut ep = Endpoints::new(src, dst).unwrap();
                if let Endpoints::V4(v4) = &mut ep {
                    v4.identification = id;
                }
                icrc(&ep, &body).unwrap()
            };
            let zero = with(0);
            for id in [0u16, 1, 2, 3, 7, 63, 64, 127, 0x8000, 0xffff, 0x1234] {
                assert_eq!(zero ^ patch.delta(0, id), with(id), "len {len} id {id}");
                assert_eq!(
                    with(id) ^ patch.delta(id, 5),
                    with(5),
                    "len {len} {id} -> 5"
                );
            }
            // Applied to the wire bytes, then undone.
            let mut pkt = body.clone();
            pkt.extend_from_slice(&to_wire(zero));
            assert!(patch.apply(&mut pkt, 0, 9));
            assert_eq!(pkt[len..], to_wire(with(9)));
            assert!(patch.apply(&mut pkt, 9, 0));
            assert_eq!(pkt[len..], to_wire(zero));
            assert!(
                !patch.apply(&mut pkt[1..], 0, 1),
                "another length is left alone"
            );
        }
        assert!(Ipv4IdentificationPatch::new(70_000).is_none());
    }
    #[test]
    fn the_header_memo_never_answers_for_another_flow_or_length() {
        let ep = |s: &str, d: &str| Endpoints::new(s.parse().unwrap(), d.parse().unwrap()).unwrap();
        // More flows x lengths than the memo holds, revisited in turns,
        // IPv4 and IPv6, so entries are found, missed and replaced.
        let flows = [
            ep("10.0.0.1:49152", "10.0.0.2:4791"),
            ep("10.0.0.2:49152", "10.0.0.1:4791"),
            ep("10.0.0.1:49153", "10.0.0.2:4791"),
            ep("[fd00::1]:49152", "[fd00::2]:4791"),
            ep("[fd00::2]:49152", "[fd00::1]:4791"),
        ];
        let mut body = [0u8; 96];
        for (i, b) in body.iter_mut().enumerate() {
            *b = (i * 37) as u8;
        }
        let check = |f: usize, len: usize| {
            let bytes = &body[..len];
            // Twice: a miss, then (usually) a hit.
            for _ in 0..2 {
                assert_eq!(
                    icrc(&flows[f], bytes).unwrap(),
                    icrc_unmemoized(&flows[f], bytes),
                    "flow {f}, {len} bytes"
                );
            }
        };
        let lens = [3, 16, 20, 80, 96];
        for _round in 0..2 {
            // Lengths within a flow, then flows within a length.
            for f in 0..flows.len() {
                for len in lens {
                    check(f, len);
                }
            }
            for len in lens {
                for f in 0..flows.len() {
                    check(f, len);
                }
            }
        }
    }

    #[test]
    fn the_senders_identification_is_found() {
        use std::net::SocketAddrV4;
        let mut e = crate::V4Endpoints {
            src: "192.168.77.2:50123".parse::<SocketAddrV4>().unwrap(),
            dst: "192.168.77.1:4791".parse::<SocketAddrV4>().unwrap(),
            identification: 0,
            dont_fragment: true,
        };
        let body: Vec<u8> = (0..1036u32).map(|k| (k * 13 + 5) as u8).collect();
        for (len, id) in [
            (12, 0x1234u16),
            (1036, 0xfedc),
            (40, 0),
            (100, 1),
            (5, 0xffff),
        ] {
            e.identification = id;
            let carried = icrc(&Endpoints::V4(e), &body[..len]).unwrap();
            let mut zero = e;
            zero.identification = 0;
            assert_eq!(
                solve_ipv4_identification(&zero, &body[..len], carried),
                Some(id),
                "len {len}"
            );
            // Any other identification in the endpoints gives the same answer.
            zero.identification = 0x5555;
            assert_eq!(
                solve_ipv4_identification(&zero, &body[..len], carried),
                Some(id)
            );
        }
        // Corrupted packets: a wrong byte, a wrong address, a flipped ICRC
        // bit are refused (each has a 2^-16 chance to pass; these do not).
        e.identification = 0x4321;
        let carried = icrc(&Endpoints::V4(e), &body[..64]).unwrap();
        let mut bad = body[..64].to_vec();
        bad[20] ^= 1;
        assert_eq!(solve_ipv4_identification(&e, &bad, carried), None);
        assert_eq!(
            solve_ipv4_identification(&e, &body[..64], carried ^ 1),
            None
        );
        let mut other = e;
        other.src = "192.168.77.3:50123".parse().unwrap();
        assert_eq!(
            solve_ipv4_identification(&other, &body[..64], carried),
            None
        );
        // How often a random ICRC passes: about 1 in 65536.
        let passes = (0..20_000u32)
            .filter(|k| {
                solve_ipv4_identification(&e, &body[..64], carried ^ k.wrapping_mul(0x9e37_79b9))
                    .is_some()
            })
            .count();
        assert!(passes <= 3, "{passes} of 20000 random ICRCs passed");
    }

    #[test]
    fn unshift_undoes_an_advance_over_zero_bytes() {
        let zeros = vec![0u8; 65535];
        for (r, n) in [
            (0x8000_0000u32, 1usize),
            (0xdead_beef, 0),
            (0x1234_5678, 22),
            (!0, 1058),
            (0x0bad_f00d, 4118),
            (1, 9022),
            (0x5a5a_5a5a, 65535),
        ] {
            let advanced = crc32_update_sliced(r, &zeros[..n]);
            assert_eq!(unshift(advanced, n), r, "n {n}");
        }
        assert_eq!(mul_mod(X_INVERSE, 0x4000_0000), 0x8000_0000, "x^-1 * x = 1");
    }

    #[test]
    fn the_solver_agrees_with_a_search_of_every_identification() {
        // For a few packets and carried values, the one identification the
        // solver names (or none) is what trying all 65,536 finds.
        use std::net::SocketAddrV4;
        let e = crate::V4Endpoints {
            src: "10.0.0.7:49152".parse::<SocketAddrV4>().unwrap(),
            dst: "10.0.0.9:4791".parse::<SocketAddrV4>().unwrap(),
            identification: 0,
            dont_fragment: true,
        };
        let body: Vec<u8> = (0..300u32).map(|k| (k * 29 + 3) as u8).collect();
        for (len, carried) in [(12, None), (300, None), (44, Some(0x1234_5678u32))] {
            let mut with = e;
            let carried = carried.unwrap_or_else(|| {
                with.identification = 0x7a5b;
                icrc(&Endpoints::V4(with), &body[..len]).unwrap()
            });
            let found: Vec<u16> = (0..=u16::MAX)
                .filter(|&id| {
                    with.identification = id;
                    icrc(&Endpoints::V4(with), &body[..len]).unwrap() == carried
                })
                .collect();
            assert!(found.len() <= 1, "{found:?}");
            assert_eq!(
                solve_ipv4_identification(&e, &body[..len], carried),
                found.first().copied(),
                "len {len}"
            );
        }
    }

    #[test]
    fn unstep_undoes_a_step() {
        for (c, b) in [
            (0u32, 0u8),
            (0xdead_beef, 0x5a),
            (!0, 0xff),
            (0x1234_5678, 7),
        ] {
            assert_eq!(crc32_unstep(crc32_update(c, &[b]), b), c);
        }
    }

    #[test]
    fn standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn the_fast_path_agrees_with_the_tables() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 131 + i / 7) as u8).collect();
        for len in [0, 1, 63, 64, 65, 255, 4096, 4113, 9000] {
            for seed in [0, !0, LRH_SEED, 0x1234_5678] {
                assert_eq!(
                    crc32_update(seed, &data[..len]),
                    crc32_update_sliced(seed, &data[..len]),
                    "len {len} seed {seed:#x}"
                );
            }
        }
    }

    #[test]
    fn eight_bytes_of_ones_give_rxes_seed() {
        assert_eq!(crc32_update(!0, &[0xff; 8]), LRH_SEED);
    }

    #[test]
    fn sliced_and_bytewise_agree() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 3) as u8).collect();
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 999, 1000] {
            let mut bytewise = !0u32;
            for &b in &data[..len] {
                bytewise = crc32_update(bytewise, &[b]);
            }
            assert_eq!(crc32_update(!0, &data[..len]), bytewise, "len {len}");
        }
    }
}
