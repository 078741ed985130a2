//! The generational handle table.
//!
//! One table holds the objects of one [`Kind`]. It owns each live object (it
//! holds the one owning `Arc`), and turns handles back into objects without a
//! global exclusive lock:
//!
//! * **Slots never move.** Storage is a fixed array of pages; page `p` holds
//!   `32 << p` slots and is allocated on first use and freed only when the
//!   table is dropped, so a slot reference stays valid for the table's life.
//! * **Each slot has one state word** (`lifecycle | refs | generation`).
//!   [`HandleTable::get`] checks the handle's generation and bumps `refs` with
//!   one compare-exchange; dropping the returned [`Ref`] takes it back with
//!   another. Readers of different objects touch different cache lines
//!   (slots are cache-line padded), so lookups scale across threads.
//! * **Removal is two-phase.** [`HandleTable::remove`] flips the slot from
//!   `PRESENT` to `REMOVED`, so no new lookup succeeds; the slot's `Arc` is
//!   released, the generation advanced and the index freed by whoever drops
//!   the last outstanding `Ref` (possibly the remover itself).
//! * **Generations never wrap.** A slot whose generation reaches the table's
//!   limit is retired instead of reused, so a stale handle can never name a
//!   later object.
//! * **Index allocation** (insert and the final free) goes through a
//!   [`slab::Slab`] behind a mutex; it is off the lookup path.

use std::fmt;
use std::marker::PhantomData;
use std::ptr;

use crate::error::{Error, Result};
use crate::handle::{Kind, RawHandle, INDEX_BITS, MAX_GENERATION};
use crate::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use crate::sync::cell::{ConstPtr, UnsafeCell};
use crate::sync::{Arc, Mutex};

const FIRST_PAGE_SHIFT: u32 = 5;
const FIRST_PAGE_SLOTS: u64 = 1 << FIRST_PAGE_SHIFT;
/// Enough pages for every `u32` index: 32 * (2^28 - 1) > 2^32.
const PAGES: usize = 28;

// State word layout.
const LIFECYCLE_MASK: u64 = 0b11;
const VACANT: u64 = 0;
const PRESENT: u64 = 1;
const REMOVED: u64 = 2;
const REF_SHIFT: u32 = 2;
const REF_ONE: u64 = 1 << REF_SHIFT;
const REF_BITS: u32 = 30;
const MAX_REFS: u64 = (1 << REF_BITS) - 1;
const GEN_SHIFT: u32 = 32;

#[inline(always)]
fn lifecycle(state: u64) -> u64 {
    state & LIFECYCLE_MASK
}
#[inline(always)]
fn refs(state: u64) -> u64 {
    (state >> REF_SHIFT) & MAX_REFS
}
#[inline(always)]
fn generation(state: u64) -> u32 {
    (state >> GEN_SHIFT) as u32
}
#[inline(always)]
fn pack(lifecycle: u64, refs: u64, generation: u32) -> u64 {
    lifecycle | (refs << REF_SHIFT) | ((generation as u64) << GEN_SHIFT)
}

/// Page number and offset of a slot index.
#[inline(always)]
fn locate(index: u32) -> (usize, usize) {
    let n = index as u64 + FIRST_PAGE_SLOTS;
    let page = (63 - n.leading_zeros() - FIRST_PAGE_SHIFT) as usize;
    let offset = (n - (FIRST_PAGE_SLOTS << page)) as usize;
    (page, offset)
}

#[inline(always)]
fn page_len(page: usize) -> usize {
    (FIRST_PAGE_SLOTS as usize) << page
}

/// One slot, alone on its cache line, so that lookups of neighbouring
/// objects from different threads do not share a line. (128-byte padding,
/// against adjacent-line prefetch, measured worse on the 2-vCPU machines
/// here: it doubles the footprint the two threads share in cache; see
/// docs/benchmarks.md.)
#[repr(align(64))]
struct Slot<T> {
    state: AtomicU64,
    /// Written only by the inserter before `PRESENT` is published, and taken
    /// only by the single thread that moves a `REMOVED` slot to zero refs.
    value: UnsafeCell<Option<Arc<T>>>,
}

