//! What a [`crate::RoceProvider`] is configured with: devices, their
//! ports, and how a GID becomes a UDP socket address.

use al::sync::atomic::{AtomicU64, Ordering};
use std::net::{IpAddr, SocketAddr};

use al::sync::RwLock;
use provider::{Gid, Mtu};

/// The RoCEv2 UDP port (IBTA A17.2), the default to listen on and send to.
pub const ROCE_PORT: u16 = roce::ROCE_UDP_PORT;

/// One RoCEv2 port: the local IP address and UDP port its socket binds,
/// and the UDP port peers listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortConfig {
    /// Local address. The IP must be a unicast address of this host (not
    /// unspecified): it is the port's GID and goes into every ICRC. UDP
    /// port 0 binds an ephemeral port, which `RoceDevice::local_addr`
    /// reports and the provider's directory publishes (see
    /// [`crate::RoceProvider`]).
    pub addr: SocketAddr,
    /// The UDP port datagrams are sent to when the directory does not know
    /// the destination GID (default 4791).
    pub peer_udp_port: u16,
    /// Active (and maximum) MTU of the port (default 1024).
    pub mtu: Mtu,
    /// How many extra send sockets the port binds on UDP source ports in
    /// 0xC000..=0xFFFF picked from a hash, so that a QP's packets leave
    /// from a source port that depends on its QPN (`qpn % n` picks the
    /// socket) and ECMP routers spread QPs over paths (IBTA A17.2.3 lets
    /// the sender choose). Default 8; 0 sends everything from the
    /// listening socket.
    pub source_ports: u8,
    /// How a UD receive's 40-byte GRH area describes an IPv4 datagram.
    /// `false` (default): as Linux rxe fills it (20 zero bytes, then the
    /// IPv4 header), which a consumer tells from an IPv6 header by the
    /// version nibble at byte 20. `true`: an IPv6-style header whose
    /// source and destination GIDs are the IPv4-mapped addresses, the
    /// layout a consumer that reads GIDs at bytes 8 and 24 (InfiniBand's)
    /// understands, e.g. `cep`'s CM agent today.
    pub ipv4_grh_as_ipv6: bool,
    /// Which of the kernel's UDP offloads the port uses (default: both,
    /// unless the environment variable `IBAL_ROCE_UDP_OFFLOAD` says
    /// otherwise; see [`UdpOffload::from_env`]).
    pub udp_offload: UdpOffload,
}

/// The kernel's UDP offloads a port may use (Linux; elsewhere neither is
/// tried). Both leave the packets on the wire exactly as without them:
/// they change how many system calls and socket buffers carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpOffload {
    /// GSO on send (`UDP_SEGMENT`): a QP's run of equal-sized packets to
    /// one peer leaves as one super-datagram the kernel cuts into them,
    /// each packet's ICRC computed for the IPv4 identification its
    /// segment gets. If the kernel refuses one (no checksum offload on
    /// the route's device, a segment above the route's MTU), its packets
    /// go one by one and the port stops trying (`tx_gso_refused`).
    pub gso: bool,
    /// GRO on receive (`UDP_GRO`): the kernel may hand several packets of
    /// one flow over as one buffer, cut back into them by the segment
    /// size it reports.
    pub gro: bool,
}

impl UdpOffload {
    /// Both offloads.
    pub const ON: UdpOffload = UdpOffload {
        gso: true,
        gro: true,
    };
    /// Neither: one datagram per packet each way, as before issue 31.
    pub const OFF: UdpOffload = UdpOffload {
        gso: false,
        gro: false,
    };

    /// What `IBAL_ROCE_UDP_OFFLOAD` asks for: unset, empty or `on`: both;
    /// `off` (or `0`, `none`): neither; `gso` or `gro`: that one only.
    /// Anything else is read as `on`. An operator's switch for comparing
    /// with and without (the CLI's `--udp-offload` sets the same).
    pub fn from_env() -> UdpOffload {
        std::env::var("IBAL_ROCE_UDP_OFFLOAD")
            .map(|v| UdpOffload::parse(&v).unwrap_or(UdpOffload::ON))
            .unwrap_or(UdpOffload::ON)
    }

    /// `on`, `off` (`0`, `none`), `gso` or `gro`; `None` for anything
    /// else.
    pub fn parse(v: &str) -> Option<UdpOffload> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "on" | "1" | "both" => Some(UdpOffload::ON),
            "off" | "0" | "none" => Some(UdpOffload::OFF),
            "gso" => Some(UdpOffload {
                gso: true,
                gro: false,
            }),
            "gro" => Some(UdpOffload {
                gso: false,
                gro: true,
            }),
            _ => None,
        }
    }
}

impl PortConfig {
    /// A port on `addr`, sending to UDP 4791, MTU 1024.
    pub fn new(addr: SocketAddr) -> PortConfig {
        PortConfig {
            addr,
            peer_udp_port: ROCE_PORT,
            mtu: Mtu::Mtu1024,
            source_ports: 8,
            ipv4_grh_as_ipv6: false,
            udp_offload: UdpOffload::from_env(),
        }
    }

