//! GRO on receive (issue 31): a GSO super-datagram of RoCEv2 packets,
//! built by hand here (each packet encoded for IPv4 identification 0, its
//! ICRC then moved to the identification `k` the sender's kernel gives
//! segment `k`: `roce::icrc::Ipv4IdentificationPatch`), arrives at a port
//! with `UDP_GRO` on as one coalesced buffer, is cut back into its
//! packets, and each verifies for its own identification, without the
//! solver, and is delivered in order. From a stranger the same buffer is
//! dropped packet by packet; a bad packet in a buffer costs only itself;
//! a port without GRO gets the packets one by one and verifies them
//! through the solver. Linux only (`UDP_SEGMENT`, `UDP_GRO`).
#![cfg(target_os = "linux")]

mod hostile_fixture;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use provider::{
    Device, Provider, QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, GRH_SIZE,
};
use roce::icrc::Ipv4IdentificationPatch;
use roce::{Bth, Deth, Endpoints, Headers, Opcode, Packet, Reth};
use roce_provider::{DeviceConfig, PortConfig, PortCounters, RoceProvider, UdpOffload};

use hostile_fixture::*;

/// Two devices on 127.0.0.1 (a) and 127.0.0.2 (b), a's ports with
/// offloads `a`, b's with `b`.
fn provider_with(a: UdpOffload, b: UdpOffload) -> RoceProvider {
    let port =
        |ip: &str, o| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0)).udp_offload(o);
    RoceProvider::new(vec![
        DeviceConfig::new("a", 1, vec![port("127.0.0.1", a)]),
        DeviceConfig::new("b", 2, vec![port("127.0.0.2", b)]),
    ])
}

