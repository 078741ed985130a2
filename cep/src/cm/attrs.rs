//! What a connection's QP is moved with, derived from the REQ and REP
//! both ends exchanged: the RTR and RTS attributes ([`rtr_attrs`],
//! [`rts_attrs`], [`ConnectionAttrs`]), what a REQ or REP carries from the
//! local QP ([`LocalQpAttrs`], with its StartingPSN from the keyed PSN
//! seed), the checks the IBTA bounds ask for, and the QP moves to INIT
//! and back that connect and accept make. No object and no agent here.

use al::{Error, Obj, Result};
use provider::{Access, AvAttr, GrhAttr, Mtu, QpModify, QpState};
use qp::Qp;

use crate::keyed::starting_psn;
use crate::wire::{PathInfo, Rep, Req, TransportType};

/// A REQ's path MTU code as an MTU (a reserved code reads as 4096).
fn ibta_mtu(code: u8) -> Mtu {
    Mtu::from_ibta_code(code).unwrap_or(Mtu::Mtu4096)
}

/// Which end of a REQ's primary path a QP is at: the active side sent
/// the REQ (its peer is the path's remote end), the passive side received
/// it (its peer is the path's local end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathEnd {
    /// The side that sent the REQ.
    Active,
    /// The side that received it.
    Passive,
}

/// RTR attributes of a connected QP on `port` toward its peer on the REQ's
/// primary path, with the REQ's path MTU, the peer's QPN, our receive PSN
/// (the StartingPSN *we* advertised: each side names the PSN it expects to
/// receive, as IBTA and Linux's CM read the field), and the RDMA READ/atomic requests
/// we accept from it. A path that is not subnet-local (routed by GID, as
/// every RoCE path is) gives the address vector a GRH with the peer's GID
/// and the path's flow label, traffic class and hop limit. [`accept`]
/// (passive) and [`rtu`] (active) apply these.
///
/// [`accept`]: super::accept
/// [`rtu`]: super::rtu
pub fn rtr_attrs(
    port: u8,
    req: &Req,
    end: PathEnd,
    dest_qpn: u32,
    rq_psn: u32,
    max_dest_rd_atomic: u8,
) -> QpModify {
    let path = &req.primary_path;
    let (dlid, dgid) = match end {
        PathEnd::Active => (path.remote_lid, path.remote_gid),
        PathEnd::Passive => (path.local_lid, path.local_gid),
    };
    let mut av = AvAttr::lid(port, dlid);
    av.sl = path.sl;
    if !path.subnet_local {
        av.grh = Some(GrhAttr {
            dgid,
            sgid_index: 0,
            flow_label: path.flow_label,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
        });
    }
    QpModify::to(QpState::Rtr)
        .av(av)
        .path_mtu(ibta_mtu(req.path_mtu))
        .dest_qpn(dest_qpn)
        .rq_psn(rq_psn)
        .max_dest_rd_atomic(max_dest_rd_atomic)
        .min_rnr_timer(12)
}

/// RTS attributes of a connected QP: our send PSN (the peer's StartingPSN), the REQ's ACK
/// timeout and retry count, the RNR retries the peer asked for, and the
/// RDMA READ/atomic requests we may have outstanding. [`rtu`] (active) and
/// the passive side's RTU handling apply these.
///
/// [`rtu`]: super::rtu
pub fn rts_attrs(sq_psn: u32, req: &Req, rnr_retry: u8, max_rd_atomic: u8) -> QpModify {
    QpModify::to(QpState::Rts)
        .sq_psn(sq_psn)
        .timeout(req.primary_path.local_ack_timeout)
        .retry_cnt(req.retry_count)
        .rnr_retry(rnr_retry)
        .max_rd_atomic(max_rd_atomic)
}

