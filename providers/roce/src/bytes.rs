//! Big-endian field access with bounds checks (network byte order, as every
//! IBTA header field is).

use crate::{DecodeError, EncodeError};

/// `bytes[..n]`, or a truncation error naming `what`.
pub(crate) fn take<'a>(
    bytes: &'a [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], DecodeError> {
    bytes.get(..n).ok_or(DecodeError::Truncated {
        what,
        need: n,
        have: bytes.len(),
    })
}

/// `out[..n]`, or an error saying how much room was needed.
pub(crate) fn room(out: &mut [u8], n: usize) -> Result<&mut [u8], EncodeError> {
    let have = out.len();
    out.get_mut(..n)
        .ok_or(EncodeError::BufferTooShort { need: n, have })
}

/// Checks that `value` fits in `bits` bits.
pub(crate) fn fits(field: &'static str, value: u64, bits: u32) -> Result<(), EncodeError> {
    let max = (1u64 << bits) - 1;
    if value > max {
        return Err(EncodeError::FieldOutOfRange { field, value, max });
    }
    Ok(())
}

pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

pub(crate) fn u24_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([0, b[i], b[i + 1], b[i + 2]])
}

pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

pub(crate) fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_be_bytes(a)
}

pub(crate) fn put_u16(b: &mut [u8], i: usize, v: u16) {
    b[i..i + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u24(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn put_u32(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], i: usize, v: u64) {
    b[i..i + 8].copy_from_slice(&v.to_be_bytes());
}
