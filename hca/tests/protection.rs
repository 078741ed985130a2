//! Every protection error path ends in an error completion with no byte
//! touched outside the target range.

mod common;
use common::*;
use hca::*;

struct Setup {
    _f: Fabric,
    a: Node,
    b: Node,
    qa: SoftQp,
    qb: SoftQp,
    abuf: RegisteredBuffer,
    bbuf: RegisteredBuffer,
    amr: SoftMr,
    bmr: SoftMr,
}

const FILL_A: u8 = 0xaa;
const FILL_B: u8 = 0xbb;

fn setup(b_access: Access) -> Setup {
    let (f, a, b) = two();
    let (qa, qb) = rc_pair(&a, &b, ALL);
    let abuf = RegisteredBuffer::new(4096);
    abuf.fill(FILL_A).unwrap();
    let bbuf = RegisteredBuffer::new(4096);
    bbuf.fill(FILL_B).unwrap();
    let amr = a.pd.register(&abuf, ALL).unwrap();
    // b's MR covers [1024, 2048) of its buffer, iova 0x10000.
    let bmr =
        b.pd.register_range(&bbuf, 1024, 1024, 0x10000, b_access)
            .unwrap();
    Setup {
        _f: f,
        a,
        b,
        qa,
        qb,
        abuf,
        bbuf,
        amr,
        bmr,
    }
}

fn untouched(buf: &RegisteredBuffer, fill: u8) {
    assert!(
        buf.to_vec().iter().all(|&x| x == fill),
        "buffer was modified"
    );
}

fn expect(s: &Setup, status: WcStatus) {
    let wc = poll1(&s.a.scq);
    assert_eq!(wc.status, status, "{wc:?}");
    assert_eq!(
        s.qa.query().state,
        QpState::Err,
        "the requester goes to ERR"
    );
}

#[test]
fn wrong_lkey_is_local_protection_error() {
    let s = setup(ALL);
    let bad = Sge {
        lkey: s.amr.lkey() ^ 0x100,
        ..s.amr.sge(0, 16)
    };
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
        },
        &[bad],
    )])
    .unwrap();
    expect(&s, WcStatus::LocalProtectionError);
    untouched(&s.bbuf, FILL_B);
}

#[test]
fn stale_lkey_after_deregistration_misses() {
    let s = setup(ALL);
    let buf = RegisteredBuffer::new(64);
    let mr = s.a.pd.register(&buf, ALL).unwrap();
    let sge = mr.sge(0, 8);
    drop(mr);
    s.qa.post_send(&[SendWr::new(1, SendOp::Send, &[sge])])
        .unwrap();
    expect(&s, WcStatus::LocalProtectionError);
}

#[test]
fn lkey_from_another_pd_is_rejected() {
    let s = setup(ALL);
    let pd2 = s.a.hca.alloc_pd().unwrap();
    let buf = RegisteredBuffer::new(64);
    let mr = pd2.register(&buf, ALL).unwrap();
    s.qa.post_send(&[SendWr::new(1, SendOp::Send, &[mr.sge(0, 8)])])
        .unwrap();
    expect(&s, WcStatus::LocalProtectionError);
}

#[test]
fn local_out_of_bounds_is_local_protection_error() {
    let s = setup(ALL);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
        },
        &[s.amr.sge(4090, 16)],
    )])
    .unwrap();
    expect(&s, WcStatus::LocalProtectionError);
    untouched(&s.bbuf, FILL_B);
}

#[test]
fn read_into_mr_without_local_write_is_local_protection_error() {
    let s = setup(ALL);
    let buf = RegisteredBuffer::new(64);
    buf.fill(1).unwrap();
    let ro = s.a.pd.register(&buf, Access::NONE).unwrap();
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Read {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
        },
        &[ro.sge(0, 64)],
    )])
    .unwrap();
    expect(&s, WcStatus::LocalProtectionError);
    untouched(&buf, 1);
}

#[test]
fn wrong_rkey_is_remote_access_error() {
    let s = setup(ALL);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey().wrapping_add(1),
        },
        &[s.amr.sge(0, 16)],
    )])
    .unwrap();
    expect(&s, WcStatus::RemoteAccessError);
    untouched(&s.bbuf, FILL_B);
    assert_eq!(
        s.qb.query().state,
        QpState::Err,
        "the responder goes to ERR too"
    );
}

#[test]
fn remote_write_out_of_bounds_touches_nothing() {
    // Straddling the MR's end by one byte, and starting before it.
    for (addr, len) in [
        (0x10000 + 1024 - 15, 16u32),
        (0x10000 - 1, 4),
        (u64::MAX - 2, 8),
    ] {
        let s = setup(ALL);
        s.qa.post_send(&[SendWr::new(
            1,
            SendOp::Write {
                remote_addr: addr,
                rkey: s.bmr.rkey(),
            },
            &[s.amr.sge(0, len)],
        )])
        .unwrap();
        expect(&s, WcStatus::RemoteAccessError);
        untouched(&s.bbuf, FILL_B);
    }
}

