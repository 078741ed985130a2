//! Property tests: every opcode with random fields round-trips through
//! encode and decode (as a UDP payload and as an IPv4/IPv6 frame), and no
//! byte string makes a decoder panic.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use proptest::prelude::*;
use roce::{
    Aeth, AtomicAckEth, AtomicEth, Bth, DecodeError, Deth, Endpoints, Frame, Headers, Ieth, ImmDt,
    IpHeader, Ipv4Header, Ipv6Header, NakCode, Opcode, Packet, Reth, Syndrome, V4Endpoints,
    V6Endpoints,
};

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        proptest::sample::select(vec![
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ])
        .prop_map(Syndrome::Nak),
    ]
}

prop_compose! {
    fn bth(op: Opcode)(
        flags in any::<[bool; 5]>(),
        pkey in any::<u16>(),
        resv6 in 0u8..64,
        dest_qp in 0u32..1 << 24,
        resv7 in 0u8..128,
        psn in 0u32..1 << 24,
    ) -> Bth {
        Bth {
            opcode: op,
            solicited: flags[0],
            mig_req: flags[1],
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: flags[2],
            becn: flags[3],
            resv6,
            dest_qp,
            ack_req: flags[4],
            resv7,
            psn,
        }
    }
}

prop_compose! {
    fn headers_for(op: Opcode)(
        bth in bth(op),
        reth in any::<(u64, u32, u32)>(),
        atomic in any::<(u64, u32, u64, u64)>(),
        syndrome in syndrome(),
        msn in 0u32..1 << 24,
        original in any::<u64>(),
        qkey in any::<u32>(),
        src_qp in 0u32..1 << 24,
        imm in any::<u32>(),
        rkey in any::<u32>(),
    ) -> Headers {
        let l = op.layout();
        Headers {
            bth,
            deth: l.deth.then_some(Deth { qkey, src_qp }),
            reth: l.reth.then_some(Reth { va: reth.0, rkey: reth.1, dma_len: reth.2 }),
            atomic_eth: l.atomic_eth.then_some(AtomicEth {
                va: atomic.0,
                rkey: atomic.1,
                swap_add: atomic.2,
                compare: atomic.3,
            }),
            aeth: l.aeth.then_some(Aeth { syndrome, msn }),
            atomic_ack_eth: l.atomic_ack_eth.then_some(AtomicAckEth { original }),
            imm: l.imm.then_some(ImmDt { value: imm }),
            ieth: l.ieth.then_some(Ieth { rkey }),
        }
    }
}

fn packet_parts() -> impl Strategy<Value = (Headers, Vec<u8>)> {
    opcode().prop_flat_map(|op| {
        let payload = if op.layout().payload {
            proptest::collection::vec(any::<u8>(), 0..300).boxed()
        } else {
            Just(Vec::new()).boxed()
        };
        (headers_for(op), payload)
    })
}

fn ip_header() -> impl Strategy<Value = IpHeader> {
    prop_oneof![
        (
            any::<(u8, u16, bool, u8)>(),
            any::<[u8; 4]>(),
            any::<[u8; 4]>()
        )
            .prop_map(
                |((tos, identification, dont_fragment, ttl), s, d)| IpHeader::V4(Ipv4Header {
                    tos,
                    identification,
                    dont_fragment,
                    ttl,
                    src: Ipv4Addr::from(s),
                    dst: Ipv4Addr::from(d),
                })
            ),
        (
            any::<(u8, u8)>(),
            0u32..1 << 20,
            any::<[u8; 16]>(),
            any::<[u8; 16]>()
        )
            .prop_map(
                |((traffic_class, hop_limit), flow_label, s, d)| IpHeader::V6(Ipv6Header {
                    traffic_class,
                    flow_label,
                    hop_limit,
                    src: Ipv6Addr::from(s),
                    dst: Ipv6Addr::from(d),
                })
            ),
    ]
}

