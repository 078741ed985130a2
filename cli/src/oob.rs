//! The out-of-band (TCP) messages of `ibal qp-exchange`, without I/O.
//!
//! **Standard exchange** (what rdma-core's `ibv_rc_pingpong` and
//! `ibv_ud_pingpong` send, checked against `libibverbs/examples/`
//! `rc_pingpong.c`, `ud_pingpong.c` and `pingpong.c`): one fixed-size
//! message per side, the text `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID as 4 hex
//! digits, QPN and PSN as 6, the GID as 32 lower-case hex digits of its 16
//! bytes in order) and a NUL, [`MSG_LEN`] = 52 bytes in all. The client
//! sends its message, reads the server's, and writes [`DONE`] (`"done"` and
//! its NUL, 5 bytes); the server reads the client's message, readies its
//! QP, sends its own, and reads the 5 bytes.
//!
//! **Extension** (ibal to ibal only; ibv tools never see it): after the 5
//! bytes the server writes one [`Ext`] line and reads one back; a client
//! that gets EOF instead (an ibv server closed the socket) knows its peer
//! is plain, and a server that gets EOF (an ibv client closed after
//! `done`) knows the same. An ibv server reads exactly the 5 bytes, so the
//! client never sends anything unasked.

use std::fmt;

/// Bytes of one standard message, NUL included
/// (`sizeof "0000:000000:000000:00000000000000000000000000000000"`).
pub const MSG_LEN: usize = 52;

/// The client's final message: `"done"` and its NUL.
pub const DONE: &[u8; 5] = b"done\0";

/// The Q_Key `ibv_ud_pingpong` uses on both sides.
pub const UD_QKEY: u32 = 0x1111_1111;

/// Bytes a UD receive buffer reserves for the GRH.
pub const GRH_BYTES: usize = 40;

/// The byte `ibv_rc_pingpong`/`ibv_ud_pingpong` fill their buffer with
/// before the first SEND (so the client's first message is all of it).
pub const IBV_FILL: u8 = 0x7b;

/// One side's address, as the standard message carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// GID (all zero when an ibv tool runs without `-g`).
    pub gid: [u8; 16],
}

/// A message that is not what the format says, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OobError(pub String);

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OobError {}

fn bad(what: impl Into<String>) -> OobError {
    OobError(what.into())
}

/// The GID as the wire text: 32 hex digits, its bytes in order (what
/// `gid_to_wire_gid` prints: four big-endian 32-bit groups).
pub fn gid_to_hex(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The standard 52-byte message of `d`.
pub fn encode(d: &Dest) -> [u8; MSG_LEN] {
    let text = format!(
        "{:04x}:{:06x}:{:06x}:{}",
        d.lid,
        d.qpn & 0xff_ffff,
        d.psn & 0xff_ffff,
        gid_to_hex(&d.gid)
    );
    let mut out = [0u8; MSG_LEN];
    out[..MSG_LEN - 1].copy_from_slice(text.as_bytes());
    out
}

fn hex_field(text: &str, name: &str, digits: usize) -> Result<u32, OobError> {
    if text.len() != digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!(
            "bad {name} field {text:?}: expected {digits} hex digits"
        )));
    }
    u32::from_str_radix(text, 16).map_err(|e| bad(format!("bad {name} field {text:?}: {e}")))
}

/// Parse a standard message: exactly [`MSG_LEN`] bytes, the four fields
/// separated by `:`, then the NUL.
pub fn decode(msg: &[u8]) -> Result<Dest, OobError> {
    if msg.len() != MSG_LEN {
        return Err(bad(format!(
            "the peer's address message has {} bytes, expected {MSG_LEN}",
            msg.len()
        )));
    }
    if msg[MSG_LEN - 1] != 0 {
        return Err(bad("the peer's address message does not end with a NUL"));
    }
    let text = std::str::from_utf8(&msg[..MSG_LEN - 1])
        .map_err(|_| bad("the peer's address message is not ASCII text"))?;
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 4 {
        return Err(bad(format!(
            "the peer's address message {text:?} does not have the form LID:QPN:PSN:GID"
        )));
    }
    let lid = hex_field(parts[0], "LID", 4)? as u16;
    let qpn = hex_field(parts[1], "QPN", 6)?;
    let psn = hex_field(parts[2], "PSN", 6)?;
    let g = parts[3];
    if g.len() != 32 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!("bad GID field {g:?}: expected 32 hex digits")));
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16)
            .map_err(|e| bad(format!("bad GID field {g:?}: {e}")))?;
    }
    Ok(Dest { lid, qpn, psn, gid })
}

