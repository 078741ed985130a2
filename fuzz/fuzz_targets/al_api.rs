//! Random create/destroy/connect/accept/reject/disconnect/close across two
//! soft HCAs with CM fault injection; at the end every counter is zero.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_testkit::fuzzing::al_api(data));
