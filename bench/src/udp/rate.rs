//! `perf send-rate --transport udp`: 64-byte RC SENDs streamed between
//! our two ports against 80-byte datagrams streamed between two sockets,
//! one per system call (the target's baseline) and batched 32 a call
//! (`sendmmsg`/`recvmmsg`: the ceiling, issue 31).

use ibal::prelude::*;
use ibal::roce::UdpOffload;

use super::ends::{offload_name, Target, MSG, SEND_DATAGRAM};
use super::figures::Figures;
use super::offload::{udp_stream_batched, BATCH};
use super::stream::{roce_stream, udp_stream};
use crate::{json_f64, BenchResult};

/// The target: RoCE SENDs against plain raw UDP datagrams (issue 31;
/// 0.5x before it).
pub const TARGET: f64 = 1.0;

/// Messages per second completed at the receiver.
#[derive(Debug, Clone)]
pub struct RateReport {
    /// Messages per contender per round.
    pub msgs: u64,
    /// Rounds (the best round of each contender is reported).
    pub rounds: usize,
    /// The RoCE ports' MTU in bytes (a 64-byte SEND is one packet at
    /// either).
    pub mtu: usize,
    /// The UDP offloads our ports used (`on`, `off`, `gso`, `gro`).
    pub offload: &'static str,
    /// RC SENDs completed at B (packets per second = messages per second).
    pub roce: Figures,
    /// Raw UDP datagrams, one `send_to` and one `recv_from` each.
    pub udp: Figures,
    /// Raw UDP datagrams, [`BATCH`] per `sendmmsg`, up to as many per
    /// `recvmmsg`.
    pub udp_batched: Figures,
    /// Plain raw UDP datagrams lost in the reported round (no flow control).
    pub udp_lost: u64,
    /// Batched raw UDP datagrams lost in the reported round.
    pub udp_batched_lost: u64,
    /// Datagrams per `recvmmsg` of the batched baseline in its reported
    /// round.
    pub udp_batched_per_receive: f64,
}

/// Process CPU nanoseconds per 64-byte message.
fn cpu_ns_per_msg(f: &Figures) -> f64 {
    f.cpu_s_per_gib * MSG as f64 / (1u64 << 30) as f64 * 1e9
}

impl RateReport {
    /// RoCE rate over plain raw UDP rate (the target's ratio).
    pub fn ratio(&self) -> f64 {
        self.roce.packets_per_sec / self.udp.packets_per_sec
    }
    /// RoCE rate over batched raw UDP rate.
    pub fn ratio_batched(&self) -> f64 {
        self.roce.packets_per_sec / self.udp_batched.packets_per_sec
    }
    /// A table.
    pub fn to_text(&self) -> String {
        let row = |what: &str, f: &Figures, lost: Option<u64>| {
            format!(
                "{what:<17} {:>12.0} {:>8.3} {:>10.2} {:>10.0} {}\n",
                f.packets_per_sec,
                f.gbps,
                f.cpu_s_per_gib,
                cpu_ns_per_msg(f),
                lost.map_or(String::new(), |l| format!("{l:>6}"))
            )
        };
        format!(
            "perf send-rate --transport udp: {MSG}-byte RC SENDs streamed between two RoCEv2 ports\n\
             on loopback (MTU {}, UDP offloads: {}), completed at the receiver, vs {SEND_DATAGRAM}-byte\n\
             raw UDP datagrams streamed between two sockets (blocking receive): \"plain\" one\n\
             send_to / recv_from each (the target's baseline), \"batched\" sendmmsg of {BATCH} and\n\
             recvmmsg (the ceiling); {} messages, best of {} rounds; CPU: process CPU clock\n\
             (both ends and the provider's threads)\n\n\
             {:<17} {:>12} {:>8} {:>10} {:>10} {:>6}\n{}{}{}\
             (batched: {:.1} datagrams per recvmmsg)\n\n\
             ratio to plain:   {:.2}x (target >= {TARGET}x)\n\
             ratio to batched: {:.2}x (the ceiling; no target)\n",
            self.mtu,
            self.offload,
            self.msgs,
            self.rounds,
            "",
            "msgs/s",
            "Gbit/s",
            "CPU s/GiB",
            "CPU ns/msg",
            "lost",
            row("RoCEv2 SEND", &self.roce, None),
            row("raw UDP plain", &self.udp, Some(self.udp_lost)),
            row("raw UDP batched", &self.udp_batched, Some(self.udp_batched_lost)),
            self.udp_batched_per_receive,
            self.ratio(),
            self.ratio_batched()
        )
    }
    /// One JSON object. The fields before issue 31 (`roce_msgs_per_sec`,
    /// `udp_msgs_per_sec`, `udp_lost`, `ratio`, `target_ratio`,
    /// `target_met`) keep their meaning against plain raw UDP.
    pub fn to_json(&self) -> String {
        let fig = |name: &str, f: &Figures| {
            format!(
                "\"{name}_msgs_per_sec\":{},\"{name}_gbps\":{},\"{name}_cpu_s_per_gib\":{},\
                 \"{name}_cpu_ns_per_msg\":{}",
                json_f64(f.packets_per_sec, 0),
                json_f64(f.gbps, 4),
                json_f64(f.cpu_s_per_gib, 4),
                json_f64(cpu_ns_per_msg(f), 1)
            )
        };
        format!(
            "{{\"benchmark\":\"send-rate\",\"transport\":\"udp\",\"msgs\":{},\"rounds\":{},\
             \"mtu\":{},\"udp_offload\":\"{}\",\"cpu_clock\":\"process\",{},{},{},\
             \"udp_lost\":{},\"udp_batched_lost\":{},\"batch\":{BATCH},\
             \"udp_batched_per_receive\":{},\"ratio\":{},\
             \"ratio_batched\":{},\"target_ratio\":{TARGET},\"target_met\":{}}}",
            self.msgs,
            self.rounds,
            self.mtu,
            self.offload,
            fig("roce", &self.roce),
            fig("udp", &self.udp),
            fig("udp_batched", &self.udp_batched),
            self.udp_lost,
            self.udp_batched_lost,
            json_f64(self.udp_batched_per_receive, 2),
            json_f64(self.ratio(), 4),
            json_f64(self.ratio_batched(), 4),
            self.ratio() >= TARGET
        )
    }
}