// SAFETY: the value is an `Arc<T>` shared across threads (needs T: Send +
// Sync), and every access to the cell follows the state-word protocol
// described on `Slot::value`, which rules out a write concurrent with any
// other access.
unsafe impl<T: Send + Sync> Sync for Slot<T> {}
// SAFETY: as above; moving a slot moves an `Option<Arc<T>>`.
unsafe impl<T: Send + Sync> Send for Slot<T> {}

impl<T> Slot<T> {
    fn vacant() -> Self {
        Slot {
            state: AtomicU64::new(pack(VACANT, 0, 0)),
            value: UnsafeCell::new(None),
        }
    }
}

/// Bytes of one slot of a table of `T` (the footprint of a live handle).
pub(crate) fn slot_bytes<T>() -> usize {
    std::mem::size_of::<Slot<T>>()
}

struct Allocator {
    slab: slab::Slab<()>,
    retired: usize,
}

/// Sizes a table may be built with; the defaults allow every index a
/// handle can carry and every generation it can carry.
#[derive(Clone, Copy, Debug)]
pub struct TableLimits {
    /// Most slots ever allocated (live, draining or retired).
    pub max_slots: usize,
    /// Generation at which a slot is retired instead of reused.
    pub max_generation: u32,
}

impl Default for TableLimits {
    fn default() -> Self {
        TableLimits {
            max_slots: 1usize << INDEX_BITS,
            max_generation: MAX_GENERATION,
        }
    }
}

/// A table of the objects of one kind; see the module docs.
pub struct HandleTable<T> {
    kind: Kind,
    limits: TableLimits,
    pages: [AtomicPtr<Slot<T>>; PAGES],
    alloc: Mutex<Allocator>,
    /// The table owns `Arc<T>`s: be Send/Sync exactly when `Arc<T>` is.
    _owns: PhantomData<Arc<T>>,
}

impl<T> HandleTable<T> {
    /// An empty table for objects of `kind`, with default limits.
    pub fn new(kind: Kind) -> Self {
        Self::with_limits(kind, TableLimits::default())
    }

    /// An empty table with explicit limits (tests use small ones to reach
    /// exhaustion and generation retirement quickly).
    pub fn with_limits(kind: Kind, limits: TableLimits) -> Self {
        let limits = TableLimits {
            max_slots: limits.max_slots.min(1usize << INDEX_BITS),
            max_generation: limits.max_generation.min(MAX_GENERATION),
        };
        HandleTable {
            kind,
            limits,
            pages: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            alloc: Mutex::new(Allocator {
                slab: slab::Slab::new(),
                retired: 0,
            }),
            _owns: PhantomData,
        }
    }

    /// The kind of object this table holds.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn invalid(&self, h: RawHandle) -> Error {
        Error::InvalidHandle {
            expected: self.kind,
            raw: h.as_u64(),
        }
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let (page, offset) = locate(index);
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null page pointer was published (Release, after the
        // slots were initialised) by `ensure_page`, points to `page_len(page)`
        // slots, and is freed only in `Drop`, which `&self` excludes.
        // `offset < page_len(page)` by construction of `locate`.
        Some(unsafe { &*base.add(offset) })
    }

