//! `perf write-bw --transport udp`: RC WRITEs between our two ports at
//! MTU 1024 and 4096 against the same packets as raw UDP datagrams
//! streamed one way: plain (one system call per datagram each side), with
//! GSO+GRO (the ceiling, issue 31), and plain doing RoCE's copies and
//! CRCs.

use ibal::prelude::*;
use ibal::roce::UdpOffload;

use super::ends::{offload_name, write_datagram, Target};
use super::figures::Figures;
use super::offload::{segments_per_send, udp_stream_gso};
use super::stream::{roce_stream, udp_stream, udp_stream_working};
use crate::{json_f64, BenchResult};

/// The target against the plain baseline (at MTU 4096, before issue 31).
pub const TARGET_PLAIN: f64 = 0.7;
/// The target against the GSO+GRO baseline (issue 31, both MTUs).
pub const TARGET_GSO: f64 = 0.6;

/// What `perf write-bw --transport udp` runs.
#[derive(Debug, Clone)]
pub struct UdpBwConfig {
    /// WRITE sizes in bytes.
    pub sizes: Vec<usize>,
    /// Bytes of WRITEs per round per size (at least 4 WRITEs).
    pub bytes_per_round: u64,
    /// Rounds (the best of each contender is reported).
    pub rounds: usize,
    /// The MTUs, one table each (1024 and 4096).
    pub mtus: Vec<Mtu>,
    /// The UDP offloads our ports use (`None`: the provider's default,
    /// `IBAL_ROCE_UDP_OFFLOAD`).
    pub offload: Option<UdpOffload>,
}

/// One message size at one MTU.
#[derive(Debug, Clone)]
pub struct BwPoint {
    /// The path MTU in bytes (the RoCE ports' and the datagrams').
    pub mtu: usize,
    /// WRITE size in bytes.
    pub size: usize,
    /// WRITEs per round.
    pub iters: u64,
    /// RoCE WRITE payload (data packets from A to B).
    pub roce: Figures,
    /// Raw UDP, one `send_to` and one `recv_from` per datagram.
    pub udp: Figures,
    /// Raw UDP with GSO super-datagrams sent and GRO buffers received.
    pub udp_gso: Figures,
    /// Raw UDP doing the user-space work RoCE cannot skip: the sender
    /// copies each packet's payload from a source buffer into the
    /// datagram and computes its CRC-32, the receiver computes the CRC-32
    /// and copies the payload into a destination buffer. Not a target's
    /// baseline.
    pub udp_work: Figures,
    /// Datagrams the plain baseline lost in its reported round.
    pub udp_lost: u64,
    /// Datagrams the GSO+GRO baseline lost in its reported round.
    pub udp_gso_lost: u64,
    /// Datagrams per receive call of the GSO+GRO baseline in its
    /// reported round (how much the kernel handed over at once).
    pub udp_gso_segments_per_receive: f64,
}

impl BwPoint {
    /// RoCE over plain raw UDP, payload Gbit/s.
    pub fn ratio(&self) -> f64 {
        self.roce.gbps / self.udp.gbps
    }
    /// RoCE over the GSO+GRO raw UDP ceiling, payload Gbit/s.
    pub fn ratio_gso(&self) -> f64 {
        self.roce.gbps / self.udp_gso.gbps
    }
}

/// RC WRITE bandwidth against raw UDP one-way throughput.
#[derive(Debug, Clone)]
pub struct BwReport {
    /// Rounds (best of each contender).
    pub rounds: usize,
    /// The UDP offloads our ports used (`on`, `off`, `gso`, `gro`).
    pub offload: &'static str,
    /// One per MTU and size.
    pub points: Vec<BwPoint>,
}

fn min_of(points: impl Iterator<Item = f64>) -> f64 {
    points.fold(f64::INFINITY, f64::min)
}

