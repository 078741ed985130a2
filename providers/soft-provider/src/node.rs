//! The fabric's routing state: HCAs by LID and GID with their QPs, the
//! fault queue, and the RNR waiters (what `engine.rs` and `respond.rs`
//! route through).

use std::collections::VecDeque;

use crate::config::{CaptureTap, FaultConfig, GSI_KEY};
use crate::hca_core::HcaCore;
use crate::qp::QpInner;
use crate::stats::Stats;
use al::fast_hash::IdMap;
use al::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use al::sync::{Arc, Mutex, RwLock};
use provider::{AvAttr, Gid, GrhAttr};

/// An HCA as the fabric routes to it: its core and its QPs by number.
pub(crate) struct HcaNode {
    pub(crate) core: Arc<HcaCore>,
    pub(crate) qps: RwLock<IdMap<u32, Arc<QpInner>>>,
}

impl HcaNode {
    /// The P_Key at `index` in port `port`'s table (see [`HcaCore::pkey`]).
    #[inline]
    pub(crate) fn pkey(&self, port: u8, index: u16) -> u16 {
        self.core.pkey(port, index)
    }

    #[inline]
    pub(crate) fn lookup(&self, qpn: u32, port: u8) -> Option<Arc<QpInner>> {
        let key = if qpn == 1 { GSI_KEY | port as u32 } else { qpn };
        self.qps.read().get(&key).cloned()
    }
}

/// A packet waiting in the fault queue.
#[derive(Clone)]
pub(crate) struct Packet {
    pub(crate) dest: Arc<HcaNode>,
    pub(crate) dport: u8,
    pub(crate) dqpn: u32,
    pub(crate) src: SrcInfo,
    pub(crate) kind: PktKind,
    pub(crate) payload: Vec<u8>,
    pub(crate) hold: u32,
}

#[derive(Clone, Copy)]
pub(crate) enum PktKind {
    Send {
        imm: Option<u32>,
    },
    Write {
        addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
}

pub(crate) struct FaultState {
    pub(crate) cfg: FaultConfig,
    pub(crate) rng: u64,
    pub(crate) queue: VecDeque<Packet>,
}

impl FaultState {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

pub(crate) struct FabricInner {
    pub(crate) lids: RwLock<IdMap<u16, (Arc<HcaNode>, u8)>>,
    pub(crate) gids: RwLock<IdMap<Gid, (Arc<HcaNode>, u8)>>,
    pub(crate) hcas: RwLock<Vec<Arc<HcaNode>>>,
    pub(crate) faults: Mutex<Option<FaultState>>,
    pub(crate) faults_on: AtomicBool,
    /// Plain RC SEND and WRITE lists run as batches (`fast.rs`); on by
    /// default.
    pub(crate) batched_sends: AtomicBool,
    pub(crate) waiters: Mutex<Vec<Arc<QpInner>>>,
    /// Wakes by posted receives so far (`wake_rnr_waiters`).
    pub(crate) wakes: AtomicU64,
    pub(crate) stats: Stats,
    /// Whether `capture` holds a tap (checked first, so a fabric nobody
    /// captures pays one relaxed load per datagram; the lock publishes the
    /// tap itself).
    pub(crate) capture_on: AtomicBool,
    pub(crate) capture: RwLock<Option<CaptureTap>>,
}

impl FabricInner {
    #[inline]
    pub(crate) fn route(&self, av: &AvAttr) -> Option<(Arc<HcaNode>, u8)> {
        match &av.grh {
            Some(g) => self.gids.read().get(&g.dgid).cloned(),
            None => self.lids.read().get(&av.dlid).cloned(),
        }
    }

    pub(crate) fn enqueue(&self, mut p: Packet) {
        let mut guard = self.faults.lock();
        // (Never empty once fault injection was switched on.)
        let fs = guard.get_or_insert_with(|| FaultState {
            cfg: FaultConfig::default(),
            rng: 0,
            queue: VecDeque::new(),
        });
        let cfg = fs.cfg;
        if fs.chance(cfg.drop) {
            self.stats.dropped_fault.fetch_add(1, Ordering::Relaxed);
            crate::trace::fault(p.dqpn, "drop");
            return;
        }
        if cfg.max_delay > 0 && fs.chance(cfg.delay) {
            p.hold = 1 + (fs.next() % cfg.max_delay as u64) as u32;
            self.stats.delayed.fetch_add(1, Ordering::Relaxed);
            crate::trace::fault(p.dqpn, "delay");
        }
        let dup = fs.chance(cfg.duplicate);
        if fs.chance(cfg.reorder) && !fs.queue.is_empty() {
            let at = fs.queue.len() - 1;
            fs.queue.insert(at, p.clone());
            self.stats.reordered.fetch_add(1, Ordering::Relaxed);
            crate::trace::fault(p.dqpn, "reorder");
        } else {
            fs.queue.push_back(p.clone());
        }
        if dup {
            crate::trace::fault(p.dqpn, "duplicate");
            fs.queue.push_back(p);
            self.stats.duplicated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queue a sender for RNR retries (see `engine::wait_rnr`).
    pub(crate) fn add_rnr_waiter(&self, qp: Arc<QpInner>) {
        self.waiters.lock().push(qp);
    }

    pub(crate) fn queued(&self) -> usize {
        self.faults.lock().as_ref().map_or(0, |f| f.queue.len())
    }
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
