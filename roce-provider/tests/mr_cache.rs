//! A QP remembers the MR its last memory access found (`MrCache`), so a
//! send's check and copy, and the next message through the same MR, skip
//! the MR table. Once that MR is deregistered its key must fail again, on
//! both sides, even though the QP still holds it (the buffers here are
//! owned memory, which a deregistration does not invalidate).

mod common;

use provider::{Device, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, WcStatus};

use common::{connect, cq, devices, qp, wait, ALL};

fn sge(lkey: u32) -> [Sge; 1] {
    [Sge {
        addr: 0,
        length: 64,
        lkey,
    }]
}

#[test]
fn a_deregistered_mr_fails_even_after_the_qp_used_it() {
    let (a, b) = devices();
    let (ca, cb) = (cq(&a), cq(&b));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (qa, qb) = (qp(&a, &pa, &ca, None), qp(&b, &pb, &cb, None));
    let (na, nb) = (a.query_qp(&qa).unwrap().qpn, b.query_qp(&qb).unwrap().qpn);
    connect(&a, &qa, &b, nb);
    connect(&b, &qb, &a, na);
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let (la, lb) = (a.mr_keys(&ma).0, b.mr_keys(&mb).0);
    let recv = |wr_id| {
        let s = sge(lb);
        b.post_recv(&qb, &[RecvWr { wr_id, sg_list: &s }]).unwrap();
    };
    let send = |wr_id| {
        let s = sge(la);
        a.post_send::<()>(&qa, &[SendWr::new(wr_id, SendOp::Send, &s)], &|_| None)
            .unwrap();
    };

    // Both QPs use their MR once: each now holds it.
    recv(1);
    send(1);
    assert_eq!(wait(&b, &cb, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&a, &ca, 1)[0].status, WcStatus::Success);

    // The receiver's MR goes: a message into its key is refused.
    drop(mb);
    recv(2);
    send(2);
    let got = wait(&b, &cb, 1)[0];
    assert_eq!(
        (got.wr_id, got.status),
        (2, WcStatus::LocalProtectionError),
        "the receive landed in a deregistered MR"
    );
    assert_ne!(wait(&a, &ca, 1)[0].status, WcStatus::Success);

    // The sender's MR goes: a send from its key is refused at once.
    let (ca2, cb2) = (cq(&a), cq(&b));
    let (qa2, qb2) = (qp(&a, &pa, &ca2, None), qp(&b, &pb, &cb2, None));
    let (na2, nb2) = (a.query_qp(&qa2).unwrap().qpn, b.query_qp(&qb2).unwrap().qpn);
    connect(&a, &qa2, &b, nb2);
    connect(&b, &qb2, &a, na2);
    let mb2 = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let lb2 = b.mr_keys(&mb2).0;
    let recv2 = |wr_id| {
        let s = sge(lb2);
        b.post_recv(&qb2, &[RecvWr { wr_id, sg_list: &s }]).unwrap();
    };
    let send2 = |wr_id| {
        let s = sge(la);
        a.post_send::<()>(&qa2, &[SendWr::new(wr_id, SendOp::Send, &s)], &|_| None)
            .unwrap();
    };
    recv2(3);
    send2(3);
    assert_eq!(wait(&b, &cb2, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&a, &ca2, 1)[0].status, WcStatus::Success);
    drop(ma);
    recv2(4);
    send2(4);
    let got = wait(&a, &ca2, 1)[0];
    assert_eq!(
        (got.wr_id, got.status),
        (4, WcStatus::LocalProtectionError),
        "the send read a deregistered MR"
    );
}
