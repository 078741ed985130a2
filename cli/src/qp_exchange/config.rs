//! What a run of `ibal qp-exchange` is told.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ibal::prelude::Mtu;

/// Which end of the TCP side channel this process is.
#[derive(Clone, Debug)]
pub enum Role {
    /// Wait for one client on this address.
    Listen(SocketAddr),
    /// Connect to this host and TCP port.
    Connect(String, u16),
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct QpxConfig {
    /// Server or client.
    pub role: Role,
    /// The RoCEv2 port's IP address (its GID).
    pub local: IpAddr,
    /// UDP port the RoCEv2 port binds.
    pub udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    pub peer_udp_port: u16,
    /// UD instead of RC.
    pub ud: bool,
    /// Round trips.
    pub iters: u32,
    /// Bytes per message.
    pub size: usize,
    /// Path MTU (and the port's MTU).
    pub mtu: Mtu,
    /// Receives kept posted.
    pub rx_depth: u32,
    /// The GID index we report (informational).
    pub gid_index: i32,
    /// RDMA WRITE before every SEND (ibal peers only).
    pub write: bool,
    /// Behave as the ibv tools do (for tests without them): no extension,
    /// the socket closed after the exchange, a buffer filled with 0x7b
    /// that each SEND sends and each receive overwrites (so it echoes); the
    /// data is not checked.
    pub plain: bool,
    /// Bound on every wait (TCP connect, accept, reads, completions).
    pub timeout: Duration,
    /// RC: the local ACK timeout attribute (4.096 us * 2^N; the tools' 14
    /// is about 67 ms). Must exceed the path's longest delay.
    pub ack_timeout: u8,
    /// RC: transport retries before a SEND fails with RETRY_EXC (0..=7).
    pub retry_cnt: u8,
    /// `--rdma-bulk SIZE` (RC, ibal extension peers: another ibal or
    /// `.ci/rxe-peer/rdma_peer.c`): instead of the ping-pong, each side
    /// exposes a buffer of `2 * SIZE` bytes (REMOTE_WRITE and REMOTE_READ)
    /// whose second half holds its [`oob::bulk_pattern`](crate::oob::bulk_pattern); the client RDMA
    /// WRITEs SIZE bytes of its pattern into the first half of the
    /// server's, RDMA READs the server's second half and checks it, sends
    /// `ibal-qpx/1 bulk-done ...`, and the server checks what was written
    /// and answers with its verdict line.
    pub bulk: Option<usize>,
}

/// The bytes of a path MTU.
pub(super) fn mtu_bytes(m: Mtu) -> usize {
    match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}
