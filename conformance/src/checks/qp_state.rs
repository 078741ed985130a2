//! The QP state machine (IBTA 10.3, 11.2.4.2) as each provider implements
//! it: every transition from every reachable state, the attributes each
//! one requires and refuses, and the bounds on attribute values.

use al::Error;
use provider::{Access, Device, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus};

use crate::fixture::Fixture;
use crate::harness::*;

const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

/// The IBTA table, written out here rather than borrowed from any
/// provider: any state may go to RESET or ERR; otherwise RESET->INIT,
/// INIT->INIT, INIT->RTR, RTR->RTS, RTS->RTS, RTS->SQD, SQD->SQD,
/// SQD->RTS, and SQE->RTS for the unreliable types only.
pub fn legal(ty: QpType, from: QpState, to: QpState) -> bool {
    use QpState::*;
    matches!(to, Reset | Err)
        || matches!(
            (from, to),
            (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Sqd)
                | (Sqd, Rts)
        )
        || (from == Sqe && to == Rts && ty != QpType::Rc)
}

fn init_req<F: Fixture>(n: &Node<'_, F>, ty: QpType) -> QpModify {
    let m = QpModify::to(QpState::Init).pkey_index(0).port(n.ep.port);
    if ty == QpType::Ud {
        m.qkey(0x1234)
    } else {
        m.access(ALL)
    }
}

/// Bring a fresh QP of `ty` on `a` to `state` by legal means (SQE: by a
/// failing send). `None` when the type cannot reach the state.
fn reach<F: Fixture>(
    a: &Node<'_, F>,
    b: &Node<'_, F>,
    ty: QpType,
    state: QpState,
) -> Option<Qp<F>> {
    let qp = a.qp(ty);
    let peer = b.qp(ty);
    let c = Conn::default();
    let steps: &[QpState] = match state {
        QpState::Reset => &[],
        QpState::Init => &[QpState::Init],
        QpState::Rtr => &[QpState::Init, QpState::Rtr],
        QpState::Rts | QpState::Sqe => &[QpState::Init, QpState::Rtr, QpState::Rts],
        QpState::Sqd => &[QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd],
        QpState::Err => &[QpState::Err],
    };
    if state == QpState::Sqe && ty == QpType::Rc {
        return None;
    }
    for &s in steps {
        let m = match s {
            QpState::Init => init_req(a, ty),
            QpState::Rtr if ty == QpType::Ud => QpModify::to(QpState::Rtr),
            QpState::Rtr => a.rtr(&qp, b, b.qpn(&peer), &c),
            QpState::Rts if ty == QpType::Ud => QpModify::to(QpState::Rts).sq_psn(0),
            QpState::Rts => a.rts(&qp, &c),
            other => QpModify::to(other),
        };
        a.modify(&qp, m)
            .unwrap_or_else(|e| panic!("{ty} QP to {s} on the way to {state}: {e}"));
    }
    if state == QpState::Sqe {
        // A send that fails locally moves an unreliable QP to SQE: a bad
        // lkey (UC), a message longer than the path MTU (UD).
        let big = a.mem(8192, 0, ALL);
        let bad = [Sge {
            lkey: big.lkey ^ 0x80,
            ..big.sge(0, 8)
        }];
        let long = [big.sge(0, 8192)];
        let av = a.av(b);
        let wr = if ty == QpType::Ud {
            SendWr::new(1, SendOp::Send, &long).to(a.dest(&av, b.qpn(&peer), 0x1234))
        } else {
            SendWr::new(1, SendOp::Send, &bad)
        };
        a.send(&qp, wr);
        let wc = a.wait_send();
        assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(
            a.state(&qp),
            QpState::Sqe,
            "{ty}: a failed send goes to SQE"
        );
    }
    assert_eq!(a.state(&qp), state);
    Some(qp)
}

/// The request the check makes for `from -> to`: the attributes the
/// natural transition into `to` takes, so that an illegal one can fail
/// only for being illegal.
fn request<F: Fixture>(
    a: &Node<'_, F>,
    b: &Node<'_, F>,
    qp: &Qp<F>,
    ty: QpType,
    from: QpState,
    to: QpState,
) -> QpModify {
    let c = Conn::default();
    match to {
        QpState::Init => init_req(a, ty),
        QpState::Rtr if ty == QpType::Ud => QpModify::to(QpState::Rtr),
        QpState::Rtr => a.rtr(qp, b, 0x100, &c),
        QpState::Rts if matches!(from, QpState::Rts | QpState::Sqd | QpState::Sqe) => {
            QpModify::to(QpState::Rts)
        }
        QpState::Rts if ty == QpType::Ud => QpModify::to(QpState::Rts).sq_psn(0),
        QpState::Rts => a.rts(qp, &c),
        other => QpModify::to(other),
    }
}

