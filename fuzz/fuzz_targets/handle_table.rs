//! Operation sequences on a small handle table, checked against a map model.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_testkit::fuzzing::handle_table(data));
