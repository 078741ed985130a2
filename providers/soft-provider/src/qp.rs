//! Queue pairs and shared receive queues of the soft provider: their
//! queues, attributes and state changes (the data path that moves their
//! work is `engine.rs`, `respond.rs` and `fast.rs`, above).

use std::collections::VecDeque;

use crate::cq::CqInner;
use crate::deferred::EnterError;
use crate::hca_core::HcaCore;
use crate::identity::Identity;
use crate::mr::{MrInner, MrTable, SeenKeys};
use crate::queues::{Posted, RecvEntries, RecvEntry, SgVec};
use al::sync::atomic::AtomicBool;
use al::sync::{Arc, Mutex};
use al::{Error, Result};
use provider::qp_state;
use provider::{
    Access, AvAttr, MigState, QpAttr, QpCaps, QpModify, QpState, QpType, RecvWr, SendOp, Sge, Wc,
    WcOpcode, WcStatus,
};

/// What every deferred-work list above the CQ holds: QPs to move to ERR.
pub(crate) type Deferred = crate::deferred::Deferred<QpInner>;

/// An SRQ's receives.
pub(crate) struct SrqQueue {
    pub(crate) wrs: VecDeque<RecvEntry>,
    /// MR keys this queue registered with (see `MrTable::note_poster`).
    seen: SeenKeys,
    /// An RC sender found the queue empty (`engine::take_recv`): the next
    /// post wakes the senders held by the RNR NAK.
    pub(crate) rnr_nakked: bool,
}

impl RecvEntries for SrqQueue {
    fn entries(&self) -> &VecDeque<RecvEntry> {
        &self.wrs
    }
}

impl RecvEntries for RecvQueue {
    fn entries(&self) -> &VecDeque<RecvEntry> {
        &self.wrs
    }
}

/// A shared receive queue.
pub(crate) struct SrqInner {
    pub(crate) pd: Identity,
    /// Its HCA (the MR table its receives are checked against).
    pub(crate) hca: Arc<HcaCore>,
    pub(crate) max_sge: usize,
    pub(crate) max_wr: usize,
    pub(crate) q: Arc<Posted<SrqQueue>>,
}

impl SrqInner {
    pub(crate) fn new(pd: Identity, hca: Arc<HcaCore>, max_sge: usize, max_wr: usize) -> SrqInner {
        SrqInner {
            pd,
            hca,
            max_sge,
            max_wr,
            q: Posted::new(SrqQueue {
                wrs: VecDeque::with_capacity(max_wr),
                seen: SeenKeys::default(),
                rnr_nakked: false,
            }),
        }
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // The SRQ's end (no QP and no handle left): its receives end here,
        // and the memories it posted into forget its queue.
        self.q.lock().wrs.clear();
        self.q.close();
    }
}

impl SrqInner {
    /// Post receives; `wake` is set when a sender held by an RNR NAK from
    /// a QP of this SRQ should look again (`FabricInner::wake_rnr_waiters`).
    pub(crate) fn post(&self, wrs: &[RecvWr<'_>], wake: &mut bool) -> Result<()> {
        let mut guard = self.q.lock();
        let q = &mut *guard;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > self.max_sge {
                return Err(Error::invalid_parameter(format!(
                    "SRQ receive {i}: {} SGEs, the SRQ allows {}",
                    wr.sg_list.len(),
                    self.max_sge
                )));
            }
            if q.wrs.len() >= self.max_wr {
                return Err(Error::insufficient_resources(format!(
                    "SRQ receive {i}: the SRQ is full ({} requests)",
                    self.max_wr
                )));
            }
            for sge in wr.sg_list {
                self.hca.mrs.note_poster(sge, &mut q.seen, &self.q);
            }
            q.wrs.push_back(RecvEntry {
                wr_id: wr.wr_id,
                sg: SgVec::new(wr.sg_list),
            });
            *wake |= std::mem::take(&mut q.rnr_nakked);
        }
        Ok(())
    }
}

/// Destination of a datagram send, resolved from the work request.
#[derive(Clone, Copy)]
pub(crate) struct UdInfo {
    pub(crate) av: AvAttr,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
    pub(crate) pkey_index: u16,
}

/// A send held in the send queue: behind an RNR NAK, or posted in SQD.
pub(crate) struct PendingWr {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sg: Vec<Sge>,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) ud: Option<UdInfo>,
    /// RNR retries left; `None` before the first attempt.
    pub(crate) rnr_left: Option<u8>,
    /// Whether the bytes it names are leased while it is held.
    pub(crate) leased: bool,
}

