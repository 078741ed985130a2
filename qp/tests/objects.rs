//! The verbs objects through the access layer: handles, cascades, busy
//! CQs/SRQs, callbacks on the executor, data movement, and nothing left
//! behind when an AL closes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc as StdArc;

use al::{Al, Error, Handle, Kind};
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use provider::RegisteredBuffer;
use provider::{
    Access, AvAttr, CqArm, Mtu, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, SrqInit,
    Wc, WcStatus,
};
use qp::{create_qp, modify_qp, post_recv, post_send, CidState, Qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

struct Side {
    ca: Handle<Ca>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    lid: u16,
}

fn fabric() -> SoftProvider {
    let f = Fabric::new();
    f.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
    f.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
    SoftProvider::new(f)
}

fn side(al: &Al, p: &SoftProvider, guid: u64, lid: u16) -> Side {
    let ca = verbs::open_ca(al.instance(), p, guid).unwrap();
    let pd = verbs::alloc_pd(al.instance(), ca).unwrap();
    let cq = verbs::create_cq(al.instance(), ca, 256, None, None).unwrap();
    Side { ca, pd, cq, lid }
}

fn rc_qp(al: &Al, s: &Side) -> Handle<Qp> {
    create_qp(al.instance(), s.pd, QpCreate::new(QpType::Rc, s.cq)).unwrap()
}

fn to_rts(al: &Al, qp: Handle<Qp>, dlid: u16, dqpn: u32, rq_psn: u32, sq_psn: u32) {
    let steps = [
        QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(ALL),
        QpModify::to(QpState::Rtr)
            .av(AvAttr::lid(1, dlid))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(dqpn)
            .rq_psn(rq_psn)
            .max_dest_rd_atomic(4)
            .min_rnr_timer(12),
        QpModify::to(QpState::Rts)
            .sq_psn(sq_psn)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(4),
    ];
    for m in &steps {
        modify_qp(al, qp, m).unwrap();
    }
}

fn sge(addr: u64, length: u32, lkey: u32) -> Sge {
    Sge { addr, length, lkey }
}

fn poll_one(al: &Al, cq: Handle<Cq>) -> Wc {
    let mut wc = [Wc::default()];
    assert_eq!(verbs::poll_cq(al, cq, &mut wc).unwrap(), 1, "a completion");
    wc[0]
}

fn mr(al: &Al, s: &Side, buf: &RegisteredBuffer) -> (Handle<Mr>, u32, u32) {
    let h = verbs::register_mr(al.instance(), s.pd, buf, 0, buf.len(), 0, ALL).unwrap();
    let r = al.resolve(h).unwrap();
    (h, r.lkey(), r.rkey())
}

#[test]
fn rc_data_moves_through_the_object_layer_byte_for_byte() {
    let p = fabric();
    let al = Al::open().unwrap();
    let (a, b) = (side(&al, &p, 0xa000, 1), side(&al, &p, 0xb000, 2));
    let (qa, qb) = (rc_qp(&al, &a), rc_qp(&al, &b));
    let qpn = |q: Handle<Qp>| al.resolve(q).unwrap().qpn();
    to_rts(&al, qa, b.lid, qpn(qb), 0x200, 0x100);
    to_rts(&al, qb, a.lid, qpn(qa), 0x100, 0x200);

    let (buf_a, buf_b) = (RegisteredBuffer::new(4096), RegisteredBuffer::new(4096));
    let (_ma, lka, _rka) = mr(&al, &a, &buf_a);
    let (_mb, lkb, rkb) = mr(&al, &b, &buf_b);
    let msg: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    buf_a.write(0, &msg).unwrap();

    // SEND into a posted receive.
    let rsge = [sge(0, 1024, lkb)];
    post_recv(
        &al,
        qb,
        &[RecvWr {
            wr_id: 9,
            sg_list: &rsge,
        }],
    )
    .unwrap();
    let ssge = [sge(0, 1024, lka)];
    post_send(&al, qa, &[SendWr::new(1, SendOp::Send, &ssge)]).unwrap();
    let wc = poll_one(&al, b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 1024)
    );
    assert_eq!(buf_b.to_vec()[..1024], msg[..]);
    assert_eq!(poll_one(&al, a.cq).wr_id, 1);

    // RDMA WRITE to offset 2048, then READ it back into a's offset 2048.
    post_send(
        &al,
        qa,
        &[SendWr::new(
            2,
            SendOp::Write {
                remote_addr: 2048,
                rkey: rkb,
            },
            &ssge,
        )],
    )
    .unwrap();
    assert_eq!(poll_one(&al, a.cq).wr_id, 2);
    assert_eq!(buf_b.to_vec()[2048..3072], msg[..]);
    let rsge_a = [sge(2048, 1024, lka)];
    post_send(
        &al,
        qa,
        &[SendWr::new(
            3,
            SendOp::Read {
                remote_addr: 2048,
                rkey: rkb,
            },
            &rsge_a,
        )],
    )
    .unwrap();
    let wc = poll_one(&al, a.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    assert_eq!(buf_a.to_vec()[2048..3072], msg[..]);

    // Fetch-and-add and compare-and-swap on b's first 8 bytes.
    buf_b.write(0, &5u64.to_ne_bytes()).unwrap();
    let asge = [sge(3072, 8, lka)];
    post_send(
        &al,
        qa,
        &[SendWr::new(
            4,
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: rkb,
                add: 10,
            },
            &asge,
        )],
    )
    .unwrap();
    assert_eq!(poll_one(&al, a.cq).status, WcStatus::Success);
    let mut old = [0u8; 8];
    buf_a.read(3072, &mut old).unwrap();
    assert_eq!(u64::from_ne_bytes(old), 5);
    let mut now = [0u8; 8];
    buf_b.read(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 15);
    post_send(
        &al,
        qa,
        &[SendWr::new(
            5,
            SendOp::CompareSwap {
                remote_addr: 0,
                rkey: rkb,
                compare: 15,
                swap: 99,
            },
            &asge,
        )],
    )
    .unwrap();
    assert_eq!(poll_one(&al, a.cq).wr_id, 5);
    buf_b.read(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 99);
    buf_a.read(3072, &mut old).unwrap();
    assert_eq!(
        u64::from_ne_bytes(old),
        15,
        "compare-and-swap returns the old value"
    );

    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

#[test]
fn closing_an_al_with_live_qps_cqs_and_mrs_leaves_nothing() {
    let p = fabric();
    let al = Al::open().unwrap();
    let a = side(&al, &p, 0xa000, 1);
    let buf = RegisteredBuffer::new(1024);
    for _ in 0..4 {
        rc_qp(&al, &a);
        mr(&al, &a, &buf);
    }
    let srq = verbs::create_srq(
        al.instance(),
        a.pd,
        SrqInit {
            max_wr: 16,
            max_sge: 1,
        },
    )
    .unwrap();
    verbs::create_av(al.instance(), a.pd, AvAttr::lid(1, 2)).unwrap();
    let s = al.stats();
    assert_eq!(
        (s.live(Kind::QP), s.live(Kind::MR), s.live(Kind::CQ)),
        (4, 4, 1)
    );
    assert_eq!(
        (
            s.live(Kind::SRQ),
            s.live(Kind::AV),
            s.live(Kind::PD),
            s.live(Kind::CA)
        ),
        (1, 1, 1, 1)
    );
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
    let _ = srq;
}

#[test]
fn a_cq_or_srq_with_bound_qps_is_busy_until_they_are_gone() {
    let p = fabric();
    let al = Al::open().unwrap();
    let a = side(&al, &p, 0xa000, 1);
    let srq = verbs::create_srq(
        al.instance(),
        a.pd,
        SrqInit {
            max_wr: 16,
            max_sge: 1,
        },
    )
    .unwrap();
    let qp = create_qp(
        al.instance(),
        a.pd,
        QpCreate {
            srq: Some(srq),
            ..QpCreate::new(QpType::Rc, a.cq)
        },
    )
    .unwrap();
    assert_eq!(al.resolve(a.cq).unwrap().bindings().count(), 2);
    assert!(matches!(
        al.destroy(a.cq, None),
        Err(Error::ResourceBusy(_))
    ));
    assert!(matches!(al.destroy(srq, None), Err(Error::ResourceBusy(_))));
    // Still usable after the refusal.
    let mut wc = [Wc::default()];
    assert_eq!(verbs::poll_cq(&al, a.cq, &mut wc).unwrap(), 0);
    al.destroy_sync(qp).unwrap();
    al.destroy_sync(a.cq).unwrap();
    al.destroy_sync(srq).unwrap();
    // A closed CQ takes no new QP.
    assert!(al.resolve(a.cq).is_err());
    assert!(al.close().unwrap().is_clean());
}

/// Issue 12 (defect 4): an SRQ or CQ of another CA is refused by
/// `create_qp`, even when it is that CA's first SRQ in its first PD (whose
/// provider ids once equalled those of the first PD here), and the refusal
/// leaves nothing bound.
#[test]
fn create_qp_refuses_an_srq_or_cq_of_another_ca() {
    let p = fabric();
    let al = Al::open().unwrap();
    let (a, b) = (side(&al, &p, 0xa000, 1), side(&al, &p, 0xb000, 2));
    let init = SrqInit {
        max_wr: 16,
        max_sge: 1,
    };
    let srq_b = verbs::create_srq(al.instance(), b.pd, init).unwrap();
    let e = create_qp(
        al.instance(),
        a.pd,
        QpCreate {
            srq: Some(srq_b),
            ..QpCreate::new(QpType::Rc, a.cq)
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    // An SRQ of another PD of the same CA, likewise.
    let pd2 = verbs::alloc_pd(al.instance(), a.ca).unwrap();
    let srq_a2 = verbs::create_srq(al.instance(), pd2, init).unwrap();
    let e = create_qp(
        al.instance(),
        a.pd,
        QpCreate {
            srq: Some(srq_a2),
            ..QpCreate::new(QpType::Rc, a.cq)
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    let e = create_qp(al.instance(), a.pd, QpCreate::new(QpType::Rc, b.cq)).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    for cq in [a.cq, b.cq] {
        assert_eq!(al.resolve(cq).unwrap().bindings().count(), 0);
    }
    for srq in [srq_b, srq_a2] {
        assert_eq!(al.resolve(srq).unwrap().bindings().count(), 0);
        al.destroy_sync(srq).unwrap();
    }
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn closing_a_ca_cascades_and_handles_go_stale() {
    let p = fabric();
    let al = Al::open().unwrap();
    let a = side(&al, &p, 0xa000, 1);
    let qp = rc_qp(&al, &a);
    al.destroy_sync(a.ca).unwrap_or_else(|e| panic!("{e}"));
    assert!(al.resolve(a.pd).is_err());
    assert!(al.resolve(qp).is_err());
    assert!(matches!(
        verbs::alloc_pd(al.instance(), a.ca),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(matches!(
        modify_qp(&al, qp, &QpModify::to(QpState::Init)),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(al.stats().is_clean(), "{}", al.stats());
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn completion_callbacks_run_on_the_al_executor() {
    let p = fabric();
    let al = Al::open().unwrap();
    let calls = StdArc::new(AtomicUsize::new(0));
    let on_executor = StdArc::new(AtomicUsize::new(0));
    let (c, e) = (calls.clone(), on_executor.clone());
    let ca = verbs::open_ca(al.instance(), &p, 0xa000).unwrap();
    let cb: verbs::CompletionCallback = StdArc::new(move |_cq| {
        c.fetch_add(1, Ordering::SeqCst);
        if al::in_callback() {
            e.fetch_add(1, Ordering::SeqCst);
        }
    });
    let cq = verbs::create_cq(al.instance(), ca, 16, Some(cb), None).unwrap();
    let pd = verbs::alloc_pd(al.instance(), ca).unwrap();
    let a = Side { ca, pd, cq, lid: 1 };
    let cb_side = side(&al, &p, 0xb000, 2);
    let (qa, qb) = (rc_qp(&al, &a), rc_qp(&al, &cb_side));
    let qpn = |q: Handle<Qp>| al.resolve(q).unwrap().qpn();
    to_rts(&al, qa, 2, qpn(qb), 0, 0);
    to_rts(&al, qb, 1, qpn(qa), 0, 0);
    let buf = RegisteredBuffer::new(64);
    let (_m, lk, _) = mr(&al, &a, &buf);
    verbs::arm_cq(&al, cq, CqArm::NextCompletion).unwrap();
    let (_mb, lkb, _) = mr(&al, &cb_side, &RegisteredBuffer::new(64));
    let rs = [sge(0, 64, lkb)];
    post_recv(
        &al,
        qb,
        &[RecvWr {
            wr_id: 1,
            sg_list: &rs,
        }],
    )
    .unwrap();
    let s = [sge(0, 64, lk)];
    post_send(&al, qa, &[SendWr::new(1, SendOp::Send, &s)]).unwrap();
    al.executor()
        .wait_until("test", || calls.load(Ordering::SeqCst) == 1)
        .unwrap();
    assert_eq!(on_executor.load(Ordering::SeqCst), 1);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn destroying_a_qp_tombstones_its_cid_slot() {
    let p = fabric();
    let al = Al::open().unwrap();
    let a = side(&al, &p, 0xa000, 1);
    let qp = rc_qp(&al, &a);
    let obj = al.resolve(qp).unwrap().to_arc();
    assert_eq!(obj.cid().load(), CidState::Unbound);
    al.destroy(qp, None).unwrap();
    assert_eq!(obj.cid().load(), CidState::Tombstone);
    assert!(matches!(
        qp::cid::bind(obj.cid(), al::RawHandle::new(Kind::CEP, 0, 1)),
        Err(Error::Destroying { .. })
    ));
    drop(obj);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn objects_of_another_al_are_invalid_handles() {
    let p = fabric();
    let (al1, al2) = (Al::open().unwrap(), Al::open().unwrap());
    let a = side(&al1, &p, 0xa000, 1);
    assert!(matches!(
        verbs::alloc_pd(al2.instance(), a.ca),
        Err(Error::InvalidHandle { .. })
    ));
    let mut wc = [Wc::default()];
    assert!(matches!(
        verbs::poll_cq(&al2, a.cq, &mut wc),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(al1.close().unwrap().is_clean());
    assert!(al2.close().unwrap().is_clean());
}
