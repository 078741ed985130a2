//! What every row of write-bw and send-rate over UDP records: payload
//! Gbit/s, packets per second and the process's CPU time per GiB of
//! payload, each measured over the same interval.
//!
//! CPU is the process's CPU clock (`CLOCK_PROCESS_CPUTIME_ID`: user and
//! system time of all its threads), read at the start and at the end of
//! the timed interval. Both ends of every contender run in this process
//! (and, for RoCE, the provider's receive and timer threads), so it is
//! the cost of both ends together. Kernel work done in softirq context
//! may be charged to whichever task the interrupt landed on, or to no
//! task, so it is a lower bound of the machine's work for both.

use std::time::Instant;

/// One contender's figures for one run (or the best of several).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Payload (RDMA or SEND data, without headers) delivered, Gbit/s.
    pub gbps: f64,
    /// Packets (datagrams, or segments of coalesced buffers) delivered
    /// per second; for a 64-byte SEND stream, messages per second.
    pub packets_per_sec: f64,
    /// Process CPU seconds spent per GiB (2^30 bytes) of payload.
    pub cpu_s_per_gib: f64,
}

impl Figures {
    /// Nothing measured (every figure NaN: `null` in JSON).
    pub const NONE: Figures = Figures {
        gbps: f64::NAN,
        packets_per_sec: f64::NAN,
        cpu_s_per_gib: f64::NAN,
    };

    /// The figures of `payload_bytes` in `packets` delivered in `secs`
    /// of wall time, costing `cpu_secs` of process CPU time. NaN where a
    /// divisor is zero or not finite.
    pub fn of(payload_bytes: u64, packets: u64, secs: f64, cpu_secs: f64) -> Figures {
        let per_sec = |x: f64| {
            if secs > 0.0 && secs.is_finite() {
                x / secs
            } else {
                f64::NAN
            }
        };
        let gib = payload_bytes as f64 / (1u64 << 30) as f64;
        Figures {
            gbps: per_sec(payload_bytes as f64 * 8.0) / 1e9,
            packets_per_sec: per_sec(packets as f64),
            cpu_s_per_gib: if gib > 0.0 { cpu_secs / gib } else { f64::NAN },
        }
    }

    /// Whichever of the two moved more payload per second (a NaN run
    /// loses to any measured one).
    pub fn best(self, other: Figures) -> Figures {
        if other.gbps > self.gbps || self.gbps.is_nan() {
            other
        } else {
            self
        }
    }
}

/// The process's CPU time so far, seconds (see the module's text).
pub(super) fn process_cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The start of a timed interval: wall clock and process CPU clock.
#[derive(Clone, Copy)]
pub(super) struct Start {
    wall: Instant,
    cpu: f64,
}

/// The end of a timed interval (taken by whichever thread sees the last
/// packet).
#[derive(Clone, Copy)]
pub(super) struct End {
    wall: Instant,
    cpu: f64,
}

impl Start {
    pub(super) fn now() -> Start {
        Start {
            wall: Instant::now(),
            cpu: process_cpu_secs(),
        }
    }

    /// The figures of `payload_bytes` in `packets` moved between `self`
    /// and `end` (NaN when nothing arrived: `end` is `None`).
    pub(super) fn figures(self, end: Option<End>, payload_bytes: u64, packets: u64) -> Figures {
        match end {
            Some(e) => Figures::of(
                payload_bytes,
                packets,
                e.wall.duration_since(self.wall).as_secs_f64(),
                e.cpu - self.cpu,
            ),
            None => Figures::NONE,
        }
    }
}

impl End {
    pub(super) fn now() -> End {
        End::after(Instant::now())
    }

    /// The end at `wall` (when the last datagram arrived), with the
    /// process's CPU time read now. A baseline's receiver notes only the
    /// wall clock per datagram (the vDSO: tens of nanoseconds) and reads
    /// the CPU clock once, when it stops: that read is a system call that
    /// sums every thread's time, and made per datagram it was work the
    /// baselines did and RoCEv2 did not (in `perf record`, ~4% of the
    /// plain baselines' user time plus their kernel share).
    pub(super) fn after(wall: Instant) -> End {
        End {
            wall,
            cpu: process_cpu_secs(),
        }
    }
}

/// What one raw UDP stream moved, as its receiver counted it.
#[derive(Clone, Copy)]
pub(super) struct Moved {
    /// Datagrams received (segments of coalesced buffers counted one by
    /// one).
    pub(super) datagrams: u64,
    /// UDP payload bytes received (the tests check it against what was
    /// sent).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) bytes: u64,
    /// Receive calls that returned data (coalesced buffers for GRO).
    pub(super) receives: u64,
    /// From the sender's start ...
    pub(super) start: Start,
    /// ... to the last receive (`None`: nothing arrived).
    pub(super) end: Option<End>,
}

impl Moved {
    /// Datagrams sent but not received (UDP has no flow control).
    pub(super) fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.datagrams)
    }

    /// The figures when each datagram carries `payload` bytes of payload
    /// (its RoCEv2 headers and ICRC not counted).
    pub(super) fn figures(&self, payload: usize) -> Figures {
        self.start
            .figures(self.end, self.datagrams * payload as u64, self.datagrams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_divide_by_wall_time_and_by_gib() {
        // 2 GiB in 4 s as 524,288 packets of 4 KiB, costing 3 CPU s.
        let f = Figures::of(2 << 30, 524_288, 4.0, 3.0);
        assert!((f.gbps - 2.0 * 8.0 * (1u64 << 30) as f64 / 4.0 / 1e9).abs() < 1e-9);
        assert!((f.gbps - 4.294967296).abs() < 1e-9);
        assert_eq!(f.packets_per_sec, 131_072.0);
        assert_eq!(f.cpu_s_per_gib, 1.5);
        // 64-byte messages: a million in one second, 0.5 CPU s.
        let f = Figures::of(64_000_000, 1_000_000, 1.0, 0.5);
        assert!((f.cpu_s_per_gib - 0.5 * (1u64 << 30) as f64 / 64e6).abs() < 1e-9);
        assert!((f.gbps - 0.512).abs() < 1e-12);
    }

    #[test]
    fn nothing_moved_is_nan_not_infinite() {
        let f = Figures::of(0, 0, 1.0, 0.2);
        assert_eq!(f.gbps, 0.0);
        assert!(f.cpu_s_per_gib.is_nan());
        let f = Figures::of(1 << 30, 10, 0.0, 0.2);
        assert!(f.gbps.is_nan() && f.packets_per_sec.is_nan());
        assert_eq!(f.cpu_s_per_gib, 0.2);
    }

    #[test]
    fn best_keeps_the_faster_run_whole() {
        let slow = Figures::of(1 << 30, 100, 2.0, 1.0);
        let fast = Figures::of(1 << 30, 100, 1.0, 9.0);
        assert_eq!(slow.best(fast), fast);
        assert_eq!(fast.best(slow), fast);
        assert_eq!(Figures::NONE.best(slow), slow);
        assert_eq!(slow.best(Figures::NONE), slow);
    }

    #[test]
    fn the_process_cpu_clock_counts_this_threads_work() {
        let thread = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
        };
        let start = Start::now();
        let t0 = thread();
        let mut x = 0u64;
        while thread() - t0 < 0.02 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let spent = thread() - t0;
        let f = start.figures(Some(End::now()), 1 << 30, 1);
        // The process's clock includes this thread's 20 ms (and whatever
        // the other test threads did meanwhile).
        assert!(f.cpu_s_per_gib >= spent - 1e-6, "{f:?} < {spent}");
    }
}
