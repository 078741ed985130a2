//! The data path: running send work requests and the responder side.
//!
//! Synchronous delivery: the sender's thread performs the receiver's
//! processing under the destination QP's receive lock, copying straight
//! from the source MR to the destination MR (one copy). Datagram and UC
//! packets go through the fabric's fault queue instead when fault injection
//! is on (see `fabric.rs`).

use al::sync::atomic::Ordering;
use al::sync::{Arc, MutexGuard};

use crate::cq::Deferred;
use crate::fabric::{FabricInner, HcaNode, Packet, PktKind, PortCore};
use crate::mr::{copy_lists, gather, resolve_local, resolve_remote, scatter, Payload, SegList};
use crate::qp::{
    send_opcode, PendingWr, QpInner, RecvEntry, RecvQueue, SendQueue, SrqQueue, UdInfo, WrView,
    PSN_MASK,
};
use provider::{
    Access, Gid, GrhAttr, QpState, QpType, SendOp, Wc, WcOpcode, WcStatus, GRH_SIZE, GSI_QKEY,
    MAD_SIZE,
};

/// Largest message (IBTA: 2^31).
pub(crate) const MAX_MSG: usize = 1 << 31;

/// What running a send produced.
pub(crate) enum Outcome {
    Done {
        status: WcStatus,
        byte_len: u32,
    },
    /// The responder had no receive posted (RC): retry later.
    Rnr,
}

fn done(status: WcStatus, byte_len: usize) -> Outcome {
    Outcome::Done {
        status,
        byte_len: byte_len as u32,
    }
}

/// The responder's verdict.
pub(crate) enum Resp {
    Ok,
    Rnr,
    /// Silently dropped (datagram/UC rules).
    Dropped,
    /// NAK: the requester completes with this status.
    Nak(WcStatus),
}

/// Who sent a packet.
#[derive(Clone, Copy)]
pub(crate) struct SrcInfo {
    pub(crate) slid: u16,
    pub(crate) sqpn: u32,
    pub(crate) pkey: u16,
    pub(crate) qkey: u32,
    pub(crate) sgid: Gid,
    pub(crate) grh: Option<GrhAttr>,
    pub(crate) solicited: bool,
}

/// IBTA P_Key match: same key, and at least one side a full member.
pub(crate) fn pkey_match(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a & 0x7fff) != 0 && ((a | b) & 0x8000) != 0
}

fn packets(len: usize, mtu: usize) -> u32 {
    len.div_ceil(mtu).max(1) as u32
}

/// Submit one send on a QP whose `sq` the caller holds.
pub(crate) fn submit(
    f: &FabricInner,
    qp: &Arc<QpInner>,
    sq: &mut SendQueue,
    wr: &WrView<'_>,
    d: &mut Deferred,
) -> al::Result<()> {
    match sq.attr.state {
        QpState::Reset | QpState::Init | QpState::Rtr => Err(al::Error::InvalidQpState(
            format!("cannot post sends in {}", sq.attr.state).into(),
        )),
        QpState::Err | QpState::Sqe => {
            qp.flush_send_wc(wr.wr_id, &wr.op, d);
            Ok(())
        }
        QpState::Sqd => hold(qp, sq, wr),
        QpState::Rts => {
            if !sq.pending.is_empty() {
                return hold(qp, sq, wr);
            }
            match execute(f, qp, sq, wr, d) {
                Outcome::Done { status, byte_len } => complete(qp, sq, wr, status, byte_len, d),
                Outcome::Rnr => {
                    let left = sq.attr.rnr_retry;
                    if left == 0 {
                        complete(qp, sq, wr, WcStatus::RnrRetryExceeded, 0, d);
                    } else {
                        let mut p = PendingWr::from_view(wr, lease_of(qp, wr));
                        p.rnr_left = Some(left);
                        sq.pending.push_back(p);
                        wait_rnr(f, qp, sq, d);
                    }
                }
            }
            Ok(())
        }
    }
}

/// Lease the bytes of a send that stays in the send queue past its post.
fn lease_of(qp: &QpInner, wr: &WrView<'_>) -> bool {
    qp.hca.mrs.hold(wr.sg)
}