/// Whether a GID's interface id (its low 8 bytes) is non-zero: the test
/// the ibv tools use to decide whether an address needs a GRH.
pub fn has_interface_id(gid: &[u8; 16]) -> bool {
    gid[8..].iter().any(|&b| b != 0)
}

/// The ibal-to-ibal extension line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ext {
    /// `rc` or `ud` (both sides must agree).
    pub ud: bool,
    /// Message size.
    pub size: u32,
    /// Round trips.
    pub iters: u32,
    /// The sender's pattern seed ([`pattern_byte`]).
    pub seed: u8,
    /// With `--write`: where the peer may RDMA WRITE (address, R_Key).
    /// With `--rdma-bulk`: the peer's bulk buffer of `2 * bulk` bytes
    /// (first half: the WRITE target; second half: the READ source, filled
    /// with [`bulk_pattern`] of `seed`).
    pub write: Option<(u64, u32)>,
    /// `--rdma-bulk SIZE` (0: not in that mode). Encoded as `bulk=SIZE`
    /// only when non-zero, so the line is unchanged otherwise; older
    /// decoders skip the field.
    pub bulk: u64,
}

/// First word of an [`Ext`] line (and its version).
pub const EXT_MAGIC: &str = "ibal-qpx/1";

impl Ext {
    /// The line, newline included.
    pub fn encode(&self) -> String {
        let (w, addr, rkey) = match self.write {
            Some((a, k)) => (1, a, k),
            None => (0, 0, 0),
        };
        let bulk = if self.bulk > 0 {
            format!(" bulk={}", self.bulk)
        } else {
            String::new()
        };
        format!(
            "{EXT_MAGIC} mode={} size={} iters={} seed={:02x} write={w} addr={addr:x} rkey={rkey:x}{bulk}\n",
            if self.ud { "ud" } else { "rc" },
            self.size,
            self.iters,
            self.seed,
        )
    }

    /// Parse a line (with or without its newline).
    pub fn decode(line: &str) -> Result<Ext, OobError> {
        let line = line.trim_end_matches(['\n', '\r']);
        let mut words = line.split(' ');
        if words.next() != Some(EXT_MAGIC) {
            return Err(bad(format!(
                "the peer's extension line {line:?} does not start with {EXT_MAGIC}"
            )));
        }
        let (mut ud, mut size, mut iters, mut seed, mut write, mut addr, mut rkey) =
            (None, None, None, None, None, None, None);
        let mut bulk = 0;
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| bad(format!("bad extension field {w:?}")))?;
            let num = |radix| {
                u64::from_str_radix(v, radix)
                    .map_err(|e| bad(format!("bad extension field {w:?}: {e}")))
            };
            match k {
                "mode" => {
                    ud = Some(match v {
                        "rc" => false,
                        "ud" => true,
                        _ => return Err(bad(format!("bad extension mode {v:?}"))),
                    })
                }
                "size" => size = Some(num(10)?),
                "iters" => iters = Some(num(10)?),
                "seed" => seed = Some(num(16)?),
                "write" => write = Some(num(10)?),
                "addr" => addr = Some(num(16)?),
                "rkey" => rkey = Some(num(16)?),
                "bulk" => bulk = num(10)?,
                _ => {} // later versions may add fields
            }
        }
        let need = |v: Option<u64>, name: &str| {
            v.ok_or_else(|| bad(format!("the peer's extension line lacks {name}=")))
        };
        let small = |v: u64, name: &str, max: u64| {
            if v > max {
                Err(bad(format!(
                    "extension field {name}={v:#x} is out of range"
                )))
            } else {
                Ok(v)
            }
        };
        let ud = ud.ok_or_else(|| bad("the peer's extension line lacks mode="))?;
        let size = small(need(size, "size")?, "size", u64::from(u32::MAX))? as u32;
        let iters = small(need(iters, "iters")?, "iters", u64::from(u32::MAX))? as u32;
        let seed = small(need(seed, "seed")?, "seed", 0xff)? as u8;
        let write = match small(need(write, "write")?, "write", 1)? {
            0 => None,
            _ => Some((
                need(addr, "addr")?,
                small(need(rkey, "rkey")?, "rkey", u64::from(u32::MAX))? as u32,
            )),
        };
        Ok(Ext {
            ud,
            size,
            iters,
            seed,
            write,
            bulk,
        })
    }
}

