//! Connections addressed by IP address and port, as rdma_cm users write
//! them, on top of the CEPs of [`crate::cm`].
//!
//! A RoCE port's GID is its IP address ([`ip_cm::gid_of`]), so an IP
//! address names a port of an open CA ([`port_of`]) and a destination GID.
//! A listener on `ip:port` listens for the rdma_cm service id of `port` in
//! its port space ([`ip_cm::service_id`]; TCP by default); a connect to
//! `ip:port` sends a REQ for that service id whose private data starts with
//! rdma_cm's header ([`ip_cm::IpCmHeader`]: our address and port, the
//! destination address), the application's private data after it. So a
//! Linux rdma_cm listener accepts our REQs, and our listener reads theirs
//! ([`request_info`]).
//!
//! Everything else is the CEP API unchanged: the returned CEP is a handle
//! in the AL's table with the same events, callbacks, CID slot binding,
//! non-blocking destroy and AL-close reclaim as any other. The event
//! handler of a listener gets [`crate::proto::Event::ConnectRequest`] with
//! the REQ; [`request_info`] turns it into addresses and user data, and
//! the application answers with [`crate::cm::accept`] or
//! [`crate::cm::reject`].
//!
//! Timers: [`IpConnect::new`] starts from [`LAN_TIMERS`], values for an
//! Ethernet LAN (`docs/cm.md`, "Addressing by IP"), each one settable.
//!
//! UD services by IP address and port (rdma_cm's UDP port space, SIDR
//! with rdma_cm's header; [`resolve`], [`sidr_request_info`],
//! [`sidr_accept`], [`ready_ud`], [`RDMA_UDP_QKEY`]) are in `sidr.rs`
//! (`docs/cm.md`, "UD services by IP").

use al::sync::Arc;
use std::net::{IpAddr, SocketAddr};

use al::{AlInstance, Error, Handle, Result};
use hca::verbs::Ca;
use provider::Mtu;
use qp::Qp;

use crate::cm::{self, Cep, CmHandler, ConnectRequest, Listen, ListenHandler};
use crate::wire::ip_cm::{self, IpCmHeader, PortSpace};
use crate::wire::Req;

mod sidr;
pub use crate::wire::ip_cm::RDMA_UDP_QKEY;
pub use sidr::{
    ready_ud, resolve, sidr_accept, sidr_request_info, IpResolve, IpResolved, ResolveHandler,
};

/// CM and transport timers of a connection (each in the IBTA encoding:
/// 4.096 us x 2^value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// How long the peer may take to answer a REQ or REP before it is sent
    /// again (CM response timeout).
    pub cm_response_timeout: u8,
    /// REQ (and REP) retries before the connection times out.
    pub max_cm_retries: u8,
    /// The QP's local ACK timeout (retransmission of unacknowledged
    /// packets); also the REQ's packet lifetime estimate.
    pub local_ack_timeout: u8,
    /// Transport retries (at most 7).
    pub retry_count: u8,
    /// RNR retries the peer uses toward us (7 = forever).
    pub rnr_retry_count: u8,
}

/// Timers for an Ethernet LAN.
///
/// Linux's CM on RoCE asks for a 4.3 s CM response timeout (2^20) and 15
/// retries, so an unreachable peer is reported after about a minute; on a
/// LAN a round trip is tens of microseconds and a busy host answers within
/// milliseconds. 2^13 (33.6 ms) with 8 retries reports a dead peer in about
/// 0.3 s and still covers a peer that is scheduled out for tens of
/// milliseconds; 2^14 (67 ms) for the local ACK timeout keeps spurious
/// retransmissions away on a loaded host while losing only 67 ms per real
/// loss.
pub const LAN_TIMERS: Timers = Timers {
    cm_response_timeout: 13,
    max_cm_retries: 8,
    local_ack_timeout: 14,
    retry_count: 7,
    rnr_retry_count: 7,
};

/// A connection request to an IP address and port.
#[derive(Clone, Debug)]
pub struct IpConnect {
    /// Where to connect: the peer's IP address and rdma_cm port.
    pub remote: SocketAddr,
    /// The port space of the service (TCP for RC, as rdma_cm).
    pub space: PortSpace,
    /// Our rdma_cm port in the header (the peer sees it as our source
    /// port); 0: derived from the QPN, as an ephemeral port.
    pub source_port: u16,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDMA READ/atomic requests accepted from the peer, and outstanding
    /// at it.
    pub rdma_depth: (u8, u8),
    /// CM and transport timers.
    pub timers: Timers,
    /// The application's private data (after rdma_cm's header: at most
    /// [`ip_cm::MAX_REQ_USER_DATA`] bytes).
    pub private_data: Vec<u8>,
}

