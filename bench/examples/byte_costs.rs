//! What one byte of an RDMA WRITE costs the CPU on this machine, piece by
//! piece: the copies and the CRC-32 the RoCEv2 path does in user space,
//! over 4 KiB packets streaming through a 64 MiB region (as a WRITE stream
//! walks its MR). With the kernel's two copies (measured by the raw UDP
//! baselines of `ibal perf write-bw`) they give the floor of the
//! provider's CPU per GiB (docs/benchmarks.md, issue 31).
//! `cargo run --release -p ibal-bench --example byte_costs`

use std::hint::black_box;
use std::time::Instant;

fn main() {
    const REGION: usize = 64 << 20;
    const PACKET: usize = 4096;
    let src = vec![7u8; REGION];
    let mut dst = vec![0u8; REGION];
    let mut pkt = vec![0u8; PACKET];
    let per_byte = |t: Instant| t.elapsed().as_secs_f64() / REGION as f64 * 1e9;
    for round in 0..3 {
        let t = Instant::now();
        for off in (0..REGION).step_by(PACKET) {
            pkt.copy_from_slice(&src[off..off + PACKET]);
            black_box(&pkt);
        }
        let gather = per_byte(t);
        let t = Instant::now();
        for off in (0..REGION).step_by(PACKET) {
            dst[off..off + PACKET].copy_from_slice(black_box(&pkt));
        }
        black_box(&dst);
        let scatter = per_byte(t);
        let t = Instant::now();
        let mut c = 0;
        for off in (0..REGION).step_by(PACKET) {
            c ^= ibal::roce::wire::icrc::crc32(&src[off..off + PACKET]);
        }
        black_box(c);
        let crc_region = per_byte(t);
        let t = Instant::now();
        for _ in (0..REGION).step_by(PACKET) {
            c ^= ibal::roce::wire::icrc::crc32(black_box(&pkt));
        }
        black_box(c);
        let crc_cached = per_byte(t);
        println!(
            "round {round}: ns per byte: copy MR -> packet {gather:.3}, packet -> MR {scatter:.3}, \
             CRC-32 from the MR {crc_region:.3}, CRC-32 of a cached packet {crc_cached:.3}"
        );
    }
}
