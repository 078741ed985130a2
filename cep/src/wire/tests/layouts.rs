//! Exact byte positions per message, from the IBTA tables as restated in
//! cm-wire.md.

use super::*;

// ---------------------------------------------------------------------------
// Per-message layouts
// ---------------------------------------------------------------------------

#[test]
fn req_layout() {
    let b = enc(sample_req());
    assert_eq!(&b[16..18], &[0x00, 0x10]);
    assert_eq!(data(&b, 0, 4), &[0x11, 0x22, 0x33, 0x44]);
    assert_zero(&b, 4, 4);
    assert_eq!(data(&b, 8, 8), &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        data(&b, 16, 8),
        &[0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8]
    );
    assert_zero(&b, 24, 4);
    assert_eq!(data(&b, 28, 4), &[0xDE, 0xAD, 0xBE, 0xEF]);
    assert_eq!(data(&b, 32, 4), &[0xAB, 0xCD, 0xEF, 0x12]);
    assert_eq!(data(&b, 36, 4), &[0x12, 0x34, 0x56, 0x34]);
    assert_eq!(data(&b, 40, 3), &[0x65, 0x43, 0x21]);
    // RemoteCMResponseTimeout 10110 | TransportServiceType 01 | EndToEndFlowControl 1
    assert_eq!(byte(&b, 43), 0b10110_01_1);
    assert_eq!(data(&b, 44, 3), &[0x0F, 0x1E, 0x2D]);
    // LocalCMResponseTimeout 01101 | RetryCount 101
    assert_eq!(byte(&b, 47), 0b01101_101);
    assert_eq!(data(&b, 48, 2), &[0xFF, 0xFF]);
    // PathMTU 0101 | RDCExists 1 | RNRRetryCount 110
    assert_eq!(byte(&b, 50), 0b0101_1_110);
    // MaxCMRetries 1001 | SRQ 1 | ExtendedTransportType 010
    assert_eq!(byte(&b, 51), 0b1001_1_010);
    // Primary path.
    assert_eq!(data(&b, 52, 4), &[0x01, 0x02, 0x03, 0x04]);
    assert_eq!(data(&b, 56, 16), &seq::<16>(0x10));
    assert_eq!(data(&b, 72, 16), &seq::<16>(0x20));
    // FlowLabel in the top 20 bits; low nibble of byte 90 and top 2 bits of 91 reserved.
    assert_eq!(data(&b, 88, 4), &[0xAB, 0xCD, 0xE0, 0b00_101010]);
    assert_eq!(byte(&b, 92), 0x5A);
    assert_eq!(byte(&b, 93), 0x40);
    assert_eq!(byte(&b, 94), 0b1011_1_000);
    assert_eq!(byte(&b, 95), 0b10011_000);
    // Alternate path.
    assert_eq!(data(&b, 96, 4), &[0x05, 0x06, 0x07, 0x08]);
    assert_eq!(data(&b, 100, 16), &seq::<16>(0x30));
    assert_eq!(data(&b, 116, 16), &seq::<16>(0x40));
    assert_eq!(data(&b, 132, 4), &[0x12, 0x34, 0x50, 0x3F]);
    assert_eq!(byte(&b, 136), 0x11);
    assert_eq!(byte(&b, 137), 0xFF);
    assert_eq!(byte(&b, 138), 0b1111_0_000);
    // AlternateLocalACKTimeout 00001 | SAPSupported 1 | reserved 00
    assert_eq!(byte(&b, 139), 0b00001_1_00);
    assert_eq!(data(&b, 140, 5), b"hello");
    assert_zero(&b, 145, DATA_LEN - 145);
}

#[test]
fn req_transport_variants_and_xrc() {
    for (t, code) in [
        (TransportType::Rc, 0u8),
        (TransportType::Uc, 1),
        (TransportType::Extended, 3),
    ] {
        let req = Req {
            transport_service_type: t,
            extended_transport_type: 1,
            ..Req::default()
        };
        let b = enc(req);
        assert_eq!((byte(&b, 43) >> 1) & 0b11, code);
        assert_eq!(byte(&b, 51), 0b0000_0_001);
        assert_eq!(req.is_xrc(), t == TransportType::Extended);
    }
}

