//! The active side: [`ConnectRequest`] (what a REQ asks for), [`connect`]
//! on a QP (bound through its CID slot) and [`connect_unbound`] (CM-only),
//! building the REQ from the request and the port, and sending it with the
//! new CEP's route published first.

use al::sync::{Arc, Mutex};
use al::{create, AlInstance, Error, Handle, Obj, Result};
use hca::verbs::Ca;
use provider::Access;
use provider::Mtu;
use qp::cid as binding;
use qp::Qp;

use super::attrs::{check_init_port, qp_to_init, spec_bounded, LocalQpAttrs};
use super::dispatch::use_port;
use super::objects::{bind_error, cep_destroyed, destroy_cep, Cep, CepState, CmHandler};
use super::port::PortUse;
use super::routes::Route;
use crate::proto::{ConnId, ConnectParams, PeerAddr};
use crate::wire::{PathInfo, PrivateData, Req};

/// What [`connect`] sends.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    /// The service to connect to.
    pub service_id: u64,
    /// The local port.
    pub port: u8,
    /// The remote port's LID.
    pub remote_lid: u16,
    /// The remote port's GID, when routing by GID.
    pub remote_gid: Option<[u8; 16]>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDMA READ/atomic requests we accept from the peer.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries the peer should use towards us (7 = forever).
    pub rnr_retry_count: u8,
    /// CM response timeout (4.096 us x 2^t) for both sides.
    pub cm_response_timeout: u8,
    /// REQ retries.
    pub max_cm_retries: u8,
    /// Local ACK timeout (also the PacketLifeTime estimate).
    pub local_ack_timeout: u8,
    /// Access rights the QP grants the peer.
    pub access: Access,
    /// Up to 92 bytes.
    pub private_data: Vec<u8>,
    /// GRH of the path when routing by GID: flow label (20 bits).
    pub flow_label: u32,
    /// GRH traffic class (RoCEv2: the IP header's DSCP and ECN byte).
    pub traffic_class: u8,
    /// GRH hop limit (RoCEv2: the IP TTL).
    pub hop_limit: u8,
}

impl ConnectRequest {
    /// A request with sensible defaults for `service_id` at `remote_lid`.
    pub fn new(service_id: u64, remote_lid: u16) -> Self {
        ConnectRequest {
            service_id,
            port: 1,
            remote_lid,
            remote_gid: None,
            path_mtu: Mtu::Mtu4096,
            responder_resources: 4,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
            cm_response_timeout: 16,
            max_cm_retries: 4,
            local_ack_timeout: 14,
            access: Access::LOCAL_WRITE
                .union(Access::REMOTE_WRITE)
                .union(Access::REMOTE_READ)
                .union(Access::REMOTE_ATOMIC),
            private_data: Vec::new(),
            flow_label: 0,
            traffic_class: 0,
            // Linux's IPv4 default TTL, and what its CM puts in a RoCE path.
            hop_limit: 64,
        }
    }
}

/// Builder-style setters: `ConnectRequest::new(service, lid).port(2)
/// .private_data(b"hi")`. Values the IBTA bounds are checked by
/// [`connect`], which refuses them (never masks).
impl ConnectRequest {
    /// The local port.
    pub fn port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }
    /// Route by GID to `gid`.
    pub fn remote_gid(mut self, gid: [u8; 16]) -> Self {
        self.remote_gid = Some(gid);
        self
    }
    /// Path MTU.
    pub fn path_mtu(mut self, mtu: Mtu) -> Self {
        self.path_mtu = mtu;
        self
    }
    /// RDMA READ/atomic requests accepted from the peer, and outstanding
    /// at it.
    pub fn rdma_depth(mut self, responder_resources: u8, initiator_depth: u8) -> Self {
        self.responder_resources = responder_resources;
        self.initiator_depth = initiator_depth;
        self
    }
    /// Transport retries and RNR retries (7 = forever); at most 7 each.
    pub fn retries(mut self, retry_count: u8, rnr_retry_count: u8) -> Self {
        self.retry_count = retry_count;
        self.rnr_retry_count = rnr_retry_count;
        self
    }
    /// CM response timeout (at most 31) and REQ retries (at most 15).
    pub fn cm_timeouts(mut self, cm_response_timeout: u8, max_cm_retries: u8) -> Self {
        self.cm_response_timeout = cm_response_timeout;
        self.max_cm_retries = max_cm_retries;
        self
    }
    /// Local ACK timeout (at most 31).
    pub fn local_ack_timeout(mut self, timeout: u8) -> Self {
        self.local_ack_timeout = timeout;
        self
    }
    /// Access rights the QP grants the peer.
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }
    /// Private data of the REQ (up to 92 bytes).
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }
    /// The GRH fields of a GID-routed path: flow label (20 bits), traffic
    /// class, hop limit. The REQ carries them and both QPs use them.
    pub fn grh(mut self, flow_label: u32, traffic_class: u8, hop_limit: u8) -> Self {
        self.flow_label = flow_label;
        self.traffic_class = traffic_class;
        self.hop_limit = hop_limit;
        self
    }
}

