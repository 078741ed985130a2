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
    if bytes.len() < 64 {
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

/// Continues from the register after the masked IP and UDP headers over
/// the BTH (byte 4 masked) and the rest, and complements.
fn finish(mut crc: u32, bth_to_end: &[u8]) -> u32 {
    if bth_to_end.len() > 4 {
        crc = crc32_update(crc, &bth_to_end[..4]);
        crc = crc32_update(crc, &[0xff]);
        crc = crc32_update(crc, &bth_to_end[5..]);
    } else {
        crc = crc32_update(crc, bth_to_end);
    }
    !crc
}

/// The ICRC of a packet sent over `endpoints`: `bth_to_end` is the UDP
/// payload from the BTH up to, not including, the ICRC (so the UDP length
/// is `8 + bth_to_end.len() + 4`). Fails only if that exceeds the IP
/// length fields.
pub fn icrc(endpoints: &Endpoints, bth_to_end: &[u8]) -> Result<u32, EncodeError> {
    let (headers, n) = endpoints.masked_headers(bth_to_end.len() + crate::ICRC_LEN)?;
    let crc = crc32_update(LRH_SEED, &headers[..n]);
    Ok(finish(crc, bth_to_end))
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
    let crc = crc32_update(LRH_SEED, &h[..n]);
    Ok(finish(crc, bth_to_end))
}

#[cfg(test)]
mod tests {
    use super::*;

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