/// What a REQ or REP carries from the local QP, given by a consumer that
/// owns its QP itself ([`connect_unbound`], [`accept_unbound`]); a bound
/// [`connect`] or [`accept`] reads the same values from its QP.
///
/// The negotiated values (RDMA READ/atomic depths, path MTU, retry and RNR
/// retry counts, local ACK timeout, access) stay where a bound connection
/// has them: [`ConnectRequest`] and [`AcceptReply`].
///
/// ```
/// # use cep::cm::LocalQpAttrs;
/// # use provider::QpType;
/// let local = LocalQpAttrs::new(QpType::Rc, 0x1234, 0x42).srq(true);
/// assert_eq!((local.qpn, local.starting_psn, local.srq), (0x1234, 0x42, true));
/// ```
///
/// [`connect_unbound`]: super::connect_unbound
/// [`accept_unbound`]: super::accept_unbound
/// [`connect`]: super::connect
/// [`accept`]: super::accept
/// [`ConnectRequest`]: super::ConnectRequest
/// [`AcceptReply`]: super::AcceptReply
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalQpAttrs {
    /// RC or UC: the REQ's transport service type (a passive side's must
    /// match the REQ's).
    pub qp_type: provider::QpType,
    /// The QP number (24 bits; not 0 or 1).
    pub qpn: u32,
    /// The StartingPSN this side puts in its REQ or REP (24 bits): the
    /// first PSN the QP receives, its RQ PSN in RTR, and the peer's SQ PSN
    /// (IBTA and Linux's CM: each side names the PSN it expects). Draw it
    /// with [`starting_psn`], as bound connections do: a PSN a stranger
    /// can guess lets it inject packets that RoCE cannot authenticate.
    pub starting_psn: u32,
    /// The QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// The QP's receive queue generates end-to-end credits.
    pub end_to_end_flow_control: bool,
}

impl LocalQpAttrs {
    /// A `qp_type` (RC or UC) QP `qpn` that receives from `starting_psn`, with
    /// no SRQ and no end-to-end flow control.
    pub fn new(qp_type: provider::QpType, qpn: u32, starting_psn: u32) -> Self {
        LocalQpAttrs {
            qp_type,
            qpn,
            starting_psn,
            srq: false,
            end_to_end_flow_control: false,
        }
    }
    /// Whether the QP receives from an SRQ.
    pub fn srq(mut self, srq: bool) -> Self {
        self.srq = srq;
        self
    }
    /// Whether the QP's receive queue generates end-to-end credits.
    pub fn end_to_end_flow_control(mut self, on: bool) -> Self {
        self.end_to_end_flow_control = on;
        self
    }

    /// What a bound connection reads from its QP.
    pub(super) fn of(qp: &Obj<Qp>, call: &str) -> Result<Self> {
        LocalQpAttrs {
            qp_type: qp.qp_type(),
            qpn: qp.qpn(),
            starting_psn: starting_psn(),
            srq: qp.has_srq(),
            end_to_end_flow_control: false,
        }
        .checked(call)
    }

    /// Refuse what the wire cannot carry (never masked).
    pub(super) fn checked(self, call: &str) -> Result<Self> {
        if !matches!(self.qp_type, provider::QpType::Rc | provider::QpType::Uc) {
            return Err(Error::invalid_parameter(format!(
                "{call} needs an RC or UC QP, not {:?}",
                self.qp_type
            )));
        }
        if self.qpn < 2 || self.qpn > 0xff_ffff {
            return Err(Error::invalid_parameter(format!(
                "{call}: QPN {:#x} is not a connected QP's number (2..=0xffffff)",
                self.qpn
            )));
        }
        if self.starting_psn > 0xff_ffff {
            return Err(Error::invalid_parameter(format!(
                "{call}: starting PSN {:#x} is out of range (24 bits)",
                self.starting_psn
            )));
        }
        Ok(self)
    }

    pub(super) fn transport(&self) -> TransportType {
        match self.qp_type {
            provider::QpType::Uc => TransportType::Uc,
            _ => TransportType::Rc,
        }
    }
}