    /// Use the UDP offloads `o` names (see [`UdpOffload`]).
    pub fn udp_offload(mut self, o: UdpOffload) -> PortConfig {
        self.udp_offload = o;
        self
    }

    /// Describe IPv4 datagrams in the GRH area with IPv4-mapped GIDs in
    /// an IPv6-style header (see [`PortConfig::ipv4_grh_as_ipv6`]).
    pub fn ipv4_grh_as_ipv6(mut self, on: bool) -> PortConfig {
        self.ipv4_grh_as_ipv6 = on;
        self
    }

    /// Bind `n` send sockets for ECMP source ports (0: none).
    pub fn source_ports(mut self, n: u8) -> PortConfig {
        self.source_ports = n;
        self
    }

    /// Send to `port` instead of 4791.
    pub fn peer_udp_port(mut self, port: u16) -> PortConfig {
        self.peer_udp_port = port;
        self
    }

    /// Use `mtu` as the port's MTU.
    pub fn mtu(mut self, mtu: Mtu) -> PortConfig {
        self.mtu = mtu;
        self
    }
}

/// One device: its identity and ports (numbered from 1 in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name.
    pub name: String,
    /// Node GUID (what `Provider::open` takes).
    pub node_guid: u64,
    /// The ports.
    pub ports: Vec<PortConfig>,
    /// The QP number the device's first QP gets (the next ones count up
    /// from it, skipping 0, 1 and numbers in use). Default: a random
    /// point, so a device opened again does not hand out the QPNs of its
    /// predecessor. Set it to reproduce what a NIC restarted with the same
    /// GUID can do, reusing a QPN a peer still holds (stale connections).
    pub first_qpn: Option<u32>,
    /// The object counts and sizes the device advertises
    /// ([`DeviceAttr`](provider::DeviceAttr)) and enforces.
    pub limits: RoceLimits,
}

impl DeviceConfig {
    /// A device with these ports.
    pub fn new(name: impl Into<String>, node_guid: u64, ports: Vec<PortConfig>) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            node_guid,
            ports,
            first_qpn: None,
            limits: RoceLimits::default(),
        }
    }

    /// Sets [`DeviceConfig::limits`].
    pub fn limits(mut self, limits: RoceLimits) -> DeviceConfig {
        self.limits = limits;
        self
    }

    /// Sets [`DeviceConfig::first_qpn`] (only its low 24 bits count).
    pub fn first_qpn(mut self, qpn: u32) -> DeviceConfig {
        self.first_qpn = Some(qpn);
        self
    }
}

/// What a RoCEv2 device advertises in its
/// [`DeviceAttr`](provider::DeviceAttr) and enforces: creating one object
/// more than a `max_*` count allows fails with `InsufficientResources`
/// naming the limit (destroying one frees its place); a size above a
/// `max_*` size is `InvalidParameter`.
///
/// Nothing is allocated in proportion to a limit: an object costs memory
/// only while it exists, so the defaults are set for a server holding
/// many connections, not for a demo (`docs/roce-provider.md`, "Limits").
/// A value outside the range its field names fails the device's open
/// with `InvalidParameter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceLimits {
    /// QPs, GSI QPs included; at most [`RoceLimits::MAX_QP`] (QP numbers
    /// are 24 bits and 0 and 1 are the special QPs'). Default 2^20: a
    /// million connection ends, while at most 1/16 of the QP numbers are
    /// in use, so a new QP finds a free number at the first or second
    /// try and a number is not soon handed out again (a peer may still
    /// send to the old QP).
    pub max_qp: u32,
    /// Work requests per QP queue; at most [`RoceLimits::MAX_QP_WR`] (the
    /// transport's queue bound). Default 2^14.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request; at most
    /// [`RoceLimits::MAX_SGE`] (the transport's bound). Default 32.
    pub max_sge: u32,
    /// CQs. Default 2^20 (one per connection end, and room).
    pub max_cq: u32,
    /// Entries per CQ (a CQ allocates the capacity it is created with,
    /// not this). Default 2^22, what large NICs offer.
    pub max_cqe: u32,
    /// MRs; at most [`RoceLimits::MAX_MR`]: keys are random 32-bit
    /// numbers, and at most one in 256 in use keeps a guessed key
    /// unlikely to name an MR and a fresh key found at the first try.
    /// Default 2^20.
    pub max_mr: u32,
    /// PDs. Default 2^20.
    pub max_pd: u32,
    /// SRQs. Default 2^16.
    pub max_srq: u32,
    /// Work requests per SRQ. Default 2^16.
    pub max_srq_wr: u32,
    /// AVs. Default 2^20 (a UD peer each).
    pub max_av: u32,
}

