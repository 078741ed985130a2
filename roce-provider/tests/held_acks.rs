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
