//! Optional ownership guards: an [`Owned`] handle destroys its object when
//! it is dropped.
//!
//! IBAL's model is explicit: a handle is a name, and the object lives until
//! someone destroys it (`handle.destroy(&al)`, or AL close). For programs
//! that prefer RAII, `handle.owned(&al)` wraps the handle; dropping the
//! guard starts the same non-blocking destroy (it never waits and never
//! panics: an object already destroyed, by its parent's cascade or AL close,
//! is simply gone). The guard dereferences to the handle, so every method
//! of the prelude works on it. [`Owned::into_handle`] gives the object back
//! to explicit management.
//!
//! Drop order is the program's business: a child's guard dropped after its
//! parent's finds the child already destroyed by the cascade.

use std::fmt;

use al::sync::Arc;
use al::{AlInstance, Handle, Object};

/// A handle that destroys its object when dropped. See the
/// [module docs](self).
pub struct Owned<T: Object> {
    al: Arc<AlInstance>,
    handle: Option<Handle<T>>,
}

impl<T: Object> Owned<T> {
    /// The handle (the object stays owned by this guard).
    pub fn handle(&self) -> Handle<T> {
        self.handle
            .expect("invariant: set until into_handle or drop")
    }

    /// Stop owning: the object lives on until destroyed explicitly.
    pub fn into_handle(mut self) -> Handle<T> {
        self.handle
            .take()
            .expect("invariant: set until into_handle or drop")
    }
}

impl<T: Object> std::ops::Deref for Owned<T> {
    type Target = Handle<T>;
    fn deref(&self) -> &Handle<T> {
        self.handle
            .as_ref()
            .expect("invariant: set until into_handle or drop")
    }
}

impl<T: Object> Drop for Owned<T> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // Non-blocking; an object already gone is not an error here.
            let _ = self.al.destroy(h, None);
        }
    }
}

impl<T: Object> fmt::Debug for Owned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Owned").field(&self.handle).finish()
    }
}

/// `handle.owned(&al)`: wrap a handle in a guard that destroys the object
/// when dropped.
pub trait Own<T: Object> {
    /// The guard (see [`Owned`]).
    fn owned(self, al: &Arc<AlInstance>) -> Owned<T>;
}

impl<T: Object> Own<T> for Handle<T> {
    fn owned(self, al: &Arc<AlInstance>) -> Owned<T> {
        Owned {
            al: al.clone(),
            handle: Some(self),
        }
    }
}
