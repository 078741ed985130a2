//! PD, CQ, MR, SRQ and AV: creation, limits, the values they refuse.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use al::Error;
use provider::{
    Access, AsyncEvent, AvAttr, CqArm, CqInit, Device, GrhAttr, QpCaps, QpInit, QpType, RecvWr,
    RegisteredBuffer, SendOp, SendWr, SrqInit, Wc, WcOpcode,
};

use crate::fixture::{Fixture, Side};
use crate::harness::*;

/// PDs are allocated and freed, several at a time; objects made in a PD
/// work, and the PD can go once they are gone.
pub fn pd_alloc_and_dealloc<F: Fixture>(f: &F) {
    let dev = f.device(Side::A);
    let pds: Vec<_> = (0..4).map(|_| dev.alloc_pd().unwrap()).collect();
    let buf = RegisteredBuffer::new(64);
    for pd in &pds {
        let mr = dev
            .register_mr(pd, &buf, 0, 64, 0x1000, Access::LOCAL_WRITE)
            .unwrap();
        dev.deregister_mr(mr).unwrap();
    }
    for pd in pds {
        dev.dealloc_pd(pd).unwrap();
    }
}

/// A CQ polls empty, returns completions in order, in batches no larger
/// than the output, and is destroyed; a capacity above `max_cqe` is
/// refused.
pub fn cq_create_poll_and_destroy<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let max = a.dev.query().max_cqe;
    invalid(a.dev.create_cq(CqInit {
        capacity: max.saturating_add(1),
        ..CqInit::default()
    }));
    let mut out = [Wc::default(); 8];
    assert_eq!(a.dev.poll_cq(&a.scq, &mut out).unwrap(), 0);
    assert_eq!(a.dev.poll_cq(&a.scq, &mut out[..0]).unwrap(), 0);

    let (qa, _qb) = pair(&a, &b, QpType::Rc, ALL);
    let src = a.mem(64, 1, ALL);
    let dst = b.mem(64, 0, ALL);
    for i in 0..5u64 {
        a.send(
            &qa,
            SendWr::new(
                100 + i,
                SendOp::Write {
                    remote_addr: dst.iova + i * 8,
                    rkey: dst.rkey,
                },
                &[src.sge(0, 8)],
            ),
        );
    }
    // Wait for all five (through the fixture), then check the order.
    let wcs = a.wait(&a.scq, 5);
    for (i, wc) in wcs.iter().enumerate() {
        ok(wc, 100 + i as u64, WcOpcode::RdmaWrite, 8);
        assert_eq!(wc.qp_num, a.qpn(&qa));
    }
    // Batches: a two-entry output never gets more than two.
    for i in 0..3u64 {
        a.send(
            &qa,
            SendWr::new(
                200 + i,
                SendOp::Write {
                    remote_addr: dst.iova,
                    rkey: dst.rkey,
                },
                &[src.sge(0, 8)],
            ),
        );
    }
    let mut ids = Vec::new();
    let end = std::time::Instant::now() + f.deadline();
    while ids.len() < 3 {
        assert!(std::time::Instant::now() < end, "only {ids:?} completed");
        let n = a.dev.poll_cq(&a.scq, &mut out[..2]).unwrap();
        assert!(n <= 2);
        ids.extend(out[..n].iter().map(|w| w.wr_id));
        f.progress();
    }
    assert_eq!(ids, [200, 201, 202]);
    drop(qa);
    let cq = a
        .dev
        .create_cq(CqInit {
            capacity: 1,
            ..CqInit::default()
        })
        .unwrap();
    a.dev.destroy_cq(cq).unwrap();
}

