//! Several datagrams per system call: `recvmmsg(2)` over a port's socket.
//!
//! Neither `rustix` (1.x lists it as not implemented) nor `socket2` wraps
//! `recvmmsg`, and `std` has no batched receive, so this module calls
//! `libc::recvmmsg` itself. `nix::sys::socket::recvmmsg` does wrap it, and
//! was tried (issue 27): with headers preallocated per address family it
//! gave the same ping-pong latency, but under a flood of junk datagrams
//! (`ibal perf send-lat --flood --iters 5000`, alternated in the same
//! minutes) the build with nix missed the 2x target in 9 of 16 runs against
//! 4 of 16 for this code and 3 of 8 for the same build with this code back:
//! its per-call and per-result work (headers re-pointed, each result's
//! address converted) costs most when nearly every datagram is junk, which
//! is the case this path exists to survive. It is the
//! only place in the crate with `unsafe` code; the rest of the crate stays
//! `deny(unsafe_code)`. What it must uphold: every pointer handed to the
//! kernel points into memory owned by this call's stack frame or by the
//! [`RecvBatch`] borrowed mutably for the call, with the lengths given
//! alongside, and nothing is read back beyond what the kernel reports it
//! wrote (`msg_len`, `msg_namelen`).
//!
//! On other systems [`RecvBatch::recv`] takes one datagram per call with
//! `std` (the caller loops).
#![allow(unsafe_code)]
// Under the model checker the system calls are not made (`fake_net`).
#![cfg_attr(ibal_loom, allow(dead_code))]

use std::net::SocketAddr;
#[cfg(not(ibal_loom))]
use std::net::UdpSocket;

#[cfg(ibal_loom)]
use crate::port::UdpSocket;

/// Buffers for up to `count` datagrams of up to `len` bytes each, and
/// what the last [`RecvBatch::recv`] put there.
pub(crate) struct RecvBatch {
    len: usize,
    bufs: Vec<u8>,
    got: Vec<Received>,
    /// The system call's headers, set up once and kept from call to call
    /// (zeroing them anew cost every empty poll ~7 KiB of stores, and
    /// setting their pointers anew ~400 stores).
    #[cfg(target_os = "linux")]
    sys: Sys,
}

/// `recvmmsg`'s headers: one `mmsghdr`, `iovec` and `sockaddr_storage`
/// per datagram, pointing at each other and at the datagram buffers.
/// Everything pointed at lives in heap blocks of `Vec`s that are never
/// resized after [`Sys::new`], so moving the batch does not move them and
/// the pointers stay valid for the batch's life.
#[cfg(target_os = "linux")]
struct Sys {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    /// Headers the kernel wrote in the last call (their `msg_namelen` and
    /// `msg_flags` must be reset before the next).
    written: usize,
}

#[cfg(target_os = "linux")]
impl Sys {
    /// Headers for the `count` chunks of `len` bytes of `bufs`.
    fn new(bufs: &mut [u8], count: usize, len: usize) -> Sys {
        // SAFETY: all-zero bytes are a valid value of these plain C
        // structs (integers and null pointers).
        let (hdr, iov, name) = unsafe {
            (
                std::mem::zeroed::<libc::mmsghdr>(),
                std::mem::zeroed::<libc::iovec>(),
                std::mem::zeroed::<libc::sockaddr_storage>(),
            )
        };
        let mut sys = Sys {
            hdrs: vec![hdr; count],
            iovs: vec![iov; count],
            names: vec![name; count],
            written: 0,
        };
        let Sys {
            hdrs, iovs, names, ..
        } = &mut sys;
        for (i, chunk) in bufs.chunks_exact_mut(len.max(1)).take(count).enumerate() {
            iovs[i].iov_base = chunk.as_mut_ptr().cast();
            iovs[i].iov_len = len;
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
        }
        sys.reset(count);
        sys
    }

