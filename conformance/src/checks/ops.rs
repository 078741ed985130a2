//! Every work-request type on the QP types where it is legal, its refusal
//! where it is not, gather/scatter lists, signaled and unsignaled sends.

use provider::{AtomicCap, Device, QpState, QpType, SendOp, SendWr, WcOpcode, WcStatus};

use crate::fixture::Fixture;
use crate::harness::*;

/// RC SEND and SEND with immediate, both ways: data, byte_len, imm,
/// qp_num, a zero-length SEND, and a message of several MTUs.
pub fn rc_send_and_send_with_immediate<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(8192, 0, ALL);
    let bm = b.mem(8192, 0, ALL);
    let msg = pattern(100, 7);
    am.write(0, &msg);
    b.recv(&qb, 11, &[bm.sge(1000, 200)]);
    a.send(&qa, SendWr::new(1, SendOp::Send, &[am.sge(0, 100)]));
    ok(&a.wait_send(), 1, WcOpcode::Send, 100);
    let wc = b.wait_recv();
    ok(&wc, 11, WcOpcode::Recv, 100);
    assert_eq!((wc.imm, wc.qp_num), (None, b.qpn(&qb)));
    assert_eq!(bm.read(1000, 100), msg);
    assert_eq!(bm.read(1100, 100), vec![0; 100], "nothing past the message");

    // b -> a with immediate, several MTUs long.
    let long = pattern(5000, 9);
    bm.write(2000, &long);
    a.recv(&qa, 12, &[am.sge(100, 6000)]);
    b.send(
        &qb,
        SendWr::new(2, SendOp::SendImm(0xdead_beef), &[bm.sge(2000, 5000)]),
    );
    ok(&b.wait_send(), 2, WcOpcode::Send, 5000);
    let wc = a.wait_recv();
    ok(&wc, 12, WcOpcode::Recv, 5000);
    assert_eq!((wc.imm, wc.qp_num), (Some(0xdead_beef), a.qpn(&qa)));
    assert_eq!(am.read(100, 5000), long);

    // Zero bytes, with and without immediate, into a receive with no SGE.
    b.recv(&qb, 13, &[]);
    b.recv(&qb, 14, &[]);
    a.send(&qa, SendWr::new(3, SendOp::Send, &[]));
    a.send(&qa, SendWr::new(4, SendOp::SendImm(5), &[]));
    let s = a.wait(&a.scq, 2);
    ok(&s[0], 3, WcOpcode::Send, 0);
    ok(&s[1], 4, WcOpcode::Send, 0);
    let r = b.wait(&b.rcq, 2);
    ok(&r[0], 13, WcOpcode::Recv, 0);
    ok(&r[1], 14, WcOpcode::Recv, 0);
    assert_eq!((r[0].imm, r[1].imm), (None, Some(5)));

    // The PSNs advanced in step on both sides.
    let (sa, sb) = (a.dev.query_qp(&qa).unwrap(), b.dev.query_qp(&qb).unwrap());
    assert_eq!(sa.sq_psn, sb.rq_psn);
    assert_eq!(sb.sq_psn, sa.rq_psn);
    assert_eq!((sa.state, sb.state), (QpState::Rts, QpState::Rts));
}

/// RC RDMA WRITE (no receive consumed, several MTUs) and WRITE with
/// immediate (consumes a receive: `RecvRdmaWithImm`, byte_len, imm).
pub fn rc_rdma_write_and_write_with_immediate<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(8192, 0, ALL);
    let bm = b.mem(8192, 0xee, ALL);
    let data = pattern(4777, 3);
    am.write(100, &data);
    a.send(
        &qa,
        SendWr::new(
            3,
            SendOp::Write {
                remote_addr: bm.iova + 2048,
                rkey: bm.rkey,
            },
            &[am.sge(100, 4777)],
        ),
    );
    ok(&a.wait_send(), 3, WcOpcode::RdmaWrite, 4777);
    assert_eq!(bm.read(2048, 4777), data);
    assert_eq!(bm.read(2047, 1), [0xee], "nothing before the target");
    assert_eq!(bm.read(2048 + 4777, 1), [0xee], "nothing after it");

    let data = pattern(50, 1);
    bm.write(0, &data);
    a.recv(&qa, 13, &[]);
    b.send(
        &qb,
        SendWr::new(
            4,
            SendOp::WriteImm {
                remote_addr: am.iova + 10,
                rkey: am.rkey,
                imm: 42,
            },
            &[bm.sge(0, 50)],
        ),
    );
    ok(&b.wait_send(), 4, WcOpcode::RdmaWrite, 50);
    let wc = a.wait_recv();
    ok(&wc, 13, WcOpcode::RecvRdmaWithImm, 50);
    assert_eq!((wc.imm, wc.qp_num), (Some(42), a.qpn(&qa)));
    assert_eq!(am.read(10, 50), data);
    b.assert_empty(&b.rcq, "a plain WRITE consumes no receive");
}

