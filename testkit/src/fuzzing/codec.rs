//! The codecs' round trips: CM MADs (`mad_codec`) and the soft fabric's
//! InfiniBand packets and ERF captures (`ib_capture`).

use cep::wire;

/// `mad_codec`: any bytes either fail to decode or decode to a message that
/// re-encodes to the same defined bits and decodes back to itself.
pub fn mad_codec(data: &[u8]) {
    // Exercise both the exact-length path and whatever length we were given.
    let mut mad = [0u8; wire::MAD_LEN];
    let n = data.len().min(wire::MAD_LEN);
    mad[..n].copy_from_slice(&data[..n]);
    for candidate in [data, &mad[..]] {
        let Ok(decoded) = wire::decode(candidate) else {
            continue;
        };
        let encoded = wire::encode(&decoded).expect("a decoded MAD must re-encode");
        assert_eq!(
            wire::validate(&decoded),
            Ok(()),
            "validate refused what encode took"
        );
        let again = wire::decode(&encoded).expect("a re-encoded MAD must decode");
        assert_eq!(again, decoded, "decode(encode(x)) != x");
        let mask = wire::defined_bits_mask(decoded.message.attribute_id())
            .expect("a decoded attribute has a mask");
        for i in 0..wire::MAD_LEN {
            assert_eq!(
                encoded[i] & mask[i],
                candidate[i] & mask[i],
                "defined bits of byte {i} changed in a round trip"
            );
        }
    }
}

/// `ib_capture`: any bytes, read as an ERF capture and as one InfiniBand
/// packet, either fail cleanly or give packets that re-encode to bytes that
/// decode back to the same packet (reserved bits, which decoding drops, are
/// the only bytes allowed to change).
pub fn ib_capture(data: &[u8]) {
    use ibal::verbs::erf;
    use ibal::verbs::packet::UdPacket;

    fn packet(bytes: &[u8]) {
        let Ok(p) = UdPacket::decode(bytes) else {
            return;
        };
        let encoded = p.encode().expect("a decoded packet must re-encode");
        assert_eq!(encoded.len(), bytes.len(), "re-encoding changed the length");
        let again = UdPacket::decode(&encoded).expect("a re-encoded packet must decode");
        assert_eq!(again, p, "decode(encode(p)) != p");
    }

    packet(data);
    // The same bytes with their CRCs made right, so that every header check
    // behind the CRCs sees arbitrary headers too.
    let mut sealed = data.to_vec();
    if ibal::verbs::packet::refresh_crcs(&mut sealed).is_ok() {
        packet(&sealed);
    }
    if let Ok(records) = erf::read(data) {
        let mut w = erf::ErfWriter::new(Vec::new());
        for r in &records {
            packet(&r.data);
            w.write(r.at, &r.data).expect("a read record must re-write");
        }
        let again = erf::read(&w.finish().expect("writing to a Vec"))
            .expect("a re-written capture must read");
        assert_eq!(again.len(), records.len(), "records lost in a round trip");
        for (a, b) in again.iter().zip(&records) {
            assert_eq!(a.data, b.data, "record data changed in a round trip");
            let drift = a.at.abs_diff(b.at);
            assert!(
                drift < std::time::Duration::from_nanos(2),
                "timestamp drifted {drift:?}"
            );
        }
    }
}
