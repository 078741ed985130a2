//! The two-HCA soft fabric the CM end-to-end tests share: a side is a CA
//! with a PD, a CQ and an RC QP.
#![allow(dead_code)] // each test file uses its own part of it

use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm;
use hca::verbs::{self, Ca, Cq, Pd};
use provider::QpType;
use qp::{create_qp, Qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

pub const SERVICE: u64 = 0x1000_0000_0000_00aa;

pub struct Side {
    pub ca: Handle<Ca>,
    pub pd: Handle<Pd>,
    pub cq: Handle<Cq>,
    pub qp: Handle<Qp>,
}

pub fn provider() -> SoftProvider {
    let f = Fabric::new();
    f.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
    f.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
    SoftProvider::new(f)
}

pub fn side(al: &Al, p: &SoftProvider, guid: u64) -> Side {
    let ca = verbs::open_ca(al.instance(), p, guid).unwrap();
    let pd = verbs::alloc_pd(al.instance(), ca).unwrap();
    let cq = verbs::create_cq(al.instance(), ca, 256, None, None).unwrap();
    let qp = new_qp(al, pd, cq);
    Side { ca, pd, cq, qp }
}

pub fn new_qp(al: &Al, pd: Handle<Pd>, cq: Handle<Cq>) -> Handle<Qp> {
    create_qp(al.instance(), pd, QpCreate::new(QpType::Rc, cq)).unwrap()
}

pub fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} (ports {})",
            cm::active_ports()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
