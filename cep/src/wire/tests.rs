//! Codec tests: exact byte positions per message (from the IBTA tables as
//! restated in cm-wire.md), round trips, every error path, and a randomized
//! decode/encode check against the defined-bits mask.

// Binary literals are grouped by CM field (e.g. `0b10110_01_1` for
// timeout | transport type | flow control), not by nibble.
#![allow(clippy::unusual_byte_groupings)]

use super::bits::{Blob, Field};
use super::messages::{self, Body, PathLayout};
use super::*;

const TID: u64 = 0x0123_4567_89AB_CDEF;

fn enc(message: impl Into<CmMessage>) -> [u8; MAD_LEN] {
    let mad = CmMad {
        transaction_id: TID,
        attribute_modifier: 0,
        message: message.into(),
    };
    let bytes = encode(&mad).expect("encode");
    assert_eq!(decode(&bytes), Ok(mad), "round trip");
    bytes
}

/// `len` bytes of the data area starting at data offset `off`.
fn data(buf: &[u8; MAD_LEN], off: usize, len: usize) -> &[u8] {
    &buf[HEADER_LEN + off..HEADER_LEN + off + len]
}

fn byte(buf: &[u8; MAD_LEN], off: usize) -> u8 {
    buf[HEADER_LEN + off]
}

fn seq<const N: usize>(start: u8) -> [u8; N] {
    core::array::from_fn(|i| start.wrapping_add(i as u8))
}

fn assert_zero(buf: &[u8; MAD_LEN], off: usize, len: usize) {
    assert!(
        data(buf, off, len).iter().all(|&b| b == 0),
        "data bytes {off}..{} should be zero: {:02x?}",
        off + len,
        data(buf, off, len)
    );
}

/// A valid CM header for `attr_id` followed by `body` (padded/truncated).
fn raw_mad(attr_id: u16, body: &[u8]) -> [u8; MAD_LEN] {
    let mut buf = [0u8; MAD_LEN];
    buf[..HEADER_LEN].copy_from_slice(&MadHeader::cm_send(attr_id, TID, 0).encode());
    for (d, s) in buf[HEADER_LEN..].iter_mut().zip(body) {
        *d = *s;
    }
    buf
}

// ---------------------------------------------------------------------------
// Header
// ---------------------------------------------------------------------------