    /// Resolve a handle to a short-lived reference.
    ///
    /// Fails with [`Error::InvalidHandle`] for a handle of another kind, an
    /// index never allocated, a stale generation, or an object already
    /// removed. Takes no lock: one compare-exchange on the slot's state word.
    #[inline]
    pub fn get(&self, h: RawHandle) -> Result<Ref<'_, T>> {
        if h.kind_id() != self.kind.id() {
            return Err(self.invalid(h));
        }
        let Some(slot) = self.slot(h.index()) else {
            return Err(self.invalid(h));
        };
        let want = h.generation();
        let mut state = slot.state.load(Ordering::Relaxed);
        loop {
            if lifecycle(state) != PRESENT || generation(state) != want {
                return Err(self.invalid(h));
            }
            if refs(state) == MAX_REFS {
                return Err(Error::insufficient_resources(
                    "too many concurrent references to one object",
                ));
            }
            // Acquire pairs with the inserter's Release publish of PRESENT,
            // so the value written before it is visible to us.
            match slot.state.compare_exchange_weak(
                state,
                state + REF_ONE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => {
                    state = actual;
                    crate::sync::spin_hint();
                }
            }
        }
        Ok(Ref {
            table: self,
            slot,
            index: h.index(),
            value: Some(slot.value.get()),
        })
    }

    /// Resolve and clone the owning `Arc` (a reference that may outlive the
    /// call; it keeps the object alive, not its handle valid).
    pub fn get_arc(&self, h: RawHandle) -> Result<Arc<T>> {
        self.get(h).map(|r| r.to_arc())
    }

    /// Insert the object built by `make`, which is given the object's handle
    /// (objects know their own handle). The handle resolves only once `make`
    /// has returned `Ok`; if it fails, the slot is given back.
    pub fn insert_with<E>(
        &self,
        make: impl FnOnce(RawHandle) -> std::result::Result<Arc<T>, E>,
    ) -> std::result::Result<RawHandle, E>
    where
        E: From<Error>,
    {
        let reservation = self.reserve()?;
        let value = make(reservation.handle())?;
        Ok(reservation.publish(value))
    }

    /// Insert an already-built object.
    pub fn insert(&self, value: Arc<T>) -> Result<RawHandle> {
        self.insert_with(|_| Ok::<_, Error>(value))
    }

    /// Reserve a slot: its handle is known but does not resolve until
    /// [`Reservation::publish`]. Dropping the reservation gives the slot back.
    /// Lets a caller build an object that knows its own handle and publish
    /// it under a lock of its choosing.
    pub fn reserve(&self) -> Result<Reservation<'_, T>> {
        let (index, slot) = self.reserve_slot()?;
        let gen = generation(slot.state.load(Ordering::Relaxed));
        Ok(Reservation {
            table: self,
            slot,
            handle: RawHandle::new(self.kind, gen, index),
            published: false,
        })
    }

    fn reserve_slot(&self) -> Result<(u32, &Slot<T>)> {
        let mut alloc = self.alloc.lock();
        let index = alloc.slab.vacant_key();
        if index >= self.limits.max_slots {
            return Err(Error::insufficient_resources(format!(
                "{} table is full ({} slots)",
                self.kind, self.limits.max_slots
            )));
        }
        let index = index as u32;
        self.ensure_page(locate(index).0);
        alloc.slab.insert(());
        drop(alloc);
        let slot = self
            .slot(index)
            .expect("invariant: the page of an allocated index exists");
        Ok((index, slot))
    }

    /// Allocate page `page` if it is missing. Called with the allocator lock
    /// held, so only one thread ever installs a page.
    fn ensure_page(&self, page: usize) {
        if !self.pages[page].load(Ordering::Acquire).is_null() {
            return;
        }
        let slots: Box<[Slot<T>]> = (0..page_len(page)).map(|_| Slot::vacant()).collect();
        let base = Box::into_raw(slots) as *mut Slot<T>;
        self.pages[page].store(base, Ordering::Release);
    }

    /// Remove the object so that no new lookup of `h` succeeds, and return
    /// an `Arc` to it (ownership passes to the caller). Lookups already in
    /// progress keep their references; the slot is recycled after the last.
    ///
    /// Of two removers of one handle exactly one gets `Ok`.
    pub fn remove(&self, h: RawHandle) -> Result<Arc<T>> {
        let held = self.get(h)?;
        let mut state = held.slot.state.load(Ordering::Relaxed);
        loop {
            // Our reference pins the generation; only the lifecycle can move.
            if lifecycle(state) != PRESENT {
                return Err(self.invalid(h));
            }
            let removed = (state & !LIFECYCLE_MASK) | REMOVED;
            match held.slot.state.compare_exchange_weak(
                state,
                removed,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => {
                    state = actual;
                    crate::sync::spin_hint();
                }
            }
        }
        let owned = held.to_arc();
        drop(held);
        Ok(owned)
    }

    /// Drop one reference to `slot`; the last reference to a removed slot
    /// recycles it.
    fn release(&self, slot: &Slot<T>, index: u32) {
        let mut state = slot.state.load(Ordering::Relaxed);
        loop {
            debug_assert!(refs(state) > 0);
            let next = state - REF_ONE;
            // AcqRel: our reads of the value happen before the recycler's
            // take (Release), and the recycler sees every other reader's
            // release (Acquire) through the chain of RMWs on this word.
            match slot
                .state
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if lifecycle(next) == REMOVED && Self::last_reference(next) {
                        self.recycle(slot, index, generation(next));
                    }
                    return;
                }
                Err(actual) => {
                    state = actual;
                    crate::sync::spin_hint();
                }
            }
        }
    }

    #[cfg(not(ibal_mutant = "table_free_early"))]
    #[inline(always)]
    fn last_reference(state: u64) -> bool {
        refs(state) == 0
    }

    /// MUTANT (loom-tests/run.sh --mutants): the old layer freed an object
    /// when it was removed, whoever still used it.
    #[cfg(ibal_mutant = "table_free_early")]
    #[inline(always)]
    fn last_reference(_state: u64) -> bool {
        true
    }

    /// Take the value out of a `REMOVED` slot with no references, advance
    /// the generation (or retire the slot) and free the index.
    fn recycle(&self, slot: &Slot<T>, index: u32, gen: u32) {
        // SAFETY: the slot is REMOVED with zero refs and we made that
        // transition: no reference exists, none can be taken (lookups need
        // PRESENT), the remover has finished with its CAS, and the index is
        // still allocated so no inserter can reach the slot.
        let value = unsafe { slot.value.get_mut().deref().take() };
        let mut alloc = self.alloc.lock();
        if gen >= self.limits.max_generation {
            // Retired: stays VACANT at its last generation and its index
            // stays allocated, so no handle ever names a later object here.
            slot.state.store(pack(VACANT, 0, gen), Ordering::Release);
            alloc.retired += 1;
        } else {
            slot.state
                .store(pack(VACANT, 0, gen + 1), Ordering::Release);
            alloc.slab.remove(index as usize);
        }
        drop(alloc);
        // The owning Arc goes last, off every lock: dropping it may run the
        // object's own teardown.
        drop(value);
    }

    /// Free the index of a reservation that was never published, advancing
    /// the slot's generation (or retiring the slot at the limit) as
    /// [`recycle`](Self::recycle) does. The slot is `VACANT` with no
    /// references and holds no value; only the reserver can reach it.
    fn give_back_unpublished(&self, slot: &Slot<T>, index: u32, gen: u32) {
        let mut alloc = self.alloc.lock();
        if gen >= self.limits.max_generation {
            alloc.retired += 1;
        } else {
            slot.state
                .store(pack(VACANT, 0, gen + 1), Ordering::Release);
            alloc.slab.remove(index as usize);
        }
    }

    /// Visit every object the table holds: `f` gets its handle, whether it
    /// was already removed, and a reference like [`get`](Self::get)'s,
    /// dropped when `f` returns.
    ///
    /// Safe against concurrent inserts and removes, and takes no lock: each
    /// slot is pinned with the compare-exchange a lookup uses, so a remove
    /// meanwhile goes ahead (the slot is recycled when the visit lets go,
    /// and if that is the last reference, the visitor's thread drops the
    /// object, as a lookup's would). Objects published or removed while the
    /// walk runs may or may not be seen; none is seen twice or half-built.
    /// A removed slot is visited only while someone else still references
    /// it (a lookup, or the remover finishing its destroy). Walks every slot
    /// of the pages allocated so far: at most twice the most objects the
    /// table ever held at once, plus 32.
    pub fn visit(&self, mut f: impl FnMut(RawHandle, bool, &Ref<'_, T>)) {
        for (page, ptr) in self.pages.iter().enumerate() {
            if ptr.load(Ordering::Acquire).is_null() {
                continue;
            }
            let first = (FIRST_PAGE_SLOTS << page) - FIRST_PAGE_SLOTS;
            for offset in 0..page_len(page) as u64 {
                let index = (first + offset) as u32;
                let Some(slot) = self.slot(index) else { break };
                let Some(state) = Self::pin_for_visit(slot) else {
                    continue;
                };
                let r = Ref {
                    table: self,
                    slot,
                    index,
                    value: Some(slot.value.get()),
                };
                let handle = RawHandle::new(self.kind, generation(state), index);
                f(handle, lifecycle(state) == REMOVED, &r);
            }
        }
    }

    /// Take a reference to a slot that holds a value: `PRESENT`, or
    /// `REMOVED` while others still reference it (its value is taken only
    /// by whoever drops the last reference, which then cannot be before
    /// ours). Returns the state the reference was taken in.
    fn pin_for_visit(slot: &Slot<T>) -> Option<u64> {
        let mut state = slot.state.load(Ordering::Relaxed);
        loop {
            let holds_value = match lifecycle(state) {
                PRESENT => true,
                REMOVED => refs(state) > 0,
                _ => false,
            };
            if !holds_value || refs(state) == MAX_REFS {
                return None;
            }
            // Acquire, as in `get`: the publish of PRESENT (and every RMW
            // after it on this word) orders the value's write before us.
            match slot.state.compare_exchange_weak(
                state,
                state + REF_ONE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(state),
                Err(actual) => {
                    state = actual;
                    crate::sync::spin_hint();
                }
            }
        }
    }

    /// Slots currently allocated: live objects, removed ones still
    /// referenced, and retired slots.
    pub fn allocated(&self) -> usize {
        self.alloc.lock().slab.len()
    }

    /// Slots retired because their generation reached the limit.
    pub fn retired(&self) -> usize {
        self.alloc.lock().retired
    }

    /// Slots holding an object (live or still referenced after removal).
    pub fn occupied(&self) -> usize {
        let alloc = self.alloc.lock();
        alloc.slab.len() - alloc.retired
    }
}

