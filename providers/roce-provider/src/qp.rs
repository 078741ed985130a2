//! Queue pairs: attributes and the modify path (through
//! `provider::qp_state`), the transport each one runs once it reaches
//! RTR, posting, and the drive loop that sends what the transport
//! produced and moves its completions to the CQs.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use al::sync::ArcCell;
use al::{Error, Result};
use parking_lot::Mutex;
use provider::qp_state;
use provider::{
    Access, AvAttr, MigState, Mtu, QpAttr, QpCaps, QpModify, QpState, QpType, RecvWr, SendOp,
    SendWr, Sge, UdDest, Wc, WcOpcode, WcStatus,
};
use roce::{Endpoints, IpHeader, Ipv4Header, Ipv6Header, Packet};
use roce_transport::{Config, Counters, Memory, PathGids, QpFilter, Source, Transmit, Transport};

use crate::config::RouteCache;
use crate::cq::{CqInner, Deferred};
use crate::device::{DevShared, PortShared, TxBatch};
use crate::mr::{DevMem, MrCache, Posted, RecvEntry};

pub(crate) const QPN_MASK: u32 = 0x00ff_ffff;
/// Key of port `p`'s GSI QP in the QP map (QP numbers are 24 bits).
pub(crate) const GSI_KEY: u32 = 0x8000_0000;
/// No deadline.
pub(crate) const NO_DEADLINE: u64 = u64::MAX;

/// A shared receive queue.
pub(crate) struct SrqInner {
    pub(crate) pd: u64,
    pub(crate) max_wr: usize,
    pub(crate) max_sge: usize,
    pub(crate) q: Arc<Posted>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        self.q.close();
    }
}

/// A datagram destination kept with a held send.
#[derive(Clone, Copy)]
struct HeldUd {
    av: AvAttr,
    remote_qpn: u32,
    remote_qkey: u32,
    pkey_index: u16,
}

/// A send held in SQD until the QP returns to RTS.
struct HeldSend {
    wr_id: u64,
    op: SendOp,
    sg: Vec<Sge>,
    signaled: bool,
    solicited: bool,
    ud: Option<HeldUd>,
    leased: bool,
}

/// A READ or atomic in the transport: its local target is leased (the
/// response lands there later) until its completion, which the provider
/// always asks the transport for and drops if the caller did not.
struct Responding {
    sg: Vec<Sge>,
    leased: bool,
    signaled: bool,
}

/// What the QP lock protects.
pub(crate) struct QpCore {
    pub(crate) attr: QpAttr,
    /// The transport, from RTR until RESET.
    t: Option<Transport<AvAttr>>,
    /// Sends posted in SQD.
    held: VecDeque<HeldSend>,
    /// READs and atomics given to the transport, oldest first.
    responding: VecDeque<Responding>,
    /// The transport's counters already added to the port's.
    seen: Counters,
    /// Where its packets went last (UD: the last destination).
    route: RouteCache,
    /// The MR its last memory access found.
    mrs_seen: MrCache,
}

pub(crate) struct QpInner {
    pub(crate) dev: Arc<DevShared>,
    /// Key in the device's QP map (the QPN, or `GSI_KEY | port`).
    pub(crate) key: u32,
    /// The QP number packets carry (1 for GSI).
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u64,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) srq: Option<Arc<SrqInner>>,
    pub(crate) core: Mutex<QpCore>,
    /// Receives posted and not yet completed (a copy of the transport's
    /// queue, shared with the memories for their in-flight check); with
    /// an SRQ, the SRQ receives this QP took and has not completed.
    pub(crate) rq: Arc<Posted>,
    /// The transport's next deadline, nanoseconds from the device's base.
    pub(crate) deadline: AtomicU64,
    /// What the receive stage checks this QP's packets against (type,
    /// port, state, keys, the connection's addresses): replaced whenever
    /// those change, read without the QP's lock, so a datagram the stage
    /// refuses never touches the QP ([`roce_transport::receive()`]).
    /// Through `al::sync`, so the `ibal_loom` build models it.
    pub(crate) filter: ArcCell<QpFilter>,
}

fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendImm(_) => WcOpcode::Send,
        SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

pub(crate) fn fresh_attr(
    qpn: u32,
    qp_type: QpType,
    caps: QpCaps,
    sq_sig_all: bool,
    port: u8,
) -> QpAttr {
    QpAttr {
        qpn,
        qp_type,
        state: QpState::Reset,
        caps,
        sq_sig_all,
        pkey_index: 0,
        port,
        qkey: if qp_type == QpType::Gsi {
            provider::GSI_QKEY
        } else {
            0
        },
        access: Access::NONE,
        av: None,
        alt_av: None,
        path_mig_state: MigState::Migrated,
        path_mtu: Mtu::Mtu1024,
        dest_qpn: 0,
        rq_psn: 0,
        sq_psn: 0,
        max_dest_rd_atomic: 0,
        max_rd_atomic: 0,
        min_rnr_timer: 0,
        timeout: 0,
        retry_cnt: 0,
        rnr_retry: 0,
    }
}