fn endpoints() -> impl Strategy<Value = Endpoints> {
    prop_oneof![
        (any::<([u8; 4], [u8; 4], u16, u16, u16, bool)>()).prop_map(|(s, d, sp, dp, id, df)| {
            Endpoints::V4(V4Endpoints {
                src: SocketAddrV4::new(s.into(), sp),
                dst: SocketAddrV4::new(d.into(), dp),
                identification: id,
                dont_fragment: df,
            })
        }),
        (any::<([u8; 16], [u8; 16], u16, u16)>()).prop_map(|(s, d, sp, dp)| {
            Endpoints::V6(V6Endpoints {
                src: SocketAddrV6::new(s.into(), sp, 0, 0),
                dst: SocketAddrV6::new(d.into(), dp, 0, 0),
            })
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_opcode_round_trips((headers, payload) in packet_parts(), ep in endpoints()) {
        let p = Packet::new(headers, &payload);
        let bytes = p.encode(&ep).unwrap();
        prop_assert_eq!(bytes.len(), p.encoded_len());
        prop_assert_eq!(bytes.len() % 4, 0);
        // Appended to a buffer already holding bytes: the same packet.
        let mut appended = vec![0xa5; 7];
        prop_assert_eq!(p.encode_append(&ep, &mut appended).unwrap(), bytes.len());
        prop_assert_eq!(&appended[..7], &[0xa5; 7][..]);
        prop_assert_eq!(&appended[7..], &bytes[..]);
        // The payload written by a filler (read from memory straight into
        // the buffer): the same packet; a filler that fails or writes
        // another length leaves the buffer as it was.
        let mut filled = vec![0x5a; 3];
        let n = roce::encode_append_filled(headers, payload.len(), &ep, &mut filled, |o: &mut Vec<u8>| {
            o.extend_from_slice(&payload);
            Ok::<_, roce::EncodeError>(())
        });
        prop_assert_eq!(n.unwrap(), bytes.len());
        prop_assert_eq!(&filled[3..], &bytes[..]);
        let before = filled.clone();
        let failed = roce::encode_append_filled(headers, payload.len(), &ep, &mut filled, |o: &mut Vec<u8>| {
            o.extend_from_slice(&payload[..payload.len() / 2]);
            Err(FillFailed)
        });
        prop_assert!(matches!(failed, Err(FillFailed)));
        prop_assert_eq!(&filled, &before);
        let short = roce::encode_append_filled(headers, payload.len() + 1, &ep, &mut filled, |o: &mut Vec<u8>| {
            o.extend_from_slice(&payload);
            Ok::<_, roce::EncodeError>(())
        });
        prop_assert!(short.is_err());
        prop_assert_eq!(&filled, &before);
        let back = Packet::decode(&bytes, &ep).unwrap();
        let mut expected = headers;
        expected.bth.pad_count = p.pad_count();
        prop_assert_eq!(back.headers, expected);
        prop_assert_eq!(back.payload, &payload[..]);
        // Any one bit flipped is caught, by a parse check or by the ICRC,
        // unless it falls in the BTH byte the ICRC masks (byte 4).
        let flip_at = bytes.len() / 2;
        let mut bad = bytes.clone();
        bad[flip_at] ^= 0x10;
        if flip_at != 4 {
            prop_assert!(Packet::decode(&bad, &ep).is_err());
        }
    }

    #[test]
    fn frames_round_trip(
        (headers, payload) in packet_parts(),
        ip in ip_header(),
        ports in any::<(u16, u16)>(),
        udp_checksum in any::<bool>(),
    ) {
        let p = Packet::new(headers, &payload);
        let f = Frame { ip, src_port: ports.0, dst_port: ports.1, udp_checksum, packet: p };
        let bytes = f.encode().unwrap();
        let back = Frame::decode(&bytes).unwrap();
        prop_assert_eq!(back.ip, ip);
        prop_assert_eq!((back.src_port, back.dst_port), ports);
        prop_assert_eq!(back.packet.payload, &payload[..]);
        prop_assert_eq!(back.packet.headers.bth.psn, headers.bth.psn);
        // A frame's UDP payload decodes alone against the frame's flow.
        let ip_len = bytes.len() - p.encoded_len();
        let alone = Packet::decode(&bytes[ip_len..], &f.endpoints()).unwrap();
        prop_assert_eq!(alone, back.packet);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        roce::fuzzing::roce_codec(&data);
    }

    #[test]
    fn mutated_packets_never_panic(
        (headers, payload) in packet_parts(),
        ep in endpoints(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut bytes = Packet::new(headers, &payload).encode(&ep).unwrap();
        for (at, v) in edits {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        let cut = cut % (bytes.len() + 1);
        roce::fuzzing::roce_codec(&bytes[..cut]);
        roce::fuzzing::roce_codec(&bytes);
        let _ = Packet::decode(&bytes[..cut], &ep);
    }
}

#[test]
fn pad_and_payload_rules() {
    let ep = Endpoints::new(
        "10.0.0.1:49152".parse().unwrap(),
        "10.0.0.2:4791".parse().unwrap(),
    )
    .unwrap();
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnly, 5, 9));
    h.bth.pad_count = 3; // ignored: encode computes it
    for (len, pad) in [(0, 0), (1, 3), (2, 2), (3, 1), (4, 0), (5, 3)] {
        let payload = vec![0xab; len];
        let bytes = Packet::new(h, &payload).encode(&ep).unwrap();
        assert_eq!((bytes[1] >> 4) & 3, pad, "payload {len}");
        assert_eq!(Packet::decode(&bytes, &ep).unwrap().payload, &payload[..]);
    }

    // A pad count larger than what follows the headers.
    let bytes = Packet::new(h, &[]).encode(&ep).unwrap();
    let mut bad = bytes.clone();
    bad[1] |= 0x20;
    assert_eq!(
        Packet::decode_without_icrc(&bad),
        Err(DecodeError::PadTooLarge {
            pad: 2,
            available: 0
        })
    );
    // A length that is not a multiple of 4.
    let mut odd = Packet::new(h, &[1, 2, 3, 4]).encode(&ep).unwrap();
    odd.pop();
    assert!(matches!(
        Packet::decode_without_icrc(&odd),
        Err(DecodeError::Misaligned { len: 19 })
    ));
    // Bytes after an ACK's AETH.
    let mut ack = Headers::new(Bth::new(Opcode::RcAck, 5, 9));
    ack.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 1,
    });
    let bytes = Packet::new(ack, &[]).encode(&ep).unwrap();
    let mut long = bytes[..bytes.len() - 4].to_vec();
    long.extend_from_slice(&[0; 8]);
    assert!(matches!(
        Packet::decode_without_icrc(&long),
        Err(DecodeError::UnexpectedPayload {
            opcode: Opcode::RcAck,
            len: 4
        })
    ));
    // Encode refuses a payload, a missing header and an extra one.
    assert!(matches!(
        Packet::new(ack, &[1]).encode(&ep),
        Err(roce::EncodeError::PayloadNotAllowed { .. })
    ));
    let mut missing = ack;
    missing.aeth = None;
    assert!(matches!(
        Packet::new(missing, &[]).encode(&ep),
        Err(roce::EncodeError::MissingHeader { header: "AETH", .. })
    ));
    // Appending refuses the same, and leaves the buffer as it was; so
    // does a packet too long for an IPv4 datagram.
    let mut out = vec![9u8; 5];
    assert!(Packet::new(ack, &[1]).encode_append(&ep, &mut out).is_err());
    assert!(Packet::new(missing, &[])
        .encode_append(&ep, &mut out)
        .is_err());
    let mut write = roce::Headers::new(Bth::new(Opcode::RcWriteOnly, 5, 9));
    write.reth = Some(Reth::default());
    let huge = vec![0u8; 70_000];
    assert!(Packet::new(write, &huge)
        .encode_append(&ep, &mut out)
        .is_err());
    assert_eq!(out, [9u8; 5]);
    let mut extra = ack;
    extra.reth = Some(Reth::default());
    assert!(matches!(
        Packet::new(extra, &[]).encode(&ep),
        Err(roce::EncodeError::UnexpectedHeader { header: "RETH", .. })
    ));
    // Truncated inside an extension header.
    let mut w = Headers::new(Bth::new(Opcode::RcWriteOnly, 1, 1));
    w.reth = Some(Reth::default());
    let bytes = Packet::new(w, &[]).encode(&ep).unwrap();
    assert!(matches!(
        Packet::decode(&bytes[..20], &ep),
        Err(DecodeError::Truncated { what: "RETH", .. })
    ));
}

#[test]
fn ipv6_masks_traffic_class_flow_label_and_hop_limit() {
    let mut h = Headers::new(Bth::new(Opcode::UdSendOnlyImm, 1, 77));
    h.deth = Some(Deth {
        qkey: 0x8001_0000,
        src_qp: 1,
    });
    h.imm = Some(ImmDt { value: 0xdead_beef });
    let payload = b"a MAD or any datagram";
    let f = Frame {
        ip: IpHeader::V6(Ipv6Header {
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        }),
        src_port: 0xc001,
        dst_port: 4791,
        udp_checksum: true,
        packet: Packet::new(h, payload),
    };
    let bytes = f.encode().unwrap();
    let mut changed = bytes.clone();
    changed[0] = 0x6a; // traffic class high nibble
    changed[1] = 0x5f; // traffic class low nibble, flow label
    changed[3] = 0x42; // flow label
    changed[7] = 1; // hop limit
    changed[46] ^= 0xff; // UDP checksum
    assert_eq!(Frame::decode(&changed).unwrap().packet, f.packet);
    let mut covered = bytes.clone();
    covered[39] ^= 1; // destination address
    assert!(matches!(
        Frame::decode(&covered),
        Err(DecodeError::IcrcMismatch { .. })
    ));
    // The flow from the socket addresses gives the same ICRC.
    let ep = Endpoints::new(
        "[fe80::1]:49153".parse().unwrap(),
        "[fe80::2]:4791".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(f.packet.encode(&ep).unwrap(), &bytes[48..]);
}

/// A filler's own error, for `encode_append_filled`.
#[derive(Debug)]
struct FillFailed;

impl From<roce::EncodeError> for FillFailed {
    fn from(_: roce::EncodeError) -> FillFailed {
        FillFailed
    }
}
