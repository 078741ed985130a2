//! What every object of a device shares ([`DevShared`]): its attributes,
//! ports and their feeding locks, MRs, QPs, clock, limits and the watch on
//! its pollers.

use al::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use al::sync::Arc;
use std::time::Duration;

use al::Result;
use provider::qp_state::{DeviceLimits, PortLimits};
use provider::{AvAttr, DeviceAttr};

use crate::clock::monotonic_ns;
use crate::config::Directory;
use crate::feed::FeedLock;
use crate::limits::{Charge, Kind, Usage};
use crate::mr::MrTable;
use crate::poll_watch::PollWatch;
use crate::port::PortShared;
use crate::provider_threads::on_provider_thread;
use crate::qp_map::QpMap;
use crate::timers::Timers;

/// Identities unique in the process (devices and PDs), so an object of
/// another device or PD is recognised by one compare.
pub(crate) fn new_identity() -> u64 {
    al::global! {
        static NEXT: AtomicU64 = AtomicU64::new(1);
    }
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What every object of a device shares: attributes, ports, MRs, QPs.
///
/// `Q` is the QP type its map holds (`qp::QpInner`, which holds this
/// state in turn: `qp::Dev`); generic only so that this module sits below
/// the QPs.
pub(crate) struct DevShared<Q> {
    pub(crate) id: u64,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortShared>,
    /// Each port's feeding lock, in the order of `ports`.
    pub(crate) feed_locks: Vec<FeedLock<Q>>,
    pub(crate) mrs: MrTable,
    pub(crate) qps: QpMap<Q>,
    pub(crate) next_qpn: AtomicU32,
    /// When the device opened ([`monotonic_ns`]).
    base: u64,
    /// Whether applications busy-poll the device's CQs: while they do the
    /// receive threads leave the sockets to them (`driver::run_port`).
    polls: PollWatch,
    pub(crate) directory: Arc<Directory>,
    pub(crate) timers: Timers,
    /// PDs, CQs, SRQs and AVs that exist now (against their limits).
    usage: Usage,
}

impl<Q> DevShared<Q> {
    /// The shared state of a device opening now with `attr` and `ports`,
    /// whose QP numbers start at `first_qpn`.
    pub(crate) fn new(
        attr: DeviceAttr,
        ports: Vec<PortShared>,
        directory: Arc<Directory>,
        first_qpn: u32,
    ) -> DevShared<Q> {
        DevShared {
            id: new_identity(),
            mrs: MrTable::new(attr.max_mr as usize),
            attr,
            feed_locks: ports.iter().map(|_| FeedLock::default()).collect(),
            ports,
            qps: QpMap::new(),
            next_qpn: AtomicU32::new(first_qpn),
            base: monotonic_ns(),
            polls: PollWatch::default(),
            directory,
            timers: Timers::default(),
            usage: Usage::default(),
        }
    }

    /// Take one place of `kind`'s limit (`InsufficientResources` when
    /// none is left).
    pub(crate) fn charge(&self, kind: Kind) -> Result<Charge> {
        self.usage.charge(&self.attr, kind)
    }

    /// Monotonic time since the device opened.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(monotonic_ns().saturating_sub(self.base))
    }

    ///
    /// Only a run of `BUSY_POLL_STREAK` polls that found nothing, each
    /// close behind the one before (`BUSY_POLL_GAP`), marks the device as
    /// busy-polled: an application spinning on its CQ does that all the
    /// time, while a consumer woken by a completion (the CM agent on QP1,
    /// which polls its receive and send CQs once each per round; an async
    /// CQ stream) drains its CQs and stops after a poll or two. Counting
    /// those made the receive threads nap after every CM message, and the
    /// next MAD waited out the nap (`ibal perf conn-rate --transport udp`:
    /// ~650 of ~700 us per connect).
    ///
    /// Nor do the polls of the provider's own threads
    /// ([`on_provider_thread`]).
    ///
    /// `took`: when the poll's progress fed its first datagram, if it took
    /// any. The gap to the poll before is measured up to then, not to the
    /// poll's end: a poll that drained a stranger's flood (up to
    /// `DRAIN_BATCHES` batches, ~100 us) is still a busy poll, and counting
    /// its length made the receive threads take the port back from a
    /// flooded poller (`perf send-lat --flood`: medians of 68 us instead
    /// of 30-38 in some runs).
    #[inline]
    pub(crate) fn note_poll(&self, found: usize, took: Option<Duration>) {
        // Only empty polls count (no clock read for the others).
        if found > 0 || on_provider_thread() {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let began = took.map_or(now, |t| (t.as_nanos() as u64).min(now));
        self.polls.note(began, now, found);
    }

    /// Whether an application polled within `window`.
    pub(crate) fn polled_within(&self, window: Duration) -> bool {
        let now = self.now().as_nanos() as u64;
        self.polls.busy_within(now, window)
    }

    /// Port `n` (1-based).
    pub(crate) fn port(&self, n: u8) -> Option<&PortShared> {
        (n as usize).checked_sub(1).and_then(|i| self.ports.get(i))
    }

    /// The limits the provider-neutral value checks use
    /// (`qp_state::check_av`, `qp_state::check_modify_values`): one P_Key
    /// and one GID per port, the port's MTU, GID routing only.
    pub(crate) fn with_limits<R>(&self, f: impl FnOnce(&DeviceLimits<'_>) -> R) -> R {
        let ports: Vec<PortLimits> = self
            .ports
            .iter()
            .map(|p| PortLimits {
                pkeys: 1,
                gids: 1,
                mtu: p.cfg.mtu,
                gid_only: true,
            })
            .collect();
        f(&DeviceLimits {
            ports: &ports,
            max_qp_rd_atomic: self.attr.max_qp_rd_atomic,
            max_qp_init_rd_atomic: self.attr.max_qp_init_rd_atomic,
        })
    }

    /// An address vector must name a port of the device and carry a GRH
    /// (RoCE routes by GID only) within the field widths.
    pub(crate) fn check_av(&self, av: &AvAttr, what: &str) -> Result<()> {
        self.with_limits(|l| provider::qp_state::check_av(av, l, what))
    }
}
