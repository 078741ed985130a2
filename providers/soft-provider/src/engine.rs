//! The requester side of the data path: posting, executing and completing
//! sends. Delivery is synchronous for RC (the responder's work,
//! `respond.rs`, runs on the caller's thread); datagram and UC packets go
//! through the fabric's fault queue when fault injection is on (`node.rs`,
//! `retry.rs`).

use crate::hca_core::PortCore;
use crate::mr::{gather, resolve_local, Payload, SegList};
use crate::node::{FabricInner, Packet, PktKind, SrcInfo};
use crate::qp::{send_opcode, Deferred, PendingWr, QpInner, SendQueue, WrView, PSN_MASK};
use crate::respond::{
    capture_datagram, done, packets, pkey_match, respond_atomic, respond_read, respond_send,
    respond_write, Outcome, Resp, MAX_MSG,
};
use al::sync::atomic::Ordering;
use al::sync::Arc;
use provider::{Access, QpState, QpType, SendOp, Wc, WcStatus, MAD_SIZE};

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
            if !matches!(sq.attr.state, QpState::Reset | QpState::Err) {
                crate::trace::entered_error(qp.qpn, Some(status), "a work request failed");
            }
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
        crate::trace::dropped(ud.qpn, "the sending port is down");
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
        crate::trace::dropped(ud.qpn, "no route to the address");
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
        crate::trace::dropped(ud.qpn, "no such QP");
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
        crate::trace::dropped(sq.attr.dest_qpn, "no route to the address");
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
        crate::trace::dropped(sq.attr.dest_qpn, "no such QP");
        return lost;
    };
    let mut rq = dest.rq.lock();
    if !rq.state.can_receive() || rq.port != dport || dest.qp_type != qp.qp_type {
        f.stats.dropped_no_dest.fetch_add(1, Ordering::Relaxed);
        crate::trace::dropped(
            sq.attr.dest_qpn,
            "the QP does not receive (state, port or type)",
        );
        return lost;
    }
    let dpkey = node.pkey(dport, rq.pkey_index);
    if !pkey_match(pkey, dpkey) {
        f.stats.dropped_pkey.fetch_add(1, Ordering::Relaxed);
        crate::trace::dropped(sq.attr.dest_qpn, "P_Key mismatch");
        return lost;
    }
    let mtu = sq.attr.path_mtu.bytes();
    let npkts = packets(len, mtu);
    if rc && rq.psn != sq.attr.sq_psn {
        // Out of sequence: the responder NAKs, retries cannot help.
        f.stats.dropped_psn.fetch_add(1, Ordering::Relaxed);
        crate::trace::dropped(sq.attr.dest_qpn, "PSN out of sequence");
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
