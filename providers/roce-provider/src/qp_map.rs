//! The device's QPs by key, and the memo of the last QP a port's datagram
//! reached.
//!
//! Every datagram names its QP; looking it up in the map is a read lock
//! and a reference count (four atomic operations) and a hash. A port's
//! datagrams mostly go to the QP the previous one went to, so the holder
//! of the port's feeding lock keeps a [`QpMemo`]: the key, the map's
//! version when it was found, and a weak reference. While no QP was
//! added or removed since (one load), the memo is upgraded instead (one
//! atomic operation, and one more to drop it). The memo is weak so that
//! it keeps no QP, and through it no device, alive.

use al::sync::atomic::{AtomicU64, Ordering};
use al::sync::Arc;
#[cfg(not(ibal_loom))]
use al::sync::Weak;

use al::sync::{RwLock, RwLockReadGuard};

/// The map itself: the device's QPs (`Q`: `qp::QpInner`; generic so that
/// this module, which the device's shared state holds, sits below the QPs
/// that hold that state).
pub(crate) type Map<Q> = al::fast_hash::IdMap<u32, Arc<Q>>;

/// The device's QPs by key, and a version that every change bumps.
pub(crate) struct QpMap<Q> {
    map: RwLock<Map<Q>>,
    /// Bumped by every change, while the write lock is held.
    version: AtomicU64,
}

/// The last QP the datagrams of one port reached ([`QpMap::find`]).
pub(crate) struct QpMemo<Q> {
    key: u32,
    version: u64,
    qp: MemoRef<Q>,
}

/// How the memo refers to its QP: weakly.
#[cfg(not(ibal_loom))]
type MemoRef<Q> = Weak<Q>;
/// loom's `Arc` has no weak count (`al::sync::Weak` is the normal build's
/// only), so under the model checker the memo holds its QP strongly and
/// the feeder clears it when it gives up the port's feeding lock
/// (`feed::Feeding`'s drop): across feeds it keeps nothing alive, as the
/// weak memo never does. The version protocol the models check is the
/// same code either way; that a weak memo keeps no QP alive is
/// `qp_map::tests::a_memo_keeps_no_qp_alive`'s.
#[cfg(ibal_loom)]
type MemoRef<Q> = Option<Arc<Q>>;

#[cfg(not(ibal_loom))]
fn memo_ref<Q>(qp: &Arc<Q>) -> MemoRef<Q> {
    Arc::downgrade(qp)
}
#[cfg(ibal_loom)]
fn memo_ref<Q>(qp: &Arc<Q>) -> MemoRef<Q> {
    Some(qp.clone())
}
#[cfg(not(ibal_loom))]
fn upgrade<Q>(r: &MemoRef<Q>) -> Option<Arc<Q>> {
    r.upgrade()
}
#[cfg(ibal_loom)]
fn upgrade<Q>(r: &MemoRef<Q>) -> Option<Arc<Q>> {
    r.clone()
}

// Not derived: a derive would ask `Q: Default`.
impl<Q> Default for QpMemo<Q> {
    fn default() -> Self {
        QpMemo {
            key: 0,
            version: 0,
            qp: MemoRef::default(),
        }
    }
}

impl<Q> QpMap<Q> {
    pub(crate) fn new() -> QpMap<Q> {
        QpMap {
            map: RwLock::new(Map::default()),
            version: AtomicU64::new(0),
        }
    }

    /// The map, for reading.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Map<Q>> {
        self.map.read()
    }

    /// Changes the map with `f` (under its write lock; memos made before
    /// stop matching).
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut Map<Q>) -> R) -> R {
        let mut map = self.map.write();
        let r = f(&mut map);
        crate::delay::point(crate::delay::Point::MapChanged);
        // The mistake the mutant puts back: a change that leaves the
        // version as it was, so memos made before still match.
        #[cfg(not(ibal_mutant = "qp_map_version_not_bumped"))]
        self.version.fetch_add(1, Ordering::Release);
        r
    }

    /// The QP with `key`: from `memo` if the map has not changed since it
    /// was made and the QP is still there, else from the map (and the memo
    /// then names it).
    pub(crate) fn find(&self, key: u32, memo: &mut QpMemo<Q>) -> Option<Arc<Q>> {
        // Read before the map: a change after this read moves the version
        // past it, so a memo made from a map read later never outlives it.
        let version = self.version.load(Ordering::Acquire);
        crate::delay::point(crate::delay::Point::MemoVersionRead);
        if memo.key == key && memo.version == version {
            if let Some(qp) = upgrade(&memo.qp) {
                return Some(qp);
            }
        }
        let qp = self.map.read().get(&key).cloned()?;
        // The mistake: the version the memo keeps read again after the
        // map, so a change between the two is stamped as already seen.
        #[cfg(ibal_mutant = "qp_memo_version_after_map")]
        let version = self.version.load(Ordering::Acquire);
        *memo = QpMemo {
            key,
            version,
            qp: memo_ref(&qp),
        };
        Some(qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qp::QpInner;
    use crate::{DeviceConfig, PortConfig, RoceProvider};
    use provider::{CqInit, Device, Provider, QpCaps, QpInit, QpType};

    /// A QP removed from the map and dropped by everyone else is gone,
    /// though a memo still names it (the weak memo keeps no QP, and
    /// through it no device, alive).
    #[test]
    fn a_memo_keeps_no_qp_alive() {
        struct Qp(u32);
        let map = QpMap::<Qp>::new();
        let qp = Arc::new(Qp(7));
        let alive = Arc::downgrade(&qp);
        map.change(|m| m.insert(7, qp));
        let mut memo = QpMemo::default();
        assert_eq!(map.find(7, &mut memo).unwrap().0, 7);
        assert_eq!(map.find(7, &mut memo).unwrap().0, 7, "from the memo");
        assert_eq!(memo.key, 7, "the memo names it");
        drop(map.change(|m| m.remove(&7)).unwrap());
        assert!(
            alive.upgrade().is_none(),
            "the memo keeps a removed QP alive"
        );
        assert!(map.find(7, &mut memo).is_none());
    }

    #[test]
    fn a_memo_follows_every_change_of_the_qp_map() {
        let port = PortConfig::new("127.0.0.1:0".parse().unwrap());
        let d = RoceProvider::new(vec![DeviceConfig::new("memo", 1, vec![port])])
            .open(1)
            .unwrap();
        let pd = d.alloc_pd().unwrap();
        let cq = d
            .create_cq(CqInit {
                capacity: 16,
                ..CqInit::default()
            })
            .unwrap();
        let init = QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        let (a, b) = (
            d.create_qp(&pd, &init).unwrap(),
            d.create_qp(&pd, &init).unwrap(),
        );
        let (map, key) = (&d.shared.qps, a.inner.key);
        let mut memo = QpMemo::<QpInner>::default();
        let found = |memo: &mut QpMemo<QpInner>| map.find(key, memo);
        assert!(Arc::ptr_eq(&found(&mut memo).unwrap(), &a.inner));
        assert!(
            Arc::ptr_eq(&found(&mut memo).unwrap(), &a.inner),
            "from the memo"
        );
        // The key names another QP while the first is still alive (as the
        // GSI key does when a port's QP1 is made again): a memo made
        // before the change must not match.
        map.change(|m| m.insert(key, b.inner.clone()));
        assert!(Arc::ptr_eq(&found(&mut memo).unwrap(), &b.inner));
        map.change(|m| m.remove(&key));
        assert!(found(&mut memo).is_none(), "removed, though alive");
    }
}
