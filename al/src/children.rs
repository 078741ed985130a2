//! The children of an object (or of an AL instance), known by handle, and
//! the callbacks that run when an object is gone.
//!
//! Below both [`crate::instance`] (an instance owns the set of its top-level
//! objects) and [`crate::object`] (each object's core owns the set of its
//! children), so neither has to import the other for it.

use crate::fast_hash::{id_map, IdMap};
use crate::handle::RawHandle;
use crate::sync::Mutex;

/// Called once, on the AL executor, after the object is fully gone.
pub type DestroyCallback = Box<dyn FnOnce(RawHandle) + Send + 'static>;

/// How a parent destroys a child it knows only by handle.
pub(crate) type DestroyFn = fn(RawHandle);

/// The children of an object (or of an AL instance), by handle.
pub(crate) struct ChildSet {
    pub(crate) inner: Mutex<ChildList>,
}

pub(crate) struct ChildList {
    /// Set when the owner starts being destroyed: no child may join after.
    pub(crate) sealed: bool,
    /// Hashed by handle (handles are ours, not a peer's), so joining and
    /// leaving cost no tree rebalancing on every object create and destroy;
    /// a cascade sorts them (see `seal_and_take`).
    pub(crate) members: IdMap<RawHandle, DestroyFn>,
}

impl ChildSet {
    pub(crate) fn new() -> Self {
        ChildSet {
            inner: Mutex::new(ChildList {
                sealed: false,
                members: id_map(),
            }),
        }
    }

    /// Seal the set and take its members, for the owner's cascade, in
    /// handle order: a cascade visits children in the same order every run
    /// (the loom models replay executions and need determinism).
    pub(crate) fn seal_and_take(&self) -> Vec<(RawHandle, DestroyFn)> {
        let mut members: Vec<(RawHandle, DestroyFn)> = {
            let mut list = self.inner.lock();
            list.sealed = true;
            std::mem::take(&mut list.members).into_iter().collect()
        };
        members.sort_unstable_by_key(|&(h, _)| h);
        members
    }

    pub(crate) fn remove(&self, h: RawHandle) {
        self.inner.lock().members.remove(&h);
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.lock().members.len()
    }
}
