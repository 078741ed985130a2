//! RC data path between two soft HCAs connected by hand.

mod common;
use common::*;
use hca::*;

#[test]
fn rc_ping_pong_all_operations() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let abuf = RegisteredBuffer::new(4096);
    let bbuf = RegisteredBuffer::new(4096);
    let amr = a.pd.register(&abuf, ALL).unwrap();
    let bmr = b.pd.register(&bbuf, ALL).unwrap();

    // SEND a -> b.
    let msg = pattern(100, 7);
    abuf.write(0, &msg).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 11,
        sg_list: &[bmr.sge(1000, 200)],
    }])
    .unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[amr.sge(0, 100)])])
        .unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(wc.byte_len, 100);
    let wc = poll1(&b.rcq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (11, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((wc.byte_len, wc.imm, wc.qp_num), (100, None, qb.qpn()));
    let mut got = vec![0; 100];
    bbuf.read(1000, &mut got).unwrap();
    assert_eq!(got, msg);

    // SEND with immediate b -> a (the pong), two SGEs gathered.
    let pong = pattern(64, 9);
    bbuf.write(0, &pong[..30]).unwrap();
    bbuf.write(500, &pong[30..]).unwrap();
    qa.post_recv(&[RecvWr {
        wr_id: 12,
        sg_list: &[amr.sge(2000, 10), amr.sge(3000, 100)],
    }])
    .unwrap();
    qb.post_send(&[SendWr::new(
        2,
        SendOp::SendImm(0xdead_beef),
        &[bmr.sge(0, 30), bmr.sge(500, 34)],
    )])
    .unwrap();
    assert_eq!(poll1(&b.scq).status, WcStatus::Success);
    let wc = poll1(&a.rcq);
    assert_eq!((wc.byte_len, wc.imm), (64, Some(0xdead_beef)));
    let mut got = vec![0; 64];
    abuf.read(2000, &mut got[..10]).unwrap();
    abuf.read(3000, &mut got[10..]).unwrap();
    assert_eq!(got, pong);

    // RDMA WRITE a -> b.
    let data = pattern(777, 3);
    abuf.write(100, &data).unwrap();
    qa.post_send(&[SendWr::new(
        3,
        SendOp::Write {
            remote_addr: bmr.iova() + 2048,
            rkey: bmr.rkey(),
        },
        &[amr.sge(100, 777)],
    )])
    .unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaWrite, 777)
    );
    assert!(b.rcq.is_empty(), "a plain WRITE consumes no receive");
    let mut got = vec![0; 777];
    bbuf.read(2048, &mut got).unwrap();
    assert_eq!(got, data);

    // RDMA WRITE with immediate b -> a.
    let data = pattern(50, 1);
    bbuf.write(0, &data).unwrap();
    qa.post_recv(&[RecvWr {
        wr_id: 13,
        sg_list: &[],
    }])
    .unwrap();
    qb.post_send(&[SendWr::new(
        4,
        SendOp::WriteImm {
            remote_addr: amr.iova() + 10,
            rkey: amr.rkey(),
            imm: 42,
        },
        &[bmr.sge(0, 50)],
    )])
    .unwrap();
    assert_eq!(poll1(&b.scq).opcode, WcOpcode::RdmaWrite);
    let wc = poll1(&a.rcq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm),
        (13, WcOpcode::RecvRdmaWithImm, 50, Some(42))
    );
    let mut got = vec![0; 50];
    abuf.read(10, &mut got).unwrap();
    assert_eq!(got, data);

    // RDMA READ a <- b.
    let remote = pattern(300, 77);
    bbuf.write(3500, &remote).unwrap();
    qa.post_send(&[SendWr::new(
        5,
        SendOp::Read {
            remote_addr: bmr.iova() + 3500,
            rkey: bmr.rkey(),
        },
        &[amr.sge(1000, 300)],
    )])
    .unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 300)
    );
    let mut got = vec![0; 300];
    abuf.read(1000, &mut got).unwrap();
    assert_eq!(got, remote);

    // Atomics on b's word at 4000.
    bbuf.write(4000, &100u64.to_ne_bytes()).unwrap();
    qa.post_send(&[SendWr::new(
        6,
        SendOp::FetchAdd {
            remote_addr: bmr.iova() + 4000,
            rkey: bmr.rkey(),
            add: 5,
        },
        &[amr.sge(4000, 8)],
    )])
    .unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    let word = |buf: &RegisteredBuffer, at| {
        let mut w = [0; 8];
        buf.read(at, &mut w).unwrap();
        u64::from_ne_bytes(w)
    };
    assert_eq!(word(&abuf, 4000), 100);
    assert_eq!(word(&bbuf, 4000), 105);
    // CAS that fails (compare 1) then succeeds (compare 105).
    for (id, compare, orig, after) in [(7, 1, 105, 105), (8, 105, 105, 999)] {
        qa.post_send(&[SendWr::new(
            id,
            SendOp::CompareSwap {
                remote_addr: bmr.iova() + 4000,
                rkey: bmr.rkey(),
                compare,
                swap: 999,
            },
            &[amr.sge(4008, 8)],
        )])
        .unwrap();
        let wc = poll1(&a.scq);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::CompareSwap)
        );
        assert_eq!(word(&abuf, 4008), orig);
        assert_eq!(word(&bbuf, 4000), after);
    }
    // The bytes around the atomic word are untouched.
    let mut around = [0u8; 8];
    bbuf.read(3992, &mut around).unwrap();
    assert_eq!(around, [0; 8]);

    // PSNs advanced on both sides in step.
    let (sa, sb) = (qa.query(), qb.query());
    assert_eq!(sa.sq_psn, sb.rq_psn);
    assert_eq!(sb.sq_psn, sa.rq_psn);
    assert_eq!(sa.state, QpState::Rts);
}

