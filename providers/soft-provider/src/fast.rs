//! The batched RC SEND and RDMA WRITE path.
//!
//! A list of RC SENDs posted in one call usually goes to one destination
//! QP, from one source MR, into receives that name one destination MR; a
//! list of RDMA WRITEs, from one source MR into one remote MR.
//! [`rc_run`] runs such a list as one *run* (SENDs or WRITEs, as the
//! first request decides): it does the per-call work once (route,
//! destination lookup, the destination's receive lock, both MR lookups,
//! both memory locks, both CQ locks) and then, per request, only the
//! checks, the copy and the completions.
//!
//! The run stops, with nothing done for that request, at the first send
//! that is not plain: another opcode, another key, more than one SGE, no
//! receive posted (RNR), a receive too short, a bounds or key failure, a
//! PSN mismatch, raw (caller-managed) memory. The caller runs that request
//! on the general path in `engine.rs`, which produces whatever error
//! completion or state change the request calls for, and then tries a new
//! run. So the results are those of the general path, request by request:
//! the run only skips work that is the same for every request in it.
//!
//! Locks are taken in the provider's order: the sender's `sq` (held by the
//! caller), the destination's `rq`, the memories (address order, one lock
//! when both MRs share a memory), then the CQs (address order, one lock
//! when one CQ serves both QPs). A user may hold a buffer's lock while it
//! polls a CQ (memory, then CQ), which is the same order. Completions are
//! pushed while `rq` and `sq` are held, as on the general path, so a flush
//! of the remaining receives or sends (done under those locks) cannot
//! overtake them in the CQ, and each completion is pushed right after its
//! copy, in the general path's order. A CQ's hooks (its completion
//! notification, its overflow events) are queued when the run unlocks it:
//! each CQ's own events keep their order, but when a run overflows two CQs
//! their events are not interleaved as the general path would interleave
//! them (nothing orders events of different CQs).

use crate::cq::CqPush;
use crate::engine::imm_of;
use crate::mr::{MrInner, MrTable};
use crate::node::FabricInner;
use crate::qp::{
    send_opcode, Deferred, DestCache, QpInner, RecvQueue, RunCache, SendQueue, PSN_MASK,
};
use crate::respond::{pkey_match, MAX_MSG};
use al::sync::atomic::Ordering;
use al::sync::Arc;
use provider::buffer::for_providers::LockedPair;
use provider::{Access, QpState, QpType, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};

/// Requests one run takes at most (the caller starts the next run).
const RUN_MAX: usize = 64;

/// What a run does with its bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// SENDs (with or without immediate) into posted receives whose one
    /// SGE is under `recv_key`.
    Send { recv_key: u32 },
    /// RDMA WRITEs (without immediate) under `rkey`.
    Write { rkey: u32 },
}

/// The plain shape a run accepts: the run's kind of operation, one
/// non-empty SGE under `lkey`. On an RC QP that allows at least one SGE
/// this is everything the general path's request validation checks (the
/// `ud` field is ignored on connected QPs), so a plain request is valid.
#[inline]
fn plain<H>(wr: &SendWr<'_, H>, lkey: u32, kind: Kind) -> bool {
    let op = match (kind, wr.op) {
        (Kind::Send { .. }, SendOp::Send | SendOp::SendImm(_)) => true,
        (Kind::Write { rkey }, SendOp::Write { rkey: r, .. }) => r == rkey,
        _ => false,
    };
    op && one_sge(wr).is_some_and(|sge| sge.lkey == lkey)
}

/// The request's gather list when it is one non-empty element.
#[inline]
fn one_sge<H>(wr: &SendWr<'_, H>) -> Option<Sge> {
    match wr.sg_list {
        [sge] if sge.length != 0 => Some(*sge),
        _ => None,
    }
}

