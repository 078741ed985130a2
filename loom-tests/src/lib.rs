//! loom models live in tests/; see run.sh