/// A CQ that receives more completions than it holds raises
/// `AsyncEvent::CqOverflow` through its hook; the completions it held
/// stay pollable. (A provider may round the capacity up: the check keeps
/// completing work until the event comes, within a bound.)
pub fn cq_overflow_raises_the_async_event<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let small = a
        .dev
        .create_cq(CqInit {
            capacity: 2,
            on_completion: None,
            on_async_error: Some(Arc::new(move |e| ev.lock().unwrap().push(e))),
        })
        .unwrap();
    let qa = a
        .dev
        .create_qp(
            &a.pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &small,
                recv_cq: &a.rcq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
            },
        )
        .unwrap();
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.qpn(&qb), &Conn::default());
    b.connect(&qb, &a, a.qpn(&qa), &Conn::default());
    const SLOTS: u64 = 512;
    let dst = b.mem(8 * SLOTS as usize, 0, ALL);
    let src = a.mem(8 * SLOTS as usize, 0, ALL);
    let value = |i: u64| [(i % 251) as u8 + 1; 8];
    for i in 0..SLOTS {
        src.write(8 * i as usize, &value(i));
    }
    let mut posted = 0;
    while events.lock().unwrap().is_empty() {
        assert!(posted < SLOTS, "no CqOverflow after {posted} completions");
        a.send(
            &qa,
            SendWr::new(
                posted,
                SendOp::Write {
                    remote_addr: dst.iova + 8 * posted,
                    rkey: dst.rkey,
                },
                &[src.sge(8 * posted, 8)],
            ),
        );
        // Let the write land before the next (the CQ is not polled).
        wait_bytes(f, &dst, 8 * posted as usize, &value(posted));
        posted += 1;
        f.progress();
    }
    assert!(posted > 2, "a 2-entry CQ held fewer than 2 completions");
    let e = events.lock().unwrap()[0].clone();
    assert!(
        matches!(e, AsyncEvent::CqOverflow { lost } if lost >= 1),
        "{e:?}"
    );
    let mut out = [Wc::default(); 4];
    let n = a.dev.poll_cq(&small, &mut out).unwrap();
    assert!(n >= 2, "the held completions are still there ({n})");
    assert_eq!(out[0].wr_id, 0, "the oldest completion is kept");
}

/// `arm_cq(NextCompletion)` calls the completion hook once for the next
/// completion; unarmed, nothing is called; `Solicited` ignores an
/// unsolicited receive and fires on a solicited one.
pub fn cq_arm_and_notify<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let cq = a
        .dev
        .create_cq(CqInit {
            capacity: 16,
            on_completion: Some(Arc::new(move || {
                h.fetch_add(1, Ordering::SeqCst);
            })),
            on_async_error: None,
        })
        .unwrap();
    let qa = a
        .dev
        .create_qp(
            &a.pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &a.scq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: true,
            },
        )
        .unwrap();
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.qpn(&qb), &Conn::default());
    b.connect(&qb, &a, a.qpn(&qa), &Conn::default());
    for i in 0..4 {
        a.recv(&qa, i, &[]);
    }
    let send = |id: u64, solicited: bool| {
        let wr = SendWr::new(id, SendOp::Send, &[]);
        b.send(&qb, if solicited { wr.solicited() } else { wr });
        b.wait_send();
    };
    let wait_hits = |n: usize| {
        let end = std::time::Instant::now() + f.deadline();
        while hits.load(Ordering::SeqCst) < n && std::time::Instant::now() < end {
            f.progress();
            std::thread::yield_now();
        }
        hits.load(Ordering::SeqCst)
    };
    send(1, false);
    assert_eq!(a.wait(&cq, 1)[0].wr_id, 0);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "not armed: no call");
    a.dev.arm_cq(&cq, CqArm::NextCompletion).unwrap();
    send(2, false);
    send(3, false);
    let wcs = a.wait(&cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (1, 2));
    assert_eq!(wait_hits(1), 1, "one call per arm");
    a.dev.arm_cq(&cq, CqArm::Solicited).unwrap();
    a.recv(&qa, 9, &[]);
    send(4, false);
    let wc = a.wait(&cq, 1)[0];
    assert!(!wc.solicited);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "unsolicited: no call");
    send(5, true);
    let wc = a.wait(&cq, 1)[0];
    assert!(wc.solicited || !f.reports_solicited(), "{wc:?}");
    assert_eq!(wait_hits(2), 2, "a solicited receive calls the hook");
}

