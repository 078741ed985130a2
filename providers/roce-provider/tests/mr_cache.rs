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

/// A long WRITE is read from its MR packet by packet as the driver
/// encodes each datagram. Its MR deregistered while most of it is still
/// to go: the next packet's read fails, nothing more of it leaves, and
/// the request completes with LOC_PROT_ERR (the QP then in error) rather
/// than sending bytes from memory the application gave back.
#[test]
fn a_long_write_whose_mr_goes_mid_send_fails_locally() {
    const LEN: usize = 16 << 20;
    let (a, b) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (cq(&a), cq(&b));
    let (qa, _qb) = connected_qps((&a, &pa, &ca), (&b, &pb, &cb));
    let (src, dst) = (RegisteredBuffer::new(LEN), RegisteredBuffer::new(LEN));
    let ms = a.register_mr(&pa, &src, 0, LEN, 0, ALL).unwrap();
    let md = b.register_mr(&pb, &dst, 0, LEN, 0, ALL).unwrap();
    src.write(0, &vec![0x5a; LEN]).unwrap();
    let sg = [Sge {
        addr: 0,
        length: LEN as u32,
        lkey: a.mr_keys(&ms).0,
    }];
    let op = SendOp::Write {
        remote_addr: 0,
        rkey: b.mr_keys(&md).1,
    };
    a.post_send::<()>(&qa, &[SendWr::new(7, op, &sg)], &|_| None)
        .unwrap();
    // At most a window (1 MiB) or a few have left by now.
    a.deregister_mr(ms).unwrap();
    let wc = wait(&a, &ca, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::LocalProtectionError));
    let mut landed = vec![0; LEN];
    dst.read(0, &mut landed).unwrap();
    let written = landed.iter().filter(|&&x| x == 0x5a).count();
    assert!(written < LEN, "all of it was sent from a deregistered MR");
}
