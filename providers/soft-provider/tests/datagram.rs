//! Soft-provider datagram behaviours: fault injection, QP1 MADs with
//! P_Key tables set by `HcaConfig` (and the drop counters), and
//! `SoftProvider`. The provider-generic UD checks (Q_Key, GRH area, MTU
//! bound) and CQ overflow are in the conformance suite (`conformance/`).

mod common;
use common::*;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

fn recv_on(q: &SoftQp, mr: &SoftMr, n: u64, size: u32) {
    for i in 0..n {
        q.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[mr.sge(i * size as u64, size)],
        }])
        .unwrap();
    }
}

#[test]
fn fault_injection_on_ud_is_deterministic() {
    fn run(seed: u64) -> (Vec<u64>, FabricStats) {
        let (f, a, b) = two();
        let qa = ud_qp(&a, 9);
        let qb = ud_qp(&b, 9);
        let bbuf = RegisteredBuffer::new(64 * 64);
        let bmr = b.pd.register(&bbuf, ALL).unwrap();
        recv_on(&qb, &bmr, 64, 64);
        let abuf = RegisteredBuffer::new(8 * 40);
        let amr = a.pd.register(&abuf, ALL).unwrap();
        let av = a.hca.create_av(&a.pd, &AvAttr::lid(1, b.lid)).unwrap();
        f.set_faults(Some(FaultConfig {
            seed,
            drop: 0.2,
            duplicate: 0.2,
            reorder: 0.1,
            delay: 0.1,
            max_delay: 3,
        }));
        for i in 0..40u64 {
            abuf.write(i as usize * 8, &i.to_le_bytes()).unwrap();
            qa.post_send(&[SendWr::new(i, SendOp::Send, &[amr.sge(i * 8, 8)])
                .unsignaled()
                .to(UdDest {
                    av: &av,
                    remote_qpn: qb.qpn(),
                    remote_qkey: 9,
                    pkey_index: 0,
                })])
            .unwrap();
        }
        assert!(b.rcq.is_empty(), "queued until progress");
        f.settle(100);
        assert_eq!(f.queued(), 0);
        let mut got = Vec::new();
        while let Some(wc) = b.rcq.poll_one() {
            let mut x = [0; 8];
            bbuf.read(wc.wr_id as usize * 64 + GRH_SIZE, &mut x)
                .unwrap();
            got.push(u64::from_le_bytes(x));
        }
        (got, f.stats())
    }
    let (x, sx) = run(42);
    let (y, sy) = run(42);
    assert_eq!(x, y, "same seed, same outcome");
    assert_eq!(sx, sy);
    assert!(sx.dropped_fault > 0 && sx.duplicated > 0, "{sx:?}");
    assert_eq!(
        x.len() as u64,
        40 - sx.dropped_fault + sx.duplicated,
        "every surviving copy arrives"
    );
    let (z, _) = run(7);
    assert_ne!(x, z, "another seed, another outcome");
    // Without faults nothing is lost.
    let (f, a, b) = two();
    let qa = ud_qp(&a, 9);
    let qb = ud_qp(&b, 9);
    let bbuf = RegisteredBuffer::new(64);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    recv_on(&qb, &bmr, 1, 64);
    f.set_faults(Some(FaultConfig::queued(1)));
    let av = a.hca.create_av(&a.pd, &AvAttr::lid(1, b.lid)).unwrap();
    qa.post_send(&[SendWr::new(0, SendOp::Send, &[]).to(UdDest {
        av: &av,
        remote_qpn: qb.qpn(),
        remote_qkey: 9,
        pkey_index: 0,
    })])
    .unwrap();
    assert_eq!(f.queued(), 1);
    assert_eq!(f.progress(), 1);
    assert!(b.rcq.poll_one().is_some());
}

#[test]
fn rc_is_not_subject_to_faults() {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    f.set_faults(Some(FaultConfig {
        seed: 1,
        drop: 1.0,
        ..FaultConfig::default()
    }));
    let bbuf = RegisteredBuffer::new(8);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bmr.sge(0, 8)],
    }])
    .unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[])]).unwrap();
    assert_eq!(poll1(&b.rcq).status, WcStatus::Success);
}