fn state_machine<F: Fixture>(f: &F, ty: QpType) {
    let (a, b) = two(f);
    let mut tried = 0;
    for from in STATES {
        for to in STATES {
            let Some(qp) = reach(&a, &b, ty, from) else {
                continue;
            };
            let r = a.modify(&qp, request(&a, &b, &qp, ty, from, to));
            if legal(ty, from, to) {
                r.unwrap_or_else(|e| panic!("{ty} {from}->{to} is legal: {e}"));
                assert_eq!(a.state(&qp), to, "{ty} {from}->{to}");
            } else {
                assert!(
                    matches!(r, Err(Error::InvalidQpState(_))),
                    "{ty} {from}->{to} is illegal: expected InvalidQpState, got {r:?}"
                );
                assert_eq!(a.state(&qp), from, "{ty} {from}->{to} refused: state kept");
            }
            tried += 1;
        }
    }
    assert!(tried >= 42);
}

/// RC: every transition from every state, legal ones succeed and land,
/// illegal ones are `InvalidQpState` and change nothing.
pub fn qp_state_machine_rc<F: Fixture>(f: &F) {
    state_machine(f, QpType::Rc)
}

/// UC: as RC, plus SQE (reached by a failed send) and SQE -> RTS.
pub fn qp_state_machine_uc<F: Fixture>(f: &F) {
    state_machine(f, QpType::Uc)
}

/// UD: as UC (SQE reached by a send longer than the MTU).
pub fn qp_state_machine_ud<F: Fixture>(f: &F) {
    state_machine(f, QpType::Ud)
}

/// A `cur_state` that does not match is refused; sends may not be posted
/// before RTS, receives not in RESET; receives may be posted in INIT.
pub fn qp_cur_state_and_posting_states<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let q = a.qp(QpType::Rc);
    let r = a.modify(&q, QpModify::to(QpState::Err).cur_state(QpState::Rts));
    assert!(
        matches!(
            r,
            Err(Error::InvalidState(_) | Error::InvalidQpState(_) | Error::InvalidParameter(_))
        ),
        "{r:?}"
    );
    assert_eq!(a.state(&q), QpState::Reset);
    let recv = |q: &Qp<F>| {
        a.dev.post_recv(
            q,
            &[RecvWr {
                wr_id: 1,
                sg_list: &[],
            }],
        )
    };
    bad_state(a.post_send(&q, &[SendWr::new(1, SendOp::Send, &[])]));
    bad_state(recv(&q));
    a.modify(&q, init_req(&a, QpType::Rc)).unwrap();
    bad_state(a.post_send(&q, &[SendWr::new(1, SendOp::Send, &[])]));
    recv(&q).unwrap();
    let peer = b.qp(QpType::Rc);
    a.modify(&q, a.rtr(&q, &b, b.qpn(&peer), &Conn::default()))
        .unwrap();
    bad_state(a.post_send(&q, &[SendWr::new(1, SendOp::Send, &[])]));
    a.modify(
        &q,
        QpModify::to(QpState::Rts)
            .cur_state(QpState::Rtr)
            .sq_psn(0)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    )
    .unwrap();
}

/// A modify missing a required attribute, or giving one the transition
/// does not take, is `InvalidParameter` naming the attribute; an
/// out-of-range value is refused; a refused modify changes nothing.
pub fn qp_missing_and_unexpected_attributes_are_named<F: Fixture>(f: &F) {
    let (a, b) = two(f);
    let q = a.qp(QpType::Rc);
    let e = a
        .modify(
            &q,
            QpModify::to(QpState::Init).pkey_index(0).port(a.ep.port),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    assert!(e.to_string().contains("access_flags"), "{e}");
    a.init(&q, ALL).unwrap();
    let c = Conn::default();
    let mut m = a.rtr(&q, &b, 5, &c);
    m.max_dest_rd_atomic = None;
    m.min_rnr_timer = None;
    let e = a.modify(&q, m).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("max_dest_rd_atomic") && s.contains("min_rnr_timer"),
        "{s}"
    );
    a.modify(&q, a.rtr(&q, &b, 5, &c)).unwrap();
    let e = a
        .modify(&q, QpModify::to(QpState::Rts).sq_psn(0))
        .unwrap_err();
    let s = e.to_string();
    for name in ["timeout", "retry_cnt", "rnr_retry", "max_rd_atomic"] {
        assert!(s.contains(name), "{s} lacks {name}");
    }
    let e = a.modify(&q, a.rts(&q, &c).dest_qpn(9)).unwrap_err();
    assert!(e.to_string().contains("dest_qpn"), "{e}");
    invalid(a.modify(&q, a.rts(&q, &c).retry_cnt(8)));
    invalid(a.modify(&q, a.rts(&q, &c).rnr_retry(8)));
    assert_eq!(a.state(&q), QpState::Rtr, "failed modifies change nothing");
}