/// RC RDMA READ, several MTUs, into a local MR with LOCAL_WRITE.
pub fn rc_rdma_read<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, _qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(8192, 0, ALL);
    let bm = b.mem(8192, 0, ALL);
    let remote = pattern(3300, 77);
    bm.write(3500, &remote);
    a.send(
        &qa,
        SendWr::new(
            5,
            SendOp::Read {
                remote_addr: bm.iova + 3500,
                rkey: bm.rkey,
            },
            &[am.sge(1000, 3300)],
        ),
    );
    ok(&a.wait_send(), 5, WcOpcode::RdmaRead, 3300);
    assert_eq!(am.read(1000, 3300), remote);
    assert_eq!(am.read(999, 1), [0]);
    assert_eq!(am.read(4300, 1), [0]);
    a.assert_empty(&a.rcq, "a READ consumes no receive");
}

/// RC fetch-and-add and compare-and-swap (failing, then succeeding) on an
/// 8-byte word: the original value lands in the local SGE, the bytes
/// around the word are untouched. Skipped when the device reports no
/// atomic support.
pub fn rc_atomics<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    if a.dev.query().atomic_cap == AtomicCap::None || b.dev.query().atomic_cap == AtomicCap::None {
        eprintln!("skipped: the device reports no atomic support");
        return;
    }
    let (qa, _qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(64, 0, ALL);
    let bm = b.mem(64, 0, ALL);
    bm.write(16, &100u64.to_ne_bytes());
    a.send(
        &qa,
        SendWr::new(
            6,
            SendOp::FetchAdd {
                remote_addr: bm.iova + 16,
                rkey: bm.rkey,
                add: 5,
            },
            &[am.sge(0, 8)],
        ),
    );
    ok(&a.wait_send(), 6, WcOpcode::FetchAdd, 8);
    assert_eq!((am.word(0), bm.word(16)), (100, 105));
    for (id, compare, after) in [(7, 1, 105), (8, 105, 999)] {
        a.send(
            &qa,
            SendWr::new(
                id,
                SendOp::CompareSwap {
                    remote_addr: bm.iova + 16,
                    rkey: bm.rkey,
                    compare,
                    swap: 999,
                },
                &[am.sge(8, 8)],
            ),
        );
        ok(&a.wait_send(), id, WcOpcode::CompareSwap, 8);
        assert_eq!(am.word(8), 105, "the original value comes back");
        assert_eq!(bm.word(16), after);
    }
    assert_eq!(
        (bm.word(8), bm.word(24)),
        (0, 0),
        "the neighbours are untouched"
    );
}

