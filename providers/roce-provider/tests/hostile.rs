//! Hostile input: datagrams from a plain UDP socket that are garbage,
//! truncated, oversized, have a bad ICRC, name no QP, or carry a wrong
//! P_Key, Q_Key, PSN or R_Key. Each is dropped or NAKed and counted in
//! the port's counters, nothing panics, and a real exchange still works
//! afterwards. Also: the GSI QP (QP1) exchanges MADs and drops a wrong
//! Q_Key, and dropping a device frees its threads and sockets.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Mtu, Provider, QpCaps, QpInit, QpModify, QpState,
    QpType, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, UdDest, Wc, WcOpcode, WcStatus,
    GRH_SIZE, GSI_QKEY, MAD_SIZE,
};
use roce::{icrc, Bth, Deth, Endpoints, Headers, Opcode, Packet};
use roce_provider::{
    DeviceConfig, PortConfig, PortCounters, RoceCq, RoceDevice, RoceMr, RocePd, RoceProvider,
    RoceQp,
};

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn provider() -> RoceProvider {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    RoceProvider::new(vec![
        DeviceConfig::new("a", 1, vec![port("127.0.0.1")]),
        DeviceConfig::new("b", 2, vec![port("127.0.0.2")]),
    ])
}

struct Side {
    dev: RoceDevice,
    pd: RocePd,
    cq: RoceCq,
}

