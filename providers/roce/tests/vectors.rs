//! The ICRC against packets other tools published, byte for byte.
//!
//! Both vectors come from scapy's RoCE tests: repository `secdev/scapy`,
//! file `test/contrib/roce.uts` (read at commit
//! 05c24f8f699f5dc31380eb177c413b35cac6267c). Scapy's `BTH.icrc` field is
//! the four wire bytes read big-endian, so its `0x78f353f3` is the wire
//! bytes `78 f3 53 f3`, i.e. the CRC-32 value `0xf353f378` this crate's
//! [`roce::icrc::icrc`] returns.

use std::net::{Ipv4Addr, SocketAddrV4};

use roce::icrc::{self, from_wire};
use roce::{
    Bth, DecodeError, Endpoints, Frame, Headers, IpHeader, Ipv4Header, Opcode, Packet, V4Endpoints,
};

/// Test "RoCE layer" of `test/contrib/roce.uts`: a UC SEND Only built with
/// scapy (`IP(tos=0x1, id=1144, flags='DF', ttl=64, src=dst='192.168.0.7',
/// len=64) / UDP(sport=49152, dport=4791, len=44) / BTH(opcode=
/// 'UC_SEND_ONLY', migreq=1, padcount=2, pkey=0xffff, dqpn=211,
/// psn=13571856) / Raw(20 bytes)`), where scapy asserts IP checksum 0xb4d5,
/// UDP checksum 0xaca2 and ICRC 0x78f353f3. The bytes below are that packet
/// from the IP header on; the 20 raw bytes are 18 bytes of payload and the
/// 2 pad bytes the pad count says.
const UC_SEND_ONLY: &str = concat!(
    "45010040047840004011b4d5c0a80007c0a80007", // IPv4
    "c00012b7002caca2",                         // UDP
    "2460ffff000000d300cf1710",                 // BTH
    "4630818be28935d90e9a95505401be885e50",     // payload
    "0000",                                     // pad
    "78f353f3",                                 // ICRC
);
const UC_PAYLOAD: &str = "4630818be28935d90e9a95505401be885e50";

/// Test "RoCE CNP captured on ConnectX-4 Lx" of `test/contrib/roce.uts`: a
/// congestion notification packet a Mellanox ConnectX-4 Lx sent, as
/// captured (Ethernet, IPv4 with TOS 0xc2 and DF, UDP source port 0 and
/// checksum 0, BTH opcode 0x81 with BECN, dest QP 0x118, 16 reserved bytes),
/// whose ICRC scapy recomputes as 0x82fd002a.
const CNP_CONNECTX4LX: &str = concat!(
    "e41d2dab2bc27cfe90643b320800",             // Ethernet
    "45c2003c718c4000401191610a0011010a001201", // IPv4
    "000012b700280000",                         // UDP
    "8100ffff4000011800000000",                 // BTH
    "00000000000000000000000000000000",         // CNP reserved
    "82fd002a",                                 // ICRC
);

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn uc_endpoints() -> Endpoints {
    let a = Ipv4Addr::new(192, 168, 0, 7);
    Endpoints::V4(V4Endpoints {
        src: SocketAddrV4::new(a, 49152),
        dst: SocketAddrV4::new(a, 4791),
        identification: 1144,
        dont_fragment: true,
    })
}

fn uc_headers() -> Headers {
    Headers::new(Bth {
        mig_req: true,
        ..Bth::new(Opcode::UcSendOnly, 211, 13_571_856)
    })
}

#[test]
fn scapy_uc_send_icrc() {
    let frame = hex(UC_SEND_ONLY);
    let udp_payload = &frame[28..];
    let body = &udp_payload[..udp_payload.len() - 4];
    let wire = from_wire([0x78, 0xf3, 0x53, 0xf3]);
    assert_eq!(wire, 0xf353_f378);
    // From the flow description (as a sender over a socket computes it).
    assert_eq!(icrc::icrc(&uc_endpoints(), body).unwrap(), wire);
    // From the raw headers (as a receiver of a frame computes it).
    assert_eq!(icrc::icrc_over_headers(&frame[..28], body).unwrap(), wire);
}

