//! Flush on error, SQD, RNR.

use provider::{
    Device, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::fixture::Fixture;
use crate::harness::*;

/// Flushed completions carry the wr_id, the status and the QP number
/// (IBTA and libibverbs leave the other fields undefined on error).
#[track_caller]
fn flushed<F: Fixture>(n: &Node<'_, F>, qp: &Qp<F>, wcs: &[provider::Wc], ids: &[u64]) {
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.qp_num)).collect();
    let want: Vec<_> = ids
        .iter()
        .map(|&i| (i, WcStatus::WrFlushError, n.qpn(qp)))
        .collect();
    assert_eq!(got, want);
}

/// Moving a QP to ERR flushes its held sends and posted receives (in
/// order, `WrFlushError`); work posted in ERR completes at once with a
/// flush, even unsignaled; the peer's sends find no responder; ERR ->
/// RESET works.
pub fn modify_to_err_flushes_everything<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let ca = Conn::default();
    let cb = Conn {
        retry_cnt: 1,
        timeout: 8,
        ..ca
    };
    let (qa, qb) = pair_with(&a, &b, QpType::Rc, &ca, &cb);
    let am = a.mem(64, 0, ALL);
    for id in 0..3 {
        a.recv(&qa, 100 + id, &[am.sge(0, 64)]);
    }
    // Hold two sends behind SQD.
    a.modify(&qa, QpModify::to(QpState::Sqd)).unwrap();
    a.post_send(
        &qa,
        &[
            SendWr::new(1, SendOp::Send, &[am.sge(0, 8)]),
            SendWr::new(2, SendOp::Send, &[am.sge(0, 8)]).unsignaled(),
        ],
    )
    .unwrap();
    a.modify(&qa, QpModify::to(QpState::Err)).unwrap();
    flushed(&a, &qa, &a.wait(&a.scq, 2), &[1, 2]);
    flushed(&a, &qa, &a.wait(&a.rcq, 3), &[100, 101, 102]);
    // Posting in ERR completes at once with a flush.
    a.send(&qa, SendWr::new(3, SendOp::Send, &[]).unsignaled());
    a.recv(&qa, 200, &[]);
    flushed(&a, &qa, &a.wait(&a.scq, 1), &[3]);
    flushed(&a, &qa, &a.wait(&a.rcq, 1), &[200]);
    // The peer now gets no answer.
    let bm = b.mem(8, 0, ALL);
    b.send(&qb, SendWr::new(9, SendOp::Send, &[bm.sge(0, 8)]));
    failed(&b.wait_send(), 9, WcStatus::RetryExceeded);
    assert_eq!(b.state(&qb), QpState::Err);
    a.modify(&qa, QpModify::to(QpState::Reset)).unwrap();
    assert_eq!(a.state(&qa), QpState::Reset);
    a.assert_empty(&a.scq, "RESET discards without completions");
    a.assert_empty(&a.rcq, "RESET discards without completions");
}

/// A send that fails moves the RC QP to ERR; the sends posted after it
/// and the posted receives are flushed, in order.
pub fn an_error_flushes_the_rest<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(64, 0, ALL);
    let bm = b.mem(64, 0, ALL);
    b.recv(&qb, 50, &[bm.sge(0, 64)]);
    a.recv(&qa, 60, &[am.sge(0, 32)]);
    a.recv(&qa, 61, &[am.sge(32, 32)]);
    let bad = [Sge {
        lkey: am.lkey ^ 0x100,
        ..am.sge(0, 8)
    }];
    let good = [am.sge(0, 8)];
    a.post_send(
        &qa,
        &[
            SendWr::new(1, SendOp::Send, &bad),
            SendWr::new(2, SendOp::Send, &good),
            SendWr::new(3, SendOp::Send, &good).unsignaled(),
        ],
    )
    .unwrap();
    let wcs = a.wait(&a.scq, 3);
    failed(&wcs[0], 1, WcStatus::LocalProtectionError);
    flushed(&a, &qa, &wcs[1..], &[2, 3]);
    flushed(&a, &qa, &a.wait(&a.rcq, 2), &[60, 61]);
    assert_eq!(a.state(&qa), QpState::Err);
    b.assert_empty(&b.rcq, "nothing was received");
    assert!(bm.all(0));
}

