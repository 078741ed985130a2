//! UD services by IP address and port, as rdma_cm's UDP port space has
//! them: [`resolve`] asks `ip:port` for its QP with a SIDR_REQ carrying
//! rdma_cm's header, and reports the QPN, the Q_Key and an address vector
//! to the service ([`IpResolved`]); a listener in [`PortSpace::Udp`]
//! (`super::listen`) reads each SIDR_REQ's addresses with
//! [`sidr_request_info`] and answers with [`sidr_accept`].
//!
//! Every UD QP of that port space uses one Q_Key, [`RDMA_UDP_QKEY`]:
//! [`ready_ud`] gives it to a QP (rdma_cm does so when it creates a UD
//! QP), [`sidr_accept`] answers with the QP's, and a resolve refuses a
//! reply with another one, as rdma_cm does.

use al::sync::Arc;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

use al::{AlInstance, Error, Handle, Result};
use hca::verbs::Ca;
use provider::{AvAttr, GrhAttr, QpModify, QpState, QpType};
use qp::Qp;

use super::{header_info, header_to, port_address, IpRequestInfo, LAN_TIMERS};
use crate::cm::{self, Cep, CmHandler};
use crate::keyed::starting_psn;
use crate::proto::{Event, PeerAddr, SidrParams, SidrReplyParams};
use crate::wire::ip_cm::{self, PortSpace, RDMA_UDP_QKEY};
use crate::wire::{PrivateData, SidrRep, SidrReq, SidrStatus};

/// A request to resolve the UD service at an IP address and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpResolve {
    /// The service's IP address and rdma_cm port.
    pub remote: SocketAddr,
    /// The port space of the service (UDP, as rdma_cm's UD ids).
    pub space: PortSpace,
    /// Our rdma_cm port in the header; 0: an ephemeral one
    /// (0xC000..=0xFFFF), drawn per request.
    pub source_port: u16,
    /// The Q_Key the service must answer with (`None`: any). In the UDP
    /// port space [`RDMA_UDP_QKEY`], else `None`.
    pub qkey: Option<u32>,
    /// How long the service may take to answer (CM timeout encoding:
    /// 4.096 us x 2^value).
    pub timeout: u8,
    /// SIDR_REQ retries before the resolve times out.
    pub max_retries: u8,
    /// The application's private data after the header (at most
    /// [`ip_cm::MAX_SIDR_REQ_USER_DATA`] bytes).
    pub private_data: Vec<u8>,
}

/// The Q_Key a service in `space` answers with, if rdma_cm fixes one.
fn space_qkey(space: PortSpace) -> Option<u32> {
    (space == PortSpace::Udp).then_some(RDMA_UDP_QKEY)
}