#[test]
fn unsignaled_sends_complete_silently_and_sq_sig_all_overrides() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let buf = RegisteredBuffer::new(64);
    let mr = a.pd.register(&buf, ALL).unwrap();
    let bbuf = RegisteredBuffer::new(64);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0,
            rkey: bmr.rkey(),
        },
        &[mr.sge(0, 8)],
    )
    .unwrap_or_signaled()])
        .unwrap();
    assert!(a.scq.is_empty());
    drop(qb);
}

trait Unsig {
    fn unwrap_or_signaled(self) -> Self;
}
impl<'a> Unsig for SendWr<'a, SoftAv> {
    fn unwrap_or_signaled(self) -> Self {
        self.unsignaled()
    }
}

#[test]
fn psn_mismatch_is_retry_exceeded() {
    let (_f, a, b) = two();
    let qa = qp(&a, QpType::Rc, None);
    let qb = qp(&b, QpType::Rc, None);
    connect(&qa, ALL, b.lid, qb.qpn(), 0, 100);
    connect(&qb, ALL, a.lid, qa.qpn(), 555, 0); // expects 555, a sends 100
    let bbuf = RegisteredBuffer::new(64);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bmr.sge(0, 64)],
    }])
    .unwrap();
    qa.post_send(&[SendWr::new(9, SendOp::Send, &[])]).unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(wc.status, WcStatus::RetryExceeded);
    assert_eq!(qa.query().state, QpState::Err);
    assert!(b.rcq.is_empty());
}

