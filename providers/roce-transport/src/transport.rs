//! The per-QP transport: the glue that owns the requester, completer and
//! responder state and exposes the sans-IO interface.

use al::sync::Arc;
use std::collections::VecDeque;
use std::time::Duration;

use provider::{Access, QpState, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus};
use roce::{Headers, IpHeader, Opcode, Packet};

use crate::config::{Config, Error};
use crate::memory::Memory;
use crate::psn;
use crate::responder::state::Responder;
use crate::wqe::{needs_response, RecvWqe, SendWqe, SgList};

/// A packet's payload: bytes of its own (responses), or a window on a
/// message the transport holds (requests), so that sending a packet of a
/// long message copies nothing until the driver encodes it.
#[derive(Debug, Clone)]
pub enum Payload {
    /// The packet's own bytes.
    Owned(Vec<u8>),
    /// `range` of a message gathered at post time.
    Shared(Arc<Vec<u8>>, std::ops::Range<usize>),
    /// A leased message's packet, still in memory: the driver reads it
    /// into the datagram as it encodes it ([`crate::Leased::read_into`];
    /// only for a [`crate::Memory`] that
    /// [`reads_as_encoded`](crate::Memory::reads_as_encoded)). As a slice
    /// it is empty: [`Transmit::packet`] does not carry it.
    Leased(crate::Leased),
}

// By value, as a derive over std's `Arc` compared (`al::sync::Arc` is
// loom's under the model checker, which has no `PartialEq`).
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        match (self, other) {
            (Payload::Owned(a), Payload::Owned(b)) => a == b,
            (Payload::Shared(a, r), Payload::Shared(b, s)) => r == s && **a == **b,
            (Payload::Leased(a), Payload::Leased(b)) => a == b,
            _ => false,
        }
    }
}
impl Eq for Payload {}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Owned(v) => v,
            Payload::Shared(m, r) => &m[r.clone()],
            Payload::Leased(_) => &[],
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::Owned(v)
    }
}

/// A packet the transport wants sent: encode it with
/// [`Transmit::packet`] and `roce::Packet::encode` for the flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit<R> {
    /// BTH and extension headers.
    pub headers: Headers,
    /// The payload (without pad).
    pub payload: Payload,
    /// Where to send it: `None` for the connected peer (RC, UC and every
    /// response), the work request's address vector for UD.
    pub route: Option<R>,
}

impl<R> Transmit<R> {
    /// The packet, borrowing the payload.
    pub fn packet(&self) -> Packet<'_> {
        Packet::new(self.headers, &self.payload)
    }
}

/// Where an incoming packet came from: the IP header the driver received
/// it in and the UDP ports. Only UD uses it (for the GRH of the receive
/// buffer); connected QPs take packets from their one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    /// The received IP header.
    pub ip: IpHeader,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

/// Counts of packets the transport dropped or answered with a NAK, by
/// reason (for the port counters of the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Packets whose opcode this QP type does not take, or whose
    /// destination QP is not this one.
    pub bad_opcode: u64,
    /// P_Key mismatch.
    pub bad_pkey: u64,
    /// Q_Key mismatch (UD).
    pub bad_qkey: u64,
    /// Requests ahead of the expected PSN (RC: NAKed once per gap; UC:
    /// message dropped).
    pub out_of_sequence: u64,
    /// Duplicate requests (re-ACKed or replayed).
    pub duplicates: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// NAKs sent other than RNR.
    pub naks_sent: u64,
    /// Messages dropped for lack of a receive (UC, UD).
    pub no_receive: u64,
    /// Responses ignored by the completer (stale, unexpected or malformed).
    pub ignored_responses: u64,
    /// Transport retries (timer or PSN sequence NAK).
    pub retries: u64,
    /// RNR retries.
    pub rnr_retries: u64,
    /// Requests dropped because the responder's READ/atomic resources
    /// were all busy.
    pub resources_busy: u64,
    /// Posted messages gathered into a completed send's kept buffer
    /// instead of a new one.
    pub message_buffers_reused: u64,
}

/// What [`Transport::post_send`] learned of a message: its length, and
/// its copy (none for READs, atomics and leased sends).
struct Prepared {
    len: u32,
    data: Option<Arc<Vec<u8>>>,
    leased: bool,
}

