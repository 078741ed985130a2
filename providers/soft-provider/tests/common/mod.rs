//! Shared helpers: two soft HCAs on one fabric, RC QPs connected by hand.
#![allow(dead_code)]

use provider::*;
use soft_provider::*;

pub struct Node {
    pub hca: SoftHca,
    pub pd: SoftPd,
    pub scq: SoftCq,
    pub rcq: SoftCq,
    pub lid: u16,
}

pub fn node(fabric: &Fabric, guid: u64, lid: u16) -> Node {
    let hca = fabric.add_hca(HcaConfig::new(guid, &[lid])).unwrap();
    let pd = hca.alloc_pd().unwrap();
    let cq = |cap| {
        hca.create_cq(CqInit {
            capacity: cap,
            ..CqInit::default()
        })
        .unwrap()
    };
    let scq = cq(256);
    let rcq = cq(256);
    Node {
        hca,
        pd,
        scq,
        rcq,
        lid,
    }
}

pub fn two() -> (Fabric, Node, Node) {
    let f = Fabric::new();
    let a = node(&f, 0xa000, 1);
    let b = node(&f, 0xb000, 2);
    (f, a, b)
}

pub fn qp(n: &Node, ty: QpType, srq: Option<&SoftSrq>) -> SoftQp {
    n.hca
        .create_qp(
            &n.pd,
            &QpInit {
                qp_type: ty,
                send_cq: &n.scq,
                recv_cq: &n.rcq,
                srq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap()
}

pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Bring an RC/UC QP to RTS towards (`dlid`, `dqpn`), receiving from
/// `rq_psn` and sending from `sq_psn`.
pub fn connect(qp: &SoftQp, access: Access, dlid: u16, dqpn: u32, rq_psn: u32, sq_psn: u32) {
    connect_rnr(qp, access, dlid, dqpn, rq_psn, sq_psn, 7)
}

pub fn connect_rnr(
    qp: &SoftQp,
    access: Access,
    dlid: u16,
    dqpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    rnr_retry: u8,
) {
    qp.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(access),
    )
    .unwrap();
    let mut rtr = QpModify::to(QpState::Rtr)
        .av(AvAttr::lid(1, dlid))
        .path_mtu(Mtu::Mtu1024)
        .dest_qpn(dqpn)
        .rq_psn(rq_psn);
    let mut rts = QpModify::to(QpState::Rts).sq_psn(sq_psn);
    if qp.qp_type() == QpType::Rc {
        rtr = rtr.max_dest_rd_atomic(4).min_rnr_timer(12);
        rts = rts
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(rnr_retry)
            .max_rd_atomic(4);
    }
    qp.modify(&rtr).unwrap();
    qp.modify(&rts).unwrap();
}

/// An RC pair a<->b with PSNs exchanged "out of band".
pub fn rc_pair(a: &Node, b: &Node, access: Access) -> (SoftQp, SoftQp) {
    let qa = qp(a, QpType::Rc, None);
    let qb = qp(b, QpType::Rc, None);
    let (psn_a, psn_b) = (0x123456, 0xabcdef);
    connect(&qa, access, b.lid, qb.qpn(), psn_b, psn_a);
    connect(&qb, access, a.lid, qa.qpn(), psn_a, psn_b);
    (qa, qb)
}

pub fn poll1(cq: &SoftCq) -> Wc {
    cq.poll_one().expect("a completion")
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn ud_qp(n: &Node, qkey: u32) -> SoftQp {
    let q = qp(n, QpType::Ud, None);
    q.modify(&QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(qkey))
        .unwrap();
    q.modify(&QpModify::to(QpState::Rtr)).unwrap();
    q.modify(&QpModify::to(QpState::Rts).sq_psn(0)).unwrap();
    q
}
