//! The verbs objects an RDMA device hands out (PD, CQ, MR, SRQ, AV, QP):
//! each holds its libibverbs object and what it must give back when it
//! drops (its hooks in the event tables, its leases).

use al::sync::{Arc, Mutex};

use provider::{QpState, QpType};

use crate::event_thread::{CqEntry, QpEntry};
use crate::leases::{Leases, QpTrack, Track};
use crate::sys;

/// A protection domain (`ibv_pd`).
pub struct RdmaPd {
    pub(crate) pd: Arc<sys::Pd>,
}

/// A completion queue (`ibv_cq`) on the device's completion channel.
pub struct RdmaCq {
    // Declared first: the hooks leave the table before the CQ can go.
    pub(crate) entry: CqEntry,
    pub(crate) cq: Arc<sys::Cq>,
}

/// A memory region (`ibv_mr`).
pub struct RdmaMr {
    // Declared first: deregistered before its leases end.
    pub(crate) mr: sys::Mr,
    pub(crate) lease_key: LeaseKey,
}

/// Ends an MR's leases when its handle goes, after the MR itself.
pub(crate) struct LeaseKey {
    pub(crate) lkey: u32,
    pub(crate) leases: Arc<Leases>,
}

impl Drop for LeaseKey {
    fn drop(&mut self) {
        self.leases.remove_mr(self.lkey);
    }
}

/// Releases a QP's leases when its handle goes, after the QP itself.
pub(crate) struct QpLeases {
    pub(crate) qpn: u32,
    pub(crate) track: Arc<QpTrack>,
    pub(crate) leases: Arc<Leases>,
}

impl Drop for QpLeases {
    fn drop(&mut self) {
        self.leases.remove_qp(self.qpn);
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct RdmaSrq {
    pub(crate) srq: Arc<sys::Srq>,
    /// Its posted receives (shared with the QPs on it).
    pub(crate) track: Arc<Track>,
}

/// An address vector (`ibv_ah`).
pub struct RdmaAv {
    pub(crate) ah: sys::Ah,
}

/// A queue pair (`ibv_qp`).
pub struct RdmaQp {
    // Declared first: the hook leaves the event table before the QP goes.
    pub(crate) events: QpEntry,
    // Destroyed before its leases end.
    pub(crate) qp: sys::Qp,
    pub(crate) leases: QpLeases,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) sq_sig_all: bool,
    /// What the last successful modifies set.
    pub(crate) set: Mutex<QpSet>,
}

/// What a QP's modifies set, as the posting paths need it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpSet {
    /// The state the last successful modify set (posting checks use it:
    /// RESET, INIT and RTR only change by a modify of ours).
    pub(crate) state: QpState,
    /// The Q_Key (UD), for the controlled Q_Key rule.
    pub(crate) qkey: u32,
}

macro_rules! opaque_debug {
    ($($t:ident),+) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )+};
}
opaque_debug!(RdmaPd, RdmaCq, RdmaMr, RdmaSrq, RdmaAv, RdmaQp);
