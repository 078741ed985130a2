//! The lifecycle every access-layer object shares.
//!
//! An object of type `T` lives as `Arc<Obj<T>>`: the type's own state
//! (`body`) plus a [`Core`] with what the access layer needs: handle, owning
//! AL instance, parent link, destroy state, children and destroy callback.
//!
//! Ownership (see `docs/ownership.md`):
//! * The kind's [`HandleTable`] holds the one owning `Arc<Obj<T>>`.
//! * A child's core holds an `Arc` to its parent's core (and a type's body
//!   may hold a typed `Arc` to its parent object); a parent knows its
//!   children by handle only. No `Weak`, no cycles.
//! * [`destroy`] is two-phase and never blocks: mark Destroying, remove from
//!   the table, type teardown, cascade to children, drop the owning `Arc`.
//! * When the last `Arc<Obj<T>>` drops, the body drops first (releasing the
//!   provider resource), then the core; when the last `Arc<Core>` drops, the
//!   destroy callback is posted to the AL executor. A child's core keeps its
//!   parent's core alive, so a parent's destroy callback always comes after
//!   its children's.

use std::fmt;
use std::ops::Deref;

use crate::attrs::Attrs;
use crate::children::{ChildSet, DestroyCallback};
use crate::error::{Error, Result};
use crate::handle::{Handle, Kind, RawHandle};
use crate::instance::{Al, AlInstance};
use crate::snapshot::{ObjectInfo, ObjectState, Snapshot};
use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::sync::{Arc, Mutex};
use crate::table::{HandleTable, Ref};

const LIVE: u8 = 0;
const DESTROYING: u8 = 1;
/// Destroyed by [`destroy_unused`], which took it off the live counts
/// itself: its drop does not count it gone again.
const UNCOUNTED: u8 = 2;

/// A type whose values are access-layer objects.
pub trait Object: Send + Sync + Sized + 'static {
    /// The kind carried in this type's handles.
    const KIND: Kind;

    /// The process-wide table of this type's objects; implement with
    /// [`object_table!`](crate::object_table)`(Type)`.
    fn table() -> &'static HandleTable<Obj<Self>>;

    /// Type-specific teardown, run by [`destroy`] after the object left its
    /// table and before its children are destroyed. Must not block: it runs
    /// inside the destroy call, possibly on the callback executor.
    fn teardown(_obj: &Arc<Obj<Self>>) {}

    /// Whether a user may destroy the object now (for example a CQ with
    /// bound QPs answers `ResourceBusy`). Asked by [`destroy`] only; a
    /// parent's cascade and AL close destroy regardless. An implementation
    /// that returns `Ok` must leave the object unable to become busy again.
    fn check_destroy(_obj: &Obj<Self>) -> Result<()> {
        Ok(())
    }

    /// Kind-specific details for a snapshot ([`AlInstance::snapshot`]): its
    /// state, numbers, the handles of objects it is tied to. Runs on the
    /// snapshot's thread with a short reference to the object held, possibly
    /// while the object is being destroyed. Must not block for long (taking
    /// a lock the object's own calls take briefly is fine) and must not
    /// create or destroy objects. Adds nothing by default.
    fn describe(_obj: &Obj<Self>, _out: &mut Attrs) {}
}

/// How to destroy an object of each kind by raw handle, filled in when a
/// kind's table is first built (see [`object_table!`](crate::object_table)).
/// Lets a lower layer destroy an object of a layer above it that it knows
/// only by handle (a QP destroying the CEP its CID slot names).
static DESTROYERS: [std::sync::OnceLock<fn(RawHandle)>; crate::handle::MAX_KINDS] =
    [const { std::sync::OnceLock::new() }; crate::handle::MAX_KINDS];

/// How to walk the table of each kind for a snapshot, filled in with
/// [`DESTROYERS`]: a kind whose table was never built has no objects.
static WALKERS: [std::sync::OnceLock<WalkFn>; crate::handle::MAX_KINDS] =
    [const { std::sync::OnceLock::new() }; crate::handle::MAX_KINDS];

