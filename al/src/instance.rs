//! The access-layer instance: the root every object hangs from.
//!
//! An application opens an [`Al`], creates objects under it, and closes it.
//! Closing destroys everything the instance still owns and waits until all
//! of it is gone (destroy callbacks included): the one blocking call of the
//! object model, refused from inside a callback.
//!
//! The wait is bounded ([`AlConfig::close_timeout`]). What the access layer
//! itself must do (destroy, cascade, run queued callbacks) happens within
//! it; what only the application can end (a reference kept past its call, a
//! callback that does not return) is reported instead of waited for: close
//! fails with [`Error::Leaked`], naming every object still held. For that the
//! instance remembers each object that outlived its destroy call (rare: it
//! costs nothing when the destroyer drops the last reference, as it usually
//! does).

use std::fmt;
use std::time::Duration;

use crate::children::{ChildSet, DestroyCallback};
use crate::error::{Error, Result};
use crate::executor::{Executor, ExecutorMode};
use crate::fast_hash::{id_map, IdMap};
use crate::handle::{Kind, RawHandle, MAX_KINDS};
use crate::report::{HeldObject, LeakReport, Stats};
use crate::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use crate::sync::{Arc, Deadline, Mutex};
use crate::table::HandleTable;

const OPEN: u8 = 0;
const CLOSING: u8 = 1;

/// How long closing an AL waits for what it destroyed to be gone, unless
/// [`AlConfig::close_timeout`] says otherwise.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for [`Al::open_with`]. Build with `..AlConfig::default()` so that
/// options added later keep their defaults.
#[derive(Clone, Copy, Debug)]
pub struct AlConfig {
    /// How callbacks are run.
    pub executor: ExecutorMode,
    /// How long [`Al::close`] (or dropping the [`Al`], or
    /// [`AlInstance::wait_closed`]) waits, after destroying everything, for
    /// the objects to be gone and the queued callbacks to have run. Past it,
    /// close fails with [`Error::Leaked`] naming what is still held.
    /// Ignored under loom, which has no clock (the wait is unbounded there).
    pub close_timeout: Duration,
}

impl Default for AlConfig {
    fn default() -> Self {
        AlConfig {
            executor: ExecutorMode::default(),
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
        }
    }
}

/// What an instance remembers of an object that outlived its destroy call,
/// until the object's core is dropped.
struct OutlivedDestroy {
    parent: Option<RawHandle>,
    object_refs: usize,
    core_refs: usize,
}

/// The shared state of an AL instance. Objects hold an `Arc` to it.
pub struct AlInstance {
    id: u64,
    handle: Mutex<Option<RawHandle>>,
    executor: Executor,
    children: ChildSet,
    state: AtomicU8,
    live: [AtomicUsize; MAX_KINDS],
    created: [AtomicUsize; MAX_KINDS],
    destroy_cb: Mutex<Option<DestroyCallback>>,
    close_timeout: Duration,
    /// Objects destroyed while others still referenced them, by handle:
    /// what a close that gives up reports. Touched only on that slow path
    /// (a destroy that does not drop the last reference) and when such an
    /// object's core finally drops.
    outlived_destroy: Mutex<IdMap<RawHandle, OutlivedDestroy>>,
}

fn al_table() -> &'static HandleTable<AlInstance> {
    crate::global! {
        static TABLE: HandleTable<AlInstance> = HandleTable::new(Kind::AL);
    }
    &TABLE
}

