//! Sending runs of packets as UDP GSO super-datagrams (Linux
//! `UDP_SEGMENT`): planning which packets of a batch go together
//! ([`plan`]), moving their ICRCs to the IPv4 identification each segment
//! will carry ([`SegmentIcrcs`]), and the `sendmmsg` whose messages carry a
//! `UDP_SEGMENT` control message ([`send_messages`]).
//!
//! Why the ICRCs move: the ICRC covers the IPv4 identification. A packet
//! sent alone from an unconnected socket with DF carries identification 0
//! (`port::no_fragments`), which is what `tx_batch` encodes for; the
//! segments of one GSO datagram carry 0, 1, 2, ... (the kernel numbers them
//! from the header's 0 as it cuts the datagram, in software or in a NIC).
//! So segment `k` of an IPv4 run has its ICRC moved from identification 0
//! to `k` before the send ([`roce::icrc::Ipv4IdentificationPatch`]: a few
//! XORs, no pass over the packet), and moved back if the kernel refuses
//! the datagram and its packets go alone. IPv6 has no identification.
//!
//! The system call is the module's only `unsafe` code (neither `rustix`
//! nor `socket2` sends a `UDP_SEGMENT` control message; `std` has no
//! batched send). What it upholds: every pointer handed to the kernel
//! points into vectors this call owns or into the caller's byte buffer,
//! borrowed for the call, with the lengths given alongside.
#![cfg_attr(any(not(target_os = "linux"), ibal_loom), allow(dead_code))]

use std::net::SocketAddr;

use roce::icrc::Ipv4IdentificationPatch;

/// Most segments one super-datagram carries (the kernel's
/// `UDP_MAX_SEGMENTS`, 64 before Linux 6.13 raised it to 128).
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Most bytes of UDP payload one super-datagram carries: the IPv4 total
/// length's 65,535 less the IPv4 and UDP headers (IPv6's payload length
/// allows 20 more; one limit keeps it simple).
pub(crate) const MAX_BYTES: usize = 65_535 - 20 - 8;

/// One message of a batch: `len` bytes at `start` of the batch's buffer,
/// to `to`; cut by the kernel into `seg`-byte segments (the last may be
/// shorter) when `segments` > 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) to: SocketAddr,
    pub(crate) start: usize,
    pub(crate) len: usize,
    /// Bytes of each segment but the last.
    pub(crate) seg: usize,
    /// Packets it carries (1: a plain datagram).
    pub(crate) segments: usize,
}

/// Groups the batch's packets (`(to, start, len)` each, in sending order)
/// into messages: a run of packets to one address, back to back in the
/// buffer, all of the first's length but the last (which may be shorter,
/// and then ends the run), at most [`MAX_SEGMENTS`] and [`MAX_BYTES`],
/// becomes one super-datagram. The order of the packets is kept.
pub(crate) fn plan(packets: &[(SocketAddr, usize, usize)], out: &mut Vec<Message>) {
    out.clear();
    let mut open: Option<Message> = None;
    for &(to, start, len) in packets {
        if let Some(m) = &mut open {
            let joins = m.to == to
                && m.start + m.len == start
                && len <= m.seg
                && len > 0
                // A shorter segment is the last one.
                && m.len == m.seg * m.segments
                && m.segments < MAX_SEGMENTS
                && m.len + len <= MAX_BYTES;
            if joins {
                m.len += len;
                m.segments += 1;
                continue;
            }
            out.push(*m);
        }
        open = Some(Message {
            to,
            start,
            len,
            seg: len,
            segments: 1,
        });
    }
    out.extend(open);
}

/// The identification patches of the packet lengths a thread sends
/// (a stream's packets have one or two lengths: its full packets and a
/// last one), so moving a segment's ICRC costs a few XORs.
#[derive(Default)]
pub(crate) struct SegmentIcrcs {
    memo: [Option<Ipv4IdentificationPatch>; 4],
    next: usize,
}

impl SegmentIcrcs {
    fn patch(&mut self, bth_to_end_len: usize) -> Option<Ipv4IdentificationPatch> {
        if let Some(p) = self
            .memo
            .iter()
            .flatten()
            .find(|p| p.bth_to_end_len() == bth_to_end_len)
        {
            return Some(*p);
        }
        let p = Ipv4IdentificationPatch::new(bth_to_end_len)?;
        self.memo[self.next] = Some(p);
        self.next = (self.next + 1) % self.memo.len();
        Some(p)
    }

