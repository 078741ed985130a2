//! A whole RoCEv2 datagram: IPv4 or IPv6 header, UDP header, RoCEv2 packet.
//! For captures and test vectors; a provider sending over UDP sockets uses
//! [`crate::Packet`] and lets the kernel build the IP and UDP headers.
//!
//! Encoding computes the IPv4 header checksum and, unless told not to, the
//! UDP checksum. Decoding checks lengths, the protocol
//! and the ICRC, but not those two checksums: the ICRC masks them, a NIC
//! has checked them before RoCE sees the packet, and captures taken on a
//! sender with checksum offload hold wrong values.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use crate::bytes::{put_u16, take, u16_at, u32_at};
use crate::ip::{ipv4_checksum, udp_checksum, IPV4_LEN, IPV6_LEN, PROTO_UDP, UDP_LEN};
use crate::{
    icrc, DecodeError, EncodeError, Endpoints, Packet, V4Endpoints, V6Endpoints, ICRC_LEN,
};

/// The IPv4 header fields a frame sets (lengths, protocol and checksum are
/// computed; no options, never fragmented).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// Type of service (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub identification: u16,
    /// Don't Fragment.
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
}

/// The IPv6 header fields a frame sets (payload length and next header are
/// computed; no extension headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
}

/// The IP header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpHeader {
    /// IPv4.
    V4(Ipv4Header),
    /// IPv6.
    V6(Ipv6Header),
}

/// An IP + UDP + RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame<'a> {
    /// The IP header.
    pub ip: IpHeader,
    /// UDP source port (RoCEv2 senders vary it per QP for ECMP).
    pub src_port: u16,
    /// UDP destination port (4791, [`crate::ROCE_UDP_PORT`]).
    pub dst_port: u16,
    /// Whether the UDP checksum is computed (true) or sent as 0 (false).
    /// Zero means "none" over IPv4; over IPv6 it is allowed only for
    /// tunnels (RFC 8200 §8.1, RFC 6936), so IPv6 frames should compute it.
    /// Decoding sets it to whether the checksum field is non-zero.
    pub udp_checksum: bool,
    /// The RoCEv2 packet.
    pub packet: Packet<'a>,
}

impl<'a> Frame<'a> {
    /// The flow the ICRC is computed for.
    pub fn endpoints(&self) -> Endpoints {
        match self.ip {
            IpHeader::V4(h) => Endpoints::V4(V4Endpoints {
                src: SocketAddrV4::new(h.src, self.src_port),
                dst: SocketAddrV4::new(h.dst, self.dst_port),
                identification: h.identification,
                dont_fragment: h.dont_fragment,
            }),
            IpHeader::V6(h) => Endpoints::V6(V6Endpoints {
                src: SocketAddrV6::new(h.src, self.src_port, 0, 0),
                dst: SocketAddrV6::new(h.dst, self.dst_port, 0, 0),
            }),
        }
    }

    /// Bytes of the encoded frame.
    pub fn encoded_len(&self) -> usize {
        let ip = match self.ip {
            IpHeader::V4(_) => IPV4_LEN,
            IpHeader::V6(_) => IPV6_LEN,
        };
        ip + UDP_LEN + self.packet.encoded_len()
    }

