//! Any sequence of work requests, wire faults, forged packets and clock
//! moves on a pair of RoCEv2 transports: no panic, every send completes
//! once and in order, bounded bursts, the bytes right
//! (`roce_transport::fuzzing::roce_transport`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    roce_transport::fuzzing::roce_transport(data);
});
