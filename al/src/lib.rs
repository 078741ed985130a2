//! Access-layer core of ibal: the pieces every object of the InfiniBand
//! access layer stands on.
//!
//! * [`sync`]: the one synchronisation shim (std/parking_lot/arc-swap, or
//!   loom under `--cfg ibal_loom`).
//! * [`handle`] and [`table`]: typed generational handles and the slab-backed
//!   table that owns every object and resolves handles without a global lock.
//! * [`object`]: the lifecycle all objects share (parent/child links,
//!   two-phase non-blocking destroy, destroy callbacks exactly once).
//! * [`instance`]: the AL instance (open, close with a bounded wait that
//!   reports what is still held, live-object counters).
//! * [`snapshot`] and [`attrs`]: a live view of an instance's objects
//!   ([`AlInstance::snapshot`]), with each kind's details.
//! * [`executor`]: the per-instance callback executor.
//! * [`error`]: the error type, with IBAL's status meanings.
//!
//! The ownership rules and lock order are in `docs/ownership.md`.

// Every public item is documented. Checked in the normal build: under
// `--cfg ibal_loom`, `al::sync` swaps in the model checker's types.
#![cfg_attr(not(ibal_loom), deny(missing_docs))]
pub mod attrs;
pub mod children;
pub mod error;
pub mod executor;
pub mod fast_hash;
pub mod footprint;
pub mod handle;
pub mod instance;
pub mod object;
pub mod report;
pub mod snapshot;
pub mod sync;
pub mod table;

pub use attrs::{Attrs, Value};
pub use children::DestroyCallback;
pub use error::{Error, Result};
pub use executor::{in_callback, ExecutorMode};
pub use handle::{Handle, Kind, RawHandle};
pub use instance::{Al, AlConfig, AlInstance, DEFAULT_CLOSE_TIMEOUT};
pub use object::{
    create, destroy, destroy_raw, destroy_sync, destroy_unused, post_callback, resolve, Core, Obj,
    Object,
};
pub use report::{HeldObject, LeakReport, Stats};
pub use snapshot::{ObjectInfo, ObjectState, Snapshot};
pub use table::{HandleTable, Ref, Reservation, TableLimits};
