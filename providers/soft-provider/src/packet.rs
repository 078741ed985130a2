//! Unreliable-datagram packets as an InfiniBand link carries them (IBA
//! vol. 1, chapters 7 and 9): Local Route Header, optional Global Route
//! Header, Base and Datagram Extended Transport Headers, optional immediate
//! data, the payload padded to a 4-byte boundary, and the two CRCs.
//!
//! The soft fabric moves a datagram by copying it between registered
//! buffers; nothing in it is a packet. This module is how the fabric shows
//! what it carried to tools that read packets: [`crate::erf`] writes these
//! bytes as InfiniBand records, which Wireshark's `infiniband` dissector
//! (tshark) decodes down to every field of the MAD inside, and
//! [`UdPacket::decode`] lets tests read a capture back with every field and
//! both CRCs checked.
//!
//! CRCs (IBA 7.8):
//! * **ICRC**: CRC-32 (the Ethernet polynomial, bit-reflected, seeded with
//!   ones, complemented, least significant byte first) over the fields that
//!   no switch or router changes. The variant fields count as ones: in a
//!   local packet the LRH's VL and the BTH's Resv8a; in a global packet the
//!   whole LRH, the GRH's traffic class, flow label and hop limit, and the
//!   BTH's Resv8a.
//! * **VCRC**: CRC-16 with polynomial 0x100B over everything from the LRH
//!   through the ICRC, in the ICRC's bit and byte order, seeded with ones and
//!   complemented. Wireshark shows both CRCs without checking them; only
//!   [`UdPacket::decode`] checks them here.

use std::fmt;

use provider::Gid;

/// Bytes of the Local Route Header.
pub const LRH_LEN: usize = 8;
/// Bytes of the Global Route Header.
pub const GRH_LEN: usize = 40;
/// Bytes of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Bytes of the Datagram Extended Transport Header.
pub const DETH_LEN: usize = 8;
/// Bytes of the immediate data header.
pub const IMMDT_LEN: usize = 4;
/// Bytes of the invariant CRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of the variant CRC.
pub const VCRC_LEN: usize = 2;
/// The largest UD payload (the largest path MTU).
pub const MAX_UD_PAYLOAD: usize = 4096;

/// BTH opcode: UD SEND Only.
pub const OPCODE_UD_SEND_ONLY: u8 = 0x64;
/// BTH opcode: UD SEND Only with Immediate.
pub const OPCODE_UD_SEND_ONLY_IMM: u8 = 0x65;

/// LRH Link Next Header: IBA transport, no GRH.
const LNH_IBA_LOCAL: u8 = 2;
/// LRH Link Next Header: GRH, then IBA transport.
const LNH_IBA_GLOBAL: u8 = 3;
/// GRH Next Header for an IBA transport header.
const GRH_NEXT_HEADER_IBA: u8 = 0x1b;
/// GRH IP version.
const GRH_IP_VERSION: u8 = 6;
const QPN_MASK: u32 = 0xff_ffff;

/// Routing fields of a global (GRH) packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
}

/// One UD SEND packet (SEND Only, with or without immediate data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdPacket {
    /// Virtual lane (4 bits); 0 for data, 15 only for QP0.
    pub vl: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Present for global (GRH-routed) packets.
    pub grh: Option<Grh>,
    /// BTH solicited event.
    pub solicited: bool,
    /// BTH partition key.
    pub pkey: u16,
    /// Destination QP (24 bits).
    pub dest_qpn: u32,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// DETH Q_Key.
    pub qkey: u32,
    /// DETH source QP (24 bits).
    pub src_qpn: u32,
    /// Immediate data (SEND Only with Immediate).
    pub immediate: Option<u32>,
    /// The message, at most [`MAX_UD_PAYLOAD`] bytes.
    pub payload: Vec<u8>,
}

