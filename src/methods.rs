//! Every verb as a method: on the AL (`al.open_ca(..)`) and on typed
//! handles (`pd.create_qp(&al, ..)`, `qp.post_send(&al, ..)`,
//! `cq.poll(&al, ..)`, `qp.connect(&al, ..)`, `cep.accept(&al, ..)`).
//!
//! Handles are defined in `al` and the objects in the layer crates, so the
//! methods come as one extension trait per object, all in
//! [`prelude`](crate::prelude). Each method is the layer's free function
//! called with its arguments in the same order: nothing is written twice.
//!
//! One receiver throughout: `&Arc<AlInstance>`. An [`Al`](crate::Al)
//! dereferences to it (`&al`), and a callback holds an `Arc<AlInstance>`
//! clone (`&inst`).

use al::{AlInstance, Handle, Object, Result};
use cep::cm::{
    self, AcceptReply, Cep, CmHandler, CmPort, ConnectRequest, ConnectionAttrs, Listen,
    ListenHandler, LocalQpAttrs,
};
use cep::ip::IpConnect;
use cep::proto::{LapParams, SidrParams, SidrReplyParams};
use cep::wire::ip_cm::PortSpace;
use cep::wire::{ApStatus, RejectReason};
use hca::any::AnyProvider;
use hca::verbs::Cq;
use hca::verbs::{self, Av, Ca, CompletionCallback, CqEventCallback, Mr, Pd, Srq};
use provider::{Access, AvAttr, CqArm, DeviceAttr, QpAttr, QpModify, RecvWr, SendWr};
use provider::{PortAttr, SrqInit, Wc};
use provider::{RawRegion, RegisteredBuffer};
use qp::{Qp, QpCreate};
use std::net::SocketAddr;

use al::sync::Arc;

/// Methods of the AL instance (`al.open_ca(..)`).
pub trait AlMethods {
    /// Open the device with node GUID `guid` of `provider`.
    fn open_ca<P: AnyProvider + ?Sized>(&self, provider: &P, guid: u64) -> Result<Handle<Ca>>;
}

impl AlMethods for Arc<AlInstance> {
    fn open_ca<P: AnyProvider + ?Sized>(&self, provider: &P, guid: u64) -> Result<Handle<Ca>> {
        verbs::open_ca(self, provider, guid)
    }
}

/// Destroy any object by its handle: the non-blocking two-phase destroy
/// (`docs/ownership.md`); its destroy callback, if any was given through
/// [`AlInstance::destroy`], runs on the AL's executor once it is gone.
pub trait Destroy {
    /// Start destroying the object (children and bound CEPs go with it).
    fn destroy(self, al: &Arc<AlInstance>) -> Result<()>;
}

impl<T: Object> Destroy for Handle<T> {
    fn destroy(self, al: &Arc<AlInstance>) -> Result<()> {
        al.destroy(self, None)
    }
}