/// UC: SEND, SEND with immediate, WRITE and WRITE with immediate work;
/// READ and both atomics are refused at post time (`InvalidParameter`).
pub fn uc_operations_and_refusals<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Uc, ALL);
    let am = a.mem(4096, 0, ALL);
    let bm = b.mem(4096, 0, ALL);
    am.write(0, &pattern(3000, 5));
    b.recv(&qb, 1, &[bm.sge(0, 4096)]);
    a.send(&qa, SendWr::new(1, SendOp::SendImm(9), &[am.sge(0, 3000)]));
    ok(&a.wait_send(), 1, WcOpcode::Send, 3000);
    let wc = b.wait_recv();
    ok(&wc, 1, WcOpcode::Recv, 3000);
    assert_eq!(wc.imm, Some(9));
    assert_eq!(bm.read(0, 3000), pattern(3000, 5));

    am.write(0, &pattern(128, 6));
    a.send(
        &qa,
        SendWr::new(
            2,
            SendOp::Write {
                remote_addr: bm.iova + 3000,
                rkey: bm.rkey,
            },
            &[am.sge(0, 128)],
        ),
    );
    ok(&a.wait_send(), 2, WcOpcode::RdmaWrite, 128);
    wait_bytes(f, &bm, 3000, &pattern(128, 6));
    b.recv(&qb, 3, &[]);
    a.send(
        &qa,
        SendWr::new(
            3,
            SendOp::WriteImm {
                remote_addr: bm.iova + 3500,
                rkey: bm.rkey,
                imm: 77,
            },
            &[am.sge(0, 16)],
        ),
    );
    ok(&a.wait_send(), 3, WcOpcode::RdmaWrite, 16);
    let wc = b.wait_recv();
    ok(&wc, 3, WcOpcode::RecvRdmaWithImm, 16);
    assert_eq!(wc.imm, Some(77));
    assert_eq!(bm.read(3500, 16), pattern(16, 6));

    let r = bm.iova;
    for op in [
        SendOp::Read {
            remote_addr: r,
            rkey: bm.rkey,
        },
        SendOp::CompareSwap {
            remote_addr: r,
            rkey: bm.rkey,
            compare: 0,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: r,
            rkey: bm.rkey,
            add: 1,
        },
    ] {
        invalid(a.post_send(&qa, &[SendWr::new(4, op, &[am.sge(0, 8)])]));
    }
    assert_eq!(a.state(&qa), QpState::Rts, "a refused post changes nothing");
    a.assert_empty(&a.scq, "a refused post completes nothing");
}

/// UD: SEND and SEND with immediate arrive with the GRH area, `src_qp`,
/// imm; RDMA and atomic operations are refused at post time.
pub fn ud_send_and_refusals<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let qa = a.ud_qp(0x1111);
    let qb = b.ud_qp(0x2222);
    let am = a.mem(256, 0, ALL);
    am.write(0, &pattern(256, 4));
    let bm = b.mem(2048, 0, ALL);
    b.recv(&qb, 1, &[bm.sge(0, 1024)]);
    b.recv(&qb, 2, &[bm.sge(1024, 1024)]);
    let av = a.av(&b);
    let to = || a.dest(&av, b.qpn(&qb), 0x2222);
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, 100)]).to(to()),
    );
    ok(&a.wait_send(), 1, WcOpcode::Send, 100);
    a.send(
        &qa,
        SendWr::new(2, SendOp::SendImm(77), &[am.sge(0, 256)]).to(to()),
    );
    ok(&a.wait_send(), 2, WcOpcode::Send, 256);
    let r = b.wait(&b.rcq, 2);
    ok(&r[0], 1, WcOpcode::Recv, 100 + provider::GRH_SIZE as u32);
    ok(&r[1], 2, WcOpcode::Recv, 256 + provider::GRH_SIZE as u32);
    for w in &r {
        assert_eq!((w.src_qp, w.qp_num), (a.qpn(&qa), b.qpn(&qb)));
        if let (Some(lid), false) = (a.ep.lid, w.grh) {
            assert_eq!(w.slid, lid, "slid names the sender");
        }
    }
    assert_eq!((r[0].imm, r[1].imm), (None, Some(77)));
    assert_eq!(bm.read(provider::GRH_SIZE, 100), pattern(100, 4));
    assert_eq!(bm.read(1024 + provider::GRH_SIZE, 256), pattern(256, 4));

    let rk = 0x1234;
    for op in [
        SendOp::Write {
            remote_addr: 0,
            rkey: rk,
        },
        SendOp::WriteImm {
            remote_addr: 0,
            rkey: rk,
            imm: 1,
        },
        SendOp::Read {
            remote_addr: 0,
            rkey: rk,
        },
        SendOp::CompareSwap {
            remote_addr: 0,
            rkey: rk,
            compare: 0,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: 0,
            rkey: rk,
            add: 1,
        },
    ] {
        invalid(a.post_send(&qa, &[SendWr::new(3, op, &[am.sge(0, 8)]).to(to())]));
    }
    // A UD send without a destination is refused too.
    invalid(a.post_send(&qa, &[SendWr::new(3, SendOp::Send, &[])]));
    assert_eq!(a.state(&qa), QpState::Rts);
    a.assert_empty(&a.scq, "refused posts complete nothing");
}

