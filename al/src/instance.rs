//! The access-layer instance: the root every object hangs from.
//!
//! An application opens an [`Al`], creates objects under it, and closes it.
//! Closing destroys everything the instance still owns and waits until all
//! of it is gone (destroy callbacks included): the one blocking call of the
//! object model, refused from inside a callback.

use std::fmt;

use crate::error::{Error, Result};
use crate::executor::{Executor, ExecutorMode};
use crate::handle::{Handle, Kind, RawHandle, MAX_KINDS};
use crate::object::{ChildSet, DestroyCallback, Obj, Object};
use crate::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex};
use crate::table::{HandleTable, Ref};

const OPEN: u8 = 0;
const CLOSING: u8 = 1;

/// Options for [`Al::open_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AlConfig {
    /// How callbacks are run.
    pub executor: ExecutorMode,
}

/// Live-object counts of one AL instance, per kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    live: [usize; MAX_KINDS],
    created: [usize; MAX_KINDS],
}

impl Stats {
    /// Objects of `kind` created and not yet fully gone (destroy callback
    /// not yet run).
    pub fn live(&self, kind: Kind) -> usize {
        self.live[kind.index()]
    }
    /// Objects of `kind` ever created in this instance.
    pub fn created(&self, kind: Kind) -> usize {
        self.created[kind.index()]
    }
    /// All live objects.
    pub fn total_live(&self) -> usize {
        self.live.iter().sum()
    }
    /// Whether nothing is live: the "nothing leaked" check.
    pub fn is_clean(&self) -> bool {
        self.total_live() == 0
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut any = false;
        for id in 1..MAX_KINDS as u8 {
            let kind = Kind::from_id(id).expect("1..MAX_KINDS are kinds");
            let (live, created) = (self.live(kind), self.created(kind));
            if live == 0 && created == 0 {
                continue;
            }
            if any {
                f.write_str(", ")?;
            }
            write!(f, "{kind}: {live} live / {created} created")?;
            any = true;
        }
        if !any {
            f.write_str("no objects")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
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

    /// Live-object counts.
    pub fn stats(&self) -> Stats {
        Stats {
            live: std::array::from_fn(|i| self.live[i].load(Ordering::Acquire)),
            created: std::array::from_fn(|i| self.created[i].load(Ordering::Relaxed)),
        }
    }

    /// Resolve one of this instance's handles.
    pub fn resolve<T: Object>(&self, h: Handle<T>) -> Result<Ref<'static, Obj<T>>> {
        crate::object::resolve(self, h)
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
        crate::object::destroy(self, h, callback)
    }

    /// Destroy and wait for the destroy callback; refused in callbacks.
    pub fn destroy_sync<T: Object>(&self, h: Handle<T>) -> Result<()> {
        crate::object::destroy_sync(self, h)
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
    /// callback has run. Refused in callbacks.
    pub fn wait_closed(&self) -> Result<()> {
        self.executor.wait_until("AL close", || {
            self.live.iter().all(|c| c.load(Ordering::Acquire) == 0) && self.executor.pending() == 0
        })
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
/// Dropping it closes it (and waits, unless dropped inside a callback, where
/// the close proceeds asynchronously).
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
    /// gone, callbacks included. From inside a callback this refuses with
    /// [`Error::WouldDeadlock`]; the instance is then closed asynchronously
    /// as it is dropped.
    pub fn close(mut self) -> Result<Stats> {
        crate::executor::refuse_in_callback("Al::close")?;
        self.closed = true;
        self.inner.close_async(None)?;
        self.inner.wait_closed()?;
        Ok(self.inner.stats())
    }
}

impl std::ops::Deref for Al {
    type Target = AlInstance;
    fn deref(&self) -> &AlInstance {
        &self.inner
    }
}

impl Drop for Al {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if self.inner.close_async(None).is_ok() && !crate::executor::in_callback() {
            let _ = self.inner.wait_closed();
        }
    }
}

impl fmt::Debug for Al {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}