/// MR registration: keys name the MR, the range must lie in the buffer,
/// REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE, undefined access bits
/// are refused; two live MRs have different keys.
pub fn mr_registration_rules<F: Fixture>(f: &F) {
    let (a, _b) = two(f);
    let buf = RegisteredBuffer::new(100);
    // The iova keeps the offset's place in its page (a buffer starts on a
    // page; a real device maps MRs page by page).
    let reg = |off: usize, len, access| {
        let iova = 0x1000u64.wrapping_add(off as u64);
        a.dev.register_mr(&a.pd, &buf, off, len, iova, access)
    };
    invalid(reg(0, 100, Access::REMOTE_WRITE));
    invalid(reg(0, 100, Access::REMOTE_ATOMIC));
    invalid(reg(50, 51, Access::NONE));
    invalid(reg(101, 0, Access::NONE));
    invalid(reg(usize::MAX, 2, Access::NONE));
    for bits in [0x10, 0x11, 0x8000_0001, u32::MAX] {
        invalid(reg(0, 100, Access::from_bits_retain(bits)));
    }
    let m1 = reg(50, 50, ALL).unwrap();
    let m2 = reg(0, 100, Access::REMOTE_READ).unwrap();
    let m3 = reg(0, 100, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let keys = [a.dev.mr_keys(&m1), a.dev.mr_keys(&m2), a.dev.mr_keys(&m3)];
    for i in 0..3 {
        for j in 0..i {
            assert_ne!(keys[i].0, keys[j].0, "lkeys of live MRs differ");
            assert_ne!(keys[i].1, keys[j].1, "rkeys of live MRs differ");
        }
    }
    for m in [m1, m2, m3] {
        a.dev.deregister_mr(m).unwrap();
    }
}

/// SRQ: receives posted to it serve several QPs in posting order, a QP
/// with an SRQ refuses its own receives, a QP going to ERR does not flush
/// the SRQ, a full SRQ refuses with `InsufficientResources`, and sizes
/// above the device's are refused.
pub fn srq_shared_by_several_qps<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let attr = b.dev.query();
    invalid(b.dev.create_srq(
        &b.pd,
        SrqInit {
            max_wr: attr.max_srq_wr.saturating_add(1),
            max_sge: 1,
        },
    ));
    invalid(b.dev.create_srq(
        &b.pd,
        SrqInit {
            max_wr: 1,
            max_sge: attr.max_sge.saturating_add(1),
        },
    ));
    let srq = b.srq(8, 2);
    let qa1 = a.qp(QpType::Rc);
    let qa2 = a.qp(QpType::Rc);
    let qb1 = b.qp_with(QpType::Rc, Some(&srq), false);
    let qb2 = b.qp_with(QpType::Rc, Some(&srq), false);
    let c = Conn::default();
    a.connect(&qa1, &b, b.qpn(&qb1), &c);
    b.connect(&qb1, &a, a.qpn(&qa1), &c);
    a.connect(&qa2, &b, b.qpn(&qb2), &c);
    b.connect(&qb2, &a, a.qpn(&qa2), &c);
    let dst = b.mem(64, 0, ALL);
    let post = |id: u64, sges: &[provider::Sge]| {
        b.dev
            .post_srq_recv(
                &srq,
                &[RecvWr {
                    wr_id: id,
                    sg_list: sges,
                }],
            )
            .map(|_| ())
    };
    post(1, &[dst.sge(0, 32)]).unwrap();
    post(2, &[dst.sge(32, 16), dst.sge(48, 16)]).unwrap();
    assert!(b
        .dev
        .post_recv(
            &qb1,
            &[RecvWr {
                wr_id: 3,
                sg_list: &[]
            }]
        )
        .is_err());
    let src = a.mem(32, 0, ALL);
    src.write(0, b"first...second..........sixteen.");
    a.send(&qa2, SendWr::new(1, SendOp::Send, &[src.sge(0, 8)]));
    let w1 = b.wait_recv();
    a.send(&qa1, SendWr::new(2, SendOp::Send, &[src.sge(8, 24)]));
    let w2 = b.wait_recv();
    ok(&w1, 1, WcOpcode::Recv, 8);
    assert_eq!(w1.qp_num, b.qpn(&qb2));
    ok(&w2, 2, WcOpcode::Recv, 24);
    assert_eq!(w2.qp_num, b.qpn(&qb1));
    assert_eq!(&dst.read(0, 8), b"first...");
    assert_eq!(&dst.read(32, 24), b"second..........sixteen.");
    assert_eq!(a.wait(&a.scq, 2).len(), 2);
    // An SRQ receive survives its QP's error: qb2 still gets it.
    post(9, &[dst.sge(0, 8)]).unwrap();
    b.modify(&qb1, provider::QpModify::to(provider::QpState::Err))
        .unwrap();
    b.assert_empty(&b.rcq, "SRQ receives are not flushed by a QP error");
    a.send(&qa2, SendWr::new(3, SendOp::Send, &[src.sge(0, 4)]));
    ok(&b.wait_recv(), 9, WcOpcode::Recv, 4);
    // Fill it: at least the 8 entries asked for fit, then a post is
    // refused (a provider may round the size up).
    let mut n = 0;
    let full = loop {
        match post(20 + n, &[]) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n <= 4096, "an 8-entry SRQ took {n} receives");
    };
    assert!(n >= 8, "an 8-entry SRQ refused its {}th receive", n + 1);
    assert!(matches!(full, Error::InsufficientResources(_)), "{full:?}");
}

