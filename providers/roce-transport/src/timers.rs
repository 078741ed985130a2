//! Transport timers: the local ACK timeout and the RNR NAK timer table.

use std::time::Duration;

/// The RNR NAK timer field of an AETH (IBTA vol. 1 §9.7.5.2.8, table
/// "Encoding for RNR NAK Timer Field"), in microseconds, by 5-bit code.
/// Code 0 is the longest, 655.36 ms; codes 1..=31 run from 0.01 ms to
/// 491.52 ms. The same values are Linux's `enum ib_rnr_timeout`
/// (`include/rdma/ib_verbs.h`, whose names spell the milliseconds) and
/// rxe's `rnrnak_usec` table in `rxe_comp.c` (which has 61410 for code 25,
/// a typo for the 61.44 ms of the spec; we follow the spec).
pub const RNR_TIMER_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The delay an RNR NAK with this timer code asks for (codes above 31 are
/// taken modulo 32, as only 5 bits travel).
pub fn rnr_delay(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_USEC[usize::from(code & 0x1f)]))
}

/// The local ACK timeout of the QP attribute `timeout` (IBTA vol. 1
/// §9.7.6.1.3 and the QP attribute table of ch. 11): 4.096 us x 2^timeout;
/// 0 means "infinite" (no transport timer). Values above 31 are clamped to
/// 31 (the field is 5 bits).
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let t = u32::from(timeout.min(31));
    Some(Duration::from_nanos(4_096u64 << t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_table_matches_ibta() {
        // Spot checks against the spec's table (values in us).
        let us = |c: u8| rnr_delay(c).as_micros();
        assert_eq!(us(0), 655_360);
        assert_eq!(us(1), 10);
        assert_eq!(us(5), 60);
        assert_eq!(us(12), 640);
        assert_eq!(us(14), 1_280);
        assert_eq!(us(18), 5_120);
        assert_eq!(us(25), 61_440);
        assert_eq!(us(31), 491_520);
        // From code 1 on the table grows, alternating x1.5 and x4/3 steps.
        for c in 2..32 {
            assert!(RNR_TIMER_USEC[c] > RNR_TIMER_USEC[c - 1], "code {c}");
        }
        assert_eq!(rnr_delay(33), rnr_delay(1));
    }

    #[test]
    fn ack_timeouts() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8_192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(67_108_864)));
        assert_eq!(ack_timeout(31), ack_timeout(40));
        assert!(ack_timeout(31).unwrap() > Duration::from_secs(8_000));
    }
}