/// Why bytes are not a UD packet this module can read or write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PacketError {
    /// Fewer bytes than the headers and CRCs need.
    Truncated {
        /// Bytes given.
        len: usize,
    },
    /// A field does not fit its width, or the payload is too long.
    FieldRange(&'static str),
    /// LRH LVer other than 0.
    LinkVersion(u8),
    /// LRH Link Next Header that is not an IBA transport.
    LinkNextHeader(u8),
    /// The LRH packet length disagrees with the bytes.
    PacketLength {
        /// PktLen of the LRH, in 4-byte words.
        lrh_words: u16,
        /// Bytes from the LRH through the ICRC.
        bytes: usize,
    },
    /// The GRH's version, next header or payload length is wrong.
    BadGrh(&'static str),
    /// BTH opcode that is not a UD SEND Only.
    NotUdSend(u8),
    /// BTH transport header version other than 0.
    TransportVersion(u8),
    /// The invariant CRC does not match.
    Icrc {
        /// In the packet.
        carried: u32,
        /// Over the packet's bytes.
        computed: u32,
    },
    /// The variant CRC does not match.
    Vcrc {
        /// In the packet.
        carried: u16,
        /// Over the packet's bytes.
        computed: u16,
    },
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len } => write!(f, "{len} bytes are too few for a UD packet"),
            Self::FieldRange(field) => write!(f, "{field} does not fit its field"),
            Self::LinkVersion(v) => write!(f, "LRH link version {v}, expected 0"),
            Self::LinkNextHeader(v) => write!(f, "LRH next header {v} is not an IBA transport"),
            Self::PacketLength { lrh_words, bytes } => write!(
                f,
                "LRH packet length {lrh_words} words does not match {bytes} bytes"
            ),
            Self::BadGrh(what) => write!(f, "bad GRH: {what}"),
            Self::NotUdSend(op) => write!(f, "BTH opcode {op:#04x} is not a UD SEND Only"),
            Self::TransportVersion(v) => write!(f, "BTH transport version {v}, expected 0"),
            Self::Icrc { carried, computed } => write!(
                f,
                "ICRC {carried:#010x} does not match the computed {computed:#010x}"
            ),
            Self::Vcrc { carried, computed } => write!(
                f,
                "VCRC {carried:#06x} does not match the computed {computed:#06x}"
            ),
        }
    }
}

impl std::error::Error for PacketError {}

impl UdPacket {
    /// The packet's bytes, LRH through VCRC.
    pub fn encode(&self) -> Result<Vec<u8>, PacketError> {
        self.check_ranges()?;
        let pad = (4 - self.payload.len() % 4) % 4;
        let transport = BTH_LEN
            + DETH_LEN
            + if self.immediate.is_some() {
                IMMDT_LEN
            } else {
                0
            }
            + self.payload.len()
            + pad;
        let grh_len = if self.grh.is_some() { GRH_LEN } else { 0 };
        let total = LRH_LEN + grh_len + transport + ICRC_LEN;
        let mut p = Vec::with_capacity(total + VCRC_LEN);

        // LRH.
        let lnh = if self.grh.is_some() {
            LNH_IBA_GLOBAL
        } else {
            LNH_IBA_LOCAL
        };
        p.push(self.vl << 4);
        p.push((self.sl << 4) | lnh);
        p.extend_from_slice(&self.dlid.to_be_bytes());
        p.extend_from_slice(&((total / 4) as u16).to_be_bytes());
        p.extend_from_slice(&self.slid.to_be_bytes());
        // GRH.
        if let Some(g) = &self.grh {
            let w0 = (u32::from(GRH_IP_VERSION) << 28)
                | (u32::from(g.traffic_class) << 20)
                | g.flow_label;
            p.extend_from_slice(&w0.to_be_bytes());
            p.extend_from_slice(&((transport + ICRC_LEN) as u16).to_be_bytes());
            p.push(GRH_NEXT_HEADER_IBA);
            p.push(g.hop_limit);
            p.extend_from_slice(&g.sgid);
            p.extend_from_slice(&g.dgid);
        }
        // BTH.
        p.push(if self.immediate.is_some() {
            OPCODE_UD_SEND_ONLY_IMM
        } else {
            OPCODE_UD_SEND_ONLY
        });
        p.push((u8::from(self.solicited) << 7) | ((pad as u8) << 4));
        p.extend_from_slice(&self.pkey.to_be_bytes());
        p.extend_from_slice(&self.dest_qpn.to_be_bytes()); // byte 4 is Resv8a = 0
        p.extend_from_slice(&self.psn.to_be_bytes()); // AckReq = 0, Resv7 = 0
                                                      // DETH.
        p.extend_from_slice(&self.qkey.to_be_bytes());
        p.extend_from_slice(&self.src_qpn.to_be_bytes()); // byte 0 is reserved = 0
        if let Some(imm) = self.immediate {
            p.extend_from_slice(&imm.to_be_bytes());
        }
        p.extend_from_slice(&self.payload);
        p.resize(p.len() + pad + ICRC_LEN + VCRC_LEN, 0);
        debug_assert_eq!(p.len(), total + VCRC_LEN);
        refresh_crcs(&mut p)?;
        Ok(p)
    }

