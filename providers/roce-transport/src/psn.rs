//! 24-bit packet sequence number arithmetic (IBTA vol. 1 §9.7.1: PSNs are
//! taken modulo 2^24; a responder treats the 2^23 PSNs before its expected
//! PSN as "duplicate" and the rest as "invalid", §9.7.5.1.1 and §9.7.5.1.2).

/// PSNs are 24 bits wide.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// `psn + n`, modulo 2^24.
pub const fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// `psn - 1`, modulo 2^24.
pub const fn prev(psn: u32) -> u32 {
    psn.wrapping_sub(1) & PSN_MASK
}

/// The signed distance from `b` to `a` (`a - b`) in the 24-bit circle,
/// in `-2^23 ..= 2^23 - 1`: positive when `a` is after `b`.
pub const fn diff(a: u32, b: u32) -> i32 {
    // Shift the 24-bit difference into the top of an i32 and back, which
    // sign-extends bit 23.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// Whether `a` comes strictly before `b`.
pub const fn before(a: u32, b: u32) -> bool {
    diff(a, b) < 0
}

/// Number of packets a message of `len` bytes takes at `mtu` bytes per
/// packet: `ceil(len / mtu)`, at least 1 (a zero-length message is one
/// packet).
pub const fn packets(len: u32, mtu: u32) -> u32 {
    if len == 0 {
        1
    } else {
        len.div_ceil(mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_prev_wrap() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK - 1, 5), 3);
        assert_eq!(prev(0), PSN_MASK);
        assert_eq!(add(7, 0), 7);
    }

    #[test]
    fn diff_is_signed_in_the_circle() {
        assert_eq!(diff(5, 3), 2);
        assert_eq!(diff(3, 5), -2);
        assert_eq!(diff(0, PSN_MASK), 1);
        assert_eq!(diff(PSN_MASK, 0), -1);
        assert_eq!(diff(2, PSN_MASK - 1), 4);
        // The half-circle boundary: 2^23 ahead is "behind" (duplicate side).
        assert_eq!(diff(1 << 23, 0), -(1 << 23));
        assert_eq!(diff((1 << 23) - 1, 0), (1 << 23) - 1);
        assert!(before(PSN_MASK, 0));
        assert!(!before(0, PSN_MASK));
        assert!(!before(9, 9));
    }

    #[test]
    fn packet_counts() {
        assert_eq!(packets(0, 256), 1);
        assert_eq!(packets(1, 256), 1);
        assert_eq!(packets(256, 256), 1);
        assert_eq!(packets(257, 256), 2);
        assert_eq!(packets(1 << 20, 4096), 256);
    }
}