/// Appends the objects of one kind (of one AL instance, by id, or of all)
/// to the list, each with its owner's id.
type WalkFn = fn(Option<u64>, &mut Vec<(u64, ObjectInfo)>);

#[doc(hidden)]
pub fn register_kind<T: Object>() {
    let _ = DESTROYERS[T::KIND.index()].set(destroy_by_handle::<T>);
    let _ = WALKERS[T::KIND.index()].set(walk_kind::<T>);
}

/// Destroy any object by raw handle, dispatching on the kind it carries.
/// Like a parent's cascade: no AL check and no [`Object::check_destroy`];
/// losing to a concurrent destroy is not an error. Fails with
/// `InvalidHandle` for a kind no table was ever built for.
pub fn destroy_raw(h: RawHandle) -> Result<()> {
    let destroyer = Kind::from_id(h.kind_id())
        .and_then(|k| DESTROYERS[k.index()].get())
        .ok_or(Error::InvalidHandle {
            expected: Kind::from_id(h.kind_id()).unwrap_or(Kind::AL),
            raw: h.as_u64(),
        })?;
    destroyer(h);
    Ok(())
}

/// Implement [`Object::table`] with a process-wide table (per loom execution
/// under the model checker).
#[macro_export]
macro_rules! object_table {
    ($ty:ty) => {
        fn table() -> &'static $crate::HandleTable<$crate::Obj<$ty>> {
            $crate::global! {
                static TABLE: $crate::HandleTable<$crate::Obj<$ty>> = {
                    $crate::object::register_kind::<$ty>();
                    $crate::HandleTable::new(<$ty as $crate::Object>::KIND)
                };
            }
            &TABLE
        }
    };
}

/// The part of every object the access layer manages.
pub struct Core {
    handle: RawHandle,
    /// `Some` for the core's whole life; taken only by `Drop`.
    al: Option<Arc<AlInstance>>,
    parent: Option<Arc<Core>>,
    state: AtomicU8,
    children: ChildSet,
    destroy_cb: Mutex<Option<DestroyCallback>>,
    /// Set (before the destroyer lets go) when the object outlived its
    /// destroy call and its AL noted it; its drop then un-notes it.
    outlived_destroy: AtomicBool,
}

impl Core {
    fn new(handle: RawHandle, al: Arc<AlInstance>, parent: Option<Arc<Core>>) -> Core {
        if let Some(kind) = Kind::from_id(handle.kind_id()) {
            al.count_created(kind);
        }
        Core {
            handle,
            al: Some(al),
            parent,
            state: AtomicU8::new(LIVE),
            children: ChildSet::new(),
            destroy_cb: Mutex::new(None),
            outlived_destroy: AtomicBool::new(false),
        }
    }

    /// This object's handle.
    pub fn handle(&self) -> RawHandle {
        self.handle
    }

    /// The AL instance that owns this object.
    pub fn al(&self) -> &Arc<AlInstance> {
        self.al
            .as_ref()
            .expect("invariant: a core's AL is taken only by Drop")
    }

    /// The parent's core, `None` for top-level objects (children of the AL).
    pub fn parent(&self) -> Option<&Arc<Core>> {
        self.parent.as_ref()
    }

    /// Whether destroy has started.
    pub fn is_destroying(&self) -> bool {
        self.state.load(Ordering::Acquire) != LIVE
    }

    /// Fail with [`Error::Destroying`] once destroy has started.
    pub fn check_live(&self) -> Result<()> {
        if self.is_destroying() {
            Err(self.destroying_error())
        } else {
            Ok(())
        }
    }

    fn destroying_error(&self) -> Error {
        Error::Destroying {
            kind: Kind::from_id(self.handle.kind_id()).unwrap_or(Kind::AL),
            raw: self.handle.as_u64(),
        }
    }

    /// Number of registered children.
    pub fn child_count(&self) -> usize {
        self.children.len()
    }