/// Byte `k` of the message a side with `seed` sends in round `i`. Two
/// consecutive rounds differ in every byte, so a stale buffer fails the
/// check.
pub fn pattern_byte(seed: u8, i: u32, k: usize) -> u8 {
    (k as u32)
        .wrapping_mul(31)
        .wrapping_add(i)
        .wrapping_add(u32::from(seed)) as u8
}

/// The whole message of round `i`.
pub fn pattern(seed: u8, i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| pattern_byte(seed, i, k)).collect()
}

/// The seed of the RDMA WRITE payloads of a side whose SEND seed is `seed`.
pub fn write_seed(seed: u8) -> u8 {
    seed ^ 0x80
}

/// Byte `k` of a `--rdma-bulk` buffer of a side with `seed`: byte `k % 4`
/// (little-endian) of the 32-bit word `(k / 4) * 0x9E3779B1 ^ seed *
/// 0x01010101`. The multiplier is odd, so every 4-byte word of a buffer
/// below 16 GiB differs from every other: a packet placed at the wrong
/// offset (even a multiple of the MTU away) fails the check, and
/// [`bulk_origin`] says where its bytes belonged. `rdma_peer.c` computes
/// the same.
pub fn bulk_byte(seed: u8, k: usize) -> u8 {
    let w = ((k / 4) as u32).wrapping_mul(0x9E37_79B1) ^ u32::from(seed).wrapping_mul(0x0101_0101);
    w.to_le_bytes()[k % 4]
}

/// A whole `--rdma-bulk` pattern of `len` bytes.
pub fn bulk_pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|k| bulk_byte(seed, k)).collect()
}

/// The offset in the [`bulk_pattern`] of `seed` that the aligned 4-byte
/// word `word` (little-endian) would have come from. Any word maps to some
/// offset; one beyond the buffer means the word is not from that pattern
/// (zeros, another seed, garbage).
pub fn bulk_origin(seed: u8, word: [u8; 4]) -> u64 {
    // 0x9E3779B1 * 0x0E8B2F51 == 1 (mod 2^32).
    let v = u32::from_le_bytes(word) ^ u32::from(seed).wrapping_mul(0x0101_0101);
    u64::from(v.wrapping_mul(0x0E8B_2F51)) * 4
}

