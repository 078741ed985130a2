//! bytes -> decode -> encode -> decode must agree on every defined bit.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_testkit::fuzzing::mad_codec(data));
