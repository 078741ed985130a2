//! Injected scheduling delays at the protocol points of the provider's
//! threads (issue 30 item 4): where loom cannot reach (the kernel socket,
//! real time), a stress test runs the real receive, timer and polling
//! threads with a yield, a short spin or a short sleep thrown in at the
//! points where two threads' protocols meet (`tests/delay_stress.rs`,
//! `docs/stress.md`, "Delay points").
//!
//! Every point is one line, `crate::delay::point(crate::delay::Point::X)`.
//! Without the `delay-points` feature (every normal build: no user of the
//! library enables it) [`point`] is an empty `#[inline(always)]` function:
//! the call compiles to nothing. With it, each call draws from a fast
//! per-thread generator (seeded from the run's seed and the thread's
//! number) whether to do nothing, `yield_now`, spin for a moment, or sleep
//! 1-50 us, with the probabilities of [`set`] or of the environment
//! variable `IBAL_DELAY_POINTS` (`yield=0.2,spin=0.1,sleep=0.02,seed=7`),
//! and counts what it did per point ([`counts`]).

/// A protocol point: where a thread may be delayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "delay-points"), allow(dead_code))]
pub enum Point {
    /// Receive thread: holds the port's feeding lock, before its blocking
    /// receive.
    FeedLocked,
    /// Receive thread: its blocking receive returned, datagrams not fed.
    RxReceived,
    /// Receive thread: the batch fed, the QPs it reached not driven.
    RxFed,
    /// Receive thread: pollers are active, about to nap.
    NapBefore,
    /// Receive thread: back from a nap.
    NapAfter,
    /// Poller (`progress`): took a port's feeding lock (`try_feeding`).
    PollFeedLocked,
    /// Poller: its datagrams fed, the QPs they reached not driven.
    PollFed,
    /// A receive counter about to be added by the feeding lock's holder.
    FeedCount,
    /// Held ACKs: the list changed by `hold`, the summary not published.
    HoldChanged,
    /// Held ACKs: the list changed by `take_for`, the summary not
    /// published.
    TakeChanged,
    /// CQ push: the completion queued, `queued` not stored.
    CqPushed,
    /// CQ poll: the lock-free check found completions, the lock not taken.
    CqPollChecked,
    /// `QpMap::find`: the version read, the memo or the map not.
    MemoVersionRead,
    /// `QpMap::change`: the map changed, the version not bumped.
    MapChanged,
    /// `Timers::arm`: the deadline is earlier than `queued`, no entry
    /// pushed yet.
    TimerArmChecked,
    /// Timer thread: planned to work (`NO_DEADLINE`), due entries not taken.
    TimerWorking,
    /// Timer thread: planned its sleep, not parked.
    TimerPlanned,
    /// QP destroy: removed from the map, its transport not yet gone.
    QpRemoved,
    /// Device close: `stop` set, the threads not woken.
    StopSignalled,
}

/// Does nothing: the `delay-points` feature is off.
#[cfg(not(feature = "delay-points"))]
#[inline(always)]
pub(crate) fn point(_at: Point) {}

#[cfg(feature = "delay-points")]
pub use on::*;

#[cfg(feature = "delay-points")]
mod on {
    use super::Point;
    use al::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::cell::Cell;
    use std::time::Duration;

    impl Point {
        /// Every point, in declaration order.
        pub const ALL: [Point; 19] = [
            Point::FeedLocked,
            Point::RxReceived,
            Point::RxFed,
            Point::NapBefore,
            Point::NapAfter,
            Point::PollFeedLocked,
            Point::PollFed,
            Point::FeedCount,
            Point::HoldChanged,
            Point::TakeChanged,
            Point::CqPushed,
            Point::CqPollChecked,
            Point::MemoVersionRead,
            Point::MapChanged,
            Point::TimerArmChecked,
            Point::TimerWorking,
            Point::TimerPlanned,
            Point::QpRemoved,
            Point::StopSignalled,
        ];
    }

