//! Round trips of every message, defaults, names and path presence.

use super::*;

// ---------------------------------------------------------------------------
// Round trips and defaults
// ---------------------------------------------------------------------------

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