/// A borrowed send work request as the engine runs it.
#[derive(Clone, Copy)]
pub(crate) struct WrView<'a> {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sg: &'a [Sge],
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) ud: Option<UdInfo>,
}

impl PendingWr {
    /// Release the request's leases (it leaves the send queue).
    #[inline]
    pub(crate) fn release(&self, mrs: &MrTable) {
        if self.leased {
            mrs.release(&self.sg);
        }
    }
    pub(crate) fn from_view(v: &WrView<'_>, leased: bool) -> PendingWr {
        PendingWr {
            wr_id: v.wr_id,
            op: v.op,
            sg: v.sg.to_vec(),
            signaled: v.signaled,
            solicited: v.solicited,
            ud: v.ud,
            rnr_left: None,
            leased,
        }
    }
    pub(crate) fn view(&self) -> WrView<'_> {
        WrView {
            wr_id: self.wr_id,
            op: self.op,
            sg: &self.sg,
            signaled: self.signaled,
            solicited: self.solicited,
            ud: self.ud,
        }
    }
}

/// Send side: the authoritative attributes and the held sends.
pub(crate) struct SendQueue {
    pub(crate) attr: QpAttr,
    pub(crate) pending: VecDeque<PendingWr>,
    pub(crate) in_retry: bool,
    /// What the batched send path looked up last time (`fast.rs`).
    pub(crate) run_cache: RunCache,
}

/// Receive side: a copy of what the responder needs, and the posted
/// receives (when the QP has no SRQ).
pub(crate) struct RecvQueue {
    pub(crate) state: QpState,
    pub(crate) port: u8,
    pub(crate) pkey_index: u16,
    pub(crate) qkey: u32,
    pub(crate) access: Access,
    /// READs and atomics the responder serves at once
    /// (`max_dest_rd_atomic`): 0 is none, and they are NAKed (RC).
    pub(crate) rd_atomic_resources: u8,
    /// Next expected PSN (RC).
    pub(crate) psn: u32,
    pub(crate) wrs: VecDeque<RecvEntry>,
    /// MR keys this queue registered with (see `MrTable::note_poster`).
    pub(crate) seen: SeenKeys,
    /// An RC sender found the queue empty (`engine::take_recv`): the next
    /// post wakes the senders held by the RNR NAK.
    pub(crate) rnr_nakked: bool,
}

/// A queue pair. Lock order: `sq`, then `rq`, then an SRQ, then CQs and
/// memory; a sender holds its own `sq` while it takes the destination's
/// `rq` (never another `sq`).
pub(crate) struct QpInner {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: Identity,
    pub(crate) hca: Arc<HcaCore>,
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) srq: Option<Arc<SrqInner>>,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) sq: Mutex<SendQueue>,
    /// Shared with the memories it posts into (their in-flight check).
    pub(crate) rq: Arc<Posted<RecvQueue>>,
    pub(crate) destroyed: AtomicBool,
}

pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;

pub(crate) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendImm(_) => WcOpcode::Send,
        SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

