//! ACKs a polling thread holds back (`HeldAcks` in `device.rs`) still
//! leave when nobody sends or polls again: the port's receive thread
//! sends them within a nap, long before the requester's retransmit timer.

mod common;

use std::time::{Duration, Instant};

use provider::{Device, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, WcStatus};

use common::{connect, connect_with_timeout, cq, devices, qp, wait, ALL};

#[test]
fn an_ack_held_by_a_poller_that_stops_polling_still_goes() {
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let (qa, qb) = (qp(&a, &pa, &ca, None), qp(&b, &pb, &cb, None));
    let (na, nb) = (a.query_qp(&qa).unwrap().qpn, b.query_qp(&qb).unwrap().qpn);
    // A's retransmit timer: 4.096 us * 2^20 = 4.3 s. Without its ACK, A's
    // SEND could only complete after that (B re-ACKing the duplicate).
    connect_with_timeout(&a, &qa, &b, nb, 20);
    connect(&b, &qb, &a, na);
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let (la, lb) = (a.mr_keys(&ma).0, b.mr_keys(&mb).0);
    for round in 0..3u64 {
        let sge = |lkey| {
            [Sge {
                addr: 0,
                length: 64,
                lkey,
            }]
        };
        b.post_recv(
            &qb,
            &[RecvWr {
                wr_id: round,
                sg_list: &sge(lb),
            }],
        )
        .unwrap();
        // B's application polls an empty CQ longer than its receive
        // thread's socket timeout, so that thread leaves the socket to
        // the poller (it naps while the application polls).
        let quiet = Instant::now() + Duration::from_millis(150);
        let mut none = [provider::Wc::default(); 1];
        while Instant::now() < quiet {
            assert_eq!(b.poll_cq(&cb, &mut none).unwrap(), 0);
            std::thread::yield_now();
        }
        let start = Instant::now();
        a.post_send::<()>(&qa, &[SendWr::new(round, SendOp::Send, &sge(la))], &|_| {
            None
        })
        .unwrap();
        // B's application polls until its receive completes (so B's
        // progress takes the SEND and holds the ACK), then goes quiet.
        let got = wait(&b, &cb, 1);
        assert_eq!(got[0].status, WcStatus::Success);
        let sent = wait(&a, &ca, 1);
        assert_eq!(sent[0].status, WcStatus::Success);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "round {round}: the SEND's ACK took {took:?} (a held ACK waited for the retransmit)"
        );
    }
}

#[test]
fn a_device_closed_right_after_its_poller_took_a_send_still_acks_it() {
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let (qa, qb) = (qp(&a, &pa, &ca, None), qp(&b, &pb, &cb, None));
    let (na, nb) = (a.query_qp(&qa).unwrap().qpn, b.query_qp(&qb).unwrap().qpn);
    connect_with_timeout(&a, &qa, &b, nb, 20);
    connect(&b, &qb, &a, na);
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let (la, lb) = (a.mr_keys(&ma).0, b.mr_keys(&mb).0);
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: 64,
            lkey,
        }]
    };
    b.post_recv(
        &qb,
        &[RecvWr {
            wr_id: 1,
            sg_list: &sge(lb),
        }],
    )
    .unwrap();
    // B polls long enough for its receive thread to leave it the socket.
    let quiet = Instant::now() + Duration::from_millis(150);
    let mut none = [provider::Wc::default(); 1];
    while Instant::now() < quiet {
        assert_eq!(b.poll_cq(&cb, &mut none).unwrap(), 0);
        std::thread::yield_now();
    }
    let start = Instant::now();
    a.post_send::<()>(&qa, &[SendWr::new(1, SendOp::Send, &sge(la))], &|_| None)
        .unwrap();
    assert_eq!(wait(&b, &cb, 1)[0].status, WcStatus::Success);
    // B's application is done: everything of B goes at once.
    drop((qb, mb, cb, pb, bb));
    drop(b);
    let sent = wait(&a, &ca, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_held_ack_leaves_before_the_next_packet_of_another_qp() {
    // B takes A's SEND on QP 1 by polling (its ACK held), then sends on
    // QP 2: A must see the ACK first (its SEND completes before QP 2's
    // message arrives, on A's one CQ), as it would if the ACK had gone at
    // once. A DREQ on QP1 after a request is the case this protects.
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let qa = [qp(&a, &pa, &ca, None), qp(&a, &pa, &ca, None)];
    let qb = [qp(&b, &pb, &cb, None), qp(&b, &pb, &cb, None)];
    for i in 0..2 {
        let (na, nb) = (
            a.query_qp(&qa[i]).unwrap().qpn,
            b.query_qp(&qb[i]).unwrap().qpn,
        );
        connect_with_timeout(&a, &qa[i], &b, nb, 20);
        connect(&b, &qb[i], &a, na);
    }
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let (la, lb) = (a.mr_keys(&ma).0, b.mr_keys(&mb).0);
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: 64,
            lkey,
        }]
    };
    let recv = |wr_id| RecvWr {
        wr_id,
        sg_list: Box::leak(Box::new(sge(la))),
    };
    b.post_recv(
        &qb[0],
        &[RecvWr {
            wr_id: 1,
            sg_list: &sge(lb),
        }],
    )
    .unwrap();
    a.post_recv(&qa[1], &[recv(2)]).unwrap();
    for round in 0..3 {
        let quiet = Instant::now() + Duration::from_millis(150);
        let mut none = [provider::Wc::default(); 1];
        while Instant::now() < quiet {
            assert_eq!(b.poll_cq(&cb, &mut none).unwrap(), 0);
            std::thread::yield_now();
        }
        a.post_send::<()>(&qa[0], &[SendWr::new(10, SendOp::Send, &sge(la))], &|_| {
            None
        })
        .unwrap();
        assert_eq!(wait(&b, &cb, 1)[0].wr_id, 1);
        b.post_send::<()>(&qb[1], &[SendWr::new(20, SendOp::Send, &sge(lb))], &|_| {
            None
        })
        .unwrap();
        let got = wait(&a, &ca, 2);
        assert_eq!(
            (got[0].wr_id, got[1].wr_id),
            (10, 2),
            "round {round}: A's SEND must complete (its ACK) before QP 2's message lands"
        );
        wait(&b, &cb, 1);
        b.post_recv(
            &qb[0],
            &[RecvWr {
                wr_id: 1,
                sg_list: &sge(lb),
            }],
        )
        .unwrap();
        a.post_recv(&qa[1], &[recv(2)]).unwrap();
    }
}
