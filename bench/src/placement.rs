//! Where a latency benchmark's two polling threads run.
//!
//! `perf send-lat` pins the two threads of each contender (the RoCE
//! ping-pong's two CQ pollers, the raw UDP ping-pong's two socket pollers)
//! to two different CPUs, the same two for every contender, so that the
//! comparison is not decided by where the scheduler happens to put them:
//! unpinned, the two RoCE pollers of one process were found sharing one
//! CPU in most runs on some days (their work then runs in series: 9-10 us
//! per round trip against 6.2-6.6 us apart), while the raw UDP pair never
//! was (`docs/benchmarks.md`, "the bimodal ping-pong"). `--no-pin` leaves
//! placement to the scheduler.

/// Two CPUs this process may run on, for the two ends of a ping-pong;
/// None when it may use fewer than two (nothing is pinned then).
pub fn two_cpus() -> Option<[usize; 2]> {
    #[cfg(target_os = "linux")]
    {
        let allowed = rustix::thread::sched_getaffinity(None).ok()?;
        let mut cpus = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
        Some([cpus.next()?, cpus.next()?])
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Three CPUs this process may run on; None when it may use fewer.
pub fn three_cpus() -> Option<[usize; 3]> {
    #[cfg(target_os = "linux")]
    {
        let allowed = rustix::thread::sched_getaffinity(None).ok()?;
        let mut cpus = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
        Some([cpus.next()?, cpus.next()?, cpus.next()?])
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Pins the calling thread to `cpu` for the rest of its life (a
/// contender's own thread). A refused pin (a CPU taken away meanwhile)
/// only costs the placement, not the measurement.
pub fn pin_this_thread(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        let mut only = rustix::thread::CpuSet::new();
        only.set(cpu);
        let _ = rustix::thread::sched_setaffinity(None, &only);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

/// Runs `f` on the calling thread pinned to `cpu` (if given), and gives
/// the thread its former CPUs back afterwards.
pub fn on_cpu<R>(cpu: Option<usize>, f: impl FnOnce() -> R) -> R {
    #[cfg(target_os = "linux")]
    if let Some(cpu) = cpu {
        use rustix::thread::{sched_getaffinity, sched_setaffinity};
        let before = sched_getaffinity(None).ok();
        pin_this_thread(cpu);
        let r = f();
        if let Some(before) = before {
            let _ = sched_setaffinity(None, &before);
        }
        return r;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_closure_runs_on_its_cpu_and_the_thread_gets_its_cpus_back() {
        use rustix::thread::{sched_getaffinity, sched_getcpu};
        let before = sched_getaffinity(None).unwrap();
        let Some([_, second]) = two_cpus() else {
            eprintln!("skipped: this process may use fewer than two CPUs");
            return;
        };
        let ran_on = on_cpu(Some(second), sched_getcpu);
        assert_eq!(ran_on, second);
        assert_eq!(sched_getaffinity(None).unwrap(), before);
        assert_eq!(on_cpu(None, || 7), 7);
        let on_own_thread = std::thread::spawn(move || {
            pin_this_thread(second);
            (sched_getcpu(), sched_getaffinity(None).unwrap().count())
        });
        assert_eq!(on_own_thread.join().unwrap(), (second, 1));
    }
}