fn gsi(n: &Node, port: u8) -> SoftQp {
    let q = n
        .hca
        .create_gsi_qp(
            &n.pd,
            port,
            &QpInit {
                qp_type: QpType::Gsi,
                send_cq: &n.scq,
                recv_cq: &n.rcq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
            },
        )
        .unwrap();
    q.modify(&QpModify::to(QpState::Init).pkey_index(0).qkey(GSI_QKEY))
        .unwrap();
    q.modify(&QpModify::to(QpState::Rtr)).unwrap();
    q.modify(&QpModify::to(QpState::Rts).sq_psn(0)).unwrap();
    q
}

#[test]
fn qp1_mads_with_pkey_and_qkey_checks() {
    let f = Fabric::new();
    let mut ca = HcaConfig::new(0xa, &[1]);
    ca.ports[0].pkeys = vec![0xffff, 0x8001, 0x0002];
    let mut cb = HcaConfig::new(0xb, &[2]);
    cb.ports[0].pkeys = vec![0xffff, 0x8003];
    f.add_hca(ca).unwrap();
    f.add_hca(cb).unwrap();
    let mk = |guid, lid| {
        let hca = f.hca(guid).unwrap();
        let pd = hca.alloc_pd().unwrap();
        let cq = || {
            hca.create_cq(CqInit {
                capacity: 64,
                ..CqInit::default()
            })
            .unwrap()
        };
        Node {
            scq: cq(),
            rcq: cq(),
            pd,
            hca,
            lid,
        }
    };
    let a = mk(0xa, 1);
    let b = mk(0xb, 2);
    let qa = gsi(&a, 1);
    let qb = gsi(&b, 1);
    assert_eq!((qa.qpn(), qb.qpn()), (1, 1));
    assert!(matches!(
        a.hca.create_gsi_qp(
            &a.pd,
            1,
            &QpInit {
                qp_type: QpType::Gsi,
                send_cq: &a.scq,
                recv_cq: &a.rcq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
            }
        ),
        Err(al::Error::ResourceBusy(_))
    ));
    let mad = RegisteredBuffer::from_vec(pattern(MAD_SIZE, 0x42));
    let amr = a.pd.register(&mad, ALL).unwrap();
    let inbox = RegisteredBuffer::new(8 * (MAD_SIZE + GRH_SIZE));
    let bmr = b.pd.register(&inbox, ALL).unwrap();
    recv_on(&qb, &bmr, 8, (MAD_SIZE + GRH_SIZE) as u32);
    let av = a.hca.create_av(&a.pd, &AvAttr::lid(1, b.lid)).unwrap();
    let send = |id, qkey, pkey_index| {
        qa.post_send(&[
            SendWr::new(id, SendOp::Send, &[amr.sge(0, MAD_SIZE as u32)]).to(UdDest {
                av: &av,
                remote_qpn: 1,
                remote_qkey: qkey,
                pkey_index,
            }),
        ])
        .unwrap();
        assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    };
    // Good MAD with the default P_Key.
    send(1, GSI_QKEY, 0);
    let wc = poll1(&b.rcq);
    assert_eq!(
        (wc.status, wc.byte_len),
        (WcStatus::Success, (MAD_SIZE + GRH_SIZE) as u32)
    );
    assert_eq!((wc.src_qp, wc.qp_num, wc.pkey_index), (1, 1, 0));
    let mut got = vec![0; MAD_SIZE];
    inbox.read(GRH_SIZE, &mut got).unwrap();
    assert_eq!(got, pattern(MAD_SIZE, 0x42));
    // Wrong Q_Key: rejected.
    send(2, 0x1234, 0);
    assert!(b.rcq.is_empty());
    assert_eq!(f.stats().dropped_qkey, 1);
    // P_Key 0x8001 is not in b's table: rejected.
    send(3, GSI_QKEY, 1);
    assert!(b.rcq.is_empty());
    // Limited 0x0002 vs absent: rejected.
    send(4, GSI_QKEY, 2);
    assert!(b.rcq.is_empty());
    assert_eq!(f.stats().dropped_pkey, 2);
    // A MAD longer than 256 bytes cannot be sent.
    let big = RegisteredBuffer::new(MAD_SIZE + 1);
    let bigmr = a.pd.register(&big, ALL).unwrap();
    qa.post_send(&[
        SendWr::new(5, SendOp::Send, &[bigmr.sge(0, MAD_SIZE as u32 + 1)]).to(UdDest {
            av: &av,
            remote_qpn: 1,
            remote_qkey: GSI_QKEY,
            pkey_index: 0,
        }),
    ])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::LocalLengthError);
    // QP1 traffic also goes through fault injection.
    qa.modify(&QpModify::to(QpState::Rts)).unwrap();
    f.set_faults(Some(FaultConfig {
        seed: 3,
        duplicate: 1.0,
        ..FaultConfig::default()
    }));
    send(6, GSI_QKEY, 0);
    assert!(b.rcq.is_empty());
    f.settle(10);
    assert_eq!(b.rcq.len(), 2, "duplicated");
    // Reply b -> a on QP1 works too (pkey index 1 on b = 0x8003 is not in
    // a's table; index 0 is).
    let ainbox = RegisteredBuffer::new(MAD_SIZE + GRH_SIZE);
    let ainmr = a.pd.register(&ainbox, ALL).unwrap();
    recv_on(&qa, &ainmr, 1, (MAD_SIZE + GRH_SIZE) as u32);
    f.set_faults(None);
    let bav = b.hca.create_av(&b.pd, &AvAttr::lid(1, a.lid)).unwrap();
    qb.post_send(&[
        SendWr::new(7, SendOp::Send, &[bmr.sge(GRH_SIZE as u64, 256)]).to(UdDest {
            av: &bav,
            remote_qpn: 1,
            remote_qkey: GSI_QKEY,
            pkey_index: 0,
        }),
    ])
    .unwrap();
    assert_eq!(poll1(&a.rcq).src_qp, 1);
}

