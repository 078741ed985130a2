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
//! With `UDP_GRO` on the socket ([`enable_gro`]; issue 31) the kernel may
//! hand over several datagrams of one flow coalesced into one buffer, and
//! says so in a `SOL_UDP`/`UDP_GRO` control message: the size of each
//! segment (the last may be shorter). A batch made for such a socket
//! ([`RecvBatch::with_gro`]) has slots large enough for a whole coalesced
//! buffer and a control buffer per slot, and [`Datagram::segments`] cuts
//! each buffer back into its packets.
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
    /// Made for a socket with `UDP_GRO` on: the kernel's control message
    /// is read with every datagram.
    gro: bool,
    /// The system call's headers, set up once and kept from call to call
    /// (zeroing them anew cost every empty poll ~7 KiB of stores, and
    /// setting their pointers anew ~400 stores).
    #[cfg(target_os = "linux")]
    sys: Sys,
}

/// `recvmmsg`'s headers: one `mmsghdr`, `iovec` and `sockaddr_storage`
/// per datagram (and with GRO one control buffer), pointing at each other
/// and at the datagram buffers. Everything pointed at lives in heap blocks
/// of `Vec`s that are never resized after [`Sys::new`], so moving the
/// batch does not move them and the pointers stay valid for the batch's
/// life.
#[cfg(target_os = "linux")]
struct Sys {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    /// One per header with GRO, none without (no control buffer: the
    /// kernel writes no control message).
    controls: Vec<Control>,
    /// Headers the kernel wrote in the last call (their `msg_namelen` and
    /// `msg_flags` must be reset before the next).
    written: usize,
}

/// A control buffer: room for one `cmsghdr` and its `int` (the GRO
/// segment size; `CMSG_SPACE(4)` is 24 bytes on 64-bit Linux, 16 on
/// 32-bit), aligned as a `cmsghdr` must be. The socket enables no other
/// control message.
#[cfg(target_os = "linux")]
type Control = [u64; 4];

#[cfg(target_os = "linux")]
impl Sys {
    /// Headers for the `count` chunks of `len` bytes of `bufs`, each with
    /// a control buffer if `gro`.
    fn new(bufs: &mut [u8], count: usize, len: usize, gro: bool) -> Sys {
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
            controls: vec![[0; 4]; if gro { count } else { 0 }],
            written: 0,
        };
        let Sys {
            hdrs,
            iovs,
            names,
            controls,
            ..
        } = &mut sys;
        for (i, chunk) in bufs.chunks_exact_mut(len.max(1)).take(count).enumerate() {
            iovs[i].iov_base = chunk.as_mut_ptr().cast();
            iovs[i].iov_len = len;
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = match controls.get_mut(i) {
                Some(c) => c.as_mut_ptr().cast(),
                None => std::ptr::null_mut(),
            };
            h.msg_controllen = 0;
        }
        sys.reset(count);
        sys
    }

    /// Makes the first `n` headers ready for the kernel again: the name
    /// and control lengths it overwrote and the flags it set.
    fn reset(&mut self, n: usize) {
        let control = if self.controls.is_empty() {
            0
        } else {
            std::mem::size_of::<Control>()
        };
        for h in self.hdrs.iter_mut().take(n) {
            h.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = control as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
    }
}

