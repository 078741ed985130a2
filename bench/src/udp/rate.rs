//! `perf send-rate --transport udp`: 64-byte RC SENDs streamed between
//! our two ports against 80-byte datagrams streamed between two sockets.

use ibal::prelude::*;

use super::ends::{Target, MSG, SEND_DATAGRAM};
use super::stream::{roce_stream, udp_stream};
use crate::{json_f64, BenchResult};

/// Messages per second completed at the receiver.
#[derive(Debug, Clone)]
pub struct RateReport {
    /// Messages per contender per round.
    pub msgs: u64,
    /// Rounds (the best round of each contender is reported).
    pub rounds: usize,
    /// RC SENDs completed at B per second.
    pub roce_msgs_per_sec: f64,
    /// Raw UDP datagrams received per second.
    pub udp_msgs_per_sec: f64,
    /// Raw UDP datagrams lost in the best round (no flow control).
    pub udp_lost: u64,
}

impl RateReport {
    /// RoCE rate over raw UDP rate.
    pub fn ratio(&self) -> f64 {
        self.roce_msgs_per_sec / self.udp_msgs_per_sec
    }
    /// A table.
    pub fn to_text(&self) -> String {
        format!(
            "perf send-rate --transport udp: {MSG}-byte RC SENDs streamed between two RoCEv2 ports\n\
             on loopback, completed at the receiver, vs {SEND_DATAGRAM}-byte raw UDP datagrams streamed\n\
             between two sockets (blocking receive); {} messages, best of {} rounds\n\n\
             RoCEv2:  {:>12.0} msgs/s\nraw UDP: {:>12.0} msgs/s ({} lost)\n\n\
             ratio: {:.2}x (target >= 0.5x)\n",
            self.msgs,
            self.rounds,
            self.roce_msgs_per_sec,
            self.udp_msgs_per_sec,
            self.udp_lost,
            self.ratio()
        )
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"benchmark\":\"send-rate\",\"transport\":\"udp\",\"msgs\":{},\"rounds\":{},\
             \"roce_msgs_per_sec\":{},\"udp_msgs_per_sec\":{},\"udp_lost\":{},\"ratio\":{},\
             \"target_ratio\":0.5,\"target_met\":{}}}",
            self.msgs,
            self.rounds,
            json_f64(self.roce_msgs_per_sec, 0),
            json_f64(self.udp_msgs_per_sec, 0),
            self.udp_lost,
            json_f64(self.ratio(), 4),
            self.ratio() >= 0.5
        )
    }
}

/// Runs send-rate.
pub fn run_send_rate(msgs: u64, rounds: usize) -> BenchResult<RateReport> {
    if msgs == 0 {
        return Err("--msgs must be at least 1".into());
    }
    let (mut roce, mut udp, mut lost) = (0f64, 0f64, 0);
    for _ in 0..rounds.max(1) {
        roce =
            roce.max(roce_stream(&Target::Loopback, msgs, MSG, Mtu::Mtu1024, false)? / MSG as f64);
        let (rate, l) = udp_stream(msgs, SEND_DATAGRAM)?;
        if rate > udp {
            (udp, lost) = (rate, l);
        }
    }
    Ok(RateReport {
        msgs,
        rounds: rounds.max(1),
        roce_msgs_per_sec: roce,
        udp_msgs_per_sec: udp,
        udp_lost: lost,
    })
}
