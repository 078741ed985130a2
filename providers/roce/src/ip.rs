//! The IP and UDP header fields the ICRC covers, as the receiver will see
//! them (IBTA Annex A17: in RoCEv2 the IP and UDP headers take the place
//! of the GRH in the ICRC, less the fields routers may change).

use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::bytes::put_u16;
use crate::EncodeError;

/// IPv4 header length without options.
pub(crate) const IPV4_LEN: usize = 20;
/// IPv6 fixed header length.
pub(crate) const IPV6_LEN: usize = 40;
/// UDP header length.
pub(crate) const UDP_LEN: usize = 8;
/// IP protocol number of UDP.
pub(crate) const PROTO_UDP: u8 = 17;

/// An IPv4 flow, with the two IPv4 header fields the ICRC covers that the
/// addresses and lengths do not give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct V4Endpoints {
    /// Sender address and UDP source port.
    pub src: SocketAddrV4,
    /// Receiver address and UDP destination port.
    pub dst: SocketAddrV4,
    /// The IPv4 identification field the sender's kernel writes. Linux
    /// writes 0 for a datagram with DF set from an unconnected UDP socket
    /// (`ip_select_ident_segs` in `include/net/ip.h`), so a userspace
    /// provider must send from an unconnected socket with
    /// `IP_MTU_DISCOVER = IP_PMTUDISC_DO` to know it.
    pub identification: u16,
    /// The Don't Fragment flag.
    pub dont_fragment: bool,
}

/// An IPv6 flow: traffic class, flow label and hop limit are masked by the
/// ICRC, so addresses and ports are all it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct V6Endpoints {
    /// Sender address and UDP source port (flow info and scope ignored).
    pub src: SocketAddrV6,
    /// Receiver address and UDP destination port.
    pub dst: SocketAddrV6,
}

/// The addresses and ports of a RoCEv2 datagram, and whatever else of its IP
/// header the ICRC covers: what [`crate::Packet::encode`] and
/// [`crate::Packet::decode`] need to build the pseudo IP and UDP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoints {
    /// Carried in IPv4.
    V4(V4Endpoints),
    /// Carried in IPv6.
    V6(V6Endpoints),
}

impl Endpoints {
    /// The flow from `src` to `dst`. IPv4-mapped IPv6 addresses
    /// (`::ffff:a.b.c.d`) are taken as IPv4, as a dual-stack socket sends
    /// them. IPv4 gets identification 0 and DF set (see
    /// [`V4Endpoints::identification`]). Mixed families are an error.
    pub fn new(src: SocketAddr, dst: SocketAddr) -> Result<Self, EncodeError> {
        let v4 = |a: &SocketAddr| match a.ip() {
            IpAddr::V4(ip) => Some(SocketAddrV4::new(ip, a.port())),
            IpAddr::V6(ip) => ip
                .to_ipv4_mapped()
                .map(|ip4| SocketAddrV4::new(ip4, a.port())),
        };
        match (v4(&src), v4(&dst), src, dst) {
            (Some(src), Some(dst), _, _) => Ok(Endpoints::V4(V4Endpoints {
                src,
                dst,
                identification: 0,
                dont_fragment: true,
            })),
            (None, None, SocketAddr::V6(src), SocketAddr::V6(dst)) => {
                Ok(Endpoints::V6(V6Endpoints { src, dst }))
            }
            _ => Err(EncodeError::MixedAddressFamilies),
        }
    }

    /// The same flow in the other direction (IPv4 identification and DF
    /// kept).
    pub fn reversed(&self) -> Self {
        match *self {
            Endpoints::V4(e) => Endpoints::V4(V4Endpoints {
                src: e.dst,
                dst: e.src,
                ..e
            }),
            Endpoints::V6(e) => Endpoints::V6(V6Endpoints {
                src: e.dst,
                dst: e.src,
            }),
        }
    }

    /// The sender's socket address.
    pub fn src(&self) -> SocketAddr {
        match self {
            Endpoints::V4(e) => e.src.into(),
            Endpoints::V6(e) => e.src.into(),
        }
    }

    /// The receiver's socket address.
    pub fn dst(&self) -> SocketAddr {
        match self {
            Endpoints::V4(e) => e.dst.into(),
            Endpoints::V6(e) => e.dst.into(),
        }
    }

    /// Length of the IP header the datagram travels in.
    pub fn ip_header_len(&self) -> usize {
        match self {
            Endpoints::V4(_) => IPV4_LEN,
            Endpoints::V6(_) => IPV6_LEN,
        }
    }