impl<T> Drop for HandleTable<T> {
    fn drop(&mut self) {
        for (page, ptr) in self.pages.iter_mut().enumerate() {
            let base = ptr.load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            // SAFETY: `base` came from `Box::into_raw` of a boxed slice of
            // exactly `page_len(page)` slots in `ensure_page`, and `&mut self`
            // proves no `Ref` (which borrows the table) is alive.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, page_len(page))) });
        }
    }
}

impl<T> fmt::Debug for HandleTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandleTable")
            .field("kind", &self.kind)
            .field("occupied", &self.occupied())
            .field("retired", &self.retired())
            .finish()
    }
}

/// A reserved, not yet visible slot; see [`HandleTable::reserve`].
pub struct Reservation<'a, T> {
    table: &'a HandleTable<T>,
    slot: &'a Slot<T>,
    handle: RawHandle,
    published: bool,
}

impl<T> Reservation<'_, T> {
    /// The handle the object will have.
    pub fn handle(&self) -> RawHandle {
        self.handle
    }

    /// Store the object and make the handle resolve.
    pub fn publish(mut self, value: Arc<T>) -> RawHandle {
        // SAFETY: the slot is VACANT with zero refs and its index is
        // allocated to this reservation: no lookup can take a reference
        // (lookups need PRESENT) and no one else writes the cell until the
        // index is freed.
        unsafe { *self.slot.value.get_mut().deref() = Some(value) };
        // Release: the value is visible to every lookup that sees PRESENT.
        self.slot.state.store(
            pack(PRESENT, 0, self.handle.generation()),
            Ordering::Release,
        );
        self.published = true;
        self.handle
    }
}