/// Requester and completer state (the send queue).
#[derive(Debug)]
pub(crate) struct SendSide<R> {
    /// Posted, not yet completed, in order.
    pub wqes: VecDeque<SendWqe<R>>,
    /// PSN the next posted message starts at.
    pub next_psn: u32,
    /// Next packet to transmit: index into `wqes` and packet index in it.
    pub tx_idx: usize,
    pub tx_pkt: u32,
    /// Oldest PSN not yet acknowledged.
    pub una: u32,
    /// PSN after the newest one ever transmitted.
    pub sent_end: u32,
    /// Packets sent since the last one with AckReq.
    pub since_ackreq: u32,
    /// Transport retries left.
    pub retry_left: u8,
    /// A gap (PSN sequence NAK, implied NAK, missing READ response) may
    /// start a retry; cleared by a retry, set again by forward progress,
    /// so one gap costs one retry however many packets reveal it.
    pub gap_retry_armed: bool,
    /// RNR retries left.
    pub rnr_left: u8,
    /// Retransmit timer.
    pub retrans_at: Option<Duration>,
    /// Transmission paused until this time by an RNR NAK.
    pub rnr_until: Option<Duration>,
    /// Message buffers of completed sends, for the next posts to gather
    /// into ([`Transport::recycle`]).
    pub spare: Vec<Vec<u8>>,
    /// Buffers of completed short sends, each held by nothing else (a
    /// short SEND's copy would otherwise cost an allocation for the bytes
    /// and one for the `Arc`, and their frees: ~400 instructions a
    /// message, as much as its ICRC).
    pub small: Vec<Arc<Vec<u8>>>,
    /// The empty message of READs, atomics and leased sends, shared;
    /// made by the first of them (most QPs never send one: 40 bytes of
    /// heap each saved).
    pub empty: Option<Arc<Vec<u8>>>,
    /// Gather lists of leased requests that left the queue, for the
    /// provider to release ([`Transport::poll_released`]).
    pub released: VecDeque<Vec<Sge>>,
}

/// SEND and WRITE messages of at least this many bytes are not copied at
/// post when the memory leases their bytes ([`Memory::lease`]): each
/// packet is gathered as it is sent. Shorter ones are copied (a lease
/// costs more than copying a few packets).
pub const LEASE_MIN: u64 = 16 << 10;

/// Buffers shorter than this come cheaply from the allocator and are not
/// kept.
const SPARE_MIN: usize = 16 << 10;
/// At most this many message buffers are kept per QP...
const SPARE_COUNT: usize = 4;
/// ... and this many short ones (under `SPARE_MIN`).
const SMALL_COUNT: usize = 8;
/// ... and none longer than this.
const SPARE_MAX: usize = 4 << 20;

/// The sans-IO transport of one QP. `R` is the type of the route a UD
/// work request names (the provider's address vector); connected QPs
/// never use it.
///
/// Drive it with [`Transport::post_send`], [`Transport::post_recv`],
/// [`Transport::handle_packet`] and [`Transport::handle_timeout`]; after
/// each input, drain [`Transport::poll_transmit`] and
/// [`Transport::poll_completion`] and re-read [`Transport::poll_timeout`].
#[derive(Debug)]
pub struct Transport<R> {
    pub(crate) cfg: Config,
    pub(crate) state: QpState,
    pub(crate) mtu: u32,
    pub(crate) sq: SendSide<R>,
    pub(crate) resp: Responder,
    pub(crate) completions: VecDeque<Wc>,
    pub(crate) counters: Counters,
}