fn next_instance_id() -> u64 {
    // Identity only, never synchronisation: a plain std atomic is enough
    // even under the model checker.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl AlInstance {
    /// Process-unique id of this instance.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// This instance's handle in the AL table.
    pub fn handle(&self) -> Option<RawHandle> {
        *self.handle.lock()
    }

    /// The callback executor.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    pub(crate) fn children(&self) -> &ChildSet {
        &self.children
    }

    /// Whether close has started.
    pub fn is_closing(&self) -> bool {
        self.state.load(Ordering::Acquire) != OPEN
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closing() {
            Err(self.closing_error())
        } else {
            Ok(())
        }
    }

    pub(crate) fn closing_error(&self) -> Error {
        Error::Destroying {
            kind: Kind::AL,
            raw: self.handle().map_or(0, |h| h.as_u64()),
        }
    }

    pub(crate) fn count_created(&self, kind: Kind) {
        self.created[kind.index()].fetch_add(1, Ordering::Relaxed);
        self.live[kind.index()].fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn count_gone(&self, kind: Kind) {
        self.live[kind.index()].fetch_sub(1, Ordering::AcqRel);
    }

    /// Remember an object whose destroy call finished while others still
    /// held it (see [`HeldObject`] for the counts).
    pub(crate) fn note_outlived_destroy(
        &self,
        handle: RawHandle,
        parent: Option<RawHandle>,
        object_refs: usize,
        core_refs: usize,
    ) {
        self.outlived_destroy.lock().insert(
            handle,
            OutlivedDestroy {
                parent,
                object_refs,
                core_refs,
            },
        );
    }

    /// The object's core dropped: it is held no more.
    pub(crate) fn forget_outlived_destroy(&self, handle: RawHandle) {
        self.outlived_destroy.lock().remove(&handle);
    }

    /// How long a close waits before it reports what is still held.
    pub fn close_timeout(&self) -> Duration {
        self.close_timeout
    }

    /// Every object gone and every callback run.
    fn is_finished(&self) -> bool {
        self.live.iter().all(|c| c.load(Ordering::Acquire) == 0) && self.executor.pending() == 0
    }

    /// What is still held now: the objects that outlived their destroy call
    /// and are still referenced, and the counts of the rest.
    pub fn leak_report(&self) -> LeakReport {
        let mut held: Vec<HeldObject> = self
            .outlived_destroy
            .lock()
            .iter()
            .map(|(&handle, o)| HeldObject {
                kind: Kind::from_id(handle.kind_id()).unwrap_or(Kind::AL),
                handle,
                parent: o.parent,
                object_refs: o.object_refs,
                core_refs: o.core_refs,
                children_held: 0,
            })
            .collect();
        held.sort_unstable_by_key(|o| o.handle);
        let mut children: IdMap<RawHandle, usize> = id_map();
        for parent in held.iter().filter_map(|o| o.parent) {
            *children.entry(parent).or_default() += 1;
        }
        for o in &mut held {
            o.children_held = children.get(&o.handle).copied().unwrap_or(0);
        }
        let stats = self.stats();
        LeakReport {
            al: self.handle().unwrap_or(RawHandle::from_u64(0)),
            waited: self.close_timeout,
            unlisted: stats.total_live().saturating_sub(held.len()),
            held,
            queued_callbacks: self.executor.pending(),
            stats,
        }
    }

    /// Live-object counts.
    pub fn stats(&self) -> Stats {
        Stats {
            live: std::array::from_fn(|i| self.live[i].load(Ordering::Acquire)),
            created: std::array::from_fn(|i| self.created[i].load(Ordering::Relaxed)),
        }
    }

    /// Start closing: destroy everything this instance owns. Does not wait.
    /// `callback` runs on the executor when the instance itself is gone.
    pub fn close_async(&self, callback: Option<DestroyCallback>) -> Result<()> {
        self.state
            .compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| self.closing_error())?;
        if let Some(callback) = callback {
            *self.destroy_cb.lock() = Some(callback);
        }
        if let Some(h) = self.handle() {
            // Our own entry: nothing else removes it, so this cannot lose.
            let _ = al_table().remove(h);
        }
        for (child, destroy_child) in self.children.seal_and_take() {
            destroy_child(child);
        }
        Ok(())
    }

    /// Wait until every object of this (closing) instance is gone and every
    /// callback has run, for at most the close timeout; past it, fail with
    /// [`Error::Leaked`] naming what is still held. Refused in callbacks.
    pub fn wait_closed(&self) -> Result<()> {
        let deadline = Deadline::after(self.close_timeout);
        if self
            .executor
            .wait_until_deadline("AL close", deadline, || self.is_finished())?
        {
            Ok(())
        } else {
            Err(Error::Leaked(Box::new(self.leak_report())))
        }
    }
}

impl Drop for AlInstance {
    fn drop(&mut self) {
        if let Some(callback) = self.destroy_cb.lock().take() {
            let handle = self.handle().unwrap_or(RawHandle::from_u64(0));
            self.executor.post(Box::new(move || callback(handle)));
        }
        // Dropping the executor lets its thread drain the queue and exit.
    }
}

impl fmt::Debug for AlInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlInstance")
            .field("id", &self.id)
            .field("handle", &self.handle())
            .field("closing", &self.is_closing())
            .field("stats", &self.stats())
            .finish()
    }
}