impl Side {
    fn new(dev: RoceDevice) -> Side {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev
            .create_cq(CqInit {
                capacity: 64,
                ..CqInit::default()
            })
            .unwrap();
        Side { dev, pd, cq }
    }
    fn gid(&self) -> [u8; 16] {
        self.dev.query_port(1).unwrap().gid_table[0]
    }
    fn av_to(&self, to: &Side) -> AvAttr {
        AvAttr {
            grh: Some(GrhAttr {
                dgid: to.gid(),
                sgid_index: 0,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..AvAttr::lid(1, 0)
        }
    }
    fn mem(&self, len: usize) -> (RegisteredBuffer, RoceMr, u32) {
        let buf = RegisteredBuffer::new(len);
        let mr = self
            .dev
            .register_mr(&self.pd, &buf, 0, len, 0, ALL)
            .unwrap();
        let key = self.dev.mr_keys(&mr).0;
        (buf, mr, key)
    }
    fn qp(&self, ty: QpType) -> RoceQp {
        self.dev
            .create_qp(
                &self.pd,
                &QpInit {
                    qp_type: ty,
                    send_cq: &self.cq,
                    recv_cq: &self.cq,
                    srq: None,
                    caps: QpCaps::default(),
                    sq_sig_all: false,
                },
            )
            .unwrap()
    }
    fn connect(&self, qp: &RoceQp, to: &Side, dqpn: u32) {
        let rc = self.dev.query_qp(qp).unwrap().qp_type == QpType::Rc;
        let m = |s| QpModify::to(s);
        self.dev
            .modify_qp(qp, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
            .unwrap();
        let mut rtr = m(QpState::Rtr)
            .av(self.av_to(to))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(dqpn)
            .rq_psn(0);
        let mut rts = m(QpState::Rts).sq_psn(0);
        if rc {
            rtr = rtr.max_dest_rd_atomic(1).min_rnr_timer(1);
            rts = rts.timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1);
        }
        self.dev.modify_qp(qp, &rtr).unwrap();
        self.dev.modify_qp(qp, &rts).unwrap();
    }
    fn ud(&self, qp: &RoceQp, qkey: u32) {
        let d = &self.dev;
        let mut init = QpModify::to(QpState::Init).pkey_index(0);
        if d.query_qp(qp).unwrap().qp_type != QpType::Gsi {
            init = init.port(1);
        }
        d.modify_qp(qp, &init.qkey(qkey)).unwrap();
        d.modify_qp(qp, &QpModify::to(QpState::Rtr)).unwrap();
        d.modify_qp(qp, &QpModify::to(QpState::Rts).sq_psn(0))
            .unwrap();
    }
    fn wait(&self, n: usize) -> Vec<Wc> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        let mut buf = [Wc::default(); 8];
        while got.len() < n && Instant::now() < end {
            let k = self.dev.poll_cq(&self.cq, &mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        assert_eq!(got.len(), n, "{got:#?}");
        got
    }
    fn counters(&self) -> PortCounters {
        self.dev.port_counters(1).unwrap()
    }
}

/// Wait until `f(counters)` holds (the driver thread counts
/// asynchronously).
fn until(side: &Side, what: &str, f: impl Fn(&PortCounters) -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f(&side.counters()) {
        assert!(Instant::now() < end, "{what}: {:#?}", side.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A SEND from `a`'s RC QP to `b`'s lands.
fn exchange(a: &Side, b: &Side, qa: &RoceQp, qb: &RoceQp, id: u64) {
    let (sbuf, _smr, skey) = a.mem(64);
    sbuf.write(0, b"still alive").unwrap();
    let (rbuf, _rmr, rkey) = b.mem(64);
    let rs = [Sge {
        addr: 0,
        length: 64,
        lkey: rkey,
    }];
    b.dev
        .post_recv(
            qb,
            &[RecvWr {
                wr_id: id,
                sg_list: &rs,
            }],
        )
        .unwrap();
    let ss = [Sge {
        addr: 0,
        length: 11,
        lkey: skey,
    }];
    a.dev
        .post_send::<()>(qa, &[SendWr::new(id, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    let (s, r) = if std::ptr::eq(a, b) {
        // One CQ gets both, in either order.
        let w = a.wait(2);
        let send = w[0].opcode == WcOpcode::Send;
        if send {
            (w[0], w[1])
        } else {
            (w[1], w[0])
        }
    } else {
        (a.wait(1)[0], b.wait(1)[0])
    };
    assert_eq!((s.wr_id, s.status), (id, WcStatus::Success));
    assert_eq!((r.wr_id, r.status, r.byte_len), (id, WcStatus::Success, 11));
    let mut out = [0u8; 11];
    rbuf.read(0, &mut out).unwrap();
    assert_eq!(&out, b"still alive");
}

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

/// Buffers in flight (`docs/memory.md`): a posted receive, and the local
/// target of a READ until its completion, refuse the application's
/// writes; an unsignaled READ that succeeds completes silently.
#[test]
fn receives_and_read_targets_are_in_flight() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let (abuf, _amr, akey) = a.mem(64);
    let (bbuf, _bmr, bkey) = b.mem(64);
    // A posted receive blocks its bytes until the SEND lands.
    let rs = [Sge {
        addr: 0,
        length: 16,
        lkey: bkey,
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
    assert!(bbuf.write(8, b"no").is_err());
    bbuf.write(32, b"elsewhere").unwrap();
    let ss = [Sge {
        addr: 0,
        length: 4,
        lkey: akey,
    }];
    a.dev
        .post_send::<()>(&qa, &[SendWr::new(1, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    bbuf.write(8, b"ok").unwrap();
    // An unsignaled READ completes silently; the signaled SEND after it
    // is the only completion.
    let read = SendWr::new(
        7,
        SendOp::Read {
            remote_addr: 32,
            rkey: bkey,
        },
        &ss,
    )
    .unsignaled();
    b.dev
        .post_recv(
            &qb,
            &[RecvWr {
                wr_id: 2,
                sg_list: &rs,
            }],
        )
        .unwrap();
    a.dev
        .post_send::<()>(&qa, &[read, SendWr::new(8, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::Success));
    let mut got = [0u8; 4];
    abuf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"else");
    assert_eq!(b.wait(1)[0].wr_id, 2);

    // A READ towards a QP that does not answer: its target is in flight
    // until RETRY_EXC_ERR.
    let lone = a.qp(QpType::Rc);
    let dead = b.qp(QpType::Rc);
    let m = |s| QpModify::to(s);
    let d = &a.dev;
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rts)
            .sq_psn(0)
            .timeout(12)
            .retry_cnt(1)
            .rnr_retry(0)
            .max_rd_atomic(1),
    )
    .unwrap();
    let target = [Sge {
        addr: 16,
        length: 8,
        lkey: akey,
    }];
    let read = SendWr::new(
        9,
        SendOp::Read {
            remote_addr: 0,
            rkey: bkey,
        },
        &target,
    );
    d.post_send::<()>(&lone, &[read], &|_| None).unwrap();
    assert!(
        abuf.write(20, b"busy").is_err(),
        "the READ target is leased"
    );
    abuf.write(40, b"free").unwrap();
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RetryExceeded));
    abuf.write(20, b"free").unwrap();
}

/// A long SEND or WRITE is read from its MR as its packets go
/// (`roce_transport::LEASE_MIN` and up), so its source is in flight until
/// the request leaves the queue: completed (signaled or not), failed, or
/// dropped with its QP. Shorter ones are copied at post and free at once.
#[test]
fn long_send_sources_are_in_flight_until_they_complete() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    const LONG: usize = 300 << 10;
    let (abuf, _amr, akey) = a.mem(LONG + 64);
    let (bbuf, _bmr, bkey) = b.mem(LONG + 64);
    let data: Vec<u8> = (0..LONG).map(|i| (i * 7 + i / 4096) as u8).collect();
    abuf.write(0, &data).unwrap();
    let long = [Sge {
        addr: 0,
        length: LONG as u32,
        lkey: akey,
    }];
    let short = [Sge {
        addr: LONG as u64,
        length: 64,
        lkey: akey,
    }];
    // Each WRITE lands where its source lies.
    fn write(wr_id: u64, sg: &[Sge; 1], bkey: u32) -> SendWr<'_, ()> {
        SendWr::new(
            wr_id,
            SendOp::Write {
                remote_addr: sg[0].addr,
                rkey: bkey,
            },
            sg,
        )
    }
    // An unsignaled long WRITE, then a signaled short one: when the short
    // one completes the long one has (in order), and both sources are free.
    a.dev
        .post_send::<()>(
            &qa,
            &[write(1, &long, bkey).unsignaled(), write(2, &short, bkey)],
            &|_| None,
        )
        .unwrap();
    abuf.write(LONG, b"short: copied at post").unwrap();
    assert_eq!(a.wait(1)[0].wr_id, 2);
    abuf.write(0, b"free again").unwrap();
    let mut got = vec![0u8; LONG];
    bbuf.read(0, &mut got).unwrap();
    assert!(got == data, "the long WRITE landed byte for byte");

    // Towards a QP that never answers: in flight until RETRY_EXC_ERR.
    let lone = a.qp(QpType::Rc);
    let dead = b.qp(QpType::Rc);
    let m = |s| QpModify::to(s);
    let d = &a.dev;
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    let rts = m(QpState::Rts)
        .sq_psn(0)
        .timeout(12)
        .retry_cnt(1)
        .rnr_retry(0)
        .max_rd_atomic(1);
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(3, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err(), "the source is leased");
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RetryExceeded));
    abuf.write(100, b"free").unwrap();

    // Reset with a long WRITE queued: the lease goes with the transport.
    d.modify_qp(&lone, &m(QpState::Reset)).unwrap();
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(4, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err());
    d.modify_qp(&lone, &m(QpState::Reset)).unwrap();
    abuf.write(100, b"free").unwrap();
    // And with destroy.
    for s in [QpState::Init, QpState::Rtr] {
        let mut mm = m(s);
        if s == QpState::Init {
            mm = mm.pkey_index(0).port(1).access(ALL);
        } else {
            mm = mm
                .av(a.av_to(&b))
                .path_mtu(Mtu::Mtu1024)
                .dest_qpn(b.dev.qp_num(&dead))
                .rq_psn(0)
                .max_dest_rd_atomic(1)
                .min_rnr_timer(1);
        }
        d.modify_qp(&lone, &mm).unwrap();
    }
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(5, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err());
    drop(lone);
    abuf.write(100, b"free").unwrap();
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

/// The limits `query` reports are enforced: past `max_pd` PDs (and
/// likewise CQs, SRQs, AVs, QPs, MRs) the next is refused with
/// `InsufficientResources` until one goes.
#[test]
fn device_limits_are_enforced() {
    let p = provider();
    let dev = p.open(1).unwrap();
    let max = dev.query().max_pd as usize;
    let mut pds: Vec<_> = (0..max).map(|_| dev.alloc_pd().unwrap()).collect();
    assert!(matches!(
        dev.alloc_pd(),
        Err(al::Error::InsufficientResources(_))
    ));
    pds.pop();
    pds.push(dev.alloc_pd().unwrap());
}
