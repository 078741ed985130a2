//! bytes -> ERF records and InfiniBand packets -> bytes -> the same packets.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ibal_testkit::fuzzing::ib_capture(data));
