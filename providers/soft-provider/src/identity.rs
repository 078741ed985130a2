//! Identities of devices and protection domains, compared on the data path
//! to tell one device's objects from another's.

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
    // Per execution under loom (`al::global!`), so each replay of a model
    // numbers its objects alike.
    al::global! {
        static NEXT: al::sync::atomic::AtomicU64 = al::sync::atomic::AtomicU64::new(1);
    }
    NEXT.fetch_add(1, al::sync::atomic::Ordering::Relaxed)
}