fn hold(qp: &QpInner, sq: &mut SendQueue, wr: &WrView<'_>) -> al::Result<()> {
    if sq.pending.len() >= qp.caps.max_send_wr as usize {
        return Err(al::Error::insufficient_resources(format!(
            "the send queue is full ({} requests held)",
            qp.caps.max_send_wr
        )));
    }
    sq.pending
        .push_back(PendingWr::from_view(wr, lease_of(qp, wr)));
    Ok(())
}

/// Queue `qp` for RNR retries. The destination remembers (under its
/// receive lock) that a sender found it empty, and a receive posted to it
/// then wakes the senders aimed at it (`FabricInner::wake_rnr_waiters`),
/// so no sender depends on `Fabric::progress` to see one; the fabric's
/// tick still counts `rnr_retry` down. A receive posted after this sender
/// found the queue empty but before it was listed would wake nobody, so
/// the sender looks once more after listing itself (without spending a
/// retry): either that look takes the receive, or it marks the queue again
/// and the post that comes later finds the sender listed.
fn wait_rnr(f: &FabricInner, qp: &Arc<QpInner>, sq: &mut SendQueue, d: &mut Deferred) {
    if !sq.in_retry {
        sq.in_retry = true;
        f.add_rnr_waiter(qp.clone());
    }
    // Also when already listed: a look that succeeded earlier can leave
    // the QP listed with nothing held until the next tick.
    retry_pending(f, qp, sq, d, false);
}

/// Generate the send completion and apply the error rules.
pub(crate) fn complete(
    qp: &QpInner,
    sq: &mut SendQueue,
    wr: &WrView<'_>,
    status: WcStatus,
    byte_len: u32,
    d: &mut Deferred,
) {
    if status == WcStatus::Success && !(wr.signaled || qp.sq_sig_all) {
        return;
    }
    let wc = Wc {
        wr_id: wr.wr_id,
        status,
        opcode: send_opcode(&wr.op),
        byte_len,
        qp_num: qp.wire_qpn(),
        ..Wc::default()
    };
    qp.send_cq.push(wc, false, d);
    if status != WcStatus::Success {
        if qp.qp_type == QpType::Rc {
            qp.error_locked(sq, d);
        } else {
            qp.sqe_locked(sq, d);
        }
    }
}

/// Retry held sends (RNR timer tick, or SQD -> RTS). Returns true while
/// some send still waits for an RNR retry.
/// With `charge` false an RNR NAK does not count against `rnr_retry` (a
/// look after a posted receive, not a timer tick).
pub(crate) fn retry_pending(
    f: &FabricInner,
    qp: &QpInner,
    sq: &mut SendQueue,
    d: &mut Deferred,
    charge: bool,
) -> bool {
    while sq.attr.state == QpState::Rts {
        let Some(mut p) = sq.pending.pop_front() else {
            return false;
        };
        match execute(f, qp, sq, &p.view(), d) {
            Outcome::Done { status, byte_len } => {
                p.release(&qp.hca.mrs);
                complete(qp, sq, &p.view(), status, byte_len, d)
            }
            Outcome::Rnr if !charge => {
                sq.pending.push_front(p);
                return true;
            }
            Outcome::Rnr => {
                let left = match p.rnr_left {
                    None => sq.attr.rnr_retry,
                    Some(7) => 7,
                    Some(n) => n.saturating_sub(1),
                };
                if left == 0 {
                    p.release(&qp.hca.mrs);
                    complete(qp, sq, &p.view(), WcStatus::RnrRetryExceeded, 0, d);
                    return false;
                }
                p.rnr_left = Some(left);
                sq.pending.push_front(p);
                return true;
            }
        }
    }
    false
}

/// Run the sends held in SQD after the QP returned to RTS.
pub(crate) fn drain_pending(
    f: &FabricInner,
    qp: &Arc<QpInner>,
    sq: &mut SendQueue,
    d: &mut Deferred,
) {
    // Held sends that never ran are tried now; if one meets an RNR NAK it
    // waits for the fabric's retry tick like any other.
    if retry_pending(f, qp, sq, d, true) {
        wait_rnr(f, qp, sq, d);
    }
}