    fn parent_set(&self) -> &ChildSet {
        match &self.parent {
            Some(p) => &p.children,
            None => self.al().children(),
        }
    }

    /// Live → Destroying; exactly one caller wins.
    #[cfg(not(ibal_mutant = "destroy_load_store"))]
    fn begin_destroy(&self) -> Result<()> {
        self.state
            .compare_exchange(LIVE, DESTROYING, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| self.destroying_error())
    }

    /// MUTANT (loom-tests/run.sh --mutants): a destroy flag read and then
    /// written, so two destroyers can both pass.
    #[cfg(ibal_mutant = "destroy_load_store")]
    fn begin_destroy(&self) -> Result<()> {
        if self.state.load(Ordering::Acquire) != LIVE {
            return Err(self.destroying_error());
        }
        self.state.store(DESTROYING, Ordering::Release);
        Ok(())
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let Some(al) = self.al.take() else { return };
        // Acquire: pairs with the store the destroyer made before it let go
        // (the Arc's own release/acquire orders it too; this says so).
        if self.outlived_destroy.load(Ordering::Acquire) {
            al.forget_outlived_destroy(self.handle);
        }
        let callback = self.destroy_cb.lock().take();
        let handle = self.handle;
        let counted = self.state.load(Ordering::Acquire) != UNCOUNTED;
        if !counted && callback.is_none() {
            return;
        }
        let executor_al = al.clone();
        // The live count drops on the executor, after the callback: "no live
        // objects" then means every destroy callback has run too.
        al.executor().post(Box::new(move || {
            if let Some(callback) = callback {
                callback(handle);
            }
            if let Some(kind) = Kind::from_id(handle.kind_id()).filter(|_| counted) {
                executor_al.count_gone(kind);
            }
        }));
        // `self.parent` drops after this body: the parent's destroy job, if
        // this was its last child, is posted after ours.
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("handle", &self.handle)
            .field("destroying", &self.is_destroying())
            .field("children", &self.child_count())
            .finish()
    }
}

/// An access-layer object: the type's body plus its [`Core`].
///
/// Field order matters: the body (and the provider resource it owns) drops
/// before the core, whose drop posts the destroy callback.
pub struct Obj<T> {
    body: T,
    core: Arc<Core>,
}

impl<T> Obj<T> {
    /// The access-layer part.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The typed handle.
    pub fn handle(&self) -> Handle<T> {
        Handle::from_raw(self.core.handle)
    }

    /// The owning AL instance.
    pub fn al(&self) -> &Arc<AlInstance> {
        self.core.al()
    }

    /// The type's own state.
    pub fn body(&self) -> &T {
        &self.body
    }
}

impl<T> Deref for Obj<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.body
    }
}

impl<T: fmt::Debug> fmt::Debug for Obj<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Obj")
            .field("core", &self.core)
            .field("body", &self.body)
            .finish()
    }
}

/// Create an object of type `T` owned by `al`, as a child of `parent` (or of
/// the AL itself when `None`). `build` receives the new object's core (its
/// handle is already known) and returns the body.
///
/// The object becomes visible only when it is also registered with its
/// parent, under the parent's child-set lock; if the parent is being
/// destroyed (or the AL closed) creation fails with [`Error::Destroying`] and
/// nothing is left behind, so no child can escape its parent's cascade.
pub fn create<T: Object>(
    al: &Arc<AlInstance>,
    parent: Option<&Arc<Core>>,
    build: impl FnOnce(&Arc<Core>) -> Result<T>,
) -> Result<Arc<Obj<T>>> {
    al.check_open()?;
    if let Some(p) = parent {
        if !Arc::ptr_eq(p.al(), al) {
            return Err(Error::invalid_parameter(
                "the parent object belongs to another AL instance",
            ));
        }
        p.check_live()?;
    }
    let reservation = T::table().reserve()?;
    let core = Arc::new(Core::new(reservation.handle(), al.clone(), parent.cloned()));
    let body = build(&core)?;
    let obj = Arc::new(Obj {
        body,
        core: core.clone(),
    });
    let set = core.parent_set();
    #[cfg(not(ibal_mutant = "child_publish_unlocked"))]
    let (mut list, sealed) = {
        let list = set.inner.lock();
        let sealed = list.sealed;
        (list, sealed)
    };
    // MUTANT (loom-tests/run.sh --mutants): the seal is checked under the
    // lock, but the child joins after the lock was released and retaken.
    #[cfg(ibal_mutant = "child_publish_unlocked")]
    let (mut list, sealed) = {
        let sealed = set.inner.lock().sealed;
        crate::sync::spin_hint();
        (set.inner.lock(), sealed)
    };
    if sealed {
        drop(list);
        return Err(match parent {
            Some(p) => p.destroying_error(),
            None => al.closing_error(),
        });
    }
    let handle = reservation.publish(obj.clone());
    list.members.insert(handle, destroy_by_handle::<T>);
    drop(list);
    Ok(obj)
}