impl<R: Clone> Transport<R> {
    /// A transport for a QP in RTS with these attributes.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        cfg.validate()?;
        Ok(Transport {
            mtu: cfg.path_mtu.bytes() as u32,
            sq: SendSide {
                wqes: VecDeque::new(),
                next_psn: cfg.sq_psn,
                tx_idx: 0,
                tx_pkt: 0,
                una: cfg.sq_psn,
                sent_end: cfg.sq_psn,
                since_ackreq: 0,
                retry_left: cfg.retry_cnt,
                gap_retry_armed: true,
                rnr_left: cfg.rnr_retry,
                retrans_at: None,
                rnr_until: None,
                spare: Vec::new(),
                small: Vec::new(),
                empty: None,
                released: VecDeque::new(),
            },
            resp: Responder::new(&cfg),
            completions: VecDeque::new(),
            counters: Counters::default(),
            state: QpState::Rts,
            cfg,
        })
    }

    /// The attributes it was created with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// RTS, or ERR after an error completion or [`Transport::set_error`].
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Drop and NAK counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The counters since the last take (or since the transport was
    /// made), which start again from 0: a provider that adds them to its
    /// own after every drive keeps no copy of the last ones.
    pub fn take_counters(&mut self) -> Counters {
        std::mem::take(&mut self.counters)
    }

    /// The PSN the next new message will start at.
    pub fn next_send_psn(&self) -> u32 {
        self.sq.next_psn
    }

    /// The PSN the responder expects next.
    pub fn expected_psn(&self) -> u32 {
        self.resp.epsn
    }

    pub(crate) fn is_datagram(&self) -> bool {
        matches!(self.cfg.qp_type, QpType::Ud | QpType::Gsi)
    }

    /// Whether the completion queue has room for more work requests.
    fn room(&self) -> bool {
        let cap = (self.cfg.max_send_wr + self.cfg.max_recv_wr) as usize;
        self.completions.len() + self.sq.wqes.len() + self.resp.rq.len() < cap + cap
    }

    /// Posts a send work request. The gather list is read now (the
    /// message is copied, so a retransmission sends the same bytes).
    /// A request that cannot run (bad L_Key, too long) is accepted and
    /// completes with its error status in order, as hardware does; in ERR
    /// it completes with WR_FLUSH_ERR.
    pub fn post_send<M: Memory>(&mut self, wr: &SendWr<'_, R>, mem: &mut M) -> Result<(), Error> {
        if self.sq.wqes.len() >= self.cfg.max_send_wr as usize || !self.room() {
            return Err(Error::QueueFull);
        }
        if wr.sg_list.len() > self.cfg.max_sge as usize {
            return Err(Error::InvalidWr("too many scatter/gather entries"));
        }
        let datagram = self.is_datagram();
        let (route, remote_qpn, remote_qkey) = match (&wr.ud, datagram) {
            (Some(ud), true) => (Some(ud.av.clone()), ud.remote_qpn, ud.remote_qkey),
            (None, true) => return Err(Error::InvalidWr("UD send without a destination")),
            (_, false) => (None, self.cfg.dest_qpn, 0),
        };
        match (self.cfg.qp_type, wr.op) {
            // max_rd_atomic 0 is "none" (IBTA), not "one": a READ or an
            // atomic could never be sent.
            (QpType::Rc, op) if needs_response(&op) && self.cfg.max_rd_atomic == 0 => {
                return Err(Error::InvalidWr(
                    "READ and atomics need max_rd_atomic of at least 1",
                ))
            }
            (QpType::Rc, _) => {}
            (QpType::Uc, SendOp::Send | SendOp::SendImm(_))
            | (QpType::Uc, SendOp::Write { .. } | SendOp::WriteImm { .. }) => {}
            (QpType::Ud | QpType::Gsi, SendOp::Send | SendOp::SendImm(_)) => {}
            _ => return Err(Error::InvalidWr("operation not supported by this QP type")),
        }
        let sges = SgList::from_slice(wr.sg_list);
        // The message is checked and copied before the request is built,
        // so that it is built with its buffer (not with the shared empty
        // one, then replaced: two reference-count operations per send).
        let prepared = match self.state {
            QpState::Err => Err(WcStatus::WrFlushError),
            _ => self.prepare(wr.op, &sges, mem),
        };
        let (data, len, leased, failed) = match prepared {
            Ok(p) => (p.data, p.len, p.leased, None),
            Err(status) => (None, 0, false, Some(status)),
        };
        let mut wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            sges,
            signaled: wr.signaled,
            solicited: wr.solicited,
            route,
            remote_qpn,
            remote_qkey,
            data: data
                .unwrap_or_else(|| Arc::clone(self.sq.empty.get_or_insert_with(Arc::default))),
            len,
            first_psn: self.sq.next_psn,
            npkts: 1,
            resp_pkts: 0,
            read_base: 0,
            failed,
            leased,
        };
        if self.state == QpState::Err {
            self.complete_send(&wqe, WcStatus::WrFlushError);
            return Ok(());
        }
        if wqe.failed.is_none() {
            wqe.npkts = match wqe.op {
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
                _ if datagram => 1,
                _ => psn::packets(wqe.len, self.mtu),
            };
            self.sq.next_psn = psn::add(self.sq.next_psn, wqe.npkts);
        } else {
            wqe.npkts = 0;
        }
        self.sq.wqes.push_back(wqe);
        Ok(())
    }

    /// Checks a send's local memory and copies its message (unless it is
    /// leased: read as it is sent).
    fn prepare<M: Memory>(
        &mut self,
        op: SendOp,
        sges: &[Sge],
        mem: &mut M,
    ) -> Result<Prepared, WcStatus> {
        let need = if needs_response(&op) {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let len = mem.check_local(sges, need).map_err(|e| e.local_status())?;
        if len > u64::from(crate::MAX_MSG) {
            return Err(WcStatus::LocalLengthError);
        }
        let mut p = Prepared {
            len: len as u32,
            data: None,
            leased: false,
        };
        match op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                // A misaligned target goes to the wire: the responder
                // NAKs it as an invalid request, as IBTA says.
                if len != 8 {
                    return Err(WcStatus::LocalLengthError);
                }
            }
            SendOp::Read { .. } => {}
            _ => {
                if self.is_datagram() && len > u64::from(self.mtu) {
                    return Err(WcStatus::LocalLengthError);
                }
                if !self.is_datagram() && len >= LEASE_MIN && mem.lease(sges) {
                    p.leased = true;
                    return Ok(p);
                }
                let data = self.message_data(len as usize, |bytes| {
                    mem.gather(sges, 0, bytes).map_err(|e| e.local_status())
                })?;
                p.data = Some(data);
            }
        }
        Ok(p)
    }

    /// Posts a receive work request (its memory is checked when a message
    /// lands in it). In ERR it completes with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), Error> {
        if self.resp.rq.len() >= self.cfg.max_recv_wr as usize || !self.room() {
            return Err(Error::QueueFull);
        }
        if wr.sg_list.len() > self.cfg.max_sge as usize {
            return Err(Error::InvalidWr("too many scatter/gather entries"));
        }
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sges: SgList::from_slice(wr.sg_list),
        };
        if self.state == QpState::Err {
            self.flush_recv(wqe);
        } else {
            self.resp.rq.push_back(wqe);
        }
        Ok(())
    }

    /// Receives posted and not yet taken by a message.
    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq.len()
    }

    /// Takes back the most recently posted receive if no message has taken
    /// it yet; returns its `wr_id`. For a provider that lends a QP one
    /// receive of a shared receive queue for the packet at hand and gives
    /// it back to the SRQ when the packet did not use it.
    pub fn unpost_recv(&mut self) -> Option<u64> {
        self.resp.rq.pop_back().map(|w| w.wr_id)
    }

    /// Applies new attributes to a live transport (a modify RTR -> RTS or
    /// RTS -> RTS, SQD -> SQD): the retry, timer, Q_Key, access and
    /// READ/atomic attributes take effect at once; the send PSN only while
    /// nothing was ever sent or posted (RTR -> RTS). The QP type, number,
    /// destination and path MTU must not change, nor `max_rd_atomic` drop
    /// to 0 while READs or atomics are queued (`InvalidConfig`; the
    /// transport is then unchanged).
    pub fn update_config(&mut self, cfg: Config) -> Result<(), Error> {
        cfg.validate()?;
        let c = &self.cfg;
        if cfg.qp_type != c.qp_type || cfg.qpn != c.qpn || cfg.path_mtu != c.path_mtu {
            return Err(Error::InvalidConfig(
                "QP type, number and path MTU are fixed once the transport runs",
            ));
        }
        if !self.is_datagram() && cfg.dest_qpn != c.dest_qpn {
            return Err(Error::InvalidConfig("the destination QP is fixed"));
        }
        let waiting = |w: &SendWqe<R>| w.needs_response() && w.failed.is_none();
        if cfg.max_rd_atomic == 0 && self.sq.wqes.iter().any(waiting) {
            // They could neither be sent nor retransmitted any more.
            return Err(Error::InvalidConfig(
                "max_rd_atomic 0 while READs or atomics are queued",
            ));
        }
        let idle = self.sq.wqes.is_empty()
            && self.sq.una == self.sq.next_psn
            && self.sq.sent_end == self.sq.next_psn;
        if idle && cfg.sq_psn != self.sq.next_psn && self.sq.next_psn == self.cfg.sq_psn {
            self.sq.next_psn = cfg.sq_psn;
            self.sq.una = cfg.sq_psn;
            self.sq.sent_end = cfg.sq_psn;
        }
        if cfg.retry_cnt != c.retry_cnt {
            self.sq.retry_left = cfg.retry_cnt;
        }
        if cfg.rnr_retry != c.rnr_retry {
            self.sq.rnr_left = cfg.rnr_retry;
        }
        self.resp.resources = usize::from(cfg.max_dest_rd_atomic);
        // The responder's expected PSN was set when it was built (RTR).
        self.cfg = Config {
            rq_psn: self.cfg.rq_psn,
            ..cfg
        };
        Ok(())
    }

    /// Whether [`Transport::poll_completion`] has something to give.
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// The next completion, oldest first.
    pub fn poll_completion(&mut self) -> Option<Wc> {
        self.completions.pop_front()
    }

    /// Moves the QP to ERR: every outstanding send and receive completes
    /// with WR_FLUSH_ERR, no request is sent or served any more. Answers
    /// the responder owes for requests it already executed still leave
    /// (`docs/roce-transport.md`, "Answers owed leave before the NAK").
    pub fn set_error(&mut self) {
        self.enter_error(None, crate::trace::WHY_MODIFY);
    }

    /// Enters ERR: the head send completes with `status` (when given),
    /// everything else is flushed. `why` is for the trace.
    ///
    /// The responder's answer queue is kept: the READ responses, atomic
    /// ACKs and ACKs queued there answer requests already executed (their
    /// memory effects happened), and a NAK a responder error queues next
    /// must follow them in PSN order (IBTA vol. 1 ch. 9: a requester takes
    /// the NAK as an implied ACK of everything before it, so a READ or
    /// atomic before it whose response was dropped here could only be
    /// retried into a QP in ERR, and would end RETRY_EXC_ERR). Nothing new
    /// is queued in ERR (packets are dropped on arrival), so the queue
    /// drains and stays bounded as before.
    pub(crate) fn enter_error(&mut self, head_status: Option<WcStatus>, why: &'static str) {
        if self.state != QpState::Err {
            crate::trace::entered_error(&self.cfg, head_status, why);
        }
        if let Some(status) = head_status {
            if let Some(w) = self.sq.wqes.pop_front() {
                self.complete_send(&w, status);
            }
        }
        self.state = QpState::Err;
        while let Some(w) = self.sq.wqes.pop_front() {
            self.complete_send(&w, WcStatus::WrFlushError);
        }
        self.sq.tx_idx = 0;
        self.sq.tx_pkt = 0;
        self.sq.retrans_at = None;
        self.sq.rnr_until = None;
        if let Some(w) = self.resp.take_current_recv() {
            self.flush_recv(w);
        }
        while let Some(w) = self.resp.rq.pop_front() {
            self.flush_recv(w);
        }
        // Duplicates are no longer answered in ERR: the replay cache
        // goes. The answer queue and its job counts stay (see above).
        self.resp.replay.clear();
    }

    fn flush_recv(&mut self, w: RecvWqe) {
        self.completions.push_back(Wc {
            wr_id: w.wr_id,
            status: WcStatus::WrFlushError,
            opcode: WcOpcode::Recv,
            qp_num: self.cfg.qpn,
            ..Wc::default()
        });
    }

    /// A buffer of `len` bytes for a message to be gathered into: a
    /// completed send's if one is kept (its old bytes are overwritten by
    /// the gather), else a new one.
    ///
    /// Why keep them: a long message's buffer (above the allocator's mmap
    /// threshold, 128 KiB) comes as fresh pages on every post, and the
    /// gather then takes a page fault per 4 KiB; `perf` showed those faults
    /// at ~10% of a 1 MiB WRITE stream's sender.
    fn message_buffer(&mut self, len: usize) -> Vec<u8> {
        if len >= SPARE_MIN {
            if let Some(i) = self.sq.spare.iter().position(|v| v.capacity() >= len) {
                let mut v = self.sq.spare.swap_remove(i);
                self.counters.message_buffers_reused += 1;
                // Only growth is zeroed; what is kept is overwritten.
                v.resize(len, 0);
                return v;
            }
        }
        vec![0; len]
    }

    /// A buffer of the `len` bytes `fill` writes, for a message copied at
    /// post, held by nothing else: a kept one when there is one.
    fn message_data(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), WcStatus>,
    ) -> Result<Arc<Vec<u8>>, WcStatus> {
        if len < SPARE_MIN {
            if let Some(mut kept) = self.sq.small.pop() {
                if let Some(v) = Arc::get_mut(&mut kept) {
                    self.counters.message_buffers_reused += 1;
                    v.clear();
                    v.resize(len, 0);
                    fill(v)?;
                    return Ok(kept);
                }
            }
            let mut v = vec![0; len];
            fill(&mut v)?;
            return Ok(Arc::new(v));
        }
        let mut v = self.message_buffer(len);
        fill(&mut v)?;
        Ok(Arc::new(v))
    }

    /// How many completed sends' buffers of a kind are kept: `most`, or
    /// the send queue's depth if smaller (no more sends than that can be
    /// waiting for one at a time; a 4-deep QP keeps 4, not 8).
    fn kept(&self, most: usize) -> usize {
        most.min(self.cfg.max_send_wr as usize)
    }

    /// Keeps the message buffer of a completed send for the next posts,
    /// if no packet still holds it and the bounds allow.
    pub(crate) fn recycle(&mut self, mut data: Arc<Vec<u8>>) {
        if data.capacity() < SPARE_MIN {
            // The shared empty message never qualifies: the transport
            // holds it too.
            if self.sq.small.len() < self.kept(SMALL_COUNT) && Arc::get_mut(&mut data).is_some() {
                self.sq.small.push(data);
            }
            return;
        }
        let Ok(v) = Arc::try_unwrap(data) else {
            return;
        };
        if (SPARE_MIN..=SPARE_MAX).contains(&v.capacity()) {
            if self.sq.spare.len() >= self.kept(SPARE_COUNT) {
                // Keep the largest: they serve every size below them.
                match self
                    .sq
                    .spare
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| s.capacity())
                {
                    Some((i, s)) if s.capacity() < v.capacity() => self.sq.spare[i] = v,
                    _ => {}
                }
            } else {
                self.sq.spare.push(v);
            }
        }
    }

    /// Pushes the completion of a send (errors always, success when
    /// signaled).
    pub(crate) fn complete_send(&mut self, w: &SendWqe<R>, status: WcStatus) {
        if w.leased {
            self.sq.released.push_back(w.sges.to_vec());
        }
        if status == WcStatus::Success && !w.signaled {
            return;
        }
        let byte_len = if status == WcStatus::Success {
            w.len
        } else {
            0
        };
        self.completions.push_back(Wc {
            wr_id: w.wr_id,
            status,
            opcode: w.wc_opcode(),
            byte_len,
            qp_num: self.cfg.qpn,
            ..Wc::default()
        });
    }

    /// The gather list of a send whose bytes the memory leased
    /// ([`Memory::lease`]) and which has now left the queue (completed,
    /// failed or flushed): the memory may release it.
    pub fn poll_released(&mut self) -> Option<Vec<Sge>> {
        self.sq.released.pop_front()
    }

    /// Every lease the transport holds (those [`Transport::poll_released`]
    /// would give, and those of requests still queued), for a provider
    /// about to drop the transport (RESET, destroy). Queued requests are
    /// not sent after this.
    pub fn take_leases(&mut self) -> Vec<Vec<Sge>> {
        let mut out: Vec<Vec<Sge>> = self.sq.released.drain(..).collect();
        for w in &mut self.sq.wqes {
            if std::mem::take(&mut w.leased) {
                out.push(std::mem::take(&mut w.sges).into_vec());
                w.failed.get_or_insert(WcStatus::WrFlushError);
            }
        }
        out
    }

    /// The earliest time [`Transport::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Duration> {
        match (self.sq.retrans_at, self.sq.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next packet to send: the responder's ACKs, NAKs and READ/atomic
    /// responses first (in PSN order), then the requester's packets.
    pub fn poll_transmit<M: Memory>(&mut self, now: Duration, mem: &mut M) -> Option<Transmit<R>> {
        if let Some(t) = self.responder_transmit(mem) {
            return Some(t);
        }
        if self.state == QpState::Err {
            return None;
        }
        self.requester_transmit(now, mem)
    }
}