/// Runs send-rate: `msgs` per contender per round, our ports at `mtu`
/// with `offload` (`None`: the provider's default).
pub fn run_send_rate(
    msgs: u64,
    rounds: usize,
    mtu: Mtu,
    offload: Option<UdpOffload>,
) -> BenchResult<RateReport> {
    if msgs == 0 {
        return Err("--msgs must be at least 1".into());
    }
    let mut roce = Figures::NONE;
    let (mut udp, mut batched) = ((Figures::NONE, 0), (Figures::NONE, 0));
    let mut per_receive = f64::NAN;
    for _ in 0..rounds.max(1) {
        roce = roce.best(roce_stream(
            &Target::Loopback,
            msgs,
            MSG,
            mtu,
            false,
            offload,
        )?);
        let m = udp_stream(msgs, SEND_DATAGRAM)?;
        let f = m.figures(MSG);
        if f.gbps > udp.0.gbps || udp.0.gbps.is_nan() {
            udp = (f, m.lost(msgs));
        }
        let m = udp_stream_batched(msgs, SEND_DATAGRAM)?;
        let f = m.figures(MSG);
        if f.gbps > batched.0.gbps || batched.0.gbps.is_nan() {
            batched = (f, m.lost(msgs));
            per_receive = m.datagrams as f64 / m.receives as f64;
        }
    }
    Ok(RateReport {
        msgs,
        rounds: rounds.max(1),
        mtu: mtu.bytes(),
        offload: offload_name(offload.unwrap_or_else(UdpOffload::from_env)),
        roce,
        udp: udp.0,
        udp_batched: batched.0,
        udp_lost: udp.1,
        udp_batched_lost: batched.1,
        udp_batched_per_receive: per_receive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_against_plain_and_the_json_keeps_its_fields() {
        // 64-byte messages: 1 M/s RoCE, 0.8 M/s plain, 4 M/s batched.
        let f = |rate: f64, cpu: f64| Figures::of(64 * rate as u64, rate as u64, 1.0, cpu);
        let r = RateReport {
            msgs: 1000,
            rounds: 1,
            mtu: 1024,
            offload: "on",
            roce: f(1e6, 1.0),
            udp: f(8e5, 1.0),
            udp_batched: f(4e6, 1.0),
            udp_lost: 3,
            udp_batched_lost: 0,
            udp_batched_per_receive: 4.5,
        };
        assert!((r.ratio() - 1.25).abs() < 1e-12);
        assert!((r.ratio_batched() - 0.25).abs() < 1e-12);
        // 1 CPU s for a million messages: 1000 ns each.
        assert!((cpu_ns_per_msg(&r.roce) - 1000.0).abs() < 1e-6);
        let json = r.to_json();
        assert!(crate::balanced(&json), "{json}");
        for key in [
            "\"roce_msgs_per_sec\":1000000",
            "\"udp_msgs_per_sec\":800000",
            "\"udp_batched_msgs_per_sec\":4000000",
            "\"roce_cpu_ns_per_msg\":1000.0",
            "\"udp_lost\":3",
            "\"ratio\":1.2500",
            "\"ratio_batched\":0.2500",
            "\"target_ratio\":1",
            "\"target_met\":true",
            "\"mtu\":1024",
            "\"udp_batched_per_receive\":4.50",
        ] {
            assert!(json.contains(key), "{key} missing: {json}");
        }
    }
}