    /// The IP packet: IP header, UDP header, RoCEv2 packet with its ICRC.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let endpoints = self.endpoints();
        let ip_len = endpoints.ip_header_len();
        let total = self.encoded_len();
        let total16 = u16::try_from(total).map_err(|_| EncodeError::TooLong { len: total })?;
        let mut v = vec![0u8; total];
        self.packet
            .encode_into(&endpoints, &mut v[ip_len + UDP_LEN..])?;
        let udp_len = (total - ip_len) as u16;
        let addrs: Vec<u8> = match self.ip {
            IpHeader::V4(h) => {
                let b = &mut v[..IPV4_LEN];
                b[0] = 0x45;
                b[1] = h.tos;
                put_u16(b, 2, total16);
                put_u16(b, 4, h.identification);
                put_u16(b, 6, if h.dont_fragment { 0x4000 } else { 0 });
                b[8] = h.ttl;
                b[9] = PROTO_UDP;
                b[12..16].copy_from_slice(&h.src.octets());
                b[16..20].copy_from_slice(&h.dst.octets());
                let c = ipv4_checksum(b);
                put_u16(b, 10, c);
                [h.src.octets(), h.dst.octets()].concat()
            }
            IpHeader::V6(h) => {
                crate::bytes::fits("IPv6 flow label", h.flow_label.into(), 20)?;
                let b = &mut v[..IPV6_LEN];
                let word = (6u32 << 28) | (u32::from(h.traffic_class) << 20) | h.flow_label;
                b[..4].copy_from_slice(&word.to_be_bytes());
                put_u16(b, 4, udp_len);
                b[6] = PROTO_UDP;
                b[7] = h.hop_limit;
                b[8..24].copy_from_slice(&h.src.octets());
                b[24..40].copy_from_slice(&h.dst.octets());
                [h.src.octets(), h.dst.octets()].concat()
            }
        };
        let udp = &mut v[ip_len..];
        put_u16(udp, 0, self.src_port);
        put_u16(udp, 2, self.dst_port);
        put_u16(udp, 4, udp_len);
        if self.udp_checksum {
            let c = udp_checksum(&addrs, udp);
            put_u16(udp, 6, c);
        }
        Ok(v)
    }

    /// Reads an IP packet carrying a RoCEv2 packet and checks its ICRC.
    /// Bytes after the IP length (an Ethernet trailer) are ignored.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let first = take(bytes, 1, "IP header")?[0];
        let (ip, ip_len, end) = match first >> 4 {
            4 => {
                let b = take(bytes, IPV4_LEN, "IPv4 header")?;
                let ihl = first & 0x0f;
                if ihl != 5 {
                    return Err(DecodeError::Ipv4Options { ihl });
                }
                let frag = u16_at(b, 6);
                if frag & 0x3fff != 0 {
                    return Err(DecodeError::Ipv4Fragment);
                }
                if b[9] != PROTO_UDP {
                    return Err(DecodeError::NotUdp { protocol: b[9] });
                }
                let total = usize::from(u16_at(b, 2));
                let ip = IpHeader::V4(Ipv4Header {
                    tos: b[1],
                    identification: u16_at(b, 4),
                    dont_fragment: frag & 0x4000 != 0,
                    ttl: b[8],
                    src: Ipv4Addr::from(u32_at(b, 12)),
                    dst: Ipv4Addr::from(u32_at(b, 16)),
                });
                (ip, IPV4_LEN, total)
            }
            6 => {
                let b = take(bytes, IPV6_LEN, "IPv6 header")?;
                if b[6] != PROTO_UDP {
                    return Err(DecodeError::NotUdp { protocol: b[6] });
                }
                let word = u32_at(b, 0);
                let mut src = [0u8; 16];
                src.copy_from_slice(&b[8..24]);
                let mut dst = [0u8; 16];
                dst.copy_from_slice(&b[24..40]);
                let ip = IpHeader::V6(Ipv6Header {
                    traffic_class: (word >> 20) as u8,
                    flow_label: word & 0x000f_ffff,
                    hop_limit: b[7],
                    src: Ipv6Addr::from(src),
                    dst: Ipv6Addr::from(dst),
                });
                (ip, IPV6_LEN, IPV6_LEN + usize::from(u16_at(b, 4)))
            }
            version => return Err(DecodeError::NotIp { version }),
        };
        if end > bytes.len() || end < ip_len + UDP_LEN {
            return Err(DecodeError::LengthMismatch {
                field: "IP length",
                claimed: end,
                actual: bytes.len(),
            });
        }
        let bytes = &bytes[..end];
        let udp = &bytes[ip_len..];
        let udp_len = usize::from(u16_at(udp, 4));
        if udp_len != udp.len() {
            return Err(DecodeError::LengthMismatch {
                field: "UDP length",
                claimed: udp_len,
                actual: udp.len(),
            });
        }
        let payload = &udp[UDP_LEN..];
        let packet = Packet::decode_without_icrc(payload)?;
        let body = &payload[..payload.len() - ICRC_LEN];
        let tail = &payload[payload.len() - ICRC_LEN..];
        let carried = icrc::from_wire([tail[0], tail[1], tail[2], tail[3]]);
        let computed = icrc::icrc_over_headers(&bytes[..ip_len + UDP_LEN], body)?;
        if carried != computed {
            return Err(DecodeError::IcrcMismatch { carried, computed });
        }
        Ok(Frame {
            ip,
            src_port: u16_at(udp, 0),
            dst_port: u16_at(udp, 2),
            udp_checksum: u16_at(udp, 6) != 0,
            packet,
        })
    }
}