/// Sends `payload` from `s` to `to` as one GSO super-datagram of
/// `seg`-byte segments (`UDP_SEGMENT`).
fn send_gso(s: &UdpSocket, to: SocketAddr, payload: &[u8], seg: u16) {
    use std::os::fd::AsRawFd;
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    // SAFETY: all-zero is a valid `sockaddr_in` and `msghdr`.
    let (mut name, mut msg) = unsafe {
        (
            std::mem::zeroed::<libc::sockaddr_in>(),
            std::mem::zeroed::<libc::msghdr>(),
        )
    };
    name.sin_family = libc::AF_INET as libc::sa_family_t;
    name.sin_port = to.port().to_be();
    name.sin_addr.s_addr = u32::from(*to.ip()).to_be();
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut control = [0u64; 4];
    msg.msg_name = (&mut name as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: the control buffer is 32 bytes, aligned for a `cmsghdr`, and
    // `CMSG_SPACE(2)` (24) fits in it: `CMSG_FIRSTHDR` returns its start
    // and the `u16` is written within it. The kernel reads the name, the
    // iovec (the payload, only read) and the control buffer during the
    // call; all live on this frame.
    let sent = unsafe {
        msg.msg_controllen = libc::CMSG_SPACE(2) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
        libc::sendmsg(s.as_raw_fd(), &msg, 0)
    };
    assert_eq!(
        sent,
        payload.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

/// The packets `pkts` as a GSO sender on `from` would send them to `to`
/// in one super-datagram: each encoded for identification 0, then its
/// ICRC moved to identification `k`, its segment index. Returns the
/// super-datagram's payload and its segment size (every packet but the
/// last must be that long, the last no longer).
fn super_datagram(from: SocketAddr, to: SocketAddr, pkts: &[(Headers, Vec<u8>)]) -> (Vec<u8>, u16) {
    let ep = Endpoints::new(from, to).unwrap();
    let mut out = Vec::new();
    let mut seg = 0;
    for (k, (h, payload)) in pkts.iter().enumerate() {
        let mut p = Packet::new(*h, payload).encode(&ep).unwrap();
        let patch = Ipv4IdentificationPatch::new(p.len() - roce::ICRC_LEN).unwrap();
        assert!(patch.apply(&mut p, 0, k as u16));
        if k == 0 {
            seg = p.len();
        }
        assert!(
            p.len() == seg || (k + 1 == pkts.len() && p.len() < seg),
            "packet {k}: {} bytes, segments of {seg}",
            p.len()
        );
        out.extend_from_slice(&p);
    }
    (out, seg as u16)
}

/// Every datagram (packet) counted once: delivered or dropped for a
/// reason (`rx_bad_state` may count a delivered packet twice).
fn stage_drops(c: &PortCounters) -> u64 {
    c.rx_oversized
        + c.rx_truncated
        + c.rx_decode_error
        + c.rx_unknown_qpn
        + c.rx_wrong_port
        + c.rx_bad_opcode
        + c.rx_bad_state
        + c.rx_bad_pkey
        + c.rx_bad_qkey
        + c.rx_wrong_source
        + c.rx_wrong_destination
        + c.rx_bad_icrc
        + c.rx_icrc_unsolved
}

fn check_invariants(c: &PortCounters) {
    assert!(
        c.rx_datagrams <= c.rx_packets + stage_drops(c)
            && c.rx_datagrams + c.rx_bad_state >= c.rx_packets + stage_drops(c),
        "every packet delivered or dropped once: {c:#?}"
    );
    assert!(c.rx_gro_segments >= 2 * c.rx_gro_buffers, "{c:#?}");
    assert!(c.rx_gro_segments <= c.rx_datagrams, "{c:#?}");
}

/// Polls `side`'s CQ for `wait`: whatever completes.
fn completions_within(side: &Side, wait: Duration) -> usize {
    let end = Instant::now() + wait;
    let mut got = 0;
    let mut buf = [provider::Wc::default(); 8];
    while Instant::now() < end {
        got += side.dev.poll_cq(&side.cq, &mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

const SETTLE: Duration = Duration::from_millis(100);

/// RC WRITEs then SENDs, PSN 0.. into `qpn`: `writes` WRITE ONLY of 256
/// bytes at 256-byte steps from 0 (`rkey`), then `sends` SEND ONLY of
/// 272 bytes (the same packet length), the last `last` bytes long.
fn rc_stream(
    qpn: u32,
    rkey: u32,
    writes: usize,
    sends: usize,
    last: usize,
) -> Vec<(Headers, Vec<u8>)> {
    let mut pkts = Vec::new();
    for i in 0..writes {
        let mut h = Headers::new(Bth::new(Opcode::RcWriteOnly, qpn, i as u32));
        h.reth = Some(Reth {
            va: 256 * i as u64,
            rkey,
            dma_len: 256,
        });
        pkts.push((h, pattern(256, i as u64)));
    }
    for j in 0..sends {
        let psn = (writes + j) as u32;
        let len = if j + 1 == sends { last } else { 272 };
        let h = Headers::new(Bth::new(Opcode::RcSendOnly, qpn, psn));
        pkts.push((h, pattern(len, 100 + j as u64)));
    }
    pkts
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(131) as usize + i * 7) as u8)
        .collect()
}

/// Posts `n` receives of 512 bytes each at 512-byte steps of `lkey`'s MR.
fn post_recvs(side: &Side, qp: &roce_provider::RoceQp, lkey: u32, n: usize) {
    for i in 0..n {
        let sg = [Sge {
            addr: 512 * i as u64,
            length: 512,
            lkey,
        }];
        side.dev
            .post_recv(
                qp,
                &[RecvWr {
                    wr_id: i as u64,
                    sg_list: &sg,
                }],
            )
            .unwrap();
    }
}

#[test]
fn a_gso_super_datagram_of_rc_writes_and_sends_arrives_through_gro_in_order() {
    let p = provider_with(UdpOffload::ON, UdpOffload::ON);
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let qpn_b = b.dev.qp_num(&qb);
    let (wbuf, _wmr, wkey) = b.mem(4096);
    let (rbuf, _rmr, rkey) = b.mem(8192);
    let (writes, sends, last) = (4, 8, 100);
    post_recvs(&b, &qb, rkey, sends);
    let pkts = rc_stream(qpn_b, wkey, writes, sends, last);
    let n = pkts.len() as u64;
    let to = b.dev.local_addr(1).unwrap();
    let before = b.counters();

    // Hostile control: the same packets from 127.0.0.77 (not the peer),
    // each ICRC right for the stranger's own flow: dropped whole, one
    // wrong source per packet, nothing written or delivered.
    let evil = UdpSocket::bind("127.0.0.77:0").unwrap();
    let (dgram, seg) = super_datagram(evil.local_addr().unwrap(), to, &pkts);
    send_gso(&evil, to, &dgram, seg);
    until(&b, "the stranger's buffer", |c| {
        c.rx_wrong_source >= before.rx_wrong_source + n
    });
    let c = b.counters();
    assert_eq!(c.rx_wrong_source - before.rx_wrong_source, n);
    assert_eq!(c.rx_packets, before.rx_packets);
    assert_eq!(
        c.rx_datagrams - before.rx_datagrams,
        n,
        "packets, not buffers"
    );
    assert_eq!(
        (
            c.rx_gro_buffers - before.rx_gro_buffers,
            c.rx_gro_segments - before.rx_gro_segments
        ),
        (1, n),
        "one coalesced buffer of {n} packets"
    );
    assert_eq!(completions_within(&b, SETTLE), 0, "nothing delivered");
    let mut written = vec![0u8; 256 * writes];
    wbuf.read(0, &mut written).unwrap();
    assert!(written.iter().all(|&x| x == 0), "nothing written");

    // Positive control: the same from the peer's address.
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (dgram, seg) = super_datagram(peer.local_addr().unwrap(), to, &pkts);
    let before = b.counters();
    send_gso(&peer, to, &dgram, seg);
    let wcs = b.wait(sends);
    for (j, wc) in wcs.iter().enumerate() {
        let len = if j + 1 == sends { last } else { 272 };
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
            (j as u64, WcStatus::Success, WcOpcode::Recv, len),
            "SEND {j} in order"
        );
        let mut got = vec![0u8; len];
        rbuf.read(512 * j, &mut got).unwrap();
        assert_eq!(got, pkts[writes + j].1, "SEND {j}'s bytes");
    }
    wbuf.read(0, &mut written).unwrap();
    for i in 0..writes {
        assert_eq!(
            &written[256 * i..256 * (i + 1)],
            &pkts[i].1[..],
            "WRITE {i}"
        );
    }
    until(&b, "counted", |c| c.rx_packets >= before.rx_packets + n);
    let c = b.counters();
    assert_eq!(c.rx_packets - before.rx_packets, n);
    assert_eq!(c.rx_gro_buffers - before.rx_gro_buffers, 1);
    assert_eq!(c.rx_gro_segments - before.rx_gro_segments, n);
    // Each packet verified for its own identification k: no solver run.
    assert_eq!(c.rx_ipv4_id_solved, before.rx_ipv4_id_solved);
    assert_eq!(c.rx_bad_icrc + c.rx_icrc_unsolved, 0);
    check_invariants(&c);
    assert_eq!(b.dev.query_qp(&qb).unwrap().state, provider::QpState::Rts);
}

#[test]
fn a_bad_packet_in_a_gro_buffer_costs_only_itself() {
    let p = provider_with(UdpOffload::ON, UdpOffload::ON);
    let b = Side::new(p.open(2).unwrap());
    let ud = b.qp(QpType::Ud);
    b.ud(&ud, 0x1234);
    let qpn = b.dev.qp_num(&ud);
    let (rbuf, _rmr, rkey) = b.mem(8192);
    let to = b.dev.local_addr(1).unwrap();
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let pkts: Vec<(Headers, Vec<u8>)> = (0..7)
        .map(|i| {
            let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, qpn, i));
            h.deth = Some(Deth {
                qkey: 0x1234,
                src_qp: 9,
            });
            let len = if i == 6 { 40 } else { 200 };
            (h, pattern(len, u64::from(i)))
        })
        .collect();
    let (mut dgram, seg) = super_datagram(peer.local_addr().unwrap(), to, &pkts);
    let seg = usize::from(seg);
    // Packet 2: one payload byte flipped (its ICRC now wrong for every
    // identification); packet 4: garbage of the same length.
    dgram[2 * seg + 100] ^= 0x01;
    dgram[4 * seg..5 * seg].fill(0xff);
    post_recvs(&b, &ud, rkey, 5);
    let before = b.counters();
    send_gso(&peer, to, &dgram, seg as u16);
    let wcs = b.wait(5);
    for (wc, i) in wcs.iter().zip([0usize, 1, 3, 5, 6]) {
        let len = pkts[i].1.len();
        assert_eq!(wc.status, WcStatus::Success, "packet {i}");
        assert_eq!(wc.byte_len as usize, GRH_SIZE + len, "packet {i}");
        let mut got = vec![0u8; len];
        rbuf.read(512 * wc.wr_id as usize + GRH_SIZE, &mut got)
            .unwrap();
        assert_eq!(got, pkts[i].1, "packet {i}'s bytes, in order");
    }
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    until(&b, "counted", |c| c.rx_datagrams >= before.rx_datagrams + 7);
    let c = b.counters();
    assert_eq!(c.rx_datagrams - before.rx_datagrams, 7);
    assert_eq!(c.rx_packets - before.rx_packets, 5);
    assert_eq!(
        (c.rx_bad_icrc + c.rx_icrc_unsolved) - (before.rx_bad_icrc + before.rx_icrc_unsolved),
        1,
        "{c:#?}"
    );
    assert_eq!(c.rx_decode_error - before.rx_decode_error, 1, "{c:#?}");
    assert_eq!(c.rx_gro_buffers - before.rx_gro_buffers, 1);
    assert_eq!(c.rx_ipv4_id_solved, before.rx_ipv4_id_solved);
    check_invariants(&c);
}

/// A port without GRO: the kernel cuts the super-datagram and each packet
/// arrives alone, its identification (k) unseen: the solver finds it for
/// a connection's peer, and the stream is delivered as before.
#[test]
fn without_gro_a_gso_stream_verifies_through_the_solver() {
    let p = provider_with(UdpOffload::OFF, UdpOffload::OFF);
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let (_wbuf, _wmr, wkey) = b.mem(4096);
    let (rbuf, _rmr, rkey) = b.mem(8192);
    post_recvs(&b, &qb, rkey, 6);
    let pkts = rc_stream(b.dev.qp_num(&qb), wkey, 0, 6, 60);
    let to = b.dev.local_addr(1).unwrap();
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (dgram, seg) = super_datagram(peer.local_addr().unwrap(), to, &pkts);
    let before = b.counters();
    send_gso(&peer, to, &dgram, seg);
    let wcs = b.wait(6);
    for (j, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (j as u64, WcStatus::Success));
        let mut got = vec![0u8; pkts[j].1.len()];
        rbuf.read(512 * j, &mut got).unwrap();
        assert_eq!(got, pkts[j].1);
    }
    until(&b, "counted", |c| c.rx_packets >= before.rx_packets + 6);
    let c = b.counters();
    assert_eq!(c.rx_gro_buffers, 0);
    assert_eq!(c.rx_datagrams - before.rx_datagrams, 6);
    // Packet 0 carries identification 0; 1..5 needed the solver.
    assert_eq!(c.rx_ipv4_id_solved - before.rx_ipv4_id_solved, 5);
    check_invariants(&c);
}

