//! Illegal transitions and missing attributes through the soft provider.

mod common;
use al::Error;
use common::*;
use hca::*;

#[test]
fn illegal_transitions_are_invalid_qp_state() {
    let (_f, a, _b) = two();
    let q = qp(&a, QpType::Rc, None);
    for to in [QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe] {
        assert!(
            matches!(q.modify(&QpModify::to(to)), Err(Error::InvalidQpState(_))),
            "{to}"
        );
    }
    q.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(ALL),
    )
    .unwrap();
    assert!(matches!(
        q.modify(&QpModify::to(QpState::Rts).sq_psn(0)),
        Err(Error::InvalidQpState(_))
    ));
    q.modify(&QpModify::to(QpState::Err)).unwrap();
    assert!(matches!(
        q.modify(
            &QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(1)
                .access(ALL)
        ),
        Err(Error::InvalidQpState(_))
    ));
    q.modify(&QpModify::to(QpState::Reset)).unwrap();
    // cur_state must match.
    assert!(matches!(
        q.modify(&QpModify::to(QpState::Err).cur_state(QpState::Rts)),
        Err(Error::InvalidState(_) | Error::InvalidQpState(_) | Error::InvalidParameter(_))
    ));
    // Posting sends before RTS is refused.
    assert!(matches!(
        q.post_send(&[SendWr::new(1, SendOp::Send, &[])]),
        Err(Error::InvalidQpState(_))
    ));
    // Posting receives in RESET is refused.
    assert!(matches!(
        q.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[]
        }]),
        Err(Error::InvalidQpState(_))
    ));
}

#[test]
fn missing_attributes_are_named() {
    let (_f, a, _b) = two();
    let q = qp(&a, QpType::Rc, None);
    let e = q
        .modify(&QpModify::to(QpState::Init).pkey_index(0).port(1))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)));
    assert!(e.to_string().contains("access_flags"), "{e}");
    q.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(ALL),
    )
    .unwrap();
    let e = q
        .modify(
            &QpModify::to(QpState::Rtr)
                .av(AvAttr::lid(1, 2))
                .path_mtu(Mtu::Mtu1024)
                .dest_qpn(5)
                .rq_psn(0),
        )
        .unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("max_dest_rd_atomic") && s.contains("min_rnr_timer"),
        "{s}"
    );
    q.modify(
        &QpModify::to(QpState::Rtr)
            .av(AvAttr::lid(1, 2))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(5)
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )
    .unwrap();
    let e = q.modify(&QpModify::to(QpState::Rts).sq_psn(0)).unwrap_err();
    let s = e.to_string();
    for name in ["timeout", "retry_cnt", "rnr_retry", "max_rd_atomic"] {
        assert!(s.contains(name), "{s} lacks {name}");
    }
    // An attribute the transition does not take.
    let e = q
        .modify(
            &QpModify::to(QpState::Rts)
                .sq_psn(0)
                .timeout(1)
                .retry_cnt(1)
                .rnr_retry(1)
                .max_rd_atomic(1)
                .dest_qpn(9),
        )
        .unwrap_err();
    assert!(e.to_string().contains("dest_qpn"), "{e}");
    // Out-of-range values.
    assert!(matches!(
        q.modify(
            &QpModify::to(QpState::Rts)
                .sq_psn(0)
                .timeout(1)
                .retry_cnt(8)
                .rnr_retry(1)
                .max_rd_atomic(1)
        ),
        Err(Error::InvalidParameter(_))
    ));
    assert_eq!(
        q.query().state,
        QpState::Rtr,
        "failed modifies change nothing"
    );
}

#[test]
fn ud_needs_qkey_and_bad_port_or_pkey_index() {
    let (_f, a, _b) = two();
    let q = qp(&a, QpType::Ud, None);
    let e = q
        .modify(&QpModify::to(QpState::Init).pkey_index(0).port(1))
        .unwrap_err();
    assert!(e.to_string().contains("qkey"));
    assert!(matches!(
        q.modify(&QpModify::to(QpState::Init).pkey_index(0).port(2).qkey(1)),
        Err(Error::InvalidParameter(_))
    ));
    assert!(matches!(
        q.modify(&QpModify::to(QpState::Init).pkey_index(5).port(1).qkey(1)),
        Err(Error::InvalidParameter(_))
    ));
    // UD does not take access flags.
    assert!(matches!(
        q.modify(
            &QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(1)
                .qkey(1)
                .access(ALL)
        ),
        Err(Error::InvalidParameter(_))
    ));
    q.modify(&QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(7))
        .unwrap();
    q.modify(&QpModify::to(QpState::Rtr)).unwrap();
    q.modify(&QpModify::to(QpState::Rts).sq_psn(1)).unwrap();
    let at = q.query();
    assert_eq!(
        (at.state, at.qkey, at.port, at.sq_psn),
        (QpState::Rts, 7, 1, 1)
    );
    // SQD -> SQD -> RTS.
    q.modify(&QpModify::to(QpState::Sqd)).unwrap();
    q.modify(&QpModify::to(QpState::Sqd).qkey(8)).unwrap();
    q.modify(&QpModify::to(QpState::Rts)).unwrap();
    assert_eq!(q.query().qkey, 8);
}