impl<R: Clone> Transport<R> {
    /// Takes one decoded packet that arrived for this QP at `now`, from
    /// `src` (used by UD for the GRH). Packets of another QP, service or
    /// partition are dropped and counted; nothing here panics or grows
    /// without bound.
    pub fn handle_packet<M: Memory>(
        &mut self,
        now: Duration,
        src: &Source,
        pkt: &Packet<'_>,
        mem: &mut M,
    ) {
        // The receive stage ran these checks against the QP's filter; a
        // transport driven without it (tests, fuzzing) still refuses what
        // is not its own, with the same function.
        let own = crate::QpFilter {
            qpn: self.cfg.qpn,
            qp_type: self.cfg.qp_type,
            port: 0,
            state: self.state,
            pkey: self.cfg.pkey,
            qkey: self.cfg.qkey,
            path: None,
        };
        if let Err(why) = crate::receive::admit(&own, pkt) {
            match why {
                crate::Discard::BadPkey => self.counters.bad_pkey += 1,
                crate::Discard::BadQkey => self.counters.bad_qkey += 1,
                _ => self.counters.bad_opcode += 1,
            }
            return;
        }
        let bth = &pkt.headers.bth;
        match bth.opcode {
            Opcode::RcAck
            | Opcode::RcAtomicAck
            | Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly => self.handle_response(now, pkt, mem),
            Opcode::UdSendOnly | Opcode::UdSendOnlyImm => self.ud_receive(src, pkt, mem),
            _ if self.cfg.qp_type == QpType::Uc => self.uc_request(pkt, mem),
            _ => self.rc_request(pkt, mem),
        }
    }

