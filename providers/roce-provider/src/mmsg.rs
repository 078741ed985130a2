//! Several datagrams per system call: `recvmmsg(2)` over a port's socket,
//! through `nix` (`nix::sys::socket::recvmmsg` and its `MultiHeaders`);
//! one datagram at a time by `recvfrom` (rustix).
//!
//! Per call, nix points the headers at this call's buffers (two stores a
//! header) and reads back each datagram's length, flags and sender; the
//! headers themselves are allocated once per batch ([`RecvBatch::new`]),
//! and nothing is allocated or copied per call beyond what the kernel
//! wrote. One thing of nix's to work around: it sets each header's name
//! length once, when the headers are made, and the kernel overwrites it
//! with the length of the address it wrote; an IPv6 sender received into a
//! header an IPv4 sender shrank would be cut to 16 bytes. So a batch keeps
//! one set of headers per address family, each sized to its family's
//! `sockaddr` exactly, and the caller says which family its socket has
//! (`a_batch_moved_between_families_reads_whole_senders`).
//!
//! On other systems [`RecvBatch::recv`] takes one datagram per call with
//! `std` (the caller loops).

use std::net::{SocketAddr, UdpSocket};

/// Buffers for up to `count` datagrams of up to `len` bytes each, and
/// what the last [`RecvBatch::recv`] put there.
pub(crate) struct RecvBatch {
    len: usize,
    bufs: Vec<u8>,
    got: Vec<Received>,
    /// The system call's headers, made once and kept from call to call.
    #[cfg(target_os = "linux")]
    sys: Sys,
}

