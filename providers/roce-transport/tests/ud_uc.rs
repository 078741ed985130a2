//! UD and UC paths.

mod common;

use std::time::Duration;

use common::{pattern, Faults, Net};
use provider::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, UdDest, WcStatus, GRH_SIZE};
use roce_transport::Config;

fn ud_cfg(qpn: u32, qkey: u32) -> Config {
    Config {
        qp_type: QpType::Ud,
        qkey,
        ..Config::rc(qpn, 0)
    }
}

#[test]
fn ud_send_fills_grh_and_checks_qkey() {
    let mut net = Net::new(ud_cfg(0x11, 0x1234), ud_cfg(0x22, 0x5678), 1);
    let (src, _) = net.sides[0].mem.register(0x1000, 4096, Access::NONE);
    let (rcv, _) = net.sides[1].mem.register(0x9000, 8192, Access::LOCAL_WRITE);
    let data = pattern(9, 100);
    net.sides[0].mem.write(src, 0x1000, &data);
    for i in 0..2u64 {
        let sge = [Sge {
            addr: 0x9000 + i * 4096,
            length: 4096,
            lkey: rcv,
        }];
        net.sides[1]
            .t
            .post_recv(&RecvWr {
                wr_id: 50 + i,
                sg_list: &sge,
            })
            .unwrap();
    }
    let sg = [Sge {
        addr: 0x1000,
        length: 100,
        lkey: src,
    }];
    for (id, qkey) in [(1, 0x9999), (2, 0x5678)] {
        let wr = SendWr::new(id, SendOp::SendImm(77), &sg).to(UdDest {
            av: &(),
            remote_qpn: 0x22,
            remote_qkey: qkey,
            pkey_index: 0,
        });
        let s = &mut net.sides[0];
        s.t.post_send(&wr, &mut s.mem).unwrap();
    }
    net.run(Duration::from_secs(1));
    // Both sends succeed locally (UD is unreliable); one is dropped.
    assert_eq!(
        net.sides[0]
            .wcs
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        [WcStatus::Success; 2]
    );
    assert_eq!(net.sides[1].t.counters().bad_qkey, 1);
    let wcs = &net.sides[1].wcs;
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.src_qp, wc.imm, wc.grh),
        (50, 140, 0x11, Some(77), true)
    );
    let buf = net.sides[1].mem.read(rcv, 0x9000, GRH_SIZE + 100);
    // IPv4: 20 zero bytes, then the IPv4 header (version 4, IHL 5, UDP,
    // 10.0.0.1 -> 10.0.0.2), as rxe lays it out.
    assert_eq!(&buf[..20], &[0; 20]);
    assert_eq!(buf[20], 0x45);
    assert_eq!(buf[20 + 9], 17);
    assert_eq!(&buf[20 + 12..20 + 20], &[10, 0, 0, 1, 10, 0, 0, 2]);
    assert_eq!(&buf[GRH_SIZE..], &data[..]);
}

#[test]
fn ud_refuses_more_than_the_mtu_and_high_bit_qkey_uses_own() {
    let mut a = ud_cfg(0x11, 0x8000_0042);
    a.path_mtu = Mtu::Mtu256;
    let mut b = ud_cfg(0x22, 0x8000_0042);
    b.path_mtu = Mtu::Mtu256;
    let mut net = Net::new(a, b, 2);
    let (src, _) = net.sides[0].mem.register(0x1000, 4096, Access::NONE);
    let (rcv, _) = net.sides[1].mem.register(0x9000, 4096, Access::LOCAL_WRITE);
    let sge = [Sge {
        addr: 0x9000,
        length: 4096,
        lkey: rcv,
    }];
    net.sides[1]
        .t
        .post_recv(&RecvWr {
            wr_id: 5,
            sg_list: &sge,
        })
        .unwrap();
    for (id, len) in [(1, 257u32), (2, 256)] {
        let sg = [Sge {
            addr: 0x1000,
            length: len,
            lkey: src,
        }];
        let wr = SendWr::new(id, SendOp::Send, &sg).to(UdDest {
            av: &(),
            remote_qpn: 0x22,
            remote_qkey: 0xffff_ffff,
            pkey_index: 0,
        });
        let s = &mut net.sides[0];
        s.t.post_send(&wr, &mut s.mem).unwrap();
    }
    net.run(Duration::from_secs(1));
    let st: Vec<_> = net.sides[0]
        .wcs
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        st,
        [(1, WcStatus::LocalLengthError), (2, WcStatus::Success)]
    );
    assert_eq!(
        net.sides[1].wcs.len(),
        1,
        "the controlled Q_Key was replaced by the QP's own"
    );
    assert_eq!(net.sides[1].wcs[0].byte_len, 256 + 40);
}

#[test]
fn uc_delivers_whole_messages_and_drops_broken_ones() {
    let mut a = Config::rc(0x11, 0x22);
    a.qp_type = QpType::Uc;
    a.path_mtu = Mtu::Mtu256;
    let mut b = Config::rc(0x22, 0x11);
    b.qp_type = QpType::Uc;
    b.path_mtu = Mtu::Mtu256;
    let mut net = Net::new(a, b, 3);
    net.faults = Faults {
        drop: 150,
        ..Faults::default()
    };
    let n = 40u64;
    let (src, _) = net.sides[0].mem.register(0x1000, 64 << 10, Access::NONE);
    let (rcv, _) = net.sides[1]
        .mem
        .register(0x100000, 64 << 10, Access::LOCAL_WRITE);
    for i in 0..n {
        net.sides[0]
            .mem
            .write(src, 0x1000 + i * 1024, &pattern(i, 1000));
        let sge = [Sge {
            addr: 0x100000 + i * 1024,
            length: 1024,
            lkey: rcv,
        }];
        net.sides[1]
            .t
            .post_recv(&RecvWr {
                wr_id: 100 + i,
                sg_list: &sge,
            })
            .unwrap();
    }
    for i in 0..n {
        let sg = [Sge {
            addr: 0x1000 + i * 1024,
            length: 1000,
            lkey: src,
        }];
        let s = &mut net.sides[0];
        s.t.post_send(&SendWr::<()>::new(i, SendOp::Send, &sg), &mut s.mem)
            .unwrap();
    }
    net.run(Duration::from_secs(1));
    assert_eq!(
        net.sides[0].wcs.len(),
        n as usize,
        "UC completes every send locally"
    );
    let got = &net.sides[1].wcs;
    assert!(
        !got.is_empty() && got.len() < n as usize,
        "some messages lost, some delivered: {}",
        got.len()
    );
    // Every delivered message is whole and right; receives are used in order.
    for (j, wc) in got.iter().enumerate() {
        assert_eq!(wc.wr_id, 100 + j as u64);
        assert_eq!(wc.byte_len, 1000);
    }
    let mut sent = (0..n).map(|i| pattern(i, 1000));
    for j in 0..got.len() as u64 {
        let buf = net.sides[1].mem.read(rcv, 0x100000 + j * 1024, 1000);
        assert!(
            sent.any(|s| s == buf),
            "delivered message {j} is one of the sent ones, whole"
        );
    }
    assert_eq!(net.sides[1].t.counters().naks_sent, 0);
}
