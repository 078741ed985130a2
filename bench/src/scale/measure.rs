//! What a process costs: its resident memory and its CPU time.

use std::time::Duration;

/// Resident memory of this process, bytes (`VmRSS` of /proc/self/status;
/// 0 where there is no procfs).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_vm_rss(&s))
        .unwrap_or(0)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU time this process has used, all threads (user and system;
/// `CLOCK_PROCESS_CPUTIME_ID`, nanosecond resolution, unlike the 10 ms
/// ticks of /proc/self/stat).
pub fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Nanoseconds since `epoch`, for time stamps kept in atomics.
pub(crate) fn nanos_since(epoch: std::time::Instant) -> u64 {
    epoch.elapsed().as_nanos().min(u128::from(u64::MAX - 1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tibal\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tibal\n"), None);
    }

    #[test]
    fn this_process_has_resident_memory_and_burns_cpu() {
        assert!(rss_bytes() > 0);
        let before = cpu_time();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_time() > before);
    }
}