impl QpInner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: u32,
        qp_type: QpType,
        pd: Identity,
        hca: Arc<HcaCore>,
        send_cq: Arc<CqInner>,
        recv_cq: Arc<CqInner>,
        srq: Option<Arc<SrqInner>>,
        caps: QpCaps,
        sq_sig_all: bool,
        gsi_port: u8,
    ) -> QpInner {
        let attr = fresh_attr(qpn, qp_type, caps, sq_sig_all, gsi_port);
        QpInner {
            qpn,
            qp_type,
            pd,
            hca,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
            sq: Mutex::new(SendQueue {
                attr,
                pending: VecDeque::new(),
                in_retry: false,
                run_cache: RunCache::default(),
            }),
            rq: Posted::new(RecvQueue {
                state: QpState::Reset,
                port: gsi_port,
                pkey_index: 0,
                qkey: 0,
                access: Access::NONE,
                rd_atomic_resources: 0,
                psn: 0,
                wrs: VecDeque::with_capacity(caps.max_recv_wr as usize),
                seen: SeenKeys::default(),
                rnr_nakked: false,
            }),
            destroyed: AtomicBool::new(false),
        }
    }

    /// The QP number a packet names (QP1 for GSI QPs).
    pub(crate) fn wire_qpn(&self) -> u32 {
        if self.qp_type == QpType::Gsi {
            1
        } else {
            self.qpn
        }
    }

    pub(crate) fn flush_send_wc(&self, wr_id: u64, op: &SendOp, d: &mut Deferred) {
        let wc = Wc {
            wr_id,
            status: WcStatus::WrFlushError,
            opcode: send_opcode(op),
            qp_num: self.wire_qpn(),
            ..Wc::default()
        };
        self.send_cq.push(wc, false, d);
    }

    pub(crate) fn recv_wc_error(&self, wr_id: u64, status: WcStatus, d: &mut Deferred) {
        let wc = Wc {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.wire_qpn(),
            ..Wc::default()
        };
        self.recv_cq.push(wc, false, d);
    }

    /// Drop every queued request without a completion (RESET, and the
    /// QP's end), releasing their leases.
    pub(crate) fn drop_queued(&self, sq: &mut SendQueue, rq: &mut RecvQueue) {
        for p in sq.pending.drain(..) {
            p.release(&self.hca.mrs);
        }
        rq.wrs.clear();
    }

    /// Flush the receive side into ERR (the caller holds `rq`).
    pub(crate) fn flush_rq_locked(&self, rq: &mut RecvQueue, d: &mut Deferred) {
        rq.state = QpState::Err;
        while let Some(e) = rq.wrs.pop_front() {
            self.recv_wc_error(e.wr_id, WcStatus::WrFlushError, d);
        }
    }

    /// Move to ERR with the send queue already locked: flush both queues.
    pub(crate) fn error_locked(&self, sq: &mut SendQueue, d: &mut Deferred) {
        if matches!(sq.attr.state, QpState::Reset) {
            return;
        }
        sq.attr.state = QpState::Err;
        while let Some(p) = sq.pending.pop_front() {
            p.release(&self.hca.mrs);
            self.flush_send_wc(p.wr_id, &p.op, d);
        }
        let mut rq = self.rq.lock();
        self.flush_rq_locked(&mut rq, d);
    }

    /// Move to SQE (datagram and UC send errors): flush held sends.
    pub(crate) fn sqe_locked(&self, sq: &mut SendQueue, d: &mut Deferred) {
        sq.attr.state = QpState::Sqe;
        while let Some(p) = sq.pending.pop_front() {
            p.release(&self.hca.mrs);
            self.flush_send_wc(p.wr_id, &p.op, d);
        }
        let mut rq = self.rq.lock();
        if rq.state != QpState::Err {
            rq.state = QpState::Sqe;
        }
    }

    /// Post receives; `wake` is set when a sender held by an RNR NAK from
    /// this QP should look again (`FabricInner::wake_rnr_waiters`).
    pub(crate) fn post_recv(
        &self,
        wrs: &[RecvWr<'_>],
        d: &mut Deferred,
        wake: &mut bool,
    ) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::invalid_state(
                "the QP uses an SRQ; post receives to the SRQ",
            ));
        }
        let mut rq = self.rq.lock();
        for (i, wr) in wrs.iter().enumerate() {
            if !rq.state.can_post_recv() {
                return Err(Error::InvalidQpState(
                    format!("receive {i}: cannot post receives in {}", rq.state).into(),
                ));
            }
            if wr.sg_list.len() > self.caps.max_recv_sge as usize {
                return Err(Error::invalid_parameter(format!(
                    "receive {i}: {} SGEs, the QP allows {}",
                    wr.sg_list.len(),
                    self.caps.max_recv_sge
                )));
            }
            if rq.state == QpState::Err {
                self.recv_wc_error(wr.wr_id, WcStatus::WrFlushError, d);
                continue;
            }
            if rq.wrs.len() >= self.caps.max_recv_wr as usize {
                return Err(Error::insufficient_resources(format!(
                    "receive {i}: the receive queue is full ({} requests)",
                    self.caps.max_recv_wr
                )));
            }
            let rq = &mut *rq;
            for sge in wr.sg_list {
                self.hca.mrs.note_poster(sge, &mut rq.seen, &self.rq);
            }
            rq.wrs.push_back(RecvEntry {
                wr_id: wr.wr_id,
                sg: SgVec::new(wr.sg_list),
            });
            if rq.rnr_nakked {
                rq.rnr_nakked = false;
                *wake = true;
            }
        }
        Ok(())
    }

    pub(crate) fn query(&self) -> QpAttr {
        let sq = self.sq.lock();
        let rq = self.rq.lock();
        let mut a = sq.attr;
        a.rq_psn = rq.psn;
        a
    }

    /// Validate and apply a modify request.
    /// Entering RTS with sends held (posted in SQD, or queued behind an RNR
    /// wait) hands them to `drain` under the same send-queue lock, so no new
    /// post can overtake them.
    pub(crate) fn modify(
        this: &Arc<Self>,
        m: &QpModify,
        d: &mut Deferred,
        drain: impl FnOnce(&Arc<QpInner>, &mut SendQueue, &mut Deferred),
    ) -> Result<()> {
        let mut sq = this.sq.lock();
        let from = sq.attr.state;
        if let Some(cur) = m.cur_state {
            if cur != from {
                return Err(Error::InvalidQpState(
                    format!("cur_state says {cur} but the QP is in {from}").into(),
                ));
            }
        }
        qp_state::check_transition(this.qp_type, from, m.state, m.given())?;
        this.check_values(&sq.attr, m)?;

        let to = m.state;
        let mut rq = this.rq.lock();
        match to {
            QpState::Reset => {
                this.drop_queued(&mut sq, &mut rq);
                let port = if this.qp_type == QpType::Gsi {
                    sq.attr.port
                } else {
                    0
                };
                sq.attr = fresh_attr(this.qpn, this.qp_type, this.caps, this.sq_sig_all, port);
                rq.state = QpState::Reset;
                rq.port = sq.attr.port;
                rq.pkey_index = 0;
                rq.qkey = 0;
                rq.access = Access::NONE;
                rq.rd_atomic_resources = 0;
                rq.psn = 0;
                return Ok(());
            }
            QpState::Err if from == QpState::Reset => {
                // Any state may go to ERR (IBTA 10.3.1), RESET too; its
                // queues are empty, so there is nothing to flush.
                sq.attr.state = QpState::Err;
                this.flush_rq_locked(&mut rq, d);
                return Ok(());
            }
            QpState::Err => {
                drop(rq);
                this.error_locked(&mut sq, d);
                return Ok(());
            }
            _ => {}
        }
        let a = &mut sq.attr;
        m.apply_to(a);
        // The receive side's PSN lives with the receive queue (`query`
        // reads it from there).
        if let Some(v) = m.rq_psn {
            rq.psn = v;
        }
        a.state = to;
        rq.state = to;
        rq.port = a.port;
        rq.pkey_index = a.pkey_index;
        rq.qkey = a.qkey;
        rq.access = a.access;
        rq.rd_atomic_resources = a.max_dest_rd_atomic;
        drop(rq);
        if to == QpState::Rts && !sq.pending.is_empty() {
            drain(this, &mut sq, d);
        }
        Ok(())
    }

    fn check_values(&self, cur: &QpAttr, m: &QpModify) -> Result<()> {
        self.hca
            .with_limits(|l| qp_state::check_modify_values(cur.port, m, l))
    }
}

