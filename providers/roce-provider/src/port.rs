//! One port of an open device: its bound UDP socket and send sockets, its
//! GID and counters, and the ACKs held for it ([`PortShared`]); binding
//! them ([`PortShared::bind`]). Sending is `tx_batch`'s job, feeding
//! received datagrams to QPs `feed`'s.

use al::sync::atomic::AtomicBool;
use std::net::SocketAddr;
#[cfg(not(ibal_loom))]
use std::net::UdpSocket;
use std::time::Duration;

use al::{Error, Result};
use provider::{Gid, LinkLayer, PortAttr, PortState};

use crate::config::{gid_of, PortConfig};
use crate::counters::AtomicCounters;
#[cfg(ibal_loom)]
pub(crate) use crate::fake_net::UdpSocket;
use crate::held_acks::HeldAcks;

/// How long a receive thread blocks before it looks at its stop flag
/// (closing the device also wakes it at once).
pub(crate) const RECV_TIMEOUT: Duration = Duration::from_millis(100);

/// One port of an open device.
pub(crate) struct PortShared {
    pub(crate) num: u8,
    pub(crate) cfg: PortConfig,
    pub(crate) socket: UdpSocket,
    /// Send sockets on source ports in 0xC000..=0xFFFF (ECMP), with
    /// their addresses; empty: send from `socket`.
    pub(crate) tx: Vec<(UdpSocket, SocketAddr)>,
    /// The bound address (the configured one, with the real UDP port).
    pub(crate) local: SocketAddr,
    pub(crate) gid: Gid,
    pub(crate) counters: AtomicCounters,
    /// The port as the receive stage sees it.
    pub(crate) view: roce_transport::Port,
    /// Positive ACKs a polling thread held back (see [`HeldAcks`]).
    pub(crate) held: HeldAcks,
    /// Send runs of packets as GSO super-datagrams (`tx_batch`): the
    /// configuration's choice, cleared for good when the kernel refuses
    /// one (`tx_gso_refused`).
    pub(crate) gso: AtomicBool,
    /// The receive socket has `UDP_GRO` on: a received buffer may hold
    /// several packets (`mmsg`).
    pub(crate) gro: bool,
}

impl PortShared {
    /// Port `num` of the device `node_guid` as `pc` configures it: its
    /// socket bound (with a read timeout of [`RECV_TIMEOUT`], never
    /// fragmenting) and its send sockets.
    pub(crate) fn bind(num: u8, pc: &PortConfig, node_guid: u64) -> Result<PortShared> {
        if pc.addr.ip().is_unspecified() || pc.addr.ip().is_multicast() {
            return Err(Error::invalid_parameter(format!(
                "port {num}: {} is not a unicast address (it is the port's GID)",
                pc.addr.ip()
            )));
        }
        let socket = UdpSocket::bind(pc.addr).map_err(|e| {
            Error::insufficient_resources(format!("port {num}: bind {}: {e}", pc.addr))
        })?;
        no_fragments(&socket).map_err(|e| {
            Error::insufficient_resources(format!("port {num}: IP_MTU_DISCOVER: {e}"))
        })?;
        socket
            .set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(|e| Error::insufficient_resources(format!("port {num}: {e}")))?;
        // A full send window (1 MiB: `roce_transport::MAX_UNACKED_BYTES`)
        // arrives back to back; the default receive buffer (~208 KiB)
        // holds a fifth of it and drops the rest, each drop costing a
        // retransmission. Ask for room for several windows (the kernel
        // caps it at net.core.rmem_max; a smaller buffer still works).
        #[cfg(not(ibal_loom))]
        let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(SOCKET_BUFFER);
        let local = socket
            .local_addr()
            .map_err(|e| Error::insufficient_resources(format!("port {num}: {e}")))?;
        let tx = source_sockets(local, pc.source_ports, node_guid);
        // GRO as configured, if the kernel takes it (Linux 5.0 and later);
        // without it every packet arrives as its own datagram, as before.
        let gro = pc.udp_offload.gro && crate::mmsg::enable_gro(&socket);
        Ok(PortShared {
            num,
            cfg: *pc,
            socket,
            tx,
            local,
            gid: gid_of(local.ip()),
            counters: AtomicCounters::default(),
            view: roce_transport::Port {
                num,
                local,
                mtu: pc.mtu,
            },
            held: HeldAcks::default(),
            gso: AtomicBool::new(
                pc.udp_offload.gso && cfg!(all(target_os = "linux", not(ibal_loom))),
            ),
            gro,
        })
    }

    /// The port's attributes, as `query_port` gives them.
    pub(crate) fn attr(&self) -> PortAttr {
        PortAttr {
            port_num: self.num,
            state: PortState::Active,
            lid: 0,
            lmc: 0,
            sm_lid: 0,
            gid_table: vec![self.gid],
            pkey_table: vec![provider::DEFAULT_PKEY],
            active_mtu: self.cfg.mtu,
            max_mtu: self.cfg.mtu,
            link_layer: LinkLayer::Ethernet,
        }
    }
}

/// Up to `n` send sockets on `local`'s IP, on UDP ports in
/// 0xC000..=0xFFFF spread by a hash of the device and the socket's index
/// (a port another socket holds is skipped; fewer sockets is fine).
fn source_sockets(local: SocketAddr, n: u8, salt: u64) -> Vec<(UdpSocket, SocketAddr)> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..u64::from(n) {
        for attempt in 0..8u64 {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, local, i, attempt).hash(&mut h);
            let port = 0xC000 | (h.finish() as u16 & 0x3fff);
            let addr = SocketAddr::new(local.ip(), port);
            if let Ok(s) = UdpSocket::bind(addr) {
                #[cfg(not(ibal_loom))]
                let _ = socket2::SockRef::from(&s).set_send_buffer_size(SOCKET_BUFFER);
                if no_fragments(&s).is_err() {
                    continue;
                }
                out.push((s, addr));
                break;
            }
        }
    }
    out
}

/// Receive and send buffer size asked of the kernel for each socket.
#[cfg(not(ibal_loom))]
const SOCKET_BUFFER: usize = 4 << 20;
/// IPv4 sockets: `IP_MTU_DISCOVER = IP_PMTUDISC_DO`. The kernel then sets
/// DF and never fragments, and (`ip_select_ident_segs`) writes IPv4
/// identification 0 on an unconnected socket: the value the ICRC was
/// computed with (`roce::Endpoints::new`). With the default
/// (`IP_PMTUDISC_WANT`) Linux writes a hashed, per-packet identification
/// and every real RoCEv2 receiver (rxe, NICs) drops our packets for a bad
/// ICRC. A datagram above the route's MTU now fails to send (counted in
/// `tx_errors`) instead of leaving in fragments no RoCE receiver accepts.
fn no_fragments(socket: &UdpSocket) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", not(ibal_loom)))]
    if socket.local_addr()?.is_ipv4() {
        use rustix::net::sockopt::{set_ip_mtu_discover, Ipv4PathMtuDiscovery};
        set_ip_mtu_discover(socket, Ipv4PathMtuDiscovery::DO)?;
    }
    #[cfg(any(not(target_os = "linux"), ibal_loom))]
    let _ = socket;
    Ok(())
}