/// A real stream between two devices with the offloads on: RDMA WRITEs
/// and SENDs land byte for byte; when the sender sent GSO super-datagrams
/// (`tx_gso_sends`), the receiver took coalesced buffers.
#[test]
fn a_stream_between_two_devices_with_the_offloads_on() {
    let p = provider_with(UdpOffload::ON, UdpOffload::ON);
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    const LEN: usize = 256 << 10;
    let (abuf, _amr, akey) = a.mem(LEN);
    let (bbuf, _bmr, bkey) = b.mem(LEN);
    let data = pattern(LEN, 77);
    abuf.write(0, &data).unwrap();
    for round in 0..4u64 {
        let sg = [Sge {
            addr: 0,
            length: LEN as u32,
            lkey: akey,
        }];
        let wr = SendWr::new(
            round,
            SendOp::Write {
                remote_addr: 0,
                rkey: bkey,
            },
            &sg,
        );
        a.dev.post_send::<()>(&qa, &[wr], &|_| None).unwrap();
        let wc = a.wait(1)[0];
        assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
    }
    let mut got = vec![0u8; LEN];
    bbuf.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITEs landed byte for byte");
    exchange(&a, &b, &qa, &qb, 9);
    let (ca, cb) = (a.counters(), b.counters());
    check_invariants(&cb);
    assert_eq!(cb.rx_bad_icrc + cb.rx_icrc_unsolved, 0, "{cb:#?}");
    if ca.tx_gso_sends > 0 {
        assert!(cb.rx_gro_buffers > 0, "GSO sent, no GRO buffer: {cb:#?}");
        // Every segment verified for its own identification.
        assert_eq!(cb.rx_ipv4_id_solved, 0, "{cb:#?}");
    } else {
        eprintln!("the sender sent no GSO super-datagram: GRO not exercised");
    }
}
