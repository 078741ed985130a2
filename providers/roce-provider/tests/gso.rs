//! GSO on send (issue 31): a QP's runs of packets leave as UDP GSO
//! super-datagrams, each segment's ICRC computed for the IPv4
//! identification the kernel gives it, and the receiver gets every byte.
//! With offloads off, nothing leaves as a super-datagram.

use std::net::SocketAddr;

use provider::{Device, Provider, RegisteredBuffer, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceProvider, UdpOffload};

mod common;

use common::{connected_qps, cq, pattern, wait, ALL};

fn devices_with(a: UdpOffload, b: UdpOffload) -> (RoceDevice, RoceDevice) {
    let port =
        |ip: &str, o| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0)).udp_offload(o);
    let p = RoceProvider::new(vec![
        DeviceConfig::new("a", 1, vec![port("127.0.0.1", a)]),
        DeviceConfig::new("b", 2, vec![port("127.0.0.2", b)]),
    ]);
    (p.open(1).unwrap(), p.open(2).unwrap())
}

/// A 1 MiB WRITE and a 256 KiB READ from `a` to `b`, bytes checked.
fn write_then_read(a: &RoceDevice, b: &RoceDevice) {
    const LEN: usize = 1 << 20;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(a), cq(b));
    let (qa, _qb) = connected_qps((a, &pa, &ca), (b, &pb, &cb));
    let (src, dst, back) = (
        RegisteredBuffer::new(LEN),
        RegisteredBuffer::new(LEN),
        RegisteredBuffer::new(LEN),
    );
    let ms = a.register_mr(&pa, &src, 0, LEN, 0, ALL).unwrap();
    let mb = a.register_mr(&pa, &back, 0, LEN, 0, ALL).unwrap();
    let md = b.register_mr(&pb, &dst, 0, LEN, 0, ALL).unwrap();
    let data = pattern(LEN, 31);
    src.write(0, &data).unwrap();
    let sg = |k, len: usize| {
        [Sge {
            addr: 0,
            length: len as u32,
            lkey: k,
        }]
    };
    let (ss, rs) = (sg(a.mr_keys(&ms).0, LEN), sg(a.mr_keys(&mb).0, LEN / 4));
    let rkey = b.mr_keys(&md).1;
    let wrs = [
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: 0,
                rkey,
            },
            &ss,
        ),
        SendWr::new(
            2,
            SendOp::Read {
                remote_addr: 0,
                rkey,
            },
            &rs,
        ),
    ];
    a.post_send::<()>(&qa, &wrs, &|_| None).unwrap();
    let wc = wait(a, &ca, 2);
    let got: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    let mut landed = vec![0; LEN];
    dst.read(0, &mut landed).unwrap();
    assert!(landed == data, "the WRITE's bytes differ at the receiver");
    let mut read = vec![0; LEN / 4];
    back.read(0, &mut read).unwrap();
    assert!(read == data[..LEN / 4], "the READ's bytes differ");
}

#[test]
fn a_write_and_a_read_leave_as_super_datagrams_and_arrive_whole() {
    let (a, b) = devices_with(UdpOffload::ON, UdpOffload::ON);
    write_then_read(&a, &b);
    let (ca, cb) = (a.port_counters(1).unwrap(), b.port_counters(1).unwrap());
    eprintln!("a: {ca:?}\nb: {cb:?}");
    // The WRITE's 1,024 packets went in runs: far fewer super-datagrams
    // than packets, none refused, none lost.
    assert!(ca.tx_gso_sends > 0, "a sent no super-datagram: {ca:?}");
    assert!(
        ca.tx_gso_segments >= 4 * ca.tx_gso_sends,
        "short runs only: {} segments in {} super-datagrams",
        ca.tx_gso_segments,
        ca.tx_gso_sends
    );
    assert!(ca.tx_gso_segments <= ca.tx_packets);
    // The READ's responses leave b the same way.
    assert!(cb.tx_gso_sends > 0, "b's READ responses: {cb:?}");
    for c in [&ca, &cb] {
        assert_eq!(
            (
                c.tx_gso_refused,
                c.tx_errors,
                c.rx_bad_icrc,
                c.rx_icrc_unsolved
            ),
            (0, 0, 0, 0),
            "{c:?}"
        );
    }
    assert_eq!(ca.retries, 0, "a retransmitted: something was lost");
    // b's GRO socket got the super-datagrams whole and checked segment k
    // with identification k: not one needed the solver. A segment whose
    // ICRC was not moved (or moved wrong) would have.
    assert!(cb.rx_gro_buffers > 0, "b took no GRO buffer: {cb:?}");
    assert_eq!((ca.rx_ipv4_id_solved, cb.rx_ipv4_id_solved), (0, 0));
}

/// The switch: with offloads off the same exchange sends no
/// super-datagram (and still works).
#[test]
fn with_offloads_off_every_packet_is_its_own_datagram() {
    let (a, b) = devices_with(UdpOffload::OFF, UdpOffload::OFF);
    write_then_read(&a, &b);
    for c in [a.port_counters(1).unwrap(), b.port_counters(1).unwrap()] {
        assert_eq!(
            (c.tx_gso_sends, c.tx_gso_segments, c.tx_gso_refused),
            (0, 0, 0)
        );
        assert_eq!((c.rx_gro_buffers, c.rx_ipv4_id_solved), (0, 0), "{c:?}");
    }
}

/// A receiver without GRO gets the super-datagram cut by the kernel into
/// segments whose identifications (1, 2, ...) its socket does not show:
/// their ICRCs, right for those identifications, fail for 0 and are
/// accepted through the identification solver (a connection's peer).
#[test]
fn a_receiver_without_gro_accepts_the_segments_through_the_solver() {
    let gso_only = UdpOffload {
        gso: true,
        gro: false,
    };
    let (a, b) = devices_with(gso_only, gso_only);
    write_then_read(&a, &b);
    let (ca, cb) = (a.port_counters(1).unwrap(), b.port_counters(1).unwrap());
    assert!(ca.tx_gso_sends > 0);
    // Every segment but each super-datagram's first needed the solver.
    assert!(
        cb.rx_ipv4_id_solved >= ca.tx_gso_segments - ca.tx_gso_sends,
        "b solved {} of {} later segments: {cb:?}",
        cb.rx_ipv4_id_solved,
        ca.tx_gso_segments - ca.tx_gso_sends
    );
    assert_eq!((cb.rx_bad_icrc, cb.rx_icrc_unsolved, ca.retries), (0, 0, 0));
}