/// Connect `qp` (RC or UC): send a REQ and return the new CEP. Its events
/// (reply, reject, timeout, ...) go to `handler`; on the reply, call [`rtu`].
///
/// The QP may be new (RESET) or readied by [`ready_for_connection`] (INIT
/// on `request.port`, receives posted): it is taken INIT -> RTR -> RTS
/// without passing through RESET, so its receives take the peer's first
/// SENDs. An INIT QP on another port is refused (`InvalidParameter`)
/// before a CEP exists. A REJ or timeout takes the QP to ERR, where its
/// receives flush.
///
/// [`rtu`]: super::rtu
/// [`ready_for_connection`]: super::ready_for_connection
pub fn connect(
    al: &Arc<AlInstance>,
    qp: Handle<Qp>,
    request: &ConnectRequest,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    // The reference is taken before the CEP id is published, and held for
    // the whole call.
    let qp = al.resolve_live(qp)?;
    let local = LocalQpAttrs::of(&qp, "connect")?;
    // Before a CEP exists: a QP readied on another port is refused here.
    check_init_port(&qp.query()?, request.port)?;
    let port_use = use_port(qp.pd().ca(), request.port, None)?;
    let (req, peer) = build_req(request, &local, &port_use)?;
    let cep = new_active_cep(al, port_use, handler, request.port, false)?;
    let h = cep.handle();
    binding::bind_and_start(
        qp.cid(),
        h.raw(),
        || {
            qp_to_init(&qp, request.port, request.access)?;
            start_active(&cep, h, req, peer, Some(qp.clone()))
        },
        destroy_cep,
    )
    .map_err(|e| bind_error(&qp, e))?;
    Ok(h)
}

/// A CM-only connect: send a REQ for a QP the caller owns (`local` says
/// what the REQ carries from it) from `request.port` of `ca`, and return
/// the new CEP, bound to no QP. Its events go to `handler` as for
/// [`connect`]; on [`Event::ReplyReceived`] move the QP with
/// [`connection_attrs`] (`init`, `rtr`, `rts`), then call [`rtu`].
///
/// Everything after the send is the bound CEP's code: RTU, reject, MRA,
/// disconnect, events, destroy (its REJ or DREQ), AL close. The CEP never
/// touches the caller's QP: on `Rejected`, `Timeout`, `DisconnectRequest`,
/// `Disconnected` and `StaleConnection`, and when it destroys the CEP, the
/// caller moves its QP to ERR itself (`docs/cm.md`, "CM-only CEPs").
///
/// [`Event::ReplyReceived`]: crate::proto::Event::ReplyReceived
/// [`connection_attrs`]: super::connection_attrs
/// [`rtu`]: super::rtu
pub fn connect_unbound(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    request: &ConnectRequest,
    local: &LocalQpAttrs,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    let local = local.checked("connect_unbound")?;
    let ca = al.resolve_live(ca)?;
    let port_use = use_port(&ca, request.port, None)?;
    let (req, peer) = build_req(request, &local, &port_use)?;
    let cep = new_active_cep(al, port_use, handler, request.port, true)?;
    let h = cep.handle();
    // As a bound connect whose bind cannot be lost: a start that fails (the
    // CEP closed by AL close, the agent refusing) destroys the CEP.
    match start_active(&cep, h, req, peer, None) {
        Ok(()) => Ok(h),
        Err(e) => {
            destroy_cep(h.raw());
            Err(e)
        }
    }
}

/// A flow label fits 20 bits: refused otherwise (never masked).
fn bounded_flow_label(label: u32) -> Result<u32> {
    if label > 0xF_FFFF {
        return Err(Error::invalid_parameter(format!(
            "flow_label {label:#x} does not fit 20 bits"
        )));
    }
    Ok(label)
}

