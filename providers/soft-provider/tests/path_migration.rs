//! Alternate paths and migration in the soft provider: a loaded alternate
//! path is stored and armed, and a migration makes it the primary path, so
//! traffic keeps flowing when the old path's ports go down.

mod common;
use common::*;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

/// Two HCAs with two ports each (LIDs 1, 3 and 2, 4), and an RC pair
/// connected over port 1.
fn two_port_pair() -> (Fabric, SoftHca, SoftHca, Node, Node, SoftQp, SoftQp) {
    let f = Fabric::new();
    let ha = f.add_hca(HcaConfig::new(0xa0, &[1, 3])).unwrap();
    let hb = f.add_hca(HcaConfig::new(0xb0, &[2, 4])).unwrap();
    let node_of = |hca: &SoftHca, lid| {
        let pd = hca.alloc_pd().unwrap();
        let cq = || {
            hca.create_cq(CqInit {
                capacity: 64,
                ..CqInit::default()
            })
            .unwrap()
        };
        Node {
            hca: hca.clone(),
            pd,
            scq: cq(),
            rcq: cq(),
            lid,
        }
    };
    let (a, b) = (node_of(&ha, 1), node_of(&hb, 2));
    let (qa, qb) = rc_pair(&a, &b, ALL);
    (f, ha, hb, a, b, qa, qb)
}

fn send_and_check(f: &Fabric, from: (&Node, &SoftQp), to: (&Node, &SoftQp), seed: u8) -> Wc {
    let src = RegisteredBuffer::from_vec(pattern(64, seed));
    let smr = from.0.pd.register(&src, ALL).unwrap();
    let dst = RegisteredBuffer::new(64);
    let dmr = to.0.pd.register(&dst, ALL).unwrap();
    to.1.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[dmr.sge(0, 64)],
    }])
    .unwrap();
    from.1
        .post_send(&[SendWr::new(1, SendOp::Send, &[smr.sge(0, 64)])])
        .unwrap();
    f.settle(10);
    let wc = poll1(&from.0.scq);
    if wc.status == WcStatus::Success {
        assert_eq!(poll1(&to.0.rcq).status, WcStatus::Success);
        assert_eq!(dst.to_vec(), pattern(64, seed));
    }
    wc
}

#[test]
fn a_migrated_pair_runs_on_the_alternate_path() {
    let (f, ha, hb, a, b, qa, qb) = two_port_pair();
    assert_eq!(qa.query().path_mig_state, MigState::Migrated);
    // Load port 2 as the alternate path on both sides and arm it.
    for (qp, dlid) in [(&qa, 4), (&qb, 3)] {
        qp.modify(
            &QpModify::to(QpState::Rts)
                .alt_av(AvAttr::lid(2, dlid))
                .path_mig_state(MigState::Rearm),
        )
        .unwrap();
        let attr = qp.query();
        assert_eq!(attr.alt_av, Some(AvAttr::lid(2, dlid)), "stored");
        assert_eq!(attr.path_mig_state, MigState::Armed, "armed at once");
        assert_eq!(attr.port, 1, "still on the primary path");
    }
    assert_eq!(
        send_and_check(&f, (&a, &qa), (&b, &qb), 1).status,
        WcStatus::Success
    );
    // Migrate both; then the primary path's ports go down.
    for (qp, dlid) in [(&qa, 4), (&qb, 3)] {
        qp.modify(&QpModify::to(QpState::Rts).path_mig_state(MigState::Migrated))
            .unwrap();
        let attr = qp.query();
        assert_eq!((attr.port, attr.av), (2, Some(AvAttr::lid(2, dlid))));
        assert_eq!(
            (attr.alt_av, attr.path_mig_state),
            (None, MigState::Migrated)
        );
    }
    ha.set_port_state(1, PortState::Down).unwrap();
    hb.set_port_state(1, PortState::Down).unwrap();
    for seed in 2..4 {
        assert_eq!(
            send_and_check(&f, (&a, &qa), (&b, &qb), seed).status,
            WcStatus::Success
        );
        assert_eq!(
            send_and_check(&f, (&b, &qb), (&a, &qa), seed + 10).status,
            WcStatus::Success
        );
    }
}

#[test]
fn without_migration_a_dead_primary_path_fails_the_send() {
    // The control for the test above: the same pair, alternate loaded but
    // not migrated, loses its SENDs when port 1 goes down.
    let (f, ha, _hb, a, b, qa, qb) = two_port_pair();
    qa.modify(
        &QpModify::to(QpState::Rts)
            .alt_av(AvAttr::lid(2, 4))
            .path_mig_state(MigState::Rearm),
    )
    .unwrap();
    ha.set_port_state(1, PortState::Down).unwrap();
    assert_eq!(
        send_and_check(&f, (&a, &qa), (&b, &qb), 5).status,
        WcStatus::RetryExceeded
    );
}

#[test]
fn migrating_without_an_armed_path_changes_nothing() {
    let (_f, _ha, _hb, _a, _b, qa, _qb) = two_port_pair();
    qa.modify(&QpModify::to(QpState::Rts).path_mig_state(MigState::Migrated))
        .unwrap();
    let attr = qa.query();
    assert_eq!((attr.port, attr.av), (1, Some(AvAttr::lid(1, 2))));
    // REARM with no alternate path loaded stays REARM (nothing to arm).
    qa.modify(&QpModify::to(QpState::Rts).path_mig_state(MigState::Rearm))
        .unwrap();
    assert_eq!(qa.query().path_mig_state, MigState::Rearm);
}
