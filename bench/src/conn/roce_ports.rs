//! The two RoCEv2 ports of `perf conn-rate --transport udp`: their
//! addresses, GUIDs and rdma_cm ports, and the provider that opens them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ibal::roce::{DeviceConfig, PortConfig, RoceProvider};

/// The two ports' addresses (the listen is on the second).
pub const ADDRS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
];
/// Node GUIDs of the two RoCEv2 devices.
pub const GUIDS: [u64; 2] = [0x0249_4241_4c43_5201, 0x0249_4241_4c43_5202];
/// The rdma_cm port the passive side listens on.
pub const LISTEN_PORT: u16 = 7474;
/// An rdma_cm port nobody listens on (the REQ -> REJ probes).
pub const UNLISTENED_PORT: u16 = 7475;

/// The provider: two devices with one port each on [`ADDRS`].
pub(crate) fn provider() -> RoceProvider {
    let port = |ip: IpAddr| PortConfig::new(SocketAddr::new(ip, 0));
    RoceProvider::new(vec![
        DeviceConfig::new("conn-rate-a", GUIDS[0], vec![port(ADDRS[0])]),
        DeviceConfig::new("conn-rate-b", GUIDS[1], vec![port(ADDRS[1])]),
    ])
}

/// Where the active side connects.
pub(crate) fn listen_addr() -> SocketAddr {
    SocketAddr::new(ADDRS[1], LISTEN_PORT)
}

/// Where the REJ probes connect.
pub(crate) fn unlistened_addr() -> SocketAddr {
    SocketAddr::new(ADDRS[1], UNLISTENED_PORT)
}
