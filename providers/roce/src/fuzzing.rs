//! The check behind the `roce_codec` fuzz target (`fuzz/`), here so that
//! `cargo test` replays its corpus on stable (`tests/fuzz_corpus.rs`). It
//! panics when an invariant breaks: that is how a fuzzer learns of a bug.

use std::net::SocketAddr;

use crate::{icrc, DecodeError, Endpoints, Frame, Packet, ICRC_LEN};

/// The flows the check encodes against.
fn flows() -> [Endpoints; 2] {
    let addr = |s: &str| s.parse::<SocketAddr>().expect("a literal address");
    [
        Endpoints::new(addr("192.0.2.1:49152"), addr("192.0.2.2:4791")).expect("one family"),
        Endpoints::new(addr("[2001:db8::1]:50000"), addr("[2001:db8::2]:4791"))
            .expect("one family"),
    ]
}

/// `roce_codec`: any bytes, read as a UDP payload and as an IP frame, either
/// fail with an error or decode to a value that re-encodes and decodes back
/// to itself. The same bytes with their ICRC made right are tried too, so
/// that every check behind the ICRC sees arbitrary input.
pub fn roce_codec(data: &[u8]) {
    for endpoints in flows() {
        // As received on a socket.
        let parsed = Packet::decode_without_icrc(data);
        if let Ok(p) = parsed {
            let bytes = p
                .encode(&endpoints)
                .expect("a decoded packet must re-encode");
            assert_eq!(bytes.len(), data.len(), "re-encoding changed the length");
            let again =
                Packet::decode(&bytes, &endpoints).expect("a re-encoded packet must decode");
            assert_eq!(again, p, "decode(encode(p)) != p");
        }
        let checked = Packet::decode(data, &endpoints);
        match (&parsed, &checked) {
            (Err(a), Err(b)) => assert_eq!(a, b, "ICRC check changed the parse error"),
            (Ok(_), Err(DecodeError::IcrcMismatch { .. } | DecodeError::TooLong { .. })) => {}
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (a, b) => panic!("parse {a:?} vs checked decode {b:?}"),
        }
        if data.len() >= ICRC_LEN {
            let mut sealed = data.to_vec();
            let n = sealed.len() - ICRC_LEN;
            if let Ok(c) = icrc::icrc(&endpoints, &sealed[..n]) {
                sealed[n..].copy_from_slice(&icrc::to_wire(c));
                let sealed_result = Packet::decode(&sealed, &endpoints);
                assert_eq!(
                    sealed_result.is_ok(),
                    parsed.is_ok(),
                    "a sealed packet must decode exactly when its parse does"
                );
            }
        }
    }
    frame(data);
    // The same bytes as a frame whose ICRC was made right.
    if let Err(DecodeError::IcrcMismatch { computed, .. }) = Frame::decode(data) {
        let mut sealed = data.to_vec();
        let end = ip_end(data).expect("an ICRC was checked, so the lengths were read");
        sealed[end - ICRC_LEN..end].copy_from_slice(&icrc::to_wire(computed));
        Frame::decode(&sealed).expect("a sealed frame must decode");
        frame(&sealed);
    }
}

/// Where the IP packet in `data` ends, by its length field.
fn ip_end(data: &[u8]) -> Option<usize> {
    match data.first()? >> 4 {
        4 => Some(usize::from(u16::from_be_bytes([
            *data.get(2)?,
            *data.get(3)?,
        ]))),
        6 => Some(40 + usize::from(u16::from_be_bytes([*data.get(4)?, *data.get(5)?]))),
        _ => None,
    }
}

fn frame(data: &[u8]) {
    let Ok(f) = Frame::decode(data) else {
        return;
    };
    let bytes = f.encode().expect("a decoded frame must re-encode");
    let again = Frame::decode(&bytes).expect("a re-encoded frame must decode");
    assert_eq!(again, f, "decode(encode(f)) != f");
}
