//! `perf send-lat|send-rate|write-bw --device NAME`: the same runs on
//! two contexts of an RDMA device, with no baseline in the same run.

use ibal::prelude::*;

use super::ends::{Target, MSG};
use super::lat::roce_pingpong;
use super::stream::roce_stream;
use crate::{json_f64, BenchResult};

/// One benchmark on an RDMA device (`--device NAME`): the same runs as on
/// loopback, with no baseline in the same run (compare with perftest on
/// the same device: `docs/benchmarks.md`, "Issue 16: on a NIC, against perftest").
#[derive(Debug, Clone)]
pub struct DeviceReport {
    /// `send-lat`, `send-rate` or `write-bw`.
    pub bench: &'static str,
    /// The device.
    pub device: String,
    /// Rounds (best of) or round trips.
    pub rounds: usize,
    /// `(what, value, unit)`.
    pub results: Vec<(String, f64, &'static str)>,
}

impl DeviceReport {
    /// Lines for people.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf {} on {} (two contexts of the device, looping back through port 1; \
             compare with perftest: docs/benchmarks.md)\n",
            self.bench, self.device
        );
        for (what, v, unit) in &self.results {
            out.push_str(&format!("  {what:<34} {v:>12.2} {unit}\n"));
        }
        out
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        let r: Vec<String> = self
            .results
            .iter()
            .map(|(w, v, u)| {
                format!(
                    "{{\"what\":\"{w}\",\"value\":{},\"unit\":\"{u}\"}}",
                    json_f64(*v, 3)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"{}\",\"device\":\"{}\",\"rounds\":{},\"results\":[{}]}}",
            self.bench,
            self.device,
            self.rounds,
            r.join(",")
        )
    }
}

/// send-lat on `device`: 64-byte RC SEND ping-pong, median and mean.
pub fn run_device_send_lat(device: &str, iters: u32) -> BenchResult<DeviceReport> {
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let (median, mean) = roce_pingpong(&Target::Device(device.into()), iters, None)?;
    Ok(DeviceReport {
        bench: "send-lat",
        device: device.into(),
        rounds: 1,
        results: vec![
            (format!("{MSG}-byte SEND round trip, median"), median, "us"),
            (format!("{MSG}-byte SEND round trip, mean"), mean, "us"),
            (
                format!("{MSG}-byte SEND one way (median / 2)"),
                median / 2.0,
                "us",
            ),
        ],
    })
}

/// send-rate on `device`: 64-byte RC SENDs streamed, messages per second.
pub fn run_device_send_rate(device: &str, msgs: u64, rounds: usize) -> BenchResult<DeviceReport> {
    if msgs == 0 {
        return Err("--msgs must be at least 1".into());
    }
    let target = Target::Device(device.into());
    let mut best = 0f64;
    for _ in 0..rounds.max(1) {
        best =
            best.max(roce_stream(&target, msgs, MSG, Mtu::Mtu4096, false, None)?.packets_per_sec);
    }
    Ok(DeviceReport {
        bench: "send-rate",
        device: device.into(),
        rounds: rounds.max(1),
        results: vec![
            (format!("{MSG}-byte SENDs"), best / 1e6, "M msg/s"),
            (
                format!("{MSG}-byte SEND payload"),
                best * MSG as f64 * 8.0 / 1e9,
                "Gbit/s",
            ),
        ],
    })
}

/// write-bw on `device`: RC WRITEs of each size, `bytes_per_round` per
/// round (at least 4 WRITEs), at the port's active MTU.
pub fn run_device_write_bw(
    device: &str,
    sizes: &[usize],
    bytes_per_round: u64,
    rounds: usize,
) -> BenchResult<DeviceReport> {
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
        return Err(format!("size {bad}: between 1 byte and 64 MiB"));
    }
    let target = Target::Device(device.into());
    let mut results = Vec::new();
    for &size in sizes {
        let iters = (bytes_per_round / size as u64).max(4);
        let mut best = 0f64;
        for _ in 0..rounds.max(1) {
            best = best.max(roce_stream(&target, iters, size, Mtu::Mtu4096, true, None)?.gbps);
        }
        results.push((format!("WRITE {size} B x {iters}"), best, "Gbit/s"));
    }
    Ok(DeviceReport {
        bench: "write-bw",
        device: device.into(),
        rounds: rounds.max(1),
        results,
    })
}