/// `recvmmsg`'s headers, one per datagram, for IPv4 and for IPv6 sockets
/// (see the module's header for why two).
#[cfg(target_os = "linux")]
struct Sys {
    v4: nix::sys::socket::MultiHeaders<nix::sys::socket::SockaddrIn>,
    v6: nix::sys::socket::MultiHeaders<nix::sys::socket::SockaddrIn6>,
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
        RecvBatch {
            len,
            bufs: vec![0; count * len],
            got: Vec::with_capacity(count),
            #[cfg(target_os = "linux")]
            sys: Sys {
                v4: nix::sys::socket::MultiHeaders::preallocate(count, None),
                v6: nix::sys::socket::MultiHeaders::preallocate(count, None),
            },
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

    /// Receives up to `max` datagrams (at most the capacity) from `socket`
    /// (an IPv6 socket if `ipv6`, else IPv4).
    /// `wait`: block (within the socket's read timeout) until one arrives,
    /// then take what else is queued without waiting (`MSG_WAITFORONE`);
    /// otherwise only what is already queued (`MSG_DONTWAIT`; the socket
    /// itself stays blocking). Returns how many datagrams there are (0: none,
    /// a timeout, or an error).
    pub(crate) fn recv(&mut self, socket: &UdpSocket, ipv6: bool, max: usize, wait: bool) -> usize {
        self.got.clear();
        let max = max.min(self.capacity());
        if max == 0 {
            return 0;
        }
        #[cfg(target_os = "linux")]
        if max == 1 && !wait {
            self.recv_one(socket);
            return self.got.len();
        }
        self.recv_sys(socket, ipv6, max, wait);
        self.got.len()
    }

    /// One datagram without waiting, by `recvfrom` (safe, through rustix):
    /// the kernel's `recvmmsg` costs more per call even for one message
    /// (its header array in and out), and a polling thread asks for one
    /// at a time in a ping-pong.
    #[cfg(target_os = "linux")]
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

    #[cfg(target_os = "linux")]
    fn recv_sys(&mut self, socket: &UdpSocket, ipv6: bool, max: usize, wait: bool) {
        use nix::sys::socket::MsgFlags;
        let flags = if wait {
            MsgFlags::MSG_WAITFORONE
        } else {
            MsgFlags::MSG_DONTWAIT
        };
        let RecvBatch {
            len,
            bufs,
            got,
            sys,
        } = self;
        if ipv6 {
            recv_into(&mut sys.v6, socket, bufs, *len, max, flags, got);
        } else {
            recv_into(&mut sys.v4, socket, bufs, *len, max, flags, got);
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn recv_sys(&mut self, socket: &UdpSocket, _ipv6: bool, _max: usize, wait: bool) {
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

/// One `recvmmsg` of up to `max` datagrams from `socket` into the
/// `len`-byte chunks of `bufs`, with `hdrs` (whose address type is the
/// socket's family); what came goes to `got`.
#[cfg(target_os = "linux")]
fn recv_into<S>(
    hdrs: &mut nix::sys::socket::MultiHeaders<S>,
    socket: &UdpSocket,
    bufs: &mut [u8],
    len: usize,
    max: usize,
    flags: nix::sys::socket::MsgFlags,
    got: &mut Vec<Received>,
) where
    S: nix::sys::socket::SockaddrLike + Copy + Into<SocketAddr>,
{
    use nix::sys::socket::{recvmmsg, MsgFlags};
    use std::io::IoSliceMut;
    use std::os::fd::AsRawFd;
    // This call's buffers, on the stack (no allocation): one chunk each,
    // an empty slice past the batch's capacity (never given to the
    // kernel: `max` is at most the capacity). An array, not a `SmallVec`:
    // nix borrows the slices for as long as their own lifetime, which a
    // container with a destructor does not allow.
    let mut chunks = bufs.chunks_exact_mut(len.max(1));
    let mut iovs: [[IoSliceMut<'_>; 1]; MAX_BATCH] =
        std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or(&mut []))]);
    let Ok(received) = recvmmsg(
        socket.as_raw_fd(),
        hdrs,
        iovs[..max].iter_mut(),
        flags,
        None,
    ) else {
        return; // nothing queued, a timeout, or an error
    };
    for msg in received.take(max) {
        got.push(Received {
            n: msg.bytes.min(len),
            from: msg.address.map(Into::into),
            truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        });
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
        let n = batch.recv(&b, false, 8, false);
        assert_eq!(n, 5);
        for (i, m) in msgs.iter().enumerate() {
            let d = batch.get(i).unwrap();
            assert_eq!(d.bytes, m.as_slice());
            assert_eq!(d.from, Some(a.local_addr().unwrap()));
            assert!(!d.truncated);
        }
        assert!(batch.get(5).is_none());
        // Nothing left: a non-blocking call returns at once with none.
        assert_eq!(batch.recv(&b, false, 8, false), 0);
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
        assert_eq!(batch.recv(&b, false, 4, false), 2);
        assert!(batch.get(0).unwrap().truncated);
        assert_eq!(batch.get(1).unwrap().bytes, b"short");
        assert_eq!(batch.recv(&b, false, 4, false), 0);
        let mut moved = Box::new(batch);
        let batch = &mut *moved;
        for round in 0..3u8 {
            let msgs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![round * 4 + i; 16]).collect();
            let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
            send_all(&a, &b, &refs);
            assert_eq!(batch.recv(&b, false, 4, true), 4);
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
        assert_eq!(batch.recv(&b, false, 2, false), 2);
        assert_eq!(batch.get(1).unwrap().bytes, b"two");
        assert_eq!(batch.recv(&b, false, 4, true), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"three");
    }

    #[test]
    fn a_datagram_longer_than_the_buffer_is_cut_and_flagged() {
        let (a, b) = pair("127.0.0.1").unwrap();
        let long = vec![7u8; 100];
        send_all(&a, &b, &[&long, b"short"]);
        let mut batch = RecvBatch::new(4, 32);
        assert_eq!(batch.recv(&b, false, 4, false), 2);
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
        assert_eq!(batch.recv(&b, false, 1, false), 1);
        let d = batch.get(0).unwrap();
        assert!(d.truncated);
        assert_eq!((d.bytes, d.from), (&long[..16], from));
        assert!(batch.get(1).is_none());
        assert_eq!(batch.recv(&b, false, 1, false), 1);
        let d = batch.get(0).unwrap();
        assert_eq!((d.bytes, d.from, d.truncated), (&b""[..], from, false));
        assert_eq!(batch.recv(&b, false, 1, false), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"short");
        assert!(!batch.get(0).unwrap().truncated);
        let t0 = std::time::Instant::now();
        assert_eq!(batch.recv(&b, false, 1, false), 0, "nothing queued");
        assert!(t0.elapsed() < Duration::from_millis(400), "it did not wait");
        assert!(batch.get(0).is_none());
    }

    #[test]
    fn an_empty_datagram_is_a_datagram() {
        let (a, b) = pair("127.0.0.1").unwrap();
        send_all(&a, &b, &[b""]);
        let mut batch = RecvBatch::new(2, 16);
        assert_eq!(batch.recv(&b, false, 2, true), 1);
        assert_eq!(batch.get(0).unwrap().bytes, b"");
    }

    #[test]
    fn waiting_blocks_until_one_arrives_or_the_timeout() {
        let (a, b) = pair("127.0.0.1").unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut batch = RecvBatch::new(4, 16);
        let t0 = std::time::Instant::now();
        assert_eq!(batch.recv(&b, false, 4, true), 0, "nothing came");
        assert!(t0.elapsed() >= Duration::from_millis(15));
        let to = b.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.send_to(b"late", to).unwrap();
        });
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(batch.recv(&b, false, 4, true), 1);
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
        assert_eq!(batch.recv(&b, true, 4, false), 2);
        for (i, m) in [&b"six"[..], b"again"].iter().enumerate() {
            let d = batch.get(i).unwrap();
            assert_eq!(d.bytes, *m);
            assert_eq!(d.from, Some(a.local_addr().unwrap()));
        }
    }

    /// One batch (a poller's, kept per thread) used on an IPv4 socket and
    /// then on IPv6 ones, in both orders and several times: every sender
    /// is read whole. (Headers shared between the families would have
    /// kept the 16-byte name length an IPv4 sender left and cut the IPv6
    /// senders.)
    #[test]
    fn a_batch_moved_between_families_reads_whole_senders() {
        let Some((a6, b6)) = pair("::1") else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        let (a4, b4) = pair("127.0.0.1").unwrap();
        let mut batch = RecvBatch::new(4, 16);
        for round in 0..3 {
            send_all(&a4, &b4, &[b"four", b"four"]);
            assert_eq!(batch.recv(&b4, false, 4, false), 2, "round {round}");
            for i in 0..2 {
                assert_eq!(batch.get(i).unwrap().from, Some(a4.local_addr().unwrap()));
            }
            send_all(&a6, &b6, &[b"six", b"six", b"six"]);
            assert_eq!(batch.recv(&b6, true, 4, true), 3, "round {round}");
            for i in 0..3 {
                let d = batch.get(i).unwrap();
                assert_eq!(d.bytes, b"six");
                assert_eq!(
                    d.from,
                    Some(a6.local_addr().unwrap()),
                    "round {round} slot {i}"
                );
            }
        }
    }
}
