//! Error completions: bad keys, bounds, access rights, lengths, no
//! responder. Each ends with the IBV-style status, the requester's RC QP
//! in ERR, and no byte moved anywhere.

use provider::{
    Access, Device, QpModify, QpState, QpType, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::fixture::Fixture;
use crate::harness::*;

const FILL_A: u8 = 0xaa;
const FILL_B: u8 = 0xbb;
/// The target MR: 1024 bytes at offset 1024 of a 4096-byte buffer. Its
/// iova sits at the same offset in its 4 KiB page as the bytes do (a
/// buffer starts on a page): a real device maps an MR page by page and
/// refuses any other iova.
const IOVA: u64 = 0x10000 + 1024;

struct Setup<'f, F: Fixture> {
    a: Node<'f, F>,
    b: Node<'f, F>,
    qa: Qp<F>,
    qb: Qp<F>,
    am: Mem<F>,
    bm: Mem<F>,
}

fn setup<F: Fixture>(f: &F, b_access: Access) -> Setup<'_, F> {
    let (a, b) = two(f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(4096, FILL_A, ALL);
    let bm = b.mem_range(4096, 1024, 1024, IOVA, FILL_B, b_access);
    Setup {
        a,
        b,
        qa,
        qb,
        am,
        bm,
    }
}

impl<F: Fixture> Setup<'_, F> {
    fn post(&self, op: SendOp, sg: &[Sge]) {
        self.a.send(&self.qa, SendWr::new(1, op, sg));
    }
    fn write(&self, addr: u64, sg: &[Sge]) {
        self.post(
            SendOp::Write {
                remote_addr: addr,
                rkey: self.bm.rkey,
            },
            sg,
        )
    }
    #[track_caller]
    fn expect(&self, status: WcStatus) {
        failed(&self.a.wait_send(), 1, status);
        assert_eq!(
            self.a.state(&self.qa),
            QpState::Err,
            "the requester goes to ERR"
        );
    }
    #[track_caller]
    fn untouched(&self) {
        assert!(self.am.all(FILL_A), "the requester's buffer was modified");
        assert!(self.bm.all(FILL_B), "the responder's buffer was modified");
    }
}

/// A wrong lkey is `LocalProtectionError`; nothing moves.
pub fn bad_lkey_is_local_protection_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    let bad = Sge {
        lkey: s.am.lkey ^ 0x100,
        ..s.am.sge(0, 16)
    };
    s.write(IOVA, &[bad]);
    s.expect(WcStatus::LocalProtectionError);
    s.untouched();
}

/// The lkey of a deregistered MR misses.
pub fn stale_lkey_is_local_protection_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    let m = s.a.mem(64, 0, ALL);
    let sge = m.sge(0, 8);
    drop(m);
    s.post(SendOp::Send, &[sge]);
    s.expect(WcStatus::LocalProtectionError);
}

/// The lkey of an MR of another PD is refused.
pub fn lkey_of_another_pd_is_local_protection_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    let pd2 = s.a.dev.alloc_pd().unwrap();
    let buf = provider::RegisteredBuffer::new(64);
    let mr = s.a.dev.register_mr(&pd2, &buf, 0, 64, 0, ALL).unwrap();
    let (lkey, _) = s.a.dev.mr_keys(&mr);
    s.post(
        SendOp::Send,
        &[Sge {
            addr: 0,
            length: 8,
            lkey,
        }],
    );
    s.expect(WcStatus::LocalProtectionError);
}

/// A local SGE reaching past its MR is `LocalProtectionError`.
pub fn local_out_of_bounds_is_local_protection_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    s.write(IOVA, &[s.am.sge(4090, 16)]);
    s.expect(WcStatus::LocalProtectionError);
    s.untouched();
}

/// A READ into an MR without LOCAL_WRITE is `LocalProtectionError`.
pub fn read_into_mr_without_local_write_is_local_protection_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    let ro = s.a.mem(64, 1, Access::NONE);
    s.post(
        SendOp::Read {
            remote_addr: IOVA,
            rkey: s.bm.rkey,
        },
        &[ro.sge(0, 64)],
    );
    s.expect(WcStatus::LocalProtectionError);
    assert!(ro.all(1));
    s.untouched();
}

/// A wrong rkey is `RemoteAccessError`; the responder QP goes to ERR too.
pub fn bad_rkey_is_remote_access_error<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    s.post(
        SendOp::Write {
            remote_addr: IOVA,
            rkey: s.bm.rkey ^ 0x100,
        },
        &[s.am.sge(0, 16)],
    );
    s.expect(WcStatus::RemoteAccessError);
    s.untouched();
    assert_eq!(s.b.state(&s.qb), QpState::Err, "the responder goes to ERR");
}

