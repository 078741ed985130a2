//! `perf write-bw --transport udp`: RC WRITEs between our two ports at
//! MTU 4096 against 4112-byte datagrams streamed one way.

use ibal::prelude::*;

use super::ends::{Target, WRITE_DATAGRAM};
use super::stream::{roce_stream, udp_stream, udp_stream_working};
use crate::{json_f64, BenchResult};

/// One message size.
#[derive(Debug, Clone)]
pub struct BwPoint {
    /// WRITE size in bytes.
    pub size: usize,
    /// WRITEs per round.
    pub iters: u64,
    /// RoCE WRITE payload, Gbit/s.
    pub roce_gbps: f64,
    /// Raw UDP payload received, Gbit/s.
    pub udp_gbps: f64,
    /// Raw UDP doing the user-space work RoCE cannot skip: the sender
    /// copies each packet's 4 KiB from a source buffer into the datagram
    /// and computes its CRC-32, the receiver computes the CRC-32 and
    /// copies the payload into a destination buffer; Gbit/s. Not the
    /// target's baseline.
    pub udp_work_gbps: f64,
}

/// RC WRITE bandwidth against raw UDP one-way throughput.
#[derive(Debug, Clone)]
pub struct BwReport {
    /// Rounds (best of each contender).
    pub rounds: usize,
    /// One per size.
    pub points: Vec<BwPoint>,
}

impl BwReport {
    /// The lowest ratio of the sizes.
    pub fn min_ratio(&self) -> f64 {
        self.points
            .iter()
            .map(|p| p.roce_gbps / p.udp_gbps)
            .fold(f64::INFINITY, f64::min)
    }
    /// A table.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf write-bw --transport udp: RC RDMA WRITE at MTU 4096 between two RoCEv2 ports on\n\
             loopback vs {WRITE_DATAGRAM}-byte raw UDP datagrams streamed one way (blocking receive);\n\
             payload Gbit/s, best of {} rounds; \"UDP+work\": raw UDP that also copies and CRCs\n\
             each packet on both sides, as RoCE must\n\n{:>10} {:>8} {:>12} {:>12} {:>8} {:>12} {:>8}\n",
            self.rounds, "size", "iters", "RoCE Gb/s", "UDP Gb/s", "ratio", "UDP+work", "ratio"
        );
        for p in &self.points {
            out.push_str(&format!(
                "{:>10} {:>8} {:>12.2} {:>12.2} {:>7.2}x {:>12.2} {:>7.2}x\n",
                p.size,
                p.iters,
                p.roce_gbps,
                p.udp_gbps,
                p.roce_gbps / p.udp_gbps,
                p.udp_work_gbps,
                p.roce_gbps / p.udp_work_gbps
            ));
        }
        out.push_str(&format!(
            "\nlowest ratio: {:.2}x (target >= 0.7x)\n",
            self.min_ratio()
        ));
        out
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        let points: Vec<String> = self
            .points
            .iter()
            .map(|p| {
                format!(
                    "{{\"size\":{},\"iters\":{},\"roce_gbps\":{},\"udp_gbps\":{},\"ratio\":{},\
                     \"udp_work_gbps\":{}}}",
                    p.size,
                    p.iters,
                    json_f64(p.roce_gbps, 3),
                    json_f64(p.udp_gbps, 3),
                    json_f64(p.roce_gbps / p.udp_gbps, 4),
                    json_f64(p.udp_work_gbps, 3)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"write-bw\",\"transport\":\"udp\",\"rounds\":{},\"results\":[{}],\
             \"min_ratio\":{},\"target_ratio\":0.7,\"target_met\":{}}}",
            self.rounds,
            points.join(","),
            json_f64(self.min_ratio(), 4),
            self.min_ratio() >= 0.7
        )
    }
}

/// Runs write-bw for each size: `bytes_per_round` of WRITEs (at least 4).
pub fn run_write_bw(sizes: &[usize], bytes_per_round: u64, rounds: usize) -> BenchResult<BwReport> {
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
        return Err(format!("size {bad}: between 1 byte and 64 MiB"));
    }
    let mut points = Vec::new();
    for &size in sizes {
        let iters = (bytes_per_round / size as u64).max(4);
        let packets = iters * (size as u64).div_ceil(4096);
        let (mut roce, mut udp, mut work) = (0f64, 0f64, 0f64);
        for _ in 0..rounds.max(1) {
            roce = roce
                .max(roce_stream(&Target::Loopback, iters, size, Mtu::Mtu4096, true)? * 8.0 / 1e9);
            let (rate, _) = udp_stream(packets, WRITE_DATAGRAM)?;
            udp = udp.max(rate * 4096.0 * 8.0 / 1e9);
            let (rate, _) = udp_stream_working(packets, size)?;
            work = work.max(rate * 4096.0 * 8.0 / 1e9);
        }
        points.push(BwPoint {
            size,
            iters,
            roce_gbps: roce,
            udp_gbps: udp,
            udp_work_gbps: work,
        });
    }
    Ok(BwReport {
        rounds: rounds.max(1),
        points,
    })
}
