//! A QP remembers the MR its last memory access found (`MrCache`), so a
//! send's check and copy, and the next message through the same MR, skip
//! the MR table. Once that MR is deregistered its key must fail again, on
//! both sides, even though the QP still holds it (the buffers here are
//! owned memory, which a deregistration does not invalidate).

mod common;

use provider::{Device, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, Wc, WcStatus};
use roce_provider::{RoceCq, RoceDevice, RoceQp};

use common::{connected_qps, cq, devices, wait, ALL};

/// A fresh connected pair; `a` sends from `la`, `b` receives into `lb`.
struct Pair<'d> {
    a: &'d RoceDevice,
    b: &'d RoceDevice,
    ca: RoceCq,
    cb: RoceCq,
    qa: RoceQp,
    qb: RoceQp,
}

impl Pair<'_> {
    /// Posts one receive of 64 bytes into `lb` and one SEND of 64 bytes
    /// from `la`, both tagged `id`.
    fn post(&self, la: u32, lb: u32, id: u64) {
        let sge = |lkey| {
            [Sge {
                addr: 0,
                length: 64,
                lkey,
            }]
        };
        let (rs, ss) = (sge(lb), sge(la));
        self.b
            .post_recv(
                &self.qb,
                &[RecvWr {
                    wr_id: id,
                    sg_list: &rs,
                }],
            )
            .unwrap();
        self.a
            .post_send::<()>(&self.qa, &[SendWr::new(id, SendOp::Send, &ss)], &|_| None)
            .unwrap();
    }

    fn receiver(&self) -> Wc {
        wait(self.b, &self.cb, 1)[0]
    }

    fn sender(&self) -> Wc {
        wait(self.a, &self.ca, 1)[0]
    }
}

#[test]
fn a_deregistered_mr_fails_even_after_the_qp_used_it() {
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ba, bb) = (RegisteredBuffer::new(64), RegisteredBuffer::new(64));
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let la = a.mr_keys(&ma).0;
    let pair = || {
        let (ca, cb) = (cq(&a), cq(&b));
        let (qa, qb) = connected_qps((&a, &pa, &ca), (&b, &pb, &cb));
        Pair {
            a: &a,
            b: &b,
            ca,
            cb,
            qa,
            qb,
        }
    };

    // The receiver's MR goes after its QP used it: a message into its key
    // is refused.
    let p = pair();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let lb = b.mr_keys(&mb).0;
    p.post(la, lb, 1);
    assert_eq!(p.receiver().status, WcStatus::Success);
    assert_eq!(p.sender().status, WcStatus::Success);
    drop(mb);
    p.post(la, lb, 2);
    let r = p.receiver();
    assert_eq!(
        (r.wr_id, r.status),
        (2, WcStatus::LocalProtectionError),
        "the receive landed in a deregistered MR"
    );
    assert_ne!(p.sender().status, WcStatus::Success);

    // The sender's MR goes after its QP used it: a send from its key is
    // refused.
    let p = pair();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let lb = b.mr_keys(&mb).0;
    p.post(la, lb, 3);
    assert_eq!(p.receiver().status, WcStatus::Success);
    assert_eq!(p.sender().status, WcStatus::Success);
    drop(ma);
    p.post(la, lb, 4);
    let s = p.sender();
    assert_eq!(
        (s.wr_id, s.status),
        (4, WcStatus::LocalProtectionError),
        "the send read a deregistered MR"
    );
}