/// The QP attributes of one end of a connection, from the REQ and REP it
/// exchanged: what a consumer needs to move a QP it owns (a CM-only CEP,
/// [`connect_unbound`] / [`accept_unbound`]) and what the CM applies to a
/// bound QP. Get it with [`connection_attrs`] (active side after
/// [`Event::ReplyReceived`], passive side after accept) or, before a
/// passive side accepts, [`accept_attrs`].
///
/// [`connect_unbound`]: super::connect_unbound
/// [`accept_unbound`]: super::accept_unbound
/// [`connection_attrs`]: super::connection_attrs
/// [`Event::ReplyReceived`]: crate::proto::Event::ReplyReceived
/// [`accept_attrs`]: super::accept_attrs
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionAttrs {
    /// The local port.
    pub port: u8,
    /// Which end of the REQ's primary path this side is.
    pub end: PathEnd,
    /// Our QP number, as the REQ (active) or REP (passive) carried it.
    pub local_qpn: u32,
    /// Our StartingPSN (in our REQ or REP): the QP's RQ PSN in RTR.
    pub local_starting_psn: u32,
    /// The peer's QP number: the QP's destination QPN.
    pub peer_qpn: u32,
    /// The peer's StartingPSN: the QP's SQ PSN in RTS.
    pub peer_starting_psn: u32,
    /// RDMA READ/atomic requests we accept from the peer
    /// (`max_dest_rd_atomic`, our responder resources).
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we may have outstanding at the peer
    /// (`max_rd_atomic`, our initiator depth).
    pub initiator_depth: u8,
    /// RNR retries toward the peer (what the peer asked for).
    pub rnr_retry_count: u8,
    /// Transport retries (the REQ's).
    pub retry_count: u8,
    /// Local ACK timeout (the REQ's primary path's).
    pub local_ack_timeout: u8,
    /// The REQ's path MTU.
    pub path_mtu: Mtu,
    /// The REQ's primary path, as the active side sent it (the passive
    /// side's peer is its `local_*` end).
    pub path: PathInfo,
    /// RC or UC.
    pub qp_type: provider::QpType,
    /// The peer's QP receives from an SRQ.
    pub peer_srq: bool,
    req: Req,
}

impl ConnectionAttrs {
    /// The attributes one end ends up with, from the REQ and REP.
    pub(super) fn negotiated(port: u8, end: PathEnd, req: &Req, rep: &Rep) -> Self {
        let (local_qpn, local_psn, peer_qpn, peer_psn, rr, id, rnr, peer_srq) = match end {
            PathEnd::Active => (
                req.local_qpn,
                req.starting_psn,
                rep.local_qpn,
                rep.starting_psn,
                rep.initiator_depth,
                rep.responder_resources,
                rep.rnr_retry_count,
                rep.srq,
            ),
            PathEnd::Passive => (
                rep.local_qpn,
                rep.starting_psn,
                req.local_qpn,
                req.starting_psn,
                rep.responder_resources,
                rep.initiator_depth.min(req.responder_resources),
                req.rnr_retry_count,
                req.srq,
            ),
        };
        ConnectionAttrs {
            port,
            end,
            local_qpn,
            local_starting_psn: local_psn,
            peer_qpn,
            peer_starting_psn: peer_psn,
            responder_resources: rr,
            initiator_depth: id,
            rnr_retry_count: rnr,
            retry_count: req.retry_count,
            local_ack_timeout: req.primary_path.local_ack_timeout,
            path_mtu: ibta_mtu(req.path_mtu),
            path: req.primary_path,
            qp_type: match req.transport_service_type {
                TransportType::Uc => provider::QpType::Uc,
                _ => provider::QpType::Rc,
            },
            peer_srq,
            req: *req,
        }
    }

    /// RESET -> INIT on our port (P_Key index 0) with `access`, as the CM
    /// does for a bound QP.
    pub fn init(&self, access: Access) -> QpModify {
        QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(self.port)
            .access(access)
    }

    /// INIT -> RTR toward the peer ([`rtr_attrs`]).
    pub fn rtr(&self) -> QpModify {
        rtr_attrs(
            self.port,
            &self.req,
            self.end,
            self.peer_qpn,
            // A side's StartingPSN is where its own receive queue starts
            // (`../shared/reference/cm-wire.md`, "PSN and resources").
            self.local_starting_psn,
            self.responder_resources,
        )
    }

    /// RTR -> RTS ([`rts_attrs`]).
    pub fn rts(&self) -> QpModify {
        rts_attrs(
            // ... and the peer's is where our sends start.
            self.peer_starting_psn,
            &self.req,
            self.rnr_retry_count,
            self.initiator_depth,
        )
    }
}

