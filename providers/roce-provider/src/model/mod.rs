//! The provider's internals, opened to the loom models of `loom-tests/`
//! (built only with `--cfg ibal_loom`; never part of the library a
//! consumer links). Each submodule gives one model file what it drives:
//! the production types themselves, and the narrow seams (a fake socket
//! queue, a clock the model moves) that replace the I/O under them.

/// The device clock under the model checker: it stands still until a
/// model moves it.
pub mod clock {
    /// Moves every device's clock `ns` nanoseconds forward.
    pub fn advance(ns: u64) {
        crate::clock::advance(ns);
    }
    /// The clock now, nanoseconds (what `Dev::now` counts from).
    pub fn now_ns() -> u64 {
        crate::clock::monotonic_ns()
    }
}

/// The CQ, the QP map and its memo, and the held ACKs
/// (`loom-tests/tests/roce_components.rs`).
pub mod components;
pub mod device;
pub mod timers;
