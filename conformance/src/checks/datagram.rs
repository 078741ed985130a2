//! UD and UC specifics: Q_Key checks, the GRH area, the MTU bound,
//! unreliable drops.

use provider::{
    Device, GrhAttr, QpModify, QpState, QpType, SendOp, SendWr, WcOpcode, WcStatus, GRH_SIZE,
};

use crate::fixture::Fixture;
use crate::harness::*;

const G: u32 = GRH_SIZE as u32;

/// A datagram with the wrong Q_Key is dropped (the sender still
/// succeeds); so is one whose controlled Q_Key (high bit) makes the
/// sender use its own, different, Q_Key. A sentinel with the right Q_Key,
/// sent after them on the same path, takes the first receive.
pub fn ud_qkey_mismatch_is_dropped<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let qa = a.ud_qp(0x1111);
    let qb = b.ud_qp(0x2222);
    let am = a.mem(64, 0, ALL);
    am.write(0, &pattern(64, 8));
    let bm = b.mem(1024, 0, ALL);
    b.recv(&qb, 1, &[bm.sge(0, 512)]);
    b.recv(&qb, 2, &[bm.sge(512, 512)]);
    let av = a.av(&b);
    let to = |qkey| a.dest(&av, b.qpn(&qb), qkey);
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, 10)]).to(to(0x3333)),
    );
    ok(&a.wait_send(), 1, WcOpcode::Send, 10);
    a.send(
        &qa,
        SendWr::new(2, SendOp::Send, &[am.sge(0, 20)]).to(to(0x8000_0000)),
    );
    ok(&a.wait_send(), 2, WcOpcode::Send, 20);
    a.send(
        &qa,
        SendWr::new(3, SendOp::SendImm(3), &[am.sge(0, 30)]).to(to(0x2222)),
    );
    ok(&a.wait_send(), 3, WcOpcode::Send, 30);
    let wc = b.wait_recv();
    ok(&wc, 1, WcOpcode::Recv, 30 + G);
    assert_eq!(wc.imm, Some(3), "the sentinel, not a dropped datagram");
    assert_eq!(bm.read(GRH_SIZE, 30), pattern(30, 8));
    // The sender's own Q_Key, through the controlled bit, when it matches.
    let qa2 = a.ud_qp(0x2222);
    a.send(
        &qa2,
        SendWr::new(4, SendOp::SendImm(4), &[am.sge(0, 40)]).to(to(0x8000_0000)),
    );
    ok(&a.wait_send(), 4, WcOpcode::Send, 40);
    let wc = b.wait_recv();
    ok(&wc, 2, WcOpcode::Recv, 40 + G);
    assert_eq!((wc.imm, wc.src_qp), (Some(4), a.qpn(&qa2)));
}

/// Every UD receive buffer starts with 40 bytes for the GRH: the payload
/// lands after them and byte_len counts them. With a GRH in the AV the
/// receive says so and, for an IPv6-style GID, the area holds an IPv6
/// header with the source and destination GIDs; the GID routes even when
/// the AV's LID names nobody. Without a GRH (LID routing) `grh` is false.
pub fn ud_grh_area<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let qa = a.ud_qp(5);
    let qb = b.ud_qp(5);
    let bm = b.mem(1024, 0, ALL);
    b.recv(&qb, 1, &[bm.sge(0, 256)]);
    let mut attr = a.grh_av_attr(&b);
    attr.dlid = 0xbeef; // names nobody: the GID must win
    attr.grh = Some(GrhAttr {
        flow_label: 0x12345,
        ..attr.grh.unwrap()
    });
    let av = a.dev.create_av(&a.pd, &attr).unwrap();
    let am = a.mem(16, 0, ALL);
    am.write(0, b"grh!");
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, 4)]).to(a.dest(&av, b.qpn(&qb), 5)),
    );
    ok(&a.wait_send(), 1, WcOpcode::Send, 4);
    let wc = b.wait_recv();
    ok(&wc, 1, WcOpcode::Recv, 4 + G);
    assert!(wc.grh, "{wc:?}");
    assert_eq!(wc.src_qp, a.qpn(&qa));
    let v = bm.read(0, 64);
    assert_eq!(&v[40..44], b"grh!");
    assert_eq!(&v[44..48], [0; 4]);
    let v4_mapped = |g: &[u8; 16]| g[..10] == [0; 10] && g[10..12] == [0xff, 0xff];
    if !v4_mapped(&a.ep.gid) && !v4_mapped(&b.ep.gid) {
        assert_eq!(v[0] >> 4, 6, "IPv6 version");
        assert_eq!(v[6], 0x1b, "next header: IBA transport");
        assert_eq!(&v[8..24], &a.ep.gid, "source GID");
        assert_eq!(&v[24..40], &b.ep.gid, "destination GID");
    }
    if f.supports_lid_routing() && b.ep.lid.is_some() {
        b.recv(&qb, 2, &[bm.sge(256, 256)]);
        let av = a.av(&b);
        a.send(
            &qa,
            SendWr::new(2, SendOp::Send, &[am.sge(0, 4)]).to(a.dest(&av, b.qpn(&qb), 5)),
        );
        ok(&a.wait_send(), 2, WcOpcode::Send, 4);
        let wc = b.wait_recv();
        ok(&wc, 2, WcOpcode::Recv, 4 + G);
        assert!(!wc.grh);
        assert_eq!(wc.slid, a.ep.lid.unwrap());
        assert_eq!(bm.read(256 + GRH_SIZE, 4), b"grh!");
    } else {
        eprintln!("LID routing not supported: the LID-routed half is skipped");
    }
}

