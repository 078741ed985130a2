//! Values the IBTA bounds are refused, never masked or clamped (issue 12,
//! defect 5): PSNs above 24 bits, an AV naming a port the CA does not have
//! (or an SL / flow label that does not fit its field), access bits that
//! name no right. Random cases against the bounds, on a two-port soft HCA;
//! the fixed cases are provider-generic and live in the conformance suite
//! (`qp_psns_are_24_bits`, `av_create_and_bounds`, `mr_registration_rules`).

use proptest::prelude::*;
use provider::buffer::RegisteredBuffer;
use provider::*;
use soft_provider::*;

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

#[test]
fn access_from_bits_keeps_only_defined_rights() {
    assert_eq!(Access::from_bits(0x10), None);
    assert_eq!(Access::from_bits(0xf), Some(Access::DEFINED));
    assert_eq!(Access::from_bits_retain(0x11).undefined_bits(), 0x10);
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
