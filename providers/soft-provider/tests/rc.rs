//! RC behaviours particular to the soft provider's model: a PSN mismatch
//! fails at once with RETRY_EXCEEDED, and an RNR retry is one
//! `Fabric::progress` tick (counted in `FabricStats::rnr_naks`). The
//! provider-generic RC checks (every operation, flush, SQD, RNR, SRQ, UC,
//! CQ notification) are in the conformance suite (`conformance/`).

mod common;
use common::*;
use provider::buffer::RegisteredBuffer;
use provider::*;

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