impl RoceLimits {
    /// Largest `max_qp`: every 24-bit QP number but 0 and 1.
    pub const MAX_QP: u32 = (1 << 24) - 2;
    /// Largest `max_qp_wr`.
    pub const MAX_QP_WR: u32 = 1 << 16;
    /// Largest `max_sge`.
    pub const MAX_SGE: u32 = 64;
    /// Largest `max_mr`.
    pub const MAX_MR: u32 = 1 << 24;

    /// `InvalidParameter` naming the first field above its bound.
    pub(crate) fn check(&self) -> al::Result<()> {
        for (name, value, max) in [
            ("max_qp", self.max_qp, Self::MAX_QP),
            ("max_qp_wr", self.max_qp_wr, Self::MAX_QP_WR),
            ("max_sge", self.max_sge, Self::MAX_SGE),
            ("max_mr", self.max_mr, Self::MAX_MR),
        ] {
            if value > max {
                return Err(al::Error::invalid_parameter(format!(
                    "limits: {name} {value} is above {max}, the most a RoCEv2 device can have"
                )));
            }
        }
        Ok(())
    }
}

impl Default for RoceLimits {
    fn default() -> Self {
        RoceLimits {
            max_qp: 1 << 20,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cq: 1 << 20,
            max_cqe: 1 << 22,
            max_mr: 1 << 20,
            max_pd: 1 << 20,
            max_srq: 1 << 16,
            max_srq_wr: 1 << 16,
            max_av: 1 << 20,
        }
    }
}

/// The GID of an IP address (RoCEv2: the IPv4-mapped IPv6 address, or
/// the IPv6 address).
pub fn gid_of(ip: IpAddr) -> Gid {
    roce::gid_of(ip)
}

/// The IP address a GID names.
pub fn ip_of(gid: &Gid) -> IpAddr {
    roce::ip_of_gid(gid)
}

/// GID -> UDP socket address, for destinations that do not listen on
/// the default port (ports bound to UDP port 0, several ports on one
/// host). Shared by every device a provider opens.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    map: RwLock<al::fast_hash::IdMap<Gid, SocketAddr>>,
    /// Bumped by every change of `map` (under its write lock), so that a
    /// [`RouteCache`] knows when its answer may be stale.
    version: AtomicU64,
}

/// One QP's last [`Directory::resolve`] answer, reused while the directory
/// has not changed: a connected QP sends every packet to one GID, and the
/// lookup (a read lock and a hash) was on every packet's path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RouteCache {
    entry: Option<(Gid, u16, u64, SocketAddr)>,
}

impl Directory {
    pub(crate) fn set(&self, gid: Gid, addr: SocketAddr) {
        let mut m = self.map.write();
        m.insert(gid, addr);
        self.version.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn remove(&self, gid: &Gid, addr: SocketAddr) {
        let mut m = self.map.write();
        if m.get(gid) == Some(&addr) {
            m.remove(gid);
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// [`Directory::resolve`] through `cache`.
    pub(crate) fn resolve_cached(
        &self,
        cache: &mut RouteCache,
        gid: &Gid,
        default_port: u16,
    ) -> SocketAddr {
        let version = self.version.load(Ordering::Acquire);
        if let Some((g, p, v, addr)) = cache.entry {
            if v == version && p == default_port && g == *gid {
                return addr;
            }
        }
        // The version read before the lookup: a change racing it leaves
        // an older version in the cache, so the next call looks again.
        let addr = self.resolve(gid, default_port);
        cache.entry = Some((*gid, default_port, version, addr));
        addr
    }

    /// Where to send a datagram for `gid`: the directory's entry, else
    /// the GID's IP at `default_port`.
    pub(crate) fn resolve(&self, gid: &Gid, default_port: u16) -> SocketAddr {
        if let Some(a) = self.map.read().get(gid) {
            return *a;
        }
        SocketAddr::new(ip_of(gid), default_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_route_follows_every_directory_change() {
        let dir = Directory::default();
        let gid = gid_of("127.0.0.5".parse().unwrap());
        let other = gid_of("127.0.0.6".parse().unwrap());
        let mut cache = RouteCache::default();
        let default = "127.0.0.5:4791".parse().unwrap();
        assert_eq!(dir.resolve_cached(&mut cache, &gid, 4791), default);
        let moved: SocketAddr = "127.0.0.5:5000".parse().unwrap();
        dir.set(gid, moved);
        assert_eq!(dir.resolve_cached(&mut cache, &gid, 4791), moved);
        assert_eq!(
            dir.resolve_cached(&mut cache, &gid, 4000),
            moved,
            "another default port looks again (the entry still wins)"
        );
        assert_eq!(
            dir.resolve_cached(&mut cache, &other, 4791),
            "127.0.0.6:4791".parse().unwrap(),
            "another GID looks again"
        );
        dir.remove(&gid, moved);
        assert_eq!(dir.resolve_cached(&mut cache, &gid, 4791), default);
        dir.remove(&gid, moved); // no entry: no change
        assert_eq!(dir.resolve_cached(&mut cache, &gid, 4791), default);
    }
}