    /// Moves the ICRC of each segment `k` of `m` (an IPv4 message) from
    /// identification `from(k)` to `to(k)`. IPv6 messages and plain
    /// datagrams are left alone.
    fn move_icrcs(
        &mut self,
        bytes: &mut [u8],
        m: &Message,
        from: impl Fn(u16) -> u16,
        to: impl Fn(u16) -> u16,
    ) {
        if m.segments < 2 || !m.to.is_ipv4() {
            return;
        }
        let mut at = m.start;
        for k in 0..m.segments {
            let len = m.seg.min(m.start + m.len - at);
            let pkt = &mut bytes[at..at + len];
            let k = k as u16;
            if let Some(p) = len
                .checked_sub(roce::ICRC_LEN)
                .and_then(|body| self.patch(body))
            {
                p.apply(pkt, from(k), to(k));
            }
            at += len;
        }
    }

    /// Gives each segment `k` of `m` the ICRC for identification `k` (the
    /// packets were encoded for identification 0).
    pub(crate) fn for_segments(&mut self, bytes: &mut [u8], m: &Message) {
        #[cfg(ibal_mutant = "gso_icrc_unpatched")]
        if true {
            return; // the mistake: every segment keeps identification 0's ICRC
        }
        self.move_icrcs(bytes, m, |_| 0, |k| k);
    }

    /// Undoes [`SegmentIcrcs::for_segments`]: each packet of `m` gets
    /// back the ICRC for identification 0, to go alone.
    pub(crate) fn for_alone(&mut self, bytes: &mut [u8], m: &Message) {
        #[cfg(ibal_mutant = "gso_icrc_unpatched")]
        if true {
            return;
        }
        self.move_icrcs(bytes, m, |k| k, |_| 0);
    }
}

