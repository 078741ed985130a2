//! The queue-pair object.
//!
//! A QP is a child of its protection domain and keeps the PD, its CQs and
//! its SRQ alive. It is bound to each CQ and to the SRQ (their `Bindings`)
//! from creation until it is fully gone, so those refuse a user destroy
//! with `ResourceBusy` meanwhile. Its connection id lives in a [`CidSlot`]:
//! destroying the QP tombstones the slot and destroys the connection
//! endpoint it held, by handle, exactly once.
//!
//! State transitions follow the IBTA table in [`provider::qp_state`]: an illegal
//! transition is `InvalidQpState`, a missing or unexpected attribute
//! `InvalidParameter` naming it.

use std::fmt;

use al::sync::Arc;
use al::{create, destroy_raw, AlInstance, Handle, Kind, Obj, Object, Ref, Result};
use hca::verbs::{Av, Cq, Dev, Pd, Srq};
use provider::{Device, QpAttr, QpCaps, QpInit, QpModify, QpType, RecvWr, SendWr};
use smallvec::SmallVec;

use crate::cid::CidSlot;

/// The provider's QP type.
pub type DevQp = <Dev as Device>::Qp;

/// A queue pair.
pub struct Qp {
    pd: Arc<Obj<Pd>>,
    send_cq: Arc<Obj<Cq>>,
    recv_cq: Arc<Obj<Cq>>,
    srq: Option<Arc<Obj<Srq>>>,
    qp: DevQp,
    qp_type: QpType,
    qpn: u32,
    cid: CidSlot,
}

impl Object for Qp {
    const KIND: Kind = Kind::QP;
    al::object_table!(Qp);

    /// Tombstone the CID slot: nothing can connect any more, and the
    /// connection endpoint that was bound (if any) is destroyed here, by the
    /// one caller that got it back from the swap. Its destroy sends the
    /// DREQ or REJ its state calls for.
    fn teardown(obj: &Arc<Obj<Self>>) {
        crate::cid::tombstone(&obj.cid, |cep| {
            let _ = destroy_raw(cep);
        });
    }