impl BwReport {
    /// The lowest ratio against plain raw UDP: over the MTU 4096 points
    /// (where that target was set) if any were measured, else over all.
    pub fn min_ratio(&self) -> f64 {
        let at_4096 = self.points.iter().any(|p| p.mtu == 4096);
        min_of(
            self.points
                .iter()
                .filter(|p| !at_4096 || p.mtu == 4096)
                .map(BwPoint::ratio),
        )
    }
    /// The lowest ratio against the GSO+GRO ceiling, over all points.
    pub fn min_ratio_gso(&self) -> f64 {
        min_of(self.points.iter().map(BwPoint::ratio_gso))
    }

    /// One table per MTU.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf write-bw --transport udp: RC RDMA WRITE between two RoCEv2 ports on loopback\n\
             (UDP offloads: {}) vs raw UDP streaming the same packets one way, blocking receive:\n\
             \"plain\" one send_to / recv_from per datagram; \"GSO+GRO\" UDP_SEGMENT super-datagrams\n\
             received coalesced under UDP_GRO; \"plain+work\" plain that also copies and CRCs each\n\
             packet on both sides, as RoCE must. Best of {} rounds by Gbit/s; payload Gbit/s,\n\
             packets/s and CPU s/GiB (process CPU clock: both ends and the provider's threads)\n",
            self.offload, self.rounds
        );
        let mut mtus: Vec<usize> = self.points.iter().map(|p| p.mtu).collect();
        mtus.dedup();
        for mtu in mtus {
            let datagram = write_datagram(mtu);
            out.push_str(&format!(
                "\nMTU {mtu}: {datagram}-byte datagrams, {} to a GSO send\n\
                 {:>9} {:>6}  {:<15} {:>8} {:>8} {:>9} {:>7}\n",
                segments_per_send(datagram),
                "size",
                "iters",
                "contender",
                "Gbit/s",
                "Mpkt/s",
                "CPU s/GiB",
                "RoCE/it"
            ));
            for p in self.points.iter().filter(|p| p.mtu == mtu) {
                let row = |what: &str, f: &Figures, ratio: Option<(f64, Option<f64>)>| {
                    let ratio = match ratio {
                        None => String::new(),
                        Some((r, None)) => format!("{r:>6.2}x"),
                        Some((r, Some(t))) => format!("{r:>6.2}x (target >= {t}x)"),
                    };
                    format!(
                        "  {what:<15} {:>8.2} {:>8.3} {:>9.3} {ratio}\n",
                        f.gbps,
                        f.packets_per_sec / 1e6,
                        f.cpu_s_per_gib
                    )
                };
                out.push_str(&format!("{:>9} {:>6}", p.size, p.iters));
                out.push_str(&row("RoCEv2 WRITE", &p.roce, None));
                let plain_target = (mtu == 4096).then_some(TARGET_PLAIN);
                out.push_str(&format!("{:>16}", ""));
                out.push_str(&row("UDP plain", &p.udp, Some((p.ratio(), plain_target))));
                out.push_str(&format!("{:>16}", ""));
                out.push_str(&row(
                    "UDP GSO+GRO",
                    &p.udp_gso,
                    Some((p.ratio_gso(), Some(TARGET_GSO))),
                ));
                out.push_str(&format!("{:>16}", ""));
                out.push_str(&row(
                    "UDP plain+work",
                    &p.udp_work,
                    Some((p.roce.gbps / p.udp_work.gbps, None)),
                ));
                out.push_str(&format!(
                    "{:>18}GSO+GRO: {:.1} datagrams per receive\n",
                    "", p.udp_gso_segments_per_receive
                ));
                if p.udp_lost + p.udp_gso_lost > 0 {
                    out.push_str(&format!(
                        "{:>18}datagrams lost: plain {}, GSO+GRO {}\n",
                        "", p.udp_lost, p.udp_gso_lost
                    ));
                }
            }
        }
        out.push_str(&format!(
            "\nlowest ratio to plain UDP{}: {:.2}x (target >= {TARGET_PLAIN}x)\n\
             lowest ratio to GSO+GRO UDP: {:.2}x (target >= {TARGET_GSO}x)\n",
            if self.points.iter().any(|p| p.mtu == 4096) {
                " (MTU 4096)"
            } else {
                ""
            },
            self.min_ratio(),
            self.min_ratio_gso()
        ));
        out
    }

    /// One JSON object. The fields before issue 31 (`results[].roce_gbps`,
    /// `udp_gbps`, `ratio`, `udp_work_gbps`, `min_ratio`, `target_ratio`,
    /// `target_met`) keep their meaning against plain raw UDP.
    pub fn to_json(&self) -> String {
        let points: Vec<String> = self
            .points
            .iter()
            .map(|p| {
                let fig = |name: &str, f: &Figures| {
                    format!(
                        "\"{name}_gbps\":{},\"{name}_pps\":{},\"{name}_cpu_s_per_gib\":{}",
                        json_f64(f.gbps, 3),
                        json_f64(f.packets_per_sec, 0),
                        json_f64(f.cpu_s_per_gib, 4)
                    )
                };
                format!(
                    "{{\"mtu\":{},\"size\":{},\"iters\":{},{},{},\"ratio\":{},{},\"ratio_gso\":{},\
                     {},\"udp_lost\":{},\"udp_gso_lost\":{},\"gso_segments_per_send\":{},\
                     \"udp_gso_segments_per_receive\":{}}}",
                    p.mtu,
                    p.size,
                    p.iters,
                    fig("roce", &p.roce),
                    fig("udp", &p.udp),
                    json_f64(p.ratio(), 4),
                    fig("udp_gso", &p.udp_gso),
                    json_f64(p.ratio_gso(), 4),
                    fig("udp_work", &p.udp_work),
                    p.udp_lost,
                    p.udp_gso_lost,
                    segments_per_send(write_datagram(p.mtu)),
                    json_f64(p.udp_gso_segments_per_receive, 2)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"write-bw\",\"transport\":\"udp\",\"rounds\":{},\
             \"udp_offload\":\"{}\",\"cpu_clock\":\"process\",\"results\":[{}],\
             \"min_ratio\":{},\"target_ratio\":{TARGET_PLAIN},\"target_met\":{},\
             \"min_ratio_gso\":{},\"target_ratio_gso\":{TARGET_GSO},\"target_met_gso\":{}}}",
            self.rounds,
            self.offload,
            points.join(","),
            json_f64(self.min_ratio(), 4),
            self.min_ratio() >= TARGET_PLAIN,
            json_f64(self.min_ratio_gso(), 4),
            self.min_ratio_gso() >= TARGET_GSO
        )
    }
}

/// Keeps the best round's figures and the datagrams that round lost;
/// whether `f` is the new best.
fn keep(best: &mut (Figures, u64), f: Figures, lost: u64) -> bool {
    let better = f.gbps > best.0.gbps || best.0.gbps.is_nan();
    if better {
        *best = (f, lost);
    }
    better
}

/// Runs write-bw for each MTU and size, the contenders interleaved
/// round by round.
pub fn run_write_bw(cfg: &UdpBwConfig) -> BenchResult<BwReport> {
    if let Some(bad) = cfg.sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
        return Err(format!("size {bad}: between 1 byte and 64 MiB"));
    }
    if cfg.mtus.is_empty() {
        return Err("at least one MTU".into());
    }
    let rounds = cfg.rounds.max(1);
    let mut points = Vec::new();
    for &mtu in &cfg.mtus {
        let mtu_bytes = mtu.bytes();
        let datagram = write_datagram(mtu_bytes);
        for &size in &cfg.sizes {
            let iters = (cfg.bytes_per_round / size as u64).max(4);
            let packets = iters * (size as u64).div_ceil(mtu_bytes as u64);
            let mut roce = Figures::NONE;
            let (mut udp, mut work) = ((Figures::NONE, 0), (Figures::NONE, 0));
            let (mut gso, mut per_receive) = ((Figures::NONE, 0), f64::NAN);
            for _ in 0..rounds {
                roce = roce.best(roce_stream(
                    &Target::Loopback,
                    iters,
                    size,
                    mtu,
                    true,
                    cfg.offload,
                )?);
                let m = udp_stream(packets, datagram)?;
                keep(&mut udp, m.figures(mtu_bytes), m.lost(packets));
                let m = udp_stream_gso(packets, datagram)?;
                if keep(&mut gso, m.figures(mtu_bytes), m.lost(packets)) {
                    per_receive = m.datagrams as f64 / m.receives as f64;
                }
                let m = udp_stream_working(packets, size, mtu_bytes)?;
                keep(&mut work, m.figures(mtu_bytes), m.lost(packets));
            }
            points.push(BwPoint {
                mtu: mtu_bytes,
                size,
                iters,
                roce,
                udp: udp.0,
                udp_gso: gso.0,
                udp_work: work.0,
                udp_lost: udp.1,
                udp_gso_lost: gso.1,
                udp_gso_segments_per_receive: per_receive,
            });
        }
    }
    Ok(BwReport {
        rounds,
        offload: offload_name(cfg.offload.unwrap_or_else(UdpOffload::from_env)),
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(gbps: f64) -> Figures {
        Figures {
            gbps,
            packets_per_sec: 1.0,
            cpu_s_per_gib: 1.0,
        }
    }

    fn point(mtu: usize, roce: f64, udp: f64, gso: f64) -> BwPoint {
        BwPoint {
            mtu,
            size: 65536,
            iters: 4,
            roce: fig(roce),
            udp: fig(udp),
            udp_gso: fig(gso),
            udp_work: fig(udp),
            udp_lost: 0,
            udp_gso_lost: 0,
            udp_gso_segments_per_receive: 15.0,
        }
    }

    #[test]
    fn ratios_and_targets_follow_their_baselines() {
        let r = BwReport {
            rounds: 1,
            offload: "on",
            points: vec![
                // MTU 1024: plain ratio 0.5 (not the plain target's MTU).
                point(1024, 2.0, 4.0, 40.0),
                point(4096, 8.0, 8.0, 10.0),
                point(4096, 9.0, 10.0, 36.0),
            ],
        };
        assert!((r.min_ratio() - 0.9).abs() < 1e-12);
        assert!((r.min_ratio_gso() - 0.05).abs() < 1e-12);
        let json = r.to_json();
        assert!(crate::balanced(&json), "{json}");
        for key in [
            "\"min_ratio\":0.9000",
            "\"target_met\":true",
            "\"min_ratio_gso\":0.0500",
            "\"target_met_gso\":false",
            "\"target_ratio_gso\":0.6",
            "\"mtu\":1024",
            "\"udp_gso_gbps\":40.000",
            "\"ratio_gso\":0.2500",
            "\"roce_pps\":1",
            "\"udp_cpu_s_per_gib\":1.0000",
            "\"gso_segments_per_send\":62",
            "\"udp_offload\":\"on\"",
        ] {
            assert!(json.contains(key), "{key} missing: {json}");
        }
        let text = r.to_text();
        assert!(text.contains("MTU 1024: 1040-byte datagrams, 62 to a GSO send"));
        assert!(text.contains("MTU 4096: 4112-byte datagrams, 15 to a GSO send"));
    }

    #[test]
    fn without_mtu_4096_the_plain_ratio_is_over_all_points() {
        let r = BwReport {
            rounds: 1,
            offload: "off",
            points: vec![point(1024, 2.0, 4.0, 40.0)],
        };
        assert!((r.min_ratio() - 0.5).abs() < 1e-12);
        assert!(r.to_json().contains("\"target_met\":false"));
    }

    #[test]
    fn the_reported_round_carries_its_own_losses() {
        let mut best = (Figures::NONE, 0);
        assert!(keep(&mut best, fig(5.0), 7));
        assert!(!keep(&mut best, fig(4.0), 0));
        assert_eq!(best, (fig(5.0), 7));
        assert!(keep(&mut best, fig(6.0), 1));
        assert_eq!(best, (fig(6.0), 1));
    }
}