impl IpConnect {
    /// A request to `remote` in the TCP port space, MTU 1024 (the RoCE
    /// MTU of a 1500-byte Ethernet), LAN timers, no private data.
    pub fn new(remote: SocketAddr) -> Self {
        IpConnect {
            remote,
            space: PortSpace::Tcp,
            source_port: 0,
            path_mtu: Mtu::Mtu1024,
            rdma_depth: (4, 4),
            timers: LAN_TIMERS,
            private_data: Vec::new(),
        }
    }
    /// The port space.
    pub fn space(mut self, space: PortSpace) -> Self {
        self.space = space;
        self
    }
    /// Our rdma_cm source port.
    pub fn source_port(mut self, port: u16) -> Self {
        self.source_port = port;
        self
    }
    /// Path MTU.
    pub fn path_mtu(mut self, mtu: Mtu) -> Self {
        self.path_mtu = mtu;
        self
    }
    /// RDMA READ/atomic depths (responder resources, initiator depth).
    pub fn rdma_depth(mut self, responder_resources: u8, initiator_depth: u8) -> Self {
        self.rdma_depth = (responder_resources, initiator_depth);
        self
    }
    /// CM and transport timers.
    pub fn timers(mut self, timers: Timers) -> Self {
        self.timers = timers;
        self
    }
    /// The application's private data.
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }

    /// The CM request this becomes for a QP with number `qpn` on a port
    /// whose address is `local`.
    pub fn to_request(&self, local: IpAddr, port: u8, qpn: u32) -> Result<ConnectRequest> {
        let source_port = match self.source_port {
            // rdma_cm binds an unbound id to an ephemeral port; the QPN
            // varies it per connection the same way.
            0 => 0xC000 | (qpn as u16 & 0x3fff),
            p => p,
        };
        let header = header_to(self.remote, local, source_port)?;
        let remote_ip = header.dst;
        let private = header
            .private_data::<{ ip_cm::REQ_PRIVATE_DATA_LEN }>(&self.private_data)
            .map_err(Error::from)?;
        let t = self.timers;
        Ok(
            ConnectRequest::new(ip_cm::service_id(self.space, self.remote.port()), 0)
                .port(port)
                .remote_gid(ip_cm::gid_of(remote_ip))
                .path_mtu(self.path_mtu)
                .rdma_depth(self.rdma_depth.0, self.rdma_depth.1)
                .retries(t.retry_count, t.rnr_retry_count)
                .cm_timeouts(t.cm_response_timeout, t.max_cm_retries)
                .local_ack_timeout(t.local_ack_timeout)
                .private_data(private.as_bytes()),
        )
    }
}

/// rdma_cm's header from `local` (UDP port `src_port`) to `remote`, both
/// addresses canonical (an IPv4-mapped IPv6 address as IPv4); refused when
/// the two are not of one IP version. Connect and resolve build it alike.
fn header_to(remote: SocketAddr, local: IpAddr, src_port: u16) -> Result<IpCmHeader> {
    let dst = remote.ip().to_canonical();
    let src = local.to_canonical();
    if dst.is_ipv4() != src.is_ipv4() {
        return Err(Error::invalid_parameter(format!(
            "{remote} cannot be reached from {src}: not the same IP version"
        )));
    }
    Ok(IpCmHeader { src, src_port, dst })
}

/// The port of `ca` whose GID is `ip` (RoCE: a port's GID 0 is its
/// address). An unspecified address (0.0.0.0, ::) names port 1.
pub fn port_of(al: &AlInstance, ca: Handle<Ca>, ip: IpAddr) -> Result<u8> {
    let ca_obj = al.resolve(ca)?;
    let ports = ca_obj.attr().num_ports;
    if ip.is_unspecified() {
        return if ports >= 1 {
            Ok(1)
        } else {
            Err(Error::invalid_parameter("the CA has no port"))
        };
    }
    let gid = ip_cm::gid_of(ip);
    for n in 1..=ports {
        if ca_obj.port(n)?.gid_table.first() == Some(&gid) {
            return Ok(n);
        }
    }
    Err(Error::invalid_parameter(format!(
        "no port of this CA has the address {ip} (a RoCEv2 port's GID 0 is its address)"
    )))
}

/// The IP address of `ca`'s port `port` (its GID 0).
pub fn address_of(al: &AlInstance, ca: Handle<Ca>, port: u8) -> Result<IpAddr> {
    let ca = al.resolve(ca)?;
    port_address(&ca, port)
}

fn port_address(ca: &al::Obj<Ca>, port: u8) -> Result<IpAddr> {
    let attr = ca.port(port)?;
    let gid = attr
        .gid_table
        .first()
        .copied()
        .ok_or_else(|| Error::invalid_parameter(format!("port {port} has no GID")))?;
    Ok(ip_cm::ip_of_gid(gid))
}