#[test]
fn remote_write_exactly_at_the_end_is_fine_and_precise() {
    let s = setup(ALL);
    s.abuf.write(0, &pattern(16, 3)).unwrap();
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0x10000 + 1024 - 16,
            rkey: s.bmr.rkey(),
        },
        &[s.amr.sge(0, 16)],
    )])
    .unwrap();
    assert_eq!(poll1(&s.a.scq).status, WcStatus::Success);
    let v = s.bbuf.to_vec();
    assert_eq!(&v[2048 - 16..2048], &pattern(16, 3)[..]);
    assert!(v[..2048 - 16]
        .iter()
        .chain(&v[2048..])
        .all(|&x| x == FILL_B));
}

#[test]
fn missing_remote_write_flag() {
    let s = setup(Access::LOCAL_WRITE | Access::REMOTE_READ);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
        },
        &[s.amr.sge(0, 16)],
    )])
    .unwrap();
    expect(&s, WcStatus::RemoteAccessError);
    untouched(&s.bbuf, FILL_B);
}

#[test]
fn missing_remote_read_flag() {
    let s = setup(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::Read {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
        },
        &[s.amr.sge(0, 16)],
    )])
    .unwrap();
    expect(&s, WcStatus::RemoteAccessError);
    untouched(&s.abuf, FILL_A);
}

#[test]
fn missing_remote_atomic_flag_and_misalignment() {
    let s = setup(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::FetchAdd {
            remote_addr: 0x10000,
            rkey: s.bmr.rkey(),
            add: 1,
        },
        &[s.amr.sge(0, 8)],
    )])
    .unwrap();
    expect(&s, WcStatus::RemoteAccessError);
    untouched(&s.bbuf, FILL_B);
    untouched(&s.abuf, FILL_A);

    let s = setup(ALL);
    s.qa.post_send(&[SendWr::new(
        1,
        SendOp::CompareSwap {
            remote_addr: 0x10004,
            rkey: s.bmr.rkey(),
            compare: 0,
            swap: 1,
        },
        &[s.amr.sge(0, 8)],
    )])
    .unwrap();
    expect(&s, WcStatus::RemoteInvalidRequest);
    untouched(&s.bbuf, FILL_B);
}

#[test]
fn qp_without_remote_write_access_refuses() {
    let (_f, a, b) = two();
    let qa = qp(&a, QpType::Rc, None);
    let qb = qp(&b, QpType::Rc, None);
    connect(&qa, ALL, b.lid, qb.qpn(), 0, 0);
    connect(&qb, Access::LOCAL_WRITE, a.lid, qa.qpn(), 0, 0);
    let bbuf = RegisteredBuffer::new(64);
    let bmr = b.pd.register(&bbuf, ALL).unwrap();
    let abuf = RegisteredBuffer::new(64);
    let amr = a.pd.register(&abuf, ALL).unwrap();
    qa.post_send(&[SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0,
            rkey: bmr.rkey(),
        },
        &[amr.sge(0, 8)],
    )])
    .unwrap();
    assert_eq!(poll1(&a.scq).status, WcStatus::RemoteInvalidRequest);
}

#[test]
fn receive_buffer_too_small_and_bad_receive_lkey() {
    let s = setup(ALL);
    s.qb.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[s.bmr.sge(0, 8)],
    }])
    .unwrap();
    s.qa.post_send(&[SendWr::new(1, SendOp::Send, &[s.amr.sge(0, 9)])])
        .unwrap();
    expect(&s, WcStatus::RemoteInvalidRequest);
    let wc = poll1(&s.b.rcq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocalLengthError));
    untouched(&s.bbuf, FILL_B);

    let s = setup(ALL);
    let bad = Sge {
        lkey: 0x7777_7700,
        ..s.bmr.sge(0, 64)
    };
    s.qb.post_recv(&[RecvWr {
        wr_id: 6,
        sg_list: &[bad],
    }])
    .unwrap();
    s.qa.post_send(&[SendWr::new(1, SendOp::Send, &[s.amr.sge(0, 9)])])
        .unwrap();
    expect(&s, WcStatus::RemoteOpError);
    let wc = poll1(&s.b.rcq);
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::LocalProtectionError));
    untouched(&s.bbuf, FILL_B);
}

#[test]
fn registration_rules() {
    let (_f, a, _b) = two();
    let buf = RegisteredBuffer::new(100);
    assert!(matches!(
        a.pd.register(&buf, Access::REMOTE_WRITE),
        Err(al::Error::InvalidParameter(_))
    ));
    assert!(matches!(
        a.pd.register_range(&buf, 50, 51, 0, Access::NONE),
        Err(al::Error::InvalidParameter(_))
    ));
    let mr = a.pd.register_range(&buf, 50, 50, 0x1000, ALL).unwrap();
    assert_ne!(mr.lkey(), 0);
    mr.write(0, &[1, 2, 3]).unwrap();
    assert!(mr.write(48, &[1, 2, 3]).is_err());
    let mut x = [0; 3];
    buf.read(50, &mut x).unwrap();
    assert_eq!(x, [1, 2, 3]);
    assert!(buf.read(99, &mut x).is_err());
}