    /// Reads a UD SEND Only packet (LRH through VCRC), checking the lengths,
    /// versions and both CRCs.
    pub fn decode(b: &[u8]) -> Result<UdPacket, PacketError> {
        let min = LRH_LEN + BTH_LEN + DETH_LEN + ICRC_LEN + VCRC_LEN;
        if b.len() < min || b.len() % 4 != VCRC_LEN {
            return Err(PacketError::Truncated { len: b.len() });
        }
        let (body, vcrc_bytes) = b.split_at(b.len() - VCRC_LEN);
        let carried_vcrc = u16::from_le_bytes([vcrc_bytes[0], vcrc_bytes[1]]);
        let computed_vcrc = vcrc(body);
        if carried_vcrc != computed_vcrc {
            return Err(PacketError::Vcrc {
                carried: carried_vcrc,
                computed: computed_vcrc,
            });
        }
        if b[0] & 0x0f != 0 {
            return Err(PacketError::LinkVersion(b[0] & 0x0f));
        }
        let lnh = b[1] & 0x03;
        let global = match lnh {
            LNH_IBA_LOCAL => false,
            LNH_IBA_GLOBAL => true,
            other => return Err(PacketError::LinkNextHeader(other)),
        };
        let lrh_words = be16(b, 4) & 0x07ff;
        if usize::from(lrh_words) * 4 != body.len() {
            return Err(PacketError::PacketLength {
                lrh_words,
                bytes: body.len(),
            });
        }
        let mut at = LRH_LEN;
        let grh = if global {
            if body.len() < LRH_LEN + GRH_LEN + BTH_LEN + DETH_LEN + ICRC_LEN {
                return Err(PacketError::Truncated { len: b.len() });
            }
            let w0 = be32(b, at);
            if (w0 >> 28) as u8 != GRH_IP_VERSION {
                return Err(PacketError::BadGrh("IP version is not 6"));
            }
            if usize::from(be16(b, at + 4)) != body.len() - LRH_LEN - GRH_LEN {
                return Err(PacketError::BadGrh("payload length"));
            }
            if b[at + 6] != GRH_NEXT_HEADER_IBA {
                return Err(PacketError::BadGrh("next header is not IBA transport"));
            }
            let g = Grh {
                traffic_class: (w0 >> 20) as u8,
                flow_label: w0 & 0xf_ffff,
                hop_limit: b[at + 7],
                sgid: gid(b, at + 8),
                dgid: gid(b, at + 24),
            };
            at += GRH_LEN;
            Some(g)
        } else {
            None
        };
        let opcode = b[at];
        let with_imm = match opcode {
            OPCODE_UD_SEND_ONLY => false,
            OPCODE_UD_SEND_ONLY_IMM => true,
            other => return Err(PacketError::NotUdSend(other)),
        };
        let tver = b[at + 1] & 0x0f;
        if tver != 0 {
            return Err(PacketError::TransportVersion(tver));
        }
        let solicited = b[at + 1] & 0x80 != 0;
        let pad = usize::from((b[at + 1] >> 4) & 0x03);
        let pkey = be16(b, at + 2);
        let dest_qpn = be32(b, at + 4) & QPN_MASK;
        let psn = be32(b, at + 8) & QPN_MASK;
        at += BTH_LEN;
        let qkey = be32(b, at);
        let src_qpn = be32(b, at + 4) & QPN_MASK;
        at += DETH_LEN;
        let immediate = if with_imm {
            if body.len() < at + IMMDT_LEN + ICRC_LEN {
                return Err(PacketError::Truncated { len: b.len() });
            }
            let v = be32(b, at);
            at += IMMDT_LEN;
            Some(v)
        } else {
            None
        };
        let icrc_at = body.len() - ICRC_LEN;
        if icrc_at < at + pad {
            return Err(PacketError::Truncated { len: b.len() });
        }
        let carried_icrc =
            u32::from_le_bytes([b[icrc_at], b[icrc_at + 1], b[icrc_at + 2], b[icrc_at + 3]]);
        let computed_icrc = icrc(&b[..icrc_at], global);
        if carried_icrc != computed_icrc {
            return Err(PacketError::Icrc {
                carried: carried_icrc,
                computed: computed_icrc,
            });
        }
        Ok(UdPacket {
            vl: b[0] >> 4,
            sl: b[1] >> 4,
            dlid: be16(b, 2),
            slid: be16(b, 6),
            grh,
            solicited,
            pkey,
            dest_qpn,
            psn,
            qkey,
            src_qpn,
            immediate,
            payload: b[at..icrc_at - pad].to_vec(),
        })
    }