    /// `lqpn 18 type RC state RTS port 1 rqpn 19 sq-psn .. rq-psn ..
    /// send-cq .. recv-cq .. cep ..`, as `rdma res show qp` names them; the
    /// state from a query of the provider (`?` if it fails, as it may
    /// mid-destroy).
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.num("lqpn", obj.qpn)
            .text("type", obj.qp_type.to_string());
        match obj.query() {
            Ok(a) => {
                out.text("state", a.state.to_string());
                if a.port != 0 {
                    out.num("port", a.port);
                }
                if !obj.qp_type.is_datagram() && a.state.can_receive() {
                    out.num("rqpn", a.dest_qpn)
                        .num("sq-psn", a.sq_psn)
                        .num("rq-psn", a.rq_psn);
                }
            }
            Err(_) => {
                out.text("state", "?");
            }
        }
        out.handle("send-cq", obj.send_cq.core().handle())
            .handle("recv-cq", obj.recv_cq.core().handle());
        if let Some(srq) = &obj.srq {
            out.handle("srq", srq.core().handle());
        }
        match obj.cid.load() {
            crate::cid::CidState::Bound(cep) => {
                out.handle("cep", cep);
            }
            crate::cid::CidState::Tombstone => {
                out.text("cid", "tombstone");
            }
            crate::cid::CidState::Unbound => {}
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.send_cq.bindings().unbind();
        self.recv_cq.bindings().unbind();
        if let Some(srq) = &self.srq {
            srq.bindings().unbind();
        }
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// The connection-id slot.
    pub fn cid(&self) -> &CidSlot {
        &self.cid
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<Obj<Pd>> {
        &self.pd
    }
    /// Whether it receives through an SRQ.
    pub fn has_srq(&self) -> bool {
        self.srq.is_some()
    }
    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<Obj<Cq>> {
        &self.send_cq
    }
    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<Obj<Cq>> {
        &self.recv_cq
    }
    /// The device.
    pub fn device(&self) -> &Dev {
        self.pd.ca().device()
    }
    /// The provider QP.
    pub fn provider(&self) -> &DevQp {
        &self.qp
    }
    /// Apply a state transition.
    pub fn modify(&self, m: &QpModify) -> Result<()> {
        let from = crate::trace::wants_transitions().then(|| self.query().ok().map(|a| a.state));
        let r = self.device().modify_qp(&self.qp, m);
        crate::trace::modified(self.qpn, self.qp_type, from.flatten(), m, &r);
        r
    }
    /// Current attributes.
    pub fn query(&self) -> Result<QpAttr> {
        self.device().query_qp(&self.qp)
    }

    /// Host bytes this QP costs: the access layer's object, slot and child
    /// entry ([`al::footprint`]) and what its provider holds for it
    /// (`Device::qp_footprint`), in that order.
    pub fn footprint(&self) -> (al::footprint::Footprint, usize) {
        (
            al::footprint::footprint::<Qp>(),
            self.device().qp_footprint(&self.qp),
        )
    }
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("cid", &self.cid)
            .finish()
    }
}

/// What [`create_qp`] needs.
#[derive(Clone, Copy, Debug)]
pub struct QpCreate {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: Handle<Cq>,
    /// CQ for receive completions.
    pub recv_cq: Handle<Cq>,
    /// Receive through this SRQ instead of the QP's own queue.
    pub srq: Option<Handle<Srq>>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Signal every send.
    pub sq_sig_all: bool,
}

impl QpCreate {
    /// The common shape: one CQ for sends and receives, the QP's own
    /// receive queue, default queue sizes, completions only for signaled
    /// sends. Change the rest with struct update syntax
    /// (`QpCreate { srq: Some(s), ..QpCreate::new(QpType::Rc, cq) }`).
    pub fn new(qp_type: QpType, cq: Handle<Cq>) -> Self {
        QpCreate {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        }
    }
    /// Receive completions on `cq` (sends stay on the first CQ).
    pub fn recv_cq(mut self, cq: Handle<Cq>) -> Self {
        self.recv_cq = cq;
        self
    }
    /// Receive through `srq` instead of the QP's own receive queue.
    pub fn srq(mut self, srq: Handle<Srq>) -> Self {
        self.srq = Some(srq);
        self
    }
    /// Queue sizes.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }
    /// A completion for every send, signaled or not.
    pub fn signal_all(mut self) -> Self {
        self.sq_sig_all = true;
        self
    }
}

/// Binds a QP-to-be to its CQs and SRQ; unbinds whatever it bound if
/// creation fails before the QP body owns the bindings.
struct BindGuard<'a> {
    bound: Vec<&'a Arc<Obj<Cq>>>,
    srq: Option<&'a Arc<Obj<Srq>>>,
    armed: bool,
}

impl Drop for BindGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            for cq in &self.bound {
                cq.bindings().unbind();
            }
            if let Some(srq) = self.srq {
                srq.bindings().unbind();
            }
        }
    }
}

/// Create a queue pair in `pd`, in RESET.
pub fn create_qp(al: &Arc<AlInstance>, pd: Handle<Pd>, init: QpCreate) -> Result<Handle<Qp>> {
    let pd = al.resolve_live(pd)?;
    let send_cq = al.resolve(init.send_cq)?.to_arc();
    let recv_cq = al.resolve(init.recv_cq)?.to_arc();
    let srq = match init.srq {
        Some(h) => Some(al.resolve(h)?.to_arc()),
        None => None,
    };
    // Identity by object, not by provider id: the CQs must be of the PD's
    // CA and the SRQ of the PD itself (the provider checks again, with
    // identities unique across devices).
    for cq in [&send_cq, &recv_cq] {
        if !Arc::ptr_eq(cq.ca(), pd.ca()) {
            return Err(al::Error::invalid_parameter(
                "the CQ belongs to another CA than the PD",
            ));
        }
    }
    if let Some(s) = &srq {
        if !Arc::ptr_eq(s.pd(), &pd) {
            return Err(al::Error::invalid_parameter(
                if Arc::ptr_eq(s.pd().ca(), pd.ca()) {
                    "the SRQ belongs to another PD"
                } else {
                    "the SRQ belongs to another CA than the PD"
                },
            ));
        }
    }
    let mut guard = BindGuard {
        bound: Vec::new(),
        srq: None,
        armed: true,
    };
    for cq in [&send_cq, &recv_cq] {
        cq.bindings().bind("CQ")?;
        guard.bound.push(cq);
    }
    if let Some(s) = &srq {
        s.bindings().bind("SRQ")?;
        guard.srq = Some(s);
    }
    let obj = create(al, Some(pd.core()), |_| {
        let device = pd.ca().device();
        let qp = device.create_qp(
            pd.provider(),
            &QpInit {
                qp_type: init.qp_type,
                send_cq: send_cq.provider(),
                recv_cq: recv_cq.provider(),
                srq: srq.as_ref().map(|s| s.provider()),
                caps: init.caps,
                sq_sig_all: init.sq_sig_all,
            },
        )?;
        let qpn = device.qp_num(&qp);
        // From here the QP body owns the bindings (its Drop unbinds).
        guard.armed = false;
        Ok(Qp {
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: srq.clone(),
            qp,
            qp_type: init.qp_type,
            qpn,
            cid: CidSlot::new(),
        })
    })?;
    Ok(obj.handle())
}

