//! Buffers in flight on the RoCEv2 provider: posted receives, RDMA READ
//! targets and long SEND sources stay refused to the application until
//! their work request completes.

mod hostile_fixture;

use provider::{
    Device, Mtu, Provider, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus,
};

use hostile_fixture::*;

/// Buffers in flight (`docs/memory.md`): a posted receive, and the local
/// target of a READ until its completion, refuse the application's
/// writes; an unsignaled READ that succeeds completes silently.
#[test]
fn receives_and_read_targets_are_in_flight() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    let (abuf, _amr, akey) = a.mem(64);
    let (bbuf, _bmr, bkey) = b.mem(64);
    // A posted receive blocks its bytes until the SEND lands.
    let rs = [Sge {
        addr: 0,
        length: 16,
        lkey: bkey,
    }];
    b.dev
        .post_recv(
            &qb,
            &[RecvWr {
                wr_id: 1,
                sg_list: &rs,
            }],
        )
        .unwrap();
    assert!(bbuf.write(8, b"no").is_err());
    bbuf.write(32, b"elsewhere").unwrap();
    let ss = [Sge {
        addr: 0,
        length: 4,
        lkey: akey,
    }];
    a.dev
        .post_send::<()>(&qa, &[SendWr::new(1, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    bbuf.write(8, b"ok").unwrap();
    // An unsignaled READ completes silently; the signaled SEND after it
    // is the only completion.
    let read = SendWr::new(
        7,
        SendOp::Read {
            remote_addr: 32,
            rkey: bkey,
        },
        &ss,
    )
    .unsignaled();
    b.dev
        .post_recv(
            &qb,
            &[RecvWr {
                wr_id: 2,
                sg_list: &rs,
            }],
        )
        .unwrap();
    a.dev
        .post_send::<()>(&qa, &[read, SendWr::new(8, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::Success));
    let mut got = [0u8; 4];
    abuf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"else");
    assert_eq!(b.wait(1)[0].wr_id, 2);

    // A READ towards a QP that does not answer: its target is in flight
    // until RETRY_EXC_ERR.
    let lone = a.qp(QpType::Rc);
    let dead = b.qp(QpType::Rc);
    let m = |s| QpModify::to(s);
    let d = &a.dev;
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rts)
            .sq_psn(0)
            .timeout(12)
            .retry_cnt(1)
            .rnr_retry(0)
            .max_rd_atomic(1),
    )
    .unwrap();
    let target = [Sge {
        addr: 16,
        length: 8,
        lkey: akey,
    }];
    let read = SendWr::new(
        9,
        SendOp::Read {
            remote_addr: 0,
            rkey: bkey,
        },
        &target,
    );
    d.post_send::<()>(&lone, &[read], &|_| None).unwrap();
    assert!(
        abuf.write(20, b"busy").is_err(),
        "the READ target is leased"
    );
    abuf.write(40, b"free").unwrap();
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RetryExceeded));
    abuf.write(20, b"free").unwrap();
}

/// A long SEND or WRITE is read from its MR as its packets go
/// (`roce_transport::LEASE_MIN` and up), so its source is in flight until
/// the request leaves the queue: completed (signaled or not), failed, or
/// dropped with its QP. Shorter ones are copied at post and free at once.
#[test]
fn long_send_sources_are_in_flight_until_they_complete() {
    let p = provider();
    let a = Side::new(p.open(1).unwrap());
    let b = Side::new(p.open(2).unwrap());
    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    a.connect(&qa, &b, b.dev.qp_num(&qb));
    b.connect(&qb, &a, a.dev.qp_num(&qa));
    const LONG: usize = 300 << 10;
    let (abuf, _amr, akey) = a.mem(LONG + 64);
    let (bbuf, _bmr, bkey) = b.mem(LONG + 64);
    let data: Vec<u8> = (0..LONG).map(|i| (i * 7 + i / 4096) as u8).collect();
    abuf.write(0, &data).unwrap();
    let long = [Sge {
        addr: 0,
        length: LONG as u32,
        lkey: akey,
    }];
    let short = [Sge {
        addr: LONG as u64,
        length: 64,
        lkey: akey,
    }];
    // Each WRITE lands where its source lies.
    fn write(wr_id: u64, sg: &[Sge; 1], bkey: u32) -> SendWr<'_, ()> {
        SendWr::new(
            wr_id,
            SendOp::Write {
                remote_addr: sg[0].addr,
                rkey: bkey,
            },
            sg,
        )
    }
    // An unsignaled long WRITE, then a signaled short one: when the short
    // one completes the long one has (in order), and both sources are free.
    a.dev
        .post_send::<()>(
            &qa,
            &[write(1, &long, bkey).unsignaled(), write(2, &short, bkey)],
            &|_| None,
        )
        .unwrap();
    abuf.write(LONG, b"short: copied at post").unwrap();
    assert_eq!(a.wait(1)[0].wr_id, 2);
    abuf.write(0, b"free again").unwrap();
    let mut got = vec![0u8; LONG];
    bbuf.read(0, &mut got).unwrap();
    assert!(got == data, "the long WRITE landed byte for byte");

    // Towards a QP that never answers: in flight until RETRY_EXC_ERR.
    let lone = a.qp(QpType::Rc);
    let dead = b.qp(QpType::Rc);
    let m = |s| QpModify::to(s);
    let d = &a.dev;
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    let rts = m(QpState::Rts)
        .sq_psn(0)
        .timeout(12)
        .retry_cnt(1)
        .rnr_retry(0)
        .max_rd_atomic(1);
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(3, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err(), "the source is leased");
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RetryExceeded));
    abuf.write(100, b"free").unwrap();

    // Reset with a long WRITE queued: the lease goes with the transport.
    d.modify_qp(&lone, &m(QpState::Reset)).unwrap();
    d.modify_qp(&lone, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &lone,
        &m(QpState::Rtr)
            .av(a.av_to(&b))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(b.dev.qp_num(&dead))
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(4, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err());
    d.modify_qp(&lone, &m(QpState::Reset)).unwrap();
    abuf.write(100, b"free").unwrap();
    // And with destroy.
    for s in [QpState::Init, QpState::Rtr] {
        let mut mm = m(s);
        if s == QpState::Init {
            mm = mm.pkey_index(0).port(1).access(ALL);
        } else {
            mm = mm
                .av(a.av_to(&b))
                .path_mtu(Mtu::Mtu1024)
                .dest_qpn(b.dev.qp_num(&dead))
                .rq_psn(0)
                .max_dest_rd_atomic(1)
                .min_rnr_timer(1);
        }
        d.modify_qp(&lone, &mm).unwrap();
    }
    d.modify_qp(&lone, &rts).unwrap();
    d.post_send::<()>(&lone, &[write(5, &long, bkey)], &|_| None)
        .unwrap();
    assert!(abuf.write(100, b"busy").is_err());
    drop(lone);
    abuf.write(100, b"free").unwrap();
}
