//! The layout tables and the defined-bits masks, and randomized decode and
//! encode checked against them.

use super::*;

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