/// A UD message of exactly the path MTU goes; one byte more is
/// `LocalLengthError` and moves the QP to SQE, from which it returns to
/// RTS and sends again.
pub fn ud_message_larger_than_mtu_is_refused<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let mtu = a.path_mtu(&b).bytes();
    let qa = a.ud_qp(9);
    let qb = b.ud_qp(9);
    let am = a.mem(mtu + 1, 0, ALL);
    am.write(0, &pattern(mtu + 1, 2));
    let bm = b.mem(2 * (mtu + GRH_SIZE + 1), 0, ALL);
    let slot = (mtu + GRH_SIZE + 1) as u64;
    b.recv(&qb, 1, &[bm.sge(0, slot as u32)]);
    let av = a.av(&b);
    let to = || a.dest(&av, b.qpn(&qb), 9);
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, mtu as u32 + 1)]).to(to()),
    );
    failed(&a.wait_send(), 1, WcStatus::LocalLengthError);
    assert_eq!(a.state(&qa), QpState::Sqe, "a UD send error goes to SQE");
    a.modify(&qa, QpModify::to(QpState::Rts)).unwrap();
    a.send(
        &qa,
        SendWr::new(2, SendOp::Send, &[am.sge(0, mtu as u32)]).to(to()),
    );
    ok(&a.wait_send(), 2, WcOpcode::Send, mtu as u32);
    let wc = b.wait_recv();
    ok(&wc, 1, WcOpcode::Recv, mtu as u32 + G);
    assert_eq!(bm.read(GRH_SIZE, mtu), pattern(mtu, 2));
}

/// UC: a SEND meeting no receive is dropped, the sender succeeds; the
/// responder's next message goes to the next receive posted.
pub fn uc_send_without_receive_is_dropped<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Uc, ALL);
    let am = a.mem(64, 0, ALL);
    am.write(0, &pattern(64, 5));
    let bm = b.mem(128, 0, ALL);
    a.send(&qa, SendWr::new(1, SendOp::Send, &[am.sge(0, 10)]));
    ok(&a.wait_send(), 1, WcOpcode::Send, 10);
    // A WRITE behind it, on the same QP: once it landed, the SEND was
    // handled (dropped) by the responder.
    a.send(
        &qa,
        SendWr::new(
            2,
            SendOp::Write {
                remote_addr: bm.iova + 64,
                rkey: bm.rkey,
            },
            &[am.sge(0, 64)],
        ),
    );
    ok(&a.wait_send(), 2, WcOpcode::RdmaWrite, 64);
    wait_bytes(f, &bm, 64, &pattern(64, 5));
    b.assert_empty(&b.rcq, "the SEND found no receive");
    b.recv(&qb, 7, &[bm.sge(0, 64)]);
    a.send(&qa, SendWr::new(3, SendOp::SendImm(3), &[am.sge(20, 20)]));
    ok(&a.wait_send(), 3, WcOpcode::Send, 20);
    let wc = b.wait_recv();
    ok(&wc, 7, WcOpcode::Recv, 20);
    assert_eq!(wc.imm, Some(3));
    assert_eq!(bm.read(0, 20), pattern(64, 5)[20..40]);
    assert_eq!(b.state(&qb), QpState::Rts);
}