    /// Makes the first `n` headers ready for the kernel again: the name
    /// length it overwrote and the flags it set.
    fn reset(&mut self, n: usize) {
        for h in self.hdrs.iter_mut().take(n) {
            h.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
    }
}

/// One received datagram.
#[derive(Clone, Copy, Debug)]
struct Received {
    /// Bytes in the buffer (at most the buffer's length).
    n: usize,
    from: Option<SocketAddr>,
    /// The datagram was longer than the buffer and was cut.
    truncated: bool,
}

/// A datagram of the last [`RecvBatch::recv`].
#[derive(Debug)]
pub(crate) struct Datagram<'a> {
    /// Its bytes (cut to the buffer when `truncated`).
    pub(crate) bytes: &'a [u8],
    /// The sender (`None`: an address family other than IPv4 or IPv6).
    pub(crate) from: Option<SocketAddr>,
    /// Longer than the buffer: the kernel cut it.
    pub(crate) truncated: bool,
}

/// Most datagrams one batch takes.
pub(crate) const MAX_BATCH: usize = 32;

impl RecvBatch {
    /// Room for `count` (at most [`MAX_BATCH`]) datagrams of `len` bytes.
    pub(crate) fn new(count: usize, len: usize) -> RecvBatch {
        let count = count.clamp(1, MAX_BATCH);
        let mut bufs = vec![0; count * len];
        #[cfg(target_os = "linux")]
        let sys = Sys::new(&mut bufs, count, len);
        RecvBatch {
            len,
            bufs,
            got: Vec::with_capacity(count),
            #[cfg(target_os = "linux")]
            sys,
        }
    }

    /// How many datagrams a call takes at most.
    pub(crate) fn capacity(&self) -> usize {
        self.bufs.len() / self.len.max(1)
    }

    /// The `i`-th datagram of the last [`RecvBatch::recv`].
    pub(crate) fn get(&self, i: usize) -> Option<Datagram<'_>> {
        let r = self.got.get(i)?;
        let at = i * self.len;
        Some(Datagram {
            bytes: &self.bufs[at..at + r.n],
            from: r.from,
            truncated: r.truncated,
        })
    }

    /// Receives up to `max` datagrams (at most the capacity) from `socket`.
    /// `wait`: block (within the socket's read timeout) until one arrives,
    /// then take what else is queued without waiting (`MSG_WAITFORONE`);
    /// otherwise only what is already queued (`MSG_DONTWAIT`; the socket
    /// itself stays blocking). Returns how many datagrams there are (0: none,
    /// a timeout, or an error).
    pub(crate) fn recv(&mut self, socket: &UdpSocket, max: usize, wait: bool) -> usize {
        self.got.clear();
        let max = max.min(self.capacity());
        if max == 0 {
            return 0;
        }
        #[cfg(all(target_os = "linux", not(ibal_loom)))]
        if max == 1 && !wait {
            self.recv_one(socket);
            return self.got.len();
        }
        self.recv_sys(socket, max, wait);
        self.got.len()
    }

    /// One datagram without waiting, by `recvfrom` (safe, through rustix):
    /// the kernel's `recvmmsg` costs more per call even for one message
    /// (its header array in and out), and a polling thread asks for one
    /// at a time in a ping-pong.
    #[cfg(all(target_os = "linux", not(ibal_loom)))]
    fn recv_one(&mut self, socket: &UdpSocket) {
        use rustix::net::{recvfrom, RecvFlags};
        let len = self.len;
        let flags = RecvFlags::DONTWAIT | RecvFlags::TRUNC;
        let Ok((n, full, from)) = recvfrom(socket, &mut self.bufs[..len], flags) else {
            return; // nothing queued, or an error
        };
        self.got.push(Received {
            n,
            from: from.and_then(|a| SocketAddr::try_from(a).ok()),
            // TRUNC: the datagram's real length, which may exceed the buffer.
            truncated: full > len,
        });
    }

    #[cfg(all(target_os = "linux", not(ibal_loom)))]
    fn recv_sys(&mut self, socket: &UdpSocket, max: usize, wait: bool) {
        use std::os::fd::AsRawFd;
        let len = self.len;
        let written = std::mem::take(&mut self.sys.written);
        // A failed call may still have written the first header.
        self.sys.reset(written.max(1));
        let Sys { hdrs, names, .. } = &mut self.sys;
        let flags = if wait {
            libc::MSG_WAITFORONE
        } else {
            libc::MSG_DONTWAIT
        };
        // SAFETY: `hdrs[..max]` (max <= their length, the capacity) were
        // set up by `Sys::new`: each names one iovec of the batch's
        // `iovs`, covering a distinct `len`-byte chunk of `self.bufs`, and
        // one `sockaddr_storage` of `names`, and has no control buffer.
        // Those heap blocks are owned by `self`, never resized (so the
        // pointers are still valid), and borrowed mutably for this call;
        // `reset` gave every header the kernel wrote last time back its
        // true name length. The kernel uses them only during the call.
        // The timeout may be null.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                hdrs.as_mut_ptr(),
                max as _,
                flags as _,
                std::ptr::null_mut(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return; // -1: nothing queued, a timeout, or an error
        };
        let n = n.min(max);
        for (h, name) in hdrs.iter().zip(names.iter()).take(n) {
            let from = sockaddr(name, h.msg_hdr.msg_namelen);
            self.got.push(Received {
                n: (h.msg_len as usize).min(len),
                from,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            });
        }
        self.sys.written = n;
    }

    /// The fake network's queue: one datagram (waiting for it if
    /// `wait`), then what else is queued, up to `max` (`MSG_WAITFORONE`).
    #[cfg(ibal_loom)]
    fn recv_sys(&mut self, socket: &UdpSocket, max: usize, wait: bool) {
        let len = self.len;
        while self.got.len() < max {
            let first = self.got.is_empty();
            let Some((bytes, from)) = socket.take(wait && first) else {
                return;
            };
            let (i, n) = (self.got.len(), bytes.len().min(len));
            self.bufs[i * len..i * len + n].copy_from_slice(&bytes[..n]);
            self.got.push(Received {
                n,
                from: Some(from),
                truncated: bytes.len() > len,
            });
        }
    }

    #[cfg(all(not(target_os = "linux"), not(ibal_loom)))]
    fn recv_sys(&mut self, socket: &UdpSocket, _max: usize, wait: bool) {
        let len = self.len;
        if socket.set_nonblocking(!wait).is_err() {
            return;
        }
        let r = socket.recv_from(&mut self.bufs[..len]);
        let _ = socket.set_nonblocking(false);
        if let Ok((n, from)) = r {
            self.got.push(Received {
                n: n.min(len),
                from: Some(from),
                truncated: false,
            });
        }
    }
}

