//! RC behaviours particular to the soft provider's model: a PSN mismatch
//! fails at once with RETRY_EXCEEDED, and an RNR retry is one
//! `Fabric::progress` tick (counted in `FabricStats::rnr_naks`). The
//! provider-generic RC checks (every operation, flush, SQD, RNR, SRQ, UC,
//! CQ notification) are in the conformance suite (`conformance/`).

mod common;
use common::*;
use hca::*;

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
    assert_eq!(f.stats().rnr_naks, 4);
}
