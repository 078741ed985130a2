//! The conformance suite against the RoCEv2-over-UDP provider: two
//! devices of one `RoceProvider` on loopback, each with one port on its
//! own IP address (127.0.0.1 and 127.0.0.2) and an ephemeral UDP port,
//! so fixtures running in parallel (and other processes) never collide.
//! The provider's directory maps each device's GID to its bound address;
//! nothing leaves the host.

use std::net::SocketAddr;

use ibal_conformance::{Endpoint, Fixture, Side};
use provider::{Device, Provider};
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};

struct RoceFixture {
    a: RoceDevice,
    b: RoceDevice,
}

impl RoceFixture {
    fn new() -> RoceFixture {
        let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
        let provider = RoceProvider::new(vec![
            DeviceConfig::new("roce-a", 0xa000, vec![port("127.0.0.1")]),
            DeviceConfig::new("roce-b", 0xb000, vec![port("127.0.0.2")]),
        ]);
        RoceFixture {
            a: provider.open(0xa000).unwrap(),
            b: provider.open(0xb000).unwrap(),
        }
    }
}

impl Fixture for RoceFixture {
    type Device = RoceDevice;

    fn device(&self, side: Side) -> &RoceDevice {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    fn endpoint(&self, side: Side) -> Endpoint {
        let port = self.device(side).query_port(1).unwrap();
        Endpoint {
            port: 1,
            lid: None,
            gid: port.gid_table[0],
            gid_index: 0,
        }
    }

    /// The driver threads make progress; waiting only yields.
    fn progress(&self) {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }

    fn supports_lid_routing(&self) -> bool {
        false
    }
}

ibal_conformance::suite!(roce, RoceFixture::new);