    const POINTS: usize = Point::ALL.len();

    /// The chances of each delay at a point (each in 0.0..=1.0, their sum
    /// at most 1; the rest of the time a point does nothing), and the
    /// run's seed.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Delays {
        /// `std::thread::yield_now`.
        pub yield_now: f64,
        /// A busy spin of 0-2047 `spin_loop` hints (about 0-5 us).
        pub spin: f64,
        /// A sleep of 1-50 us (more, as the OS's timer slack allows).
        pub sleep: f64,
        /// Seeds every thread's generator (with the thread's number).
        pub seed: u64,
    }

    impl Default for Delays {
        /// What a point does when neither [`set`] nor `IBAL_DELAY_POINTS`
        /// said otherwise: 20 % yields, 10 % spins, 2 % sleeps, seed 1.
        fn default() -> Self {
            Delays {
                yield_now: 0.2,
                spin: 0.1,
                sleep: 0.02,
                seed: 1,
            }
        }
    }

    impl Delays {
        /// `s` as `IBAL_DELAY_POINTS` gives it: `key=value` pairs
        /// separated by commas, keys `yield`, `spin`, `sleep` (chances)
        /// and `seed`; a key left out keeps its [`Default`] value.
        pub fn parse(s: &str) -> Result<Delays, String> {
            let mut d = Delays::default();
            for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("{pair}: expected key=value"))?;
                let chance = || -> Result<f64, String> {
                    let p: f64 = v.parse().map_err(|e| format!("{pair}: {e}"))?;
                    (0.0..=1.0)
                        .contains(&p)
                        .then_some(p)
                        .ok_or_else(|| format!("{pair}: a chance is in 0..=1"))
                };
                match k {
                    "yield" => d.yield_now = chance()?,
                    "spin" => d.spin = chance()?,
                    "sleep" => d.sleep = chance()?,
                    "seed" => d.seed = v.parse().map_err(|e| format!("{pair}: {e}"))?,
                    _ => return Err(format!("{pair}: unknown key (yield, spin, sleep, seed)")),
                }
            }
            if d.yield_now + d.spin + d.sleep > 1.0 {
                return Err(format!("{s}: the chances add up to more than 1"));
            }
            Ok(d)
        }
    }

    /// What one point did: calls, and the delays among them.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PointCount {
        /// Times a thread passed the point.
        pub calls: u64,
        /// Of those, yields.
        pub yields: u64,
        /// Spins.
        pub spins: u64,
        /// Sleeps.
        pub sleeps: u64,
    }

    /// The configuration in effect, as thresholds on a 32-bit draw.
    struct Config {
        /// Set once a configuration is in effect (by [`set`], or read
        /// from the environment at the first point).
        ready: AtomicBool,
        /// Draws below these do: a yield; else a spin; else a sleep.
        yield_below: AtomicU64,
        spin_below: AtomicU64,
        sleep_below: AtomicU64,
        seed: AtomicU64,
        /// Bumped by every [`set`]: a thread's generator is seeded again.
        epoch: AtomicU32,
        /// Numbers the threads as they first pass a point.
        threads: AtomicU64,
        /// Per point: calls, yields, spins, sleeps.
        counts: [[AtomicU64; 4]; POINTS],
    }

    al::global! {
        static CONFIG: Config = Config {
            ready: AtomicBool::new(false),
            yield_below: AtomicU64::new(0),
            spin_below: AtomicU64::new(0),
            sleep_below: AtomicU64::new(0),
            seed: AtomicU64::new(0),
            epoch: AtomicU32::new(0),
            threads: AtomicU64::new(0),
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        };
    }

    al::thread_local_value! {
        /// This thread's generator state and the epoch it was seeded in.
        static RNG: Cell<(u64, u32)> = const { Cell::new((0, u32::MAX)) };
    }

    /// Puts `d` in effect for every point from now on (threads seed their
    /// generators again), and zeroes the [`counts`].
    pub fn set(d: Delays) {
        let c = &*CONFIG;
        let scale = |p: f64| (p.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u64;
        let y = scale(d.yield_now);
        let s = y + scale(d.spin);
        let z = s + scale(d.sleep);
        c.yield_below.store(y, Ordering::Relaxed);
        c.spin_below.store(s, Ordering::Relaxed);
        c.sleep_below.store(z, Ordering::Relaxed);
        c.seed.store(d.seed, Ordering::Relaxed);
        c.threads.store(0, Ordering::Relaxed);
        for row in &c.counts {
            for n in row {
                n.store(0, Ordering::Relaxed);
            }
        }
        c.epoch.fetch_add(1, Ordering::Release);
        c.ready.store(true, Ordering::Release);
    }

    /// The configuration of `IBAL_DELAY_POINTS`, or the [`Default`] (a
    /// malformed value panics: a stress run must not run with delays it
    /// was not asked for).
    pub fn from_env() -> Delays {
        match std::env::var("IBAL_DELAY_POINTS") {
            Ok(s) => Delays::parse(&s).unwrap_or_else(|e| panic!("IBAL_DELAY_POINTS: {e}")),
            Err(_) => Delays::default(),
        }
    }

    /// What each point did since the last [`set`], in [`Point::ALL`]'s
    /// order.
    pub fn counts() -> Vec<(Point, PointCount)> {
        let c = &*CONFIG;
        Point::ALL
            .iter()
            .map(|&p| {
                let [calls, yields, spins, sleeps] = c.counts[p as usize]
                    .each_ref()
                    .map(|n| n.load(Ordering::Relaxed));
                (
                    p,
                    PointCount {
                        calls,
                        yields,
                        spins,
                        sleeps,
                    },
                )
            })
            .collect()
    }

    /// splitmix64: a good 64-bit mix of a counter.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32-bit draw of this thread's generator (xorshift64*).
    fn draw(c: &Config) -> u64 {
        let epoch = c.epoch.load(Ordering::Acquire);
        RNG.with(|cell| {
            let (mut x, seeded) = cell.get();
            if seeded != epoch {
                let n = c.threads.fetch_add(1, Ordering::Relaxed);
                x = mix(c.seed.load(Ordering::Relaxed) ^ mix(n + 1)) | 1;
            }
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            cell.set((x, epoch));
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
        })
    }

    /// A thread passes the protocol point `at`: maybe delayed.
    #[inline(never)]
    pub fn point(at: Point) {
        let c = &*CONFIG;
        if !c.ready.load(Ordering::Acquire) {
            set(from_env());
        }
        let row = &c.counts[at as usize];
        row[0].fetch_add(1, Ordering::Relaxed);
        let r = draw(c);
        if r < c.yield_below.load(Ordering::Relaxed) {
            row[1].fetch_add(1, Ordering::Relaxed);
            al::sync::thread::yield_now();
        } else if r < c.spin_below.load(Ordering::Relaxed) {
            row[2].fetch_add(1, Ordering::Relaxed);
            for _ in 0..(r & 2047) {
                std::hint::spin_loop();
            }
        } else if r < c.sleep_below.load(Ordering::Relaxed) {
            row[3].fetch_add(1, Ordering::Relaxed);
            al::sync::thread::sleep(Duration::from_micros(1 + r % 50));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_setting_parses_and_refuses_what_it_cannot_mean() {
            let d = Delays::parse("yield=0.5, sleep=0.1,seed=9").unwrap();
            assert_eq!(
                d,
                Delays {
                    yield_now: 0.5,
                    spin: 0.1,
                    sleep: 0.1,
                    seed: 9
                }
            );
            assert_eq!(Delays::parse("").unwrap(), Delays::default());
            for bad in [
                "yield",
                "yield=2",
                "nap=0.1",
                "yield=0.6,spin=0.5",
                "seed=x",
            ] {
                assert!(Delays::parse(bad).is_err(), "{bad}");
            }
        }
    }
}
