//! The raw UDP ceilings (issue 31): what this machine's UDP moves when
//! the kernel's offloads and batched system calls are used, with the same
//! datagrams and the same blocking receive as the plain baselines.
//!
//! * GSO+GRO: the sender sets `UDP_SEGMENT` to the datagram size and
//!   sends super-datagrams of up to [`MAX_SEGMENTS`] datagrams
//!   ([`MAX_SUPER`] bytes); the kernel cuts each into datagrams of that
//!   size (on loopback it delivers it whole). The receiver has `UDP_GRO`
//!   on and takes whole coalesced buffers with `recvmsg`, counting the
//!   datagrams in each by the segment size of the `UDP_GRO` control
//!   message.
//! * Batched: `sendmmsg` of [`BATCH`] datagrams a call, `recvmmsg` of up
//!   to [`BATCH`] a call (`MSG_WAITFORONE`: blocks for the first only).
//!
//! Unlike the plain baselines, both senders keep within a window of the
//! receiver's count (2 MiB of datagrams; sleeping 50 us when it is full,
//! as the RoCE streams' pollers do): they send so much faster than one
//! receiver takes that the kernel would otherwise drop a large share.
//!
//! Neither std, socket2 nor rustix wraps these calls, so this is the
//! crate's one module with `unsafe` code. What it upholds: every pointer
//! handed to the kernel points into memory this call owns or borrows
//! (stack or `Vec`s not resized while the pointers live), with its
//! length beside it, and nothing is read beyond what the kernel reports
//! it wrote (the returned byte counts, `msg_controllen`, `msg_len`).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use super::ends::udp_pair;
use super::figures::{End, Moved, Start};
use crate::BenchResult;

/// Most datagrams in one GSO super-datagram (the kernel allows 64 and
/// more; 64 is what the probe used).
pub const MAX_SEGMENTS: usize = 64;
/// Most bytes in one GSO super-datagram (below the 65,507 a UDP/IPv4
/// datagram can carry).
pub const MAX_SUPER: usize = 65_000;
/// Datagrams per `sendmmsg`/`recvmmsg` call in the batched baseline.
pub const BATCH: usize = 32;
/// A GRO receive buffer: a whole coalesced datagram fits.
const GRO_BUF: usize = 64 << 10;

/// How far ahead of its receiver a ceiling's sender may run, in bytes:
/// half the receive buffer the kernel grants for the 4 MiB asked (it
/// doubles it), less its per-buffer overhead. Without it the sender
/// outruns the receiver and the kernel drops datagrams (tens of
/// thousands in a 256 MiB run at MTU 1024), costing sender CPU for
/// nothing; with it the same bytes arrive as were sent, as with RoCE's
/// window.
const WINDOW_BYTES: u64 = 2 << 20;

/// The sender's view of its receiver's progress.
#[derive(Default)]
struct Progress {
    /// Datagrams received so far.
    received: AtomicU64,
    /// The receiver has stopped (everything arrived, or 200 ms of
    /// silence after a loss).
    done: AtomicBool,
}

impl Progress {
    fn received(&self, n: u64) {
        self.received.store(n, Ordering::Release);
    }

