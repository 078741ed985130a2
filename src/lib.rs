//! ibal: the InfiniBand Access Layer object model in Rust.
//!
//! This facade re-exports the layers users program against:
//! * [`al`]: AL instances, handles, the object lifecycle, errors;
//! * [`hca`]: verbs objects and providers (the embedded soft HCA);
//! * [`qp`]: queue pairs and their connection-id slot;
//! * [`cep`]: the IBTA connection manager (MAD codec, protocol, CEPs).
//!
//! Layering is one-way: `al` <- `hca` <- `qp` <- `cep` <- `ibal`.

pub use al;
pub use al::{
    Al, AlConfig, Error, ExecutorMode, Handle, HeldObject, Kind, LeakReport, RawHandle, Result,
    Stats,
};
pub use cep;
pub use hca;
pub use qp;