/// UD: RESET->INIT needs a Q_Key and takes no access flags; the port must
/// exist and the P_Key index be in the table; SQD->SQD may change the
/// Q_Key; the values given are what `query_qp` reports.
pub fn ud_qp_attributes<F: Fixture>(f: &F) {
    let (a, _b) = two(f);
    let q = a.qp(QpType::Ud);
    let port = a.ep.port;
    let ports = a.dev.query().num_ports;
    let pkeys = a.dev.query_port(port).unwrap().pkey_table.len() as u16;
    let e = a
        .modify(&q, QpModify::to(QpState::Init).pkey_index(0).port(port))
        .unwrap_err();
    assert!(e.to_string().contains("qkey"), "{e}");
    invalid(
        a.modify(
            &q,
            QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(ports + 1)
                .qkey(1),
        ),
    );
    invalid(a.modify(
        &q,
        QpModify::to(QpState::Init).pkey_index(0).port(0).qkey(1),
    ));
    invalid(
        a.modify(
            &q,
            QpModify::to(QpState::Init)
                .pkey_index(pkeys)
                .port(port)
                .qkey(1),
        ),
    );
    invalid(
        a.modify(
            &q,
            QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(port)
                .qkey(1)
                .access(ALL),
        ),
    );
    assert_eq!(a.state(&q), QpState::Reset);
    a.modify(
        &q,
        QpModify::to(QpState::Init).pkey_index(0).port(port).qkey(7),
    )
    .unwrap();
    a.modify(&q, QpModify::to(QpState::Rtr)).unwrap();
    a.modify(&q, QpModify::to(QpState::Rts).sq_psn(1)).unwrap();
    let at = a.dev.query_qp(&q).unwrap();
    assert_eq!(
        (at.state, at.qp_type, at.qkey, at.port, at.sq_psn, at.qpn),
        (QpState::Rts, QpType::Ud, 7, port, 1, a.qpn(&q))
    );
    a.modify(&q, QpModify::to(QpState::Sqd)).unwrap();
    a.modify(&q, QpModify::to(QpState::Sqd).qkey(8)).unwrap();
    a.modify(&q, QpModify::to(QpState::Rts)).unwrap();
    assert_eq!(a.dev.query_qp(&q).unwrap().qkey, 8);
}

/// PSNs are 24 bits: a larger `rq_psn` or `sq_psn` is refused, never
/// masked; the largest fits and is reported back with the other values.
pub fn qp_psns_are_24_bits<F: Fixture>(f: &F) {
    const PSN_MAX: u32 = 0xff_ffff;
    let (a, b) = two(f);
    let q = a.qp(QpType::Rc);
    let peer = b.qp(QpType::Rc);
    a.init(&q, Access::REMOTE_WRITE).unwrap();
    let c = |rq_psn, sq_psn| Conn {
        rq_psn,
        sq_psn,
        ..Conn::default()
    };
    invalid(a.modify(&q, a.rtr(&q, &b, b.qpn(&peer), &c(PSN_MAX + 1, 0))));
    invalid(a.modify(&q, a.rtr(&q, &b, b.qpn(&peer), &c(u32::MAX, 0))));
    assert_eq!(
        a.state(&q),
        QpState::Init,
        "a refused modify changes nothing"
    );
    a.modify(&q, a.rtr(&q, &b, b.qpn(&peer), &c(PSN_MAX, 0)))
        .unwrap();
    invalid(a.modify(&q, a.rts(&q, &c(0, 1 << 24))));
    a.modify(&q, a.rts(&q, &c(0, PSN_MAX))).unwrap();
    let at = a.dev.query_qp(&q).unwrap();
    assert_eq!(
        (at.rq_psn, at.sq_psn, at.dest_qpn, at.access, at.port),
        (
            PSN_MAX,
            PSN_MAX,
            b.qpn(&peer),
            Access::REMOTE_WRITE,
            a.ep.port
        )
    );
    assert_eq!((at.retry_cnt, at.rnr_retry, at.timeout), (7, 7, 14));
    // Undefined access bits are refused on a QP too.
    let q2 = a.qp(QpType::Rc);
    for bits in [0x10, 0x8000_0001, u32::MAX] {
        invalid(a.init(&q2, Access::from_bits_retain(bits)));
    }
    assert_eq!(a.state(&q2), QpState::Reset);
}
