//! Hostile input: datagrams from a plain UDP socket that are garbage,
//! truncated, oversized, have a bad ICRC, name no QP, or carry a wrong
//! P_Key, Q_Key, PSN or R_Key. Each is dropped or NAKed and counted in
//! the port's counters, nothing panics, and a real exchange still works
//! afterwards. Also: the GSI QP (QP1) exchanges MADs and drops a wrong
//! Q_Key.

mod hostile_fixture;

use std::net::UdpSocket;
use std::time::Duration;

use provider::{
    Device, Provider, QpCaps, QpInit, QpState, QpType, RecvWr, SendOp, SendWr, Sge, UdDest, Wc,
    WcOpcode, WcStatus, GRH_SIZE, GSI_QKEY, MAD_SIZE,
};
use roce::{icrc, Bth, Deth, Endpoints, Headers, Opcode, Packet};

use hostile_fixture::*;

#[test]
fn hostile_datagrams_are_dropped_and_counted() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let ud = b.qp(QpType::Ud);
    b.ud(&ud, 0x1234);
    exchange(&a, &b, &qa, &qb, 1);

    let target = b.dev.local_addr(1).unwrap();
    let evil = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ep = Endpoints::new(evil.local_addr().unwrap(), target).unwrap();
    let send = |bytes: &[u8]| {
        evil.send_to(bytes, target).unwrap();
    };
    let encode = |h: Headers, payload: &[u8]| Packet::new(h, payload).encode(&ep).unwrap();
    let before = b.counters();

    // Garbage, empty, truncated, oversized.
    send(&[]);
    send(&[0xff; 7]);
    send(&[0x04, 0, 0]);
    send(&(0..200u32).map(|i| (i * 37) as u8).collect::<Vec<_>>());
    send(&vec![0u8; 6000]);
    until(&b, "garbage", |c| {
        c.rx_datagrams >= before.rx_datagrams + 5
            && c.rx_truncated > before.rx_truncated
            && c.rx_oversized > before.rx_oversized
            && c.rx_decode_error + c.rx_bad_icrc > before.rx_decode_error + before.rx_bad_icrc
    });

    // A well-formed packet with a flipped ICRC bit.
    let qpn_b = b.dev.qp_num(&qb);
    let mut bad = encode(Headers::new(Bth::new(Opcode::RcSendOnly, qpn_b, 0)), b"x");
    let n = bad.len();
    bad[n - 1] ^= 1;
    send(&bad);
    until(&b, "bad ICRC", |c| c.rx_bad_icrc > before.rx_bad_icrc);

    // Unknown QPN, QPN 0.
    let unknown = (qpn_b + 7) & 0xff_ffff;
    send(&encode(
        Headers::new(Bth::new(Opcode::RcSendOnly, unknown, 0)),
        b"x",
    ));
    send(&encode(
        Headers::new(Bth::new(Opcode::RcSendOnly, 0, 0)),
        b"x",
    ));
    until(&b, "unknown QPN", |c| {
        c.rx_unknown_qpn >= before.rx_unknown_qpn + 2
    });

    // A sender that writes a non-zero IPv4 identification (Linux rxe):
    // its ICRC is right for that identification, which the socket does not
    // show; the port finds it and takes the packet (here: a datagram to
    // the UD QP, which has no receive posted, so it is counted there and
    // not as a bad ICRC). The ICRC is the stage's last check: the packet
    // must name a QP that takes it.
    let Endpoints::V4(mut v4) = ep else {
        panic!("an IPv4 flow")
    };
    v4.identification = 0xbeef;
    let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, b.dev.qp_num(&ud), 0));
    h.deth = Some(Deth {
        qkey: 0x1234,
        src_qp: 9,
    });
    let with_id = Packet::new(h, b"rxe-style")
        .encode(&Endpoints::V4(v4))
        .unwrap();
    let (icrc_before, no_receive_before) = {
        let c = b.counters();
        (c.rx_bad_icrc, c.rx_no_receive)
    };
    send(&with_id);
    until(&b, "IPv4 identification solved", |c| {
        c.rx_ipv4_id_solved > before.rx_ipv4_id_solved && c.rx_no_receive > no_receive_before
    });
    assert_eq!(b.counters().rx_bad_icrc, icrc_before);

    // Wrong P_Key (another partition).
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnly, qpn_b, 0));
    h.bth.pkey = 0x8001;
    send(&encode(h, b"x"));
    until(&b, "P_Key", |c| c.rx_bad_pkey > before.rx_bad_pkey);

    // Wrong Q_Key on the UD QP.
    let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, b.dev.qp_num(&ud), 0));
    h.deth = Some(Deth {
        qkey: 0x4321,
        src_qp: 9,
    });
    send(&encode(h, b"x"));
    until(&b, "Q_Key", |c| c.rx_bad_qkey > before.rx_bad_qkey);

    // A PSN far outside the window (NAKed once; the NAK goes to the
    // connected peer, which ignores it as stale).
    send(&encode(
        Headers::new(Bth::new(Opcode::RcSendOnly, qpn_b, 0x40_0000)),
        b"x",
    ));
    until(&b, "PSN", |c| {
        c.rx_out_of_sequence > before.rx_out_of_sequence
    });

    // An opcode the QP type does not take (UC SEND to an RC QP).
    send(&encode(
        Headers::new(Bth::new(Opcode::UcSendOnly, qpn_b, 1)),
        b"x",
    ));
    until(&b, "opcode", |c| c.rx_bad_opcode > before.rx_bad_opcode);

    assert_eq!(
        b.counters().rx_packets - before.rx_packets,
        2,
        "only the rxe-style UD datagram and the out-of-window PSN passed the receive stage \
         (the PSN check is the transport's)"
    );
    // The connection survives all of it.
    exchange(&a, &b, &qa, &qb, 2);
    assert_eq!(b.dev.query_qp(&qb).unwrap().state, QpState::Rts);
}

