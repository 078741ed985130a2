//! The responder side of the data path: a packet arrives at its
//! destination QP (receive, RDMA WRITE/READ, atomics), under that QP's
//! receive lock, copying straight from the source MR to the destination MR.
//! Also the outcome types the requester (`engine.rs`) reads.

use crate::mr::{copy_lists, gather, resolve_local, resolve_remote, scatter, Payload, SegList};
use crate::node::{FabricInner, HcaNode, Packet, PktKind, SrcInfo};
use crate::qp::{Deferred, QpInner, RecvQueue, SrqQueue, UdInfo};
use crate::queues::RecvEntry;
use al::sync::atomic::Ordering;
use al::sync::{Arc, MutexGuard};
use provider::{Access, Gid, GrhAttr, QpType, SendOp, Wc, WcOpcode, WcStatus, GRH_SIZE, GSI_QKEY};

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

pub(crate) fn done(status: WcStatus, byte_len: usize) -> Outcome {
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

/// IBTA P_Key match: same key, and at least one side a full member.
pub(crate) fn pkey_match(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a & 0x7fff) != 0 && ((a | b) & 0x8000) != 0
}

pub(crate) fn packets(len: usize, mtu: usize) -> u32 {
    len.div_ceil(mtu).max(1) as u32
}

/// Deliver a queued packet (fault-injection mode).
pub(crate) fn deliver(f: &FabricInner, p: &Packet, d: &mut Deferred) {
    let Some(dest) = p.dest.lookup(p.dqpn, p.dport) else {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        crate::trace::dropped(p.dqpn, "no such QP");
        return;
    };
    let mut rq = dest.rq.lock();
    let payload = Payload::Bytes(&p.payload);
    if !dest.qp_type.is_datagram() {
        if !rq.state.can_receive() || rq.port != p.dport {
            f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
            crate::trace::dropped(p.dqpn, "the QP does not receive (state or port)");
            return;
        }
        let dpkey = p.dest.pkey(p.dport, rq.pkey_index);
        if !pkey_match(p.src.pkey, dpkey) {
            f.stats.dropped_pkey.fetch_add(1, Ordering::Relaxed);
            crate::trace::dropped(p.dqpn, "P_Key mismatch");
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
    if rq.state != provider::QpState::Err {
        crate::trace::entered_error(dest.qpn, None, "responder error");
    }
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
pub(crate) fn capture_datagram(
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
            crate::trace::dropped(dest.qpn, "the QP does not receive (state or port)");
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
            crate::trace::dropped(dest.qpn, "P_Key mismatch");
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
            crate::trace::dropped(dest.qpn, "Q_Key mismatch");
            return Resp::Dropped;
        }
    }
    let Some(entry) = take_recv(dest, rq) else {
        if dest.qp_type == QpType::Rc {
            f.stats.rnr_naks.fetch_add(1, Ordering::Relaxed);
            crate::trace::dropped(dest.qpn, "no receive posted (RC: RNR NAK)");
            return Resp::Rnr;
        }
        f.stats.dropped_no_recv.fetch_add(1, Ordering::Relaxed);
        crate::trace::dropped(dest.qpn, "no receive posted");
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
pub(crate) fn respond_read(
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
pub(crate) fn respond_atomic(
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
