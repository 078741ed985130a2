//! The in-process fabric: HCAs, ports, routing, fault injection, and the
//! progress engine for queued packets and RNR retries.

use std::collections::VecDeque;

use al::fast_hash::{id_map, IdMap};
use al::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use al::sync::{Arc, Mutex, RwLock};
use al::{Error, Result};

use crate::cq::Deferred;
use crate::engine::{self, SrcInfo};
use crate::hca::SoftHca;
use crate::mr::MrTable;
use crate::qp::{QpInner, SendQueue};
use provider::qp_state::{check_av, DeviceLimits, PortLimits};
use provider::{
    AtomicCap, AvAttr, DeviceAttr, DeviceInfo, Gid, LinkLayer, Mtu, PortAttr, PortState,
    DEFAULT_PKEY,
};

/// What [`Fabric::set_capture`] hands each datagram to.
pub type CaptureTap = std::sync::Arc<dyn Fn(&crate::packet::UdPacket) + Send + Sync>;

/// Key of a GSI QP in an HCA's QP table (above every 24-bit QPN).
pub(crate) const GSI_KEY: u32 = 0xff00_0000;

/// Configuration of one port of a soft HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Base LID (unique in the fabric, non-zero).
    pub lid: u16,
    /// GID table; index 0 is the port GID (unique in the fabric).
    pub gids: Vec<Gid>,
    /// P_Key table.
    pub pkeys: Vec<u16>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Initial state.
    pub state: PortState,
    /// Link layer (informational).
    pub link_layer: LinkLayer,
}

impl PortConfig {
    /// An active InfiniBand port with LID `lid`, GID fe80::`guid`, the
    /// default P_Key and a 4096-byte MTU.
    pub fn new(lid: u16, guid: u64) -> PortConfig {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[8..].copy_from_slice(&guid.to_be_bytes());
        PortConfig {
            lid,
            gids: vec![gid],
            pkeys: vec![DEFAULT_PKEY],
            mtu: Mtu::Mtu4096,
            state: PortState::Active,
            link_layer: LinkLayer::InfiniBand,
        }
    }
}

/// Configuration of a soft HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaConfig {
    /// Device name.
    pub name: String,
    /// Node GUID (unique in the fabric).
    pub node_guid: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Ports, numbered from 1.
    pub ports: Vec<PortConfig>,
    /// The object counts and sizes the HCA advertises ([`DeviceAttr`]) and
    /// enforces; small values let tests reach them.
    pub limits: HcaLimits,
}

/// What a soft HCA advertises in its [`DeviceAttr`] and enforces: creating
/// one object more than a `max_*` count allows fails with
/// `InsufficientResources` naming the limit (destroying one frees its
/// place); a size above a `max_*` size is `InvalidParameter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcaLimits {
    /// QPs, GSI QPs included (at most 2^24 - 2: QP numbers are 24 bits and
    /// 0 and 1 are the special QPs').
    pub max_qp: u32,
    /// Work requests per QP queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// CQs.
    pub max_cq: u32,
    /// Entries per CQ.
    pub max_cqe: u32,
    /// MRs (at most 2^24 - 1: the MR key needs 8 bits beside the slot).
    pub max_mr: u32,
    /// PDs.
    pub max_pd: u32,
    /// SRQs.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// AVs.
    pub max_av: u32,
}

impl Default for HcaLimits {
    fn default() -> Self {
        HcaLimits {
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_srq: 1 << 16,
            max_srq_wr: 1 << 14,
            max_av: 1 << 16,
        }
    }
}

/// Largest `max_qp`: every 24-bit QP number but 0 and 1.
const MAX_QPS: u32 = (1 << 24) - 2;

impl HcaConfig {
    /// An HCA with one port per LID in `lids`; port GUIDs are
    /// `node_guid + port number`.
    pub fn new(node_guid: u64, lids: &[u16]) -> HcaConfig {
        HcaConfig {
            name: format!("soft{node_guid:x}"),
            node_guid,
            vendor_id: 0,
            vendor_part_id: 0x50f7,
            ports: lids
                .iter()
                .enumerate()
                .map(|(i, &lid)| PortConfig::new(lid, node_guid.wrapping_add(i as u64 + 1)))
                .collect(),
            limits: HcaLimits::default(),
        }
    }
}