/// The first byte where `got` differs from `want`, for the error message.
pub fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 77, 2];

    #[test]
    fn encodes_as_the_ibv_tools_do() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: GID,
        };
        let m = encode(&d);
        assert_eq!(m.len(), 52);
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc0a84d02"
        );
        assert_eq!(m[51], 0);
        assert_eq!(decode(&m), Ok(d));
    }

    #[test]
    fn decodes_upper_case_and_masks_24_bits() {
        let mut m = [0u8; 52];
        m[..51].copy_from_slice(b"0001:ABCDEF:000000:FE800000000000000000000000000001");
        let d = decode(&m).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (1, 0xabcdef, 0));
        assert_eq!(d.gid[0], 0xfe);
        assert_eq!(d.gid[15], 1);
        let wide = Dest {
            lid: 0,
            qpn: 0x1ff_ffff,
            psn: 0x100_0001,
            gid: GID,
        };
        let back = decode(&encode(&wide)).unwrap();
        assert_eq!((back.qpn, back.psn), (0xff_ffff, 1));
    }

    #[test]
    fn malformed_messages_are_refused_with_the_reason() {
        let good = encode(&Dest {
            lid: 0,
            qpn: 1,
            psn: 2,
            gid: GID,
        });
        let err = |m: &[u8]| decode(m).unwrap_err().0;
        assert!(err(&good[..51]).contains("51 bytes, expected 52"));
        assert!(err(b"done\0").contains("5 bytes"));
        let mut no_nul = good;
        no_nul[51] = b'0';
        assert!(err(&no_nul).contains("NUL"));
        let mut colon = good;
        colon[4] = b'-';
        assert!(err(&colon).contains("LID:QPN:PSN:GID"));
        let mut hex = good;
        hex[6] = b'g';
        assert!(err(&hex).contains("QPN"));
        let mut gid = good;
        gid[50] = b'z';
        assert!(err(&gid).contains("GID"));
        let mut utf = good;
        utf[0] = 0xff;
        assert!(err(&utf).contains("ASCII"));
        let mut short_field = [0u8; 52];
        short_field[..51].copy_from_slice(b"000:0000011:abcdef:00000000000000000000ffffc0a84d02");
        assert!(err(&short_field).contains("LID"));
    }

    #[test]
    fn interface_id_decides_the_grh() {
        assert!(has_interface_id(&GID));
        assert!(!has_interface_id(&[0; 16]));
    }

    #[test]
    fn extension_round_trips_and_refuses_garbage() {
        for e in [
            Ext {
                ud: false,
                size: 4096,
                iters: 1000,
                seed: 0x5a,
                write: Some((0x1000_0000, 0xdead_beef)),
                bulk: 0,
            },
            Ext {
                ud: false,
                size: 1 << 20,
                iters: 1,
                seed: 0x5a,
                write: Some((0x1000_0000, 0xdead_beef)),
                bulk: 1 << 20,
            },
            Ext {
                ud: true,
                size: 1024,
                iters: 3,
                seed: 0,
                write: None,
                bulk: 0,
            },
        ] {
            let line = e.encode();
            assert!(line.ends_with('\n'));
            assert_eq!(Ext::decode(&line), Ok(e));
        }
        assert!(Ext::decode("done").unwrap_err().0.contains("ibal-qpx/1"));
        assert!(Ext::decode("ibal-qpx/1 mode=xx")
            .unwrap_err()
            .0
            .contains("mode"));
        assert!(Ext::decode("ibal-qpx/1 mode=rc size=1")
            .unwrap_err()
            .0
            .contains("iters"));
        assert!(
            Ext::decode("ibal-qpx/1 mode=rc size=1 iters=1 seed=100 write=0")
                .unwrap_err()
                .0
                .contains("seed")
        );
        assert!(Ext::decode("ibal-qpx/1 mode=rc size=x").is_err());
        assert!(Ext::decode("ibal-qpx/1 junk").is_err());
    }

    #[test]
    fn bulk_words_are_unique_and_name_their_origin() {
        let p = bulk_pattern(0x5a, 1 << 16);
        let words: std::collections::HashSet<&[u8]> = p.chunks(4).collect();
        assert_eq!(words.len(), (1 << 16) / 4);
        for at in [0usize, 4, 1024, 4096, 65532] {
            let w = [p[at], p[at + 1], p[at + 2], p[at + 3]];
            assert_eq!(bulk_origin(0x5a, w), at as u64);
        }
        assert_eq!(bulk_byte(0, 0), 0);
        assert_eq!(bulk_byte(0, 4), 0xb1);
        assert_eq!(bulk_byte(0, 7), 0x9e);
        assert_eq!(bulk_byte(1, 0), 1);
    }

    #[test]
    fn patterns_change_every_byte_each_round() {
        let a = pattern(7, 3, 300);
        let b = pattern(7, 4, 300);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &b), Some(0));
        assert_eq!(first_difference(&a[..2], &a), Some(2));
    }
}