/// The QP type a REQ asks for must be the accepting QP's.
pub(super) fn check_transport(req: &Req, qp_type: provider::QpType) -> Result<()> {
    let expected = match req.transport_service_type {
        TransportType::Rc => provider::QpType::Rc,
        TransportType::Uc => provider::QpType::Uc,
        other => {
            return Err(Error::invalid_state(format!(
                "the request asks for {other:?}, which accept cannot serve"
            )))
        }
    };
    if qp_type != expected {
        return Err(Error::invalid_parameter(format!(
            "the request asks for a {expected:?} QP, not {qp_type:?}"
        )));
    }
    Ok(())
}

/// Bring `qp` to INIT for a connection on `port` with `access`, as
/// [`connect`] and [`accept`] do before they send: from RESET, or from ERR
/// (or any other state) through RESET. A QP already in INIT
/// ([`ready_for_connection`], or moved there by its owner) stays there:
/// INIT -> INIT sets the connection's P_Key index (0) and access, and the
/// receives posted meanwhile stay posted (RESET would discard them). An
/// INIT QP on another port than `port` is refused, naming both ports.
///
/// [`connect`]: super::connect
/// [`accept`]: super::accept
/// [`ready_for_connection`]: super::ready_for_connection
pub fn qp_to_init(qp: &Obj<Qp>, port: u8, access: Access) -> Result<()> {
    let attr = qp.query()?;
    check_init_port(&attr, port)?;
    let init = QpModify::to(QpState::Init)
        .pkey_index(0)
        .port(port)
        .access(access);
    if !matches!(attr.state, QpState::Reset | QpState::Init) {
        qp.modify(&QpModify::to(QpState::Reset))?;
    }
    qp.modify(&init)
}

/// A QP in INIT is tied to its port: a connection on another port cannot
/// take it (moving it there would go through RESET and lose its posted
/// receives), so that is refused, naming both ports.
pub(super) fn check_init_port(attr: &provider::QpAttr, port: u8) -> Result<()> {
    if attr.state == QpState::Init && attr.port != port {
        return Err(Error::invalid_parameter(format!(
            "QP {:#x} is in INIT on port {}, the connection is on port {port} \
             (ready it for that port, or from RESET)",
            attr.qpn, attr.port
        )));
    }
    Ok(())
}

/// Put back the state a failed accept found `qp` in (RESET, INIT with its
/// port, P_Key index and access, or ERR): [`accept`] does, and so do the
/// librdmacm-backed CEPs (crate `cep-rdmacm`).
///
/// One exception keeps posted receives from vanishing: a QP found in INIT
/// that the accept had already taken to RTR cannot go back to INIT but
/// through RESET, which discards its receive queue without a completion.
/// It goes to ERR instead, where every receive posted in INIT completes
/// with `WrFlushError` (`docs/cm.md`, "Accept outcomes").
///
/// [`accept`]: super::accept
pub fn restore_qp(qp: &Obj<Qp>, before: &provider::QpAttr) {
    let Ok(now) = qp.query() else { return };
    let init = QpModify::to(QpState::Init)
        .pkey_index(before.pkey_index)
        .port(before.port)
        .access(before.access);
    let _ = match (before.state, now.state) {
        // INIT -> INIT puts the access and P_Key index back, receives kept.
        (QpState::Init, QpState::Init) => qp.modify(&init),
        (QpState::Init, _) => qp.modify(&QpModify::to(QpState::Err)),
        (was, now) if was == now => Ok(()),
        (QpState::Err, _) => qp.modify(&QpModify::to(QpState::Err)),
        _ => qp.modify(&QpModify::to(QpState::Reset)),
    };
}

/// A field the IBTA bounds: refused when out of range, never masked (a
/// masked value is a different request than the caller made).
pub(super) fn spec_bounded(name: &str, value: u8, max: u8) -> Result<u8> {
    if value > max {
        return Err(Error::invalid_parameter(format!(
            "{name} {value} is out of range (at most {max})"
        )));
    }
    Ok(value)
}