fn fresh_attr(qpn: u32, qp_type: QpType, caps: QpCaps, sq_sig_all: bool, port: u8) -> QpAttr {
    QpAttr {
        qpn,
        qp_type,
        state: QpState::Reset,
        caps,
        sq_sig_all,
        pkey_index: 0,
        port,
        qkey: 0,
        access: Access::NONE,
        av: None,
        alt_av: None,
        path_mig_state: MigState::Migrated,
        path_mtu: provider::Mtu::Mtu4096,
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

impl EnterError for QpInner {
    /// Move to ERR (used after locks of other QPs were released).
    fn enter_error(&self, d: &mut Deferred) {
        let mut sq = self.sq.lock();
        if matches!(sq.attr.state, QpState::Reset | QpState::Err) {
            // The receive side may have gone to ERR alone; make it whole.
            if sq.attr.state == QpState::Err {
                let mut rq = self.rq.lock();
                self.flush_rq_locked(&mut rq, d);
            }
            return;
        }
        self.error_locked(&mut sq, d);
    }
}

/// What a run looked up, kept in the sender's [`SendQueue`] (under its
/// lock) for the next run: the destination of the connected QP and the
/// MRs last used on each side. Each entry is checked before use with plain
/// loads, never trusted: the destination must still be the one the QP's
/// attributes name, its HCA still on the fabric and its QP not destroyed;
/// an MR must still be registered under the key. A stale entry is looked
/// up again. `SoftQp`'s drop clears the cache, so two QPs caching each
/// other do not keep each other alive.
#[derive(Default)]
pub(crate) struct RunCache {
    pub(crate) dest: Option<DestCache>,
    pub(crate) src_mr: Option<Arc<MrInner>>,
}

pub(crate) struct DestCache {
    /// The attributes the entry was looked up for.
    pub(crate) av: AvAttr,
    pub(crate) dest_qpn: u32,
    /// The destination HCA (its `removed` flag says it left the fabric).
    pub(crate) core: Arc<HcaCore>,
    pub(crate) dport: u8,
    pub(crate) qp: Arc<QpInner>,
    /// The receive MR last used at the destination.
    pub(crate) mr: Option<Arc<MrInner>>,
    /// The MR last written by RDMA WRITE at the destination.
    pub(crate) rmr: Option<Arc<MrInner>>,
}