#[test]
fn a_bad_rkey_is_naked_and_counted() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let (_buf, _mr, key) = a.mem(64);
    let (_bb, _bmr, bkey) = b.mem(64);
    let sg = [Sge {
        addr: 0,
        length: 8,
        lkey: key,
    }];
    let before = b.counters();
    // The R_Key of b's MR, off by one: names nothing.
    let op = SendOp::Write {
        remote_addr: 0,
        rkey: bkey ^ 1,
    };
    a.dev
        .post_send::<()>(&qa, &[SendWr::new(1, op, &sg)], &|_| None)
        .unwrap();
    let wc = a.wait(1)[0];
    assert_eq!(wc.status, WcStatus::RemoteAccessError);
    until(&b, "NAK", |c| c.naks_sent > before.naks_sent);
    // Out of range on the right key.
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let op = SendOp::Write {
        remote_addr: 60,
        rkey: bkey,
    };
    a.dev
        .post_send::<()>(&qa, &[SendWr::new(2, op, &sg)], &|_| None)
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::RemoteAccessError);
}

#[test]
fn the_gsi_qp_carries_mads_and_checks_the_qkey() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let gsi = |s: &Side| {
        s.dev
            .create_gsi_qp(
                &s.pd,
                1,
                &QpInit {
                    qp_type: QpType::Gsi,
                    send_cq: &s.cq,
                    recv_cq: &s.cq,
                    srq: None,
                    caps: QpCaps::default(),
                    sq_sig_all: true,
                },
            )
            .unwrap()
    };
    let ga = gsi(&a);
    let gb = gsi(&b);
    assert_eq!(a.dev.qp_num(&ga), 1);
    a.ud(&ga, GSI_QKEY);
    b.ud(&gb, GSI_QKEY);
    let (rbuf, _rmr, rkey) = b.mem(2 * (GRH_SIZE + MAD_SIZE));
    for i in 0..2u64 {
        let sg = [Sge {
            addr: i * (GRH_SIZE + MAD_SIZE) as u64,
            length: (GRH_SIZE + MAD_SIZE) as u32,
            lkey: rkey,
        }];
        b.dev
            .post_recv(
                &gb,
                &[RecvWr {
                    wr_id: 10 + i,
                    sg_list: &sg,
                }],
            )
            .unwrap();
    }
    let (sbuf, _smr, skey) = a.mem(MAD_SIZE);
    sbuf.write(0, &[0x81; MAD_SIZE]).unwrap();
    let av = a.dev.create_av(&a.pd, &a.av_to(&b)).unwrap();
    let sg = [Sge {
        addr: 0,
        length: MAD_SIZE as u32,
        lkey: skey,
    }];
    let before = b.counters();
    for (id, qkey) in [(1u64, 0x1111u32), (2, GSI_QKEY)] {
        let wr = SendWr::new(id, SendOp::Send, &sg).to(UdDest {
            av: &av,
            remote_qpn: 1,
            remote_qkey: qkey,
            pkey_index: 0,
        });
        a.dev.post_send(&ga, &[wr], &|_| Some(&av)).unwrap();
        assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    }
    // A P_Key index outside the table (one entry, 0xffff) is refused.
    let wr = SendWr::new(3, SendOp::Send, &sg).to(UdDest {
        av: &av,
        remote_qpn: 1,
        remote_qkey: GSI_QKEY,
        pkey_index: 1,
    });
    assert!(matches!(
        a.dev.post_send(&ga, &[wr], &|_| Some(&av)),
        Err(al::Error::InvalidParameter(_))
    ));
    let wc = b.wait(1)[0];
    assert_eq!(
        (
            wc.wr_id,
            wc.status,
            wc.opcode,
            wc.byte_len,
            wc.src_qp,
            wc.qp_num
        ),
        (
            10,
            WcStatus::Success,
            WcOpcode::Recv,
            (GRH_SIZE + MAD_SIZE) as u32,
            1,
            1
        )
    );
    let mut mad = [0u8; MAD_SIZE];
    rbuf.read(GRH_SIZE, &mut mad).unwrap();
    assert!(mad.iter().all(|&x| x == 0x81));
    assert!(b.counters().rx_bad_qkey > before.rx_bad_qkey);
    // One GSI QP per port.
    assert!(a
        .dev
        .create_gsi_qp(
            &a.pd,
            1,
            &QpInit {
                qp_type: QpType::Gsi,
                send_cq: &a.cq,
                recv_cq: &a.cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
            },
        )
        .is_err());
}

