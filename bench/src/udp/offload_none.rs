//! The raw UDP ceilings need Linux's `UDP_SEGMENT`, `UDP_GRO`,
//! `sendmmsg` and `recvmmsg`; elsewhere they report an error.

use super::figures::Moved;
use crate::BenchResult;

/// As on Linux (`offload.rs`).
pub const MAX_SEGMENTS: usize = 64;
/// As on Linux (`offload.rs`).
pub const MAX_SUPER: usize = 65_000;
/// As on Linux (`offload.rs`).
pub const BATCH: usize = 32;

/// Datagrams of `datagram` bytes in one super-datagram.
pub fn segments_per_send(datagram: usize) -> usize {
    (MAX_SUPER / datagram.max(1)).clamp(1, MAX_SEGMENTS)
}

/// Datagrams in a coalesced buffer (see `offload.rs`).
pub fn segments_in(len: usize, segment: usize) -> u64 {
    if segment == 0 {
        1
    } else {
        len.div_ceil(segment).max(1) as u64
    }
}

pub(super) fn udp_stream_gso(_count: u64, _datagram: usize) -> BenchResult<Moved> {
    Err("the GSO+GRO baseline needs Linux".into())
}

pub(super) fn udp_stream_batched(_count: u64, _datagram: usize) -> BenchResult<Moved> {
    Err("the batched baseline needs Linux".into())
}
