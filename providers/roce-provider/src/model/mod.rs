//! The provider's internals, opened to the loom models of `loom-tests/`
//! (built only with `--cfg ibal_loom`; never part of the library a
//! consumer links). Each submodule gives one model file what it drives:
//! the production types themselves, and the narrow seams (a fake socket
//! queue, a clock the model moves) that replace the I/O under them.