/// Whether the kernel's error on a super-datagram means it will refuse
/// every one from this socket (no checksum offload on the route's device:
/// `EIO`; a segment above the route's MTU or a kernel without
/// `UDP_SEGMENT`: `EINVAL`, `ENOPROTOOPT`, `EOPNOTSUPP`; `EMSGSIZE`),
/// rather than a passing condition.
pub(crate) fn is_refusal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// Sends `msgs` (their bytes in `bytes`) with one `sendmmsg`, each
/// message with more than one segment with a `UDP_SEGMENT` control
/// message. Returns how many of the first messages the kernel took (at
/// least one), or the error of the first.
#[cfg(all(target_os = "linux", not(ibal_loom)))]
#[allow(unsafe_code)]
pub(crate) fn send_messages(
    socket: &std::net::UdpSocket,
    bytes: &[u8],
    msgs: &[Message],
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    if msgs.is_empty() {
        return Ok(0);
    }
    let n = msgs.len();
    // One control buffer per message, room for one `u16` cmsg, aligned
    // as a `cmsghdr` (u64s).
    // SAFETY: CMSG_SPACE only computes a length.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    let words = space.div_ceil(8);
    let mut controls = vec![0u64; words * n];
    // SAFETY: all-zero bytes are valid values of these plain C structs.
    let (hdr, name) = unsafe {
        (
            std::mem::zeroed::<libc::mmsghdr>(),
            std::mem::zeroed::<libc::sockaddr_storage>(),
        )
    };
    let mut names = vec![name; n];
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(n);
    let mut hdrs = vec![hdr; n];
    for (i, m) in msgs.iter().enumerate() {
        let Some(b) = bytes.get(m.start..m.start + m.len) else {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        };
        iovs.push(libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        });
        let namelen = write_sockaddr(&mut names[i], m.to);
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = namelen;
        if m.segments > 1 {
            let ctl = &mut controls[i * words..(i + 1) * words];
            h.msg_control = ctl.as_mut_ptr().cast();
            h.msg_controllen = space as _;
            // SAFETY: the header names a control buffer of `space` bytes
            // (CMSG_SPACE of a u16), so CMSG_FIRSTHDR is a pointer to its
            // start, aligned (u64s), with room for the header and the
            // u16 CMSG_DATA points at.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), m.seg as u16);
            }
        }
    }
    for (h, iov) in hdrs.iter_mut().zip(iovs.iter_mut()) {
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: each of the `n` headers names one iovec of `iovs` covering
    // a range of `bytes` (checked above), one sockaddr of `names` with its
    // true length, and either no control buffer or one of `controls`
    // holding one well-formed cmsg. All of these vectors live until the
    // call returns and are not moved during it; the kernel only reads them
    // (and writes each header's `msg_len`).
    let sent = unsafe { libc::sendmmsg(socket.as_raw_fd(), hdrs.as_mut_ptr(), n as _, 0) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// Writes `addr` into `name` as the kernel reads it; returns its length.
#[cfg(all(target_os = "linux", not(ibal_loom)))]
#[allow(unsafe_code)]
fn write_sockaddr(name: &mut libc::sockaddr_storage, addr: SocketAddr) -> libc::socklen_t {
    let p = (name as *mut libc::sockaddr_storage).cast::<u8>();
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as _,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: the storage is larger than and at least as aligned
            // as a sockaddr_in, and borrowed mutably.
            unsafe { std::ptr::write(p.cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>() as _
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as _,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, a sockaddr_in6.
            unsafe { std::ptr::write(p.cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>() as _
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// (to, start, len) of packets laid back to back.
    fn laid(packets: &[(SocketAddr, usize)]) -> Vec<(SocketAddr, usize, usize)> {
        let mut at = 0;
        packets
            .iter()
            .map(|&(to, len)| {
                let p = (to, at, len);
                at += len;
                p
            })
            .collect()
    }

    fn shape(msgs: &[Message]) -> Vec<(usize, usize, usize)> {
        msgs.iter().map(|m| (m.len, m.seg, m.segments)).collect()
    }

    #[test]
    fn runs_to_one_peer_become_one_message_and_a_short_packet_ends_one() {
        let (p, q) = (a("10.0.0.2:4791"), a("10.0.0.3:4791"));
        let mut out = Vec::new();
        plan(
            &laid(&[
                (p, 100),
                (p, 100),
                (p, 60),
                (p, 100),
                (q, 100),
                (q, 100),
                (p, 20),
            ]),
            &mut out,
        );
        assert_eq!(
            shape(&out),
            [(260, 100, 3), (100, 100, 1), (200, 100, 2), (20, 20, 1)]
        );
        assert_eq!(
            out.iter().map(|m| m.start).collect::<Vec<_>>(),
            [0, 260, 360, 560]
        );
        assert_eq!(out[2].to, q);
        // A longer packet never joins (it would be cut).
        plan(&laid(&[(p, 50), (p, 80)]), &mut out);
        assert_eq!(shape(&out), [(50, 50, 1), (80, 80, 1)]);
        // Packets not back to back in the buffer never join.
        plan(&[(p, 0, 10), (p, 20, 10)], &mut out);
        assert_eq!(out.len(), 2);
        plan(&[], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_message_stays_within_the_kernel_s_limits() {
        let p = a("10.0.0.2:4791");
        let mut out = Vec::new();
        plan(&laid(&vec![(p, 10); 150]), &mut out);
        assert_eq!(shape(&out), [(640, 10, 64), (640, 10, 64), (220, 10, 22)]);
        plan(&laid(&vec![(p, 4124); 40]), &mut out);
        let max = MAX_BYTES / 4124;
        assert_eq!(out[0].segments, max);
        assert!(out.iter().all(|m| m.len <= MAX_BYTES));
        assert_eq!(out.iter().map(|m| m.segments).sum::<usize>(), 40);
    }

    /// Packets with valid ICRCs for identification 0: after
    /// `for_segments`, segment k's ICRC is the one computed for
    /// identification k (IPv4), unchanged for IPv6; `for_alone` restores
    /// every byte.
    #[test]
    fn segment_icrcs_move_to_their_identification_and_back() {
        use roce::Endpoints;
        for (from, to) in [
            ("10.0.0.1:49152", "10.0.0.2:4791"),
            ("[fd00::1]:49152", "[fd00::2]:4791"),
        ] {
            let (from, to) = (a(from), a(to));
            let lens = [300usize, 300, 300, 120];
            let mut bytes = Vec::new();
            let mut packets = Vec::new();
            for (i, &len) in lens.iter().enumerate() {
                let body: Vec<u8> = (0..len - 4).map(|j| (i * 31 + j * 7) as u8).collect();
                let ep = Endpoints::new(from, to).unwrap();
                packets.push((to, bytes.len(), len));
                bytes.extend_from_slice(&body);
                bytes
                    .extend_from_slice(&roce::icrc::to_wire(roce::icrc::icrc(&ep, &body).unwrap()));
            }
            let mut msgs = Vec::new();
            plan(&packets, &mut msgs);
            assert_eq!(shape(&msgs), [(1020, 300, 4)]);
            let original = bytes.clone();
            let mut icrcs = SegmentIcrcs::default();
            icrcs.for_segments(&mut bytes, &msgs[0]);
            for (k, &(_, start, len)) in packets.iter().enumerate() {
                let mut ep = Endpoints::new(from, to).unwrap();
                if let Endpoints::V4(v4) = &mut ep {
                    v4.identification = k as u16;
                }
                let body = &bytes[start..start + len - 4];
                let want = roce::icrc::to_wire(roce::icrc::icrc(&ep, body).unwrap());
                assert_eq!(
                    bytes[start + len - 4..start + len],
                    want,
                    "{to} segment {k}"
                );
            }
            icrcs.for_alone(&mut bytes, &msgs[0]);
            assert_eq!(bytes, original);
        }
    }
}
