//! Queue pairs: what a QP is ([`QpInner`], [`QpCore`]), its attributes
//! as the receive stage and the transport see them, and its end. Its jobs
//! are split by path: `modify` (attributes and states, through
//! `provider::qp_state`), `post` (receives and sends from the
//! application), `drive` (packets in, and the drive loop that sends what
//! the transport produced and moves its completions to the CQs).

mod drive;
mod footprint;
mod lazy_deque;
mod modify;
mod post;

use al::sync::atomic::{AtomicU64, Ordering};
use al::sync::Arc;

use al::sync::ArcCell;
use al::sync::Mutex;
use provider::{
    Access, AvAttr, MigState, Mtu, QpAttr, QpCaps, QpState, QpType, SendOp, Sge, Wc, WcOpcode,
    WcStatus,
};
use roce_transport::{Config, PathGids, QpFilter, Transport};

use crate::config::RouteCache;
use crate::cq::CqInner;
use crate::mr::{DevMem, MrCache, Posted};
use crate::shared::DevShared;
use crate::timers::NO_DEADLINE;
use lazy_deque::LazyDeque;

/// The device's shared state as the QPs hold it.
pub(crate) type Dev = DevShared<QpInner>;

pub(crate) const QPN_MASK: u32 = 0x00ff_ffff;
/// Key of port `p`'s GSI QP in the QP map (QP numbers are 24 bits).
pub(crate) const GSI_KEY: u32 = 0x8000_0000;

/// What a QP reads of the address vector a datagram send names: its
/// attributes and its PD. The provider's AV (`objects::RoceAv`) is the
/// one implementation; a trait so that the QPs sit below the objects that
/// hold them.
pub(crate) trait AvView {
    fn attr(&self) -> &AvAttr;
    fn pd(&self) -> u64;
}

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
    held: LazyDeque<HeldSend>,
    /// READs and atomics given to the transport, oldest first.
    responding: LazyDeque<Responding>,
    /// Where its packets went last (UD: the last destination).
    route: RouteCache,
    /// The MR its last memory access found.
    mrs_seen: MrCache,
}

pub(crate) struct QpInner {
    pub(crate) dev: Arc<Dev>,
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
    /// The deadline of the timer heap's entry this QP counts on
    /// (`timers::Timers`; written under the heap's lock).
    pub(crate) queued: AtomicU64,
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
pub(crate) fn filter_of(dev: &Dev, qpn: u32, a: &QpAttr) -> QpFilter {
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
            held: LazyDeque::new(),
            responding: LazyDeque::new(),
            route: RouteCache::default(),
            mrs_seen: MrCache::default(),
        }
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

    /// Gives back the bytes of every send the transport reads as it sends
    /// (`Memory::lease`), before the transport goes.
    fn release_leases(&self, core: &mut QpCore) {
        if let Some(t) = core.t.as_mut() {
            for sg in t.take_leases() {
                self.dev.mrs.release(&sg);
            }
        }
    }

    fn release_responding(&self, core: &mut QpCore) {
        for p in core.responding.drain() {
            if p.leased {
                self.dev.mrs.release(&p.sg);
            }
        }
    }

    /// Sends the ACKs held on this QP's port (`held_acks::HeldAcks`).
    fn flush_held_acks(&self) {
        let port = self.core.lock().attr.port;
        if let Some(p) = self.dev.port(port) {
            p.flush_held();
        }
    }

    /// The QP's end: queued requests end with it (no completions).
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
        for h in core.held.drain() {
            if h.leased {
                self.dev.mrs.release(&h.sg);
            }
        }
        self.rq.close();
        self.deadline.store(NO_DEADLINE, Ordering::SeqCst);
        self.dev.timers.forget(&self.queued);
    }
}

impl crate::timers::Armed for QpInner {
    fn key(&self) -> u32 {
        self.key
    }

    fn queued(&self) -> &AtomicU64 {
        &self.queued
    }

    fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod size_tests {
    /// A QP's state is allocated once per connection end: what is inline
    /// here is paid by every QP, idle or not (issue 28: 3 KiB per end, all
    /// layers together). 1,056 bytes before the transport's counters were
    /// taken instead of copied and the SQD and READ queues made lazy.
    #[test]
    fn a_qp_s_inline_state_stays_small() {
        use std::mem::size_of;
        assert!(
            size_of::<super::QpInner>() <= 904,
            "{}",
            size_of::<super::QpInner>()
        );
        assert!(
            size_of::<super::QpCore>() <= 792,
            "{}",
            size_of::<super::QpCore>()
        );
    }
}