#[test]
fn rnr_retry_exceeded_after_configured_retries() {
    let (f, a, b) = two();
    let qa = qp(&a, QpType::Rc, None);
    let qb = qp(&b, QpType::Rc, None);
    connect_rnr(&qa, ALL, b.lid, qb.qpn(), 0, 0, 3);
    connect(&qb, ALL, a.lid, qa.qpn(), 0, 0);
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[])]).unwrap();
    qa.post_send(&[SendWr::new(2, SendOp::Send, &[])]).unwrap();
    assert!(a.scq.is_empty(), "RNR NAK: waiting for a retry");
    f.progress();
    f.progress();
    assert!(a.scq.is_empty(), "two retries used, one left");
    f.progress();
    let wc = poll1(&a.scq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExceeded));
    let wc = poll1(&a.scq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushError));
    assert_eq!(qa.query().state, QpState::Err);
    // The first attempt, the sender's one free look when it starts to
    // wait (engine::wait_rnr), and three retries.
    assert_eq!(f.stats().rnr_naks, 5);
}

/// Nobody calls `Fabric::progress` here: the receive's post itself wakes
/// the sender held by the RNR NAK (before, the SEND waited forever).
#[test]
fn a_posted_receive_wakes_the_sender_without_a_fabric_tick() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let buf = RegisteredBuffer::from_vec(b"early".to_vec());
    let mr = a.pd.register(&buf, ALL).unwrap();
    let bbuf = RegisteredBuffer::new(16);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[mr.sge(0, 5)])])
        .unwrap();
    assert!(a.scq.is_empty(), "RNR: held");
    qb.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: &[bmr.sge(0, 16)],
    }])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    assert_eq!(poll1(&b.rcq).wr_id, 10);
    assert_eq!(&bbuf.to_vec()[..5], b"early");
}

/// The same through an SRQ: its post wakes the senders held by its QPs.
#[test]
fn a_receive_posted_to_an_srq_wakes_the_sender() {
    let (_f, a, b) = two();
    let srq = b
        .hca
        .create_srq(
            &b.pd,
            SrqInit {
                max_wr: 4,
                max_sge: 1,
            },
        )
        .unwrap();
    let qa = qp(&a, QpType::Rc, None);
    let qb = qp(&b, QpType::Rc, Some(&srq));
    connect(&qa, ALL, b.lid, qb.qpn(), 7, 9);
    connect(&qb, ALL, a.lid, qa.qpn(), 9, 7);
    let buf = RegisteredBuffer::from_vec(b"early".to_vec());
    let mr = a.pd.register(&buf, ALL).unwrap();
    let bbuf = RegisteredBuffer::new(16);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[mr.sge(0, 5)])])
        .unwrap();
    assert!(a.scq.is_empty(), "RNR: held");
    srq.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: &[bmr.sge(0, 16)],
    }])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    assert_eq!(&bbuf.to_vec()[..5], b"early");
}

#[test]
fn rnr_recovers_when_a_receive_is_posted() {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let buf = RegisteredBuffer::from_vec(b"hello".to_vec());
    let mr = a.pd.register(&buf, ALL).unwrap();
    let bbuf = RegisteredBuffer::new(16);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[mr.sge(0, 5)])])
        .unwrap();
    qa.post_send(&[SendWr::new(2, SendOp::SendImm(3), &[mr.sge(0, 5)])])
        .unwrap();
    f.progress();
    assert!(a.scq.is_empty());
    qb.post_recv(&[
        RecvWr {
            wr_id: 10,
            sg_list: &[bmr.sge(0, 16)],
        },
        RecvWr {
            wr_id: 11,
            sg_list: &[bmr.sge(0, 16)],
        },
    ])
    .unwrap();
    assert_eq!(f.settle(10), 1);
    assert_eq!(poll1(&a.scq).wr_id, 1);
    assert_eq!(poll1(&a.scq).wr_id, 2);
    assert_eq!(poll1(&b.rcq).wr_id, 10);
    let wc = poll1(&b.rcq);
    assert_eq!((wc.wr_id, wc.imm), (11, Some(3)));
    assert_eq!(&bbuf.to_vec()[..5], b"hello");
}

