//! A RoCEv2 device's limits ([`RoceLimits`]): what `query` reports is what
//! the configuration set, each count is enforced (one more than allowed is
//! `InsufficientResources` naming the limit, and destroying one frees its
//! place), each size is enforced (`InvalidParameter`), and a limit above
//! what the device can have refuses the open.

use std::any::Any;
use std::net::SocketAddr;

use al::Error;
use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Provider, QpCaps, QpInit, QpType, RegisteredBuffer,
    SrqInit,
};
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceLimits, RoceProvider};

/// Every count limit 2, every size limit small.
fn small() -> RoceLimits {
    RoceLimits {
        max_qp: 2,
        max_qp_wr: 8,
        max_sge: 3,
        max_cq: 2,
        max_cqe: 16,
        max_mr: 2,
        max_pd: 2,
        max_srq: 2,
        max_srq_wr: 8,
        max_av: 2,
    }
}

fn open(limits: RoceLimits) -> al::Result<RoceDevice> {
    let port = PortConfig::new(SocketAddr::new("127.0.0.1".parse().unwrap(), 0));
    RoceProvider::new(vec![
        DeviceConfig::new("limits", 7, vec![port]).limits(limits)
    ])
    .open(7)
}

fn cq_init(capacity: u32) -> CqInit {
    CqInit {
        capacity,
        ..CqInit::default()
    }
}

fn av() -> AvAttr {
    AvAttr {
        grh: Some(GrhAttr {
            dgid: roce_provider::gid_of("127.0.0.1".parse().unwrap()),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }),
        ..AvAttr::lid(1, 0)
    }
}

#[test]
fn query_reports_the_configured_limits_and_the_defaults_are_a_server_s() {
    let d = open(small()).unwrap();
    let a = d.query();
    let l = small();
    assert_eq!(
        (a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe),
        (l.max_qp, l.max_qp_wr, l.max_sge, l.max_cq, l.max_cqe)
    );
    assert_eq!(
        (a.max_mr, a.max_pd, a.max_srq, a.max_srq_wr, a.max_av),
        (l.max_mr, l.max_pd, l.max_srq, l.max_srq_wr, l.max_av)
    );
    drop(d);
    let a = open(RoceLimits::default()).unwrap().query();
    assert!(a.max_qp >= 100_000, "100,000 connections by default");
    assert_eq!(a.max_qp, 1 << 20);
}

/// Each count limit: with `max_* = 2`, two objects are made, the third is
/// refused with `InsufficientResources` naming the limit, and once one is
/// destroyed another is made.
#[test]
fn every_count_limit_refuses_one_more_and_frees_a_place_on_destroy() {
    let d = open(small()).unwrap();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(cq_init(16)).unwrap();
    let buf = RegisteredBuffer::new(64);
    let init = QpInit {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        caps: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
        },
        sq_sig_all: false,
    };
    type Make<'a> = Box<dyn Fn() -> al::Result<Box<dyn Any>> + 'a>;
    fn boxed<T: 'static>(r: al::Result<T>) -> al::Result<Box<dyn Any>> {
        r.map(|o| Box::new(o) as Box<dyn Any>)
    }
    // What exists already: one PD and one CQ (the ones above).
    let kinds: Vec<(&str, usize, Make<'_>)> = vec![
        ("max_pd", 1, Box::new(|| boxed(d.alloc_pd()))),
        ("max_cq", 1, Box::new(|| boxed(d.create_cq(cq_init(4))))),
        ("max_qp", 0, Box::new(|| boxed(d.create_qp(&pd, &init)))),
        (
            "max_mr",
            0,
            Box::new(|| boxed(d.register_mr(&pd, &buf, 0, 64, 0, Access::LOCAL_WRITE))),
        ),
        (
            "max_srq",
            0,
            Box::new(|| {
                boxed(d.create_srq(
                    &pd,
                    SrqInit {
                        max_wr: 4,
                        max_sge: 1,
                    },
                ))
            }),
        ),
        ("max_av", 0, Box::new(|| boxed(d.create_av(&pd, &av())))),
    ];
    for (name, existing, make) in &kinds {
        let mut made: Vec<Box<dyn Any>> = (*existing..2)
            .map(|i| make().unwrap_or_else(|e| panic!("{name}: object {i}: {e}")))
            .collect();
        match make() {
            Err(Error::InsufficientResources(why)) => {
                assert!(why.contains(name), "{name}: {why}")
            }
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => panic!("{name}: one more than allowed was made"),
        }
        if made.is_empty() {
            continue; // the limit is held by the test's own PD or CQ
        }
        made.pop();
        made.push(make().unwrap_or_else(|e| panic!("{name}: after a destroy: {e}")));
    }
}

