//! A RoCEv2 device's ports: IPv6 ports, ECMP source ports with a
//! valid ICRC, the IPv4 GRH area layouts, and that
//! dropping a device frees its threads and sockets.

mod hostile_fixture;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use provider::{
    AvAttr, Device, GrhAttr, Provider, QpType, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode,
    GRH_SIZE,
};
use roce::{Endpoints, Opcode, Packet};
use roce_provider::{DeviceConfig, PortConfig, RoceProvider};

use hostile_fixture::*;

#[test]
fn dropping_the_device_frees_its_threads_and_sockets() {
    let p = provider();
    let dev = p.open(1).unwrap();
    let addr = dev.local_addr(1).unwrap();
    assert!(p.open(1).is_err(), "a device opens once");
    // A clone is another handle: the device runs until the last goes.
    let other = dev.clone();
    drop(dev);
    assert!(p.open(1).is_err(), "still open through the clone");
    assert!(UdpSocket::bind(addr).is_err(), "still bound");
    let watch = other.close_watch();
    drop(other);
    // A reaper joins the threads and closes the sockets (the drop does
    // not wait: tests/shutdown.rs); then the address can be bound again,
    // and the device can be opened again.
    assert!(watch.wait(Duration::from_secs(2)).is_some());
    drop(UdpSocket::bind(addr).unwrap());
    let again = p.open(1).unwrap();
    drop(again);
}

/// An IPv6 port (`::1`): its GID is the IPv6 address; two QPs of one
/// device exchange over it, and a UD receive's GRH area holds the IPv6
/// header with both GIDs. Skipped when the host has no IPv6 loopback.
#[test]
fn ipv6_port() {
    if UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback: skipped");
        return;
    }
    let p = RoceProvider::new(vec![DeviceConfig::new(
        "v6",
        6,
        vec![PortConfig::new("[::1]:0".parse().unwrap())],
    )]);
    let a = Side::new(p.open(6).unwrap());
    let gid = a.gid();
    assert_eq!(gid, std::net::Ipv6Addr::LOCALHOST.octets());
    let q1 = a.qp(QpType::Rc);
    let q2 = a.qp(QpType::Rc);
    a.connect(&q1, &a, a.dev.qp_num(&q2));
    a.connect(&q2, &a, a.dev.qp_num(&q1));
    exchange(&a, &a, &q1, &q2, 5);

    let u1 = a.qp(QpType::Ud);
    let u2 = a.qp(QpType::Ud);
    a.ud(&u1, 3);
    a.ud(&u2, 3);
    let (rbuf, _rmr, rkey) = a.mem(256);
    let rs = [Sge {
        addr: 0,
        length: 256,
        lkey: rkey,
    }];
    a.dev
        .post_recv(
            &u2,
            &[RecvWr {
                wr_id: 1,
                sg_list: &rs,
            }],
        )
        .unwrap();
    let (sbuf, _smr, skey) = a.mem(16);
    sbuf.write(0, b"six!").unwrap();
    let av = a.dev.create_av(&a.pd, &a.av_to(&a)).unwrap();
    let ss = [Sge {
        addr: 0,
        length: 4,
        lkey: skey,
    }];
    let wr = SendWr::new(1, SendOp::Send, &ss).to(UdDest {
        av: &av,
        remote_qpn: a.dev.qp_num(&u2),
        remote_qkey: 3,
        pkey_index: 0,
    });
    a.dev.post_send(&u1, &[wr], &|_| Some(&av)).unwrap();
    let wcs = a.wait(2);
    let r = wcs.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert!(r.grh);
    assert_eq!(r.byte_len, GRH_SIZE as u32 + 4);
    assert_eq!(r.src_qp, a.dev.qp_num(&u1));
    let mut g = [0u8; GRH_SIZE + 4];
    rbuf.read(0, &mut g).unwrap();
    assert_eq!(g[0] >> 4, 6);
    assert_eq!(&g[8..24], &gid);
    assert_eq!(&g[24..40], &gid);
    assert_eq!(&g[40..], b"six!");
}

