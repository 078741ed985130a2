//! The device clock: monotonic nanoseconds, read on every packet and every
//! drive of a QP (several times per message).
//!
//! `clock_gettime(CLOCK_MONOTONIC)` (glibc's vDSO call) straight into
//! integer nanoseconds costs about half of `Instant::elapsed`, whose checked
//! `timespec` arithmetic made a read ~130 instructions (callgrind, `ibal
//! perf send-lat --one-thread`). Through libc rather than rustix's own
//! vDSO reader, which crashes under valgrind (it reads the auxiliary
//! vector valgrind gives the program).
#![allow(unsafe_code)]

/// The monotonic clock, nanoseconds.
#[cfg(all(target_os = "linux", not(ibal_loom)))]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` that lives across the
    // call, which writes only it; CLOCK_MONOTONIC exists on every Linux,
    // so the call cannot fail (had it, `ts` would stay zero: time 0, a
    // clock that stands still, never undefined behaviour).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The monotonic clock, nanoseconds from its first read.
#[cfg(all(not(target_os = "linux"), not(ibal_loom)))]
pub(crate) fn monotonic_ns() -> u64 {
    // Never under loom (the model clock above); process-wide, read only.
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

al::global! {
    /// Under the model checker the clock is the model's: it stands still
    /// until a model moves it ([`advance`]), so every execution of a model
    /// sees the same times (loom replays executions and must not see the
    /// real clock's) and a timer fires only when a model says time passed.
    #[cfg(ibal_loom)]
    static MODEL_NS: al::sync::atomic::AtomicU64 = al::sync::atomic::AtomicU64::new(1_000_000);
}

/// The model's clock (see `MODEL_NS`).
#[cfg(ibal_loom)]
pub(crate) fn monotonic_ns() -> u64 {
    MODEL_NS.load(al::sync::atomic::Ordering::SeqCst)
}

/// Moves the model's clock `ns` forward.
#[cfg(ibal_loom)]
pub(crate) fn advance(ns: u64) {
    MODEL_NS.fetch_add(ns, al::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_clock_moves_forward_with_instant() {
        let (t0, i0) = (monotonic_ns(), Instant::now());
        std::thread::sleep(Duration::from_millis(5));
        let (t1, i1) = (Instant::now(), monotonic_ns());
        let ours = i1 - t0;
        let std = t1.duration_since(i0).as_nanos() as u64;
        assert!(ours >= 5_000_000, "{ours} ns over a 5 ms sleep");
        // Read in the other order around `Instant`'s reads: ours spans
        // theirs, so it is never shorter.
        assert!(ours >= std, "{ours} < {std}");
        assert!(ours - std < 50_000_000, "{ours} vs {std}");
    }
}
