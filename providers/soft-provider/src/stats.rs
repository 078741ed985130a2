//! The fabric's counters: the public snapshot and the atomics behind it.

use al::sync::atomic::AtomicU64;

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
    /// [`Fabric::set_batched_sends`](crate::Fabric::set_batched_sends)).
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
