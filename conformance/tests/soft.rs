//! The conformance suite against the soft provider: two soft HCAs on one
//! fabric, opened through `SoftProvider`.

use ibal_conformance::{Endpoint, Fixture, Side};
use provider::Provider;
use soft_provider::{Fabric, HcaConfig, SoftHca, SoftProvider};

/// Two single-port soft HCAs (LIDs 1 and 2) on a fresh fabric.
struct SoftFixture {
    fabric: Fabric,
    a: SoftHca,
    b: SoftHca,
    /// Address by GID only, as a RoCE provider must.
    gid_only: bool,
}

impl SoftFixture {
    fn new() -> SoftFixture {
        Self::build(false)
    }

    /// The same fabric addressed the way a RoCE port is: no LIDs, every AV
    /// with a GRH.
    fn gid_only() -> SoftFixture {
        Self::build(true)
    }

    fn build(gid_only: bool) -> SoftFixture {
        let fabric = Fabric::new();
        fabric.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
        fabric.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
        let provider = SoftProvider::new(fabric.clone());
        SoftFixture {
            a: provider.open(0xa000).unwrap(),
            b: provider.open(0xb000).unwrap(),
            fabric,
            gid_only,
        }
    }
}

impl Fixture for SoftFixture {
    type Device = SoftHca;

    fn device(&self, side: Side) -> &SoftHca {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    fn endpoint(&self, side: Side) -> Endpoint {
        let port = provider::Device::query_port(self.device(side), 1).unwrap();
        Endpoint {
            port: 1,
            lid: (!self.gid_only).then_some(port.lid),
            gid: port.gid_table[0],
            gid_index: 0,
        }
    }

    /// One fabric tick: queued datagrams, RNR retries.
    fn progress(&self) {
        self.fabric.progress();
    }

    fn supports_lid_routing(&self) -> bool {
        !self.gid_only
    }
}

ibal_conformance::suite!(soft, SoftFixture::new);
ibal_conformance::suite!(soft_gid_only, SoftFixture::gid_only);
