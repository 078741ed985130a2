//! What a run of the IP ping-pong is told: its role and settings.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use provider::Mtu;

/// The rdma_cm port a listener uses when none is given (librdmacm's
/// examples use 7471).
pub const DEFAULT_PORT: u16 = 7471;

/// Which side this process plays.
#[derive(Clone, Debug)]
pub enum Role {
    /// Wait for connections on this address.
    Listen(SocketAddr),
    /// Connect to this address.
    Connect(SocketAddr),
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct IpPingPongConfig {
    /// Listen or connect.
    pub role: Role,
    /// Our RoCEv2 port's address (the connecting side's default: the
    /// address the kernel routes from; on loopback, the next 127.x address).
    pub local: Option<IpAddr>,
    /// UDP port our RoCEv2 port binds.
    pub udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    pub peer_udp_port: u16,
    /// Round trips (the connecting side's choice; the listener follows it).
    pub iterations: u32,
    /// Bytes written each way per round trip (the connecting side's choice).
    pub size: usize,
    /// Path MTU.
    pub mtu: Mtu,
    /// Connections a listener serves before it exits.
    pub count: u32,
    /// How long to wait for the peer at any step.
    pub timeout: Duration,
    /// How long each connection stays up after the ping-pong: the
    /// connecting side waits this long before its DREQ, the listener before
    /// it answers the peer's DREQ (so a test can kill a peer in that
    /// window). 0 by default.
    pub hold: Duration,
    /// Our device's node GUID (default: from the process id).
    pub guid: Option<u64>,
    /// Our device's first QPN (default: random).
    pub first_qpn: Option<u32>,
    /// Our RoCEv2 device's `max_qp` (default: `RoceLimits`').
    pub max_qp: Option<u32>,
    /// Run on this RDMA device (libibverbs name, `rxe0`, `mlx5_0`) with
    /// librdmacm-backed CEPs instead of our RoCEv2 port (feature `rdma`;
    /// `rdma`).
    pub device: Option<String>,
    /// Print snapshots of our objects on stderr, at an interval
    /// (`--status`) and on SIGUSR1; over our RoCEv2 port only. `None`:
    /// never.
    pub status: Option<crate::status::StatusConfig>,
}

impl IpPingPongConfig {
    /// Defaults for `role`.
    pub fn new(role: Role) -> Self {
        IpPingPongConfig {
            role,
            local: None,
            udp_port: ibal::roce::ROCE_PORT,
            peer_udp_port: ibal::roce::ROCE_PORT,
            iterations: 1000,
            size: 4096,
            mtu: Mtu::Mtu1024,
            count: 1,
            timeout: Duration::from_secs(30),
            hold: Duration::ZERO,
            guid: None,
            first_qpn: None,
            max_qp: None,
            device: None,
            status: None,
        }
    }
}