/// Each size limit: at the limit it is accepted, one above it is
/// `InvalidParameter` naming the limit.
#[test]
fn every_size_limit_is_accepted_at_its_value_and_refused_above() {
    let l = small();
    let d = open(RoceLimits {
        max_cq: 100,
        max_srq: 100,
        ..l
    })
    .unwrap();
    let pd = d.alloc_pd().unwrap();
    let qp_with = |caps: QpCaps| {
        let cq = d.create_cq(cq_init(4)).unwrap();
        d.create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps,
                sq_sig_all: false,
            },
        )
        .map(|_| ())
    };
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let srq = |max_wr, max_sge| d.create_srq(&pd, SrqInit { max_wr, max_sge }).map(|_| ());
    type Make<'a> = Box<dyn Fn(u32) -> al::Result<()> + 'a>;
    let cases: Vec<(&str, Make<'_>, u32)> = vec![
        (
            "max_qp_wr",
            Box::new(|n| {
                qp_with(QpCaps {
                    max_send_wr: n,
                    ..caps
                })
            }),
            l.max_qp_wr,
        ),
        (
            "max_sge",
            Box::new(|n| {
                qp_with(QpCaps {
                    max_recv_sge: n,
                    ..caps
                })
            }),
            l.max_sge,
        ),
        (
            "max_cqe",
            Box::new(|n| d.create_cq(cq_init(n)).map(|_| ())),
            l.max_cqe,
        ),
        ("max_srq_wr", Box::new(|n| srq(n, 1)), l.max_srq_wr),
        ("max_sge", Box::new(|n| srq(1, n)), l.max_sge),
    ];
    for (name, make, at) in &cases {
        make(*at).unwrap_or_else(|e| panic!("{name} at {at}: {e}"));
        match make(at + 1) {
            Err(Error::InvalidParameter(why)) => assert!(why.contains(name), "{name}: {why}"),
            other => panic!("{name} above {at}: {other:?}"),
        }
    }
}

/// A limit above what a RoCEv2 device can have (24-bit QP numbers; the
/// transport's queue and SGE bounds; sparse random MR keys) fails the
/// open, naming it; at the bound the device opens.
#[test]
fn a_limit_beyond_the_device_s_reach_refuses_the_open() {
    let d = RoceLimits::default();
    let beyond = [
        (
            "max_qp",
            RoceLimits {
                max_qp: RoceLimits::MAX_QP + 1,
                ..d
            },
        ),
        (
            "max_qp_wr",
            RoceLimits {
                max_qp_wr: RoceLimits::MAX_QP_WR + 1,
                ..d
            },
        ),
        (
            "max_sge",
            RoceLimits {
                max_sge: RoceLimits::MAX_SGE + 1,
                ..d
            },
        ),
        (
            "max_mr",
            RoceLimits {
                max_mr: RoceLimits::MAX_MR + 1,
                ..d
            },
        ),
    ];
    for (name, limits) in beyond {
        match open(limits) {
            Err(Error::InvalidParameter(why)) => assert!(why.contains(name), "{name}: {why}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let most = RoceLimits {
        max_qp: RoceLimits::MAX_QP,
        max_qp_wr: RoceLimits::MAX_QP_WR,
        max_sge: RoceLimits::MAX_SGE,
        max_mr: RoceLimits::MAX_MR,
        ..d
    };
    assert_eq!(open(most).unwrap().query().max_qp, (1 << 24) - 2);
}
