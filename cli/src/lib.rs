//! The `ibal` command-line tool's code and the project's harnesses, kept out
//! of the library a verbs consumer imports (`ibal`): the ping-pong main job,
//! device listing, packet capture, benchmarks (`perf`), the stress run and
//! the checks behind the fuzz targets (`fuzzing`, which the fuzz crate and
//! `cargo test`'s corpus replays call directly).
//!
//! Nothing here is API for applications; it builds on the facade and the
//! layer crates like any other user of them.

pub mod capture;
pub mod devinfo;
pub mod fuzzing;
pub mod oob;
pub mod perf;
pub mod pingpong;
pub mod pingpong_ip;
#[cfg(feature = "rdma")]
pub mod pingpong_rdma;
pub mod qp_exchange;
pub mod relay;
pub mod rping;
pub mod stress;
