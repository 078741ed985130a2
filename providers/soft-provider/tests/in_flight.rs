//! Buffers in flight: from the post of a local work request until it
//! finishes, the bytes it names are leased, and the application's mutating
//! accessors refuse them with `ResourceBusy` (changing nothing); the
//! memory stays alive whatever the application drops.

mod common;
use al::{Error, Result};
use common::*;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

fn busy(r: Result<()>) -> bool {
    matches!(r, Err(Error::ResourceBusy(_)))
}

#[test]
fn a_posted_receive_leases_exactly_its_bytes_until_it_completes() {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let src = RegisteredBuffer::from_vec(pattern(64, 1));
    let smr = a.pd.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(256);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    let sg = [dmr.sge(64, 64)];
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &sg,
    }])
    .unwrap();
    assert_eq!(dst.in_flight(), 1);
    assert!(dst.is_in_flight(100, 1) && !dst.is_in_flight(0, 64));
    // Every mutating path over the leased bytes is refused, nothing moves.
    assert!(busy(dst.write(100, &[9])));
    assert!(
        busy(dst.write(0, &[9; 65])),
        "one byte of overlap is enough"
    );
    assert!(busy(dst.fill(7)));
    assert!(matches!(dst.with_mut(|_| ()), Err(Error::ResourceBusy(_))));
    assert!(busy(dst.with_range_mut(120, 8, |_| ())));
    assert!(
        busy(dmr.write(64, &[1])),
        "the MR's own write is refused too"
    );
    assert!(dst.to_vec().iter().all(|&x| x == 0), "nothing was written");
    // Bytes beside it stay the application's, and reading is always fine.
    dst.write(0, &[5; 64]).unwrap();
    dst.write(128, &[6; 128]).unwrap();
    let mut out = [0u8; 64];
    dst.read(64, &mut out).unwrap();
    // The message lands; the lease goes with the consumed receive.
    qa.post_send(&[SendWr::new(2, SendOp::Send, &[smr.sge(0, 64)])])
        .unwrap();
    f.settle(10);
    assert_eq!(poll1(&b.rcq).status, WcStatus::Success);
    assert_eq!(dst.in_flight(), 0);
    assert_eq!(&dst.to_vec()[64..128], &pattern(64, 1)[..]);
    dst.write(64, &[0; 64]).unwrap();
}

#[test]
fn a_flushed_receive_releases_its_lease() {
    let (_f, a, b) = two();
    let (_qa, qb) = rc_pair(&a, &b, ALL);
    let dst = RegisteredBuffer::new(64);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    for id in 0..3 {
        qb.post_recv(&[RecvWr {
            wr_id: id,
            sg_list: &[dmr.sge(0, 64)],
        }])
        .unwrap();
    }
    assert_eq!(dst.in_flight(), 3);
    qb.modify(&QpModify::to(QpState::Err)).unwrap();
    for _ in 0..3 {
        assert_eq!(poll1(&b.rcq).status, WcStatus::WrFlushError);
    }
    assert_eq!(dst.in_flight(), 0);
    dst.fill(1).unwrap();
}

#[test]
fn destroying_the_qp_releases_its_leases() {
    let (_f, a, b) = two();
    let (_qa, qb) = rc_pair(&a, &b, ALL);
    let dst = RegisteredBuffer::new(64);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 32), dmr.sge(32, 32)],
    }])
    .unwrap();
    assert_eq!(dst.in_flight(), 2, "one lease per SGE");
    drop(qb);
    assert_eq!(dst.in_flight(), 0);
    dst.fill(1).unwrap();
}

#[test]
fn srq_receives_are_leased_too() {
    let (_f, _a, b) = two();
    let srq = b
        .hca
        .create_srq(
            &b.pd,
            SrqInit {
                max_wr: 8,
                max_sge: 2,
            },
        )
        .unwrap();
    let dst = RegisteredBuffer::new(64);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    srq.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 16)],
    }])
    .unwrap();
    assert!(busy(dst.write(8, &[1])));
    dst.write(16, &[1]).unwrap();
    drop(srq);
    assert_eq!(dst.in_flight(), 0);
}

#[test]
fn a_send_held_for_rnr_leases_its_source_until_it_completes() {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let src = RegisteredBuffer::from_vec(pattern(32, 3));
    let smr = a.pd.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(32);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    qa.post_send(&[SendWr::new(1, SendOp::Send, &[smr.sge(0, 32)])])
        .unwrap();
    f.progress();
    assert!(a.scq.is_empty(), "no receive yet: the send is held (RNR)");
    assert!(
        busy(src.write(0, &[0; 32])),
        "the held send's bytes are still in flight"
    );
    qb.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: &[dmr.sge(0, 32)],
    }])
    .unwrap();
    f.settle(10);
    assert_eq!(poll1(&a.scq).status, WcStatus::Success);
    assert_eq!(src.in_flight(), 0);
    src.write(0, &[0; 32]).unwrap();
    assert_eq!(
        dst.to_vec(),
        pattern(32, 3),
        "the data sent is the data posted"
    );
}