/// Thousands of random packets with a valid ICRC (so they get past the
/// codec) aimed at live QPs of every type, first from a stranger
/// (127.0.0.77), then from the connected QPs' peer's own address. From
/// the stranger: the RC and UC QPs stay in RTS, complete nothing, and
/// their posted buffers keep their bytes (only the UD QP, which takes
/// datagrams from anyone, may complete receives, into its own buffers).
/// From the peer (which may end its own connections): no panic, every
/// datagram counted, and a fresh connection works afterwards.
#[test]
fn random_packets_with_valid_icrc_do_not_break_the_device() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let rc = b.qp(QpType::Rc);
    let peer = a.qp(QpType::Rc);
    b.connect(&rc, &a, a.dev.qp_num(&peer));
    let uc = b.qp(QpType::Uc);
    b.connect(&uc, &a, a.dev.qp_num(&peer));
    let ud = b.qp(QpType::Ud);
    b.ud(&ud, 7);
    let (buf, _mr, key) = b.mem(4096);
    buf.write(0, &[0xee; 4096]).unwrap();
    for (i, q) in [&rc, &uc, &ud].into_iter().enumerate() {
        for k in 0..8u64 {
            let sg = [Sge {
                addr: (i as u64 * 8 + k) * 64,
                length: 64,
                lkey: key,
            }];
            b.dev
                .post_recv(
                    q,
                    &[RecvWr {
                        wr_id: k,
                        sg_list: &sg,
                    }],
                )
                .unwrap();
        }
    }
    let qpns = [b.dev.qp_num(&rc), b.dev.qp_num(&uc), b.dev.qp_num(&ud), 1];
    let target = b.dev.local_addr(1).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const N: u64 = 3000;
    let mut flood = |from: &str| {
        let evil = UdpSocket::bind((from, 0)).unwrap();
        let ep = Endpoints::new(evil.local_addr().unwrap(), target).unwrap();
        let before = b.counters();
        for i in 0..N {
            let len = 12 + 4 * (rnd() % 80) as usize;
            let mut body: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            // A known opcode most of the time, a live QP, TVer 0, P_Key
            // ffff half of the time, and a PSN near 0 now and then.
            if i % 4 != 0 {
                let ops = [
                    0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x0a, 0x0b, 0x0c, 0x10, 0x11, 0x13, 0x14,
                    0x24, 0x2a, 0x64, 0x65,
                ];
                body[0] = ops[(rnd() % ops.len() as u64) as usize];
                body[1] &= 0xf0;
            }
            if i % 2 == 0 {
                body[2] = 0xff;
                body[3] = 0xff;
            }
            let q = qpns[(rnd() % 4) as usize];
            body[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
            if i % 3 == 0 {
                body[9] = 0;
                body[10] = 0;
            }
            let crc = icrc::icrc(&ep, &body).unwrap();
            body.extend_from_slice(&icrc::to_wire(crc));
            evil.send_to(&body, target).unwrap();
            if i % 256 == 0 {
                // Let the driver keep up (the socket buffer is finite).
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        until(&b, "every datagram handled", |c| {
            c.rx_datagrams >= before.rx_datagrams + N / 2
        });
        std::thread::sleep(Duration::from_millis(50));
        (before, b.counters())
    };

    // From a stranger.
    let (before, c) = flood("127.0.0.77");
    assert!(c.rx_wrong_source > before.rx_wrong_source, "{c:#?}");
    for (q, name) in [(&rc, "RC"), (&uc, "UC")] {
        assert_eq!(b.dev.query_qp(q).unwrap().state, QpState::Rts, "{name}");
    }
    let mut got = [Wc::default(); 64];
    let n = b.dev.poll_cq(&b.cq, &mut got).unwrap();
    let ud_qpn = b.dev.qp_num(&ud);
    assert!(
        got[..n].iter().all(|w| w.qp_num == ud_qpn),
        "only the UD QP completes anything: {:?}",
        &got[..n]
    );
    let mut connected = vec![0u8; 16 * 64];
    buf.read(0, &mut connected).unwrap();
    assert!(
        connected.iter().all(|&x| x == 0xee),
        "the RC and UC receive buffers are untouched"
    );
    let mut rest = vec![0u8; 4096 - 24 * 64];
    buf.read(24 * 64, &mut rest).unwrap();
    assert!(
        rest.iter().all(|&x| x == 0xee),
        "nothing outside any receive"
    );

    // From the peer's own address: the targets may end (a peer can break
    // its own connection), the device does not.
    let (before, c) = flood("127.0.0.1");
    assert!(c.rx_packets > before.rx_packets, "{c:#?}");
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    while b.dev.poll_cq(&b.cq, &mut [Wc::default(); 16]).unwrap() > 0 {}
    exchange(&a, &b, &qa, &qb, 99);
}