/// The segment size of a coalesced buffer, from the `SOL_UDP`/`UDP_GRO`
/// control message the kernel wrote into `h`'s control buffer (0: none,
/// the buffer is one datagram).
#[cfg(target_os = "linux")]
fn gro_segment_size(h: &libc::msghdr) -> usize {
    if h.msg_control.is_null() {
        return 0;
    }
    let want = std::mem::size_of::<libc::c_int>() as libc::c_uint;
    // SAFETY: `h` is a header of a `Sys`, after a call that succeeded:
    // `msg_control` points at its own `Control` buffer and the kernel set
    // `msg_controllen` to what it wrote there, at most the buffer's size
    // (`reset`). `CMSG_FIRSTHDR` and `CMSG_NXTHDR` return only headers that
    // lie wholly within `msg_control[..msg_controllen]` (or null), and the
    // `int` is read (unaligned) only from a message whose `cmsg_len` says
    // it holds one.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let m = &*c;
            if m.cmsg_level == libc::SOL_UDP
                && m.cmsg_type == libc::UDP_GRO
                && m.cmsg_len as usize >= libc::CMSG_LEN(want) as usize
            {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(size).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// Turns `UDP_GRO` on for `socket`: the kernel may then coalesce datagrams
/// of one flow into one buffer (and must be read with a [`RecvBatch`] made
/// [`RecvBatch::with_gro`]). Returns whether the kernel took it (it needs
/// Linux 5.0).
#[cfg(all(target_os = "linux", not(ibal_loom)))]
pub(crate) fn enable_gro(socket: &UdpSocket) -> bool {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: `socket` is an open socket for the call's length (borrowed),
    // and the option value is a live `int` whose size is passed with it;
    // the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// No GRO off Linux, nor under the model checker (`fake_net`).
#[cfg(any(not(target_os = "linux"), ibal_loom))]
pub(crate) fn enable_gro(_socket: &UdpSocket) -> bool {
    false
}

/// One received datagram.
#[derive(Clone, Copy, Debug)]
struct Received {
    /// Bytes in the buffer (at most the buffer's length).
    n: usize,
    from: Option<SocketAddr>,
    /// The datagram was longer than the buffer and was cut.
    truncated: bool,
    /// GRO: the size of each segment of the coalesced buffer (0: not
    /// coalesced).
    segment_size: usize,
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
    /// GRO: the segment size the kernel reported (0: not coalesced).
    segment_size: usize,
}

impl<'a> Datagram<'a> {
    /// Its packets: a buffer the kernel coalesced (GRO) cut by the segment
    /// size it reported, in order, the last possibly shorter; otherwise
    /// the whole datagram, one packet. Never none (an empty datagram is
    /// one empty packet).
    pub(crate) fn segments(&self) -> Segments<'a> {
        Segments {
            rest: self.bytes,
            size: self.segment_size,
            index: 0,
            truncated: self.truncated,
            done: false,
        }
    }
}

/// One packet of a [`Datagram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment<'a> {
    /// Its bytes.
    pub(crate) bytes: &'a [u8],
    /// Its place in the coalesced buffer, from 0: the IPv4 identification
    /// a GSO sender's kernel gave it (0 for a datagram not coalesced).
    pub(crate) index: u16,
    /// The kernel cut the buffer within or before the end of this packet
    /// (only ever the last).
    pub(crate) truncated: bool,
}

/// The packets of a [`Datagram`] ([`Datagram::segments`]).
#[derive(Debug, Clone)]
pub(crate) struct Segments<'a> {
    rest: &'a [u8],
    /// The segment size; 0: the datagram is one packet.
    size: usize,
    index: u16,
    truncated: bool,
    done: bool,
}

impl<'a> Iterator for Segments<'a> {
    type Item = Segment<'a>;

    fn next(&mut self) -> Option<Segment<'a>> {
        if self.done {
            return None;
        }
        let index = self.index;
        // A segment size of 0 (which no kernel reports) cannot cut
        // anything: the buffer is taken as one packet, which the receive
        // stage drops as oversized if it is longer than one can be.
        if self.size == 0 || self.rest.len() <= self.size {
            self.done = true;
            return Some(Segment {
                bytes: self.rest,
                index,
                truncated: self.truncated,
            });
        }
        let (bytes, rest) = self.rest.split_at(self.size);
        self.rest = rest;
        // At most 65,535 segments (a buffer of at most 65,536 bytes, each
        // at least one): the index never saturates in practice.
        self.index = self.index.saturating_add(1);
        Some(Segment {
            bytes,
            index,
            truncated: false,
        })
    }
}

/// Most datagrams one batch takes.
pub(crate) const MAX_BATCH: usize = 32;