/// Resolve a handle of `al`'s to a short-lived reference.
pub fn resolve<T: Object>(al: &AlInstance, h: Handle<T>) -> Result<Ref<'static, Obj<T>>> {
    let r = T::table().get(h.raw())?;
    if r.core.al.as_ref().map(|a| a.id()) != Some(al.id()) {
        return Err(Error::InvalidHandle {
            expected: T::KIND,
            raw: h.as_u64(),
        });
    }
    Ok(r)
}

/// Destroy the object `h` of `al`'s, without blocking.
///
/// A second destroy of the same object fails with [`Error::Destroying`] (its
/// callback is not taken); a stale handle fails with
/// [`Error::InvalidHandle`]. `callback` runs on the AL executor once the
/// object and everything it owned are gone.
pub fn destroy<T: Object>(
    al: &AlInstance,
    h: Handle<T>,
    callback: Option<DestroyCallback>,
) -> Result<()> {
    let r = resolve(al, h)?;
    T::check_destroy(&r)?;
    destroy_ref(r, callback)
}

fn destroy_ref<T: Object>(
    r: Ref<'static, Obj<T>>,
    callback: Option<DestroyCallback>,
) -> Result<()> {
    r.core.begin_destroy()?;
    if let Some(callback) = callback {
        install_destroy_callback(&r.core, callback);
    }
    let handle = r.core.handle;
    // Only the destroyer that won `begin_destroy` removes, so this succeeds.
    let owned = T::table().remove(handle)?;
    drop(r);
    T::teardown(&owned);
    for (child, destroy_child) in owned.core.children.seal_and_take() {
        destroy_child(child);
    }
    owned.core.parent_set().remove(handle);
    note_if_outlives_destroy(&owned);
    drop(owned);
    Ok(())
}

/// Undo a [`create`] whose caller found, before it gave the handle to
/// anyone, that the object cannot be used (a listen its port refused):
/// destroy it as [`destroy`] does and, when the caller's reference is the
/// last, take it off the live counts now rather than on the executor, so
/// that the failed call leaves nothing counted when it returns. Losing to
/// a racing destroy (AL close's cascade) is fine: that destroy finishes it
/// and its count goes the usual way.
pub fn destroy_unused<T: Object>(obj: Arc<Obj<T>>) {
    if obj.core.begin_destroy().is_err() {
        return;
    }
    let handle = obj.core.handle;
    if let Ok(owned) = T::table().remove(handle) {
        T::teardown(&owned);
        for (child, destroy_child) in owned.core.children.seal_and_take() {
            destroy_child(child);
        }
    }
    obj.core.parent_set().remove(handle);
    if Arc::strong_count(&obj) == 1 && Arc::strong_count(&obj.core) == 1 {
        // Nobody else can reach it (out of the table, out of its parent's
        // set, no other reference): the count is ours to take back.
        obj.core.state.store(UNCOUNTED, Ordering::Release);
        if let Some(kind) = Kind::from_id(handle.kind_id()) {
            obj.core.al().count_gone(kind);
        }
    } else {
        note_if_outlives_destroy(&obj);
    }
}