/// Fault injection for datagram (UD, GSI) and UC traffic. Probabilities
/// are in `0.0..=1.0`; decisions come from a generator seeded with `seed`,
/// so a run is reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Generator seed.
    pub seed: u64,
    /// Probability a packet is lost.
    pub drop: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet overtakes the one queued before it.
    pub reorder: f64,
    /// Probability a packet is held for 1..=`max_delay` progress calls.
    pub delay: f64,
    /// Longest delay in progress calls.
    pub max_delay: u32,
}

impl FaultConfig {
    /// Queue packets (deliver on [`Fabric::progress`]) with no faults.
    pub fn queued(seed: u64) -> FaultConfig {
        FaultConfig {
            seed,
            ..FaultConfig::default()
        }
    }
}

/// Counters of what the fabric did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FabricStats {
    /// Queued packets delivered.
    pub delivered: u64,
    /// Packets dropped by fault injection.
    pub dropped_fault: u64,
    /// Packets duplicated by fault injection.
    pub duplicated: u64,
    /// Packets reordered by fault injection.
    pub reordered: u64,
    /// Packets delayed by fault injection.
    pub delayed: u64,
    /// Packets dropped for a P_Key mismatch.
    pub dropped_pkey: u64,
    /// Datagrams dropped for a Q_Key mismatch.
    pub dropped_qkey: u64,
    /// Datagrams/UC messages dropped for want of a receive.
    pub dropped_no_recv: u64,
    /// Packets with no destination (no such LID/GID/QP, port down, QP
    /// not ready).
    pub dropped_no_dest: u64,
    /// RC packets out of sequence (PSN mismatch).
    pub dropped_psn: u64,
    /// RNR NAKs sent.
    pub rnr_naks: u64,
    /// RC SENDs and RDMA WRITEs that ran on the batched path (see
    /// [`Fabric::set_batched_sends`]).
    pub batched_sends: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) delivered: AtomicU64,
    pub(crate) dropped_fault: AtomicU64,
    pub(crate) duplicated: AtomicU64,
    pub(crate) reordered: AtomicU64,
    pub(crate) delayed: AtomicU64,
    pub(crate) dropped_pkey: AtomicU64,
    pub(crate) dropped_qkey: AtomicU64,
    pub(crate) dropped_no_recv: AtomicU64,
    pub(crate) dropped_no_dest: AtomicU64,
    pub(crate) dropped_psn: AtomicU64,
    pub(crate) rnr_naks: AtomicU64,
    pub(crate) batched_sends: AtomicU64,
}

/// One port of an HCA as the data path sees it.
pub(crate) struct PortCore {
    pub(crate) num: u8,
    lid: u16,
    pub(crate) gids: Vec<Gid>,
    pub(crate) pkeys: Vec<u16>,
    pub(crate) mtu: Mtu,
    state: AtomicU8,
    link_layer: LinkLayer,
}

fn state_code(s: PortState) -> u8 {
    match s {
        PortState::Down => 0,
        PortState::Init => 1,
        PortState::Armed => 2,
        PortState::Active => 3,
    }
}

impl PortCore {
    pub(crate) fn lid(&self) -> u16 {
        self.lid
    }
    pub(crate) fn is_active(&self) -> bool {
        self.state.load(Ordering::Acquire) == 3
    }
    pub(crate) fn set_state(&self, s: PortState) {
        self.state.store(state_code(s), Ordering::Release);
    }
    pub(crate) fn attr(&self) -> PortAttr {
        let state = match self.state.load(Ordering::Acquire) {
            0 => PortState::Down,
            1 => PortState::Init,
            2 => PortState::Armed,
            _ => PortState::Active,
        };
        PortAttr {
            port_num: self.num,
            state,
            lid: self.lid,
            lmc: 0,
            sm_lid: 1,
            gid_table: self.gids.clone(),
            pkey_table: self.pkeys.clone(),
            active_mtu: self.mtu,
            max_mtu: Mtu::Mtu4096,
            link_layer: self.link_layer,
        }
    }
}

