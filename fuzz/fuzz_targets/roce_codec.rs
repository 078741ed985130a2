//! bytes -> RoCEv2 packet / IP frame -> bytes -> the same packet or frame;
//! never a panic (`roce::fuzzing::roce_codec`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| roce::fuzzing::roce_codec(data));