#[test]
fn scapy_uc_send_encodes_byte_for_byte() {
    let frame = hex(UC_SEND_ONLY);
    let payload = hex(UC_PAYLOAD);
    let packet = Packet::new(uc_headers(), &payload);
    assert_eq!(packet.pad_count(), 2);
    assert_eq!(packet.encode(&uc_endpoints()).unwrap(), &frame[28..]);

    let f = Frame {
        ip: IpHeader::V4(Ipv4Header {
            tos: 1,
            identification: 1144,
            dont_fragment: true,
            ttl: 64,
            src: Ipv4Addr::new(192, 168, 0, 7),
            dst: Ipv4Addr::new(192, 168, 0, 7),
        }),
        src_port: 49152,
        dst_port: 4791,
        udp_checksum: true,
        packet,
    };
    // Scapy's IP and UDP checksums (0xb4d5, 0xaca2) included.
    assert_eq!(f.encode().unwrap(), frame);
}

#[test]
fn scapy_uc_send_decodes() {
    let frame = hex(UC_SEND_ONLY);
    let f = Frame::decode(&frame).unwrap();
    assert_eq!(f.endpoints(), uc_endpoints());
    assert_eq!(f.packet.headers.bth.pad_count, 2);
    assert_eq!(
        f.packet.headers,
        Headers::new(Bth {
            pad_count: 2,
            ..uc_headers().bth
        })
    );
    assert_eq!(f.packet.payload, &hex(UC_PAYLOAD)[..]);
    let p = Packet::decode(&frame[28..], &uc_endpoints()).unwrap();
    assert_eq!(p, f.packet);
}

#[test]
fn masked_fields_do_not_change_the_icrc_and_others_do() {
    let frame = hex(UC_SEND_ONLY);
    // IPv4 TOS, TTL, header checksum; UDP checksum; BTH FECN/BECN/Resv6.
    for (i, v) in [
        (1, 0xb8),
        (8, 1),
        (10, 0),
        (11, 0),
        (26, 0),
        (27, 0),
        (32, 0xc0),
    ] {
        let mut f = frame.clone();
        f[i] = v;
        assert!(Frame::decode(&f).is_ok(), "byte {i} is masked");
    }
    // Every other byte before the ICRC is covered (the length fields and
    // the pad count are covered too, but changing them fails earlier).
    for i in (0..frame.len() - 4).filter(|i| ![1, 8, 10, 11, 26, 27, 32].contains(i)) {
        let mut f = frame.clone();
        f[i] ^= 0x01;
        assert!(
            Frame::decode(&f).is_err(),
            "flipping byte {i} went unnoticed"
        );
    }
    let mut f = frame.clone();
    f[16] ^= 1; // destination address
    assert!(matches!(
        Frame::decode(&f),
        Err(DecodeError::IcrcMismatch { .. })
    ));
    // The same packet received on another flow fails its ICRC.
    let other = Endpoints::V4(V4Endpoints {
        identification: 0,
        ..match uc_endpoints() {
            Endpoints::V4(e) => e,
            Endpoints::V6(_) => unreachable!(),
        }
    });
    assert!(matches!(
        Packet::decode(&frame[28..], &other),
        Err(DecodeError::IcrcMismatch { .. })
    ));
}

#[test]
fn connectx4_lx_cnp() {
    let captured = hex(CNP_CONNECTX4LX);
    let ip = &captured[14..];
    let f = Frame::decode(ip).unwrap();
    let bth = f.packet.headers.bth;
    assert_eq!(bth.opcode, Opcode::Cnp);
    assert!(bth.becn && !bth.fecn);
    assert_eq!(bth.dest_qp, 0x118);
    assert_eq!((bth.pkey, bth.psn, bth.pad_count), (0xffff, 0, 0));
    assert!(f.packet.payload.is_empty());
    assert_eq!((f.src_port, f.dst_port, f.udp_checksum), (0, 4791, false));
    let body = &ip[28..ip.len() - 4];
    assert_eq!(
        icrc::icrc_over_headers(&ip[..28], body).unwrap(),
        0x2a00_fd82
    );
    assert_eq!(icrc::icrc(&f.endpoints(), body).unwrap(), 0x2a00_fd82);
    // Re-encoding gives the captured bytes back, checksums included.
    assert_eq!(f.encode().unwrap(), ip);
}