/// Before the destroyer drops its reference: if anyone else still holds the
/// object or its core, the object outlives this destroy call, and its AL
/// notes it so that a close that gives up can name it. The counts cannot
/// grow here (no lookup finds a removed object; only a holder can clone),
/// so "1 and 1" means this drop ends it, which is the common case and costs
/// two loads.
fn note_if_outlives_destroy<T: Object>(owned: &Arc<Obj<T>>) {
    let object_refs = Arc::strong_count(owned) - 1;
    let core_refs = Arc::strong_count(&owned.core) - 1;
    if object_refs == 0 && core_refs == 0 {
        return;
    }
    let core = &owned.core;
    core.al().note_outlived_destroy(
        core.handle,
        core.parent.as_ref().map(|p| p.handle),
        object_refs,
        core_refs,
    );
    core.outlived_destroy.store(true, Ordering::Release);
}

#[cfg(not(ibal_mutant = "destroy_callback_early"))]
fn install_destroy_callback(core: &Core, callback: DestroyCallback) {
    *core.destroy_cb.lock() = Some(callback);
}

/// MUTANT (loom-tests/run.sh --mutants): the destroy callback queued by the
/// destroy call, while others may still hold and use the object.
#[cfg(ibal_mutant = "destroy_callback_early")]
fn install_destroy_callback(core: &Core, callback: DestroyCallback) {
    let handle = core.handle;
    core.al()
        .executor()
        .post(Box::new(move || callback(handle)));
}

/// Cascade entry: destroy a child known only by handle. Losing to a
/// concurrent destroy of the same child is fine: that destroy finishes it.
fn destroy_by_handle<T: Object>(h: RawHandle) {
    if let Ok(r) = T::table().get(h) {
        let _ = destroy_ref(r, None);
    }
}

/// Destroy and wait until the destroy callback would have run. Refuses with
/// [`Error::WouldDeadlock`] on the callback executor.
pub fn destroy_sync<T: Object>(al: &AlInstance, h: Handle<T>) -> Result<()> {
    crate::executor::refuse_in_callback("destroy_sync")?;
    let done = Arc::new(crate::sync::atomic::AtomicBool::new(false));
    let signal = done.clone();
    destroy(
        al,
        h,
        Some(Box::new(move |_| signal.store(true, Ordering::Release))),
    )?;
    al.executor()
        .wait_until("destroy_sync", || done.load(Ordering::Acquire))
}

/// Post `f` to the object's AL executor, with a reference held across it so
/// the object outlives the callback and its destroy callback comes after.
pub fn post_callback<T: Object>(obj: &Arc<Obj<T>>, f: impl FnOnce(&Arc<Obj<T>>) + Send + 'static) {
    let held = obj.clone();
    obj.al().executor().post(Box::new(move || f(&held)));
}

