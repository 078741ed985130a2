//! Does `MSG_ZEROCOPY` pay for the GSO sends of a RoCEv2 stream on this
//! machine? Raw UDP over loopback, the sender writing 64 KiB GSO
//! super-datagrams (`UDP_SEGMENT`, the RoCE packet sizes of MTU 1024 and
//! 4096), the receiver with `UDP_GRO`; each size copied by the kernel, then
//! handed over with `MSG_ZEROCOPY` (completions drained from the error
//! queue as they come). Prints Gbit/s and process CPU seconds per GiB
//! received. `cargo run --release -p ibal-bench --example udp_zerocopy [secs]`
//! (docs/benchmarks.md has the result: the provider copies).

#[cfg(target_os = "linux")]
fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    for _round in 0..2 {
        for seg in [1040usize, 4112] {
            for zerocopy in [false, true] {
                if let Err(e) = probe::run(seg, zerocopy, secs) {
                    eprintln!("segment {seg}, zerocopy {zerocopy}: {e}");
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("Linux only (UDP_SEGMENT, UDP_GRO, MSG_ZEROCOPY)");
}

#[cfg(target_os = "linux")]
mod probe {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn set(fd: i32, level: i32, name: i32, v: i32) -> Result<(), String> {
        // SAFETY: `v` is an int that lives across the call and its size is
        // given; the kernel only reads it.
        let r = unsafe { libc::setsockopt(fd, level, name, (&v as *const i32).cast(), 4) };
        if r == 0 {
            Ok(())
        } else {
            Err(format!(
                "setsockopt({level}, {name}): {}",
                std::io::Error::last_os_error()
            ))
        }
    }

    fn cpu_seconds() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    }

    /// Drains the zero-copy completions queued on `fd`; how many.
    fn drain_completions(fd: i32) -> u64 {
        let mut n = 0;
        let mut control = [0u64; 16];
        loop {
            // SAFETY: all-zero is a valid msghdr.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_control = control.as_mut_ptr().cast();
            m.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: `m` names only `control`, which lives across the call,
            // with its size; no data buffer.
            let r = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
            if r < 0 {
                return n;
            }
            n += 1;
        }
    }

    pub fn run(seg: usize, zerocopy: bool, secs: f64) -> Result<(), String> {
        let rx = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let tx = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let (r, t) = (rx.as_raw_fd(), tx.as_raw_fd());
        set(r, libc::SOL_UDP, libc::UDP_GRO, 1)?;
        set(r, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20)?;
        set(t, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20)?;
        set(
            t,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
        set(t, libc::SOL_UDP, libc::UDP_SEGMENT, seg as i32)?;
        if zerocopy {
            set(t, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)?;
        }
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(|e| e.to_string())?;
        tx.connect(rx.local_addr().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let len = (65_000 / seg).min(64) * seg;
        let stop = Arc::new(AtomicBool::new(false));
        let receiver = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                let mut bytes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(k) = rx.recv(&mut buf) {
                        bytes += k as u64;
                    }
                }
                bytes
            })
        };
        // Buffers in turn, so a zero-copy send's pages are not rewritten
        // while the kernel may still hold them (their bytes do not matter).
        let bufs: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; len]).collect();
        let flags = if zerocopy { libc::MSG_ZEROCOPY } else { 0 };
        let (t0, c0) = (Instant::now(), cpu_seconds());
        let (mut sent, mut completions, mut i) = (0u64, 0u64, 0usize);
        while t0.elapsed().as_secs_f64() < secs {
            let b = &bufs[i % bufs.len()];
            i += 1;
            // SAFETY: `b` is valid for `b.len()` bytes across the call.
            let r = unsafe { libc::send(t, b.as_ptr().cast(), b.len(), flags) };
            if r > 0 {
                sent += r as u64;
            }
            if zerocopy {
                completions += drain_completions(t);
            }
        }
        let elapsed = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        let got = receiver.join().map_err(|_| "receiver panicked")?;
        let cpu = cpu_seconds() - c0;
        println!(
            "segment {seg:>5} {:<9} sent {:6.2} Gbit/s, received {:6.2} Gbit/s, {:.2} CPU s per GiB received, {completions} completions",
            if zerocopy { "zerocopy" } else { "copy" },
            sent as f64 * 8.0 / elapsed / 1e9,
            got as f64 * 8.0 / elapsed / 1e9,
            cpu / (got as f64 / f64::from(1u32 << 30)),
        );
        Ok(())
    }
}