/// The receive stage's view of a QP of `dev` with attributes `a`.
pub(crate) fn filter_of(dev: &DevShared, qpn: u32, a: &QpAttr) -> QpFilter {
    // RC and UC take packets only from the GID of their primary path, to
    // their port's GID (its one entry: `sgid_index` 0).
    let path = match (a.qp_type, a.av.and_then(|av| av.grh), dev.port(a.port)) {
        (QpType::Rc | QpType::Uc, Some(grh), Some(port)) => Some(PathGids {
            remote: grh.dgid,
            local: port.gid,
        }),
        _ => None,
    };
    QpFilter {
        qpn,
        qp_type: a.qp_type,
        port: a.port,
        state: a.state,
        pkey: provider::DEFAULT_PKEY,
        qkey: a.qkey,
        path,
    }
}

impl QpCore {
    pub(crate) fn new(attr: QpAttr) -> QpCore {
        QpCore {
            attr,
            t: None,
            held: VecDeque::new(),
            responding: VecDeque::new(),
            seen: Counters::default(),
            route: RouteCache::default(),
            mrs_seen: MrCache::default(),
        }
    }
}

/// Whether a request packet with this opcode takes a receive (SEND
/// first/only, WRITE with immediate last/only, UD SEND), by its low five
/// bits (the same for RC, UC and UD).
fn takes_receive(opcode: u8) -> bool {
    matches!(opcode & 0x1f, 0x00 | 0x04 | 0x05 | 0x09 | 0x0b | 0x17)
}

/// The IP header a datagram from `ep.src()` to `ep.dst()` had, as far as
/// a UDP socket shows it (for the GRH area of UD receives).
fn ip_header(ep: &Endpoints) -> IpHeader {
    match ep {
        Endpoints::V4(e) => IpHeader::V4(Ipv4Header {
            tos: 0,
            identification: e.identification,
            dont_fragment: e.dont_fragment,
            ttl: 64,
            src: *e.src.ip(),
            dst: *e.dst.ip(),
        }),
        Endpoints::V6(e) => IpHeader::V6(Ipv6Header {
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            src: *e.src.ip(),
            dst: *e.dst.ip(),
        }),
    }
}