/// Run plain RC SENDs or RDMA WRITEs from the start of `wrs`. Returns
/// how many ran; 0 means the first needs the general path.
pub(crate) fn rc_run<H>(
    f: &FabricInner,
    qp: &QpInner,
    sq: &mut SendQueue,
    wrs: &[SendWr<'_, H>],
    d: &mut Deferred,
) -> usize {
    let Some(first) = wrs.first() else {
        return 0;
    };
    if qp.qp_type != QpType::Rc
        || qp.caps.max_send_sge == 0
        || sq.attr.state != QpState::Rts
        || !sq.pending.is_empty()
        || !matches!(
            first.op,
            SendOp::Send | SendOp::SendImm(_) | SendOp::Write { .. }
        )
    {
        return 0;
    }
    let Some(Sge { lkey, .. }) = one_sge(first) else {
        return 0;
    };
    let Some(port) = qp.hca.port(sq.attr.port) else {
        return 0;
    };
    let Some(&pkey) = port.pkeys.get(sq.attr.pkey_index as usize) else {
        return 0;
    };
    if !port.is_active() {
        return 0;
    }
    // The cache is moved out for the run (so the run can borrow it and
    // `sq` at once) and put back after.
    let mut cache = std::mem::take(&mut sq.run_cache);
    let ran = match RunCache::dest(&mut cache.dest, sq, f) {
        Some(dest) => run_cached(
            qp,
            sq,
            wrs,
            d,
            dest,
            &mut cache.src_mr,
            lkey,
            pkey,
            port.lid(),
        ),
        None => 0,
    };
    sq.run_cache = cache;
    f.stats
        .batched_sends
        .fetch_add(ran as u64, Ordering::Relaxed);
    ran
}

/// The run proper, with the destination and the MR slots from the cache.
#[allow(clippy::too_many_arguments)]
fn run_cached<H>(
    qp: &QpInner,
    sq: &mut SendQueue,
    wrs: &[SendWr<'_, H>],
    d: &mut Deferred,
    dest_cache: &mut DestCache,
    src_slot: &mut Option<Arc<MrInner>>,
    lkey: u32,
    pkey: u16,
    slid: u16,
) -> usize {
    let DestCache {
        core: node,
        dport,
        qp: dest,
        mr: dst_slot,
        rmr: rmr_slot,
        ..
    } = dest_cache;
    let dport = *dport;
    if dest.qp_type != QpType::Rc || dest.srq.is_some() {
        return 0;
    }
    let Some(src_mr) = RunCache::mr(src_slot, &qp.hca.mrs, lkey) else {
        return 0;
    };
    if src_mr.pd != qp.pd {
        return 0;
    }
    let mut rq = dest.rq.lock();
    if !rq.state.can_receive() || rq.port != dport {
        return 0;
    }
    let dpkey = node.pkey(dport, rq.pkey_index);
    if !pkey_match(pkey, dpkey) {
        return 0;
    }
    // Where the bytes go: the first request decides the run's kind.
    let (kind, dst_mr) = match wrs[0].op {
        SendOp::Write { rkey, .. } => {
            if !rq.access.contains(Access::REMOTE_WRITE) {
                return 0;
            }
            let Some(mr) = RunCache::mr(rmr_slot, &dest.hca.mrs, rkey) else {
                return 0;
            };
            if mr.pd != dest.pd || !mr.access.contains(Access::REMOTE_WRITE) {
                return 0;
            }
            (Kind::Write { rkey }, mr)
        }
        _ => {
            let Some(recv_key) = rq.wrs.front().and_then(|e| match e.sg.as_slice() {
                [one] => Some(one.lkey),
                _ => None,
            }) else {
                return 0;
            };
            let Some(mr) = RunCache::mr(dst_slot, &dest.hca.mrs, recv_key) else {
                return 0;
            };
            if mr.pd != dest.pd || !mr.access.contains(Access::LOCAL_WRITE) {
                return 0;
            }
            (Kind::Send { recv_key }, mr)
        }
    };
    let mtu = sq.attr.path_mtu.bytes();
    debug_assert!(mtu.is_power_of_two());
    let run = Run {
        qp,
        dest,
        src_mr,
        dst_mr,
        kind,
        lkey,
        slid,
        mtu_shift: mtu.trailing_zeros(),
    };
    let wrs = &wrs[..wrs.len().min(RUN_MAX)];
    // Unlocked on the way out: the CQs (in `with_cqs`), then the memories,
    // then `rq` (held while the receive completions were pushed).
    let Some(mut mem) = LockedPair::lock(&src_mr.mem, &dst_mr.mem) else {
        return 0; // raw memory: the general path, request by request
    };
    run.with_cqs(d, |cqs| run.copy_loop(sq, &mut rq, wrs, cqs, &mut mem))
}

/// What a run needs besides the queues.
struct Run<'r> {
    qp: &'r QpInner,
    dest: &'r QpInner,
    src_mr: &'r MrInner,
    /// The receive MR (SENDs) or the remote MR (WRITEs).
    dst_mr: &'r MrInner,
    kind: Kind,
    lkey: u32,
    slid: u16,
    mtu_shift: u32,
}

/// The run's CQs, locked: the destination's receive CQ and the sender's
/// send CQ, or one CQ serving both.
struct RunCqs<'c> {
    recv: CqPush<'c>,
    send: Option<CqPush<'c>>,
}

impl<'c> RunCqs<'c> {
    fn send(&mut self) -> &mut CqPush<'c> {
        match &mut self.send {
            Some(s) => s,
            None => &mut self.recv,
        }
    }
}