/// The IPv4 or IPv6 address the kernel wrote into `name` (`len` bytes).
#[cfg(target_os = "linux")]
fn sockaddr(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    let len = len as usize;
    match i32::from(name.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the kernel wrote a `sockaddr_in` (family AF_INET, and
            // at least its size) at the start of the storage, which is
            // larger and at least as aligned.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((name as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, a `sockaddr_in6`.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((name as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                u32::from_be(a.sin6_flowinfo),
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pair(ip: &str) -> Option<(UdpSocket, UdpSocket)> {
        let a = UdpSocket::bind((ip, 0)).ok()?;
        let b = UdpSocket::bind((ip, 0)).ok()?;
        b.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        Some((a, b))
    }

    /// Sends `msgs` from `a` to `b`. Loopback delivers within `send_to`,
    /// so they are queued at `b` when this returns.
    fn send_all(a: &UdpSocket, b: &UdpSocket, msgs: &[&[u8]]) {
        let to = b.local_addr().unwrap();
        for m in msgs {
            a.send_to(m, to).unwrap();
        }
    }

    #[test]
    fn several_queued_datagrams_in_one_call_in_order() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let msgs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 10 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        send_all(&a, &b, &refs);
        let mut batch = RecvBatch::new(8, 64);
        let n = batch.recv(&b, 8, false);
        assert_eq!(n, 5);
        for (i, m) in msgs.iter().enumerate() {
            let d = batch.get(i).unwrap();
            assert_eq!(d.bytes, m.as_slice());
            assert_eq!(d.from, Some(a.local_addr().unwrap()));
            assert!(!d.truncated);
        }
        assert!(batch.get(5).is_none());
        // Nothing left: a non-blocking call returns at once with none.
        assert_eq!(batch.recv(&b, 8, false), 0);
        assert!(batch.get(0).is_none());
    }

    /// The headers are set up once: after a call that filled slots (one
    /// cut, so flagged), a move of the batch and more calls, every slot
    /// still reads the right bytes, sender and flags.
    #[test]
    fn headers_set_up_once_survive_reuse_and_moves() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let long = [7u8; 40];
        send_all(&a, &b, &[&long, b"short"]);
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(batch.recv(&b, 4, false), 2);
        assert!(batch.get(0).unwrap().truncated);
        assert_eq!(batch.get(1).unwrap().bytes, b"short");
        assert_eq!(batch.recv(&b, 4, false), 0);
        let mut moved = Box::new(batch);
        let batch = &mut *moved;
        for round in 0..3u8 {
            let msgs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![round * 4 + i; 16]).collect();
            let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
            send_all(&a, &b, &refs);
            assert_eq!(batch.recv(&b, 4, true), 4);
            for (i, m) in msgs.iter().enumerate() {
                let d = batch.get(i).unwrap();
                assert_eq!(d.bytes, m.as_slice(), "round {round} slot {i}");
                assert_eq!(d.from, Some(a.local_addr().unwrap()));
                assert!(!d.truncated, "round {round} slot {i} kept an old flag");
            }
        }
    }

    #[test]
    fn at_most_max_and_the_rest_stays_queued() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let refs: Vec<&[u8]> = vec![b"one", b"two", b"three"];
        send_all(&a, &b, &refs);
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(batch.recv(&b, 2, false), 2);
        assert_eq!(batch.get(1).unwrap().bytes, b"two");
        assert_eq!(batch.recv(&b, 4, true), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"three");
    }

    #[test]
    fn a_datagram_longer_than_the_buffer_is_cut_and_flagged() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let long = vec![7u8; 100];
        send_all(&a, &b, &[&long, b"short"]);
        let mut batch = RecvBatch::new(4, 32);
        assert_eq!(batch.recv(&b, 4, false), 2);
        let d = batch.get(0).unwrap();
        assert!(d.truncated);
        assert_eq!(d.bytes, &long[..32]);
        let d = batch.get(1).unwrap();
        assert!(!d.truncated);
        assert_eq!(d.bytes, b"short");
    }

    /// One at a time without waiting (a poller's `recvfrom`): the same
    /// bytes, sender and truncation flag as a batch, oldest first, and
    /// nothing (at once) when nothing is queued.
    #[test]
    fn one_at_a_time_reads_as_a_batch_does() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let long = [9u8; 40];
        send_all(&a, &b, &[&long, b"", b"short"]);
        let mut batch = RecvBatch::new(4, 16);
        let from = Some(a.local_addr().unwrap());
        assert_eq!(batch.recv(&b, 1, false), 1);
        let d = batch.get(0).unwrap();
        assert!(d.truncated);
        assert_eq!((d.bytes, d.from), (&long[..16], from));
        assert!(batch.get(1).is_none());
        assert_eq!(batch.recv(&b, 1, false), 1);
        let d = batch.get(0).unwrap();
        assert_eq!((d.bytes, d.from, d.truncated), (&b""[..], from, false));
        assert_eq!(batch.recv(&b, 1, false), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"short");
        assert!(!batch.get(0).unwrap().truncated);
        let t0 = std::time::Instant::now();
        assert_eq!(batch.recv(&b, 1, false), 0, "nothing queued");
        assert!(t0.elapsed() < Duration::from_millis(400), "it did not wait");
        assert!(batch.get(0).is_none());
    }

    #[test]
    fn an_empty_datagram_is_a_datagram() {
        let (a, b) = pair("127.0.0.1").unwrap();
        send_all(&a, &b, &[b""]);
        let mut batch = RecvBatch::new(2, 16);
        assert_eq!(batch.recv(&b, 2, true), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"");
    }

    #[test]
    fn waiting_blocks_until_one_arrives_or_the_timeout() {
        let (a, b) = pair("127.0.0.1").unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut batch = RecvBatch::new(4, 16);
        let t0 = std::time::Instant::now();
        assert_eq!(batch.recv(&b, 4, true), 0, "nothing came");
        assert!(t0.elapsed() >= Duration::from_millis(15));
        let to = b.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.send_to(b"late", to).unwrap();
        });
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(batch.recv(&b, 4, true), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"late");
        sender.join().unwrap();
    }

    #[test]
    fn ipv6_sources() {
        let Some((a, b)) = pair("::1") else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        send_all(&a, &b, &[b"six", b"again"]);
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(batch.recv(&b, 4, false), 2);
        for (i, m) in [&b"six"[..], b"again"].iter().enumerate() {
            let d = batch.get(i).unwrap();
            assert_eq!(d.bytes, *m);
            assert_eq!(d.from, Some(a.local_addr().unwrap()));
        }
    }
}
