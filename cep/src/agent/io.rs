//! The provider side of the agent: QP1, its CQs, the receive and send
//! buffer pools and the address-vector cache. Everything here is used with
//! the agent's core lock held (see `docs/cm-agent.md`).

use std::collections::VecDeque;

use al::fast_hash::{id_map, IdMap};
use al::{Error, Result};
use provider::{
    Access, AvAttr, CompletionHook, CqArm, CqInit, Device, GrhAttr, QpCaps, QpInit, QpModify,
    QpState, QpType, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, UdDest, Wc, WcStatus, GRH_SIZE,
    GSI_QKEY, MAD_SIZE,
};

use crate::proto::{PeerAddr, Transmit};
use crate::wire::MAD_LEN;

/// QP number of the GSI QP every CM MAD goes to.
pub(crate) const GSI_QPN: u32 = 1;

/// The sender's GID from the 40-byte GRH area of a receive buffer. On
/// InfiniBand and on RoCEv2 over IPv6 the area holds the GRH or the IPv6
/// header (source address at bytes 8..24). On RoCEv2 over IPv4 it holds
/// 20 zero bytes and then the IPv4 header (version 4 in the high nibble of
/// byte 20, source address at bytes 32..36), as Linux's rxe fills it and
/// `ibv_init_ah_from_wc` reads it; the GID is then the IPv4-mapped address.
pub(crate) fn source_gid(grh: &[u8; GRH_SIZE]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    if grh[..20].iter().all(|&b| b == 0) && grh[20] >> 4 == 4 {
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&grh[32..36]);
    } else {
        gid.copy_from_slice(&grh[8..24]);
    }
    gid
}

/// Bytes of one receive buffer: the GRH area, then the MAD.
pub(crate) const RECV_STRIDE: usize = GRH_SIZE + MAD_SIZE;

/// Most address vectors kept; past this the cache is emptied.
const AV_CACHE_MAX: usize = 1024;

/// Completions taken from a CQ per `poll_cq` call.
const POLL_BATCH: usize = 16;

/// Counters kept under the core lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IoCounters {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    pub(crate) malformed: u64,
    pub(crate) ignored: u64,
    pub(crate) send_errors: u64,
    pub(crate) recv_errors: u64,
}

/// One received MAD, copied out of its receive buffer.
pub(crate) struct Received {
    pub(crate) from: PeerAddr,
    pub(crate) len: usize,
    pub(crate) mad: [u8; MAD_SIZE],
}

/// QP1 of one port and everything it needs.
pub(crate) struct Io<D: Device> {
    port: u8,
    pkey_index: u16,
    // Field order is not relied on for teardown: `destroy` does it in
    // the IBAL order (QP, AVs, MRs, CQs, PD).
    qp: D::Qp,
    send_cq: D::Cq,
    recv_cq: D::Cq,
    pd: D::Pd,
    recv_buf: RegisteredBuffer,
    recv_mr: D::Mr,
    recv_lkey: u32,
    send_buf: RegisteredBuffer,
    send_mr: D::Mr,
    send_lkey: u32,
    /// Send buffer slots not owned by an outstanding send.
    free_send: Vec<u32>,
    avs: IdMap<PeerAddr, D::Av>,
    pub(crate) counters: IoCounters,
    /// Completion scratch for `receive` and `reclaim`, kept so a poll of
    /// an empty CQ does not initialise a fresh batch every time.
    wcs: [Wc; POLL_BATCH],
}

impl<D: Device> Io<D> {
    /// Creates QP1 on `port` with its CQs and pools, brings it to RTS and
    /// posts every receive buffer. On error everything created so far is
    /// destroyed (dropped).
    pub(crate) fn new(
        dev: &D,
        port: u8,
        pkey_index: u16,
        recv_buffers: u32,
        send_buffers: u32,
        on_recv: CompletionHook,
    ) -> Result<Self> {
        if recv_buffers == 0 || send_buffers == 0 {
            return Err(Error::invalid_parameter(
                "the CM agent needs at least one receive and one send buffer",
            ));
        }
        let pd = dev.alloc_pd()?;
        let send_cq = dev.create_cq(CqInit {
            capacity: send_buffers + 1,
            on_completion: None,
            on_async_error: None,
        })?;
        let recv_cq = dev.create_cq(CqInit {
            capacity: recv_buffers + 1,
            on_completion: Some(on_recv),
            on_async_error: None,
        })?;
        let qp = dev.create_gsi_qp(
            &pd,
            port,
            &QpInit {
                qp_type: QpType::Gsi,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: send_buffers,
                    max_recv_wr: recv_buffers,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                },
                sq_sig_all: true,
            },
        )?;
        dev.modify_qp(
            &qp,
            &QpModify::to(QpState::Init)
                .pkey_index(pkey_index)
                .qkey(GSI_QKEY),
        )?;
        dev.modify_qp(&qp, &QpModify::to(QpState::Rtr))?;
        dev.modify_qp(&qp, &QpModify::to(QpState::Rts).sq_psn(0))?;