/// A remote range straddling the MR's end or start, or wrapping the
/// address space, is `RemoteAccessError`, with no byte written.
pub fn remote_out_of_bounds_is_remote_access_error<F: Fixture>(f: &F) {
    for (addr, len) in [(IOVA + 1024 - 15, 16u32), (IOVA - 1, 4), (u64::MAX - 2, 8)] {
        let s = setup(f, ALL);
        s.write(addr, &[s.am.sge(0, len)]);
        s.expect(WcStatus::RemoteAccessError);
        s.untouched();
    }
    let s = setup(f, ALL);
    s.post(
        SendOp::Read {
            remote_addr: IOVA + 1000,
            rkey: s.bm.rkey,
        },
        &[s.am.sge(0, 25)],
    );
    s.expect(WcStatus::RemoteAccessError);
    s.untouched();
}

/// A WRITE ending exactly at the MR's end succeeds and writes exactly its
/// bytes (the iova and offset of the MR are honoured).
pub fn remote_write_up_to_the_end_is_exact<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    s.am.write(0, &pattern(16, 3));
    s.write(IOVA + 1024 - 16, &[s.am.sge(0, 16)]);
    ok(&s.a.wait_send(), 1, WcOpcode::RdmaWrite, 16);
    let v = s.bm.buf.to_vec();
    assert_eq!(&v[2048 - 16..2048], &pattern(16, 3)[..]);
    assert!(v[..2048 - 16]
        .iter()
        .chain(&v[2048..])
        .all(|&x| x == FILL_B));
}

