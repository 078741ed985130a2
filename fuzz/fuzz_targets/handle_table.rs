//! Operation sequences on a small handle table, checked against a map model.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_cli::fuzzing::handle_table(data));