impl QpInner {
    /// The QP's memory, as its transport sees it, for one call (`seen`:
    /// the QP's [`MrCache`]).
    fn mem<'a>(&'a self, seen: &'a mut MrCache) -> DevMem<'a> {
        DevMem::new(&self.dev.mrs, self.pd, seen)
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            qp_num: self.qpn,
            ..Wc::default()
        }
    }

    pub(crate) fn query(&self) -> QpAttr {
        self.core.lock().attr
    }

    /// The transport configuration for attributes `a`.
    fn config(&self, a: &QpAttr) -> Config {
        let port_mtu = self
            .dev
            .port(a.port)
            .map(|p| p.cfg.mtu)
            .unwrap_or(Mtu::Mtu1024);
        let datagram = self.qp_type.is_datagram();
        let srq_sge = self.srq.as_ref().map_or(0, |s| s.max_sge as u32);
        let clamp = |v: u32, hi: u32| v.clamp(1, hi);
        Config {
            qp_type: self.qp_type,
            qpn: self.qpn,
            dest_qpn: a.dest_qpn,
            sq_psn: a.sq_psn,
            rq_psn: a.rq_psn,
            path_mtu: if datagram { port_mtu } else { a.path_mtu },
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            qkey: a.qkey,
            pkey: provider::DEFAULT_PKEY,
            access: a.access,
            max_send_wr: clamp(self.caps.max_send_wr, 1 << 16),
            max_recv_wr: if self.srq.is_some() {
                1
            } else {
                clamp(self.caps.max_recv_wr, 1 << 16)
            },
            max_sge: clamp(
                self.caps
                    .max_send_sge
                    .max(self.caps.max_recv_sge)
                    .max(srq_sge),
                64,
            ),
        }
    }

    // ----- modify -----

    pub(crate) fn modify(&self, m: &QpModify) -> Result<()> {
        // ACKs held for this QP's peer leave before the QP changes (a move
        // to ERR would otherwise strand them: its peer's last request
        // would stay unacknowledged and end flushed).
        self.flush_held_acks();
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.modify_locked(&mut core, m, &mut d);
            self.publish_filter(&core.attr);
            r
        };
        d.run();
        r
    }

    /// Gives the receive stage the QP's attributes as they are now (under
    /// the QP's lock, after any change of its state, port, keys or path).
    fn publish_filter(&self, attr: &QpAttr) {
        let f = filter_of(&self.dev, self.qpn, attr);
        if self.filter() != f {
            self.filter.store(al::sync::Arc::new(f));
        }
    }

    /// The receive stage's view of this QP now (a copy: no lock, no
    /// reference count).
    pub(crate) fn filter(&self) -> QpFilter {
        // Through a reference, whatever `load` gives: an `arc_swap` guard
        // (normal builds) or the `Arc` itself (`ibal_loom`).
        QpFilter::clone(&self.filter.load())
    }

    fn modify_locked(&self, core: &mut QpCore, m: &QpModify, d: &mut Deferred) -> Result<()> {
        let from = core.attr.state;
        if let Some(cur) = m.cur_state {
            if cur != from {
                return Err(Error::InvalidQpState(
                    format!("cur_state says {cur} but the QP is in {from}").into(),
                ));
            }
        }
        qp_state::check_transition(self.qp_type, from, m.state, m.given())?;
        self.check_values(&core.attr, m)?;
        let to = m.state;
        match to {
            QpState::Reset => {
                self.reset(core);
                return Ok(());
            }
            QpState::Err => {
                self.enter_error(core, d);
                return Ok(());
            }
            _ => {}
        }
        let mut a = core.attr;
        apply(&mut a, m);
        a.state = to;
        let cfg = self.config(&a);
        match core.t.as_mut() {
            None if to == QpState::Rtr => {
                let mut t =
                    Transport::new(cfg).map_err(|e| Error::invalid_parameter(e.to_string()))?;
                // Receives posted in INIT go to the new transport.
                if self.srq.is_none() {
                    for e in &self.rq.lock().wrs {
                        t.post_recv(&RecvWr {
                            wr_id: e.wr_id,
                            sg_list: &e.sg,
                        })
                        .map_err(|e| Error::insufficient_resources(e.to_string()))?;
                    }
                }
                core.t = Some(t);
                core.seen = Counters::default();
            }
            None => {}
            Some(t) => t
                .update_config(cfg)
                .map_err(|e| Error::invalid_parameter(e.to_string()))?,
        }
        core.attr = a;
        if to == QpState::Rts && !core.held.is_empty() {
            // Back from SQD: the held sends go, in order.
            let held: Vec<HeldSend> = core.held.drain(..).collect();
            for h in held {
                if h.leased {
                    self.dev.mrs.release(&h.sg);
                }
                let wr = SendWr {
                    wr_id: h.wr_id,
                    op: h.op,
                    sg_list: &h.sg,
                    signaled: h.signaled,
                    solicited: h.solicited,
                    ud: h.ud.as_ref().map(|u| UdDest {
                        av: &u.av,
                        remote_qpn: u.remote_qpn,
                        remote_qkey: u.remote_qkey,
                        pkey_index: u.pkey_index,
                    }),
                };
                // A refusal here (queue full) cannot name a request the
                // caller still holds: it completes with a flush instead.
                if self.submit(core, &wr, d).is_err() {
                    self.send_cq.push(
                        self.wc(h.wr_id, WcStatus::WrFlushError, send_opcode(&h.op)),
                        d,
                    );
                }
            }
        }
        self.drive(core, d);
        Ok(())
    }

    fn reset(&self, core: &mut QpCore) {
        self.release_leases(core);
        core.t = None;
        self.release_responding(core);
        for h in core.held.drain(..) {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
        }
        self.rq.lock().wrs.clear();
        let port = if self.qp_type == QpType::Gsi {
            core.attr.port
        } else {
            0
        };
        core.attr = fresh_attr(self.qpn, self.qp_type, self.caps, self.sq_sig_all, port);
        core.mrs_seen = MrCache::default();
        self.deadline.store(NO_DEADLINE, Ordering::SeqCst);
    }

    /// To ERR: everything outstanding is flushed, in order.
    fn enter_error(&self, core: &mut QpCore, d: &mut Deferred) {
        if core.attr.state == QpState::Reset {
            core.attr.state = QpState::Err;
            return;
        }
        match core.t.as_mut() {
            Some(t) => {
                t.set_error();
                core.attr.state = QpState::Err;
                self.drive(core, d);
            }
            None => {
                core.attr.state = QpState::Err;
                let wrs: Vec<RecvEntry> = self.rq.lock().wrs.drain(..).collect();
                for e in wrs {
                    self.recv_cq
                        .push(self.wc(e.wr_id, WcStatus::WrFlushError, WcOpcode::Recv), d);
                }
            }
        }
        self.flush_held(core, d);
    }

    fn flush_held(&self, core: &mut QpCore, d: &mut Deferred) {
        for h in core.held.drain(..) {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
            self.send_cq.push(
                self.wc(h.wr_id, WcStatus::WrFlushError, send_opcode(&h.op)),
                d,
            );
        }
    }

    fn check_values(&self, cur: &QpAttr, m: &QpModify) -> Result<()> {
        if self.qp_type == QpType::Gsi && m.port.is_some_and(|p| p != cur.port) {
            return Err(Error::invalid_parameter("a GSI QP's port is fixed"));
        }
        self.dev
            .with_limits(|l| provider::qp_state::check_modify_values(cur.port, m, l))
    }

    // ----- posting -----

    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::invalid_state(
                "the QP uses an SRQ; post receives to the SRQ",
            ));
        }
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.post_recv_locked(&mut core, wrs, &mut d);
            // A receive only changes what the transport has to do when
            // it completes at once (flushed in ERR): skip the drive (a
            // clock read, the send and completion queues' checks) on the
            // application's path otherwise.
            if core.t.as_ref().is_some_and(|t| t.has_completions()) {
                self.drive(&mut core, &mut d);
            }
            r
        };
        d.run();
        r
    }

    fn post_recv_locked(
        &self,
        core: &mut QpCore,
        wrs: &[RecvWr<'_>],
        d: &mut Deferred,
    ) -> Result<()> {
        for (i, wr) in wrs.iter().enumerate() {
            let state = core.attr.state;
            if !state.can_post_recv() {
                return Err(Error::InvalidQpState(
                    format!("receive {i}: cannot post receives in {state}").into(),
                ));
            }
            if wr.sg_list.len() > self.caps.max_recv_sge as usize {
                return Err(Error::invalid_parameter(format!(
                    "receive {i}: {} SGEs, the QP allows {}",
                    wr.sg_list.len(),
                    self.caps.max_recv_sge
                )));
            }
            if state == QpState::Err && core.t.is_none() {
                self.recv_cq
                    .push(self.wc(wr.wr_id, WcStatus::WrFlushError, WcOpcode::Recv), d);
                continue;
            }
            let mut rq = self.rq.lock();
            if rq.wrs.len() >= self.caps.max_recv_wr as usize {
                return Err(Error::insufficient_resources(format!(
                    "receive {i}: the receive queue is full ({} requests)",
                    self.caps.max_recv_wr
                )));
            }
            if let Some(t) = core.t.as_mut() {
                t.post_recv(wr)
                    .map_err(|e| Error::insufficient_resources(format!("receive {i}: {e}")))?;
            }
            let list = &mut *rq;
            for sge in wr.sg_list {
                self.dev.mrs.note_poster(sge, &mut list.seen, &self.rq);
            }
            list.wrs.push_back(RecvEntry {
                wr_id: wr.wr_id,
                sg: wr.sg_list.into(),
            });
        }
        Ok(())
    }

    /// Check a send against the QP type and resolve its destination.
    fn view<'a, H>(
        &self,
        i: usize,
        wr: &SendWr<'a, H>,
        av: Option<&'a crate::device::RoceAv>,
    ) -> Result<Option<HeldUd>> {
        if wr.sg_list.len() > self.caps.max_send_sge as usize {
            return Err(Error::invalid_parameter(format!(
                "send {i}: {} SGEs, the QP allows {}",
                wr.sg_list.len(),
                self.caps.max_send_sge
            )));
        }
        let ok = match self.qp_type {
            QpType::Ud | QpType::Gsi => matches!(wr.op, SendOp::Send | SendOp::SendImm(_)),
            QpType::Uc => matches!(
                wr.op,
                SendOp::Send | SendOp::SendImm(_) | SendOp::Write { .. } | SendOp::WriteImm { .. }
            ),
            QpType::Rc => true,
        };
        if !ok {
            return Err(Error::invalid_parameter(format!(
                "send {i}: {:?} is not available on a {} QP",
                wr.op, self.qp_type
            )));
        }
        if !self.qp_type.is_datagram() {
            return Ok(None);
        }
        let Some(u) = &wr.ud else {
            return Err(Error::invalid_parameter(format!(
                "send {i}: a datagram send needs a destination (ud)"
            )));
        };
        let Some(av) = av else {
            return Err(Error::invalid_parameter(format!(
                "send {i}: the destination names no address vector"
            )));
        };
        if av.pd != self.pd {
            return Err(Error::invalid_parameter(format!(
                "send {i}: the AV belongs to another PD (or another device)"
            )));
        }
        if self.qp_type == QpType::Gsi && u.pkey_index != 0 {
            return Err(Error::invalid_parameter(format!(
                "send {i}: pkey_index {} is outside the port's P_Key table (one entry)",
                u.pkey_index
            )));
        }
        if u.remote_qpn > QPN_MASK {
            return Err(Error::invalid_parameter(format!(
                "send {i}: remote QPN must fit 24 bits"
            )));
        }
        Ok(Some(HeldUd {
            av: av.attr,
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
            pkey_index: u.pkey_index,
        }))
    }

    pub(crate) fn post_send<'v, H>(
        &self,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v crate::device::RoceAv>,
    ) -> Result<()> {
        let mut d = Deferred::default();
        let r = {
            let mut core = self.core.lock();
            let r = self.post_send_locked(&mut core, wrs, av_of, &mut d);
            self.drive(&mut core, &mut d);
            r
        };
        d.run();
        r
    }

    fn post_send_locked<'v, H>(
        &self,
        core: &mut QpCore,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v crate::device::RoceAv>,
        d: &mut Deferred,
    ) -> Result<()> {
        for (i, wr) in wrs.iter().enumerate() {
            let av = if self.qp_type.is_datagram() {
                av_of(i)
            } else {
                None
            };
            let ud = self.view(i, wr, av)?;
            let signaled = wr.signaled || self.sq_sig_all;
            match core.attr.state {
                QpState::Reset | QpState::Init | QpState::Rtr => {
                    return Err(Error::InvalidQpState(
                        format!("send {i}: cannot post sends in {}", core.attr.state).into(),
                    ))
                }
                QpState::Err | QpState::Sqe => {
                    self.send_cq.push(
                        self.wc(wr.wr_id, WcStatus::WrFlushError, send_opcode(&wr.op)),
                        d,
                    );
                    continue;
                }
                QpState::Sqd => {
                    // Refused at post as in RTS (the transport's rule):
                    // held, it would end flushed instead.
                    if core.attr.max_rd_atomic == 0
                        && matches!(
                            wr.op,
                            SendOp::Read { .. }
                                | SendOp::CompareSwap { .. }
                                | SendOp::FetchAdd { .. }
                        )
                    {
                        return Err(Error::invalid_parameter(format!(
                            "send {i}: READ and atomics need max_rd_atomic of at least 1"
                        )));
                    }
                    if core.held.len() >= self.caps.max_send_wr as usize {
                        return Err(Error::insufficient_resources(format!(
                            "send {i}: the send queue is full ({} requests held)",
                            self.caps.max_send_wr
                        )));
                    }
                    let leased = self.dev.mrs.hold(wr.sg_list);
                    core.held.push_back(HeldSend {
                        wr_id: wr.wr_id,
                        op: wr.op,
                        sg: wr.sg_list.to_vec(),
                        signaled,
                        solicited: wr.solicited,
                        ud,
                        leased,
                    });
                    continue;
                }
                QpState::Rts => {}
            }
            let twr = SendWr {
                wr_id: wr.wr_id,
                op: wr.op,
                sg_list: wr.sg_list,
                signaled,
                solicited: wr.solicited,
                ud: ud.as_ref().map(|u| UdDest {
                    av: &u.av,
                    remote_qpn: u.remote_qpn,
                    remote_qkey: u.remote_qkey,
                    pkey_index: u.pkey_index,
                }),
            };
            if let Err(e) = self.submit(core, &twr, d) {
                return Err(match e {
                    Error::InsufficientResources(s) => {
                        Error::InsufficientResources(format!("send {i}: {s}").into())
                    }
                    Error::InvalidParameter(s) => {
                        Error::InvalidParameter(format!("send {i}: {s}").into())
                    }
                    e => e,
                });
            }
        }
        Ok(())
    }

    /// Give one send to the transport (the QP is in RTS). An unreliable
    /// QP checks the local memory first: a send that fails locally
    /// completes with its error and moves the QP to SQE (after the sends
    /// before it completed).
    fn submit(&self, core: &mut QpCore, wr: &SendWr<'_, AvAttr>, d: &mut Deferred) -> Result<()> {
        if core.t.is_none() {
            return Err(Error::InvalidQpState("the QP has no transport".into()));
        }
        if matches!(self.qp_type, QpType::Uc | QpType::Ud | QpType::Gsi) {
            let mtu = core
                .t
                .as_ref()
                .map_or(1024, |t| t.config().path_mtu.bytes()) as u64;
            let status = match self
                .mem(&mut core.mrs_seen)
                .check_local(wr.sg_list, Access::NONE)
            {
                Err(e) => Some(e.local_status()),
                Ok(len) if self.qp_type.is_datagram() && len > mtu => {
                    Some(WcStatus::LocalLengthError)
                }
                Ok(_) => None,
            };
            if let Some(status) = status {
                self.drive(core, d);
                self.send_cq
                    .push(self.wc(wr.wr_id, status, send_opcode(&wr.op)), d);
                core.attr.state = QpState::Sqe;
                self.publish_filter(&core.attr);
                return Ok(());
            }
        }
        let responds = matches!(
            wr.op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        let mut twr = *wr;
        twr.signaled |= responds;
        let r = match self.transport_post(core, &twr) {
            Ok(()) => Ok(()),
            Err(roce_transport::Error::QueueFull) => {
                // Completions waiting to be moved out count against the
                // queue: move them, then try once more.
                self.drive(core, d);
                self.transport_post(core, &twr).map_err(|_| {
                    Error::insufficient_resources(format!(
                        "the send queue is full ({} requests)",
                        self.caps.max_send_wr
                    ))
                })
            }
            Err(e) => Err(Error::invalid_parameter(e.to_string())),
        };
        if r.is_ok() && responds {
            core.responding.push_back(Responding {
                leased: self.dev.mrs.hold(wr.sg_list),
                sg: wr.sg_list.to_vec(),
                signaled: wr.signaled,
            });
        }
        r
    }

    /// Gives `wr` to the transport (the QP has one: `submit` checked).
    fn transport_post(
        &self,
        core: &mut QpCore,
        wr: &SendWr<'_, AvAttr>,
    ) -> std::result::Result<(), roce_transport::Error> {
        let mut mem = self.mem(&mut core.mrs_seen);
        match core.t.as_mut() {
            Some(t) => t.post_send(wr, &mut mem),
            None => Err(roce_transport::Error::InvalidWr("the QP has no transport")),
        }
    }

    /// Gives back the bytes of every send the transport reads as it sends
    /// ([`Memory::lease`]), before the transport goes.
    fn release_leases(&self, core: &mut QpCore) {
        if let Some(t) = core.t.as_mut() {
            for sg in t.take_leases() {
                self.dev.mrs.release(&sg);
            }
        }
    }

    fn release_responding(&self, core: &mut QpCore) {
        for p in core.responding.drain(..) {
            if p.leased {
                self.dev.mrs.release(&p.sg);
            }
        }
    }

    // ----- the drive loop -----

    /// Send what the transport has to send, move its completions to the
    /// CQs, follow its state, and publish its next deadline.
    pub(crate) fn drive(&self, core: &mut QpCore, d: &mut Deferred) {
        self.drive_at(core, d, self.dev.now());
    }

    /// [`QpInner::drive`] at `now` (read by the caller, already holding
    /// the QP's lock).
    fn drive_at(&self, core: &mut QpCore, d: &mut Deferred, now: Duration) {
        let QpCore {
            attr,
            t,
            held,
            responding,
            seen,
            route,
            mrs_seen,
        } = core;
        let Some(t) = t.as_mut() else {
            self.deadline.store(NO_DEADLINE, Ordering::SeqCst);
            return;
        };
        let port = self.dev.port(attr.port);
        let mut mem = self.mem(mrs_seen);
        if let Some(port) = port {
            // The batch (the thread's encoding buffers) only when there
            // is something to send: most drives (after a receive, an ACK)
            // have nothing.
            let mut batch = None;
            while let Some(tx) = t.poll_transmit(now, &mut mem) {
                let b = batch.get_or_insert_with(|| port.batch(self.qpn));
                self.transmit(b, attr.av.as_ref(), &tx, route);
            }
            if let Some(mut b) = batch {
                b.flush();
            }
        } else {
            while t.poll_transmit(now, &mut mem).is_some() {}
        }
        // Sends read from memory as they went have left: their bytes are
        // the application's again, before it can see their completions.
        while let Some(sg) = t.poll_released() {
            self.dev.mrs.release(&sg);
        }
        while let Some(wc) = t.poll_completion() {
            match wc.opcode {
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                    let e = self.rq.lock().wrs.pop_front();
                    if let (true, Some(e), Some(port)) = (wc.grh, &e, port) {
                        if port.cfg.ipv4_grh_as_ipv6 {
                            ipv4_grh_as_ipv6(&mut mem, &e.sg);
                        }
                    }
                    self.recv_cq.push(wc, d);
                }
                WcOpcode::RdmaRead | WcOpcode::CompareSwap | WcOpcode::FetchAdd => {
                    let p = responding.pop_front();
                    if let Some(p) = &p {
                        if p.leased {
                            self.dev.mrs.release(&p.sg);
                        }
                    }
                    if wc.status != WcStatus::Success || p.is_none_or(|p| p.signaled) {
                        self.send_cq.push(wc, d);
                    }
                }
                _ => self.send_cq.push(wc, d),
            }
        }
        if let Some(port) = port {
            let c = t.counters();
            port.counters.add_transport(seen, &c);
            *seen = c;
        }
        let deadline = t.poll_timeout().map_or(NO_DEADLINE, |x| {
            x.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64
        });
        // Every writer holds the QP's lock, so the value read is the last
        // one written; an unchanged deadline (a drive after a SEND taken,
        // most drives) was published and announced to the timer thread
        // by the drive that set it: no store (a locked exchange) again.
        if self.deadline.load(Ordering::Relaxed) != deadline {
            self.deadline.store(deadline, Ordering::SeqCst);
            if deadline != NO_DEADLINE {
                self.dev.timers.armed(deadline);
            }
        }
        if t.state() == QpState::Err && !matches!(attr.state, QpState::Err | QpState::Reset) {
            attr.state = QpState::Err;
            self.publish_filter(attr);
            for h in held.drain(..) {
                if h.leased {
                    self.dev.mrs.release(&h.sg);
                }
                self.send_cq.push(
                    self.wc(h.wr_id, WcStatus::WrFlushError, send_opcode(&h.op)),
                    d,
                );
            }
        }
    }

    fn transmit(
        &self,
        batch: &mut TxBatch<'_>,
        av: Option<&AvAttr>,
        tx: &Transmit<AvAttr>,
        route: &mut RouteCache,
    ) {
        let port = batch.port();
        let av = tx.route.as_ref().or(av);
        let Some(grh) = av.and_then(|a| a.grh) else {
            port.counters.add(&port.counters.tx_errors, 1);
            return;
        };
        let to: SocketAddr =
            self.dev
                .directory
                .resolve_cached(route, &grh.dgid, port.cfg.peer_udp_port);
        batch.push(to, &tx.packet());
    }

    // ----- the driver's entry points -----

    /// A packet for this QP (arrived on `port` over the flow `ep`): the
    /// transport takes it. Sending what it
    /// answers and moving its completions is left to
    /// [`QpInner::drive_now`], which the receive thread calls once per
    /// batch of datagrams. Returns whether the transport took the packet
    /// (so the QP needs driving).
    pub(crate) fn on_packet(
        &self,
        port: &PortShared,
        ep: &Endpoints,
        pkt: &Packet<'_>,
        now: Duration,
    ) -> bool {
        let mut core = self.core.lock();
        self.take_packet(&mut core, port, ep, pkt, now)
    }

    /// [`QpInner::on_packet`] and [`QpInner::drive_now`] in one: for a
    /// packet that arrived alone (a poller's receive of one datagram),
    /// one lock of the QP and one clock reading instead of two. Hooks go
    /// on `d`, for the caller to run once it holds no buffer of the
    /// driver's (a hook may poll).
    pub(crate) fn on_packet_and_drive(
        &self,
        port: &PortShared,
        ep: &Endpoints,
        pkt: &Packet<'_>,
        d: &mut Deferred,
        now: Duration,
    ) {
        let mut core = self.core.lock();
        if self.take_packet(&mut core, port, ep, pkt, now) {
            self.drive_at(&mut core, d, now);
        }
    }

    fn take_packet(
        &self,
        core: &mut QpCore,
        port: &PortShared,
        ep: &Endpoints,
        pkt: &Packet<'_>,
        now: Duration,
    ) -> bool {
        // The stage checked the state against the QP's filter; the QP may
        // have left it since (a modify or destroy between the two).
        if !core.attr.state.can_receive() || core.t.is_none() {
            port.counters.add(&port.counters.rx_bad_state, 1);
            return false;
        }
        let src = Source {
            ip: ip_header(ep),
            src_port: ep.src().port(),
            dst_port: ep.dst().port(),
        };
        let mut mem = self.mem(&mut core.mrs_seen);
        let t = core.t.as_mut().expect("checked above");
        let lend = self
            .srq
            .as_ref()
            .filter(|_| takes_receive(pkt.headers.bth.opcode.value()) && t.recv_queue_len() == 0);
        match lend {
            Some(srq) => {
                // Lend the SRQ's first receive for this packet; keep
                // it here if the packet took it, else give it back.
                let mut sq = srq.q.lock();
                let lent = match sq.wrs.front() {
                    Some(e) => t
                        .post_recv(&RecvWr {
                            wr_id: e.wr_id,
                            sg_list: &e.sg,
                        })
                        .is_ok(),
                    None => false,
                };
                t.handle_packet(now, &src, pkt, &mut mem);
                if lent {
                    if t.recv_queue_len() > 0 {
                        t.unpost_recv();
                    } else if let Some(e) = sq.wrs.pop_front() {
                        let mut rq = self.rq.lock();
                        let list = &mut *rq;
                        for sge in &e.sg {
                            self.dev.mrs.note_poster(sge, &mut list.seen, &self.rq);
                        }
                        list.wrs.push_back(e);
                    }
                }
            }
            None => t.handle_packet(now, &src, pkt, &mut mem),
        }
        true
    }

    /// Sends what the transport has to send and moves its completions to
    /// the CQs (after a batch of packets).
    pub(crate) fn drive_now(&self) {
        let mut d = Deferred::default();
        {
            let mut core = self.core.lock();
            self.drive(&mut core, &mut d);
        }
        d.run();
    }

    /// The transport's deadline passed.
    pub(crate) fn on_timer(&self) {
        let mut d = Deferred::default();
        {
            let mut core = self.core.lock();
            let now = self.dev.now();
            if let Some(t) = core.t.as_mut() {
                t.handle_timeout(now);
            }
            self.drive(&mut core, &mut d);
        }
        d.run();
    }

    /// The QP's end: queued requests end with it (no completions).
    /// Sends the ACKs held on this QP's port ([`crate::device::HeldAcks`]).
    fn flush_held_acks(&self) {
        let port = self.core.lock().attr.port;
        if let Some(p) = self.dev.port(port) {
            p.flush_held();
        }
    }

    pub(crate) fn destroy(&self) {
        self.flush_held_acks();
        let mut core = self.core.lock();
        // A datagram the stage let through just before this still finds
        // no transport below; none is let through after.
        self.filter.store(al::sync::Arc::new(QpFilter {
            state: QpState::Reset,
            ..self.filter()
        }));
        self.release_leases(&mut core);
        core.t = None;
        core.mrs_seen = MrCache::default();
        self.release_responding(&mut core);
        for h in core.held.drain(..) {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
        }
        self.rq.close();
        self.deadline.store(NO_DEADLINE, Ordering::SeqCst);
    }
}