    /// Runs the timers due at `now`: the retransmit timer (go-back-N from
    /// the oldest unacknowledged PSN, or RETRY_EXC_ERR) and the end of an
    /// RNR wait.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.state != QpState::Rts {
            return;
        }
        if self.sq.rnr_until.is_some_and(|t| now >= t) {
            self.sq.rnr_until = None;
        }
        self.retransmit_timeout(now);
    }
}

/// Bytes a request of `n` bytes takes from the system allocator (glibc:
/// the request and an 8-byte header rounded up to 16, at least 32; none
/// for an empty request).
fn allocated(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        ((n + 8).div_ceil(16) * 16).max(32)
    }
}

fn deque_bytes<T>(d: &VecDeque<T>) -> usize {
    allocated(d.capacity() * std::mem::size_of::<T>())
}

impl<R> Transport<R> {
    /// Heap bytes the transport holds beyond its own struct: its queues'
    /// allocations, the packet buffers it keeps for reuse and the data its
    /// queued sends share, as allocated (`docs/scale.md`). Gather lists of
    /// up to two entries are inline.
    pub fn heap_bytes(&self) -> usize {
        let sq = &self.sq;
        let data: usize = sq
            .wqes
            .iter()
            .map(|w| allocated(16 + std::mem::size_of::<Vec<u8>>()) + allocated(w.data.capacity()))
            .sum();
        let spare: usize = allocated(sq.spare.capacity() * std::mem::size_of::<Vec<u8>>())
            + sq.spare
                .iter()
                .map(|b| allocated(b.capacity()))
                .sum::<usize>();
        let small: usize = allocated(sq.small.capacity() * std::mem::size_of::<Arc<Vec<u8>>>())
            + sq.small
                .iter()
                .map(|b| allocated(16 + std::mem::size_of::<Vec<u8>>()) + allocated(b.capacity()))
                .sum::<usize>();
        let released: usize = deque_bytes(&sq.released)
            + sq.released
                .iter()
                .map(|s| allocated(s.capacity() * std::mem::size_of::<Sge>()))
                .sum::<usize>();
        deque_bytes(&sq.wqes)
            + data
            + spare
            + small
            + released
            + deque_bytes(&self.completions)
            + deque_bytes(&self.resp.rq)
            + deque_bytes(&self.resp.out)
            + deque_bytes(&self.resp.replay)
    }
}
