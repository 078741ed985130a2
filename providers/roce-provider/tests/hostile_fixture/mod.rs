//! What the hostile-input, in-flight and port tests share: a provider with
//! two devices on 127.0.0.1 and 127.0.0.2, a side (device, PD, CQ) on each,
//! and an exchange that shows a pair of QPs still works.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use provider::{
    Access, AvAttr, CqInit, Device, GrhAttr, Mtu, QpCaps, QpInit, QpModify, QpState, QpType,
    RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use roce_provider::{
    DeviceConfig, PortConfig, PortCounters, RoceCq, RoceDevice, RoceMr, RocePd, RoceProvider,
    RoceQp,
};

pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

pub fn provider() -> RoceProvider {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    RoceProvider::new(vec![
        DeviceConfig::new("a", 1, vec![port("127.0.0.1")]),
        DeviceConfig::new("b", 2, vec![port("127.0.0.2")]),
    ])
}

pub struct Side {
    pub dev: RoceDevice,
    pub pd: RocePd,
    pub cq: RoceCq,
}

impl Side {
    pub fn new(dev: RoceDevice) -> Side {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev
            .create_cq(CqInit {
                capacity: 64,
                ..CqInit::default()
            })
            .unwrap();
        Side { dev, pd, cq }
    }
    pub fn gid(&self) -> [u8; 16] {
        self.dev.query_port(1).unwrap().gid_table[0]
    }
    pub fn av_to(&self, to: &Side) -> AvAttr {
        AvAttr {
            grh: Some(GrhAttr {
                dgid: to.gid(),
                sgid_index: 0,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..AvAttr::lid(1, 0)
        }
    }
    pub fn mem(&self, len: usize) -> (RegisteredBuffer, RoceMr, u32) {
        let buf = RegisteredBuffer::new(len);
        let mr = self
            .dev
            .register_mr(&self.pd, &buf, 0, len, 0, ALL)
            .unwrap();
        let key = self.dev.mr_keys(&mr).0;
        (buf, mr, key)
    }
    pub fn qp(&self, ty: QpType) -> RoceQp {
        self.dev
            .create_qp(
                &self.pd,
                &QpInit {
                    qp_type: ty,
                    send_cq: &self.cq,
                    recv_cq: &self.cq,
                    srq: None,
                    caps: QpCaps::default(),
                    sq_sig_all: false,
                },
            )
            .unwrap()
    }
    pub fn connect(&self, qp: &RoceQp, to: &Side, dqpn: u32) {
        let rc = self.dev.query_qp(qp).unwrap().qp_type == QpType::Rc;
        let m = |s| QpModify::to(s);
        self.dev
            .modify_qp(qp, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
            .unwrap();
        let mut rtr = m(QpState::Rtr)
            .av(self.av_to(to))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(dqpn)
            .rq_psn(0);
        let mut rts = m(QpState::Rts).sq_psn(0);
        if rc {
            rtr = rtr.max_dest_rd_atomic(1).min_rnr_timer(1);
            rts = rts.timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1);
        }
        self.dev.modify_qp(qp, &rtr).unwrap();
        self.dev.modify_qp(qp, &rts).unwrap();
    }
    pub fn ud(&self, qp: &RoceQp, qkey: u32) {
        let d = &self.dev;
        let mut init = QpModify::to(QpState::Init).pkey_index(0);
        if d.query_qp(qp).unwrap().qp_type != QpType::Gsi {
            init = init.port(1);
        }
        d.modify_qp(qp, &init.qkey(qkey)).unwrap();
        d.modify_qp(qp, &QpModify::to(QpState::Rtr)).unwrap();
        d.modify_qp(qp, &QpModify::to(QpState::Rts).sq_psn(0))
            .unwrap();
    }
    pub fn wait(&self, n: usize) -> Vec<Wc> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        let mut buf = [Wc::default(); 8];
        while got.len() < n && Instant::now() < end {
            let k = self.dev.poll_cq(&self.cq, &mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        assert_eq!(got.len(), n, "{got:#?}");
        got
    }
    pub fn counters(&self) -> PortCounters {
        self.dev.port_counters(1).unwrap()
    }
}

/// Wait until `f(counters)` holds (the driver thread counts
/// asynchronously).
pub fn until(side: &Side, what: &str, f: impl Fn(&PortCounters) -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f(&side.counters()) {
        assert!(Instant::now() < end, "{what}: {:#?}", side.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A SEND from `a`'s RC QP to `b`'s lands.
pub fn exchange(a: &Side, b: &Side, qa: &RoceQp, qb: &RoceQp, id: u64) {
    let (sbuf, _smr, skey) = a.mem(64);
    sbuf.write(0, b"still alive").unwrap();
    let (rbuf, _rmr, rkey) = b.mem(64);
    let rs = [Sge {
        addr: 0,
        length: 64,
        lkey: rkey,
    }];
    b.dev
        .post_recv(
            qb,
            &[RecvWr {
                wr_id: id,
                sg_list: &rs,
            }],
        )
        .unwrap();
    let ss = [Sge {
        addr: 0,
        length: 11,
        lkey: skey,
    }];
    a.dev
        .post_send::<()>(qa, &[SendWr::new(id, SendOp::Send, &ss)], &|_| None)
        .unwrap();
    let (s, r) = if std::ptr::eq(a, b) {
        // One CQ gets both, in either order.
        let w = a.wait(2);
        let send = w[0].opcode == WcOpcode::Send;
        if send {
            (w[0], w[1])
        } else {
            (w[1], w[0])
        }
    } else {
        (a.wait(1)[0], b.wait(1)[0])
    };
    assert_eq!((s.wr_id, s.status), (id, WcStatus::Success));
    assert_eq!((r.wr_id, r.status, r.byte_len), (id, WcStatus::Success, 11));
    let mut out = [0u8; 11];
    rbuf.read(0, &mut out).unwrap();
    assert_eq!(&out, b"still alive");
}
