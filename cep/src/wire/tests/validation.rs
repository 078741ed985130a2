//! Every error path of decode and encode: lengths, header fields,
//! attributes, reserved values and bits, widths, private data, canonical
//! codes, and the error type.

use super::*;

// ---------------------------------------------------------------------------
// Validation errors
// ---------------------------------------------------------------------------

#[test]
fn bad_length() {
    let good = enc(Rtu::default());
    for len in [0usize, 1, 23, 24, 255] {
        assert_eq!(decode(&good[..len]), Err(WireError::BadLength { got: len }));
    }
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(decode(&long), Err(WireError::BadLength { got: 257 }));
    assert_eq!(
        decode(&[0u8; 4096]),
        Err(WireError::BadLength { got: 4096 })
    );
}

#[test]
fn bad_header_fields() {
    let good = enc(Rtu::default());
    let with = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        decode(&b)
    };
    assert_eq!(with(0, 2), Err(WireError::BadBaseVersion(2)));
    assert_eq!(with(0, 0), Err(WireError::BadBaseVersion(0)));
    assert_eq!(with(1, 0x03), Err(WireError::BadClass(0x03)));
    assert_eq!(with(1, 0x87), Err(WireError::BadClass(0x87)));
    assert_eq!(with(2, 1), Err(WireError::BadClassVersion(1)));
    assert_eq!(with(2, 3), Err(WireError::BadClassVersion(3)));
    assert_eq!(with(3, 0x83), Err(WireError::BadMethod(0x83)), "R bit set");
    assert_eq!(with(3, 0x01), Err(WireError::BadMethod(0x01)), "Get");
    assert_eq!(with(3, 0x81), Err(WireError::BadMethod(0x81)), "GetResp");
    // The first bad field in wire order wins.
    let mut b = good;
    b[0] = 9;
    b[1] = 9;
    assert_eq!(decode(&b), Err(WireError::BadBaseVersion(9)));
}

#[test]
fn unknown_attributes() {
    for a in [0x0000u16, 0x0001, 0x000F, 0x001B, 0x0020, 0xFFFF, 0x1000] {
        assert_eq!(
            decode(&raw_mad(a, &[])),
            Err(WireError::UnknownAttribute(a))
        );
        assert!(defined_bits_mask(a).is_none());
    }
}

#[test]
fn reserved_enum_values() {
    // REQ TransportServiceType = 2 (byte 43 bits 5..6).
    let mut body = [0u8; DATA_LEN];
    body[43] = 0b00000_10_0;
    assert_eq!(
        decode(&raw_mad(attr::REQ, &body)),
        Err(WireError::Reserved {
            field: "REQ TransportServiceType",
            value: 2
        })
    );
    // MRA MessageMRAed = 3.
    let mut body = [0u8; DATA_LEN];
    body[8] = 0b11_000000;
    assert_eq!(
        decode(&raw_mad(attr::MRA, &body)),
        Err(WireError::Reserved {
            field: "MRA MessageMRAed",
            value: 3
        })
    );
    // REJ MessageRejected = 3.
    let mut body = [0u8; DATA_LEN];
    body[8] = 0b11_000000;
    assert_eq!(
        decode(&raw_mad(attr::REJ, &body)),
        Err(WireError::Reserved {
            field: "REJ MessageRejected",
            value: 3
        })
    );
    // REP FailoverAccepted = 3.
    let mut body = [0u8; DATA_LEN];
    body[26] = 0b00000_11_0;
    assert_eq!(
        decode(&raw_mad(attr::REP, &body)),
        Err(WireError::Reserved {
            field: "REP FailoverAccepted",
            value: 3
        })
    );
    // The low 6 bits next to MessageMRAed/Rejected are reserved, not part of it.
    let mut body = [0u8; DATA_LEN];
    body[8] = 0b10_111111;
    assert!(decode(&raw_mad(attr::MRA, &body)).is_ok());
    assert!(decode(&raw_mad(attr::REJ, &body)).is_ok());
}