/// A slot of a batch made [`RecvBatch::with_gro`]: a whole coalesced
/// buffer (a UDP payload is at most 65,527 bytes; a smaller slot would
/// have the kernel cut a coalesced buffer and lose its tail).
pub(crate) const GRO_SLOT: usize = 1 << 16;

impl RecvBatch {
    /// Room for `count` (at most [`MAX_BATCH`]) datagrams of `len` bytes,
    /// from a socket without GRO.
    pub(crate) fn new(count: usize, len: usize) -> RecvBatch {
        RecvBatch::build(count, len, false)
    }

    /// Room for `count` (at most [`MAX_BATCH`]) coalesced buffers of
    /// [`GRO_SLOT`] bytes, and the kernel's word on how each is cut: for a
    /// socket with `UDP_GRO` on ([`enable_gro`]).
    pub(crate) fn with_gro(count: usize) -> RecvBatch {
        RecvBatch::build(count, GRO_SLOT, true)
    }

    fn build(count: usize, len: usize, gro: bool) -> RecvBatch {
        let count = count.clamp(1, MAX_BATCH);
        let mut bufs = vec![0; count * len];
        #[cfg(target_os = "linux")]
        let sys = Sys::new(&mut bufs, count, len, gro);
        RecvBatch {
            len,
            bufs,
            got: Vec::with_capacity(count),
            gro,
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
            segment_size: r.segment_size,
        })
    }

    /// Whether the last [`RecvBatch::recv`] took `n` = 1 datagram that
    /// is one packet (not a coalesced buffer of several).
    pub(crate) fn lone_packet(&self, n: usize) -> bool {
        n == 1 && self.get(0).is_some_and(|d| d.segments().nth(1).is_none())
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
            if self.gro {
                self.recv_one_gro(socket);
            } else {
                self.recv_one(socket);
            }
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
            segment_size: 0,
        });
    }

    /// One datagram or coalesced buffer without waiting, on a socket with
    /// GRO: `recvfrom` cannot read the control message that says how a
    /// coalesced buffer is cut, so `recvmsg` with the first slot's header
    /// (still one system call, with no header array to copy in and out).
    #[cfg(all(target_os = "linux", not(ibal_loom)))]
    fn recv_one_gro(&mut self, socket: &UdpSocket) {
        use std::os::fd::AsRawFd;
        let len = self.len;
        let written = std::mem::take(&mut self.sys.written);
        self.sys.reset(written.max(1));
        let Sys {
            hdrs,
            names,
            written,
            ..
        } = &mut self.sys;
        let h = &mut hdrs[0].msg_hdr;
        // SAFETY: `h` is the first header `Sys::new` set up (a batch has
        // at least one): it names one iovec covering the first `len`-byte
        // chunk of `self.bufs`, the first `sockaddr_storage` and, with
        // GRO, the first control buffer, all in heap blocks owned by
        // `self` (never resized; borrowed mutably for this call), with
        // their true lengths (`reset`). The kernel uses them only during
        // the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), h, libc::MSG_DONTWAIT) };
        let Ok(n) = usize::try_from(n) else {
            return; // -1: nothing queued, or an error
        };
        *written = 1;
        self.got.push(Received {
            n: n.min(len),
            from: sockaddr(&names[0], h.msg_namelen),
            truncated: h.msg_flags & libc::MSG_TRUNC != 0,
            segment_size: gro_segment_size(h),
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
        // one `sockaddr_storage` of `names`, and (with GRO) one `Control`
        // buffer of `controls`, or none.
        // Those heap blocks are owned by `self`, never resized (so the
        // pointers are still valid), and borrowed mutably for this call;
        // `reset` gave every header the kernel wrote last time back its
        // true name and control lengths. The kernel uses them only during the call.
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
                segment_size: gro_segment_size(&h.msg_hdr),
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
                segment_size: 0,
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
                segment_size: 0,
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

    /// Sends `payload` from `a` to `to` as one GSO super-datagram
    /// (`UDP_SEGMENT` = `seg`): the kernel cuts it into `seg`-byte
    /// datagrams (the last shorter), or on loopback hands it whole to a
    /// receiver with `UDP_GRO`.
    fn send_gso(a: &UdpSocket, to: SocketAddr, payload: &[u8], seg: u16) {
        let seg = usize::from(seg);
        let m = crate::gso::Message {
            to,
            start: 0,
            len: payload.len(),
            seg,
            segments: payload.len().div_ceil(seg),
        };
        let sent = crate::gso::send_messages(a, payload, &[m]);
        assert_eq!(sent.unwrap(), 1, "one super-datagram sent");
    }

    /// `n` packets of `seg` bytes (the last `last`), each a distinct byte
    /// pattern, back to back.
    fn packets(n: usize, seg: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let len = if i + 1 == n { last } else { seg };
                (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
            })
            .collect()
    }

    /// A receiver with GRO on.
    fn gro_pair() -> (UdpSocket, UdpSocket) {
        let (a, b) = pair("127.0.0.1").unwrap();
        assert!(enable_gro(&b), "UDP_GRO refused (Linux 5.0+)");
        (a, b)
    }

    #[test]
    fn a_gso_super_datagram_is_one_gro_buffer_cut_back_into_its_packets() {
        let (a, b) = gro_pair();
        let pkts = packets(7, 1100, 333);
        send_gso(&a, b.local_addr().unwrap(), &pkts.concat(), 1100);
        let mut batch = RecvBatch::with_gro(4);
        assert_eq!(batch.recv(&b, 4, true), 1, "one coalesced buffer");
        assert!(!batch.lone_packet(1));
        let d = batch.get(0).unwrap();
        assert_eq!(d.from, Some(a.local_addr().unwrap()));
        assert!(!d.truncated);
        let segs: Vec<Segment<'_>> = d.segments().collect();
        assert_eq!(segs.len(), pkts.len());
        for (k, (s, p)) in segs.iter().zip(&pkts).enumerate() {
            assert_eq!(usize::from(s.index), k);
            assert_eq!(s.bytes, p.as_slice(), "packet {k}");
            assert!(!s.truncated);
        }
        // The lone-datagram path (`recvmsg`) reads the segment size too.
        send_gso(&a, b.local_addr().unwrap(), &pkts.concat(), 1100);
        assert_eq!(batch.recv(&b, 1, false), 1);
        let d = batch.get(0).unwrap();
        let got: Vec<(u16, &[u8])> = d.segments().map(|s| (s.index, s.bytes)).collect();
        let want: Vec<(u16, &[u8])> = (0..).zip(pkts.iter().map(|p| p.as_slice())).collect();
        assert_eq!(got, want);
        assert_eq!(batch.recv(&b, 4, false), 0, "nothing left");
    }

    #[test]
    fn without_gro_the_kernel_delivers_the_segments_one_by_one() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let pkts = packets(5, 300, 17);
        send_gso(&a, b.local_addr().unwrap(), &pkts.concat(), 300);
        let mut batch = RecvBatch::new(8, 2048);
        assert_eq!(batch.recv(&b, 8, true), 5);
        for (i, p) in pkts.iter().enumerate() {
            let d = batch.get(i).unwrap();
            assert_eq!(d.bytes, p.as_slice());
            assert_eq!(d.from, Some(a.local_addr().unwrap()));
            let segs: Vec<_> = d.segments().collect();
            assert_eq!(segs.len(), 1);
            assert_eq!(segs[0].index, 0);
        }
    }

    /// Plain datagrams on a GRO socket are one packet each, at index 0,
    /// through both paths; buffers and plain datagrams mix in one batch,
    /// and the slots (and their control buffers) are reused correctly.
    #[test]
    fn plain_datagrams_and_coalesced_buffers_mix_on_a_gro_socket() {
        let (a, b) = gro_pair();
        let to = b.local_addr().unwrap();
        let mut batch = RecvBatch::with_gro(4);
        for round in 0..3u8 {
            a.send_to(&[round; 40], to).unwrap();
            let pkts = packets(3, 64, 64);
            send_gso(&a, to, &pkts.concat(), 64);
            a.send_to(b"tail", to).unwrap();
            assert_eq!(batch.recv(&b, 4, true), 3, "round {round}");
            let d0: Vec<_> = batch.get(0).unwrap().segments().collect();
            assert_eq!(
                (d0.len(), d0[0].index, d0[0].bytes),
                (1, 0, &[round; 40][..])
            );
            let d1: Vec<_> = batch.get(1).unwrap().segments().map(|s| s.bytes).collect();
            assert_eq!(d1, pkts.iter().map(|p| p.as_slice()).collect::<Vec<_>>());
            let d2: Vec<_> = batch.get(2).unwrap().segments().collect();
            assert_eq!((d2.len(), d2[0].bytes), (1, &b"tail"[..]));
            a.send_to(b"lone", to).unwrap();
            assert_eq!(batch.recv(&b, 1, false), 1);
            assert!(batch.lone_packet(1), "round {round}");
            assert_eq!(batch.get(0).unwrap().bytes, b"lone");
        }
    }

    fn cut(bytes: &[u8], size: usize, truncated: bool) -> Vec<(u16, Vec<u8>, bool)> {
        Datagram {
            bytes,
            from: None,
            truncated,
            segment_size: size,
        }
        .segments()
        .map(|s| (s.index, s.bytes.to_vec(), s.truncated))
        .collect()
    }

    #[test]
    fn segments_of_odd_buffers() {
        let b: Vec<u8> = (0..10).collect();
        // Not coalesced, or a size of 0 (no kernel reports it): one packet.
        assert_eq!(cut(&b, 0, false), vec![(0, b.clone(), false)]);
        // A size above the length: one packet, the whole buffer.
        assert_eq!(cut(&b, 64, false), vec![(0, b.clone(), false)]);
        // Exact multiples, and a shorter last one.
        assert_eq!(
            cut(&b, 5, false),
            vec![(0, b[..5].to_vec(), false), (1, b[5..].to_vec(), false)]
        );
        assert_eq!(
            cut(&b, 4, false),
            vec![
                (0, b[..4].to_vec(), false),
                (1, b[4..8].to_vec(), false),
                (2, b[8..].to_vec(), false)
            ]
        );
        // A buffer the kernel cut: only the last packet says so.
        assert_eq!(
            cut(&b, 4, true),
            vec![
                (0, b[..4].to_vec(), false),
                (1, b[4..8].to_vec(), false),
                (2, b[8..].to_vec(), true)
            ]
        );
        // An empty datagram is one empty packet, whatever the size.
        assert_eq!(cut(&[], 4, false), vec![(0, vec![], false)]);
        // The smallest size on the largest buffer: every index distinct.
        let big = vec![0u8; GRO_SLOT - 1];
        let idx: Vec<u16> = Datagram {
            bytes: &big,
            from: None,
            truncated: false,
            segment_size: 1,
        }
        .segments()
        .map(|s| s.index)
        .collect();
        assert_eq!(idx.len(), GRO_SLOT - 1);
        assert_eq!(idx.last(), Some(&u16::MAX.wrapping_sub(1)));
    }

    #[test]
    fn a_control_buffer_holds_the_gro_message() {
        // SAFETY: a pure computation on a constant.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as _) };
        assert!(space as usize <= std::mem::size_of::<Control>());
    }

    #[test]
    fn ipv6_super_datagrams_are_cut_too() {
        let Some((a, b)) = pair("::1") else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        assert!(enable_gro(&b));
        let pkts = packets(4, 500, 499);
        send_gso(&a, b.local_addr().unwrap(), &pkts.concat(), 500);
        let mut batch = RecvBatch::with_gro(2);
        assert_eq!(batch.recv(&b, 2, true), 1);
        let d = batch.get(0).unwrap();
        assert_eq!(d.from, Some(a.local_addr().unwrap()));
        let got: Vec<(u16, &[u8])> = d.segments().map(|s| (s.index, s.bytes)).collect();
        let want: Vec<(u16, &[u8])> = (0..).zip(pkts.iter().map(|p| p.as_slice())).collect();
        assert_eq!(got, want);
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