#[test]
fn modify_to_err_flushes_everything() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let buf = RegisteredBuffer::new(64);
    let mr = a.pd.register(&buf, ALL).unwrap();
    for id in 0..3 {
        qa.post_recv(&[RecvWr {
            wr_id: 100 + id,
            sg_list: &[mr.sge(0, 64)],
        }])
        .unwrap();
    }
    // Hold two sends behind SQD.
    qa.modify(&QpModify::to(QpState::Sqd)).unwrap();
    qa.post_send(&[
        SendWr::new(1, SendOp::Send, &[mr.sge(0, 8)]),
        SendWr::new(2, SendOp::Send, &[mr.sge(0, 8)]),
    ])
    .unwrap();
    assert!(a.scq.is_empty());
    qa.modify(&QpModify::to(QpState::Err)).unwrap();
    let mut wcs = [Wc::default(); 8];
    let n = a.scq.poll(&mut wcs);
    assert_eq!(n, 2);
    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::WrFlushError));
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (1, 2));
    let n = a.rcq.poll(&mut wcs);
    assert_eq!(n, 3);
    assert!(wcs[..n]
        .iter()
        .all(|w| w.status == WcStatus::WrFlushError && w.opcode == WcOpcode::Recv));
    // Posting in ERR completes at once with a flush.
    qa.post_send(&[SendWr::new(3, SendOp::Send, &[]).unsignaled()])
        .unwrap();
    qa.post_recv(&[RecvWr {
        wr_id: 200,
        sg_list: &[],
    }])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::WrFlushError);
    assert_eq!(poll1(&a.rcq).wr_id, 200);
    // The peer now gets no answer.
    let bbuf = RegisteredBuffer::new(8);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qb.post_send(&[SendWr::new(9, SendOp::Send, &[bmr.sge(0, 8)])])
        .unwrap();
    assert_eq!(poll1(&b.scq).status, WcStatus::RetryExceeded);
    // ERR -> RESET -> INIT works again.
    qa.modify(&QpModify::to(QpState::Reset)).unwrap();
    assert_eq!(qa.query().state, QpState::Reset);
}

#[test]
fn sqd_holds_sends_until_rts() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let bbuf = RegisteredBuffer::new(8);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bmr.sge(0, 8)],
    }])
    .unwrap();
    qa.modify(&QpModify::to(QpState::Sqd)).unwrap();
    qa.post_send(&[SendWr::new(5, SendOp::SendImm(1), &[])])
        .unwrap();
    assert!(b.rcq.is_empty());
    qa.modify(&QpModify::to(QpState::Rts)).unwrap();
    assert_eq!(poll1(&a.scq).wr_id, 5);
    assert_eq!(poll1(&b.rcq).imm, Some(1));
}

#[test]
fn srq_receives_for_several_qps() {
    let (_f, a, b) = two();
    let srq = b
        .hca
        .create_srq(
            &b.pd,
            SrqInit {
                max_wr: 8,
                max_sge: 2,
            },
        )
        .unwrap();
    let qa1 = qp(&a, QpType::Rc, None);
    let qa2 = qp(&a, QpType::Rc, None);
    let qb1 = qp(&b, QpType::Rc, Some(&srq));
    let qb2 = qp(&b, QpType::Rc, Some(&srq));
    connect(&qa1, ALL, b.lid, qb1.qpn(), 0, 0);
    connect(&qb1, ALL, a.lid, qa1.qpn(), 0, 0);
    connect(&qa2, ALL, b.lid, qb2.qpn(), 0, 0);
    connect(&qb2, ALL, a.lid, qa2.qpn(), 0, 0);
    let bbuf = RegisteredBuffer::new(64);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    srq.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &[bmr.sge(0, 32)],
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[bmr.sge(32, 32)],
        },
    ])
    .unwrap();
    assert!(qb1
        .post_recv(&[RecvWr {
            wr_id: 3,
            sg_list: &[]
        }])
        .is_err());
    let abuf = RegisteredBuffer::from_vec(b"first...second..".to_vec());
    let amr = a.pd.register(&abuf, ALL).unwrap();
    qa2.post_send(&[SendWr::new(1, SendOp::Send, &[amr.sge(0, 8)])])
        .unwrap();
    qa1.post_send(&[SendWr::new(2, SendOp::Send, &[amr.sge(8, 8)])])
        .unwrap();
    let w1 = poll1(&b.rcq);
    let w2 = poll1(&b.rcq);
    assert_eq!((w1.wr_id, w1.qp_num), (1, qb2.qpn()));
    assert_eq!((w2.wr_id, w2.qp_num), (2, qb1.qpn()));
    let v = bbuf.to_vec();
    assert_eq!(&v[0..8], b"first...");
    assert_eq!(&v[32..40], b"second..");
    assert!(srq.is_empty());
    // SRQ receives are not flushed when a QP errors.
    srq.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[],
    }])
    .unwrap();
    qb1.modify(&QpModify::to(QpState::Err)).unwrap();
    assert_eq!(srq.len(), 1);
    // SRQ overflow.
    for i in 0..7 {
        srq.post_recv(&[RecvWr {
            wr_id: 20 + i,
            sg_list: &[],
        }])
        .unwrap();
    }
    assert!(matches!(
        srq.post_recv(&[RecvWr {
            wr_id: 99,
            sg_list: &[]
        }]),
        Err(al::Error::InsufficientResources(_))
    ));
}