#[test]
fn reserved_bits_are_ignored_on_decode_and_zeroed_on_encode() {
    for a in attr::ALL {
        let mask = defined_bits_mask(a).unwrap();
        // All defined bits zero, all reserved bits one: must decode (no
        // enum can be reserved at zero) to the default message.
        let mut b = [0u8; MAD_LEN];
        b[..HEADER_LEN].copy_from_slice(&MadHeader::cm_send(a, TID, 0).encode());
        for (x, m) in b.iter_mut().zip(mask).skip(HEADER_LEN) {
            *x |= !m;
        }
        let m = decode(&b).unwrap();
        let again = encode(&m).unwrap();
        assert!(again[HEADER_LEN..].iter().all(|&x| x == 0), "{a:#x}");
    }
}

#[test]
fn wide_fields_are_rejected_on_encode() {
    fn oor(m: impl Into<CmMessage>, field: &'static str, value: u64) {
        let mad = CmMad::new(0, m);
        assert_eq!(
            encode(&mad),
            Err(WireError::FieldOutOfRange { field, value }),
            "{field}"
        );
    }
    let r = Req::default();
    let p = PathInfo::default();
    let q24 = 1u32 << 24;
    oor(
        Req {
            local_qpn: q24,
            ..r
        },
        "REQ LocalQPN",
        1 << 24,
    );
    oor(
        Req {
            local_qpn: u32::MAX,
            ..r
        },
        "REQ LocalQPN",
        u32::MAX.into(),
    );
    oor(
        Req {
            local_eecn: q24,
            ..r
        },
        "REQ LocalEECN",
        1 << 24,
    );
    oor(
        Req {
            remote_eecn: q24,
            ..r
        },
        "REQ RemoteEECN",
        1 << 24,
    );
    oor(
        Req {
            starting_psn: q24,
            ..r
        },
        "REQ StartingPSN",
        1 << 24,
    );
    oor(
        Req {
            remote_cm_response_timeout: 32,
            ..r
        },
        "REQ RemoteCMResponseTimeout",
        32,
    );
    oor(
        Req {
            local_cm_response_timeout: 32,
            ..r
        },
        "REQ LocalCMResponseTimeout",
        32,
    );
    oor(
        Req {
            retry_count: 8,
            ..r
        },
        "REQ RetryCount",
        8,
    );
    oor(Req { path_mtu: 16, ..r }, "REQ PathPacketPayloadMTU", 16);
    oor(
        Req {
            rnr_retry_count: 8,
            ..r
        },
        "REQ RNRRetryCount",
        8,
    );
    oor(
        Req {
            max_cm_retries: 16,
            ..r
        },
        "REQ MaxCMRetries",
        16,
    );
    oor(
        Req {
            extended_transport_type: 8,
            ..r
        },
        "REQ ExtendedTransportType",
        8,
    );
    oor(
        Req {
            primary_path: PathInfo {
                flow_label: 1 << 20,
                ..p
            },
            ..r
        },
        "REQ PrimaryFlowLabel",
        1 << 20,
    );
    oor(
        Req {
            primary_path: PathInfo {
                packet_rate: 64,
                ..p
            },
            ..r
        },
        "REQ PrimaryPacketRate",
        64,
    );
    oor(
        Req {
            primary_path: PathInfo { sl: 16, ..p },
            ..r
        },
        "REQ PrimarySL",
        16,
    );
    oor(
        Req {
            primary_path: PathInfo {
                local_ack_timeout: 32,
                ..p
            },
            ..r
        },
        "REQ PrimaryLocalACKTimeout",
        32,
    );
    oor(
        Req {
            alternate_path: PathInfo {
                flow_label: u32::MAX,
                ..p
            },
            ..r
        },
        "REQ AlternateFlowLabel",
        u32::MAX.into(),
    );
    oor(
        Req {
            alternate_path: PathInfo {
                local_ack_timeout: 255,
                ..p
            },
            ..r
        },
        "REQ AlternateLocalACKTimeout",
        255,
    );
    oor(
        Mra {
            service_timeout: 32,
            ..Mra::default()
        },
        "MRA ServiceTimeout",
        32,
    );
    oor(
        Rej {
            rejected_info_length: 128,
            ..Rej::default()
        },
        "REJ RejectedInfoLength",
        128,
    );
    let rep = Rep::default();
    oor(
        Rep {
            local_qpn: q24,
            ..rep
        },
        "REP LocalQPN",
        1 << 24,
    );
    oor(
        Rep {
            local_eecn: q24,
            ..rep
        },
        "REP LocalEECN",
        1 << 24,
    );
    oor(
        Rep {
            starting_psn: q24,
            ..rep
        },
        "REP StartingPSN",
        1 << 24,
    );
    oor(
        Rep {
            target_ack_delay: 32,
            ..rep
        },
        "REP TargetACKDelay",
        32,
    );
    oor(
        Rep {
            rnr_retry_count: 8,
            ..rep
        },
        "REP RNRRetryCount",
        8,
    );
    oor(
        Dreq {
            remote_qpn_eecn: q24,
            ..Dreq::default()
        },
        "DREQ RemoteQPN/EECN",
        1 << 24,
    );
    oor(
        SidrRep {
            qpn: q24,
            ..SidrRep::default()
        },
        "SIDR_REP QPN",
        1 << 24,
    );
    let lap = Lap::default();
    oor(
        Lap {
            remote_qpn_eecn: q24,
            ..lap
        },
        "LAP RemoteQPN/EECN",
        1 << 24,
    );
    oor(
        Lap {
            remote_cm_response_timeout: 32,
            ..lap
        },
        "LAP RemoteCMResponseTimeout",
        32,
    );
    oor(
        Lap {
            alternate_path: PathInfo {
                flow_label: 1 << 20,
                ..p
            },
            ..lap
        },
        "LAP AlternateFlowLabel",
        1 << 20,
    );
    oor(
        Lap {
            alternate_path: PathInfo {
                packet_rate: 0x40,
                ..p
            },
            ..lap
        },
        "LAP AlternatePacketRate",
        0x40,
    );
    oor(
        Lap {
            alternate_path: PathInfo { sl: 0x10, ..p },
            ..lap
        },
        "LAP AlternateSL",
        0x10,
    );
    // The largest 24-bit values are fine.
    let max = Req {
        local_qpn: 0xFF_FFFF,
        local_eecn: 0xFF_FFFF,
        remote_eecn: 0xFF_FFFF,
        starting_psn: 0xFF_FFFF,
        ..r
    };
    let b = enc(max);
    assert_eq!(data(&b, 32, 3), &[0xFF; 3]);
}