/// The identity of a device or protection domain: unique among every
/// device and PD of the process, for its whole life (64 bits do not wrap).
///
/// Cross-object checks ("is this SRQ/AV/MR in the QP's PD?", "is this CQ
/// on this device?") compare these, so an object of another device can
/// never pass for one of ours, as it did when PD ids were per-device
/// counters that all started at 1 (issue 12). Comparing two of them is one
/// integer compare, which is all the per-work-request path can afford.
pub(crate) type Identity = u64;

/// A fresh [`Identity`].
pub(crate) fn new_identity() -> Identity {
    // A plain std atomic, also under loom: the only property wanted is
    // uniqueness, which a relaxed fetch_add gives, and a static cannot
    // hold a loom atomic.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What QPs and MRs of an HCA share (no back references).
pub(crate) struct HcaCore {
    /// This device's identity (its CQs carry it).
    pub(crate) id: Identity,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortCore>,
    pub(crate) mrs: MrTable,
    pub(crate) next_qpn: AtomicU32,
    /// Live objects of each counted kind (MRs are counted by `mrs`).
    counts: [AtomicU32; Counted::KINDS],
}

/// The kinds of object whose number an HCA limits (besides MRs, which its
/// key table counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Pd,
    Cq,
    Qp,
    Srq,
    Av,
}

impl Counted {
    const KINDS: usize = 5;

    /// The limit's name in `DeviceAttr` and the objects' name.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Counted::Pd => ("max_pd", "PDs"),
            Counted::Cq => ("max_cq", "CQs"),
            Counted::Qp => ("max_qp", "QPs"),
            Counted::Srq => ("max_srq", "SRQs"),
            Counted::Av => ("max_av", "AVs"),
        }
    }
}

/// One object's place in its HCA's count; dropping it (with the object)
/// gives the place back.
pub(crate) struct Charge {
    core: Arc<HcaCore>,
    what: Counted,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({:?})", self.what)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.core.counts[self.what as usize].fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many objects of each limited kind an HCA holds now
/// ([`SoftHca::usage`](crate::SoftHca::usage)): what its limits are checked
/// against, and a leak check (every count returns to 0 once every user,
/// the CM agents' QP1 included, is gone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUsage {
    /// Protection domains.
    pub pds: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs (GSI QPs included).
    pub qps: u32,
    /// Shared receive queues.
    pub srqs: u32,
    /// Address vectors.
    pub avs: u32,
    /// Memory regions.
    pub mrs: u32,
}

impl HcaUsage {
    /// Whether the HCA holds nothing.
    pub fn is_empty(&self) -> bool {
        *self == HcaUsage::default()
    }
}

impl HcaCore {
    /// The current counts (each a snapshot).
    pub(crate) fn usage(&self) -> HcaUsage {
        let n = |what: Counted| self.counts[what as usize].load(Ordering::Acquire);
        HcaUsage {
            pds: n(Counted::Pd),
            cqs: n(Counted::Cq),
            qps: n(Counted::Qp),
            srqs: n(Counted::Srq),
            avs: n(Counted::Av),
            mrs: self.mrs.len() as u32,
        }
    }

    fn limit(&self, what: Counted) -> u32 {
        let a = &self.attr;
        match what {
            Counted::Pd => a.max_pd,
            Counted::Cq => a.max_cq,
            Counted::Qp => a.max_qp,
            Counted::Srq => a.max_srq,
            Counted::Av => a.max_av,
        }
    }

    /// Take a place for one more `what`, or fail with
    /// `InsufficientResources` naming the limit. (An associated function:
    /// under loom `Arc` is not a std receiver type.)
    pub(crate) fn charge(this: &Arc<Self>, what: Counted) -> Result<Charge> {
        let max = this.limit(what);
        this.counts[what as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| {
                let (limit, objects) = what.names();
                Error::insufficient_resources(format!(
                    "{limit} reached: the HCA allows {max} {objects}"
                ))
            })?;
        Ok(Charge {
            core: this.clone(),
            what,
        })
    }
}