        let recv_len = recv_buffers as usize * RECV_STRIDE;
        let recv_buf = RegisteredBuffer::new(recv_len);
        let recv_mr = dev.register_mr(&pd, &recv_buf, 0, recv_len, 0, Access::LOCAL_WRITE)?;
        let recv_lkey = dev.mr_keys(&recv_mr).0;
        let send_len = send_buffers as usize * MAD_LEN;
        let send_buf = RegisteredBuffer::new(send_len);
        let send_mr = dev.register_mr(&pd, &send_buf, 0, send_len, 0, Access::NONE)?;
        let send_lkey = dev.mr_keys(&send_mr).0;

        let io = Self {
            port,
            pkey_index,
            qp,
            send_cq,
            recv_cq,
            pd,
            recv_buf,
            recv_mr,
            recv_lkey,
            send_buf,
            send_mr,
            send_lkey,
            free_send: (0..send_buffers).rev().collect(),
            avs: id_map(),
            counters: IoCounters::default(),
            wcs: [Wc::default(); POLL_BATCH],
        };
        for slot in 0..recv_buffers {
            io.post_recv(dev, slot)?;
        }
        dev.arm_cq(&io.recv_cq, CqArm::NextCompletion)?;
        Ok(io)
    }

    fn post_recv(&self, dev: &D, slot: u32) -> Result<()> {
        let sge = Sge {
            addr: slot as u64 * RECV_STRIDE as u64,
            length: RECV_STRIDE as u32,
            lkey: self.recv_lkey,
        };
        dev.post_recv(
            &self.qp,
            &[RecvWr {
                wr_id: slot as u64,
                sg_list: &[sge],
            }],
        )
    }

    /// Takes up to one batch of receive completions, copies each MAD out
    /// and reposts its buffer; the MADs go to `out` in arrival order.
    /// Returns whether the CQ may hold more: the poll filled the batch
    /// (with fewer, the CQ was empty after them).
    pub(crate) fn receive(&mut self, dev: &D, out: &mut Vec<Received>) -> bool {
        let n = match dev.poll_cq(&self.recv_cq, &mut self.wcs) {
            Ok(n) => n,
            Err(_) => return false,
        };
        for i in 0..n {
            let wc = self.wcs[i];
            let slot = wc.wr_id as u32;
            if wc.status != WcStatus::Success {
                // A flush means the QP left RTS (shutdown): the buffer is
                // not reposted. Anything else: reuse the buffer.
                self.counters.recv_errors += 1;
                if wc.status != WcStatus::WrFlushError && self.post_recv(dev, slot).is_err() {
                    self.counters.recv_errors += 1;
                }
                continue;
            }
            let base = slot as usize * RECV_STRIDE;
            let len = (wc.byte_len as usize)
                .saturating_sub(GRH_SIZE)
                .min(MAD_SIZE);
            let mut mad = [0u8; MAD_SIZE];
            let mut grh = [0u8; GRH_SIZE];
            let ok = self.recv_buf.read(base + GRH_SIZE, &mut mad[..len]).is_ok()
                && (!wc.grh || self.recv_buf.read(base, &mut grh).is_ok());
            let gid = if wc.grh { source_gid(&grh) } else { [0; 16] };
            if self.post_recv(dev, slot).is_err() {
                self.counters.recv_errors += 1;
            }
            if !ok {
                self.counters.recv_errors += 1;
                continue;
            }
            self.counters.received += 1;
            out.push(Received {
                from: PeerAddr { lid: wc.slid, gid },
                len,
                mad,
            });
        }
        n == POLL_BATCH
    }

    /// Arms the receive CQ for the next completion.
    pub(crate) fn arm(&self, dev: &D) {
        let _ = dev.arm_cq(&self.recv_cq, CqArm::NextCompletion);
    }

    /// Frees the send buffers of completed sends; a send that completed in
    /// error is counted and, if it left QP1 in SQE, QP1 goes back to RTS.
    pub(crate) fn reclaim(&mut self, dev: &D) {
        loop {
            let n = dev.poll_cq(&self.send_cq, &mut self.wcs).unwrap_or(0);
            let mut sqe = false;
            for wc in &self.wcs[..n] {
                self.free_send.push(wc.wr_id as u32);
                if wc.status != WcStatus::Success {
                    tracing::debug!(target: "ibal::cm::mad", status = ?wc.status, "CM MAD send completed in error");
                    self.counters.send_errors += 1;
                    sqe = true;
                }
            }
            if sqe {
                self.recover(dev);
            }
            if n < POLL_BATCH {
                break;
            }
        }
    }

    fn recover(&self, dev: &D) {
        if let Ok(attr) = dev.query_qp(&self.qp) {
            if attr.state == QpState::Sqe {
                let _ = dev.modify_qp(&self.qp, &QpModify::to(QpState::Rts));
            }
        }
    }

    fn av_attr(&self, to: PeerAddr) -> AvAttr {
        let mut attr = AvAttr::lid(self.port, to.lid);
        if to.gid != [0; 16] {
            attr.grh = Some(GrhAttr {
                dgid: to.gid,
                sgid_index: 0,
                flow_label: 0,
                hop_limit: 255,
                traffic_class: 0,
            });
        }
        attr
    }

    /// Sends as many of `backlog` as there are free send buffers, in order.
    /// A MAD that cannot be encoded or posted is dropped and counted (the
    /// CM's own retries cover a lost MAD). Completed sends are reaped only
    /// when the pool runs dry: the send CQ holds one more entry than there
    /// are send buffers, so it cannot overflow, and a send that completed
    /// in error is noticed (and QP1 recovered) at the next reap.
    pub(crate) fn send(&mut self, dev: &D, backlog: &mut VecDeque<Transmit>) {
        if self.free_send.is_empty() {
            self.reclaim(dev);
        }
        while let Some(t) = backlog.front() {
            let Some(slot) = self.free_send.pop().or_else(|| {
                self.reclaim(dev);
                self.free_send.pop()
            }) else {
                break;
            };
            let sent = self.send_one(dev, slot, t);
            if let Err(e) = &sent {
                tracing::warn!(target: "ibal::cm::mad", attr = %t.mad.message_kind(), error = %e, peer_gid = %provider::trace::Gid(t.to.gid), peer_lid = t.to.lid, "CM MAD not sent");
            }
            backlog.pop_front();
            if sent.is_err() {
                self.counters.send_errors += 1;
                self.free_send.push(slot);
                self.recover(dev);
            } else {
                self.counters.sent += 1;
            }
        }
    }

    fn send_one(&mut self, dev: &D, slot: u32, t: &Transmit) -> Result<()> {
        let bytes = t
            .mad
            .encode()
            .map_err(|e| Error::invalid_parameter(format!("CM MAD does not encode: {e}")))?;
        let offset = slot as usize * MAD_LEN;
        self.send_buf.write(offset, &bytes)?;
        if !self.avs.contains_key(&t.to) {
            if self.avs.len() >= AV_CACHE_MAX {
                for (_, av) in self.avs.drain() {
                    let _ = dev.destroy_av(av);
                }
            }
            let av = dev.create_av(&self.pd, &self.av_attr(t.to))?;
            self.avs.insert(t.to, av);
        }
        let av = &self.avs[&t.to];
        let sge = Sge {
            addr: offset as u64,
            length: MAD_LEN as u32,
            lkey: self.send_lkey,
        };
        dev.post_send(
            &self.qp,
            &[SendWr::new(slot as u64, SendOp::Send, &[sge]).to(UdDest {
                av,
                remote_qpn: GSI_QPN,
                remote_qkey: GSI_QKEY,
                pkey_index: self.pkey_index,
            })],
            &|_| Some(av),
        )
    }

    /// Send buffers owned by outstanding sends.
    pub(crate) fn sends_outstanding(&self, send_buffers: u32) -> usize {
        send_buffers as usize - self.free_send.len()
    }

    /// Tears everything down in the IBAL order: QP1 first (flushing its
    /// queues), then address vectors, memory regions, CQs and the PD.
    pub(crate) fn destroy(mut self, dev: &D) {
        let _ = dev.modify_qp(&self.qp, &QpModify::to(QpState::Err));
        let _ = dev.destroy_qp(self.qp);
        for (_, av) in self.avs.drain() {
            let _ = dev.destroy_av(av);
        }
        let _ = dev.deregister_mr(self.recv_mr);
        let _ = dev.deregister_mr(self.send_mr);
        let _ = dev.destroy_cq(self.send_cq);
        let _ = dev.destroy_cq(self.recv_cq);
        let _ = dev.dealloc_pd(self.pd);
        drop(self.recv_buf);
        drop(self.send_buf);
    }
}