#[test]
fn deregistering_under_a_posted_receive_frees_nothing_early() {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let src = RegisteredBuffer::from_vec(pattern(16, 5));
    let smr = a.pd.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(16);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 16)],
    }])
    .unwrap();
    // The application lets go of everything it holds over the memory.
    drop(dmr);
    drop(dst);
    // The receive's key names no MR now: it fails when the message comes,
    // without touching the bytes (which its lease still keeps alive).
    qa.post_send(&[SendWr::new(2, SendOp::Send, &[smr.sge(0, 16)])])
        .unwrap();
    f.settle(10);
    assert_eq!(poll1(&b.rcq).status, WcStatus::LocalProtectionError);
}

#[test]
fn a_receive_whose_key_names_nothing_leases_nothing() {
    let (_f, a, b) = two();
    let (_qa, qb) = rc_pair(&a, &b, ALL);
    let dst = RegisteredBuffer::new(16);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    let bad = Sge {
        lkey: dmr.lkey() ^ 0x100,
        ..dmr.sge(0, 16)
    };
    let outside = Sge {
        length: 17,
        ..dmr.sge(0, 16)
    };
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[bad, outside],
    }])
    .unwrap();
    assert_eq!(dst.in_flight(), 0);
    dst.fill(3).unwrap();
}

/// Both send paths (batched and general) release exactly the receives
/// they consume, no more.
#[test]
fn consumed_receives_release_their_slots_on_both_send_paths() {
    for batched in [true, false] {
        let (f, a, b) = two();
        f.set_batched_sends(batched);
        let (qa, qb) = rc_pair(&a, &b, ALL);
        let src = RegisteredBuffer::from_vec(pattern(16 * 64, 7));
        let smr = a.pd.register(&src, ALL).unwrap();
        let dst = RegisteredBuffer::new(16 * 64);
        let dmr = b.pd.register(&dst, ALL).unwrap();
        let rsg: Vec<[Sge; 1]> = (0..16).map(|i| [dmr.sge(i * 64, 64)]).collect();
        let recvs: Vec<RecvWr> = (0..16)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sg_list: &rsg[i],
            })
            .collect();
        qb.post_recv(&recvs).unwrap();
        assert_eq!(dst.in_flight(), 16);
        let ssg: Vec<[Sge; 1]> = (0..10).map(|i| [smr.sge(i * 64, 64)]).collect();
        let sends: Vec<SendWr<SoftAv>> = (0..10)
            .map(|i| SendWr::new(i as u64, SendOp::Send, &ssg[i]))
            .collect();
        qa.post_send(&sends).unwrap();
        f.settle(10);
        assert_eq!(dst.in_flight(), 6, "batched={batched}");
        assert_eq!(
            f.stats().batched_sends > 0,
            batched,
            "the path under test ran"
        );
        dst.write(0, &[0; 640]).unwrap();
        assert!(matches!(
            dst.write(640, &[0; 1]),
            Err(Error::ResourceBusy(_))
        ));
        // Back to RESET drops the rest without completions, and their leases.
        qb.modify(&QpModify::to(QpState::Reset)).unwrap();
        assert_eq!(dst.in_flight(), 0);
    }
}

#[test]
fn ud_and_write_with_immediate_receives_release_theirs() {
    let (f, a, b) = two();
    let (ua, ub) = (ud_qp(&a, 0x11), ud_qp(&b, 0x11));
    let src = RegisteredBuffer::from_vec(pattern(64, 9));
    let smr = a.pd.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(128);
    let dmr = b.pd.register(&dst, ALL).unwrap();
    ub.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 128)],
    }])
    .unwrap();
    let av = a.hca.create_av(&a.pd, &AvAttr::lid(1, b.lid)).unwrap();
    let ud = UdDest {
        av: &av,
        remote_qpn: ub.qpn(),
        remote_qkey: 0x11,
        pkey_index: 0,
    };
    ua.post_send(&[SendWr::new(1, SendOp::Send, &[smr.sge(0, 64)]).to(ud)])
        .unwrap();
    f.settle(10);
    assert_eq!(poll1(&b.rcq).status, WcStatus::Success);
    assert_eq!(dst.in_flight(), 0, "UD receive");

    let (qa, qb) = rc_pair(&a, &b, ALL);
    qb.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[dmr.sge(64, 64)],
    }])
    .unwrap();
    let write = SendOp::WriteImm {
        remote_addr: 0,
        rkey: dmr.rkey(),
        imm: 5,
    };
    qa.post_send(&[SendWr::new(2, write, &[smr.sge(0, 32)])])
        .unwrap();
    f.settle(10);
    assert_eq!(poll1(&b.rcq).imm, Some(5));
    assert_eq!(dst.in_flight(), 0, "WRITE with immediate");
}