impl HcaCore {
    pub(crate) fn port(&self, n: u8) -> Option<&PortCore> {
        self.ports.get((n as usize).checked_sub(1)?)
    }

    /// The limits the provider-neutral value checks use
    /// (`qp_state::check_av`, `qp_state::check_modify_values`).
    pub(crate) fn with_limits<R>(&self, f: impl FnOnce(&DeviceLimits<'_>) -> R) -> R {
        let ports: Vec<PortLimits> = self
            .ports
            .iter()
            .map(|p| PortLimits {
                pkeys: p.pkeys.len(),
                gids: p.gids.len(),
                mtu: p.mtu,
                gid_only: false,
            })
            .collect();
        f(&DeviceLimits {
            ports: &ports,
            max_qp_rd_atomic: self.attr.max_qp_rd_atomic,
            max_qp_init_rd_atomic: self.attr.max_qp_init_rd_atomic,
        })
    }

    /// An address vector must name a port of this CA, a GID of that port
    /// and values that fit their IBTA fields (`qp_state::check_av`).
    /// `what` names the AV in the error ("AV", "av", "alt_av").
    pub(crate) fn check_av(&self, av: &AvAttr, what: &str) -> Result<()> {
        self.with_limits(|l| check_av(av, l, what))
    }
}

/// An HCA as the fabric routes to it: its core and its QPs by number.
pub(crate) struct HcaNode {
    pub(crate) core: Arc<HcaCore>,
    pub(crate) qps: RwLock<IdMap<u32, Arc<QpInner>>>,
    pub(crate) removed: AtomicBool,
}

impl HcaNode {
    /// The P_Key at `index` in port `port`'s table; 0 (which matches no
    /// key) when the port or the index does not exist.
    #[inline]
    pub(crate) fn pkey(&self, port: u8, index: u16) -> u16 {
        self.core
            .port(port)
            .and_then(|p| p.pkeys.get(index as usize).copied())
            .unwrap_or(0)
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

struct FaultState {
    cfg: FaultConfig,
    rng: u64,
    queue: VecDeque<Packet>,
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
    lids: RwLock<IdMap<u16, (Arc<HcaNode>, u8)>>,
    gids: RwLock<IdMap<Gid, (Arc<HcaNode>, u8)>>,
    hcas: RwLock<Vec<Arc<HcaNode>>>,
    faults: Mutex<Option<FaultState>>,
    pub(crate) faults_on: AtomicBool,
    /// Plain RC SEND and WRITE lists run as batches (`fast.rs`); on by
    /// default.
    pub(crate) batched_sends: AtomicBool,
    pub(crate) waiters: Mutex<Vec<Arc<QpInner>>>,
    /// Wakes by posted receives so far (`wake_rnr_waiters`).
    wakes: AtomicU64,
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
            return;
        }
        if cfg.max_delay > 0 && fs.chance(cfg.delay) {
            p.hold = 1 + (fs.next() % cfg.max_delay as u64) as u32;
            self.stats.delayed.fetch_add(1, Ordering::Relaxed);
        }
        let dup = fs.chance(cfg.duplicate);
        if fs.chance(cfg.reorder) && !fs.queue.is_empty() {
            let at = fs.queue.len() - 1;
            fs.queue.insert(at, p.clone());
            self.stats.reordered.fetch_add(1, Ordering::Relaxed);
        } else {
            fs.queue.push_back(p.clone());
        }
        if dup {
            fs.queue.push_back(p);
            self.stats.duplicated.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn progress(&self) -> usize {
        let mut ready = Vec::new();
        if let Some(fs) = self.faults.lock().as_mut() {
            let n = fs.queue.len();
            for _ in 0..n {
                let mut p = fs.queue.pop_front().expect("counted");
                if p.hold > 0 {
                    p.hold -= 1;
                    fs.queue.push_back(p);
                } else {
                    ready.push(p);
                }
            }
        }
        let work = ready.len();
        for p in &ready {
            let mut d = Deferred::new();
            engine::deliver(self, p, &mut d);
            d.run();
        }
        work + self.retry_rnr_waiters(|_| true, true)
    }

    /// Queue a sender for RNR retries (see `engine::wait_rnr`).
    pub(crate) fn add_rnr_waiter(&self, qp: Arc<QpInner>) {
        self.waiters.lock().push(qp);
    }

    /// A receive was posted to a queue a sender had found empty: let the
    /// senders waiting for an RNR retry whose destination QP `takes_it`
    /// says draws from that queue look again now (without spending a
    /// retry).
    pub(crate) fn wake_rnr_waiters(&self, takes_it: impl Fn(&QpInner) -> bool) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.retry_rnr_waiters(
            |sq| {
                let dest = sq.attr.av.and_then(|av| self.route(&av));
                dest.and_then(|(node, dport)| node.lookup(sq.attr.dest_qpn, dport))
                    .is_some_and(|d| takes_it(&d))
            },
            false,
        );
    }

    /// Retry the RNR waiters `wanted` picks (one retry each, counted
    /// against `rnr_retry` if `charge`); returns the work done. A wake that
    /// comes while this runs may have found the list without the senders
    /// taken out here: if one came, everyone left looks once more (bounded
    /// rounds; what is left waits for the next wake or tick).
    fn retry_rnr_waiters(&self, wanted: impl Fn(&SendQueue) -> bool, charge: bool) -> usize {
        let mut work = 0;
        let mut filtered = true;
        let mut charge = charge;
        for _round in 0..8 {
            let seen = self.wakes.load(Ordering::SeqCst);
            let waiters = std::mem::take(&mut *self.waiters.lock());
            let mut keep = Vec::new();
            for qp in waiters {
                if qp.destroyed.load(Ordering::Acquire) {
                    continue;
                }
                let mut d = Deferred::new();
                {
                    let mut sq = qp.sq.lock();
                    if filtered && !wanted(&sq) {
                        drop(sq);
                        keep.push(qp);
                        continue;
                    }
                    let before = sq.pending.len();
                    let still = engine::retry_pending(self, &qp, &mut sq, &mut d, charge);
                    work += before - sq.pending.len();
                    if still {
                        // Still waiting counts as work, so `settle` goes on.
                        work += 1;
                        keep.push(qp.clone());
                    } else {
                        sq.in_retry = false;
                    }
                }
                d.run();
            }
            self.waiters.lock().extend(keep);
            if self.wakes.load(Ordering::SeqCst) == seen {
                break;
            }
            (filtered, charge) = (false, false);
        }
        work
    }

    fn queued(&self) -> usize {
        self.faults.lock().as_ref().map_or(0, |f| f.queue.len())
    }
}

/// An in-process fabric connecting any number of soft HCAs.
///
/// Cloning shares the fabric.
#[derive(Clone)]
pub struct Fabric {
    pub(crate) inner: Arc<FabricInner>,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new()
    }
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("hcas", &self.inner.hcas.read().len())
            .finish()
    }
}