#[test]
fn header_bytes() {
    let mad = CmMad {
        transaction_id: TID,
        attribute_modifier: 0xA1B2_C3D4,
        message: CmMessage::Rtu(Rtu::default()),
    };
    let b = encode(&mad).unwrap();
    assert_eq!(&b[0..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&b[4..8], &[0, 0, 0, 0], "Status and ClassSpecific");
    assert_eq!(&b[8..16], &TID.to_be_bytes());
    assert_eq!(&b[16..18], &[0x00, 0x14]);
    assert_eq!(&b[18..20], &[0, 0]);
    assert_eq!(&b[20..24], &[0xA1, 0xB2, 0xC3, 0xD4]);
    assert_eq!(decode(&b), Ok(mad));
    assert_eq!(mad.header(), MadHeader::decode(&b).unwrap());
}

#[test]
fn header_struct_round_trip_and_short_buffer() {
    let h = MadHeader {
        base_version: 9,
        mgmt_class: 0x81,
        class_version: 7,
        method: 0x83,
        status: 0x1234,
        class_specific: 0x5678,
        transaction_id: u64::MAX - 1,
        attribute_id: 0xBEEF,
        reserved: 0x0102,
        attribute_modifier: 0xFFFF_0001,
    };
    let bytes = h.encode();
    assert_eq!(bytes[4..6], [0x12, 0x34]);
    assert_eq!(bytes[6..8], [0x56, 0x78]);
    assert_eq!(bytes[18..20], [0x01, 0x02]);
    assert_eq!(MadHeader::decode(&bytes), Ok(h));
    // A header can be parsed from a whole (even invalid) MAD, e.g. to answer it.
    let mut mad = [0u8; MAD_LEN];
    mad[..HEADER_LEN].copy_from_slice(&bytes);
    assert_eq!(MadHeader::decode(&mad), Ok(h));
    assert_eq!(h.validate_cm(), Err(WireError::BadBaseVersion(9)));
    assert_eq!(
        MadHeader::decode(&bytes[..23]),
        Err(WireError::BadLength { got: 23 })
    );
    assert_eq!(MadHeader::cm_send(attr::REQ, 1, 0).validate_cm(), Ok(()));
}

#[test]
fn status_class_specific_and_reserved_header_words_are_ignored_and_zeroed() {
    let mut b = enc(Drep::default());
    b[4..8].copy_from_slice(&[0xFF; 4]);
    b[18..20].copy_from_slice(&[0xFF; 2]);
    let m = decode(&b).unwrap();
    let again = encode(&m).unwrap();
    assert_eq!(&again[4..8], &[0; 4]);
    assert_eq!(&again[18..20], &[0; 2]);
}

// ---------------------------------------------------------------------------
// Per-message layouts
// ---------------------------------------------------------------------------

fn sample_req() -> Req {
    Req {
        local_comm_id: 0x1122_3344,
        service_id: 0x0102_0304_0506_0708,
        local_ca_guid: 0xA1A2_A3A4_A5A6_A7A8,
        local_qkey: 0xDEAD_BEEF,
        local_qpn: 0xAB_CDEF,
        responder_resources: 0x12,
        local_eecn: 0x12_3456,
        initiator_depth: 0x34,
        remote_eecn: 0x65_4321,
        remote_cm_response_timeout: 0b10110,
        transport_service_type: TransportType::Uc,
        end_to_end_flow_control: true,
        starting_psn: 0x0F_1E2D,
        local_cm_response_timeout: 0b01101,
        retry_count: 0b101,
        pkey: 0xFFFF,
        path_mtu: 5,
        rdc_exists: true,
        rnr_retry_count: 0b110,
        max_cm_retries: 0b1001,
        srq: true,
        extended_transport_type: 0b010,
        primary_path: PathInfo {
            local_lid: 0x0102,
            remote_lid: 0x0304,
            local_gid: seq(0x10),
            remote_gid: seq(0x20),
            flow_label: 0xA_BCDE,
            packet_rate: 0b10_1010,
            traffic_class: 0x5A,
            hop_limit: 0x40,
            sl: 0b1011,
            subnet_local: true,
            local_ack_timeout: 0b10011,
        },
        alternate_path: PathInfo {
            local_lid: 0x0506,
            remote_lid: 0x0708,
            local_gid: seq(0x30),
            remote_gid: seq(0x40),
            flow_label: 0x1_2345,
            packet_rate: 0x3F,
            traffic_class: 0x11,
            hop_limit: 0xFF,
            sl: 0xF,
            subnet_local: false,
            local_ack_timeout: 0b00001,
        },
        sap_supported: true,
        private_data: PrivateData::new(b"hello").unwrap(),
    }
}

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

fn sample_rep() -> Rep {
    Rep {
        local_comm_id: 0x0102_0304,
        remote_comm_id: 0x0506_0708,
        local_qkey: 0x1111_1111,
        local_qpn: 0xFE_DCBA,
        local_eecn: 0x00_0001,
        starting_psn: 0xAB_CDEF,
        responder_resources: 4,
        initiator_depth: 8,
        target_ack_delay: 0b11111,
        failover_accepted: FailoverAccepted::Rejected,
        end_to_end_flow_control: true,
        rnr_retry_count: 0b011,
        srq: true,
        local_ca_guid: 0x0002_C903_0000_1234,
        private_data: PrivateData::new(&[0x5A; 196]).unwrap(),
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

fn sample_lap() -> Lap {
    Lap {
        local_comm_id: 0x0A0A_0A0A,
        remote_comm_id: 0x0B0B_0B0B,
        remote_qpn_eecn: 0x12_3456,
        remote_cm_response_timeout: 0b11000,
        alternate_path: PathInfo {
            local_lid: 0x0A0B,
            remote_lid: 0x0C0D,
            local_gid: seq(0x50),
            remote_gid: seq(0x60),
            flow_label: 0xF_FFFF,
            packet_rate: 0b00_0111,
            traffic_class: 0x77,
            hop_limit: 0x08,
            sl: 0b0001,
            subnet_local: true,
            local_ack_timeout: 0b11111,
        },
        private_data: PrivateData::new(&[0xAB; 168]).unwrap(),
    }
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

// ---------------------------------------------------------------------------
// Round trips and defaults
// ---------------------------------------------------------------------------

fn all_samples() -> Vec<CmMessage> {
    vec![
        sample_req().into(),
        Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: MessageMraed::Rep,
            service_timeout: 31,
            private_data: PrivateData::new(b"mra").unwrap(),
        }
        .into(),
        Rej {
            reason: RejectReason::ConsumerReject,
            rejected_info_length: 3,
            ..Rej::default()
        }
        .into(),
        sample_rep().into(),
        Rtu {
            local_comm_id: u32::MAX,
            remote_comm_id: u32::MAX,
            private_data: PrivateData::new(&[0xFF; 224]).unwrap(),
        }
        .into(),
        Dreq {
            remote_qpn_eecn: 0xFF_FFFF,
            ..Dreq::default()
        }
        .into(),
        Drep::default().into(),
        SidrReq {
            service_id: u64::MAX,
            ..SidrReq::default()
        }
        .into(),
        SidrRep {
            status: SidrStatus::NoQp,
            qpn: 0xFF_FFFF,
            ..SidrRep::default()
        }
        .into(),
        sample_lap().into(),
        Apr {
            ap_status: ApStatus::Other(200),
            ..Apr::default()
        }
        .into(),
    ]
}

#[test]
fn round_trip_every_message() {
    let samples = all_samples();
    assert_eq!(samples.len(), 11);
    for (i, message) in samples.into_iter().enumerate() {
        let mad = CmMad {
            transaction_id: i as u64 * 0x1_0001,
            attribute_modifier: i as u32,
            message,
        };
        let bytes = mad.encode().unwrap();
        assert_eq!(u16::from_be_bytes([bytes[16], bytes[17]]), attr::ALL[i]);
        assert_eq!(CmMad::decode(&bytes), Ok(mad));
        // And the bytes survive a second trip untouched.
        assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
    }
}

#[test]
fn default_messages_have_all_zero_bodies() {
    let defaults: [CmMessage; 11] = [
        Req::default().into(),
        Mra::default().into(),
        Rej::default().into(),
        Rep::default().into(),
        Rtu::default().into(),
        Dreq::default().into(),
        Drep::default().into(),
        SidrReq::default().into(),
        SidrRep::default().into(),
        Lap::default().into(),
        Apr::default().into(),
    ];
    for m in defaults {
        let b = enc(m);
        assert!(
            b[HEADER_LEN..].iter().all(|&x| x == 0),
            "{}",
            m.message_kind()
        );
        // Conversely, an all-zero body decodes to the default.
        assert_eq!(decode(&raw_mad(m.attribute_id(), &[])).unwrap().message, m);
    }
}

#[test]
fn message_kind_attribute_ids_and_names() {
    let kinds = [
        "REQ", "MRA", "REJ", "REP", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP", "LAP", "APR",
    ];
    for (i, m) in all_samples().iter().enumerate() {
        assert_eq!(m.message_kind(), kinds[i]);
        assert_eq!(m.attribute_id(), attr::ALL[i]);
        assert_eq!(attr::name(attr::ALL[i]), Some(kinds[i]));
        assert_eq!(CmMad::new(1, *m).message_kind(), kinds[i]);
    }
    assert_eq!(
        attr::ALL,
        [0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A]
    );
    assert_eq!(attr::name(0x0001), None);
    assert_eq!(attr::name(0x001B), None);
}

#[test]
fn path_presence() {
    assert!(!PathInfo::default().is_present());
    assert!(sample_req().primary_path.is_present());
    let roce = PathInfo {
        local_gid: seq(1),
        ..PathInfo::default()
    };
    assert!(roce.is_present());
}

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

// ---------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------

#[test]
fn cm_timeouts() {
    assert_eq!(cm_timeout_to_nanos(0), 4_096);
    assert_eq!(cm_timeout_to_nanos(1), 8_192);
    assert_eq!(cm_timeout_to_nanos(10), 4_194_304);
    assert_eq!(cm_timeout_to_nanos(20), 4_294_967_296); // ~4.3 s
    assert_eq!(cm_timeout_to_nanos(31), 4_096u64 << 31); // ~2.4 h
    assert_eq!(cm_timeout_to_nanos(51), 1u64 << 63);
    assert_eq!(cm_timeout_to_nanos(52), u64::MAX);
    assert_eq!(cm_timeout_to_nanos(255), u64::MAX);
    for t in 0..52u8 {
        assert_eq!(
            cm_timeout_to_nanos(t + 1),
            cm_timeout_to_nanos(t).saturating_mul(2)
        );
    }
}

// ---------------------------------------------------------------------------
// Layout tables and masks
// ---------------------------------------------------------------------------

struct Table {
    attr: u16,
    fields: &'static [Field],
    blobs: &'static [Blob],
    paths: &'static [PathLayout],
}

fn table<B: Body>() -> Table {
    Table {
        attr: B::ATTR,
        fields: B::FIELDS,
        blobs: B::BLOBS,
        paths: B::PATHS,
    }
}

fn tables() -> [Table; 11] {
    [
        table::<Req>(),
        table::<messages::Mra>(),
        table::<Rej>(),
        table::<Rep>(),
        table::<Rtu>(),
        table::<Dreq>(),
        table::<Drep>(),
        table::<SidrReq>(),
        table::<SidrRep>(),
        table::<Lap>(),
        table::<Apr>(),
    ]
}

/// Bit index sets of each table entry, to check the tables for overlaps.
fn field_bits(f: Field) -> Vec<usize> {
    (0..f.width as usize)
        .map(|i| f.off * 8 + f.bit as usize + i)
        .collect()
}

fn blob_bits(b: Blob) -> Vec<usize> {
    (b.off * 8..(b.off + b.len) * 8).collect()
}

#[test]
fn layout_tables_are_in_range_and_disjoint() {
    for (i, t) in tables().iter().enumerate() {
        assert_eq!(t.attr, attr::ALL[i]);
        let mut owner = vec![None::<String>; MAD_LEN * 8];
        let mut claim = |bits: Vec<usize>, name: String| {
            for bit in bits {
                assert!((HEADER_LEN * 8..MAD_LEN * 8).contains(&bit), "{name}");
                if let Some(prev) = &owner[bit] {
                    panic!("{name} overlaps {prev} at bit {bit}");
                }
                owner[bit] = Some(name.clone());
            }
        };
        let mut fields: Vec<Field> = t.fields.to_vec();
        let mut blobs: Vec<Blob> = t.blobs.to_vec();
        for p in t.paths {
            fields.extend(p.fields());
            blobs.extend(p.blobs());
        }
        for f in fields {
            assert!(f.is_well_formed(), "{f:?}");
            claim(field_bits(f), f.name.to_string());
        }
        for b in blobs {
            assert!(b.is_well_formed(), "{b:?}");
            claim(blob_bits(b), format!("blob at {}", b.off));
        }
    }
}

fn data_mask(a: u16, off: usize) -> u8 {
    defined_bits_mask(a).unwrap()[HEADER_LEN + off]
}

#[test]
fn masks_mark_reserved_bits() {
    for a in attr::ALL {
        let m = defined_bits_mask(a).unwrap();
        assert_eq!(&m[0..4], &[0xFF; 4]);
        assert_eq!(&m[4..8], &[0; 4], "Status, ClassSpecific");
        assert_eq!(&m[8..18], &[0xFF; 10]);
        assert_eq!(&m[18..20], &[0; 2], "Reserved");
        assert_eq!(&m[20..24], &[0xFF; 4]);
        // Private data always runs to the end of the MAD.
        assert_eq!(m[MAD_LEN - 1], 0xFF);
    }
    let req = |off| data_mask(attr::REQ, off);
    for off in (4..8).chain(24..28) {
        assert_eq!(req(off), 0, "REQ byte {off}");
    }
    assert_eq!(req(43), 0xFF);
    assert_eq!(req(47), 0xFF);
    assert_eq!(req(50), 0xFF);
    assert_eq!(req(51), 0xFF);
    assert_eq!(req(90), 0xF0);
    assert_eq!(req(91), 0x3F);
    assert_eq!(req(94), 0xF8);
    assert_eq!(req(95), 0xF8);
    assert_eq!(req(134), 0xF0);
    assert_eq!(req(135), 0x3F);
    assert_eq!(req(138), 0xF8);
    assert_eq!(req(139), 0xFC);
    assert_eq!(req(140), 0xFF);

    assert_eq!(data_mask(attr::MRA, 8), 0xC0);
    assert_eq!(data_mask(attr::MRA, 9), 0xF8);
    assert_eq!(data_mask(attr::REJ, 8), 0xC0);
    assert_eq!(data_mask(attr::REJ, 9), 0xFE);
    for off in [15, 19, 23] {
        assert_eq!(data_mask(attr::REP, off), 0, "REP byte {off}");
    }
    assert_eq!(data_mask(attr::REP, 26), 0xFF);
    assert_eq!(data_mask(attr::REP, 27), 0xF0);
    assert_eq!(data_mask(attr::DREQ, 11), 0);
    for off in (8..12).chain(16..20) {
        assert_eq!(data_mask(attr::LAP, off), 0, "LAP byte {off}");
    }
    assert_eq!(data_mask(attr::LAP, 15), 0xF8);
    assert_eq!(data_mask(attr::LAP, 58), 0xF0);
    assert_eq!(data_mask(attr::LAP, 61), 0x3F);
    assert_eq!(data_mask(attr::LAP, 62), 0xF8);
    assert_eq!(data_mask(attr::LAP, 63), 0xF8);
    assert_eq!(data_mask(attr::APR, 10), 0);
    assert_eq!(data_mask(attr::APR, 11), 0);
    assert_eq!(data_mask(attr::SIDR_REQ, 6), 0);
    assert_eq!(data_mask(attr::SIDR_REQ, 7), 0);
    for off in [6, 7, 11] {
        assert_eq!(data_mask(attr::SIDR_REP, off), 0, "SIDR_REP byte {off}");
    }
    // RTU and DREP have no reserved body bits at all.
    assert!(defined_bits_mask(attr::RTU).unwrap()[HEADER_LEN..]
        .iter()
        .all(|&x| x == 0xFF));
    assert!(defined_bits_mask(attr::DREP).unwrap()[HEADER_LEN..]
        .iter()
        .all(|&x| x == 0xFF));
}

// ---------------------------------------------------------------------------
// Randomized decode/encode
// ---------------------------------------------------------------------------

/// xorshift64* (Vigna): tiny, deterministic, good enough to spray bits.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_be_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[test]
fn randomized_decode_never_panics_and_round_trips() {
    const ITERATIONS: usize = 200_000;
    let masks: Vec<(u16, [u8; MAD_LEN])> = attr::ALL
        .iter()
        .map(|&a| (a, defined_bits_mask(a).unwrap()))
        .collect();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut decoded = [0usize; 11];
    let mut errors = 0usize;
    let mut buf = [0u8; MAD_LEN + 8];
    for i in 0..ITERATIONS {
        rng.fill(&mut buf);
        // Mostly full-size MADs; now and then a wrong length.
        let len = match rng.next() % 64 {
            0 => (rng.next() % (MAD_LEN as u64 + 8)) as usize,
            _ => MAD_LEN,
        };
        if i % 2 == 0 {
            // Valid CM header so the body decoders run; sometimes an
            // out-of-range AttributeID to keep that path busy too.
            let a = if rng.next() % 16 == 0 {
                rng.next() as u16
            } else {
                attr::ALL[(rng.next() % 11) as usize]
            };
            let hdr = MadHeader::cm_send(a, rng.next(), rng.next() as u32).encode();
            buf[..HEADER_LEN].copy_from_slice(&hdr);
            // Random junk in the header words the codec ignores.
            buf[4..8].copy_from_slice(&(rng.next() as u32).to_be_bytes());
            buf[18..20].copy_from_slice(&(rng.next() as u16).to_be_bytes());
        }
        let input = &buf[..len];
        let Ok(mad) = decode(input) else {
            errors += 1;
            continue;
        };
        let a = mad.message.attribute_id();
        let idx = attr::ALL.iter().position(|&x| x == a).unwrap();
        decoded[idx] += 1;
        let out = encode(&mad).expect("a decoded message must encode");
        let mask = &masks[idx].1;
        for j in 0..MAD_LEN {
            assert_eq!(
                out[j] & mask[j],
                input[j] & mask[j],
                "defined bits lost at byte {j} of {}",
                mad.message_kind()
            );
            assert_eq!(out[j] & !mask[j], 0, "reserved bits set at byte {j}");
        }
        assert_eq!(decode(&out), Ok(mad));
    }
    // Every body decoder was exercised many times, and the error paths too.
    for (i, n) in decoded.iter().enumerate() {
        assert!(*n > 2_000, "{} decoded only {n} times", attr::ALL[i]);
    }
    assert!(errors > ITERATIONS / 2);
}

#[test]
fn every_defined_bit_is_preserved_and_every_reserved_bit_dropped() {
    // Walk a single set bit through every body position of every message:
    // exact agreement between the mask and what the codec keeps.
    for a in attr::ALL {
        let mask = defined_bits_mask(a).unwrap();
        for bit in HEADER_LEN * 8..MAD_LEN * 8 {
            let mut b = raw_mad(a, &[]);
            b[bit / 8] |= 0x80 >> (bit % 8);
            let defined = mask[bit / 8] & (0x80 >> (bit % 8)) != 0;
            let out = match decode(&b) {
                Ok(m) => encode(&m).unwrap(),
                // The high bit of a 2-bit closed enum alone spells a reserved
                // code (TransportServiceType 2); such a bit is defined.
                Err(WireError::Reserved { .. }) => {
                    assert!(defined, "attr {a:#x} bit {bit}");
                    continue;
                }
                Err(e) => panic!("attr {a:#x} bit {bit}: {e}"),
            };
            let kept = out[bit / 8] & (0x80 >> (bit % 8)) != 0;
            assert_eq!(
                kept,
                defined,
                "attr {a:#x} data bit {}",
                bit - HEADER_LEN * 8
            );
        }
    }
}

/// `validate` applies exactly `encode`'s checks: the same error for a value
/// too wide for its field, and success wherever `encode` succeeds.
#[test]
fn validate_agrees_with_encode() {
    let bad: Vec<CmMad> = vec![
        CmMad::new(
            1,
            Req {
                local_qpn: 1 << 24,
                ..Req::default()
            },
        ),
        CmMad::new(
            2,
            Rep {
                starting_psn: 1 << 24,
                ..Rep::default()
            },
        ),
        CmMad::new(
            3,
            Mra {
                service_timeout: 32,
                ..Mra::default()
            },
        ),
        CmMad::new(
            4,
            Req {
                primary_path: PathInfo {
                    flow_label: 1 << 20,
                    ..PathInfo::default()
                },
                ..Req::default()
            },
        ),
    ];
    for mad in &bad {
        let e = encode(mad).expect_err("out of range");
        assert_eq!(validate(mad), Err(e), "{mad:?}");
    }
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut buf = [0u8; MAD_LEN];
    let mut checked = 0;
    for i in 0..20_000 {
        rng.fill(&mut buf);
        let a = attr::ALL[i % 11];
        let hdr = MadHeader::cm_send(a, rng.next(), 0).encode();
        buf[..HEADER_LEN].copy_from_slice(&hdr);
        if let Ok(mad) = decode(&buf) {
            assert_eq!(validate(&mad), encode(&mad).map(|_| ()));
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} decoded");
}