/// AVs: one that reaches the peer is made and destroyed; one naming a port
/// the device does not have, an SL above 15 or a flow label above 20 bits
/// is refused (also as a QP's primary or alternate path).
pub fn av_create_and_bounds<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let av = a.av(&b);
    a.dev.destroy_av(av).unwrap();
    let g = a.dev.create_av(&a.pd, &a.grh_av_attr(&b)).unwrap();
    a.dev.destroy_av(g).unwrap();
    let ports = a.dev.query().num_ports;
    let good = a.av_attr(&b);
    let grh = |flow_label| GrhAttr {
        dgid: b.ep.gid,
        sgid_index: a.ep.gid_index,
        flow_label,
        hop_limit: 64,
        traffic_class: 0,
    };
    let bad = [
        AvAttr { port: 0, ..good },
        AvAttr {
            port: ports + 1,
            ..good
        },
        AvAttr { port: 255, ..good },
        AvAttr { sl: 16, ..good },
        AvAttr {
            grh: Some(grh(1 << 20)),
            ..good
        },
    ];
    for attr in bad {
        invalid(a.dev.create_av(&a.pd, &attr));
        let qp = a.qp(QpType::Rc);
        a.init(&qp, Access::NONE).unwrap();
        let c = Conn::default();
        let mut m = a.rtr(&qp, &b, 0x100, &c);
        m.av = Some(attr);
        invalid(a.modify(&qp, m));
        let mut m = a.rtr(&qp, &b, 0x100, &c);
        m.alt_av = Some(attr);
        invalid(a.modify(&qp, m));
        assert_eq!(
            a.state(&qp),
            provider::QpState::Init,
            "a refused modify changes nothing"
        );
    }
    // The largest SL and flow label fit.
    let edge = AvAttr {
        sl: 15,
        grh: Some(grh(0xf_ffff)),
        ..good
    };
    a.dev.create_av(&a.pd, &edge).unwrap();
}