/// Gather and scatter lists: a SEND gathered from three SGEs of two MRs
/// lands across three receive SGEs with other boundaries; a WRITE gathers
/// three; a READ scatters into three.
pub fn multi_sge_gather_and_scatter<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let a1 = a.mem(1024, 0, ALL);
    let a2 = a.mem(1024, 0, ALL);
    let bm = b.mem(4096, 0, ALL);
    let msg = pattern(600, 21);
    a1.write(0, &msg[..100]);
    a2.write(500, &msg[100..350]);
    a1.write(900, &msg[350..450]);
    a2.write(0, &msg[450..]);
    let gather = [
        a1.sge(0, 100),
        a2.sge(500, 250),
        a1.sge(900, 100),
        a2.sge(0, 150),
    ];
    b.recv(
        &qb,
        1,
        &[bm.sge(0, 10), bm.sge(1000, 500), bm.sge(2000, 400)],
    );
    a.send(&qa, SendWr::new(1, SendOp::Send, &gather[..3]));
    ok(&a.wait_send(), 1, WcOpcode::Send, 450);
    ok(&b.wait_recv(), 1, WcOpcode::Recv, 450);
    let mut got = bm.read(0, 10);
    got.extend(bm.read(1000, 440));
    assert_eq!(got, msg[..450]);
    assert_eq!(bm.read(1440, 1), [0], "scatter stops at the message end");

    a.send(
        &qa,
        SendWr::new(
            2,
            SendOp::Write {
                remote_addr: bm.iova + 3000,
                rkey: bm.rkey,
            },
            &gather,
        ),
    );
    ok(&a.wait_send(), 2, WcOpcode::RdmaWrite, 600);
    assert_eq!(bm.read(3000, 600), msg);

    let back = a.mem(1024, 0, ALL);
    a.send(
        &qa,
        SendWr::new(
            3,
            SendOp::Read {
                remote_addr: bm.iova + 3000,
                rkey: bm.rkey,
            },
            &[back.sge(0, 1), back.sge(100, 299), back.sge(500, 300)],
        ),
    );
    ok(&a.wait_send(), 3, WcOpcode::RdmaRead, 600);
    let mut got = back.read(0, 1);
    got.extend(back.read(100, 299));
    got.extend(back.read(500, 300));
    assert_eq!(got, msg);
}

/// An unsignaled send completes silently (a later signaled one shows it
/// was done, in order); `sq_sig_all` signals every send; an unsignaled
/// send that fails still completes.
pub fn signaled_and_unsignaled_sends<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(64, 0, ALL);
    am.write(0, &pattern(64, 1));
    let bm = b.mem(64, 0, ALL);
    let write = |id, off: u64| {
        SendWr::new(
            id,
            SendOp::Write {
                remote_addr: bm.iova + off,
                rkey: bm.rkey,
            },
            &[],
        )
    };
    let sg = [am.sge(0, 8)];
    b.recv(&qb, 1, &[bm.sge(32, 8)]);
    a.send(
        &qa,
        SendWr {
            sg_list: &sg,
            ..write(1, 0)
        }
        .unsignaled(),
    );
    a.send(&qa, SendWr::new(2, SendOp::Send, &sg));
    ok(&a.wait_send(), 2, WcOpcode::Send, 8);
    ok(&b.wait_recv(), 1, WcOpcode::Recv, 8);
    a.assert_empty(&a.scq, "the unsignaled WRITE completes silently");
    assert_eq!(bm.read(0, 8), pattern(8, 1), "and it was done first");

    // sq_sig_all overrides.
    let qa2 = a.qp_with(QpType::Rc, None, true);
    let qb2 = b.qp(QpType::Rc);
    a.connect(&qa2, &b, b.qpn(&qb2), &Conn::default());
    b.connect(&qb2, &a, a.qpn(&qa2), &Conn::default());
    a.send(
        &qa2,
        SendWr {
            sg_list: &sg,
            ..write(3, 16)
        }
        .unsignaled(),
    );
    ok(&a.wait_send(), 3, WcOpcode::RdmaWrite, 8);

    // An unsignaled failure completes.
    let bad = [provider::Sge {
        lkey: am.lkey ^ 0x80,
        ..sg[0]
    }];
    a.send(
        &qa,
        SendWr {
            sg_list: &bad,
            ..write(4, 0)
        }
        .unsignaled(),
    );
    let wc = a.wait_send();
    failed(&wc, 4, WcStatus::LocalProtectionError);
}