/// Run one send work request to the end (or to an RNR NAK).
pub(crate) fn execute(
    f: &FabricInner,
    qp: &QpInner,
    sq: &mut SendQueue,
    wr: &WrView<'_>,
    d: &mut Deferred,
) -> Outcome {
    let hca = &qp.hca;
    let port_num = sq.attr.port;
    let Some(port) = hca.port(port_num) else {
        return done(WcStatus::LocalQpOpError, 0);
    };
    let need = match wr.op {
        SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
            Access::LOCAL_WRITE
        }
        _ => Access::NONE,
    };
    let Some(local) = resolve_local(&hca.mrs, qp.pd, wr.sg, need) else {
        return done(WcStatus::LocalProtectionError, 0);
    };
    let len = local.total;
    if len > MAX_MSG {
        return done(WcStatus::LocalLengthError, 0);
    }
    if matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }) && len != 8 {
        return done(WcStatus::LocalLengthError, 0);
    }
    if qp.qp_type.is_datagram() {
        send_datagram(f, qp, sq, port, wr, &local, d)
    } else {
        send_connected(f, qp, sq, port, wr, &local, d)
    }
}

/// The immediate data a send carries, if any.
pub(crate) fn imm_of(op: &SendOp) -> Option<u32> {
    match *op {
        SendOp::SendImm(i) => Some(i),
        SendOp::WriteImm { imm, .. } => Some(imm),
        _ => None,
    }
}

fn send_datagram(
    f: &FabricInner,
    qp: &QpInner,
    sq: &mut SendQueue,
    port: &PortCore,
    wr: &WrView<'_>,
    local: &SegList,
    d: &mut Deferred,
) -> Outcome {
    let Some(ud) = wr.ud else {
        return done(WcStatus::LocalQpOpError, 0);
    };
    let len = local.total;
    let limit = if qp.qp_type == QpType::Gsi {
        MAD_SIZE
    } else {
        port.mtu.bytes()
    };
    if len > limit {
        return done(WcStatus::LocalLengthError, 0);
    }
    let pkey_index = if qp.qp_type == QpType::Gsi {
        ud.pkey_index
    } else {
        sq.attr.pkey_index
    };
    let Some(&pkey) = port.pkeys.get(pkey_index as usize) else {
        return done(WcStatus::LocalQpOpError, 0);
    };
    // IBTA controlled Q_Key: a work-request Q_Key with the high bit set
    // means "the QP's own Q_Key".
    let qkey = if ud.qkey & 0x8000_0000 != 0 {
        sq.attr.qkey
    } else {
        ud.qkey
    };
    let sgid = ud
        .av
        .grh
        .and_then(|g| port.gids.get(g.sgid_index as usize).copied())
        .unwrap_or_default();
    let src = SrcInfo {
        slid: port.lid(),
        sqpn: qp.wire_qpn(),
        pkey,
        qkey,
        sgid,
        grh: ud.av.grh,
        solicited: wr.solicited,
    };
    let ok = done(WcStatus::Success, len);
    if !port.is_active() {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return ok;
    }
    let imm = imm_of(&wr.op);
    // Every datagram takes the next PSN of its QP, as on a real link.
    let psn = sq.attr.sq_psn;
    sq.attr.sq_psn = (psn + 1) & PSN_MASK;
    if f.capture_on.load(Ordering::Relaxed) {
        capture_datagram(f, &src, &ud, psn, imm, local);
    }
    let Some((node, dport)) = f.route(&ud.av) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return ok;
    };
    if f.faults_on.load(Ordering::Acquire) {
        let Some(payload) = gather(local) else {
            return done(WcStatus::LocalProtectionError, 0);
        };
        f.enqueue(Packet {
            dest: node,
            dport,
            dqpn: ud.qpn,
            src,
            kind: PktKind::Send { imm },
            payload,
            hold: 0,
        });
        return ok;
    }
    let Some(dest) = node.lookup(ud.qpn, dport) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return ok;
    };
    let mut rq = dest.rq.lock();
    let _ = respond_send(
        f,
        &node,
        &dest,
        &mut rq,
        dport,
        &src,
        Payload::List(local),
        imm,
        d,
    );
    ok
}

