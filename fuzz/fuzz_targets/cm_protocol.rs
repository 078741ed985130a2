//! Received MADs, user calls and clock steps on two sans-IO CM endpoints.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_testkit::fuzzing::cm_protocol(data));