    /// Waits (sleeping as the RoCE benchmark's pollers do) until sending
    /// up to datagram `upto` keeps at most `window` datagrams unreceived.
    fn wait_for_room(&self, upto: u64, window: u64) {
        while upto.saturating_sub(self.received.load(Ordering::Acquire)) > window
            && !self.done.load(Ordering::Acquire)
        {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

/// Datagrams of `datagram` bytes in one super-datagram.
pub fn segments_per_send(datagram: usize) -> usize {
    (MAX_SUPER / datagram.max(1)).clamp(1, MAX_SEGMENTS)
}

/// Datagrams in a coalesced buffer of `len` bytes whose `UDP_GRO`
/// control message said `segment` (0: none came, one datagram; the
/// last segment may be shorter than the others).
pub fn segments_in(len: usize, segment: usize) -> u64 {
    if segment == 0 {
        1
    } else {
        len.div_ceil(segment).max(1) as u64
    }
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// `setsockopt(fd, level, name, &val)` for an `int` option.
fn set_int_option(
    sock: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value points at `val` on this stack frame, with
    // its size; the descriptor is `sock`'s, open for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Streams `count` datagrams of `datagram` bytes from 127.0.0.1 to
/// 127.0.0.2 as GSO super-datagrams, received with `UDP_GRO`; the
/// receiver ends when all arrived or after 200 ms of silence.
pub(super) fn udp_stream_gso(count: u64, datagram: usize) -> BenchResult<Moved> {
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(io_err("local_addr"))?;
    set_int_option(
        &a,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        datagram as libc::c_int,
    )
    .map_err(io_err("UDP_SEGMENT"))?;
    set_int_option(&b, libc::SOL_UDP, libc::UDP_GRO, 1).map_err(io_err("UDP_GRO"))?;
    let per_send = segments_per_send(datagram);
    let ready = Arc::new(Barrier::new(2));
    let progress = Arc::new(Progress::default());
    let window = (WINDOW_BYTES / datagram as u64).max(per_send as u64);
    let receiver = {
        let ready = Arc::clone(&ready);
        let progress = Arc::clone(&progress);
        std::thread::spawn(move || -> BenchResult<(u64, u64, u64, Option<End>)> {
            let mut buf = vec![0u8; GRO_BUF];
            let (mut datagrams, mut bytes, mut receives, mut last) = (0u64, 0u64, 0u64, None);
            ready.wait();
            while datagrams < count {
                match recv_gro(&b, &mut buf) {
                    Ok((n, segment)) => {
                        last = Some(Instant::now());
                        datagrams += segments_in(n, segment);
                        progress.received(datagrams);
                        bytes += n as u64;
                        receives += 1;
                    }
                    Err(e) if is_timeout(&e) => break,
                    Err(e) => {
                        progress.done.store(true, Ordering::Release);
                        return Err(format!("recvmsg: {e}"));
                    }
                }
            }
            progress.done.store(true, Ordering::Release);
            Ok((datagrams, bytes, receives, last.map(End::after)))
        })
    };
    let msg = vec![0x5au8; per_send * datagram];
    ready.wait();
    let start = Start::now();
    let mut sent = 0u64;
    while sent < count {
        let k = (count - sent).min(per_send as u64) as usize;
        progress.wait_for_room(sent + k as u64, window);
        a.send_to(&msg[..k * datagram], b_addr)
            .map_err(io_err("send_to (UDP_SEGMENT)"))?;
        sent += k as u64;
    }
    let (datagrams, bytes, receives, end) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())??;
    Ok(Moved {
        datagrams,
        bytes,
        receives,
        start,
        end,
    })
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// One `recvmsg` into `buf`: (bytes, the `UDP_GRO` segment size or 0).
fn recv_gro(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, usize)> {
    // Room for one `int` control message and then some, aligned as
    // `cmsghdr` needs.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero bytes are a valid `msghdr` (integers and null
    // pointers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (into `buf`, with its length) and at
    // `control` (with its size), all alive and unaliased for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::other("a coalesced buffer was cut"));
    }
    let mut segment = 0usize;
    // SAFETY: the kernel set `msg_controllen` to what it wrote into
    // `control`; CMSG_FIRSTHDR/CMSG_NXTHDR stay within it, and a
    // UDP_GRO message's data is one `int` (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                segment = v.max(0) as usize;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, segment))
}

/// Streams `count` datagrams of `datagram` bytes from 127.0.0.1 to
/// 127.0.0.2, [`BATCH`] per `sendmmsg`, received by `recvmmsg`.
pub(super) fn udp_stream_batched(count: u64, datagram: usize) -> BenchResult<Moved> {
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(io_err("local_addr"))?;
    let ready = Arc::new(Barrier::new(2));
    let progress = Arc::new(Progress::default());
    // Each small datagram is its own socket buffer, charged its
    // overhead (~1 KiB) besides its bytes.
    let window = (WINDOW_BYTES / (datagram as u64 + 1024)).max(BATCH as u64);
    let receiver = {
        let ready = Arc::clone(&ready);
        let progress = Arc::clone(&progress);
        std::thread::spawn(move || -> BenchResult<(u64, u64, u64, Option<End>)> {
            let mut batch = MmsgBufs::new(datagram + 64);
            let (mut datagrams, mut bytes, mut receives, mut last) = (0u64, 0u64, 0u64, None);
            ready.wait();
            while datagrams < count {
                match batch.recv(&b) {
                    Ok(lens) => {
                        last = Some(Instant::now());
                        datagrams += lens.len() as u64;
                        progress.received(datagrams);
                        bytes += lens.iter().map(|&l| l as u64).sum::<u64>();
                        receives += 1;
                    }
                    Err(e) if is_timeout(&e) => break,
                    Err(e) => {
                        progress.done.store(true, Ordering::Release);
                        return Err(format!("recvmmsg: {e}"));
                    }
                }
            }
            progress.done.store(true, Ordering::Release);
            Ok((datagrams, bytes, receives, last.map(End::after)))
        })
    };
    let mut batch = MmsgBufs::new(datagram);
    ready.wait();
    let start = Start::now();
    let mut sent = 0u64;
    while sent < count {
        let k = (count - sent).min(BATCH as u64) as usize;
        progress.wait_for_room(sent + k as u64, window);
        sent += batch.send(&a, b_addr, k).map_err(io_err("sendmmsg"))? as u64;
    }
    let (datagrams, bytes, receives, end) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())??;
    Ok(Moved {
        datagrams,
        bytes,
        receives,
        start,
        end,
    })
}

/// [`BATCH`] buffers of one size and the `mmsghdr`s pointing at them.
struct MmsgBufs {
    len: usize,
    bufs: Vec<u8>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    lens: Vec<usize>,
}

impl MmsgBufs {
    fn new(len: usize) -> MmsgBufs {
        let mut bufs = vec![0x5au8; BATCH * len];
        let iovs: Vec<libc::iovec> = bufs
            .chunks_exact_mut(len)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr().cast(),
                iov_len: len,
            })
            .collect();
        // SAFETY: all-zero bytes are a valid `mmsghdr`.
        let hdrs = vec![unsafe { std::mem::zeroed::<libc::mmsghdr>() }; BATCH];
        MmsgBufs {
            len,
            bufs,
            iovs,
            hdrs,
            lens: Vec::with_capacity(BATCH),
        }
    }

    /// Points header `i` at buffer `i` (and at `name`, if any).
    fn aim(&mut self, n: usize, name: Option<&mut libc::sockaddr_in>) {
        let name = name.map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_in).cast::<libc::c_void>()
        });
        for i in 0..n {
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = name;
            h.msg_hdr.msg_namelen = if name.is_null() {
                0
            } else {
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
            };
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        debug_assert_eq!(self.bufs.len(), BATCH * self.len);
    }

    /// Sends `n` (at most [`BATCH`]) datagrams to `to` (IPv4); returns
    /// how many the kernel took.
    fn send(&mut self, sock: &UdpSocket, to: SocketAddr, n: usize) -> io::Result<usize> {
        let SocketAddr::V4(to) = to else {
            return Err(io::Error::other("IPv4 only"));
        };
        // SAFETY: all-zero bytes are a valid `sockaddr_in`.
        let mut name: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        name.sin_family = libc::AF_INET as libc::sa_family_t;
        name.sin_port = to.port().to_be();
        name.sin_addr.s_addr = u32::from_ne_bytes(to.ip().octets());
        let n = n.min(BATCH);
        self.aim(n, Some(&mut name));
        // SAFETY: the first `n` headers point at `name` on this stack
        // frame and at this batch's iovecs and buffers, all alive and
        // unaliased for the call.
        let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), self.hdrs.as_mut_ptr(), n as _, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Receives up to [`BATCH`] datagrams, blocking (under the socket's
    /// read timeout) for the first only; returns their lengths.
    fn recv(&mut self, sock: &UdpSocket) -> io::Result<&[usize]> {
        self.aim(BATCH, None);
        // SAFETY: every header points at this batch's iovecs and buffers
        // (no name, no control), alive and unaliased for the call; no
        // timeout pointer.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                BATCH as _,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.lens.clear();
        self.lens.extend(
            self.hdrs[..r as usize]
                .iter()
                .map(|h| (h.msg_len as usize).min(self.len)),
        );
        Ok(&self.lens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn super_datagrams_hold_whole_packets_within_the_limits() {
        // MTU 4096: 4112-byte packets, 15 to a 61,680-byte super-datagram.
        assert_eq!(segments_per_send(4112), 15);
        // MTU 1024: 1040-byte packets, 62 (64,480 bytes).
        assert_eq!(segments_per_send(1040), 62);
        // Small datagrams: at most 64.
        assert_eq!(segments_per_send(80), MAX_SEGMENTS);
        // Larger than the limit: one a send.
        assert_eq!(segments_per_send(70_000), 1);
        for d in [80, 1040, 4112, 9000] {
            let k = segments_per_send(d);
            assert!(k * d <= MAX_SUPER && k <= MAX_SEGMENTS);
        }
    }

    #[test]
    fn a_coalesced_buffer_counts_its_segments_the_last_one_short() {
        assert_eq!(segments_in(15 * 4112, 4112), 15);
        assert_eq!(segments_in(14 * 4112 + 100, 4112), 15);
        assert_eq!(segments_in(4112, 4112), 1);
        // No UDP_GRO message: one datagram, whatever its length.
        assert_eq!(segments_in(4112, 0), 1);
        assert_eq!(segments_in(80, 0), 1);
    }

    /// The ceiling moves exactly the datagrams and bytes sent: three full
    /// super-datagrams of 62 and one of 14 at MTU 1024, then at MTU 4096
    /// a count whose last send is a single plain datagram (no GSO, no
    /// UDP_GRO message on it). Few enough to fit the socket buffer, so
    /// nothing may be lost.
    #[test]
    fn gso_and_gro_move_exactly_what_was_sent() {
        for (count, datagram) in [(200u64, 1040usize), (31, 4112)] {
            let m = udp_stream_gso(count, datagram).expect("GSO stream");
            assert_eq!(m.datagrams, count, "datagram {datagram}");
            assert_eq!(m.bytes, count * datagram as u64, "datagram {datagram}");
            // Whole super-datagrams arrived, not datagrams one by one
            // (loopback delivers them unsegmented to a UDP_GRO socket).
            let sends = count.div_ceil(segments_per_send(datagram) as u64);
            assert_eq!(m.receives, sends, "datagram {datagram}");
            assert!(m.end.is_some());
        }
    }

    #[test]
    fn batched_calls_move_exactly_what_was_sent() {
        let count = 1000u64;
        let m = udp_stream_batched(count, 80).expect("batched stream");
        assert_eq!(m.datagrams, count);
        assert_eq!(m.bytes, count * 80);
        assert_eq!(m.lost(count), 0);
        assert!(m.receives >= count.div_ceil(BATCH as u64));
    }
}