fn send_connected(
    f: &FabricInner,
    qp: &QpInner,
    sq: &mut SendQueue,
    port: &PortCore,
    wr: &WrView<'_>,
    local: &SegList,
    d: &mut Deferred,
) -> Outcome {
    let rc = qp.qp_type == QpType::Rc;
    let len = local.total;
    // What the requester sees when no responder answers.
    let lost = if rc {
        done(WcStatus::RetryExceeded, 0)
    } else {
        done(WcStatus::Success, len)
    };
    let Some(av) = sq.attr.av else {
        return done(WcStatus::LocalQpOpError, 0);
    };
    let Some(&pkey) = port.pkeys.get(sq.attr.pkey_index as usize) else {
        return done(WcStatus::LocalQpOpError, 0);
    };
    if !port.is_active() {
        return lost;
    }
    let Some((node, dport)) = f.route(&av) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return lost;
    };
    let sgid = av
        .grh
        .and_then(|g| port.gids.get(g.sgid_index as usize).copied())
        .unwrap_or_default();
    let src = SrcInfo {
        slid: port.lid(),
        sqpn: qp.qpn,
        pkey,
        qkey: 0,
        sgid,
        grh: av.grh,
        solicited: wr.solicited,
    };
    let imm = imm_of(&wr.op);
    if !rc && f.faults_on.load(Ordering::Acquire) {
        let Some(payload) = gather(local) else {
            return done(WcStatus::LocalProtectionError, 0);
        };
        let kind = match wr.op {
            SendOp::Write { remote_addr, rkey }
            | SendOp::WriteImm {
                remote_addr, rkey, ..
            } => PktKind::Write {
                addr: remote_addr,
                rkey,
                imm,
            },
            _ => PktKind::Send { imm },
        };
        f.enqueue(Packet {
            dest: node,
            dport,
            dqpn: sq.attr.dest_qpn,
            src,
            kind,
            payload,
            hold: 0,
        });
        return done(WcStatus::Success, len);
    }
    let Some(dest) = node.lookup(sq.attr.dest_qpn, dport) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return lost;
    };
    let mut rq = dest.rq.lock();
    if !rq.state.can_receive() || rq.port != dport || dest.qp_type != qp.qp_type {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return lost;
    }
    let dpkey = node.pkey(dport, rq.pkey_index);
    if !pkey_match(pkey, dpkey) {
        f.stats.dropped_pkey.fetch_add(1, Ordering::Relaxed);
        return lost;
    }
    let mtu = sq.attr.path_mtu.bytes();
    let npkts = packets(len, mtu);
    if rc && rq.psn != sq.attr.sq_psn {
        // Out of sequence: the responder NAKs, retries cannot help.
        f.stats.dropped_psn.fetch_add(1, Ordering::Relaxed);
        return lost;
    }
    let payload = Payload::List(local);
    let resp = match wr.op {
        SendOp::Send | SendOp::SendImm(_) => {
            respond_send(f, &node, &dest, &mut rq, dport, &src, payload, imm, d)
        }
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteImm {
            remote_addr, rkey, ..
        } => respond_write(&dest, &mut rq, &src, payload, remote_addr, rkey, imm, d),
        SendOp::Read { remote_addr, rkey } => {
            respond_read(&dest, &mut rq, local, remote_addr, rkey, d)
        }
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
            respond_atomic(&dest, &mut rq, local, &wr.op, d)
        }
    };
    match resp {
        Resp::Ok => {
            if rc {
                rq.psn = (rq.psn + npkts) & PSN_MASK;
                sq.attr.sq_psn = (sq.attr.sq_psn + npkts) & PSN_MASK;
            }
            done(WcStatus::Success, len)
        }
        Resp::Rnr => Outcome::Rnr,
        Resp::Dropped => lost,
        Resp::Nak(s) => done(s, 0),
    }
}

