//! The project's harnesses, beside the library and the `ibal` command:
//!
//! * [`stress`]: many threads doing random API calls against one
//!   provider, with CM fault injection, checking every answer and that
//!   nothing leaks (`ibal stress`, `docs/stress.md`);
//! * [`relay`]: a UDP relay between two RoCEv2 ports that drops,
//!   duplicates, reorders and delays datagrams (`ibal relay`, the fault
//!   tests' network);
//! * [`fuzzing`]: the checks behind the fuzz targets in `fuzz/`, which
//!   `cargo test` also runs over every committed corpus entry;
//! * [`devices`]: the devices the tools share (the embedded default
//!   fabric of two soft HCAs; an RDMA device by name).
//!
//! Nothing here is API for applications; it builds on the facade and the
//! layer crates like any other user of them.

pub mod devices;
pub mod fuzzing;
pub mod relay;
pub mod stress;