impl<T> Drop for Reservation<'_, T> {
    fn drop(&mut self) {
        if !self.published {
            // The handle was already handed out (to the object's builder,
            // which may have kept it or shown it to someone): give the slot
            // back exactly as a removal does, under a new generation or
            // retired, so that this handle value never names a later object.
            self.table.give_back_unpublished(
                self.slot,
                self.handle.index(),
                self.handle.generation(),
            );
        }
    }
}

/// A short-lived reference to a table entry: dereferences to the object and
/// keeps its slot from being recycled until dropped. Use [`Ref::to_arc`] to
/// keep the object beyond the call.
pub struct Ref<'a, T> {
    table: &'a HandleTable<T>,
    slot: &'a Slot<T>,
    index: u32,
    /// Under loom this guard tracks the read for the reference's whole life.
    value: Option<ConstPtr<Option<Arc<T>>>>,
}

impl<T> Ref<'_, T> {
    /// The owning `Arc` (borrowed).
    #[inline]
    pub fn arc(&self) -> &Arc<T> {
        let value = self
            .value
            .as_ref()
            .expect("invariant: a live Ref holds its pointer");
        // SAFETY: we hold a reference count on a slot that was PRESENT when
        // we took it; the value is only taken once the count reaches zero,
        // and only written before PRESENT was published.
        let value = unsafe { value.deref() };
        value
            .as_ref()
            .expect("invariant: a referenced slot holds a value")
    }

    /// Clone the owning `Arc`, to keep the object alive past this call.
    #[inline]
    pub fn to_arc(&self) -> Arc<T> {
        self.arc().clone()
    }
}

