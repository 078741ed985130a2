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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::qp::QpInner;

type Map = al::fast_hash::IdMap<u32, Arc<QpInner>>;

pub(crate) struct QpMap {
    map: RwLock<Map>,
    /// Bumped by every change, while the write lock is held.
    version: AtomicU64,
}

/// The last QP the datagrams of one port reached ([`QpMap::find`]).
#[derive(Default)]
pub(crate) struct QpMemo {
    key: u32,
    version: u64,
    qp: Weak<QpInner>,
}

impl QpMap {
    pub(crate) fn new() -> QpMap {
        QpMap {
            map: RwLock::new(Map::default()),
            version: AtomicU64::new(0),
        }
    }

    /// The map, for reading.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Map> {
        self.map.read()
    }

    /// Changes the map with `f` (under its write lock; memos made before
    /// stop matching).
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut Map) -> R) -> R {
        let mut map = self.map.write();
        let r = f(&mut map);
        self.version.fetch_add(1, Ordering::Release);
        r
    }

    /// The QP with `key`: from `memo` if the map has not changed since it
    /// was made and the QP is still there, else from the map (and the memo
    /// then names it).
    pub(crate) fn find(&self, key: u32, memo: &mut QpMemo) -> Option<Arc<QpInner>> {
        // Read before the map: a change after this read moves the version
        // past it, so a memo made from a map read later never outlives it.
        let version = self.version.load(Ordering::Acquire);
        if memo.key == key && memo.version == version {
            if let Some(qp) = memo.qp.upgrade() {
                return Some(qp);
            }
        }
        let qp = self.map.read().get(&key).cloned()?;
        *memo = QpMemo {
            key,
            version,
            qp: Arc::downgrade(&qp),
        };
        Some(qp)
    }
}
