//! The object counts a soft HCA advertises are enforced (issue 12,
//! defect 5): one object beyond a `max_*` count fails with
//! `InsufficientResources` naming the limit, and destroying one gives its
//! place back.

use al::Error;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

const SMALL: HcaLimits = HcaLimits {
    max_qp: 3,
    max_qp_wr: 16,
    max_sge: 2,
    max_cq: 3,
    max_cqe: 64,
    max_mr: 3,
    max_pd: 3,
    max_srq: 3,
    max_srq_wr: 16,
    max_av: 3,
};

fn small_hca(f: &Fabric, guid: u64, lid: u16) -> SoftHca {
    f.add_hca(HcaConfig {
        limits: SMALL,
        ..HcaConfig::new(guid, &[lid])
    })
    .unwrap()
}

fn cq(h: &SoftHca) -> Result<SoftCq, Error> {
    h.create_cq(CqInit {
        capacity: 8,
        ..CqInit::default()
    })
}

/// Fill `make` up to `max` (counting `already` objects made before), check
/// the next one fails naming `limit`, drop one, and check one more fits.
fn fill_refuse_free<T: std::fmt::Debug>(
    max: u32,
    already: u32,
    limit: &str,
    mut make: impl FnMut() -> Result<T, Error>,
) -> Vec<T> {
    let mut live: Vec<T> = (already..max).map(|_| make().unwrap()).collect();
    match make() {
        Err(Error::InsufficientResources(m)) => {
            assert!(m.contains(limit), "{m} does not name {limit}")
        }
        other => panic!("{limit}: expected InsufficientResources, got {other:?}"),
    }
    live.pop();
    live.push(make().unwrap_or_else(|e| panic!("{limit}: a freed place is reused: {e}")));
    live
}

#[test]
fn device_attr_reports_the_configured_limits() {
    let f = Fabric::new();
    let a = small_hca(&f, 0xa000, 1).query();
    assert_eq!(
        (a.max_qp, a.max_cq, a.max_mr, a.max_pd, a.max_srq, a.max_av),
        (3, 3, 3, 3, 3, 3)
    );
    assert_eq!(
        (a.max_qp_wr, a.max_sge, a.max_cqe, a.max_srq_wr),
        (16, 2, 64, 16)
    );
}

#[test]
fn max_pd_is_enforced() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pds = fill_refuse_free(SMALL.max_pd, 0, "max_pd", || h.alloc_pd());
    // Through the provider interface, dealloc gives the place back too.
    let mut pds = pds.into_iter();
    Device::dealloc_pd(&h, pds.next().unwrap()).unwrap();
    h.alloc_pd().unwrap();
}

#[test]
fn max_cq_is_enforced() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    fill_refuse_free(SMALL.max_cq, 0, "max_cq", || cq(&h));
}

#[test]
fn max_mr_is_enforced() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pd = h.alloc_pd().unwrap();
    let buf = RegisteredBuffer::new(64);
    fill_refuse_free(SMALL.max_mr, 0, "max_mr", || {
        pd.register(&buf, Access::LOCAL_WRITE)
    });
}

#[test]
fn max_srq_is_enforced() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pd = h.alloc_pd().unwrap();
    let init = SrqInit {
        max_wr: 4,
        max_sge: 1,
    };
    fill_refuse_free(SMALL.max_srq, 0, "max_srq", || h.create_srq(&pd, init));
}

#[test]
fn max_av_is_enforced() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pd = h.alloc_pd().unwrap();
    fill_refuse_free(SMALL.max_av, 0, "max_av", || {
        h.create_av(&pd, &AvAttr::lid(1, 7))
    });
}

#[test]
fn max_qp_is_enforced_and_counts_the_gsi_qp() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pd = h.alloc_pd().unwrap();
    let c = cq(&h).unwrap();
    let init = QpInit {
        qp_type: QpType::Rc,
        send_cq: &c,
        recv_cq: &c,
        srq: None,
        caps: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
        },
        sq_sig_all: false,
    };
    let gsi = h.create_gsi_qp(&pd, 1, &init).unwrap();
    let qps = fill_refuse_free(SMALL.max_qp, 1, "max_qp", || h.create_qp(&pd, &init));
    drop(gsi);
    let _more = h.create_qp(&pd, &init).unwrap();
    assert!(matches!(
        h.create_gsi_qp(&pd, 1, &init),
        Err(Error::InsufficientResources(_))
    ));
    drop(qps);
    h.create_gsi_qp(&pd, 1, &init).unwrap();
}

#[test]
fn sizes_above_the_advertised_maxima_are_refused() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    let pd = h.alloc_pd().unwrap();
    assert!(matches!(
        h.create_cq(CqInit {
            capacity: SMALL.max_cqe + 1,
            ..CqInit::default()
        }),
        Err(Error::InvalidParameter(_))
    ));
    let too_big = [
        SrqInit {
            max_wr: SMALL.max_srq_wr + 1,
            max_sge: 1,
        },
        SrqInit {
            max_wr: 1,
            max_sge: SMALL.max_sge + 1,
        },
    ];
    for init in too_big {
        assert!(matches!(
            h.create_srq(&pd, init),
            Err(Error::InvalidParameter(_))
        ));
    }
    let c = cq(&h).unwrap();
    let ok = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    for caps in [
        QpCaps {
            max_send_wr: SMALL.max_qp_wr + 1,
            ..ok
        },
        QpCaps {
            max_recv_wr: SMALL.max_qp_wr + 1,
            ..ok
        },
        QpCaps {
            max_send_sge: SMALL.max_sge + 1,
            ..ok
        },
        QpCaps {
            max_recv_sge: SMALL.max_sge + 1,
            ..ok
        },
    ] {
        let init = QpInit {
            qp_type: QpType::Ud,
            send_cq: &c,
            recv_cq: &c,
            srq: None,
            caps,
            sq_sig_all: false,
        };
        assert!(matches!(
            h.create_qp(&pd, &init),
            Err(Error::InvalidParameter(_))
        ));
    }
}

#[test]
fn limits_the_soft_hca_cannot_honour_are_refused() {
    let f = Fabric::new();
    for limits in [
        HcaLimits {
            max_qp: 1 << 24,
            ..HcaLimits::default()
        },
        HcaLimits {
            max_mr: 1 << 24,
            ..HcaLimits::default()
        },
    ] {
        let e = f
            .add_hca(HcaConfig {
                limits,
                ..HcaConfig::new(0xa000, &[1])
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    }
}

/// `usage()` counts what the limits are checked against, and every count
/// returns to 0 when the objects go.
#[test]
fn usage_counts_each_kind_and_returns_to_zero() {
    let f = Fabric::new();
    let h = small_hca(&f, 0xa000, 1);
    assert!(h.usage().is_empty());
    let pd = h.alloc_pd().unwrap();
    let c = cq(&h).unwrap();
    let buf = RegisteredBuffer::new(64);
    let mr = pd.register(&buf, Access::LOCAL_WRITE).unwrap();
    let av = h.create_av(&pd, &AvAttr::lid(1, 7)).unwrap();
    let srq = h
        .create_srq(
            &pd,
            SrqInit {
                max_wr: 4,
                max_sge: 1,
            },
        )
        .unwrap();
    assert_eq!(
        h.usage(),
        HcaUsage {
            pds: 1,
            cqs: 1,
            qps: 0,
            srqs: 1,
            avs: 1,
            mrs: 1,
        }
    );
    drop((srq, av, mr, c, pd));
    assert!(h.usage().is_empty(), "{:?}", h.usage());
}