/// What leaves the port, seen by a plain UDP socket standing in for a
/// peer (reached through the provider's directory): a RoCEv2 packet with
/// a valid ICRC for the flow, from a UDP source port in 0xC000..=0xFFFF
/// that depends on the QPN.
#[test]
fn packets_leave_from_ecmp_source_ports_with_a_valid_icrc() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let peer = UdpSocket::bind("127.0.0.3:0").unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let peer_addr = peer.local_addr().unwrap();
    let peer_gid = roce_provider::gid_of(peer_addr.ip());
    p.add_peer(peer_gid, peer_addr);
    let av_attr = AvAttr {
        grh: Some(GrhAttr {
            dgid: peer_gid,
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }),
        ..AvAttr::lid(1, 0)
    };
    let av = a.dev.create_av(&a.pd, &av_attr).unwrap();
    let (_buf, _mr, key) = a.mem(16);
    let sg = [Sge {
        addr: 0,
        length: 5,
        lkey: key,
    }];
    let mut ports = std::collections::HashSet::new();
    for _ in 0..4 {
        let q = a.qp(QpType::Ud);
        a.ud(&q, 0x77);
        let wr = SendWr::new(1, SendOp::Send, &sg).to(UdDest {
            av: &av,
            remote_qpn: 0x42,
            remote_qkey: 0x77,
            pkey_index: 0,
        });
        a.dev.post_send(&q, &[wr], &|_| Some(&av)).unwrap();
        let mut buf = [0u8; 2048];
        let (n, src) = peer.recv_from(&mut buf).unwrap();
        assert!(src.port() >= 0xC000, "{src}");
        let ep = Endpoints::new(src, peer_addr).unwrap();
        let pkt = Packet::decode(&buf[..n], &ep).unwrap();
        assert_eq!(pkt.headers.bth.opcode, Opcode::UdSendOnly);
        assert_eq!(pkt.headers.bth.dest_qp, 0x42);
        assert_eq!(pkt.headers.deth.unwrap().src_qp, a.dev.qp_num(&q));
        assert_eq!(pkt.payload.len(), 5);
        ports.insert(src.port());
        a.wait(1);
    }
    assert!(
        ports.len() > 1,
        "consecutive QPs use different source ports"
    );
}

/// IPv4 GRH area: rxe's layout by default (20 zero bytes, then the IPv4
/// header); with `ipv4_grh_as_ipv6`, an IPv6-style header with the
/// IPv4-mapped GIDs at bytes 8 and 24.
#[test]
fn ipv4_grh_area_layouts() {
    for v6_style in [false, true] {
        let port = |ip: &str| {
            PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0)).ipv4_grh_as_ipv6(v6_style)
        };
        let p = RoceProvider::new(vec![
            DeviceConfig::new("a", 1, vec![port("127.0.0.1")]),
            DeviceConfig::new("b", 2, vec![port("127.0.0.2")]),
        ]);
        let a = Side::new(p.open(1).unwrap());
        let b = Side::new(p.open(2).unwrap());
        let (qa, qb) = (a.qp(QpType::Ud), b.qp(QpType::Ud));
        a.ud(&qa, 5);
        b.ud(&qb, 5);
        let (rbuf, _rmr, rkey) = b.mem(128);
        let rs = [Sge {
            addr: 0,
            length: 128,
            lkey: rkey,
        }];
        b.dev
            .post_recv(
                &qb,
                &[RecvWr {
                    wr_id: 1,
                    sg_list: &rs,
                }],
            )
            .unwrap();
        let (_sbuf, _smr, skey) = a.mem(8);
        let av = a.dev.create_av(&a.pd, &a.av_to(&b)).unwrap();
        let ss = [Sge {
            addr: 0,
            length: 8,
            lkey: skey,
        }];
        let wr = SendWr::new(1, SendOp::Send, &ss).to(UdDest {
            av: &av,
            remote_qpn: b.dev.qp_num(&qb),
            remote_qkey: 5,
            pkey_index: 0,
        });
        a.dev.post_send(&qa, &[wr], &|_| Some(&av)).unwrap();
        a.wait(1);
        let wc = b.wait(1)[0];
        assert!(wc.grh);
        let mut g = [0u8; GRH_SIZE];
        rbuf.read(0, &mut g).unwrap();
        if v6_style {
            assert_eq!(g[0] >> 4, 6);
            assert_eq!(&g[8..24], &a.gid());
            assert_eq!(&g[24..40], &b.gid());
        } else {
            assert_eq!(g[..20], [0; 20]);
            assert_eq!(g[20] >> 4, 4);
            assert_eq!(&g[32..36], &[127, 0, 0, 1]);
            assert_eq!(&g[36..40], &[127, 0, 0, 2]);
        }
    }
}
