//! The `ibal` command-line tool's code, kept out of the library a verbs
//! consumer imports (`ibal`): the ping-pong main job, device listing,
//! packet capture, qp-exchange and rping. The benchmarks `ibal perf` runs
//! are in `ibal-bench`; the stress run, the fault relay and the checks
//! behind the fuzz targets in `ibal-testkit`.
//!
//! Nothing here is API for applications; it builds on the facade and the
//! layer crates like any other user of them.

pub mod capture;
pub mod devinfo;
pub mod oob;
pub mod pingpong;
pub mod pingpong_ip;
pub mod qp_exchange;
pub mod rping;
pub mod status;