/// An MR without REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC refuses that
/// operation with `RemoteAccessError`.
pub fn missing_mr_remote_rights_are_remote_access_error<F: Fixture>(f: &F) {
    let s = setup(f, Access::LOCAL_WRITE | Access::REMOTE_READ);
    s.write(IOVA, &[s.am.sge(0, 16)]);
    s.expect(WcStatus::RemoteAccessError);
    s.untouched();

    let s = setup(f, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.post(
        SendOp::Read {
            remote_addr: IOVA,
            rkey: s.bm.rkey,
        },
        &[s.am.sge(0, 16)],
    );
    s.expect(WcStatus::RemoteAccessError);
    s.untouched();

    let s = setup(f, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.post(
        SendOp::FetchAdd {
            remote_addr: IOVA,
            rkey: s.bm.rkey,
            add: 1,
        },
        &[s.am.sge(0, 8)],
    );
    s.expect(WcStatus::RemoteAccessError);
    s.untouched();
}

/// A responder QP without the remote access flag for the operation
/// refuses it with `RemoteInvalidRequest`; so does a misaligned atomic.
pub fn qp_access_and_misaligned_atomic_are_remote_invalid_request<F: Fixture>(f: &F) {
    for (b_qp_access, op) in [
        (Access::LOCAL_WRITE, 0),
        (Access::LOCAL_WRITE | Access::REMOTE_WRITE, 1),
        (Access::LOCAL_WRITE | Access::REMOTE_READ, 2),
    ] {
        let (a, b) = two(f);
        let ca = Conn::default();
        let cb = Conn {
            access: b_qp_access,
            ..ca
        };
        let (qa, _qb) = pair_with(&a, &b, QpType::Rc, &ca, &cb);
        let am = a.mem(64, FILL_A, ALL);
        let bm = b.mem(64, FILL_B, ALL);
        let (remote_addr, rkey) = (bm.iova, bm.rkey);
        let op = match op {
            0 => SendOp::Write { remote_addr, rkey },
            1 => SendOp::Read { remote_addr, rkey },
            _ => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
        };
        a.send(&qa, SendWr::new(1, op, &[am.sge(0, 8)]));
        failed(&a.wait_send(), 1, WcStatus::RemoteInvalidRequest);
        assert_eq!(a.state(&qa), QpState::Err);
        assert!(am.all(FILL_A) && bm.all(FILL_B));
    }
    let s = setup(f, ALL);
    s.post(
        SendOp::CompareSwap {
            remote_addr: IOVA + 4,
            rkey: s.bm.rkey,
            compare: 0,
            swap: 1,
        },
        &[s.am.sge(0, 8)],
    );
    s.expect(WcStatus::RemoteInvalidRequest);
    s.untouched();
}

/// `max_rd_atomic` 0 and `max_dest_rd_atomic` 0 mean none (IBTA), not
/// one. A requester with `max_rd_atomic` 0 (where the fixture says the
/// provider refuses it at post): READ and atomics are `InvalidParameter`
/// at post, nothing completes, the QP stays in RTS and a SEND after them
/// is delivered. A responder with `max_dest_rd_atomic` 0 (every provider):
/// a READ or an atomic completes `RemoteInvalidRequest`, the requester
/// goes to ERR, no byte moves. Atomics are left out on a device that
/// reports no atomic support.
pub fn rd_atomic_depths_of_0_are_none<F: Fixture>(f: &F) {
    let atomics = {
        let (a, b) = two(f);
        a.dev.query().atomic_cap != provider::AtomicCap::None
            && b.dev.query().atomic_cap != provider::AtomicCap::None
    };
    // The READ, then (with atomics) compare-and-swap and fetch-and-add,
    // at `remote_addr` under `rkey`.
    let kinds = if atomics { 3 } else { 1 };
    let op = |kind: usize, rkey: u32, remote_addr: u64| match kind {
        0 => SendOp::Read { remote_addr, rkey },
        1 => SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare: 0,
            swap: 1,
        },
        _ => SendOp::FetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
    };
    if f.refuses_rd_atomic_without_max_rd_atomic() {
        let (a, b) = two(f);
        let ca = Conn {
            max_rd_atomic: 0,
            ..Conn::default()
        };
        let (qa, qb) = pair_with(&a, &b, QpType::Rc, &ca, &Conn::default());
        let am = a.mem(64, FILL_A, ALL);
        let bm = b.mem(64, FILL_B, ALL);
        let sge = [am.sge(0, 8)];
        for kind in 0..kinds {
            let wr = SendWr::new(1, op(kind, bm.rkey, bm.iova), &sge);
            invalid(a.post_send(&qa, &[wr]));
        }
        // In SQD too, where a send is held until RTS: refused at post,
        // not held and flushed later.
        a.modify(&qa, QpModify::to(QpState::Sqd)).unwrap();
        for kind in 0..kinds {
            let wr = SendWr::new(1, op(kind, bm.rkey, bm.iova), &sge);
            invalid(a.post_send(&qa, &[wr]));
        }
        a.modify(&qa, QpModify::to(QpState::Rts)).unwrap();
        assert_eq!(a.state(&qa), QpState::Rts, "refusals leave the QP");
        a.assert_empty(&a.scq, "a refused request completes nothing");
        b.recv(&qb, 5, &[bm.sge(0, 8)]);
        a.send(&qa, SendWr::new(2, SendOp::Send, &[am.sge(0, 8)]));
        ok(&a.wait_send(), 2, WcOpcode::Send, 8);
        ok(&b.wait_recv(), 5, WcOpcode::Recv, 8);
        assert_eq!(bm.read(0, 8), am.read(0, 8), "the SEND landed");
    }
    for kind in 0..kinds {
        let (a, b) = two(f);
        let cb = Conn {
            max_dest_rd_atomic: 0,
            ..Conn::default()
        };
        let (qa, _qb) = pair_with(&a, &b, QpType::Rc, &Conn::default(), &cb);
        let am = a.mem(64, FILL_A, ALL);
        let bm = b.mem(64, FILL_B, ALL);
        let op = op(kind, bm.rkey, bm.iova);
        a.send(&qa, SendWr::new(1, op, &[am.sge(0, 8)]));
        failed(&a.wait_send(), 1, WcStatus::RemoteInvalidRequest);
        assert_eq!(a.state(&qa), QpState::Err, "{op:?}");
        assert!(am.all(FILL_A) && bm.all(FILL_B), "{op:?}: no byte moved");
    }
}

/// A SEND longer than the receive buffer: the requester gets
/// `RemoteInvalidRequest`, the receive `LocalLengthError`. A receive whose
/// SGE names no MR: the requester gets `RemoteOpError`, the receive
/// `LocalProtectionError`. No byte lands either way.
pub fn receive_errors_complete_both_sides<F: Fixture>(f: &F) {
    let s = setup(f, ALL);
    s.b.recv(&s.qb, 5, &[s.bm.sge(0, 8)]);
    s.post(SendOp::Send, &[s.am.sge(0, 9)]);
    s.expect(WcStatus::RemoteInvalidRequest);
    failed(&s.b.wait_recv(), 5, WcStatus::LocalLengthError);
    s.untouched();

    let s = setup(f, ALL);
    let bad = Sge {
        lkey: s.bm.lkey ^ 0x100,
        ..s.bm.sge(0, 64)
    };
    s.b.recv(&s.qb, 6, &[bad]);
    s.post(SendOp::Send, &[s.am.sge(0, 9)]);
    s.expect(WcStatus::RemoteOpError);
    failed(&s.b.wait_recv(), 6, WcStatus::LocalProtectionError);
    s.untouched();
}

/// An RC QP connected to a QP number nobody has ends its send with
/// `RetryExceeded` (after its retries; the timeout is short) and goes to
/// ERR.
pub fn rc_without_responder_is_retry_exceeded<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let qa = a.qp(QpType::Rc);
    let absent = b.qp(QpType::Rc);
    let dqpn = b.qpn(&absent);
    drop(absent);
    a.connect(
        &qa,
        &b,
        dqpn,
        &Conn {
            retry_cnt: 1,
            timeout: 8,
            ..Conn::default()
        },
    );
    let am = a.mem(64, 0, ALL);
    a.send(&qa, SendWr::new(9, SendOp::Send, &[am.sge(0, 8)]));
    failed(&a.wait_send(), 9, WcStatus::RetryExceeded);
    assert_eq!(a.state(&qa), QpState::Err);
}