#[test]
fn uc_send_and_write() {
    let (_f, a, b) = two();
    let qa = qp(&a, QpType::Uc, None);
    let qb = qp(&b, QpType::Uc, None);
    connect(&qa, ALL, b.lid, qb.qpn(), 0, 0);
    connect(&qb, ALL, a.lid, qa.qpn(), 0, 0);
    let abuf = RegisteredBuffer::from_vec(pattern(128, 5));
    let amr = a.pd.register(&abuf, ALL).unwrap();
    let bbuf = RegisteredBuffer::new(256);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    // No receive posted: UC drops the message; the sender still succeeds.
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[amr.sge(0, 10)])])
        .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    assert!(b.rcq.is_empty());
    qa.post_send(&[SendWr::new(
        2,
        SendOp::Write {
            remote_addr: 128,
            rkey: bmr.rkey(),
        },
        &[amr.sge(0, 128)],
    )])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    assert_eq!(&bbuf.to_vec()[128..], &pattern(128, 5)[..]);
    // READ is not a UC operation.
    assert!(matches!(
        qa.post_send(&[SendWr::new(
            3,
            SendOp::Read {
                remote_addr: 0,
                rkey: bmr.rkey()
            },
            &[amr.sge(0, 8)]
        )]),
        Err(al::Error::InvalidParameter(_))
    ));
}

#[test]
fn completion_hook_fires_once_per_arm() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let f = Fabric::new();
    let a = node(&f, 1, 1);
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let cq = a
        .hca
        .create_cq(CqInit {
            capacity: 16,
            on_completion: Some(al::sync::Arc::new(move || {
                h.fetch_add(1, Ordering::SeqCst);
            })),
            on_async_error: None,
        })
        .unwrap();
    let b = node(&f, 2, 2);
    let qa = a
        .hca
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
    let qb = qp(&b, QpType::Rc, None);
    connect(&qa, ALL, b.lid, qb.qpn(), 0, 0);
    connect(&qb, ALL, a.lid, qa.qpn(), 0, 0);
    for i in 0..4 {
        qa.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[],
        }])
        .unwrap();
    }
    let send = |solicited: bool| {
        let wr = SendWr::new(0, SendOp::Send, &[]);
        let wr = if solicited { wr.solicited() } else { wr };
        qb.post_send(&[wr]).unwrap();
    };
    send(false);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "not armed");
    cq.arm(CqArm::NextCompletion);
    send(false);
    send(false);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "one notification per arm");
    cq.arm(CqArm::Solicited);
    assert_eq!(cq.len(), 3);
    // An unsolicited one does not fire, a solicited one does.
    qa.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[],
    }])
    .unwrap();
    send(false);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    send(true);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}