/// Rewrite the GRH area at the start of a UD receive that holds an IPv4
/// header the rxe way (20 zero bytes, then the header) into an IPv6-style
/// header with IPv4-mapped source and destination GIDs.
fn ipv4_grh_as_ipv6(mem: &mut DevMem<'_>, sg: &[Sge]) {
    let mut g = [0u8; provider::GRH_SIZE];
    if mem.gather(sg, 0, &mut g).is_err() || g[20] >> 4 != 4 || g[..20] != [0; 20] {
        return;
    }
    let v4 = |b: &[u8]| std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_ipv6_mapped();
    let (src, dst) = (v4(&g[32..36]), v4(&g[36..40]));
    // IPv4 total length less its 20-byte header is the IPv6 payload.
    let payload = u16::from_be_bytes([g[22], g[23]]).saturating_sub(20);
    let mut out = [0u8; provider::GRH_SIZE];
    out[0] = 0x60;
    out[4..6].copy_from_slice(&payload.to_be_bytes());
    out[6] = 17; // UDP
    out[7] = g[28]; // TTL as the hop limit
    out[8..24].copy_from_slice(&src.octets());
    out[24..40].copy_from_slice(&dst.octets());
    let _ = mem.scatter(sg, 0, &out);
}

/// Apply the attributes of `m` to `a` (values already checked).
fn apply(a: &mut QpAttr, m: &QpModify) {
    if let Some(v) = m.pkey_index {
        a.pkey_index = v;
    }
    if let Some(v) = m.port {
        a.port = v;
    }
    if let Some(v) = m.qkey {
        a.qkey = v;
    }
    if let Some(v) = m.access {
        a.access = v;
    }
    if let Some(v) = m.av {
        a.av = Some(v);
    }
    if let Some(v) = m.alt_av {
        a.alt_av = Some(v);
    }
    match m.path_mig_state {
        Some(MigState::Rearm | MigState::Armed) if a.alt_av.is_some() => {
            a.path_mig_state = MigState::Armed;
        }
        Some(MigState::Rearm | MigState::Armed) => a.path_mig_state = MigState::Rearm,
        Some(MigState::Migrated) if a.path_mig_state == MigState::Armed => {
            if let Some(alt) = a.alt_av.take() {
                a.av = Some(alt);
                a.port = alt.port;
            }
            a.path_mig_state = MigState::Migrated;
        }
        Some(MigState::Migrated) => a.path_mig_state = MigState::Migrated,
        None => {}
    }
    if let Some(v) = m.path_mtu {
        a.path_mtu = v;
    }
    if let Some(v) = m.dest_qpn {
        a.dest_qpn = v;
    }
    if let Some(v) = m.rq_psn {
        a.rq_psn = v;
    }
    if let Some(v) = m.sq_psn {
        a.sq_psn = v;
    }
    if let Some(v) = m.max_dest_rd_atomic {
        a.max_dest_rd_atomic = v;
    }
    if let Some(v) = m.max_rd_atomic {
        a.max_rd_atomic = v;
    }
    if let Some(v) = m.min_rnr_timer {
        a.min_rnr_timer = v;
    }
    if let Some(v) = m.timeout {
        a.timeout = v;
    }
    if let Some(v) = m.retry_cnt {
        a.retry_cnt = v;
    }
    if let Some(v) = m.rnr_retry {
        a.rnr_retry = v;
    }
}