/// In SQD, posted sends are held; back in RTS they go, in order.
pub fn sqd_holds_sends_until_rts<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let bm = b.mem(16, 0, ALL);
    let am = a.mem(16, 0, ALL);
    am.write(0, b"held!...");
    b.recv(&qb, 1, &[bm.sge(0, 8)]);
    b.recv(&qb, 2, &[bm.sge(8, 8)]);
    a.modify(&qa, QpModify::to(QpState::Sqd)).unwrap();
    a.send(&qa, SendWr::new(5, SendOp::SendImm(1), &[am.sge(0, 8)]));
    a.send(&qa, SendWr::new(6, SendOp::Send, &[am.sge(0, 4)]));
    for _ in 0..10 {
        f.progress();
    }
    b.assert_empty(&b.rcq, "SQD holds the sends");
    a.assert_empty(&a.scq, "SQD holds the sends");
    a.modify(&qa, QpModify::to(QpState::Rts)).unwrap();
    let s = a.wait(&a.scq, 2);
    ok(&s[0], 5, WcOpcode::Send, 8);
    ok(&s[1], 6, WcOpcode::Send, 4);
    let r = b.wait(&b.rcq, 2);
    ok(&r[0], 1, WcOpcode::Recv, 8);
    assert_eq!(r[0].imm, Some(1));
    ok(&r[1], 2, WcOpcode::Recv, 4);
    assert_eq!(&bm.read(0, 12), b"held!...held");
}

/// An RC SEND meeting no receive is retried (RNR) and succeeds once a
/// receive is posted; the SENDs behind it keep their order.
pub fn rnr_retry_then_success<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(16, 0, ALL);
    am.write(0, b"hello");
    let bm = b.mem(32, 0, ALL);
    a.send(&qa, SendWr::new(1, SendOp::Send, &[am.sge(0, 5)]));
    a.send(&qa, SendWr::new(2, SendOp::SendImm(3), &[am.sge(0, 5)]));
    for _ in 0..10 {
        f.progress();
    }
    a.assert_empty(&a.scq, "no receive yet: the send waits (rnr_retry 7)");
    b.dev
        .post_recv(
            &qb,
            &[
                RecvWr {
                    wr_id: 10,
                    sg_list: &[bm.sge(0, 16)],
                },
                RecvWr {
                    wr_id: 11,
                    sg_list: &[bm.sge(16, 16)],
                },
            ],
        )
        .unwrap();
    let s = a.wait(&a.scq, 2);
    ok(&s[0], 1, WcOpcode::Send, 5);
    ok(&s[1], 2, WcOpcode::Send, 5);
    let r = b.wait(&b.rcq, 2);
    ok(&r[0], 10, WcOpcode::Recv, 5);
    ok(&r[1], 11, WcOpcode::Recv, 5);
    assert_eq!((r[0].imm, r[1].imm), (None, Some(3)));
    assert_eq!(&bm.read(0, 5), b"hello");
    assert_eq!(&bm.read(16, 5), b"hello");
    assert_eq!(a.state(&qa), QpState::Rts);
}

/// With no receive ever posted, an RC SEND ends with `RnrRetryExceeded`
/// after `rnr_retry` retries (0 and 2 tried); the next send is flushed
/// and the QP is in ERR. A WRITE with immediate needs a receive too.
pub fn rnr_retry_exceeded<F: Fixture>(f: &F) {
    for (rnr_retry, with_imm) in [(0, false), (2, false), (1, true)] {
        let (a, b) = two(f);
        let ca = Conn {
            rnr_retry,
            ..Conn::default()
        };
        let (qa, _qb) = pair_with(&a, &b, QpType::Rc, &ca, &Conn::default());
        let am = a.mem(16, 0, ALL);
        let bm = b.mem(16, 0, ALL);
        let op = if with_imm {
            SendOp::WriteImm {
                remote_addr: bm.iova,
                rkey: bm.rkey,
                imm: 1,
            }
        } else {
            SendOp::Send
        };
        a.send(&qa, SendWr::new(1, op, &[am.sge(0, 8)]));
        a.send(&qa, SendWr::new(2, SendOp::Send, &[]));
        let wcs = a.wait(&a.scq, 2);
        failed(&wcs[0], 1, WcStatus::RnrRetryExceeded);
        failed(&wcs[1], 2, WcStatus::WrFlushError);
        assert_eq!(a.state(&qa), QpState::Err, "rnr_retry {rnr_retry}");
        b.assert_empty(&b.rcq, "nothing was received");
    }
}
