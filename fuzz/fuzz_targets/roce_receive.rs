//! Arbitrary datagrams from chosen sources through the RoCEv2 receive
//! stage against QPs the input describes: no panic, nothing accepted that
//! a check should refuse, nothing refused that its QP takes
//! (`roce_transport::fuzzing::receive::roce_receive`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    roce_transport::fuzzing::receive::roce_receive(data);
});
