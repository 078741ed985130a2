//! The checks behind the fuzz targets in `fuzz/`.
//!
//! They live here, not in `fuzz/`, so that `cargo test` on stable replays
//! every committed corpus entry and crash artifact through the very same code
//! (`tests/fuzz_corpus.rs`), without libFuzzer. Each function panics when an
//! invariant breaks: that is how a fuzzer learns of a bug.
//!
//! One file per target family: `codec` (`mad_codec`, `ib_capture`),
//! `handle_table`, `cm_protocol`, `al_api`.

mod al_api;
mod cm_protocol;
mod codec;
mod handle_table;

pub use al_api::{al_api, AL_API_MAX_OPS};
pub use cm_protocol::cm_protocol;
pub use codec::{ib_capture, mad_codec};
pub use handle_table::handle_table;
