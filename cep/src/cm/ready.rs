//! Receives before the connection: [`ready_for_connection`] takes a new
//! (or failed) RC or UC QP to INIT on a port, as rdma_cm's `rdma_create_qp`
//! leaves its QP, so the consumer posts its receives first and then
//! connects or accepts. `connect` and `accept` on that port take the QP
//! from INIT (`attrs.rs`, `qp_to_init`) without passing through RESET.

use al::{AlInstance, Error, Handle, Result};
use provider::{Access, QpModify, QpState, QpType};
use qp::{CidState, Qp};

use super::attrs::check_init_port;
use super::objects::bind_error;

/// The access a readied QP has until its connection sets the one its
/// [`ConnectRequest`] or [`AcceptReply`] asks for: nothing for a peer
/// (there is none yet), as rdma_cm's INIT before its CM sets the rest.
///
/// ```
/// use cep::cm::READY_ACCESS;
/// use provider::Access;
/// // The peer gets its rights from the connection, not before.
/// assert!(!READY_ACCESS.contains(Access::REMOTE_WRITE));
/// assert!(!READY_ACCESS.contains(Access::REMOTE_READ));
/// ```
///
/// [`ConnectRequest`]: super::ConnectRequest
/// [`AcceptReply`]: super::AcceptReply
pub const READY_ACCESS: Access = Access::LOCAL_WRITE;

/// Take `qp` (RC or UC) to INIT on `port` with P_Key index 0 and
/// [`READY_ACCESS`], before it has a connection, so receives can be posted
/// now and are there when the peer's first SEND arrives. Then [`connect`]
/// (with `request.port == port`; `connect_ip` with the same port) or
/// [`accept`] (on a request that came to `port`) takes it INIT -> RTR ->
/// RTS with the connection's access; the receives stay posted throughout.
///
/// * From RESET: RESET -> INIT. From ERR (a connection that failed, once
///   its CEP is gone): ERR -> RESET -> INIT; every receive posted before
///   had already completed with `WrFlushError` in ERR.
/// * Already in INIT on `port`: nothing to do, `Ok(())`. In INIT on
///   another port: `InvalidParameter` naming both (as `connect` and
///   `accept` refuse such a QP); RTR, RTS or later: `InvalidState`.
/// * A QP bound to a CEP is refused with `AlreadyConnected`
///   (`QpInTimewait` while its old connection is in timewait); a UD QP
///   with `InvalidParameter` (it is readied with a Q_Key, by
///   `QpModify`).
///
/// What a connection that fails does to a readied QP is what it does to
/// any bound QP: a REJ or a timeout takes it to ERR and its receives
/// complete with `WrFlushError` (`docs/cm.md`, "Receives before the
/// connection").
///
/// ```
/// use al::Al;
/// use cep::cm::ready_for_connection;
/// use hca::verbs;
/// use provider::{QpState, QpType, RecvWr, RegisteredBuffer, Access, Sge};
/// use qp::{create_qp, post_recv, query_qp, QpCreate};
/// use soft_provider::{Fabric, HcaConfig, SoftProvider};
/// # fn main() -> al::Result<()> {
/// let fabric = Fabric::new();
/// fabric.add_hca(HcaConfig::new(0xa000, &[1]))?;
/// let provider = SoftProvider::new(fabric);
/// let al = Al::open()?;
/// let inst = al.instance();
/// let ca = verbs::open_ca(inst, &provider, 0xa000)?;
/// let pd = verbs::alloc_pd(inst, ca)?;
/// let cq = verbs::create_cq(inst, ca, 16, None, None)?;
/// let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq))?;
/// let buf = RegisteredBuffer::new(64);
/// let lkey = verbs::register_mr(inst, pd, &buf, 0, 64, 0, Access::LOCAL_WRITE)?;
/// let lkey = al.resolve(lkey)?.lkey();
/// let sge = [Sge { addr: 0, length: 64, lkey }];
/// let recv = [RecvWr { wr_id: 1, sg_list: &sge }];
/// assert!(post_recv(inst, qp, &recv).is_err(), "no receives in RESET");
///
/// ready_for_connection(inst, qp, 1)?;
/// assert_eq!(query_qp(inst, qp)?.state, QpState::Init);
/// assert_eq!(query_qp(inst, qp)?.access, cep::cm::READY_ACCESS);
/// post_recv(inst, qp, &recv)?; // there when the peer's first SEND comes
/// ready_for_connection(inst, qp, 1)?; // again: nothing to do
/// assert!(ready_for_connection(inst, qp, 2).is_err(), "INIT on port 1");
/// assert!(al.close()?.is_clean());
/// # Ok(())
/// # }
/// ```
///
/// [`connect`]: super::connect
/// [`accept`]: super::accept
pub fn ready_for_connection(al: &AlInstance, qp: Handle<Qp>, port: u8) -> Result<()> {
    let qp = al.resolve_live(qp)?;
    if !matches!(qp.qp_type(), QpType::Rc | QpType::Uc) {
        return Err(Error::invalid_parameter(format!(
            "ready_for_connection needs an RC or UC QP, not {:?}",
            qp.qp_type()
        )));
    }
    if let CidState::Bound(_) = qp.cid().load() {
        return Err(bind_error(&qp, Error::AlreadyConnected));
    }
    let attr = qp.query()?;
    check_init_port(&attr, port)?;
    match attr.state {
        QpState::Init => return Ok(()),
        QpState::Reset => {}
        QpState::Err => qp.modify(&QpModify::to(QpState::Reset))?,
        other => {
            return Err(Error::invalid_state(format!(
                "ready_for_connection needs a QP in RESET or ERR, not {other:?} \
                 (a connected QP is readied again once its connection is over)"
            )))
        }
    }
    qp.modify(
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(port)
            .access(READY_ACCESS),
    )
}