/// Deliver a queued packet (fault-injection mode).
pub(crate) fn deliver(f: &FabricInner, p: &Packet, d: &mut Deferred) {
    let Some(dest) = p.dest.lookup(p.dqpn, p.dport) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut rq = dest.rq.lock();
    let payload = Payload::Bytes(&p.payload);
    if !dest.qp_type.is_datagram() {
        if !rq.state.can_receive() || rq.port != p.dport {
            f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let dpkey = p.dest.pkey(p.dport, rq.pkey_index);
        if !pkey_match(p.src.pkey, dpkey) {
            f.stats.dropped_pkey.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    match p.kind {
        PktKind::Send { imm } => {
            respond_send(f, &p.dest, &dest, &mut rq, p.dport, &p.src, payload, imm, d);
        }
        PktKind::Write { addr, rkey, imm } => {
            respond_write(&dest, &mut rq, &p.src, payload, addr, rkey, imm, d);
        }
    }
    f.stats.delivered.fetch_add(1, Ordering::Relaxed);
}

/// Put the responder QP in ERR: flush its receive side now, its send side
/// once every lock is released.
fn responder_error(dest: &Arc<QpInner>, rq: &mut RecvQueue, d: &mut Deferred) {
    dest.flush_rq_locked(rq, d);
    d.errors.push(dest.clone());
}

/// A receive taken off its queue. Taken from an SRQ, it keeps the SRQ
/// locked until the caller is done with it (the destination's `rq` lock
/// does the same for its own queue): the in-flight check scans the queue
/// under that lock, so it cannot see the receive gone before its data has
/// landed. Lock order: `rq`, then the SRQ, then CQs and memory.
struct TakenRecv<'q> {
    entry: RecvEntry,
    _srq: Option<MutexGuard<'q, SrqQueue>>,
}

impl std::ops::Deref for TakenRecv<'_> {
    type Target = RecvEntry;
    fn deref(&self) -> &RecvEntry {
        &self.entry
    }
}

/// Take the next receive; an RC QP found empty remembers it, so the next
/// post wakes the sender its RNR NAK holds (see [`wait_rnr`]).
fn take_recv<'q>(dest: &'q QpInner, rq: &mut RecvQueue) -> Option<TakenRecv<'q>> {
    let rc = dest.qp_type == QpType::Rc;
    match &dest.srq {
        Some(srq) => {
            let mut q = srq.q.lock();
            let Some(entry) = q.wrs.pop_front() else {
                q.rnr_nakked |= rc;
                return None;
            };
            Some(TakenRecv {
                entry,
                _srq: Some(q),
            })
        }
        None => {
            let Some(entry) = rq.wrs.pop_front() else {
                rq.rnr_nakked |= rc;
                return None;
            };
            Some(TakenRecv { entry, _srq: None })
        }
    }
}