#[test]
fn mra_layout() {
    let m = Mra {
        local_comm_id: 0xCAFE_BABE,
        remote_comm_id: 0x0BAD_F00D,
        message_mraed: MessageMraed::Lap,
        service_timeout: 0b10101,
        private_data: PrivateData::new(&[0xEE; 222]).unwrap(),
    };
    let b = enc(m);
    assert_eq!(&b[16..18], &[0x00, 0x11]);
    assert_eq!(
        data(&b, 0, 8),
        &[0xCA, 0xFE, 0xBA, 0xBE, 0x0B, 0xAD, 0xF0, 0x0D]
    );
    assert_eq!(byte(&b, 8), 0b10_000000);
    assert_eq!(byte(&b, 9), 0b10101_000);
    assert!(data(&b, 10, 222).iter().all(|&x| x == 0xEE));
    for (kind, code) in [(MessageMraed::Req, 0u8), (MessageMraed::Rep, 1)] {
        let b = enc(Mra {
            message_mraed: kind,
            ..m
        });
        assert_eq!(byte(&b, 8), code << 6);
    }
}

#[test]
fn rej_layout() {
    let mut ari = [0u8; INFO_LEN];
    ari[0] = 0x99;
    ari[71] = 0x77;
    let r = Rej {
        local_comm_id: 1,
        remote_comm_id: 2,
        message_rejected: MessageRejected::Rep,
        rejected_info_length: 72,
        reason: RejectReason::InvalidAlternateFlowLabel,
        ari,
        private_data: PrivateData::new(&[1, 2, 3]).unwrap(),
    };
    let b = enc(r);
    assert_eq!(&b[16..18], &[0x00, 0x12]);
    assert_eq!(data(&b, 0, 8), &[0, 0, 0, 1, 0, 0, 0, 2]);
    assert_eq!(byte(&b, 8), 0b01_000000);
    assert_eq!(byte(&b, 9), 72 << 1);
    assert_eq!(data(&b, 10, 2), &[0x00, 33]);
    assert_eq!(data(&b, 12, 72), &ari);
    assert_eq!(data(&b, 84, 3), &[1, 2, 3]);
    assert_zero(&b, 87, DATA_LEN - 87);
    assert_eq!(r.ari_bytes(), &ari[..]);
    let other = enc(Rej {
        message_rejected: MessageRejected::Other,
        rejected_info_length: 0x7F,
        reason: RejectReason::Other(0xFFFF),
        ..r
    });
    assert_eq!(byte(&other, 8), 0b10_000000);
    assert_eq!(byte(&other, 9), 0xFE);
    assert_eq!(data(&other, 10, 2), &[0xFF, 0xFF]);
    // A length beyond the area is kept verbatim but the accessor clamps it.
    let clamped = Rej {
        rejected_info_length: 100,
        ..r
    };
    assert_eq!(clamped.ari_bytes().len(), INFO_LEN);
    let short = Rej {
        rejected_info_length: 2,
        ..r
    };
    assert_eq!(short.ari_bytes(), &[0x99, 0]);
}

#[test]
fn reject_reasons_all_codes() {
    for code in 0u16..=40 {
        let reason = RejectReason::from_code(code);
        assert_eq!(reason.code(), code);
        assert!(reason.is_canonical());
        let named = (1..=33).contains(&code);
        assert_eq!(!matches!(reason, RejectReason::Other(_)), named, "{code}");
        let b = enc(Rej {
            reason,
            ..Rej::default()
        });
        assert_eq!(data(&b, 10, 2), &code.to_be_bytes());
    }
    assert_eq!(RejectReason::from_code(28), RejectReason::ConsumerReject);
    assert_eq!(RejectReason::from_code(12), RejectReason::InvalidPrimaryGid);
    assert_eq!(
        RejectReason::from_code(23),
        RejectReason::InvalidAlternatePacketRate
    );
    assert_eq!(
        RejectReason::from_code(31),
        RejectReason::InvalidClassVersion
    );
}