/// Connects `qp` (RC or UC) to `request.remote`: a REQ for the rdma_cm
/// service id with rdma_cm's header in its private data, from the QP's
/// port `port` (whose address is the header's source). Events go to
/// `handler` as for [`cm::connect`]; answer the reply with [`cm::rtu`].
pub fn connect(
    al: &Arc<AlInstance>,
    qp: Handle<Qp>,
    port: u8,
    request: &IpConnect,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    let (local, qpn) = {
        let q = al.resolve(qp)?;
        q.pd().ca().device().check_own_qp1()?;
        (port_address(q.pd().ca(), port)?, q.qpn())
    };
    cm::connect(al, qp, &request.to_request(local, port, qpn)?, handler)
}

/// Listens on `addr` (an address of one of `ca`'s ports, or unspecified
/// for port 1) for connection requests in port space `space`. Requests go
/// to `on_request` ([`request_info`] reads their addresses), the accepted
/// connections' events to `handler`, as for [`cm::listen`].
pub fn listen(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    addr: SocketAddr,
    space: PortSpace,
    on_request: ListenHandler,
    handler: CmHandler,
) -> Result<Handle<Listen>> {
    al.resolve(ca)?.device().check_own_qp1()?;
    let port = port_of(al, ca, addr.ip())?;
    cm::listen(
        al,
        ca,
        port,
        ip_cm::service_id(space, addr.port()),
        on_request,
        handler,
    )
}

/// What an rdma_cm-style REQ or SIDR_REQ says about its sender and the
/// service it asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpRequestInfo {
    /// The active side's address and rdma_cm port.
    pub source: SocketAddr,
    /// The address and port it asked for (ours).
    pub destination: SocketAddr,
    /// The port space of the service id.
    pub space: PortSpace,
    /// The application's private data after the header (the REQ's
    /// private data is fixed-size: zero padding included).
    pub user_data: Vec<u8>,
}

/// Reads the rdma_cm addressing of a received REQ: its service id must be
/// an rdma_cm one and its private data must start with the header.
pub fn request_info(req: &Req) -> Result<IpRequestInfo> {
    header_info(req.service_id, req.private_data.as_bytes())
}

/// The rdma_cm addressing of a REQ or SIDR_REQ: its service id and the
/// header at the start of its private data.
fn header_info(service_id: u64, private_data: &[u8]) -> Result<IpRequestInfo> {
    let (space, port) = ip_cm::parse_service_id(service_id).ok_or_else(|| {
        Error::invalid_parameter(format!(
            "service id {service_id:#x} is not an rdma_cm IP service id"
        ))
    })?;
    let (header, user) = IpCmHeader::decode(private_data).map_err(Error::from)?;
    Ok(IpRequestInfo {
        source: header.src_socket(),
        destination: SocketAddr::new(header.dst, port),
        space,
        user_data: user.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn a_request_carries_the_service_id_the_header_and_the_user_data() {
        let remote: SocketAddr = "10.0.0.2:7174".parse().unwrap();
        let r = IpConnect::new(remote)
            .private_data(b"user bytes")
            .to_request(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1, 0x12)
            .unwrap();
        assert_eq!(r.service_id, 0x0106_1C06);
        assert_eq!(r.remote_gid, Some(ip_cm::gid_of(remote.ip())));
        assert_eq!(r.cm_response_timeout, LAN_TIMERS.cm_response_timeout);
        assert_eq!(r.max_cm_retries, LAN_TIMERS.max_cm_retries);
        let req = Req {
            service_id: r.service_id,
            private_data: crate::wire::PrivateData::new(&r.private_data).unwrap(),
            ..Req::default()
        };
        let info = request_info(&req).unwrap();
        assert_eq!(info.source, "10.0.0.1:49170".parse().unwrap());
        assert_eq!(info.destination, remote);
        assert_eq!(info.space, PortSpace::Tcp);
        assert_eq!(&info.user_data[..10], b"user bytes");
        assert_eq!(info.user_data.len(), ip_cm::MAX_REQ_USER_DATA);
    }

    #[test]
    fn mixed_ip_versions_too_much_data_and_foreign_service_ids_are_refused() {
        let v6: SocketAddr = "[fe80::1]:1".parse().unwrap();
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(IpConnect::new(v6).to_request(local, 1, 1).is_err());
        let long = vec![0u8; ip_cm::MAX_REQ_USER_DATA + 1];
        let v4: SocketAddr = "127.0.0.2:1".parse().unwrap();
        assert!(IpConnect::new(v4)
            .private_data(&long)
            .to_request(local, 1, 1)
            .is_err());
        // An IPv4-mapped local address is the IPv4 address.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(IpConnect::new(v4).to_request(mapped, 1, 1).is_ok());
        let foreign = Req {
            service_id: 0x1ba1_0001_0000_0000,
            ..Req::default()
        };
        assert!(request_info(&foreign).is_err());
        let no_header = Req {
            service_id: ip_cm::service_id(PortSpace::Tcp, 1),
            private_data: crate::wire::PrivateData::new(&[0x77; 40]).unwrap(),
            ..Req::default()
        };
        assert!(request_info(&no_header).is_err());
    }
}
