//! The job's own bytes in the CM's private data: the connecting side's
//! hello after rdma_cm's header in the REQ (iterations, size, its buffer),
//! the listener's reply in the REP (its buffer).

use std::net::SocketAddr;

/// What this job puts after rdma_cm's header in the REQ, and in the REP.
const MAGIC: &[u8; 4] = b"IBPP";
const VERSION: u8 = 1;

/// Largest --size (the whole MR is 2 * size + 16 bytes).
pub(crate) const MAX_SIZE: usize = 64 << 20;

/// The job's parameters after rdma_cm's header in the REQ: magic,
/// version, iterations, size, the connecting side's buffer (address of its
/// write target, R_Key).
pub(crate) fn encode_hello(iterations: u32, size: usize, rkey: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(25);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    v.extend_from_slice(&iterations.to_be_bytes());
    v.extend_from_slice(&(size as u32).to_be_bytes());
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&rkey.to_be_bytes());
    v
}

/// A request's hello: iterations, size, the peer's buffer address and
/// rkey.
pub(crate) type Hello = (u32, usize, u64, u32);

/// The hello of a request from `source`, checked. Otherwise what to
/// reject it with (the REJ's private data) and why, in words.
pub(crate) fn read_hello(
    user_data: &[u8],
    source: SocketAddr,
) -> Result<Hello, (&'static [u8], String)> {
    match decode_hello(user_data) {
        Ok(h) if h.0 > 0 && h.1 > 0 && h.1 <= MAX_SIZE => Ok(h),
        Ok(_) => Err((
            b"bad size",
            format!("{source} asked for a size or count out of range"),
        )),
        Err(e) => Err((b"not ibal pingpong", format!("{source}: {e}"))),
    }
}

/// `(iterations, size, addr, rkey)` of a hello, or why not.
pub(crate) fn decode_hello(b: &[u8]) -> Result<Hello, String> {
    if b.len() < 25 || &b[..4] != MAGIC {
        return Err("the request does not come from `ibal pingpong --connect`".into());
    }
    if b[4] != VERSION {
        return Err(format!("ping-pong version {} (we speak {VERSION})", b[4]));
    }
    let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let addr = u64::from_be_bytes(b[13..21].try_into().expect("8 bytes"));
    Ok((u32_at(5), u32_at(9) as usize, addr, u32_at(21)))
}

/// The listener's answer in the REP: magic, the address and R_Key of its
/// write target.
pub(crate) fn encode_reply(rkey: u32) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&rkey.to_be_bytes());
    v
}

/// The address and R_Key of the listener's write target, from its REP.
pub(crate) fn decode_reply(b: &[u8]) -> Result<(u64, u32), String> {
    if b.len() < 16 || &b[..4] != MAGIC {
        return Err("the peer's reply is not from `ibal pingpong --listen`".into());
    }
    let addr = u64::from_be_bytes(b[4..12].try_into().expect("8 bytes"));
    Ok((addr, u32::from_be_bytes(b[12..16].try_into().expect("4"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_reply_round_trip_and_strangers_are_refused() {
        let h = encode_hello(7, 4096, 0xabcd);
        assert!(h.len() <= cep::wire::ip_cm::MAX_REQ_USER_DATA);
        let mut padded = h.clone();
        padded.resize(56, 0);
        assert_eq!(decode_hello(&padded).unwrap(), (7, 4096, 0, 0xabcd));
        assert!(decode_hello(b"IBPQ and more bytes than twenty-five").is_err());
        let mut old = h;
        old[4] = 9;
        assert!(decode_hello(&old).is_err());
        assert_eq!(decode_reply(&encode_reply(5)).unwrap(), (0, 5));
        assert!(decode_reply(&[0; 16]).is_err());
    }
}