/// An open access-layer instance, owned by the application.
///
/// Dropping it closes it and waits, as [`Al::close`] does, for at most the
/// close timeout; what is still held then is written to stderr, since a drop
/// cannot return it. Dropped inside a callback, it closes asynchronously.
pub struct Al {
    inner: Arc<AlInstance>,
    closed: bool,
}

impl Al {
    /// Open an instance with a callback thread.
    pub fn open() -> Result<Al> {
        Al::open_with(AlConfig::default())
    }

    /// Open an instance with explicit options.
    pub fn open_with(config: AlConfig) -> Result<Al> {
        let id = next_instance_id();
        let executor = Executor::new(config.executor, format!("ibal-cb-{id}"))?;
        let inner = Arc::new(AlInstance {
            id,
            handle: Mutex::new(None),
            executor,
            children: ChildSet::new(),
            state: AtomicU8::new(OPEN),
            live: std::array::from_fn(|_| AtomicUsize::new(0)),
            created: std::array::from_fn(|_| AtomicUsize::new(0)),
            destroy_cb: Mutex::new(None),
            close_timeout: config.close_timeout,
            outlived_destroy: Mutex::new(id_map()),
        });
        let h = al_table().insert(inner.clone())?;
        *inner.handle.lock() = Some(h);
        Ok(Al {
            inner,
            closed: false,
        })
    }

    /// Resolve an AL handle (as stored by users or tools) to its instance.
    pub fn lookup(h: RawHandle) -> Result<Arc<AlInstance>> {
        al_table().get_arc(h)
    }

    /// Number of AL instances open in this process.
    pub fn open_instances() -> usize {
        al_table().occupied()
    }

    /// Every AL instance open in this process (not closing), in handle
    /// order; for process-wide views ([`Al::snapshot_all`]). Takes no lock
    /// an open or close waits for.
    pub fn instances() -> Vec<Arc<AlInstance>> {
        let mut all = Vec::new();
        al_table().visit(|_, removed, r| {
            if !removed {
                all.push(r.to_arc());
            }
        });
        all
    }

    /// The shared instance (what objects hold).
    pub fn instance(&self) -> &Arc<AlInstance> {
        &self.inner
    }

    /// This instance's handle.
    pub fn handle(&self) -> RawHandle {
        self.inner
            .handle()
            .expect("invariant: an open Al has a handle")
    }

    /// Live-object counts.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Run queued callbacks on this thread (manual executor mode).
    pub fn run_callbacks(&self) -> usize {
        self.inner.executor.run_pending()
    }

    /// Close: destroy everything this instance owns and wait until it is all
    /// gone, callbacks included, for at most [`AlConfig::close_timeout`].
    ///
    /// * `Ok(stats)`: everything is gone (`stats.is_clean()` holds).
    /// * `Err(Error::Leaked(report))`: the close is done but something was
    ///   still held when the timeout passed (a reference kept past its call,
    ///   a callback that did not return); the report names each object. They
    ///   are released, destroy callbacks included, as their last references
    ///   go (in manual executor mode, by whoever runs the callbacks).
    /// * From inside a callback this refuses with [`Error::WouldDeadlock`];
    ///   the instance is then closed asynchronously as it is dropped.
    pub fn close(mut self) -> Result<Stats> {
        crate::executor::refuse_in_callback("Al::close")?;
        self.closed = true;
        self.inner.close_async(None)?;
        self.inner.wait_closed()?;
        Ok(self.inner.stats())
    }
}

/// `&al` is a `&Arc<AlInstance>`, the one receiver every call takes
/// (creating calls need the `Arc`, which new objects hold), and through it
/// a `&AlInstance`; a callback's `Arc<AlInstance>` clone works the same.
impl std::ops::Deref for Al {
    type Target = Arc<AlInstance>;
    fn deref(&self) -> &Arc<AlInstance> {
        &self.inner
    }
}

impl Drop for Al {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if self.inner.close_async(None).is_ok() && !crate::executor::in_callback() {
            if let Err(e) = self.inner.wait_closed() {
                // A drop cannot return the report, and must neither hang nor
                // panic: say it where a developer will look. (`eprintln!`
                // panics if stderr is gone; a failed write is ignored.)
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "ibal: dropping an AL: {e}");
            }
        }
    }
}

impl fmt::Debug for Al {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}
