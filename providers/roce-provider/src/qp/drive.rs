//! Packets in and the drive loop: a packet the receive stage passed is
//! handed to the QP's transport (with an SRQ's receive lent to it), and a
//! drive sends what the transport has to send, moves its completions to
//! the CQs, follows its state and publishes its next deadline.

use al::sync::atomic::Ordering;
use std::net::SocketAddr;
use std::time::Duration;

use provider::{AvAttr, QpState, RecvWr, Sge, WcOpcode, WcStatus};
use roce::{Endpoints, IpHeader, Ipv4Header, Ipv6Header, Packet};
use roce_transport::{MemError, Memory, Payload, Source, Transmit};

use super::{send_opcode, QpCore, QpInner};
use crate::config::RouteCache;
use crate::cq::Deferred;
use crate::mr::DevMem;
use crate::port::PortShared;
use crate::timers::NO_DEADLINE;
use crate::tx_batch::TxBatch;

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
                if let Err(e) = self.transmit(b, attr.av.as_ref(), &tx, route, &mut mem) {
                    t.leased_read_failed(&tx, e);
                }
                if let roce_transport::Payload::Owned(v) = tx.payload {
                    crate::mr::recycle_packet_buffer(v);
                }
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
            // What the transport counted since the last drive (taken, so
            // the QP keeps no copy of the last snapshot to diff against).
            port.counters.add_transport(&t.take_counters());
        }
        let deadline = t.poll_timeout().map_or(NO_DEADLINE, |x| {
            x.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64
        });
        // Published only if it changed (`Timers::publish`: every writer
        // holds the QP's lock).
        self.dev
            .timers
            .publish(self.key, &self.deadline, &self.queued, deadline);
        if t.state() == QpState::Err && !matches!(attr.state, QpState::Err | QpState::Reset) {
            attr.state = QpState::Err;
            self.publish_filter(attr);
            for h in held.drain() {
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

    /// Encodes `tx` into `batch`, a leased payload read from `mem` as it
    /// is encoded; fails only when that read did (the MR went away).
    fn transmit(
        &self,
        batch: &mut TxBatch<'_>,
        av: Option<&AvAttr>,
        tx: &Transmit<AvAttr>,
        route: &mut RouteCache,
        mem: &mut DevMem<'_>,
    ) -> Result<(), MemError> {
        let port = batch.port();
        let av = tx.route.as_ref().or(av);
        let Some(grh) = av.and_then(|a| a.grh) else {
            port.counters.add(&port.counters.tx_errors, 1);
            crate::trace::not_sent(self.qpn, None, "no GRH in the address vector");
            return Ok(());
        };
        let to: SocketAddr =
            self.dev
                .directory
                .resolve_cached(route, &grh.dgid, port.cfg.peer_udp_port);
        match &tx.payload {
            Payload::Leased(l) => batch.push_leased(to, tx.headers, l, mem),
            _ => {
                batch.push(to, &tx.packet());
                Ok(())
            }
        }
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
