//! ibal: the InfiniBand Access Layer object model in Rust.
//!
//! This facade re-exports the layers users program against:
//! * [`al`]: AL instances, handles, the object lifecycle, errors;
//! * [`hca`]: verbs objects and providers (the embedded soft HCA);
//! * [`qp`]: queue pairs and their connection-id slot;
//! * [`cep`]: the IBTA connection manager (MAD codec, protocol, CEPs).
//!
//! Layering is one-way: `al` <- `hca` <- `qp` <- `cep` <- `ibal`.
//!
//! # A first program
//!
//! `use ibal::prelude::*;` brings the types and, as methods, every verb.
//! Every call takes the AL as `&Arc<AlInstance>` (`&al` for an [`Al`]):
//!
//! ```
//! use ibal::prelude::*;
//!
//! # fn main() -> ibal::Result<()> {
//! let fabric = Fabric::new();
//! fabric.add_hca(HcaConfig::new(0xa000, &[1]))?;
//! let provider = SoftProvider::new(fabric);
//! let al = Al::open()?;
//! let ca = al.open_ca(&provider, 0xa000)?;
//! let pd = ca.alloc_pd(&al)?;
//! let cq = ca.create_cq(&al, 64)?;
//! let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
//! assert_eq!(qp.query(&al)?.state, QpState::Reset);
//! let buf = RegisteredBuffer::new(4096);
//! let mr = pd.register(&al, &buf, Access::LOCAL_WRITE)?;
//! let (lkey, _rkey) = mr.keys(&al)?;
//! assert_ne!(lkey, 0);
//! qp.destroy(&al)?;
//! assert!(al.close()?.is_clean());
//! # Ok(())
//! # }
//! ```
//!
//! `examples/rc_pingpong.rs` connects two QPs through the CM with the same
//! calls.

pub use al;
pub use al::{
    Al, AlConfig, Error, ExecutorMode, Handle, HeldObject, Kind, LeakReport, RawHandle, Result,
    Stats,
};
pub use cep;
pub use hca;
pub use qp;

pub mod methods;
pub mod prelude;
