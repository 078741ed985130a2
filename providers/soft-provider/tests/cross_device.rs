//! Objects of one HCA are never accepted by another (issue 12, defect 4).
//!
//! Two fresh soft HCAs hand out look-alike objects: their first PDs, MRs
//! and QPs are created the same way. Every test here gives HCA A an object
//! (or a key) of HCA B where A has a look-alike of its own, and requires a
//! refusal with no byte moved, instead of A using its own look-alike.
//!
//! This file holds only these tests, on purpose: the MR-key tests rely on
//! no other test registering memory between their two registrations.

mod common;
use al::Error;
use common::*;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

const SRQ: SrqInit = SrqInit {
    max_wr: 16,
    max_sge: 1,
};

fn fill(len: usize, b: u8) -> RegisteredBuffer {
    let buf = RegisteredBuffer::new(len);
    buf.fill(b).unwrap();
    buf
}

fn untouched(buf: &RegisteredBuffer, b: u8) {
    assert!(buf.to_vec().iter().all(|&x| x == b), "buffer was modified");
}

fn init<'a>(n: &'a Node, scq: &'a SoftCq, srq: Option<&'a SoftSrq>) -> QpInit<'a, SoftCq, SoftSrq> {
    QpInit {
        qp_type: QpType::Rc,
        send_cq: scq,
        recv_cq: &n.rcq,
        srq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    }
}

#[test]
fn create_qp_refuses_an_srq_of_another_hca() {
    let (_f, a, b) = two();
    // Each HCA's first PD and SRQ: look-alikes.
    let srq_a = a.hca.create_srq(&a.pd, SRQ).unwrap();
    let srq_b = b.hca.create_srq(&b.pd, SRQ).unwrap();
    let e = a
        .hca
        .create_qp(&a.pd, &init(&a, &a.scq, Some(&srq_b)))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    // The same through the provider interface, and for the GSI QP.
    let e = Device::create_qp(&a.hca, &a.pd, &init(&a, &a.scq, Some(&srq_b))).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    assert!(a
        .hca
        .create_gsi_qp(&a.pd, 1, &init(&a, &a.scq, Some(&srq_b)))
        .is_err());
    // A's own SRQ is fine.
    a.hca
        .create_qp(&a.pd, &init(&a, &a.scq, Some(&srq_a)))
        .unwrap();
}

#[test]
fn create_qp_refuses_a_cq_of_another_hca() {
    let (_f, a, b) = two();
    let e = a.hca.create_qp(&a.pd, &init(&a, &b.scq, None)).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    let mut i = init(&a, &a.scq, None);
    i.recv_cq = &b.rcq;
    let e = a.hca.create_qp(&a.pd, &i).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    let e = a.hca.create_gsi_qp(&a.pd, 1, &i).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
}

#[test]
fn srq_av_and_mr_calls_refuse_a_pd_of_another_hca() {
    let (_f, a, b) = two();
    let buf = fill(64, 0);
    assert!(a.hca.create_srq(&b.pd, SRQ).is_err());
    assert!(a.hca.create_av(&b.pd, &AvAttr::lid(1, b.lid)).is_err());
    assert!(Device::register_mr(&a.hca, &b.pd, &buf, 0, 64, 0, Access::LOCAL_WRITE).is_err());
    assert!(Device::dealloc_pd(&a.hca, b.hca.alloc_pd().unwrap()).is_err());
}

#[test]
fn a_ud_send_refuses_an_av_of_another_hca() {
    let (_f, a, b) = two();
    // B receives on a UD QP; A sends with an AV B made (pointing at B).
    let qa = ud_qp(&a, 0x1111);
    let qb = ud_qp(&b, 0x1111);
    let rbuf = fill(4096, 0xee);
    let rmr = b.pd.register(&rbuf, Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[rmr.sge(0, 4096)],
    }])
    .unwrap();
    let sbuf = fill(256, 0x42);
    let smr = a.pd.register(&sbuf, Access::NONE).unwrap();
    let av_b = b.hca.create_av(&b.pd, &AvAttr::lid(1, b.lid)).unwrap();
    let sg = [smr.sge(0, 256)];
    let wr = SendWr {
        ud: Some(UdDest {
            av: &av_b,
            remote_qpn: qb.qpn(),
            remote_qkey: 0x1111,
            pkey_index: 0,
        }),
        ..SendWr::new(7, SendOp::Send, &sg)
    };
    let e = qa.post_send(std::slice::from_ref(&wr)).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    assert!(a.scq.is_empty() && b.rcq.is_empty());
    untouched(&rbuf, 0xee);
    assert_eq!(
        qa.query().state,
        QpState::Rts,
        "a refused post changes nothing"
    );

    // A's own AV to the same place works.
    let av_a = a.hca.create_av(&a.pd, &AvAttr::lid(1, b.lid)).unwrap();
    let wr = SendWr {
        ud: Some(UdDest {
            av: &av_a,
            ..wr.ud.unwrap()
        }),
        ..wr
    };
    qa.post_send(&[wr]).unwrap();
    assert_eq!(poll1(&b.rcq).status, WcStatus::Success);
}

#[test]
fn an_lkey_of_another_hca_is_a_local_protection_error() {
    let (_f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    // A's and B's first MRs.
    let abuf = fill(4096, 0xaa);
    let amr = a.pd.register(&abuf, ALL).unwrap();
    let bbuf = fill(4096, 0xbb);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    let rbuf = fill(4096, 0xcc);
    let rmr = b.pd.register(&rbuf, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[rmr.sge(0, 4096)],
    }])
    .unwrap();
    // A SEND on A naming B's lkey.
    let sg = [Sge {
        addr: 0,
        length: 64,
        lkey: bmr.lkey(),
    }];
    qa.post_send(&[SendWr::new(3, SendOp::Send, &sg)]).unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(wc.status, WcStatus::LocalProtectionError, "{wc:?}");
    assert!(b.rcq.is_empty(), "nothing was received");
    untouched(&rbuf, 0xcc);
    untouched(&abuf, 0xaa);
    drop(amr);
}

#[test]
fn an_rkey_of_another_hca_is_a_remote_access_error() {
    let (_f, a, b) = two();
    let (qa, _qb) = rc_pair(&a, &b, ALL);
    // A's and B's first MRs; A writes to B with A's own key as the rkey.
    let abuf = fill(4096, 0xaa);
    let amr = a.pd.register(&abuf, ALL).unwrap();
    let bbuf = fill(4096, 0xbb);
    // B's look-alike of A's MR, which the rkey named before issue 12.
    let _bmr = b.pd.register(&bbuf, ALL).unwrap();
    let sg = [amr.sge(0, 64)];
    let op = SendOp::Write {
        remote_addr: 0,
        rkey: amr.rkey(),
    };
    qa.post_send(&[SendWr::new(5, op, &sg)]).unwrap();
    let wc = poll1(&a.scq);
    assert_eq!(wc.status, WcStatus::RemoteAccessError, "{wc:?}");
    untouched(&bbuf, 0xbb);
    untouched(&abuf, 0xaa);
}
