//! Benchmarks behind `ibal perf`. Each one measures a baseline in the same
//! run and reports ratios against it, because the machines are shared.

pub mod conn;
pub mod lookup;
pub mod verbs;