impl<T> std::ops::Deref for Ref<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.arc()
    }
}

impl<T> Drop for Ref<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // End the tracked read before the count drops: whoever recycles the
        // slot will write it.
        self.value = None;
        self.table.release(self.slot, self.index);
    }
}

impl<T: fmt::Debug> fmt::Debug for Ref<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(all(test, not(ibal_loom)))]
mod tests {
    use super::*;

    const K: Kind = Kind::custom(16);

    #[test]
    fn locate_covers_pages_contiguously() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(31), (0, 31));
        assert_eq!(locate(32), (1, 0));
        assert_eq!(locate(95), (1, 63));
        assert_eq!(locate(96), (2, 0));
        let (p, o) = locate(u32::MAX);
        assert!(p < PAGES);
        assert!(o < page_len(p));
        // Every index maps to a distinct (page, offset) and pages are filled in order.
        let mut expect = (0usize, 0usize);
        for i in 0..10_000u32 {
            assert_eq!(locate(i), expect, "index {i}");
            expect.1 += 1;
            if expect.1 == page_len(expect.0) {
                expect = (expect.0 + 1, 0);
            }
        }
    }

    #[test]
    fn insert_get_remove() {
        let t = HandleTable::new(K);
        let h = t.insert(Arc::new(7u32)).unwrap();
        assert_eq!(*t.get(h).unwrap(), 7);
        let owned = t.remove(h).unwrap();
        assert_eq!(*owned, 7);
        assert!(matches!(t.get(h), Err(Error::InvalidHandle { .. })));
        assert!(matches!(t.remove(h), Err(Error::InvalidHandle { .. })));
        assert_eq!(t.occupied(), 0);
    }

    #[test]
    fn wrong_kind_forged_and_unallocated_handles_are_invalid() {
        let t = HandleTable::new(K);
        let h = t.insert(Arc::new(1u8)).unwrap();
        let other_kind = RawHandle::new(Kind::QP, h.generation(), h.index());
        assert!(t.get(other_kind).is_err());
        let far = RawHandle::new(K, 0, 1 << 30);
        assert!(t.get(far).is_err());
        let wrong_gen = RawHandle::new(K, h.generation() + 1, h.index());
        assert!(t.get(wrong_gen).is_err());
        for raw in [0u64, u64::MAX, 0x0c00_0000_ffff_ffff, 0xffff_ffff] {
            assert!(t.get(RawHandle::from_u64(raw)).is_err());
        }
    }

    #[test]
    fn a_reused_slot_gets_a_new_generation() {
        let t = HandleTable::new(K);
        let a = t.insert(Arc::new(1u8)).unwrap();
        t.remove(a).unwrap();
        let b = t.insert(Arc::new(2u8)).unwrap();
        assert_eq!(a.index(), b.index());
        assert_ne!(a.generation(), b.generation());
        assert!(t.get(a).is_err());
        assert_eq!(*t.get(b).unwrap(), 2);
    }

    #[test]
    fn slot_is_recycled_only_after_the_last_reference() {
        let t = HandleTable::new(K);
        let h = t.insert(Arc::new(5u8)).unwrap();
        let r = t.get(h).unwrap();
        let owned = t.remove(h).unwrap();
        // Removed: no new lookup, but the held reference still reads.
        assert!(t.get(h).is_err());
        assert_eq!(*r, 5);
        assert_eq!(Arc::strong_count(&owned), 2);
        // A new insert cannot take the still-referenced slot.
        let other = t.insert(Arc::new(6u8)).unwrap();
        assert_ne!(other.index(), h.index());
        drop(r);
        assert_eq!(Arc::strong_count(&owned), 1);
        let again = t.insert(Arc::new(7u8)).unwrap();
        assert_eq!(again.index(), h.index());
        assert_ne!(again.generation(), h.generation());
    }

    #[test]
    fn generation_limit_retires_slots() {
        let t = HandleTable::with_limits(
            K,
            TableLimits {
                max_slots: 4,
                max_generation: 3,
            },
        );
        let mut seen = Vec::new();
        for _ in 0..4 {
            let h = t.insert(Arc::new(0u8)).unwrap();
            seen.push(h);
            t.remove(h).unwrap();
        }
        // One slot went through generations 0..=3 and is now retired.
        assert!(seen.iter().all(|h| h.index() == 0));
        assert_eq!(t.retired(), 1);
        let next = t.insert(Arc::new(0u8)).unwrap();
        assert_eq!(next.index(), 1);
        for h in &seen {
            assert!(t.get(*h).is_err());
        }
    }

    #[test]
    fn full_table_reports_insufficient_resources() {
        let t = HandleTable::with_limits(
            K,
            TableLimits {
                max_slots: 2,
                max_generation: MAX_GENERATION,
            },
        );
        t.insert(Arc::new(0u8)).unwrap();
        t.insert(Arc::new(0u8)).unwrap();
        assert!(matches!(
            t.insert(Arc::new(0u8)),
            Err(Error::InsufficientResources(_))
        ));
    }

    #[test]
    fn failed_make_gives_the_slot_back() {
        let t: HandleTable<u8> = HandleTable::new(K);
        let r: Result<RawHandle> = t.insert_with(|_| Err(Error::invalid_parameter("no")));
        assert!(r.is_err());
        assert_eq!(t.allocated(), 0);
    }

    #[test]
    fn a_failed_insert_never_reissues_the_handle_its_maker_saw() {
        let t: HandleTable<u8> = HandleTable::new(K);
        let mut seen = None;
        let r: Result<RawHandle> = t.insert_with(|h| {
            seen = Some(h);
            Err(Error::invalid_parameter("no"))
        });
        assert!(r.is_err());
        let seen = seen.expect("the maker ran");
        let next = t.insert(Arc::new(1u8)).unwrap();
        assert_eq!(next.index(), seen.index(), "the slot itself is reused");
        assert_ne!(next, seen, "but under a new generation");
        assert!(t.get(seen).is_err());
    }

    #[test]
    fn a_failed_insert_at_the_generation_limit_retires_the_slot() {
        let t: HandleTable<u8> = HandleTable::with_limits(
            K,
            TableLimits {
                max_slots: 4,
                max_generation: 2,
            },
        );
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r: Result<RawHandle> = t.insert_with(|h| {
                seen.push(h);
                Err(Error::invalid_parameter("no"))
            });
            assert!(r.is_err());
        }
        assert!(seen.iter().all(|h| h.index() == 0));
        assert_eq!(
            seen.iter().map(|h| h.generation()).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(t.retired(), 1);
        assert_eq!(t.insert(Arc::new(0u8)).unwrap().index(), 1);
    }

    #[test]
    fn dropping_the_table_drops_remaining_objects() {
        let obj = Arc::new(9u8);
        let t = HandleTable::new(K);
        t.insert(obj.clone()).unwrap();
        assert_eq!(Arc::strong_count(&obj), 2);
        drop(t);
        assert_eq!(Arc::strong_count(&obj), 1);
    }

    #[test]
    fn visit_meets_live_objects_and_removed_ones_still_referenced() {
        let t = HandleTable::new(K);
        let handles: Vec<_> = (0..100u32)
            .map(|i| t.insert(Arc::new(i)).unwrap())
            .collect();
        let held = t.get(handles[7]).unwrap();
        for h in handles.iter().step_by(2) {
            t.remove(*h).unwrap();
        }
        let mut seen = Vec::new();
        t.visit(|h, removed, r| seen.push((h, removed, **r)));
        let want: Vec<_> = handles
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(i, h)| (*h, false, i as u32))
            .collect();
        // 7 is odd: kept. Remove it too while held, and it shows as removed.
        assert_eq!(seen, want);
        t.remove(handles[7]).unwrap();
        seen.clear();
        t.visit(|h, removed, r| seen.push((h, removed, **r)));
        assert!(seen.contains(&(handles[7], true, 7)), "{seen:?}");
        assert_eq!(seen.len(), 50);
        drop(held);
        seen.clear();
        t.visit(|h, removed, r| seen.push((h, removed, **r)));
        assert_eq!(seen.len(), 49);
        assert!(seen.iter().all(|(_, removed, _)| !removed));
        // The visit left no reference behind: every slot recycles.
        for (h, _, _) in seen {
            t.remove(h).unwrap();
        }
        assert_eq!(t.occupied(), 0);
    }

    #[test]
    fn visit_races_inserts_and_removes_without_harm() {
        let t = HandleTable::new(K);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..2_000u32 {
                    let hs: Vec<_> = (0..20)
                        .map(|i| t.insert(Arc::new(round * 100 + i)).unwrap())
                        .collect();
                    for h in hs {
                        t.remove(h).unwrap();
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Release);
            });
            let mut walks = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) || walks == 0 {
                t.visit(|h, _, r| {
                    // Never half-built: the value is the one inserted under
                    // this handle's slot, and its slot index matches.
                    assert_eq!(h.kind_id(), K.id());
                    assert!(**r % 100 < 20);
                });
                walks += 1;
            }
        });
        assert_eq!(t.occupied(), 0);
    }

    #[test]
    fn concurrent_lookups_and_removes_agree() {
        let t = Arc::new(HandleTable::new(K));
        let handles: Vec<_> = (0..256u32)
            .map(|i| t.insert(Arc::new(i)).unwrap())
            .collect();
        let removed = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for w in 0..2 {
                let t = &t;
                let handles = &handles;
                let removed = &removed;
                s.spawn(move || {
                    for (i, h) in handles.iter().enumerate() {
                        if let Ok(r) = t.get(*h) {
                            assert_eq!(*r, i as u32);
                        }
                        if i % 2 == w && t.remove(*h).is_ok() {
                            removed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(removed.into_inner(), 256);
        assert_eq!(t.occupied(), 0);
    }
}