impl IpResolve {
    /// A resolve of `remote` in the UDP port space, expecting
    /// [`RDMA_UDP_QKEY`], with the LAN timers' response timeout and
    /// retries ([`LAN_TIMERS`]: a dead service is reported in ~0.3 s).
    ///
    /// ```
    /// use cep::ip::{IpResolve, RDMA_UDP_QKEY};
    /// use cep::wire::ip_cm::PortSpace;
    /// let r = IpResolve::new("10.0.0.2:4000".parse().unwrap()).private_data(b"hi");
    /// assert_eq!((r.space, r.qkey), (PortSpace::Udp, Some(RDMA_UDP_QKEY)));
    /// ```
    pub fn new(remote: SocketAddr) -> Self {
        IpResolve {
            remote,
            space: PortSpace::Udp,
            source_port: 0,
            qkey: space_qkey(PortSpace::Udp),
            timeout: LAN_TIMERS.cm_response_timeout,
            max_retries: LAN_TIMERS.max_cm_retries,
            private_data: Vec::new(),
        }
    }
    /// The port space; the expected Q_Key becomes that space's
    /// ([`RDMA_UDP_QKEY`] for UDP, any for the others): call
    /// [`IpResolve::qkey`] after it to change it.
    pub fn space(mut self, space: PortSpace) -> Self {
        self.space = space;
        self.qkey = space_qkey(space);
        self
    }
    /// Our rdma_cm source port (0: ephemeral).
    pub fn source_port(mut self, port: u16) -> Self {
        self.source_port = port;
        self
    }
    /// The Q_Key the service must answer with (`None`: any).
    pub fn qkey(mut self, qkey: Option<u32>) -> Self {
        self.qkey = qkey;
        self
    }
    /// Response timeout (CM encoding) and retries.
    pub fn timeouts(mut self, timeout: u8, max_retries: u8) -> Self {
        self.timeout = timeout;
        self.max_retries = max_retries;
        self
    }
    /// The application's private data.
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }

    /// The SIDR_REQ this becomes from a port whose address is `local`:
    /// the rdma_cm service id of the remote port, the remote GID, and
    /// rdma_cm's header (`local`, our source port, the remote address)
    /// before the private data.
    ///
    /// ```
    /// use cep::ip::{sidr_request_info, IpResolve};
    /// use cep::wire::ip_cm::{self, PortSpace};
    /// use cep::wire::SidrReq;
    /// let r = IpResolve::new("10.0.0.2:4000".parse().unwrap()).source_port(50_000);
    /// let p = r.to_sidr_params("10.0.0.1".parse().unwrap())?;
    /// assert_eq!(p.service_id, ip_cm::service_id(PortSpace::Udp, 4000));
    /// let req = SidrReq { service_id: p.service_id, private_data: p.private_data, ..SidrReq::default() };
    /// let info = sidr_request_info(&req)?;
    /// assert_eq!(info.source, "10.0.0.1:50000".parse().unwrap());
    /// assert_eq!(info.destination, r.remote);
    /// # Ok::<(), al::Error>(())
    /// ```
    pub fn to_sidr_params(&self, local: IpAddr) -> Result<SidrParams> {
        let src_port = match self.source_port {
            // An ephemeral port, as rdma_cm binds an unbound id: random,
            // so two resolvers of one host rarely share one.
            0 => 0xC000 | (starting_psn() as u16 & 0x3fff),
            p => p,
        };
        let header = header_to(self.remote, local, src_port)?;
        let remote_ip = header.dst;
        let private_data = header
            .private_data::<{ ip_cm::SIDR_REQ_PRIVATE_DATA_LEN }>(&self.private_data)
            .map_err(Error::from)?;
        let peer = PeerAddr {
            lid: 0,
            gid: ip_cm::gid_of(remote_ip),
        };
        Ok(SidrParams {
            timeout: self.timeout,
            max_retries: self.max_retries,
            private_data,
            ..SidrParams::new(ip_cm::service_id(self.space, self.remote.port()), peer)
        })
    }

    /// What a SIDR_REP to this request says, for a requester on `port`:
    /// the service's QP, Q_Key and an address vector to it by GID. A
    /// status other than success is an error (`NotFound` when nobody
    /// listens on the port, `RemoteError` otherwise), and so is a Q_Key
    /// other than [`IpResolve::qkey`] (`RemoteError`).
    ///
    /// ```
    /// use cep::ip::{IpResolve, RDMA_UDP_QKEY};
    /// use cep::wire::{SidrRep, SidrStatus};
    /// let r = IpResolve::new("10.0.0.2:4000".parse().unwrap());
    /// let rep = SidrRep { qpn: 0x48, qkey: RDMA_UDP_QKEY, ..SidrRep::default() };
    /// let found = r.reply(&rep, 1)?;
    /// assert_eq!((found.qpn, found.qkey, found.av.port), (0x48, RDMA_UDP_QKEY, 1));
    /// let wrong = SidrRep { qkey: 0x1111, ..rep };
    /// assert!(r.reply(&wrong, 1).is_err());
    /// # Ok::<(), al::Error>(())
    /// ```
    pub fn reply(&self, rep: &SidrRep, port: u8) -> Result<IpResolved> {
        if rep.status != SidrStatus::Success {
            let why = format!("{}: SIDR_REP status {:?}", self.remote, rep.status);
            return Err(if rep.status == SidrStatus::ServiceIdNotSupported {
                Error::NotFound(format!("{why} (nobody listens there)").into())
            } else {
                Error::RemoteError(why.into())
            });
        }
        if let Some(want) = self.qkey.filter(|&q| q != rep.qkey) {
            return Err(Error::RemoteError(
                format!(
                    "{} answered Q_Key {:#x}; the {:?} port space uses {want:#x}",
                    self.remote, rep.qkey, self.space
                )
                .into(),
            ));
        }
        let mut av = AvAttr::lid(port, 0);
        av.grh = Some(GrhAttr {
            dgid: ip_cm::gid_of(self.remote.ip()),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        });
        Ok(IpResolved {
            remote: self.remote,
            qpn: rep.qpn & 0xff_ffff,
            qkey: rep.qkey,
            av,
            private_data: rep.private_data.as_bytes().to_vec(),
        })
    }
}

