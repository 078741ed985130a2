//! ACKs a polling thread holds back (`HeldAcks` in `device.rs`) still
//! leave when nobody sends or polls again (the port's receive thread sends
//! them within a nap, long before the requester's retransmit timer), and
//! never after a later packet of another QP.

mod common;

use std::time::{Duration, Instant};

use provider::{Device, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, Wc, WcStatus};
use roce_provider::{RoceCq, RoceDevice, RoceMr, RocePd, RoceQp};

use common::{connect, connect_with_timeout, cq, devices, qp, wait, ALL};

/// Two devices, `n` RC QPs connected pairwise (A's with a 4.3 s
/// retransmit timer, 4.096 us * 2^20: without its ACK an A SEND could only
/// complete after that), one CQ and one 64-byte MR per side.
struct Pair {
    a: RoceDevice,
    b: RoceDevice,
    ca: RoceCq,
    cb: RoceCq,
    qa: Vec<RoceQp>,
    qb: Vec<RoceQp>,
    la: u32,
    lb: u32,
    _keep: (
        RocePd,
        RocePd,
        RoceMr,
        RoceMr,
        RegisteredBuffer,
        RegisteredBuffer,
    ),
}

impl Pair {
    fn new(n: usize) -> Pair {
        let (a, b) = devices();
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (cq(&a), cq(&b));
        let qa: Vec<_> = (0..n).map(|_| qp(&a, &pa, &ca, None)).collect();
        let qb: Vec<_> = (0..n).map(|_| qp(&b, &pb, &cb, None)).collect();
        for (x, y) in qa.iter().zip(&qb) {
            let (nx, ny) = (a.query_qp(x).unwrap().qpn, b.query_qp(y).unwrap().qpn);
            connect_with_timeout(&a, x, &b, ny, 20);
            connect(&b, y, &a, nx);
        }
        let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
        let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
        let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
        let (la, lb) = (a.mr_keys(&ma).0, b.mr_keys(&mb).0);
        Pair {
            a,
            b,
            ca,
            cb,
            qa,
            qb,
            la,
            lb,
            _keep: (pa, pb, ma, mb, ba, bb),
        }
    }

    fn sge(lkey: u32) -> [Sge; 1] {
        [Sge {
            addr: 0,
            length: 64,
            lkey,
        }]
    }

    fn recv(dev: &RoceDevice, qp: &RoceQp, lkey: u32, wr_id: u64) {
        let sge = Pair::sge(lkey);
        dev.post_recv(
            qp,
            &[RecvWr {
                wr_id,
                sg_list: &sge,
            }],
        )
        .unwrap();
    }

    fn send(dev: &RoceDevice, qp: &RoceQp, lkey: u32, wr_id: u64) {
        let sge = Pair::sge(lkey);
        dev.post_send::<()>(qp, &[SendWr::new(wr_id, SendOp::Send, &sge)], &|_| None)
            .unwrap();
    }

    /// B's application polls an empty CQ longer than its receive thread's
    /// socket timeout, so that thread leaves the socket to the poller (it
    /// naps while the application busy-polls): B's next packet is taken
    /// by B's poller, and its ACK held.
    fn b_polls_until_its_receive_thread_steps_aside(&self) {
        let quiet = Instant::now() + Duration::from_millis(150);
        let mut none = [Wc::default(); 1];
        while Instant::now() < quiet {
            assert_eq!(self.b.poll_cq(&self.cb, &mut none).unwrap(), 0);
            std::thread::yield_now();
        }
    }
}

#[test]
fn an_ack_held_by_a_poller_that_stops_polling_still_goes() {
    let p = Pair::new(1);
    for round in 0..3u64 {
        Pair::recv(&p.b, &p.qb[0], p.lb, round);
        p.b_polls_until_its_receive_thread_steps_aside();
        let start = Instant::now();
        Pair::send(&p.a, &p.qa[0], p.la, round);
        // B's application polls until its receive completes, then goes
        // quiet.
        assert_eq!(wait(&p.b, &p.cb, 1)[0].status, WcStatus::Success);
        assert_eq!(wait(&p.a, &p.ca, 1)[0].status, WcStatus::Success);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "round {round}: the SEND's ACK took {took:?} (a held ACK waited for the retransmit)"
        );
    }
}

#[test]
fn a_device_closed_right_after_its_poller_took_a_send_still_acks_it() {
    let p = Pair::new(1);
    Pair::recv(&p.b, &p.qb[0], p.lb, 1);
    p.b_polls_until_its_receive_thread_steps_aside();
    let start = Instant::now();
    Pair::send(&p.a, &p.qa[0], p.la, 1);
    assert_eq!(wait(&p.b, &p.cb, 1)[0].status, WcStatus::Success);
    // B's application is done: everything of B goes at once.
    let Pair {
        a,
        b,
        ca,
        cb,
        qa,
        qb,
        ..
    } = p;
    drop((qb, cb));
    drop(b);
    assert_eq!(wait(&a, &ca, 1)[0].status, WcStatus::Success);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    drop(qa);
}

#[test]
fn a_held_ack_leaves_before_the_next_packet_of_another_qp() {
    // B takes A's SEND on QP 1 by polling (its ACK held), then sends on
    // QP 2: A must see the ACK first (its SEND completes before QP 2's
    // message arrives, on A's one CQ), as it would if the ACK had gone at
    // once. A DREQ on QP1 after a request is the case this protects.
    let p = Pair::new(2);
    for round in 0..3 {
        Pair::recv(&p.b, &p.qb[0], p.lb, 1);
        Pair::recv(&p.a, &p.qa[1], p.la, 2);
        p.b_polls_until_its_receive_thread_steps_aside();
        Pair::send(&p.a, &p.qa[0], p.la, 10);
        assert_eq!(wait(&p.b, &p.cb, 1)[0].wr_id, 1);
        Pair::send(&p.b, &p.qb[1], p.lb, 20);
        let got = wait(&p.a, &p.ca, 2);
        assert_eq!(
            (got[0].wr_id, got[1].wr_id),
            (10, 2),
            "round {round}: A's SEND must complete (its ACK) before QP 2's message lands"
        );
        wait(&p.b, &p.cb, 1);
    }
}
