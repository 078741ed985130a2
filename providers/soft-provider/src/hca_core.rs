//! What an HCA's QPs, MRs and handles share: its ports, limits, the
//! count of its objects, and its MR table (no back references to the
//! fabric or to QPs).

use crate::identity::Identity;
use crate::mr::MrTable;
use al::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use al::sync::Arc;
use al::{Error, Result};
use provider::qp_state::{check_av, DeviceLimits, PortLimits};
use provider::{AvAttr, DeviceAttr, Gid, LinkLayer, Mtu, PortAttr, PortState};

/// One port of an HCA as the data path sees it.
pub(crate) struct PortCore {
    pub(crate) num: u8,
    pub(crate) lid: u16,
    pub(crate) gids: Vec<Gid>,
    pub(crate) pkeys: Vec<u16>,
    pub(crate) mtu: Mtu,
    pub(crate) state: AtomicU8,
    pub(crate) link_layer: LinkLayer,
}

pub(crate) fn state_code(s: PortState) -> u8 {
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

/// What QPs and MRs of an HCA share (no back references).
pub(crate) struct HcaCore {
    /// This device's identity (its CQs carry it).
    pub(crate) id: Identity,
    /// Set when the HCA leaves the fabric (a cached route to it is stale).
    pub(crate) removed: AtomicBool,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortCore>,
    pub(crate) mrs: MrTable,
    pub(crate) next_qpn: AtomicU32,
    /// Live objects of each counted kind (MRs are counted by `mrs`).
    pub(crate) counts: [AtomicU32; Counted::KINDS],
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
    /// The P_Key at `index` in port `port`'s table; 0 (which matches no
    /// key) when the port or the index does not exist.
    #[inline]
    pub(crate) fn pkey(&self, port: u8, index: u16) -> u16 {
        self.port(port)
            .and_then(|p| p.pkeys.get(index as usize).copied())
            .unwrap_or(0)
    }

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