/// The REQ of `request` for the QP `local`, and the peer it goes to.
fn build_req(
    request: &ConnectRequest,
    local: &LocalQpAttrs,
    port_use: &PortUse,
) -> Result<(Req, PeerAddr)> {
    // The port's address and P_Key as its agent read them when it started
    // (P_Key index 0, `AgentConfig::default()`): no port query per REQ.
    let addr = port_use.0.agent.local_addr();
    let pkey = port_use.0.agent.pkey();
    // A RoCE port has no LID (0): Linux's CM then writes the permissive
    // LID (0xFFFF) at both ends of the path, and a packet rate from the
    // link (10 Gb/s, code 3, for a path we cannot measure).
    let roce = addr.lid == 0 && request.remote_gid.is_some();
    let (local_lid, remote_lid, packet_rate) = if roce {
        (0xFFFF, 0xFFFF, 3)
    } else {
        (
            addr.lid,
            request.remote_lid,
            PathInfo::default().packet_rate,
        )
    };
    let req = Req {
        service_id: request.service_id,
        local_qpn: local.qpn,
        local_qkey: 0,
        starting_psn: local.starting_psn,
        responder_resources: request.responder_resources,
        initiator_depth: request.initiator_depth,
        remote_cm_response_timeout: spec_bounded(
            "cm_response_timeout",
            request.cm_response_timeout,
            31,
        )?,
        local_cm_response_timeout: request.cm_response_timeout,
        transport_service_type: local.transport(),
        end_to_end_flow_control: local.end_to_end_flow_control,
        retry_count: spec_bounded("retry_count", request.retry_count, 7)?,
        rnr_retry_count: spec_bounded("rnr_retry_count", request.rnr_retry_count, 7)?,
        max_cm_retries: spec_bounded("max_cm_retries", request.max_cm_retries, 15)?,
        path_mtu: request.path_mtu.ibta_code(),
        pkey,
        srq: local.srq,
        primary_path: PathInfo {
            local_lid,
            remote_lid,
            local_gid: addr.gid,
            remote_gid: request.remote_gid.unwrap_or([0; 16]),
            flow_label: bounded_flow_label(request.flow_label)?,
            traffic_class: request.traffic_class,
            hop_limit: request.hop_limit,
            packet_rate,
            subnet_local: request.remote_gid.is_none(),
            local_ack_timeout: spec_bounded("local_ack_timeout", request.local_ack_timeout, 31)?,
            ..PathInfo::default()
        },
        private_data: PrivateData::new(&request.private_data)
            .map_err(|e| Error::invalid_parameter(e.to_string()))?,
        ..Req::default()
    };
    let peer = PeerAddr {
        lid: request.remote_lid,
        gid: request.remote_gid.unwrap_or([0; 16]),
    };
    Ok((req, peer))
}

/// A new active-side CEP (bound or CM-only), not started.
fn new_active_cep(
    al: &Arc<AlInstance>,
    port_use: PortUse,
    handler: CmHandler,
    port: u8,
    cm_only: bool,
) -> Result<Arc<Obj<Cep>>> {
    create(al, None, |_| {
        Ok(Cep {
            port: port_use,
            handler,
            state: Mutex::new(CepState {
                port,
                cm_only,
                ..CepState::default()
            }),
        })
    })
}

/// Send the REQ of a new active CEP and record it, with the bound `qp` if
/// any. The state lock is held across the agent call: a teardown (AL
/// close, QP destroy, the user's destroy) either ran before (closed) or
/// finds the connection's id.
fn start_active(
    cep: &Obj<Cep>,
    h: Handle<Cep>,
    req: Req,
    peer: PeerAddr,
    qp: Option<Arc<Obj<Qp>>>,
) -> Result<()> {
    let mut st = cep.state.lock();
    if st.closed {
        return Err(cep_destroyed(cep));
    }
    let conn = start_connect(cep, ConnectParams::new(peer, req), h)?;
    st.conn = Some(conn);
    st.qp = qp;
    st.req = Some(req);
    st.peer = Some(peer);
    Ok(())
}

/// Send the REQ, the CEP's route published before it can leave.
fn start_connect(cep: &Obj<Cep>, params: ConnectParams, h: Handle<Cep>) -> Result<ConnId> {
    let (agent, routes) = (&cep.port.0.agent, &cep.port.0.routes);
    #[cfg(not(ibal_mutant = "route_after_start"))]
    return agent.connect_published(params, |id| routes.publish(id, Route::Cep(h.raw())));
    // MUTANT (loom-tests/run.sh --mutants): published after the REQ left.
    #[cfg(ibal_mutant = "route_after_start")]
    return agent
        .connect(params)
        .inspect(|&id| routes.publish(id, Route::Cep(h.raw())));
}