/// Apply a state transition to a QP.
pub fn modify_qp(al: &AlInstance, qp: Handle<Qp>, m: &QpModify) -> Result<()> {
    let r = al.resolve(qp)?;
    r.core().check_live()?;
    r.modify(m)
}

/// Query a QP's attributes.
pub fn query_qp(al: &AlInstance, qp: Handle<Qp>) -> Result<QpAttr> {
    al.resolve(qp)?.query()
}

/// How many address vectors one [`post_send`] call holds on the stack.
const AVS_ON_STACK: usize = 16;

/// Post send work requests.
///
/// A datagram (UD) send names its destination's address vector by handle
/// (`SendWr::new(..).to(UdDest { av: &av, .. })`). Before anything is
/// posted, every AV of the list is resolved and checked: it must be a live
/// AV of this AL instance, in the QP's protection domain. A stale, forged
/// or dying AV handle fails the whole call with `InvalidHandle` or
/// `Destroying` (of kind AV), one of another PD or CA with
/// `InvalidParameter` naming the request's index; either way nothing is
/// posted. The AVs are held until the provider has taken the requests.
///
/// On a connected QP (RC, UC) a destination is ignored, as IBTA says; the
/// requests go to the provider as they are: no copy, no lookup.
///
/// Past those checks the provider's rule applies: on error the requests
/// before the failing one are posted, the rest are not, and the error
/// names the index.
pub fn post_send(al: &AlInstance, qp: Handle<Qp>, wrs: &[SendWr<'_, Handle<Av>>]) -> Result<()> {
    let r = al.resolve(qp)?;
    if !r.qp_type.is_datagram() {
        return r.device().post_send(&r.qp, wrs, &|_| None);
    }
    // Resolve and check every AV first, so that a bad one posts nothing;
    // `avs[i]` is request i's.
    let mut avs: SmallVec<[Option<Ref<'static, Obj<Av>>>; AVS_ON_STACK]> = SmallVec::new();
    for (i, wr) in wrs.iter().enumerate() {
        avs.push(match &wr.ud {
            Some(ud) => Some(resolve_av(al, &r, i, *ud.av)?),
            None => None,
        });
    }
    r.device().post_send(&r.qp, wrs, &|i| {
        avs.get(i).and_then(Option::as_ref).map(|av| av.provider())
    })
}

/// Resolve send `i`'s AV handle and check it may be used on `qp`.
fn resolve_av(al: &AlInstance, qp: &Qp, i: usize, av: Handle<Av>) -> Result<Ref<'static, Obj<Av>>> {
    let r = al.resolve(av)?;
    r.core().check_live()?;
    if !Arc::ptr_eq(r.pd(), &qp.pd) {
        return Err(al::Error::invalid_parameter(
            if Arc::ptr_eq(r.pd().ca(), qp.pd.ca()) {
                format!("send {i}: the AV belongs to another PD than the QP")
            } else {
                format!("send {i}: the AV belongs to another CA than the QP")
            },
        ));
    }
    Ok(r)
}

/// Post receive work requests.
pub fn post_recv(al: &AlInstance, qp: Handle<Qp>, wrs: &[RecvWr<'_>]) -> Result<()> {
    let r = al.resolve(qp)?;
    r.device().post_recv(&r.qp, wrs)
}