fn grh_bytes(src: &SrcInfo, dgid: Gid, len: usize) -> [u8; GRH_SIZE] {
    let g = src.grh.unwrap_or(GrhAttr {
        dgid,
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 0,
        traffic_class: 0,
    });
    let mut h = [0u8; GRH_SIZE];
    let w0 = (6u32 << 28) | ((g.traffic_class as u32) << 20) | (g.flow_label & 0xf_ffff);
    h[0..4].copy_from_slice(&w0.to_be_bytes());
    h[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    h[6] = 0x1b;
    h[7] = g.hop_limit;
    h[8..24].copy_from_slice(&src.sgid);
    h[24..40].copy_from_slice(&g.dgid);
    h
}

/// Show a datagram to the fabric's capture tap, if one is still set.
fn capture_datagram(
    f: &FabricInner,
    src: &SrcInfo,
    ud: &UdInfo,
    psn: u32,
    imm: Option<u32>,
    local: &SegList,
) {
    let Some(tap) = f.capture.read().clone() else {
        return;
    };
    let Some(payload) = gather(local) else {
        return; // the send fails its local checks and puts nothing on the link
    };
    let packet = crate::packet::UdPacket {
        vl: 0,
        sl: ud.av.sl & 0x0f,
        dlid: ud.av.dlid,
        slid: src.slid,
        grh: ud.av.grh.map(|g| crate::packet::Grh {
            traffic_class: g.traffic_class,
            flow_label: g.flow_label & 0xf_ffff,
            hop_limit: g.hop_limit,
            sgid: src.sgid,
            dgid: g.dgid,
        }),
        solicited: src.solicited,
        pkey: src.pkey,
        dest_qpn: ud.qpn & 0x00ff_ffff, // QPNs are 24 bits on the wire
        psn,
        qkey: src.qkey,
        src_qpn: src.sqpn,
        immediate: imm,
        payload,
    };
    tap(&packet);
}

/// A SEND (or SEND with immediate) arriving at `dest`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn respond_send(
    f: &FabricInner,
    node: &HcaNode,
    dest: &Arc<QpInner>,
    rq: &mut RecvQueue,
    dport: u8,
    src: &SrcInfo,
    payload: Payload<'_>,
    imm: Option<u32>,
    d: &mut Deferred,
) -> Resp {
    let datagram = dest.qp_type.is_datagram();
    let mut pkey_index = 0u16;
    if datagram {
        if !rq.state.can_receive() || rq.port != dport {
            f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
            return Resp::Dropped;
        }
        let pkeys = &node.core.ports[dport as usize - 1].pkeys;
        let found = if dest.qp_type == QpType::Gsi {
            pkeys.iter().position(|&k| pkey_match(src.pkey, k))
        } else {
            let i = rq.pkey_index as usize;
            pkeys
                .get(i)
                .is_some_and(|&k| pkey_match(src.pkey, k))
                .then_some(i)
        };
        let Some(i) = found else {
            f.stats.dropped_pkey.fetch_add(1, Ordering::Relaxed);
            return Resp::Dropped;
        };
        pkey_index = i as u16;
        let want = if dest.qp_type == QpType::Gsi {
            GSI_QKEY
        } else {
            rq.qkey
        };
        if src.qkey != want {
            f.stats.dropped_qkey.fetch_add(1, Ordering::Relaxed);
            return Resp::Dropped;
        }
    }
    let Some(entry) = take_recv(dest, rq) else {
        if dest.qp_type == QpType::Rc {
            f.stats.rnr_naks.fetch_add(1, Ordering::Relaxed);
            return Resp::Rnr;
        }
        f.stats.dropped_no_recv.fetch_add(1, Ordering::Relaxed);
        return Resp::Dropped;
    };
    let skip = if datagram { GRH_SIZE } else { 0 };
    let Some(dst) = resolve_local(
        &dest.hca.mrs,
        dest.pd,
        entry.sg.as_slice(),
        Access::LOCAL_WRITE,
    ) else {
        dest.recv_wc_error(entry.wr_id, WcStatus::LocalProtectionError, d);
        responder_error(dest, rq, d);
        return Resp::Nak(WcStatus::RemoteOpError);
    };
    let len = payload.len();
    if dst.total < skip + len {
        dest.recv_wc_error(entry.wr_id, WcStatus::LocalLengthError, d);
        responder_error(dest, rq, d);
        return Resp::Nak(WcStatus::RemoteInvalidRequest);
    }
    if datagram && src.grh.is_some() {
        let dgid = node.core.ports[dport as usize - 1]
            .gids
            .first()
            .copied()
            .unwrap_or_default();
        let h = grh_bytes(src, dgid, len);
        scatter(Payload::Bytes(&h), &dst, 0);
    }
    if !scatter(payload, &dst, skip) {
        dest.recv_wc_error(entry.wr_id, WcStatus::LocalProtectionError, d);
        responder_error(dest, rq, d);
        return Resp::Nak(WcStatus::RemoteOpError);
    }
    let wc = Wc {
        wr_id: entry.wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: (len + skip) as u32,
        imm,
        qp_num: dest.wire_qpn(),
        src_qp: src.sqpn,
        slid: src.slid,
        pkey_index,
        grh: datagram && src.grh.is_some(),
        solicited: src.solicited,
    };
    dest.recv_cq.push(wc, src.solicited, d);
    Resp::Ok
}

fn nak_or_drop(dest: &Arc<QpInner>, rq: &mut RecvQueue, s: WcStatus, d: &mut Deferred) -> Resp {
    if dest.qp_type == QpType::Rc {
        responder_error(dest, rq, d);
        Resp::Nak(s)
    } else {
        Resp::Dropped
    }
}