    fn check_ranges(&self) -> Result<(), PacketError> {
        let checks = [
            (self.vl > 0x0f, "VL"),
            (self.sl > 0x0f, "SL"),
            (self.dest_qpn > QPN_MASK, "the destination QPN"),
            (self.src_qpn > QPN_MASK, "the source QPN"),
            (self.psn > QPN_MASK, "the PSN"),
            (self.payload.len() > MAX_UD_PAYLOAD, "the payload"),
            (
                self.grh.is_some_and(|g| g.flow_label > 0xf_ffff),
                "the flow label",
            ),
        ];
        match checks.iter().find(|(bad, _)| *bad) {
            Some((_, field)) => Err(PacketError::FieldRange(field)),
            None => Ok(()),
        }
    }
}

/// Recomputes the ICRC and VCRC of a packet whose headers or payload were
/// edited in place (tests, tools, fuzzing). The bytes need a 4-byte-aligned
/// body plus the VCRC, an LRH naming an IBA transport, and room for the
/// headers that LRH announces; nothing else is checked.
pub fn refresh_crcs(b: &mut [u8]) -> Result<(), PacketError> {
    let n = b.len();
    if n < LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN || n % 4 != VCRC_LEN {
        return Err(PacketError::Truncated { len: n });
    }
    let global = match b[1] & 0x03 {
        LNH_IBA_LOCAL => false,
        LNH_IBA_GLOBAL => true,
        other => return Err(PacketError::LinkNextHeader(other)),
    };
    let icrc_at = n - VCRC_LEN - ICRC_LEN;
    if global && icrc_at < LRH_LEN + GRH_LEN + BTH_LEN {
        return Err(PacketError::Truncated { len: n });
    }
    let i = icrc(&b[..icrc_at], global).to_le_bytes();
    b[icrc_at..icrc_at + ICRC_LEN].copy_from_slice(&i);
    let v = vcrc(&b[..n - VCRC_LEN]).to_le_bytes();
    b[n - VCRC_LEN..].copy_from_slice(&v);
    Ok(())
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn gid(b: &[u8], at: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    g
}

/// The ICRC of `packet` (LRH up to, not including, the ICRC), with the
/// variant fields counted as ones. `packet` holds at least the LRH, the GRH
/// when `global`, and the BTH.
fn icrc(packet: &[u8], global: bool) -> u32 {
    let mut crc = !0u32;
    let bth_at = if global {
        // The whole LRH, then the GRH with traffic class, flow label and
        // hop limit as ones (the IP version, payload length, next header
        // and both GIDs count as they are).
        crc = crc32_update(crc, &[0xff; LRH_LEN]);
        let mut grh = [0u8; GRH_LEN];
        grh.copy_from_slice(&packet[LRH_LEN..LRH_LEN + GRH_LEN]);
        grh[0] |= 0x0f;
        grh[1..4].fill(0xff);
        grh[7] = 0xff;
        crc = crc32_update(crc, &grh);
        LRH_LEN + GRH_LEN
    } else {
        // The LRH with its VL as ones.
        let mut lrh = [0u8; LRH_LEN];
        lrh.copy_from_slice(&packet[..LRH_LEN]);
        lrh[0] |= 0xf0;
        crc = crc32_update(crc, &lrh);
        LRH_LEN
    };
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&packet[bth_at..bth_at + BTH_LEN]);
    bth[4] = 0xff; // Resv8a
    crc = crc32_update(crc, &bth);
    !crc32_update(crc, &packet[bth_at + BTH_LEN..])
}