/// A resolved UD service: where to send its datagrams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpResolved {
    /// The address and port that was resolved.
    pub remote: SocketAddr,
    /// The service's UD QP number (a send's `remote_qpn`).
    pub qpn: u32,
    /// Its Q_Key (a send's `remote_qkey`).
    pub qkey: u32,
    /// An address vector to it (a GRH to its GID, from the requesting
    /// port): create it in the sending QP's PD.
    pub av: AvAttr,
    /// The SIDR_REP's private data (fixed-size: zero padding included).
    pub private_data: Vec<u8>,
}

/// Called once with the outcome of [`resolve`], on the AL executor.
pub type ResolveHandler = std::sync::Arc<dyn Fn(Result<IpResolved>) + Send + Sync>;

/// Resolves the UD service at `request.remote` from port `port` of `ca`
/// (whose address is the header's source): a SIDR_REQ with rdma_cm's
/// header, resent as [`IpResolve::timeouts`] say. `on_result` gets the
/// service ([`IpResolve::reply`]) or the error (`Timeout` when nobody
/// answered) exactly once; the returned SIDR CEP goes by itself after.
/// Destroying it first cancels the resolve (`Canceled`).
pub fn resolve(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    port: u8,
    request: &IpResolve,
    on_result: ResolveHandler,
) -> Result<Handle<Cep>> {
    let local = {
        let ca = al.resolve(ca)?;
        ca.device().check_own_qp1()?;
        port_address(&ca, port)?
    };
    let params = request.to_sidr_params(local)?;
    let request = request.clone();
    // Identity of the one call, not synchronisation: a std atomic even
    // under loom.
    let done = AtomicBool::new(false);
    let handler: CmHandler = std::sync::Arc::new(move |_cep, ev| {
        let outcome = match ev {
            Event::SidrReply { rep, .. } => request.reply(rep, port),
            Event::Timeout { .. } => Err(Error::Timeout(
                format!("no SIDR_REP from {}", request.remote).into(),
            )),
            Event::Released { .. } => Err(Error::Canceled(
                format!("the resolve of {} ended unanswered", request.remote).into(),
            )),
            _ => return,
        };
        if !done.swap(true, Ordering::AcqRel) {
            on_result(outcome);
        }
    });
    cm::sidr_request(al, ca, params, port, handler)
}

/// Reads the rdma_cm addressing of a received SIDR_REQ (the SIDR
/// counterpart of [`super::request_info`]): its service id must be an
/// rdma_cm one and its private data must start with the header. The
/// user data is the rest of the private data, zero padding included.
///
/// ```
/// use cep::ip::sidr_request_info;
/// use cep::wire::SidrReq;
/// // Not rdma_cm's: no header in the private data.
/// let req = SidrReq { service_id: 0x0111_0fa0, ..SidrReq::default() };
/// assert!(sidr_request_info(&req).is_err());
/// ```
pub fn sidr_request_info(req: &SidrReq) -> Result<IpRequestInfo> {
    header_info(req.service_id, req.private_data.as_bytes())
}

