//! Helpers the provider's integration tests share: two devices on
//! loopback, RC QPs connected by hand, CQ polling with a deadline.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Mtu, Provider, QpCaps, QpInit, QpModify, QpState,
    QpType, Wc,
};
use roce_provider::{DeviceConfig, PortConfig, RoceCq, RoceDevice, RoceProvider, RoceQp, RoceSrq};

pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

pub fn devices() -> (RoceDevice, RoceDevice) {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    let p = RoceProvider::new(vec![
        DeviceConfig::new("a", 1, vec![port("127.0.0.1")]),
        DeviceConfig::new("b", 2, vec![port("127.0.0.2")]),
    ]);
    (p.open(1).unwrap(), p.open(2).unwrap())
}

pub fn gid(d: &RoceDevice) -> [u8; 16] {
    d.query_port(1).unwrap().gid_table[0]
}

pub fn connect(d: &RoceDevice, qp: &RoceQp, to: &RoceDevice, dqpn: u32) {
    connect_with_timeout(d, qp, to, dqpn, 14);
}

/// RESET -> RTS towards `dqpn` on `to`, with local ACK timeout `timeout`
/// (4.096 us * 2^timeout).
pub fn connect_with_timeout(d: &RoceDevice, qp: &RoceQp, to: &RoceDevice, dqpn: u32, timeout: u8) {
    let av = AvAttr {
        grh: Some(GrhAttr {
            dgid: gid(to),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }),
        ..AvAttr::lid(1, 0)
    };
    let m = QpModify::to;
    d.modify_qp(qp, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        qp,
        &m(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(dqpn)
            .rq_psn(7)
            .max_dest_rd_atomic(4)
            .min_rnr_timer(1),
    )
    .unwrap();
    d.modify_qp(
        qp,
        &m(QpState::Rts)
            .sq_psn(7)
            .timeout(timeout)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(4),
    )
    .unwrap();
}

pub fn cq(d: &RoceDevice) -> RoceCq {
    d.create_cq(CqInit {
        capacity: 256,
        ..CqInit::default()
    })
    .unwrap()
}

pub fn qp(
    d: &RoceDevice,
    pd: &roce_provider::RocePd,
    cq: &RoceCq,
    srq: Option<&RoceSrq>,
) -> RoceQp {
    d.create_qp(
        pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        },
    )
    .unwrap()
}

pub fn wait(d: &RoceDevice, cq: &RoceCq, n: usize) -> Vec<Wc> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 16];
    while got.len() < n {
        assert!(Instant::now() < end, "{} of {n}: {got:?}", got.len());
        let k = d.poll_cq(cq, &mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7) as u8)
        .collect()
}

/// An RC QP on `a` (completing on `ca`, PD `pa`) and one on `b` (`cb`,
/// `pb`), connected to each other.
pub fn connected_qps(
    (a, pa, ca): (&RoceDevice, &roce_provider::RocePd, &RoceCq),
    (b, pb, cb): (&RoceDevice, &roce_provider::RocePd, &RoceCq),
) -> (RoceQp, RoceQp) {
    let (qa, qb) = (qp(a, pa, ca, None), qp(b, pb, cb, None));
    let (na, nb) = (a.query_qp(&qa).unwrap().qpn, b.query_qp(&qb).unwrap().qpn);
    connect(a, &qa, b, nb);
    connect(b, &qb, a, na);
    (qa, qb)
}

/// A connected RC pair whose B side completes on a CQ with `hook`, each
/// side with a registered 64-byte buffer: what the completion-hook tests
/// exchange SENDs over.
pub struct HookedPair {
    pub ca: RoceCq,
    pub cb: RoceCq,
    pub qa: RoceQp,
    pub qb: RoceQp,
    pub lkeys: [u32; 2],
    /// The MRs, kept registered for the pair's life.
    pub mrs: (roce_provider::RoceMr, roce_provider::RoceMr),
}

/// [`HookedPair`] between `a` and `b`.
pub fn hooked_pair(a: &RoceDevice, b: &RoceDevice, hook: provider::CompletionHook) -> HookedPair {
    let cb = b
        .create_cq(CqInit {
            capacity: 64,
            on_completion: Some(hook),
            ..CqInit::default()
        })
        .unwrap();
    let ca = cq(a);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (qa, qb) = connected_qps((a, &pa, &ca), (b, &pb, &cb));
    let (ba, bb) = (
        provider::RegisteredBuffer::new(64),
        provider::RegisteredBuffer::new(64),
    );
    let ma = a.register_mr(&pa, &ba, 0, 64, 0, ALL).unwrap();
    let mb = b.register_mr(&pb, &bb, 0, 64, 0, ALL).unwrap();
    let lkeys = [a.mr_keys(&ma).0, b.mr_keys(&mb).0];
    HookedPair {
        ca,
        cb,
        qa,
        qb,
        lkeys,
        mrs: (ma, mb),
    }
}