#[test]
fn rej_with_unknown_reason_decodes() {
    let mut body = [0u8; DATA_LEN];
    body[10] = 0x12;
    body[11] = 0x34;
    let m = decode(&raw_mad(attr::REJ, &body)).unwrap();
    match m.message {
        CmMessage::Rej(r) => assert_eq!(r.reason, RejectReason::Other(0x1234)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rep_layout() {
    let b = enc(sample_rep());
    assert_eq!(&b[16..18], &[0x00, 0x13]);
    assert_eq!(
        data(&b, 0, 12),
        &[1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x11, 0x11, 0x11]
    );
    assert_eq!(data(&b, 12, 4), &[0xFE, 0xDC, 0xBA, 0]);
    assert_eq!(data(&b, 16, 4), &[0, 0, 1, 0]);
    assert_eq!(data(&b, 20, 4), &[0xAB, 0xCD, 0xEF, 0]);
    assert_eq!(data(&b, 24, 2), &[4, 8]);
    // TargetACKDelay 11111 | FailoverAccepted 10 | EndToEndFlowControl 1
    assert_eq!(byte(&b, 26), 0b11111_10_1);
    // RNRRetryCount 011 | SRQ 1 | reserved 0000
    assert_eq!(byte(&b, 27), 0b011_1_0000);
    assert_eq!(
        data(&b, 28, 8),
        &[0x00, 0x02, 0xC9, 0x03, 0x00, 0x00, 0x12, 0x34]
    );
    assert!(data(&b, 36, 196).iter().all(|&x| x == 0x5A));

    let b = enc(Rep {
        target_ack_delay: 0b00001,
        failover_accepted: FailoverAccepted::NotSupported,
        end_to_end_flow_control: false,
        rnr_retry_count: 0b111,
        srq: false,
        ..sample_rep()
    });
    assert_eq!(byte(&b, 26), 0b00001_01_0);
    assert_eq!(byte(&b, 27), 0b111_0_0000);
}

#[test]
fn rtu_drep_layout() {
    let pd = PrivateData::new(&seq::<224>(7)).unwrap();
    let b = enc(Rtu {
        local_comm_id: 0xAABB_CCDD,
        remote_comm_id: 0x1122_3344,
        private_data: pd,
    });
    assert_eq!(&b[16..18], &[0x00, 0x14]);
    assert_eq!(
        data(&b, 0, 8),
        &[0xAA, 0xBB, 0xCC, 0xDD, 0x11, 0x22, 0x33, 0x44]
    );
    assert_eq!(data(&b, 8, 224), pd.as_bytes());

    let b = enc(Drep {
        local_comm_id: 0xAABB_CCDD,
        remote_comm_id: 0x1122_3344,
        private_data: pd,
    });
    assert_eq!(&b[16..18], &[0x00, 0x16]);
    assert_eq!(
        data(&b, 0, 8),
        &[0xAA, 0xBB, 0xCC, 0xDD, 0x11, 0x22, 0x33, 0x44]
    );
    assert_eq!(data(&b, 8, 224), pd.as_bytes());
}

#[test]
fn dreq_layout() {
    let b = enc(Dreq {
        local_comm_id: 9,
        remote_comm_id: 10,
        remote_qpn_eecn: 0x00_ABCD,
        private_data: PrivateData::new(&[0xFF; 220]).unwrap(),
    });
    assert_eq!(&b[16..18], &[0x00, 0x15]);
    assert_eq!(data(&b, 0, 8), &[0, 0, 0, 9, 0, 0, 0, 10]);
    assert_eq!(data(&b, 8, 4), &[0x00, 0xAB, 0xCD, 0x00]);
    assert!(data(&b, 12, 220).iter().all(|&x| x == 0xFF));
}

#[test]
fn sidr_req_layout() {
    let b = enc(SidrReq {
        request_id: 0xFEED_FACE,
        pkey: 0x8001,
        service_id: 0x1000_0000_0001_0002,
        private_data: PrivateData::new(b"sidr").unwrap(),
    });
    assert_eq!(&b[16..18], &[0x00, 0x17]);
    assert_eq!(data(&b, 0, 4), &[0xFE, 0xED, 0xFA, 0xCE]);
    assert_eq!(data(&b, 4, 4), &[0x80, 0x01, 0, 0]);
    assert_eq!(data(&b, 8, 8), &[0x10, 0, 0, 0, 0, 1, 0, 2]);
    assert_eq!(data(&b, 16, 4), b"sidr");
    assert_zero(&b, 20, DATA_LEN - 20);
}

#[test]
fn sidr_rep_layout() {
    let info = seq::<INFO_LEN>(0x80);
    let m = SidrRep {
        request_id: 0xFEED_FACE,
        status: SidrStatus::Redirect,
        additional_info_length: 9,
        qpn: 0x00_0102,
        service_id: 0x0A0B_0C0D_0E0F_1011,
        qkey: 0x8001_0000,
        additional_info: info,
        private_data: PrivateData::new(&[0x33; 136]).unwrap(),
    };
    let b = enc(m);
    assert_eq!(&b[16..18], &[0x00, 0x18]);
    assert_eq!(data(&b, 0, 4), &[0xFE, 0xED, 0xFA, 0xCE]);
    assert_eq!(data(&b, 4, 4), &[4, 9, 0, 0]);
    assert_eq!(data(&b, 8, 4), &[0x00, 0x01, 0x02, 0x00]);
    assert_eq!(
        data(&b, 12, 8),
        &[0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]
    );
    assert_eq!(data(&b, 20, 4), &[0x80, 0x01, 0x00, 0x00]);
    assert_eq!(data(&b, 24, 72), &info);
    assert!(data(&b, 96, 136).iter().all(|&x| x == 0x33));
    assert_eq!(m.additional_info_bytes(), &info[..9]);
    for code in 0u8..=5 {
        let status = SidrStatus::from_code(code);
        assert!(!matches!(status, SidrStatus::Other(_)));
        let b = enc(SidrRep { status, ..m });
        assert_eq!(byte(&b, 4), code);
    }
    assert_eq!(SidrStatus::from_code(6), SidrStatus::Other(6));
    let b = enc(SidrRep {
        status: SidrStatus::Other(0xEE),
        ..m
    });
    assert_eq!(byte(&b, 4), 0xEE);
}

#[test]
fn lap_layout() {
    let b = enc(sample_lap());
    assert_eq!(&b[16..18], &[0x00, 0x19]);
    assert_eq!(
        data(&b, 0, 8),
        &[0x0A, 0x0A, 0x0A, 0x0A, 0x0B, 0x0B, 0x0B, 0x0B]
    );
    assert_zero(&b, 8, 4);
    assert_eq!(data(&b, 12, 3), &[0x12, 0x34, 0x56]);
    // RemoteCMResponseTimeout 11000 | reserved 000
    assert_eq!(byte(&b, 15), 0b11000_000);
    assert_zero(&b, 16, 4);
    assert_eq!(data(&b, 20, 4), &[0x0A, 0x0B, 0x0C, 0x0D]);
    assert_eq!(data(&b, 24, 16), &seq::<16>(0x50));
    assert_eq!(data(&b, 40, 16), &seq::<16>(0x60));
    // FlowLabel (20 bits) | reserved nibble | TrafficClass
    assert_eq!(data(&b, 56, 4), &[0xFF, 0xFF, 0xF0, 0x77]);
    assert_eq!(byte(&b, 60), 0x08);
    assert_eq!(byte(&b, 61), 0b00_000111);
    assert_eq!(byte(&b, 62), 0b0001_1_000);
    assert_eq!(byte(&b, 63), 0b11111_000);
    assert!(data(&b, 64, 168).iter().all(|&x| x == 0xAB));
}

#[test]
fn apr_layout() {
    let info = seq::<INFO_LEN>(1);
    let m = Apr {
        local_comm_id: 0x0102_0304,
        remote_comm_id: 0x0506_0708,
        additional_info_length: 5,
        ap_status: ApStatus::IsCurrent,
        additional_info: info,
        private_data: PrivateData::new(&[0xC3; 148]).unwrap(),
    };
    let b = enc(m);
    assert_eq!(&b[16..18], &[0x00, 0x1A]);
    assert_eq!(data(&b, 0, 8), &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(data(&b, 8, 4), &[5, 5, 0, 0]);
    assert_eq!(data(&b, 12, 72), &info);
    assert!(data(&b, 84, 148).iter().all(|&x| x == 0xC3));
    assert_eq!(m.additional_info_bytes(), &[1, 2, 3, 4, 5]);
    for code in 0u8..=13 {
        let ap_status = ApStatus::from_code(code);
        assert!(!matches!(ap_status, ApStatus::Other(_)));
        let b = enc(Apr { ap_status, ..m });
        assert_eq!(byte(&b, 9), code);
    }
    assert_eq!(ApStatus::from_code(14), ApStatus::Other(14));
    assert_eq!(ApStatus::from_code(0), ApStatus::Success);
}
