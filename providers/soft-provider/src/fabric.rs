//! The in-process fabric a user builds: HCAs joining and leaving, fault
//! injection, capture, and the tick that drives queued packets and RNR
//! retries.

use crate::config::{CaptureTap, FaultConfig, HcaConfig, MAX_QPS};
use crate::hca::SoftHca;
use crate::hca_core::{state_code, HcaCore, PortCore};
use crate::identity::new_identity;
use crate::mr::MrTable;
use crate::node::{FabricInner, FaultState, HcaNode};
use crate::stats::{FabricStats, Stats};
use al::fast_hash::id_map;
use al::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use al::sync::{Arc, Mutex, RwLock};
use al::{Error, Result};
use provider::{AtomicCap, DeviceAttr, DeviceInfo};

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
            removed: AtomicBool::new(false),
            mrs: MrTable::new(attr.max_mr),
            attr,
            ports,
            next_qpn: AtomicU32::new(0x100),
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
        });
        let node = Arc::new(HcaNode {
            core,
            qps: RwLock::new(id_map()),
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
        node.core.removed.store(true, Ordering::Release);
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

impl SoftHca {
    /// The fabric this HCA is on.
    pub fn fabric(&self) -> Fabric {
        Fabric {
            inner: self.fabric.clone(),
        }
    }
}
