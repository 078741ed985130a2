//! Values the IBTA bounds are refused, never masked or clamped (issue 12,
//! defect 5): PSNs above 24 bits, an AV naming a port the CA does not have
//! (or an SL / flow label that does not fit its field), access bits that
//! name no right. Fixed cases first, then random ones against the bounds.

use al::Error;
use hca::*;
use proptest::prelude::*;

const PSN_MAX: u32 = 0xff_ffff;

/// A fabric with one two-port HCA (LIDs 1 and 2) and one UD peer.
struct Setup {
    _f: Fabric,
    hca: SoftHca,
    pd: SoftPd,
    cq: SoftCq,
}

fn setup() -> Setup {
    let f = Fabric::new();
    let hca = f.add_hca(HcaConfig::new(0xa000, &[1, 2])).unwrap();
    let pd = hca.alloc_pd().unwrap();
    let cq = hca
        .create_cq(CqInit {
            capacity: 16,
            ..CqInit::default()
        })
        .unwrap();
    Setup { _f: f, hca, pd, cq }
}

fn rc_qp(s: &Setup) -> SoftQp {
    s.hca
        .create_qp(
            &s.pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &s.cq,
                recv_cq: &s.cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap()
}

fn init(access: Access) -> QpModify {
    QpModify::to(QpState::Init)
        .pkey_index(0)
        .port(1)
        .access(access)
}

fn rtr(av: AvAttr, rq_psn: u32) -> QpModify {
    QpModify::to(QpState::Rtr)
        .av(av)
        .path_mtu(Mtu::Mtu1024)
        .dest_qpn(0x200)
        .rq_psn(rq_psn)
        .max_dest_rd_atomic(1)
        .min_rnr_timer(12)
}

fn rts(sq_psn: u32) -> QpModify {
    QpModify::to(QpState::Rts)
        .sq_psn(sq_psn)
        .timeout(14)
        .retry_cnt(7)
        .rnr_retry(7)
        .max_rd_atomic(1)
}

fn invalid<T: std::fmt::Debug>(r: Result<T, Error>) {
    assert!(
        matches!(r, Err(Error::InvalidParameter(_))),
        "expected InvalidParameter, got {r:?}"
    );
}

#[test]
fn psns_above_24_bits_are_refused_not_masked() {
    let s = setup();
    let qp = rc_qp(&s);
    qp.modify(&init(Access::REMOTE_WRITE)).unwrap();
    invalid(qp.modify(&rtr(AvAttr::lid(1, 9), PSN_MAX + 1)));
    invalid(qp.modify(&rtr(AvAttr::lid(1, 9), u32::MAX)));
    assert_eq!(
        qp.query().state,
        QpState::Init,
        "a refused modify changes nothing"
    );
    qp.modify(&rtr(AvAttr::lid(1, 9), PSN_MAX)).unwrap();
    invalid(qp.modify(&rts(1 << 24)));
    qp.modify(&rts(PSN_MAX)).unwrap();
    let a = qp.query();
    assert_eq!((a.rq_psn, a.sq_psn), (PSN_MAX, PSN_MAX));
}

#[test]
fn an_av_must_name_a_port_of_the_ca_and_fit_its_fields() {
    let s = setup();
    let grh = |flow_label| GrhAttr {
        dgid: [0; 16],
        sgid_index: 0,
        flow_label,
        hop_limit: 64,
        traffic_class: 0,
    };
    let bad = [
        AvAttr::lid(0, 9),
        AvAttr::lid(3, 9),
        AvAttr::lid(255, 9),
        AvAttr {
            sl: 16,
            ..AvAttr::lid(1, 9)
        },
        AvAttr {
            grh: Some(grh(1 << 20)),
            ..AvAttr::lid(1, 9)
        },
    ];
    for av in bad {
        invalid(s.hca.create_av(&s.pd, &av));
        let qp = rc_qp(&s);
        qp.modify(&init(Access::NONE)).unwrap();
        invalid(qp.modify(&rtr(av, 0)));
        let mut m = rtr(AvAttr::lid(1, 9), 0);
        m.alt_av = Some(av);
        invalid(qp.modify(&m));
        assert_eq!(qp.query().state, QpState::Init);
    }
    // Port 2 exists; the largest SL and flow label fit.
    let good = AvAttr {
        sl: 15,
        grh: Some(grh(0xf_ffff)),
        ..AvAttr::lid(2, 9)
    };
    s.hca.create_av(&s.pd, &good).unwrap();
    let qp = rc_qp(&s);
    qp.modify(&init(Access::NONE)).unwrap();
    qp.modify(&rtr(good, 0)).unwrap();
}

#[test]
fn undefined_access_bits_are_refused() {
    assert_eq!(Access::from_bits(0x10), None);
    assert_eq!(Access::from_bits(0xf), Some(Access::DEFINED));
    let s = setup();
    let buf = RegisteredBuffer::new(64);
    for bits in [0x10, 0x11, 0x8000_0001, u32::MAX] {
        let access = Access::from_bits_retain(bits);
        invalid(s.pd.register(&buf, access));
        invalid(Device::register_mr(&s.hca, &s.pd, &buf, 0, 64, 0, access));
        let qp = rc_qp(&s);
        invalid(qp.modify(&init(access)));
        assert_eq!(qp.query().state, QpState::Reset);
    }
}

/// What the spec says of an access value given to MR registration.
fn mr_access_ok(bits: u32) -> bool {
    let a = Access::from_bits_retain(bits);
    let needs_local_write = a.contains(Access::REMOTE_WRITE) || a.contains(Access::REMOTE_ATOMIC);
    bits & !0xf == 0 && (!needs_local_write || a.contains(Access::LOCAL_WRITE))
}

fn psn() -> impl Strategy<Value = u32> {
    prop_oneof![0..=PSN_MAX, any::<u32>(), Just(PSN_MAX + 1)]
}

fn access_bits() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..16, 0u32..64, any::<u32>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random PSNs, access bits, AV ports, SLs and flow labels: every
    /// modify and registration is accepted exactly when each value is
    /// inside its spec bound, and a refused one leaves the QP's state.
    #[test]
    fn random_attributes_are_accepted_exactly_within_the_spec_bounds(
        access in access_bits(),
        port in prop_oneof![0u8..4, any::<u8>()],
        sl in 0u8..32,
        flow_label in prop_oneof![0u32..=0xf_ffff, any::<u32>()],
        with_grh in any::<bool>(),
        rq_psn in psn(),
        sq_psn in psn(),
    ) {
        let s = setup();
        let buf = RegisteredBuffer::new(64);
        let mr = s.pd.register(&buf, Access::from_bits_retain(access));
        prop_assert_eq!(mr.is_ok(), mr_access_ok(access), "MR access {:#x}", access);

        let qp = rc_qp(&s);
        let r = qp.modify(&init(Access::from_bits_retain(access)));
        prop_assert_eq!(r.is_ok(), access & !0xf == 0, "QP access {:#x}", access);
        if r.is_err() {
            prop_assert_eq!(qp.query().state, QpState::Reset);
            qp.modify(&init(Access::NONE)).unwrap();
        }

        let av = AvAttr {
            sl,
            grh: with_grh.then_some(GrhAttr {
                dgid: [0; 16],
                sgid_index: 0,
                flow_label,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..AvAttr::lid(port, 9)
        };
        let av_ok = (1..=2).contains(&port) && sl <= 15 && (!with_grh || flow_label <= 0xf_ffff);
        prop_assert_eq!(s.hca.create_av(&s.pd, &av).is_ok(), av_ok);
        let r = qp.modify(&rtr(av, rq_psn));
        prop_assert_eq!(r.is_ok(), av_ok && rq_psn <= PSN_MAX, "{:?}", r);
        if r.is_err() {
            prop_assert_eq!(qp.query().state, QpState::Init);
            qp.modify(&rtr(AvAttr::lid(1, 9), 0)).unwrap();
        }
        let r = qp.modify(&rts(sq_psn));
        prop_assert_eq!(r.is_ok(), sq_psn <= PSN_MAX, "{:?}", r);
        if let Ok(()) = r {
            prop_assert_eq!(qp.query().sq_psn, sq_psn);
        }
    }
}
