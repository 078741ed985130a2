//! Codec tests: exact byte positions per message (from the IBTA tables as
//! restated in cm-wire.md), round trips, every error path, and a randomized
//! decode/encode check against the defined-bits mask.
//!
//! This file holds the helpers, the sample messages, the header and timer
//! tests; the rest is beside it: `layouts.rs` (byte positions per message),
//! `round_trips.rs`, `validation.rs` (every error path) and `masks.rs`
//! (layout tables, defined-bits masks, randomized decode and encode).

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

// Messages with every field set, for the layout, round-trip and mask tests.

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

mod layouts;
mod masks;
mod round_trips;
mod validation;