impl Fabric {
    /// An empty fabric with fault injection off.
    pub fn new() -> Fabric {
        Fabric {
            inner: Arc::new(FabricInner {
                lids: RwLock::new(id_map()),
                gids: RwLock::new(id_map()),
                hcas: RwLock::new(Vec::new()),
                faults: Mutex::new(None),
                faults_on: AtomicBool::new(false),
                batched_sends: AtomicBool::new(true),
                waiters: Mutex::new(Vec::new()),
                wakes: AtomicU64::new(0),
                stats: Stats::default(),
                capture_on: AtomicBool::new(false),
                capture: RwLock::new(None),
            }),
        }
    }

    /// Add an HCA. Its node GUID, LIDs and GIDs must be new to the fabric,
    /// LIDs non-zero, and every port needs at least one GID and P_Key.
    pub fn add_hca(&self, cfg: HcaConfig) -> Result<SoftHca> {
        if cfg.ports.is_empty() || cfg.ports.len() > 254 {
            return Err(Error::invalid_parameter("an HCA needs 1..=254 ports"));
        }
        let mut hcas = self.inner.hcas.write();
        let mut lids = self.inner.lids.write();
        let mut gids = self.inner.gids.write();
        if hcas.iter().any(|h| h.core.attr.node_guid == cfg.node_guid) {
            return Err(Error::invalid_parameter(format!(
                "node GUID {:#x} is already on the fabric",
                cfg.node_guid
            )));
        }
        for (i, p) in cfg.ports.iter().enumerate() {
            if p.lid == 0 || p.lid >= 0xc000 || lids.contains_key(&p.lid) {
                return Err(Error::invalid_parameter(format!(
                    "port {}: LID {:#x} is zero, multicast or taken",
                    i + 1,
                    p.lid
                )));
            }
            if p.gids.is_empty() || p.pkeys.is_empty() {
                return Err(Error::invalid_parameter(format!(
                    "port {}: needs at least one GID and one P_Key",
                    i + 1
                )));
            }
            if p.gids.iter().any(|g| gids.contains_key(g)) {
                return Err(Error::invalid_parameter(format!(
                    "port {}: a GID is already on the fabric",
                    i + 1
                )));
            }
        }
        let l = cfg.limits;
        if l.max_qp > MAX_QPS || l.max_mr > crate::mr::MAX_MRS {
            return Err(Error::invalid_parameter(format!(
                "limits: max_qp must be at most {MAX_QPS}, max_mr at most {}",
                crate::mr::MAX_MRS
            )));
        }
        let attr = DeviceAttr {
            name: cfg.name.clone(),
            node_guid: cfg.node_guid,
            vendor_id: cfg.vendor_id,
            vendor_part_id: cfg.vendor_part_id,
            hw_ver: 1,
            num_ports: cfg.ports.len() as u8,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_mr_size: 1 << 40,
            max_pd: l.max_pd,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_av: l.max_av,
            max_qp_rd_atomic: 16,
            max_qp_init_rd_atomic: 16,
            atomic_cap: AtomicCap::Hca,
            max_msg_size: 1 << 31,
        };
        let ports = cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| PortCore {
                num: i as u8 + 1,
                lid: p.lid,
                gids: p.gids.clone(),
                pkeys: p.pkeys.clone(),
                mtu: p.mtu,
                state: AtomicU8::new(state_code(p.state)),
                link_layer: p.link_layer,
            })
            .collect();
        let core = Arc::new(HcaCore {
            id: new_identity(),
            mrs: MrTable::new(attr.max_mr),
            attr,
            ports,
            next_qpn: AtomicU32::new(0x100),
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
        });
        let node = Arc::new(HcaNode {
            core,
            qps: RwLock::new(id_map()),
            removed: AtomicBool::new(false),
        });
        for (i, p) in cfg.ports.iter().enumerate() {
            lids.insert(p.lid, (node.clone(), i as u8 + 1));
            for g in &p.gids {
                gids.insert(*g, (node.clone(), i as u8 + 1));
            }
        }
        hcas.push(node.clone());
        Ok(SoftHca {
            fabric: self.inner.clone(),
            node,
        })
    }

    /// Take an HCA off the fabric: packets to it are lost from now on.
    /// Handles to it keep working locally.
    pub fn remove_hca(&self, node_guid: u64) -> Result<()> {
        let mut hcas = self.inner.hcas.write();
        let Some(i) = hcas.iter().position(|h| h.core.attr.node_guid == node_guid) else {
            return Err(Error::NotFound(
                format!("no HCA with node GUID {node_guid:#x}").into(),
            ));
        };
        let node = hcas.remove(i);
        node.removed.store(true, Ordering::Release);
        self.inner
            .lids
            .write()
            .retain(|_, (n, _)| !std::ptr::eq(&**n, &*node));
        self.inner
            .gids
            .write()
            .retain(|_, (n, _)| !std::ptr::eq(&**n, &*node));
        Ok(())
    }

    /// A handle to the HCA with this node GUID.
    pub fn hca(&self, node_guid: u64) -> Option<SoftHca> {
        self.inner
            .hcas
            .read()
            .iter()
            .find(|h| h.core.attr.node_guid == node_guid)
            .map(|node| SoftHca {
                fabric: self.inner.clone(),
                node: node.clone(),
            })
    }

    /// The HCAs on the fabric.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.inner
            .hcas
            .read()
            .iter()
            .map(|h| DeviceInfo {
                name: h.core.attr.name.clone(),
                node_guid: h.core.attr.node_guid,
            })
            .collect()
    }

    /// Switch fault injection on (`Some`) or off (`None`). While on,
    /// datagram (UD, GSI) and UC packets are queued and delivered by
    /// [`progress`](Self::progress); RC traffic is never affected. Switching
    /// off delivers nothing by itself: call `progress` to flush the queue.
    pub fn set_faults(&self, cfg: Option<FaultConfig>) {
        let mut f = self.inner.faults.lock();
        match cfg {
            Some(cfg) => {
                let queue = f.take().map(|s| s.queue).unwrap_or_default();
                *f = Some(FaultState {
                    cfg,
                    rng: cfg.seed,
                    queue,
                });
                self.inner.faults_on.store(true, Ordering::Release);
            }
            None => {
                self.inner.faults_on.store(false, Ordering::Release);
                if let Some(s) = f.as_mut() {
                    s.cfg = FaultConfig::queued(s.cfg.seed);
                }
            }
        }
    }

    /// Run lists of plain RC SENDs and RDMA WRITEs as batches (the
    /// default), or every request through the general path (`false`). The
    /// results are the same either way (a differential test checks it);
    /// the switch exists to compare the two and to rule the batched path
    /// out when debugging.
    pub fn set_batched_sends(&self, on: bool) {
        self.inner.batched_sends.store(on, Ordering::Relaxed);
    }

    /// Show every UD datagram a port of this fabric sends (QP1's MADs
    /// included) to `tap`, as the packet an InfiniBand link would carry
    /// ([`crate::packet::UdPacket`]); `None` stops. A datagram is shown
    /// when its port sends it, before routing, fault injection or the
    /// receiver's checks, as a capture on the sender's link would see it.
    /// The soft fabric moves RC and UC data by memory copy, not packets, so
    /// only datagrams are shown. The tap runs on the sending thread with
    /// the sender's send queue locked: it must be quick and must not call
    /// into the fabric.
    pub fn set_capture(&self, tap: Option<CaptureTap>) {
        let mut slot = self.inner.capture.write();
        self.inner
            .capture_on
            .store(tap.is_some(), Ordering::Relaxed);
        *slot = tap;
    }

    /// One tick: deliver queued packets whose delay ran out (in queue
    /// order) and retry sends stalled by an RNR NAK once. Returns the
    /// amount of work done (0 means nothing moved).
    pub fn progress(&self) -> usize {
        self.inner.progress()
    }

    /// Call [`progress`](Self::progress) until no packet is queued and no
    /// send waits for an RNR retry, at most `max_ticks` times. Returns the
    /// number of ticks used.
    pub fn settle(&self, max_ticks: usize) -> usize {
        for t in 0..max_ticks {
            self.inner.progress();
            if self.inner.queued() == 0 && self.inner.waiters.lock().is_empty() {
                return t + 1;
            }
        }
        max_ticks
    }

    /// Packets waiting in the fault queue.
    pub fn queued(&self) -> usize {
        self.inner.queued()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> FabricStats {
        let s = &self.inner.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FabricStats {
            delivered: l(&s.delivered),
            dropped_fault: l(&s.dropped_fault),
            duplicated: l(&s.duplicated),
            reordered: l(&s.reordered),
            delayed: l(&s.delayed),
            dropped_pkey: l(&s.dropped_pkey),
            dropped_qkey: l(&s.dropped_qkey),
            dropped_no_recv: l(&s.dropped_no_recv),
            dropped_no_dest: l(&s.dropped_no_dest),
            dropped_psn: l(&s.dropped_psn),
            rnr_naks: l(&s.rnr_naks),
            batched_sends: l(&s.batched_sends),
        }
    }
}
