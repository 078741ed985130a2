//! `ibal stress`: many threads doing random connect, accept, reject,
//! disconnect, QP destroy, CA close and AL close on the soft fabric, with
//! fault injection on the CM traffic; then a leak and invariant check.
//!
//! The fabric has [`StressConfig::hcas`] soft HCAs (one port each). Each
//! worker thread owns one or two AL instances at a time and, driven by its
//! own seeded xorshift generator, picks among: open/close an AL, open a CA
//! (and attach the CM to it), close a CA (cascade), allocate/destroy PDs,
//! CQs, QPs and MRs, listen on a service / cancel it, connect a QP to a
//! service of any HCA, accept or reject a pending request, disconnect, and
//! destroy a CEP. The CM callbacks answer at random too: a listen accepts
//! (on a QP of its AL on its HCA), rejects, sends an MRA or leaves the
//! request for the worker; the active side mostly sends the RTU; DREQs are
//! mostly answered. A ticker thread calls [`Fabric::progress`], which is the
//! only way faulted (queued) MADs are delivered.
//!
//! Every destroy the run issues carries a destroy callback that counts its
//! calls. At the end every AL is closed and the run fails when:
//! * an AL still has live objects after close (`Stats::is_clean`), or close
//!   did not finish within [`CLOSE_LIMIT`];
//! * a destroy callback ran twice, or not at all;
//! * a CEP got an event after its `Released`, or two `Released`;
//! * a callback panicked (executor counts, or the run's own handlers), or a
//!   library call panicked on a worker thread;
//! * a call failed with an error that is not one of those it documents for
//!   that operation ([`Op::allows`]);
//! * the CM agents did not all shut down (`cep::cm::active_ports`);
//! * a double accept had two winners, or a loser changed its QP or named
//!   a live CEP gone; an accept on an active CEP did not fail with
//!   `InvalidState` or moved its QP's binding;
//! * a SIDR request had no end (reply or timeout), two ends, or its CEP
//!   outlived its `Released`;
//! * a QP's CID slot stayed bound to a CEP that is gone;
//! * a CM port still routed anything but the static listens, or held a
//!   connection or a comm id, once every worker AL was closed.
//!
//! `docs/stress.md` has the details and a recorded run.
//!
//! Files: `ops` (the calls and the errors each documents), `checker` (shared
//! run state and checks), `ctx` (one AL's objects and its CM handlers),
//! `workers` (the random actions), `report` (the summary), `run` (setup,
//! the end of the run and its leak checks).

mod checker;
mod ctx;
mod ops;
mod report;
mod run;
mod workers;

pub use checker::Checker;
pub use ops::{error_name, says_cep_gone, Op};
pub use report::StressReport;
pub use run::{main, main_on, run, run_on};
pub use workers::STUCK_LIMIT;

use checker::SidrState;
use ctx::{AlCtx, Objs};
use ops::panic_text;
use workers::{worker, Slot, WorkerStatus, ACTIONS, MAX_QPS};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, AlInstance, DestroyCallback, Error, Handle, Kind, Object, Stats};
use cep::cm::{self, AcceptReply, Cep, CmHandler, CmPort, ConnectRequest, Listen, ListenHandler};
use cep::proto::Event;
use cep::proto::{PeerAddr, SidrParams, SidrReplyParams, TimedOut};
use cep::wire::RejectReason;
use cep::wire::{PrivateData, SidrStatus};
use hca::any::{AnyDevice, AnyProvider};
use hca::provider::{Access, QpType};
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use hca::QpState;
use hca::RegisteredBuffer;
use ibal::roce::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};
use ibal::verbs::{Fabric, FaultConfig, HcaConfig, SoftProvider};
use qp::CidState;
use qp::{create_qp, Qp, QpCreate};

/// How long closing one AL may take before the run calls it hung.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(30);

/// Services per HCA that listens and connects choose from.
pub const SERVICES_PER_HCA: u64 = 4;

/// The service id `k` of HCA `hca`.
pub fn service_id(hca: usize, k: u64) -> u64 {
    0x5157_0000_0000_0000 | ((hca as u64) << 8) | k
}

/// Node GUID of HCA `i` of a stress fabric.
pub fn node_guid(i: usize) -> u64 {
    0x0002_c903_00e0_0001 + ((i as u64) << 20)
}

/// LID of the (single) port of HCA `i` of a stress fabric.
pub fn lid(i: usize) -> u16 {
    0x20 + i as u16
}