impl Run<'_> {
    /// Lock the run's CQs (two in address order), run `body`, queue the
    /// CQ hooks on `d`.
    fn with_cqs(&self, d: &mut Deferred, body: impl FnOnce(&mut RunCqs<'_>) -> usize) -> usize {
        let (rcq, scq) = (&*self.dest.recv_cq, &*self.qp.send_cq);
        let mut cqs = if std::ptr::eq(rcq, scq) {
            RunCqs {
                recv: rcq.begin_push(),
                send: None,
            }
        } else if (rcq as *const _ as usize) < (scq as *const _ as usize) {
            let recv = rcq.begin_push();
            RunCqs {
                recv,
                send: Some(scq.begin_push()),
            }
        } else {
            let send = Some(scq.begin_push());
            RunCqs {
                recv: rcq.begin_push(),
                send,
            }
        };
        let ran = body(&mut cqs);
        let RunCqs { recv, send } = cqs;
        recv.finish(d);
        if let Some(s) = send {
            s.finish(d);
        }
        ran
    }

    /// Check, copy (through the memories the run has locked) and complete
    /// requests until one is not plain. Returns how many ran.
    fn copy_loop<H>(
        &self,
        sq: &mut SendQueue,
        rq: &mut RecvQueue,
        wrs: &[SendWr<'_, H>],
        cqs: &mut RunCqs<'_>,
        mem: &mut LockedPair<'_>,
    ) -> usize {
        let mut k = 0;
        for wr in wrs {
            if !plain(wr, self.lkey, self.kind) {
                break;
            }
            let sge = wr.sg_list[0]; // one element: `plain` checked
            let len = sge.length as usize;
            if len > MAX_MSG || rq.psn != sq.attr.sq_psn {
                break;
            }
            // The whole SGE must lie in the MR (as `resolve_local` checks).
            let Some(so) = self.src_mr.locate(sge.addr, len) else {
                break;
            };
            // The destination range, and the receive a SEND consumes.
            let (dofs, recv_id) = match (self.kind, wr.op) {
                (Kind::Send { recv_key }, _) => {
                    let Some(entry) = rq.wrs.front() else {
                        break; // RNR: the general path retries or fails it
                    };
                    let [rsge] = entry.sg.as_slice() else {
                        break;
                    };
                    if rsge.lkey != recv_key || (rsge.length as usize) < len {
                        break;
                    }
                    // The whole receive SGE must lie in its MR, too.
                    let Some(dofs) = self.dst_mr.locate(rsge.addr, rsge.length as usize) else {
                        break;
                    };
                    (dofs, Some(entry.wr_id))
                }
                (Kind::Write { .. }, SendOp::Write { remote_addr, .. }) => {
                    let Some(dofs) = self.dst_mr.locate(remote_addr, len) else {
                        break;
                    };
                    (dofs, None)
                }
                _ => break,
            };
            if recv_id.is_some() {
                rq.wrs.pop_front();
            }
            mem.copy(so, dofs, len);
            let npkts = (len.wrapping_sub(1) >> self.mtu_shift) as u32 + 1;
            rq.psn = (rq.psn + npkts) & PSN_MASK;
            sq.attr.sq_psn = (sq.attr.sq_psn + npkts) & PSN_MASK;
            if let Some(wr_id) = recv_id {
                cqs.recv.push(
                    Wc {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: len as u32,
                        imm: imm_of(&wr.op),
                        qp_num: self.dest.wire_qpn(),
                        src_qp: self.qp.qpn,
                        slid: self.slid,
                        solicited: wr.solicited,
                        ..Wc::default()
                    },
                    wr.solicited,
                );
            }
            if wr.signaled || self.qp.sq_sig_all {
                cqs.send().push(
                    Wc {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        opcode: send_opcode(&wr.op),
                        byte_len: len as u32,
                        qp_num: self.qp.wire_qpn(),
                        ..Wc::default()
                    },
                    false,
                );
            }
            k += 1;
        }
        k
    }
}

impl RunCache {
    /// Forget everything (the QP is going away).
    pub(crate) fn clear(&mut self) {
        *self = RunCache::default();
    }

    /// The destination of `sq`'s connection, through the cache entry
    /// `slot` (moved out of `sq`): checked, or looked up again.
    fn dest<'s>(
        slot: &'s mut Option<DestCache>,
        sq: &SendQueue,
        f: &FabricInner,
    ) -> Option<&'s mut DestCache> {
        let av = sq.attr.av?;
        let dest_qpn = sq.attr.dest_qpn;
        let valid = slot.as_ref().is_some_and(|c| {
            c.av == av
                && c.dest_qpn == dest_qpn
                && !c.core.removed.load(Ordering::Acquire)
                && !c.qp.destroyed.load(Ordering::Acquire)
        });
        if !valid {
            *slot = None;
            let (node, dport) = f.route(&av)?;
            let qp = node.lookup(dest_qpn, dport)?;
            *slot = Some(DestCache {
                av,
                dest_qpn,
                core: node.core.clone(),
                dport,
                qp,
                mr: None,
                rmr: None,
            });
        }
        slot.as_mut()
    }

    /// The MR `key` names in `table`, through the one-entry cache `slot`
    /// (borrowed from it: no reference count changes on a hit).
    fn mr<'s>(
        slot: &'s mut Option<Arc<MrInner>>,
        table: &MrTable,
        key: u32,
    ) -> Option<&'s MrInner> {
        let hit = slot
            .as_ref()
            .is_some_and(|mr| mr.key == key && !mr.deregistered.load(Ordering::Acquire));
        if !hit {
            *slot = table.lookup(key);
        }
        slot.as_deref()
    }
}