    /// The IP and UDP headers of a datagram whose UDP payload is
    /// `udp_payload_len` bytes, with the fields the ICRC masks set to ones
    /// (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label,
    /// hop limit; UDP: checksum). Returns the buffer and how many of its
    /// bytes are used (28 or 48).
    pub(crate) fn masked_headers(
        &self,
        udp_payload_len: usize,
    ) -> Result<([u8; IPV6_LEN + UDP_LEN], usize), EncodeError> {
        let mut h = [0u8; IPV6_LEN + UDP_LEN];
        let udp_len = udp_payload_len + UDP_LEN;
        let (ip_len, sport, dport) = match self {
            Endpoints::V4(e) => {
                let total = udp_len + IPV4_LEN;
                let total16 =
                    u16::try_from(total).map_err(|_| EncodeError::TooLong { len: total })?;
                h[0] = 0x45;
                h[1] = 0xff; // TOS
                put_u16(&mut h, 2, total16);
                put_u16(&mut h, 4, e.identification);
                put_u16(&mut h, 6, if e.dont_fragment { 0x4000 } else { 0 });
                h[8] = 0xff; // TTL
                h[9] = PROTO_UDP;
                h[10] = 0xff; // header checksum
                h[11] = 0xff;
                h[12..16].copy_from_slice(&e.src.ip().octets());
                h[16..20].copy_from_slice(&e.dst.ip().octets());
                (IPV4_LEN, e.src.port(), e.dst.port())
            }
            Endpoints::V6(e) => {
                let len16 = u16::try_from(udp_len).map_err(|_| EncodeError::TooLong {
                    len: udp_len + IPV6_LEN,
                })?;
                h[0] = 0x6f; // version 6, traffic class high nibble
                h[1] = 0xff; // traffic class low nibble, flow label
                h[2] = 0xff;
                h[3] = 0xff;
                put_u16(&mut h, 4, len16);
                h[6] = PROTO_UDP;
                h[7] = 0xff; // hop limit
                h[8..24].copy_from_slice(&e.src.ip().octets());
                h[24..40].copy_from_slice(&e.dst.ip().octets());
                (IPV6_LEN, e.src.port(), e.dst.port())
            }
        };
        let udp = &mut h[ip_len..ip_len + UDP_LEN];
        put_u16(udp, 0, sport);
        put_u16(udp, 2, dport);
        put_u16(udp, 4, udp_len as u16);
        put_u16(udp, 6, 0xffff);
        Ok((h, ip_len + UDP_LEN))
    }
}

/// The 16-bit ones' complement sum of `data` (odd lengths padded with a
/// zero byte), folded, starting from `sum` (RFC 1071).
pub(crate) fn ones_sum(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// The IPv4 header checksum of a 20-byte header whose checksum field is 0.
pub(crate) fn ipv4_checksum(header: &[u8]) -> u16 {
    !(ones_sum(0, header) as u16)
}

/// The UDP checksum over the pseudo header (`addrs`: source then
/// destination address octets, 8 bytes for IPv4, 32 for IPv6), the UDP
/// header (checksum field 0) and payload; 0 is sent as 0xffff (RFC 768,
/// RFC 8200 §8.1).
pub(crate) fn udp_checksum(addrs: &[u8], udp: &[u8]) -> u16 {
    let mut sum = ones_sum(0, addrs);
    // Protocol, then the UDP length as 32 bits (the IPv6 form; for lengths
    // below 65536 the IPv4 sum is the same).
    sum = ones_sum(sum, &[0, PROTO_UDP]);
    sum = ones_sum(sum, &(udp.len() as u32).to_be_bytes());
    sum = ones_sum(sum, udp);
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

/// The GID of an IP address as RoCEv2 writes it: the IPv4-mapped IPv6
/// address (`::ffff:a.b.c.d`), or the IPv6 address (IBTA A17.4.5.1).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCEv2 GID names (IPv4 for an IPv4-mapped GID).
pub fn ip_of_gid(gid: &[u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_are_ipv4_and_families_must_match() {
        let e = Endpoints::new(
            "[::ffff:10.0.0.1]:49152".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
        )
        .unwrap();
        assert!(matches!(e, Endpoints::V4(_)));
        assert_eq!(e.dst(), "10.0.0.2:4791".parse().unwrap());
        assert_eq!(e.reversed().src(), e.dst());
        assert_eq!(
            Endpoints::new(
                "[fe80::1]:1".parse().unwrap(),
                "10.0.0.2:4791".parse().unwrap()
            ),
            Err(EncodeError::MixedAddressFamilies)
        );
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2.
        assert_eq!(
            ones_sum(0, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
    }
}