/// A fabric of `n` soft HCAs with one port each ([`node_guid`], [`lid`]),
/// each limited to `max_objects` of every counted kind when given.
pub fn fabric(n: usize, max_objects: Option<u32>) -> Fabric {
    let fabric = Fabric::new();
    for i in 0..n {
        let mut cfg = HcaConfig::new(node_guid(i), &[lid(i)]);
        cfg.name = format!("stress{i}");
        if let Some(m) = max_objects {
            let l = &mut cfg.limits;
            (l.max_pd, l.max_cq, l.max_qp) = (m, m, m);
            (l.max_srq, l.max_av, l.max_mr) = (m, m, m);
        }
        fabric
            .add_hca(cfg)
            .expect("invariant: distinct GUIDs and LIDs");
    }
    fabric
}

// -------------------------------------------------------------- transport --

/// What the HCAs of a run are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Soft HCAs on one [`Fabric`], with its CM fault injection.
    #[default]
    Soft,
    /// RoCEv2 ports of one [`RoceProvider`] on loopback: HCA `i` is a
    /// device with one port on 127.0.0.(i + 1), ephemeral UDP port; every
    /// CM MAD and packet goes through the kernel's UDP. No fault injection
    /// (the fabric's faults are soft-only), no device limits.
    Udp,
}

impl Transport {
    /// `soft` or `udp`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Soft => "soft",
            Transport::Udp => "udp",
        }
    }
}

/// The address of HCA `i`'s RoCEv2 port ([`Transport::Udp`]).
pub fn udp_addr(i: usize) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1 + i as u8))
}

/// The GID a connect or SIDR request of the run names HCA `i` by (soft:
/// none, the LID does; udp: its port's address).
pub fn gid_of_hca(transport: Transport, i: usize) -> Option<[u8; 16]> {
    (transport == Transport::Udp).then(|| ibal::roce::gid_of(udp_addr(i)))
}

/// A [`RoceProvider`] whose devices are opened once and shared: a RoCE
/// device refuses a second open (it owns its UDP socket), while the stress
/// opens every HCA in many ALs at once, as the soft provider allows. Each
/// `open_ca` gets a handle to the one open device (the CM keys its agents
/// by device instance, so the CAs of one HCA share one agent, as with soft
/// HCAs). The devices stay open until the provider is dropped.
pub struct SharedRoce {
    inner: RoceProvider,
    open: Mutex<HashMap<u64, RoceDevice>>,
}

impl SharedRoce {
    /// `n` devices ([`node_guid`]) with one port each on [`udp_addr`].
    pub fn new(n: usize) -> SharedRoce {
        let devices = (0..n)
            .map(|i| {
                let port = PortConfig::new(std::net::SocketAddr::new(udp_addr(i), 0));
                DeviceConfig::new(format!("stress-roce{i}"), node_guid(i), vec![port])
            })
            .collect();
        SharedRoce {
            inner: RoceProvider::new(devices),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The open device of HCA `i`, if any CA opened it.
    pub fn device(&self, i: usize) -> Option<RoceDevice> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&node_guid(i)).cloned()
    }
}

impl AnyProvider for SharedRoce {
    fn open_any(&self, guid: u64) -> al::Result<AnyDevice> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = open.get(&guid) {
            return Ok(d.clone().into());
        }
        let d = hca::provider::Provider::open(&self.inner, guid)?;
        open.insert(guid, d.clone());
        Ok(d.into())
    }
}

/// The provider the workers open CAs from.
pub type AnyShared = Arc<dyn AnyProvider + Send + Sync>;

// ------------------------------------------------------------- randomness --

/// splitmix64 of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A xorshift64 generator (one per worker thread).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// Seeded; any seed works.
    pub fn new(seed: u64) -> XorShift {
        XorShift(mix(seed) | 1)
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------- config --

/// Settings of one stress run.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// How long the workers run.
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
    /// Fault probabilities for UD/GSI/UC packets (the CM MADs).
    pub drop: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Probability a packet is held for 1..=3 progress ticks.
    pub delay: f64,
    /// Seed of the worker generators, the callbacks and the fabric faults.
    pub seed: u64,
    /// Soft HCAs on the fabric.
    pub hcas: usize,
    /// Create every listen once, before the workers start, in a listener
    /// AL of its own (with a pool of QPs per HCA to accept on), instead of
    /// letting the workers listen and cancel at random. Avoids calling
    /// `cm::listen` while CM traffic flows (see `docs/stress.md`, known
    /// bugs).
    pub static_listens: bool,
    /// Limit every HCA to this many PDs, CQs, QPs (its GSI QP included),
    /// SRQs, AVs and MRs: creations keep meeting `InsufficientResources`
    /// and the workers exhaust the PDs on purpose.
    pub max_objects: Option<u32>,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            seconds: 10.0,
            threads: 4,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            seed: 1,
            hcas: 4,
            static_listens: false,
            max_objects: None,
        }
    }
}