#[test]
fn decode_masks_24_bit_fields() {
    // Neighbouring bytes set to 0xFF must not leak into the 24-bit values.
    let mut body = [0u8; DATA_LEN];
    body[32..36].copy_from_slice(&[0x01, 0x02, 0x03, 0xFF]); // QPN + ResponderResources
    body[44..48].copy_from_slice(&[0x04, 0x05, 0x06, 0xFF]); // PSN + timeout/retry
    let CmMessage::Req(r) = decode(&raw_mad(attr::REQ, &body)).unwrap().message else {
        panic!("not a REQ")
    };
    assert_eq!(r.local_qpn, 0x01_0203);
    assert_eq!(r.responder_resources, 0xFF);
    assert_eq!(r.starting_psn, 0x04_0506);
    assert_eq!(r.local_cm_response_timeout, 31);
    assert_eq!(r.retry_count, 7);

    let mut body = [0xFFu8; DATA_LEN];
    body[26] = 0; // keep FailoverAccepted valid
    let CmMessage::Rep(r) = decode(&raw_mad(attr::REP, &body)).unwrap().message else {
        panic!("not a REP")
    };
    assert_eq!(r.local_qpn, 0xFF_FFFF);
    assert_eq!(r.local_eecn, 0xFF_FFFF);
    assert_eq!(r.starting_psn, 0xFF_FFFF);
}