/// The VCRC of `packet` (LRH through ICRC).
fn vcrc(packet: &[u8]) -> u16 {
    // 0x100B, bit-reflected.
    const POLY: u16 = 0xd008;
    let mut crc = !0u16;
    for &byte in packet {
        crc ^= u16::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// CRC-32 (IEEE 802.3, bit-reflected) of `data` continuing from the
/// register value `crc`, with no inversion at either end.
fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    const POLY: u32 = 0xedb8_8320;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mad_packet() -> UdPacket {
        UdPacket {
            vl: 0,
            sl: 0,
            dlid: 2,
            slid: 1,
            grh: None,
            solicited: false,
            pkey: 0xffff,
            dest_qpn: 1,
            psn: 7,
            qkey: 0x8001_0000,
            src_qpn: 1,
            immediate: None,
            payload: (0..=255u8).collect(),
        }
    }

    #[test]
    fn the_crc32_is_the_ethernet_one() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(!crc32_update(!0, b"123456789"), 0xcbf4_3926);
        // Eight bytes of ones (the LRH of a global packet, or the missing
        // LRH of RoCEv2) leave the register at the value Linux's software
        // RoCE driver seeds its ICRC with.
        assert_eq!(crc32_update(!0, &[0xff; 8]), 0xdebb_20e3);
    }

    #[test]
    fn a_local_mad_packet_has_the_iba_layout() {
        let p = mad_packet();
        let b = p.encode().unwrap();
        assert_eq!(b.len(), 8 + 12 + 8 + 256 + 4 + 2);
        assert_eq!(b[0], 0x00, "VL 0, LVer 0");
        assert_eq!(b[1], 0x02, "SL 0, LNH IBA local");
        assert_eq!(&b[2..4], &[0, 2], "DLID");
        assert_eq!(be16(&b, 4), ((8 + 12 + 8 + 256 + 4) / 4) as u16, "PktLen");
        assert_eq!(&b[6..8], &[0, 1], "SLID");
        assert_eq!(b[8], OPCODE_UD_SEND_ONLY);
        assert_eq!(b[9], 0, "SE 0, M 0, pad 0, TVer 0");
        assert_eq!(&b[10..12], &[0xff, 0xff], "P_Key");
        assert_eq!(&b[12..16], &[0, 0, 0, 1], "Resv8a, DestQP");
        assert_eq!(&b[16..20], &[0, 0, 0, 7], "AckReq, PSN");
        assert_eq!(&b[20..24], &[0x80, 0x01, 0, 0], "Q_Key");
        assert_eq!(&b[24..28], &[0, 0, 0, 1], "SrcQP");
        assert_eq!(&b[28..284], &p.payload[..]);
        assert_eq!(UdPacket::decode(&b).unwrap(), p);
    }

    #[test]
    fn global_padded_and_immediate_packets_round_trip() {
        let mut p = mad_packet();
        p.grh = Some(Grh {
            traffic_class: 0x12,
            flow_label: 0xabcde,
            hop_limit: 64,
            sgid: [0xfe; 16],
            dgid: [0x80; 16],
        });
        p.immediate = Some(0xdead_beef);
        p.solicited = true;
        p.sl = 3;
        for len in [0, 1, 2, 3, 5, 255, 4096] {
            p.payload = (0..len).map(|i| i as u8).collect();
            let b = p.encode().unwrap();
            assert_eq!(b.len() % 4, 2);
            assert_eq!(b[1] & 3, 3, "LNH IBA global");
            assert_eq!(UdPacket::decode(&b).unwrap(), p, "payload of {len} bytes");
        }
    }

    #[test]
    fn the_icrc_ignores_variant_fields_and_covers_the_rest() {
        let b = mad_packet().encode().unwrap();
        let body = &b[..b.len() - VCRC_LEN - ICRC_LEN];
        let base = icrc(body, false);
        // A switch may change the VL and Resv8a: same ICRC.
        let mut v = body.to_vec();
        v[0] |= 0x70;
        v[12] = 0x5a;
        assert_eq!(icrc(&v, false), base);
        // Anything else changes it: SL, DLID, P_Key, DestQP, Q_Key, payload.
        for at in [1, 3, 11, 15, 21, 100] {
            let mut v = body.to_vec();
            v[at] ^= 0x10;
            assert_ne!(icrc(&v, false), base, "byte {at}");
        }
    }

    #[test]
    fn every_corrupted_byte_and_bad_header_is_refused() {
        let b = mad_packet().encode().unwrap();
        for at in 0..b.len() {
            let mut v = b.clone();
            v[at] ^= 0x01;
            assert!(UdPacket::decode(&v).is_err(), "flip at byte {at} accepted");
        }
        for len in 0..b.len() {
            assert!(UdPacket::decode(&b[..len]).is_err(), "{len} bytes accepted");
        }
        let mut rc = mad_packet().encode().unwrap();
        rc[8] = 0x04; // RC SEND Only
        refresh_crcs(&mut rc).unwrap();
        assert_eq!(UdPacket::decode(&rc), Err(PacketError::NotUdSend(0x04)));
        // Each header check, behind valid CRCs.
        let edits: [(usize, u8, PacketError); 4] = [
            (0, 0x01, PacketError::LinkVersion(1)),
            (9, 0x01, PacketError::TransportVersion(1)),
            (
                5,
                0x00,
                PacketError::PacketLength {
                    lrh_words: 0,
                    bytes: rc.len() - 2,
                },
            ),
            (
                8,
                0x64,
                PacketError::Icrc {
                    carried: 0,
                    computed: 0,
                },
            ),
        ];
        for (at, value, want) in edits {
            let mut b = mad_packet().encode().unwrap();
            b[at] = value;
            if !matches!(want, PacketError::Icrc { .. }) {
                refresh_crcs(&mut b).unwrap();
            } else {
                b[30] ^= 1; // payload changed, CRCs left alone: VCRC fixed only
                let n = b.len();
                let v = vcrc(&b[..n - 2]).to_le_bytes();
                b[n - 2..].copy_from_slice(&v);
            }
            let got = UdPacket::decode(&b).unwrap_err();
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&want),
                "byte {at} = {value:#x}: {got}"
            );
        }
        let mut short = vec![0u8; 10];
        assert!(refresh_crcs(&mut short).is_err());
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panicking() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = mad_packet().encode().unwrap();
        for round in 0..20_000 {
            let mut b = if round % 2 == 0 {
                valid.clone()
            } else {
                (0..next() % 400).map(|_| next() as u8).collect()
            };
            // Headers that pass the first checks reach the deeper ones.
            if b.len() > 2 && round % 4 == 1 {
                b[0] &= 0xf0;
                b[1] = (b[1] & 0xfc) | 2 | (next() as u8 & 1);
            }
            for _ in 0..next() % 4 {
                if !b.is_empty() {
                    let at = (next() % b.len() as u64) as usize;
                    b[at] = next() as u8;
                }
            }
            if round % 3 == 0 {
                b.truncate((next() % (b.len() as u64 + 1)) as usize);
            }
            // Make the length, PktLen and VCRC agree now and then, so the
            // header checks behind them run on damaged headers too.
            if round % 4 == 1 && b.len() >= 8 {
                b.truncate(b.len() - (b.len() + 2) % 4);
                let words = ((b.len() - 2) / 4) as u16;
                b[4..6].copy_from_slice(&words.to_be_bytes());
                let _ = refresh_crcs(&mut b);
            }
            let _ = UdPacket::decode(&b);
        }
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        let cases: [fn(&mut UdPacket); 5] = [
            |p| p.vl = 16,
            |p| p.sl = 16,
            |p| p.dest_qpn = 1 << 24,
            |p| p.psn = 1 << 24,
            |p| p.payload = vec![0; MAX_UD_PAYLOAD + 1],
        ];
        for f in cases {
            let mut p = mad_packet();
            f(&mut p);
            assert!(matches!(p.encode(), Err(PacketError::FieldRange(_))));
        }
    }
}
