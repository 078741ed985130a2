//! bytes -> rdma_cm private-data header -> bytes agree on every defined bit;
//! headers built from the bytes round-trip; never a panic
//! (`cep::wire::ip_cm::fuzz_check`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cep::wire::ip_cm::fuzz_check(data));