#[test]
fn private_data_limits() {
    fn check<const N: usize>(expected: usize) {
        assert_eq!(N, expected);
        assert_eq!(PrivateData::<N>::MAX_LEN, expected);
        let exact = PrivateData::<N>::new(&vec![0xA5; N]).unwrap();
        assert!(exact.iter().all(|&b| b == 0xA5));
        assert_eq!(
            PrivateData::<N>::new(&vec![0; N + 1]),
            Err(WireError::PrivateDataTooLong {
                max: expected,
                got: N + 1
            })
        );
        let short = PrivateData::<N>::try_from(&[1u8, 2, 3][..]).unwrap();
        assert_eq!(&short[..3], &[1, 2, 3]);
        assert!(short[3..].iter().all(|&b| b == 0), "zero-padded");
        assert_eq!(short.as_ref().len(), N);
        assert_eq!(
            PrivateData::<N>::new(&[]).unwrap(),
            PrivateData::<N>::zeroed()
        );
    }
    check::<92>(92);
    check::<222>(222);
    check::<148>(148);
    check::<196>(196);
    check::<224>(224);
    check::<220>(220);
    check::<216>(216);
    check::<136>(136);
    check::<168>(168);
    // Each message's field uses its own limit.
    let req = Req::default();
    let _: PrivateData<92> = req.private_data;
    let _: PrivateData<222> = Mra::default().private_data;
    let _: PrivateData<148> = Rej::default().private_data;
    let _: PrivateData<196> = Rep::default().private_data;
    let _: PrivateData<224> = Rtu::default().private_data;
    let _: PrivateData<220> = Dreq::default().private_data;
    let _: PrivateData<224> = Drep::default().private_data;
    let _: PrivateData<216> = SidrReq::default().private_data;
    let _: PrivateData<136> = SidrRep::default().private_data;
    let _: PrivateData<168> = Lap::default().private_data;
    let _: PrivateData<148> = Apr::default().private_data;
    // And the areas end exactly at the end of the MAD.
    let full = Req {
        private_data: PrivateData::new(&[0xFF; 92]).unwrap(),
        ..req
    };
    let b = enc(full);
    assert_eq!(byte(&b, 139), 0, "private data must not spill backwards");
    assert!(b[MAD_LEN - 92..].iter().all(|&x| x == 0xFF));
}

#[test]
fn private_data_debug_is_compact() {
    let pd = PrivateData::<92>::new(&[1, 0, 2]).unwrap();
    let s = format!("{pd:?}");
    assert!(s.contains("01, 00, 02"), "{s}");
    assert!(s.contains("89 zero bytes"), "{s}");
    let full = PrivateData::<4>::from([9, 9, 9, 9]);
    assert_eq!(format!("{full:?}"), "PrivateData<4>([09, 09, 09, 09])");
    assert_eq!(full.into_bytes(), [9; 4]);
}

#[test]
fn non_canonical_other_is_rejected_on_encode() {
    let cases: [(CmMessage, &str, u64); 4] = [
        (
            Rej {
                reason: RejectReason::Other(28),
                ..Rej::default()
            }
            .into(),
            "REJ Reason",
            28,
        ),
        (
            SidrRep {
                status: SidrStatus::Other(0),
                ..SidrRep::default()
            }
            .into(),
            "SIDR_REP Status",
            0,
        ),
        (
            Apr {
                ap_status: ApStatus::Other(13),
                ..Apr::default()
            }
            .into(),
            "APR APStatus",
            13,
        ),
        (
            Rej {
                reason: RejectReason::Other(1),
                ..Rej::default()
            }
            .into(),
            "REJ Reason",
            1,
        ),
    ];
    for (m, field, value) in cases {
        assert_eq!(
            encode(&CmMad::new(0, m)),
            Err(WireError::NonCanonical { field, value })
        );
    }
    assert!(!RejectReason::Other(1).is_canonical());
    assert!(RejectReason::Other(0).is_canonical());
    assert!(RejectReason::Other(34).is_canonical());
}

#[test]
fn error_display_and_error_trait() {
    let errors = [
        WireError::BadLength { got: 12 },
        WireError::BadBaseVersion(2),
        WireError::BadClass(0x81),
        WireError::BadClassVersion(1),
        WireError::BadMethod(0x83),
        WireError::UnknownAttribute(0x1B),
        WireError::FieldOutOfRange {
            field: "REQ LocalQPN",
            value: 1 << 24,
        },
        WireError::PrivateDataTooLong { max: 92, got: 93 },
        WireError::Reserved {
            field: "REQ TransportServiceType",
            value: 2,
        },
        WireError::NonCanonical {
            field: "REJ Reason",
            value: 28,
        },
    ];
    let expected_fragments = [
        "256",
        "BaseVersion 2",
        "0x81",
        "ClassVersion 1",
        "0x83",
        "0x001b",
        "0x1000000",
        "93",
        "reserved value 2",
        "REJ Reason",
    ];
    for (e, frag) in errors.iter().zip(expected_fragments) {
        let s = e.to_string();
        assert!(s.contains(frag), "{s:?} should mention {frag:?}");
        let dynerr: &dyn std::error::Error = e;
        assert!(dynerr.source().is_none());
    }
}