/// An RDMA WRITE (with or without immediate) arriving at `dest`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn respond_write(
    dest: &Arc<QpInner>,
    rq: &mut RecvQueue,
    src: &SrcInfo,
    payload: Payload<'_>,
    addr: u64,
    rkey: u32,
    imm: Option<u32>,
    d: &mut Deferred,
) -> Resp {
    if !rq.state.can_receive() {
        return Resp::Dropped;
    }
    if !rq.access.contains(Access::REMOTE_WRITE) {
        return nak_or_drop(dest, rq, WcStatus::RemoteInvalidRequest, d);
    }
    let len = payload.len();
    let seg = if len == 0 {
        None
    } else {
        match resolve_remote(
            &dest.hca.mrs,
            dest.pd,
            rkey,
            addr,
            len,
            Access::REMOTE_WRITE,
        ) {
            Some(s) => Some(s),
            None => return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d),
        }
    };
    let entry = if imm.is_some() {
        match take_recv(dest, rq) {
            Some(e) => Some(e),
            None if dest.qp_type == QpType::Rc => return Resp::Rnr,
            None => return Resp::Dropped,
        }
    } else {
        None
    };
    if let Some(seg) = seg {
        if !scatter(payload, &SegList::one(seg), 0) {
            return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d);
        }
    }
    if let Some(e) = entry {
        let wc = Wc {
            wr_id: e.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: len as u32,
            imm,
            qp_num: dest.qpn,
            src_qp: src.sqpn,
            slid: src.slid,
            solicited: src.solicited,
            ..Wc::default()
        };
        dest.recv_cq.push(wc, src.solicited, d);
    }
    Resp::Ok
}

/// An RDMA READ request arriving at `dest`; the data lands in `local`.
fn respond_read(
    dest: &Arc<QpInner>,
    rq: &mut RecvQueue,
    local: &SegList,
    addr: u64,
    rkey: u32,
    d: &mut Deferred,
) -> Resp {
    if !rq.access.contains(Access::REMOTE_READ) || rq.rd_atomic_resources == 0 {
        // No right, or no READ/atomic resources offered
        // (max_dest_rd_atomic 0): invalid request, as IBTA and rxe say.
        return nak_or_drop(dest, rq, WcStatus::RemoteInvalidRequest, d);
    }
    let len = local.total;
    if len == 0 {
        return Resp::Ok;
    }
    let Some(seg) = resolve_remote(&dest.hca.mrs, dest.pd, rkey, addr, len, Access::REMOTE_READ)
    else {
        return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d);
    };
    if !copy_lists(&SegList::one(seg), local, 0, len) {
        return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d);
    }
    Resp::Ok
}

/// An atomic arriving at `dest`; the original value lands in `local`.
fn respond_atomic(
    dest: &Arc<QpInner>,
    rq: &mut RecvQueue,
    local: &SegList,
    op: &SendOp,
    d: &mut Deferred,
) -> Resp {
    let (addr, rkey) = match *op {
        SendOp::CompareSwap {
            remote_addr, rkey, ..
        }
        | SendOp::FetchAdd {
            remote_addr, rkey, ..
        } => (remote_addr, rkey),
        _ => return Resp::Nak(WcStatus::LocalQpOpError),
    };
    if !rq.access.contains(Access::REMOTE_ATOMIC) || rq.rd_atomic_resources == 0 {
        return nak_or_drop(dest, rq, WcStatus::RemoteInvalidRequest, d);
    }
    if addr % 8 != 0 {
        return nak_or_drop(dest, rq, WcStatus::RemoteInvalidRequest, d);
    }
    let Some(seg) = resolve_remote(&dest.hca.mrs, dest.pd, rkey, addr, 8, Access::REMOTE_ATOMIC)
    else {
        return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d);
    };
    let off = seg.off;
    let orig = seg.mr.mem.with_mut(|m| {
        let cell: &mut [u8; 8] = (&mut m[off..off + 8]).try_into().expect("8 bytes");
        let old = u64::from_ne_bytes(*cell);
        let new = match *op {
            SendOp::CompareSwap { compare, swap, .. } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            SendOp::FetchAdd { add, .. } => old.wrapping_add(add),
            _ => old,
        };
        *cell = new.to_ne_bytes();
        old
    });
    let Some(orig) = orig else {
        return nak_or_drop(dest, rq, WcStatus::RemoteAccessError, d);
    };
    scatter(Payload::Bytes(&orig.to_ne_bytes()), local, 0);
    Resp::Ok
}