#[test]
fn provider_trait_drives_the_soft_hca() {
    fn roundtrip<D: Device>(dev: &D) -> usize {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev
            .create_cq(CqInit {
                capacity: 8,
                ..CqInit::default()
            })
            .unwrap();
        let buf = RegisteredBuffer::new(64);
        let mr = dev.register_mr(&pd, &buf, 0, 64, 0, ALL).unwrap();
        let (lkey, _) = dev.mr_keys(&mr);
        let qp = dev
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Ud,
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: QpCaps::default(),
                    sq_sig_all: true,
                },
            )
            .unwrap();
        dev.modify_qp(
            &qp,
            &QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(3),
        )
        .unwrap();
        dev.modify_qp(&qp, &QpModify::to(QpState::Rtr)).unwrap();
        dev.modify_qp(&qp, &QpModify::to(QpState::Rts).sq_psn(0))
            .unwrap();
        let sge = Sge {
            addr: 0,
            length: 64,
            lkey,
        };
        dev.post_recv(
            &qp,
            &[RecvWr {
                wr_id: 1,
                sg_list: &[sge],
            }],
        )
        .unwrap();
        let lid = dev.query_port(1).unwrap().lid;
        let av = dev.create_av(&pd, &AvAttr::lid(1, lid)).unwrap();
        let small = Sge { length: 8, ..sge };
        let wr = SendWr::new(2, SendOp::Send, std::slice::from_ref(&small)).to(UdDest {
            av: &av,
            remote_qpn: dev.qp_num(&qp),
            remote_qkey: 3,
            pkey_index: 0,
        });
        dev.post_send(&qp, &[wr], &|_| Some(&av)).unwrap();
        let mut wcs = [Wc::default(); 4];
        let n = dev.poll_cq(&cq, &mut wcs).unwrap();
        dev.destroy_qp(qp).unwrap();
        dev.deregister_mr(mr).unwrap();
        n
    }
    let f = Fabric::new();
    f.add_hca(HcaConfig::new(0x77, &[9])).unwrap();
    let p = SoftProvider::new(f);
    assert_eq!(p.devices().len(), 1);
    let dev = p.open(0x77).unwrap();
    assert!(p.open(0x78).is_err());
    assert_eq!(dev.query().num_ports, 1);
    assert_eq!(roundtrip(&dev), 2, "loopback send and receive");
}