/// Wraps a closure as the receive CQ's completion hook.
pub(crate) fn hook(f: impl Fn() + Send + Sync + 'static) -> CompletionHook {
    std::sync::Arc::new(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_gid_reads_ib_ipv6_and_ipv4_layouts() {
        // A GRH / IPv6 header: version 6, source address at 8..24.
        let mut v6 = [0u8; GRH_SIZE];
        v6[0] = 0x60;
        let src: [u8; 16] = std::array::from_fn(|i| 0xfe - i as u8);
        v6[8..24].copy_from_slice(&src);
        assert_eq!(source_gid(&v6), src);
        // RoCEv2 over IPv4: 20 zero bytes, then a 20-byte IPv4 header.
        let mut v4 = [0u8; GRH_SIZE];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[192, 0, 2, 7]);
        v4[36..40].copy_from_slice(&[192, 0, 2, 8]);
        let mut want = [0u8; 16];
        want[10..12].copy_from_slice(&[0xff, 0xff]);
        want[12..].copy_from_slice(&[192, 0, 2, 7]);
        assert_eq!(source_gid(&v4), want);
        // An IPv4-mapped GID inside a real GRH stays as it is.
        let mut mapped = [0u8; GRH_SIZE];
        mapped[0] = 0x60;
        mapped[8..24].copy_from_slice(&want);
        assert_eq!(source_gid(&mapped), want);
    }
}