/// Methods of an open channel adapter.
pub trait CaMethods {
    /// The device's attributes (limits, GUID, ports).
    fn attr(self, al: &Arc<AlInstance>) -> Result<DeviceAttr>;
    /// The current attributes of port `port` (1-based): state, LID, GID
    /// table (on a RoCEv2 port, its IP address as GID 0), MTU.
    fn port(self, al: &Arc<AlInstance>, port: u8) -> Result<PortAttr>;
    /// Allocate a protection domain.
    fn alloc_pd(self, al: &Arc<AlInstance>) -> Result<Handle<Pd>>;
    /// A completion queue of `capacity` entries, polled by the caller.
    fn create_cq(self, al: &Arc<AlInstance>, capacity: u32) -> Result<Handle<Cq>>;
    /// A completion queue with a completion callback (after
    /// [`CqMethods::arm`]) and an event callback (overflow).
    fn create_cq_with(
        self,
        al: &Arc<AlInstance>,
        capacity: u32,
        on_completion: Option<CompletionCallback>,
        on_event: Option<CqEventCallback>,
    ) -> Result<Handle<Cq>>;
    /// Attach the connection manager to every port (one handle per port).
    fn attach_cm(self, al: &Arc<AlInstance>) -> Result<Vec<Handle<CmPort>>>;
    /// Listen for connection (and SIDR) requests for `service_id` on `port`.
    fn listen(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        service_id: u64,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>>;
    /// Ask a UD service for its QP (SIDR) from `port`.
    fn sidr_request(
        self,
        al: &Arc<AlInstance>,
        params: SidrParams,
        port: u8,
        handler: CmHandler,
    ) -> Result<Handle<Cep>>;
    /// CM-only connect from `request.port`: send a REQ for a QP the caller
    /// owns and moves itself (`local` is what the REQ carries from it); the
    /// CEP is bound to no QP ([`cm::connect_unbound`], `docs/cm.md`,
    /// "CM-only CEPs").
    fn connect_unbound(
        self,
        al: &Arc<AlInstance>,
        request: &ConnectRequest,
        local: &LocalQpAttrs,
        handler: CmHandler,
    ) -> Result<Handle<Cep>>;
    /// Listen rdma_cm style on `addr` (the address of one of this CA's
    /// RoCEv2 ports, or unspecified for port 1; the port number in the TCP
    /// port space). [`crate::cm::ip::request_info`] reads each request's
    /// addresses and user data ([`cep::ip::listen`]).
    fn listen_ip(
        self,
        al: &Arc<AlInstance>,
        addr: SocketAddr,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>>;
}

impl CaMethods for Handle<Ca> {
    fn attr(self, al: &Arc<AlInstance>) -> Result<DeviceAttr> {
        Ok(al.resolve(self)?.attr().clone())
    }
    fn port(self, al: &Arc<AlInstance>, port: u8) -> Result<PortAttr> {
        al.resolve(self)?.port(port)
    }
    fn alloc_pd(self, al: &Arc<AlInstance>) -> Result<Handle<Pd>> {
        verbs::alloc_pd(al, self)
    }
    fn create_cq(self, al: &Arc<AlInstance>, capacity: u32) -> Result<Handle<Cq>> {
        verbs::create_cq(al, self, capacity, None, None)
    }
    fn create_cq_with(
        self,
        al: &Arc<AlInstance>,
        capacity: u32,
        on_completion: Option<CompletionCallback>,
        on_event: Option<CqEventCallback>,
    ) -> Result<Handle<Cq>> {
        verbs::create_cq(al, self, capacity, on_completion, on_event)
    }
    fn attach_cm(self, al: &Arc<AlInstance>) -> Result<Vec<Handle<CmPort>>> {
        cm::attach_ca(al, self)
    }
    fn listen(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        service_id: u64,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>> {
        cm::listen(al, self, port, service_id, on_request, handler)
    }
    fn sidr_request(
        self,
        al: &Arc<AlInstance>,
        params: SidrParams,
        port: u8,
        handler: CmHandler,
    ) -> Result<Handle<Cep>> {
        cm::sidr_request(al, self, params, port, handler)
    }
    fn connect_unbound(
        self,
        al: &Arc<AlInstance>,
        request: &ConnectRequest,
        local: &LocalQpAttrs,
        handler: CmHandler,
    ) -> Result<Handle<Cep>> {
        cm::connect_unbound(al, self, request, local, handler)
    }
    fn listen_ip(
        self,
        al: &Arc<AlInstance>,
        addr: SocketAddr,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>> {
        cep::ip::listen(al, self, addr, PortSpace::Tcp, on_request, handler)
    }
}

/// Methods of a protection domain.
pub trait PdMethods {
    /// A queue pair (in RESET).
    fn create_qp(self, al: &Arc<AlInstance>, init: QpCreate) -> Result<Handle<Qp>>;
    /// Register the whole of `buf` (which the MR keeps alive).
    fn register(
        self,
        al: &Arc<AlInstance>,
        buf: &RegisteredBuffer,
        access: Access,
    ) -> Result<Handle<Mr>>;
    /// Register `len` bytes of `buf` from `offset`, addressed from `iova`.
    fn register_range(
        self,
        al: &Arc<AlInstance>,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Handle<Mr>>;
    /// Register caller-managed memory (zero copy). The `unsafe` promise was
    /// made when the [`RawRegion`] was built ([`RawRegion::new`] says what
    /// it is); the MR's addresses are the region's own.
    fn register_region(
        self,
        al: &Arc<AlInstance>,
        region: RawRegion,
        access: Access,
    ) -> Result<Handle<Mr>>;
    /// A shared receive queue.
    fn create_srq(self, al: &Arc<AlInstance>, init: SrqInit) -> Result<Handle<Srq>>;
    /// An address vector (for UD sends).
    fn create_av(self, al: &Arc<AlInstance>, attr: AvAttr) -> Result<Handle<Av>>;
}

impl PdMethods for Handle<Pd> {
    fn create_qp(self, al: &Arc<AlInstance>, init: QpCreate) -> Result<Handle<Qp>> {
        qp::create_qp(al, self, init)
    }
    fn register(
        self,
        al: &Arc<AlInstance>,
        buf: &RegisteredBuffer,
        access: Access,
    ) -> Result<Handle<Mr>> {
        verbs::register_mr(al, self, buf, 0, buf.len(), 0, access)
    }
    fn register_range(
        self,
        al: &Arc<AlInstance>,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Handle<Mr>> {
        verbs::register_mr(al, self, buf, offset, len, iova, access)
    }
    fn register_region(
        self,
        al: &Arc<AlInstance>,
        region: RawRegion,
        access: Access,
    ) -> Result<Handle<Mr>> {
        verbs::register_region(al, self, region, access)
    }
    fn create_srq(self, al: &Arc<AlInstance>, init: SrqInit) -> Result<Handle<Srq>> {
        verbs::create_srq(al, self, init)
    }
    fn create_av(self, al: &Arc<AlInstance>, attr: AvAttr) -> Result<Handle<Av>> {
        verbs::create_av(al, self, attr)
    }
}

/// Methods of a memory region.
pub trait MrMethods {
    /// The (lkey, rkey) pair.
    fn keys(self, al: &Arc<AlInstance>) -> Result<(u32, u32)>;
}

impl MrMethods for Handle<Mr> {
    fn keys(self, al: &Arc<AlInstance>) -> Result<(u32, u32)> {
        let mr = al.resolve(self)?;
        Ok((mr.lkey(), mr.rkey()))
    }
}

/// Methods of a completion queue.
pub trait CqMethods {
    /// Take up to `out.len()` completions; returns how many.
    fn poll(self, al: &Arc<AlInstance>, out: &mut [Wc]) -> Result<usize>;
    /// Ask for the completion callback on the next (solicited) completion.
    fn arm(self, al: &Arc<AlInstance>, arm: CqArm) -> Result<()>;
}

impl CqMethods for Handle<Cq> {
    fn poll(self, al: &Arc<AlInstance>, out: &mut [Wc]) -> Result<usize> {
        verbs::poll_cq(al, self, out)
    }
    fn arm(self, al: &Arc<AlInstance>, arm: CqArm) -> Result<()> {
        verbs::arm_cq(al, self, arm)
    }
}

/// Methods of a shared receive queue.
pub trait SrqMethods {
    /// Post receive work requests to the SRQ.
    fn post_recv(self, al: &Arc<AlInstance>, wrs: &[RecvWr<'_>]) -> Result<()>;
}

impl SrqMethods for Handle<Srq> {
    fn post_recv(self, al: &Arc<AlInstance>, wrs: &[RecvWr<'_>]) -> Result<()> {
        verbs::post_srq_recv(al, self, wrs)
    }
}

/// Methods of a queue pair.
pub trait QpMethods {
    /// Post send work requests. A UD send names its destination's AV by
    /// handle (`.to(UdDest { av: &av, .. })`); every AV is checked (live,
    /// of this AL, in the QP's PD) before anything is posted
    /// ([`crate::verbs::post_send`]).
    fn post_send(self, al: &Arc<AlInstance>, wrs: &[SendWr<'_, Handle<Av>>]) -> Result<()>;
    /// Post receive work requests.
    fn post_recv(self, al: &Arc<AlInstance>, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// The QP's attributes and state.
    fn query(self, al: &Arc<AlInstance>) -> Result<QpAttr>;
    /// An IBTA state transition (or attribute change).
    fn modify(self, al: &Arc<AlInstance>, m: &QpModify) -> Result<()>;
    /// Connect (RC or UC) through the CM: send a REQ; the CEP's events go
    /// to `handler` (answer the reply with [`CepMethods::rtu`]).
    fn connect(
        self,
        al: &Arc<AlInstance>,
        request: &ConnectRequest,
        handler: CmHandler,
    ) -> Result<Handle<Cep>>;
    /// Connect rdma_cm style to `request.remote` (an IP address and port)
    /// from port `port` of the QP's CA: the REQ carries rdma_cm's header
    /// and then the request's private data ([`cep::ip::connect`]).
    fn connect_ip(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        request: &IpConnect,
        handler: CmHandler,
    ) -> Result<Handle<Cep>>;
    /// Take this RC or UC QP to INIT on `port` before its connection, as
    /// rdma_cm's `rdma_create_qp` leaves a QP: post receives now, then
    /// `connect`/`connect_ip` from `port` or `accept` a request that came
    /// to `port`, which take it INIT -> RTR -> RTS with the receives still
    /// posted ([`cm::ready_for_connection`] has the rules; `docs/cm.md`,
    /// "Receives before the connection").
    ///
    /// ```
    /// use ibal::prelude::*;
    /// # fn main() -> ibal::Result<()> {
    /// let fabric = Fabric::new();
    /// fabric.add_hca(HcaConfig::new(0xa000, &[1]))?;
    /// let provider = SoftProvider::new(fabric);
    /// let al = Al::open()?;
    /// let ca = al.open_ca(&provider, 0xa000)?;
    /// let (pd, cq) = (ca.alloc_pd(&al)?, ca.create_cq(&al, 16)?);
    /// let caps = QpCaps { max_recv_wr: 8, ..QpCaps::default() };
    /// let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq).caps(caps))?;
    /// let buf = RegisteredBuffer::new(4096);
    /// let (lkey, _) = pd.register(&al, &buf, Access::LOCAL_WRITE)?.keys(&al)?;
    ///
    /// qp.ready_for_connection(&al, 1)?;
    /// assert_eq!(qp.query(&al)?.state, QpState::Init);
    /// let sge = [Sge { addr: 0, length: 4096, lkey }];
    /// qp.post_recv(&al, &[RecvWr { wr_id: 7, sg_list: &sge }])?;
    /// // ... qp.connect(&al, &ConnectRequest::new(service, lid), handler)?
    /// assert!(al.close()?.is_clean());
    /// # Ok(())
    /// # }
    /// ```
    fn ready_for_connection(self, al: &Arc<AlInstance>, port: u8) -> Result<()>;
}

impl QpMethods for Handle<Qp> {
    fn post_send(self, al: &Arc<AlInstance>, wrs: &[SendWr<'_, Handle<Av>>]) -> Result<()> {
        qp::post_send(al, self, wrs)
    }
    fn post_recv(self, al: &Arc<AlInstance>, wrs: &[RecvWr<'_>]) -> Result<()> {
        qp::post_recv(al, self, wrs)
    }
    fn query(self, al: &Arc<AlInstance>) -> Result<QpAttr> {
        qp::query_qp(al, self)
    }
    fn modify(self, al: &Arc<AlInstance>, m: &QpModify) -> Result<()> {
        qp::modify_qp(al, self, m)
    }
    fn connect(
        self,
        al: &Arc<AlInstance>,
        request: &ConnectRequest,
        handler: CmHandler,
    ) -> Result<Handle<Cep>> {
        cm::connect(al, self, request, handler)
    }
    fn connect_ip(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        request: &IpConnect,
        handler: CmHandler,
    ) -> Result<Handle<Cep>> {
        cep::ip::connect(al, self, port, request, handler)
    }
    fn ready_for_connection(self, al: &Arc<AlInstance>, port: u8) -> Result<()> {
        cm::ready_for_connection(al, self, port)
    }
}

/// Methods of a connection endpoint (see `cep::cm` for each call's rules;
/// `accept`'s failure rule is on [`cm::accept`]).
pub trait CepMethods {
    /// Accept the request on `qp` (passive side).
    fn accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, reply: &AcceptReply) -> Result<()>;
    /// Answer the reply with the RTU (active side); the QP goes to RTS.
    fn rtu(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
    /// Reject the request or reply.
    fn reject(self, al: &Arc<AlInstance>, reason: RejectReason, private_data: &[u8]) -> Result<()>;
    /// Ask the peer for more time (MRA).
    fn mra(self, al: &Arc<AlInstance>, service_timeout: u8, private_data: &[u8]) -> Result<()>;
    /// Start a disconnect (DREQ).
    fn disconnect(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
    /// Answer the peer's DREQ (DREP).
    fn disconnect_reply(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
    /// Propose an alternate path (LAP).
    fn lap(self, al: &Arc<AlInstance>, params: LapParams) -> Result<()>;
    /// Answer the peer's LAP (APR).
    fn apr(self, al: &Arc<AlInstance>, status: ApStatus, private_data: &[u8]) -> Result<()>;
    /// Answer a SIDR request.
    fn sidr_reply(self, al: &Arc<AlInstance>, reply: SidrReplyParams) -> Result<()>;
    /// CM-only accept (passive side): send the REP for a QP the caller owns
    /// (`local`); nothing is bound ([`cm::accept_unbound`]). Move the QP to
    /// RTR first, with [`CepMethods::accept_attrs`].
    fn accept_unbound(
        self,
        al: &Arc<AlInstance>,
        local: &LocalQpAttrs,
        reply: &AcceptReply,
    ) -> Result<()>;
    /// What a CM-only accept with `local` and `reply` will negotiate: the
    /// caller's QP attributes for INIT and RTR before the REP leaves
    /// ([`cm::accept_attrs`]). Changes nothing.
    fn accept_attrs(
        self,
        al: &Arc<AlInstance>,
        local: &LocalQpAttrs,
        reply: &AcceptReply,
    ) -> Result<ConnectionAttrs>;
    /// This end's negotiated QP attributes (peer QPN and PSN, RDMA depths,
    /// path; `rtr()` and `rts()` modifies), once the REQ and REP are known
    /// ([`cm::connection_attrs`]).
    fn connection_attrs(self, al: &Arc<AlInstance>) -> Result<ConnectionAttrs>;
}

impl CepMethods for Handle<Cep> {
    fn accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, reply: &AcceptReply) -> Result<()> {
        cm::accept(al, self, qp, reply)
    }
    fn rtu(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cm::rtu(al, self, private_data)
    }
    fn reject(self, al: &Arc<AlInstance>, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        cm::reject(al, self, reason, private_data)
    }
    fn mra(self, al: &Arc<AlInstance>, service_timeout: u8, private_data: &[u8]) -> Result<()> {
        cm::mra(al, self, service_timeout, private_data)
    }
    fn disconnect(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cm::disconnect(al, self, private_data)
    }
    fn disconnect_reply(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cm::disconnect_reply(al, self, private_data)
    }
    fn lap(self, al: &Arc<AlInstance>, params: LapParams) -> Result<()> {
        cm::lap(al, self, params)
    }
    fn apr(self, al: &Arc<AlInstance>, status: ApStatus, private_data: &[u8]) -> Result<()> {
        cm::apr(al, self, status, private_data)
    }
    fn sidr_reply(self, al: &Arc<AlInstance>, reply: SidrReplyParams) -> Result<()> {
        cm::sidr_reply(al, self, reply)
    }
    fn accept_unbound(
        self,
        al: &Arc<AlInstance>,
        local: &LocalQpAttrs,
        reply: &AcceptReply,
    ) -> Result<()> {
        cm::accept_unbound(al, self, local, reply)
    }
    fn accept_attrs(
        self,
        al: &Arc<AlInstance>,
        local: &LocalQpAttrs,
        reply: &AcceptReply,
    ) -> Result<ConnectionAttrs> {
        cm::accept_attrs(al, self, local, reply)
    }
    fn connection_attrs(self, al: &Arc<AlInstance>) -> Result<ConnectionAttrs> {
        cm::connection_attrs(al, self)
    }
}

/// Connections on an `rdma` CA through librdmacm (feature `rdma`;
/// `ibal::rdma::cm`): the counterparts of [`QpMethods::connect_ip`] and
/// [`CaMethods::listen_ip`], which need the project's CM agent on QP1 and
/// so refuse an `rdma` CA (QP1 is the kernel's there). They take the same
/// [`IpConnect`] and deliver the same events, to handlers of the
/// rdma_cm-backed CEP type (`docs/rdma-provider.md`, "Connections").
#[cfg(feature = "rdma")]
pub trait RdmaCmMethods {
    /// Connect this QP (RC) to `request.remote` through librdmacm
    /// ([`cep_rdmacm::connect`]).
    fn rdma_cm_connect(
        self,
        al: &Arc<AlInstance>,
        request: &IpConnect,
        handler: cep_rdmacm::RdmaCmHandler,
    ) -> Result<Handle<cep_rdmacm::RdmaCep>>;
}

#[cfg(feature = "rdma")]
impl RdmaCmMethods for Handle<Qp> {
    fn rdma_cm_connect(
        self,
        al: &Arc<AlInstance>,
        request: &IpConnect,
        handler: cep_rdmacm::RdmaCmHandler,
    ) -> Result<Handle<cep_rdmacm::RdmaCep>> {
        cep_rdmacm::connect(al, self, request, handler)
    }
}

/// Listening on an `rdma` CA through librdmacm (feature `rdma`).
#[cfg(feature = "rdma")]
pub trait RdmaCmListenMethods {
    /// Listen on `addr` of this CA's device ([`cep_rdmacm::listen`]).
    fn rdma_cm_listen(
        self,
        al: &Arc<AlInstance>,
        addr: std::net::SocketAddr,
        space: cep::wire::ip_cm::PortSpace,
        on_request: cep_rdmacm::RdmaListenHandler,
        handler: cep_rdmacm::RdmaCmHandler,
    ) -> Result<Handle<cep_rdmacm::RdmaListen>>;
}

#[cfg(feature = "rdma")]
impl RdmaCmListenMethods for Handle<Ca> {
    fn rdma_cm_listen(
        self,
        al: &Arc<AlInstance>,
        addr: std::net::SocketAddr,
        space: cep::wire::ip_cm::PortSpace,
        on_request: cep_rdmacm::RdmaListenHandler,
        handler: cep_rdmacm::RdmaCmHandler,
    ) -> Result<Handle<cep_rdmacm::RdmaListen>> {
        cep_rdmacm::listen(al, self, addr, space, on_request, handler)
    }
}

/// Methods of an rdma_cm-backed CEP, named as [`CepMethods`]' (feature
/// `rdma`; the rules are `cep_rdmacm`'s).
#[cfg(feature = "rdma")]
pub trait RdmaCepMethods {
    /// Accept the request on `qp` (passive side).
    fn accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, reply: &AcceptReply) -> Result<()>;
    /// Answer the reply (active side): QP to RTS, RTU (no private data).
    fn rtu(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
    /// Reject the request or reply (librdmacm sends reason 28).
    fn reject(self, al: &Arc<AlInstance>, reason: RejectReason, private_data: &[u8]) -> Result<()>;
    /// Start a disconnect (DREQ).
    fn disconnect(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
    /// Answer the peer's DREQ (DREP).
    fn disconnect_reply(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()>;
}

#[cfg(feature = "rdma")]
impl RdmaCepMethods for Handle<cep_rdmacm::RdmaCep> {
    fn accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, reply: &AcceptReply) -> Result<()> {
        cep_rdmacm::accept(al, self, qp, reply)
    }
    fn rtu(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cep_rdmacm::rtu(al, self, private_data)
    }
    fn reject(self, al: &Arc<AlInstance>, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        cep_rdmacm::reject(al, self, reason, private_data)
    }
    fn disconnect(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cep_rdmacm::disconnect(al, self, private_data)
    }
    fn disconnect_reply(self, al: &Arc<AlInstance>, private_data: &[u8]) -> Result<()> {
        cep_rdmacm::disconnect_reply(al, self, private_data)
    }
}

/// UD services by IP address on a CA (rdma_cm's UDP port space;
/// `docs/cm.md`, "UD services by IP"): resolve one, or listen as one.
pub trait IpUdCaMethods {
    /// Resolve the UD service at `request.remote` from port `port`: a
    /// SIDR_REQ with rdma_cm's header; `on_result` gets its QPN, Q_Key and
    /// an address vector to it, or the error, once
    /// ([`cep::ip::resolve`]).
    fn resolve_ip(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        request: &cep::ip::IpResolve,
        on_result: cep::ip::ResolveHandler,
    ) -> Result<Handle<Cep>>;
    /// Listen on `addr` (the address of one of this CA's RoCEv2 ports, or
    /// unspecified for port 1) in the UDP port space: SIDR requests come
    /// to `on_request` as `Event::SidrRequest`
    /// ([`cep::ip::sidr_request_info`] reads their addresses; answer with
    /// [`IpUdCepMethods::sidr_accept`]).
    fn listen_ip_ud(
        self,
        al: &Arc<AlInstance>,
        addr: SocketAddr,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>>;
}

impl IpUdCaMethods for Handle<Ca> {
    fn resolve_ip(
        self,
        al: &Arc<AlInstance>,
        port: u8,
        request: &cep::ip::IpResolve,
        on_result: cep::ip::ResolveHandler,
    ) -> Result<Handle<Cep>> {
        cep::ip::resolve(al, self, port, request, on_result)
    }
    fn listen_ip_ud(
        self,
        al: &Arc<AlInstance>,
        addr: SocketAddr,
        on_request: ListenHandler,
        handler: CmHandler,
    ) -> Result<Handle<Listen>> {
        cep::ip::listen(al, self, addr, PortSpace::Udp, on_request, handler)
    }
}

/// A UD QP for rdma_cm's UDP port space.
pub trait IpUdQpMethods {
    /// RTS on `port` with P_Key index 0 and Q_Key
    /// [`RDMA_UDP_QKEY`](cep::ip::RDMA_UDP_QKEY), from RESET or INIT
    /// ([`cep::ip::ready_ud`]).
    fn ready_ud(self, al: &Arc<AlInstance>, port: u8) -> Result<()>;
}

impl IpUdQpMethods for Handle<Qp> {
    fn ready_ud(self, al: &Arc<AlInstance>, port: u8) -> Result<()> {
        cep::ip::ready_ud(al, self, port)
    }
}

/// Answering a SIDR request with a UD QP.
pub trait IpUdCepMethods {
    /// Answer with `qp`'s number and Q_Key ([`cep::ip::sidr_accept`]).
    fn sidr_accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, private_data: &[u8]) -> Result<()>;
}

impl IpUdCepMethods for Handle<Cep> {
    fn sidr_accept(self, al: &Arc<AlInstance>, qp: Handle<Qp>, private_data: &[u8]) -> Result<()> {
        cep::ip::sidr_accept(al, self, qp, private_data)
    }
}

/// An address vector back to the sender of a received datagram.
///
/// ```
/// use ibal::prelude::*;
/// # fn main() -> ibal::Result<()> {
/// let fabric = Fabric::new();
/// fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
/// fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
/// let provider = SoftProvider::new(fabric);
/// let al = Al::open()?;
/// let end = |guid| -> Result<_> {
///     let ca = al.open_ca(&provider, guid)?;
///     let pd = ca.alloc_pd(&al)?;
///     let cq = ca.create_cq(&al, 8)?;
///     let qp = pd.create_qp(&al, QpCreate::new(QpType::Ud, cq))?;
///     qp.ready_ud(&al, 1)?;
///     let buf = RegisteredBuffer::new(GRH_SIZE + 4);
///     let (lkey, _) = pd.register(&al, &buf, Access::LOCAL_WRITE)?.keys(&al)?;
///     let sge = [Sge { addr: 0, length: buf.len() as u32, lkey }];
///     let gid = ca.port(&al, 1)?.gid_table[0];
///     Ok((pd, cq, qp, buf, sge, gid))
/// };
/// let (pd_a, _cq_a, qp_a, _, sge_a, gid_a) = end(0xa)?;
/// let (pd_b, cq_b, qp_b, buf_b, sge_b, gid_b) = end(0xb)?;
/// qp_b.post_recv(&al, &[RecvWr { wr_id: 1, sg_list: &sge_b }])?;
/// // A sends to B by GID: B's receive starts with a GRH.
/// let mut to_b = AvAttr::lid(1, 0);
/// to_b.grh = Some(GrhAttr { dgid: gid_b, sgid_index: 0, flow_label: 0, hop_limit: 64, traffic_class: 0 });
/// let av = pd_a.create_av(&al, to_b)?;
/// let dest = UdDest { av: &av, remote_qpn: qp_b.query(&al)?.qpn, remote_qkey: RDMA_UDP_QKEY, pkey_index: 0 };
/// let four_bytes = [Sge { length: 4, ..sge_a[0] }];
/// qp_a.post_send(&al, &[SendWr::new(2, SendOp::Send, &four_bytes).to(dest)])?;
/// let mut wc = [Wc::default()];
/// for _ in 0..1000 {
///     if cq_b.poll(&al, &mut wc)? == 1 { break; }
///     std::thread::sleep(std::time::Duration::from_millis(1));
/// }
/// assert!(wc[0].grh && wc[0].status == WcStatus::Success);
/// let mut grh = [0u8; GRH_SIZE];
/// buf_b.read(0, &mut grh)?;
/// // B's way back to A, without reading the GRH itself.
/// let back = pd_b.create_av_from_wc(&al, &wc[0], &grh, 1)?;
/// let attr = AvAttr::from_wc(&wc[0], &grh, 1)?;
/// assert_eq!(attr.grh.map(|g| g.dgid), Some(gid_a));
/// assert_eq!(attr.dlid, 1); // A's LID, from the completion
/// # let _ = back;
/// assert!(al.close()?.is_clean());
/// # Ok(())
/// # }
/// ```
pub trait AvFromWcMethods {
    /// `ibv_create_ah_from_wc`: an AV in this PD to the sender of the UD
    /// receive `wc`, whose buffer starts with `grh` (its first
    /// `GRH_SIZE` bytes), sent from `port`
    /// ([`crate::verbs::create_av_from_wc`], [`AvAttr::from_wc`]).
    fn create_av_from_wc(
        self,
        al: &Arc<AlInstance>,
        wc: &Wc,
        grh: &[u8],
        port: u8,
    ) -> Result<Handle<Av>>;
}

impl AvFromWcMethods for Handle<Pd> {
    fn create_av_from_wc(
        self,
        al: &Arc<AlInstance>,
        wc: &Wc,
        grh: &[u8],
        port: u8,
    ) -> Result<Handle<Av>> {
        verbs::create_av_from_wc(al, self, wc, grh, port)
    }
}