impl IpRequestInfo {
    /// [`sidr_request_info`] as a constructor, for handlers that import
    /// only the type.
    ///
    /// ```
    /// use cep::ip::{IpRequestInfo, IpResolve};
    /// use cep::wire::SidrReq;
    /// let p = IpResolve::new("[fe80::2]:9".parse().unwrap()).to_sidr_params("fe80::1".parse().unwrap())?;
    /// let req = SidrReq { service_id: p.service_id, private_data: p.private_data, ..SidrReq::default() };
    /// assert_eq!(IpRequestInfo::from_sidr_req(&req)?.source.ip().to_string(), "fe80::1");
    /// # Ok::<(), al::Error>(())
    /// ```
    pub fn from_sidr_req(req: &SidrReq) -> Result<IpRequestInfo> {
        sidr_request_info(req)
    }
}

/// Answers a SIDR request with `qp`, a UD QP past RESET: success, its QPN
/// and its Q_Key (which [`ready_ud`] makes [`RDMA_UDP_QKEY`]), and
/// `private_data` (at most 136 bytes).
pub fn sidr_accept(
    al: &Arc<AlInstance>,
    cep: Handle<Cep>,
    qp: Handle<Qp>,
    private_data: &[u8],
) -> Result<()> {
    let attr = qp::query_qp(al, qp)?;
    if attr.qp_type != QpType::Ud {
        return Err(Error::invalid_parameter(format!(
            "a SIDR reply names a UD QP, not a {:?} one",
            attr.qp_type
        )));
    }
    if matches!(attr.state, QpState::Reset | QpState::Err) {
        return Err(Error::InvalidState(
            format!(
                "QP {:#x} is in {:?}: it has no Q_Key to answer with (ready_ud)",
                attr.qpn, attr.state
            )
            .into(),
        ));
    }
    let reply = SidrReplyParams {
        status: SidrStatus::Success,
        qpn: attr.qpn,
        qkey: attr.qkey,
        private_data: PrivateData::new(private_data)?,
        ..SidrReplyParams::default()
    };
    cm::sidr_reply(al, cep, reply)
}

/// Makes a UD QP ready to send and receive in rdma_cm's UDP port space,
/// as `rdma_create_qp` does for a UD id: RTS on `port` with P_Key index 0
/// and [`RDMA_UDP_QKEY`], from RESET or INIT (a QP already in RTS with
/// that Q_Key is left as it is).
pub fn ready_ud(al: &Arc<AlInstance>, qp: Handle<Qp>, port: u8) -> Result<()> {
    let attr = qp::query_qp(al, qp)?;
    if attr.qp_type != QpType::Ud {
        return Err(Error::invalid_parameter(format!(
            "ready_ud takes a UD QP, not a {:?} one",
            attr.qp_type
        )));
    }
    if attr.state == QpState::Rts && attr.qkey == RDMA_UDP_QKEY && attr.port == port {
        return Ok(());
    }
    let init = QpModify::to(QpState::Init)
        .pkey_index(0)
        .port(port)
        .qkey(RDMA_UDP_QKEY);
    match attr.state {
        QpState::Reset | QpState::Init => qp::modify_qp(al, qp, &init)?,
        state => {
            return Err(Error::InvalidState(
                format!("ready_ud takes a QP in RESET or INIT, not {state:?}").into(),
            ))
        }
    }
    qp::modify_qp(al, qp, &QpModify::to(QpState::Rtr))?;
    qp::modify_qp(al, qp, &QpModify::to(QpState::Rts).sq_psn(0))
}