/// The typed verbs of an instance: its own handles resolved and destroyed.
/// They live here, above [`AlInstance`], because they need the object
/// lifecycle; the instance below knows its objects only by handle.
impl AlInstance {
    /// Resolve one of this instance's handles.
    pub fn resolve<T: Object>(&self, h: Handle<T>) -> Result<Ref<'static, Obj<T>>> {
        resolve(self, h)
    }

    /// Resolve one of this instance's handles and keep the object (an
    /// `Arc`) for the rest of the call; fails with `Destroying` once its
    /// destroy has started, so nothing new is hung on a dying object.
    pub fn resolve_live<T: Object>(&self, h: Handle<T>) -> Result<Arc<Obj<T>>> {
        let obj = self.resolve(h)?.to_arc();
        obj.core().check_live()?;
        Ok(obj)
    }

    /// Destroy one of this instance's objects without blocking.
    pub fn destroy<T: Object>(
        &self,
        h: Handle<T>,
        callback: Option<DestroyCallback>,
    ) -> Result<()> {
        destroy(self, h, callback)
    }

    /// Destroy and wait for the destroy callback; refused in callbacks.
    pub fn destroy_sync<T: Object>(&self, h: Handle<T>) -> Result<()> {
        destroy_sync(self, h)
    }

    /// Every object of this instance now: kind, handle, parent, reference
    /// counts and each kind's details ([`Object::describe`]), plus the
    /// objects destroyed but still held (see [`ObjectState`]).
    ///
    /// Walks the table of every kind created so far in the process and
    /// keeps this instance's objects, pinning each slot as a lookup does:
    /// it takes no lock a create or destroy waits for, and what it meets is
    /// not atomic across objects (see [`crate::snapshot`]). Costs a walk of
    /// every kind's table (all instances' objects): for an operator's view,
    /// not a hot path.
    pub fn snapshot(&self) -> Snapshot {
        let mut found = Vec::new();
        for walk in WALKERS.iter().filter_map(|w| w.get()) {
            walk(Some(self.id()), &mut found);
        }
        self.snapshot_of(found.into_iter().map(|(_, o)| o).collect())
    }

    /// The snapshot of the objects `walked` (this instance's), with those
    /// destroyed but still held added and the counters read.
    fn snapshot_of(&self, mut objects: Vec<ObjectInfo>) -> Snapshot {
        let walked: std::collections::HashSet<RawHandle> =
            objects.iter().map(|o| o.handle).collect();
        for held in self.leak_report().held {
            if walked.contains(&held.handle) {
                continue;
            }
            let mut o = ObjectInfo::new(held.kind, held.handle, held.parent);
            o.state = ObjectState::Destroyed;
            o.object_refs = held.object_refs;
            o.core_refs = held.core_refs;
            objects.push(o);
        }
        objects.sort_by_key(|o| (o.kind, o.handle.index(), o.handle.generation()));
        Snapshot {
            al: self.handle().unwrap_or(RawHandle::from_u64(0)),
            closing: self.is_closing(),
            objects,
            stats: self.stats(),
            queued_callbacks: self.executor().pending(),
        }
    }
}

impl Al {
    /// A [`snapshot`](AlInstance::snapshot) of every AL instance open in
    /// this process, in instance order, from one walk of the tables (a
    /// process-wide view: a stress run's workers open instances of their
    /// own). Instances opened or closed meanwhile may or may not appear.
    pub fn snapshot_all() -> Vec<Snapshot> {
        let mut found = Vec::new();
        for walk in WALKERS.iter().filter_map(|w| w.get()) {
            walk(None, &mut found);
        }
        let mut by_al: std::collections::HashMap<u64, Vec<ObjectInfo>> =
            std::collections::HashMap::new();
        for (al, o) in found {
            by_al.entry(al).or_default().push(o);
        }
        Al::instances()
            .into_iter()
            .map(|al| {
                let objects = by_al.remove(&al.id()).unwrap_or_default();
                al.snapshot_of(objects)
            })
            .collect()
    }
}

/// The objects of kind `T` (of the instance with id `al`, or of all), each
/// with its owner's id; see [`AlInstance::snapshot`].
fn walk_kind<T: Object>(al: Option<u64>, out: &mut Vec<(u64, ObjectInfo)>) {
    T::table().visit(|_, _, r| {
        let core = &r.core;
        let Some(owner) = core.al.as_ref().map(|a| a.id()) else {
            return;
        };
        if al.is_some_and(|id| id != owner) {
            return;
        }
        let mut o = ObjectInfo::new(T::KIND, core.handle, core.parent.as_ref().map(|p| p.handle));
        // A removed slot is always a destroying object: only destroy removes.
        o.state = if core.is_destroying() {
            ObjectState::Destroying
        } else {
            ObjectState::Live
        };
        o.object_refs = Arc::strong_count(r.arc()) - 1;
        o.core_refs = Arc::strong_count(core) - 1;
        o.children = core.child_count();
        T::describe(r, &mut o.attrs);
        out.push((owner, o));
    });
}
