//! `ibal perf write-bw` and `ibal perf send-rate`: the data path as a user
//! of the object layer sees it, against a plain-Rust baseline measured in
//! the same run.
//!
//! Both benchmarks open an AL instance on the embedded default fabric
//! ([`ibal_testkit::devices::default_fabric`]: two soft HCAs), open both CAs,
//! allocate a PD and one CQ (send and receive) on each, register the
//! buffers as MRs, create one RC QP per side and bring the pair to RTS by
//! hand (RESET -> INIT -> RTR -> RTS, no CM). Every verb goes through the
//! handle tables: `qp::post_send`/`qp::post_recv` and
//! `hca::verbs::poll_cq` resolve their handle on each call, exactly as an
//! application's calls do. At the end the AL is closed and must report no
//! live object (`Stats::is_clean`), else the run is an error.
//!
//! The soft provider delivers synchronously: `post_send` does the
//! responder's work (one copy from the source MR to the destination MR) on
//! the caller's thread, so a completion is ready when `post_send` returns.
//!
//! # write-bw
//!
//! RDMA WRITE of `size` bytes from an MR on HCA 0 to an MR on HCA 1, `iters`
//! times, against `dst.copy_from_slice(&src)` between two `Vec<u8>` of the
//! same size, `iters` times. As bandwidth tools do (perftest's
//! `ib_write_bw` moderates completions too), only every
//! [`WRITE_SIGNAL_EVERY`]-th WRITE (and the last) is signaled and its
//! completion polled, the others are posted unsignaled; `signal_every = k`
//! changes that (1: every WRITE signaled and polled before the next is
//! posted; k is at most the send queue depth, 64, as real hardware
//! requires). Rounds interleave the two
//! contenders; the fastest round of each is kept. Ratio: ibal GB/s over
//! memcpy GB/s (target >= 0.8).
//!
//! # send-rate
//!
//! The message rate of 64-byte RC SENDs, measured the way message-rate
//! tools (perftest's `ib_send_bw` with a post list) measure it: many
//! messages in flight, posted and polled in batches. Per batch of
//! [`SEND_BATCH`]: one `post_recv` of the batch's receives on QP 1, one
//! `post_send` of its SENDs on QP 0, then polls of QP 1's CQ and QP 0's CQ
//! (room for the whole batch) until every receive and every send has
//! completed with success and the right length. All on one thread, which
//! is where the soft provider does its work.
//!
//! Baseline ("a `std::sync::mpsc` round of the same payload"): on the same
//! thread, `[u8; 64]` messages through a `std::sync::mpsc::channel()`,
//! timed two ways in the same rounds: one at a time (`send` then `recv`),
//! and in batches like the SENDs ([`SEND_BATCH`] `send`s, then as many
//! `recv`s). The faster of the two is the baseline. Ratio: ibal messages/s
//! over that mpsc messages/s (target >= 1.0).
//!
//! For context the report also gives the SENDs one at a time (post a
//! receive, post one SEND, poll the receive completion, poll the send
//! completion: four calls, each resolving its handle, per message), which
//! is a latency figure rather than a rate, and the round trip through an
//! echo thread (`tx.send` to a thread that sends the array back, `rx.recv`
//! of the echo), which measures two thread wake-ups more than the channel;
//! it runs `max(msgs / 10, 1)` round trips per round.
//!
//! By job: `pair` the two RC QPs on the default fabric, `write_bw` and
//! `send_rate` the two benchmarks.

mod pair;
mod send_rate;
mod write_bw;

pub use super::BenchResult;
pub use pair::{
    AUTO_BYTES_PER_ROUND, MAX_SIZE, MSG_SIZE, SEND_RATE_TARGET, SQ_DEPTH, WRITE_BW_TARGET,
    WRITE_SIGNAL_EVERY,
};
pub use send_rate::{run_send_rate, SendRateConfig, SendRateReport, SEND_BATCH};
pub use write_bw::{run_write_bw, WriteBwConfig, WriteBwReport, WritePoint};

#[cfg(test)]
mod tests {
    use super::super::balanced;
    use super::*;

    #[test]
    fn a_tiny_write_bw_run_moves_data_and_reports_every_size() {
        let report = run_write_bw(&WriteBwConfig {
            sizes: vec![4096, 64 << 10],
            iters: Some(8),
            rounds: 2,
            signal_every: 3,
        })
        .unwrap();
        assert_eq!(report.points.len(), 2);
        assert_eq!(report.points[1].size, 64 << 10);
        assert!(report
            .points
            .iter()
            .all(|p| p.ibal_gbps > 0.0 && p.memcpy_gbps > 0.0 && p.iters == 8));
        let json = report.to_json();
        assert!(json.starts_with('{') && json.ends_with('}') && balanced(&json));
        assert!(json.contains("\"benchmark\":\"write-bw\""));
        assert!(json.contains("\"min_ratio\":"));
        assert!(report.to_text().contains("memcpy GB/s"));
    }

    #[test]
    fn a_tiny_send_rate_run_reports_both_rates() {
        let report = run_send_rate(&SendRateConfig {
            msgs: 100,
            rounds: 2,
        })
        .unwrap();
        assert!(report.ibal_ns_per_msg > 0.0 && report.ibal_one_at_a_time_ns_per_msg > 0.0);
        assert!(report.mpsc_one_at_a_time_ns_per_msg > 0.0 && report.mpsc_batched_ns_per_msg > 0.0);
        assert!(report.pingpong_ns_per_round_trip > 0.0);
        // The baseline is the faster mpsc figure.
        assert_eq!(
            report.mpsc_ns_per_msg(),
            report
                .mpsc_one_at_a_time_ns_per_msg
                .min(report.mpsc_batched_ns_per_msg)
        );
        let json = report.to_json();
        assert!(json.starts_with('{') && json.ends_with('}') && balanced(&json));
        assert!(json.contains("\"ibal_msgs_per_sec\":"));
        assert!(json.contains("\"ratio\":"));
        assert!(json.contains("\"ibal_one_at_a_time_ns_per_msg\":"));
        assert!(json.contains("\"mpsc_batched_ns_per_msg\":"));
        assert!(report.to_text().contains("mpsc send+recv"));
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |f: fn(&mut WriteBwConfig)| {
            let mut c = WriteBwConfig::default();
            f(&mut c);
            run_write_bw(&c).unwrap_err()
        };
        assert!(bad(|c| c.sizes.clear()).contains("size"));
        assert!(bad(|c| c.sizes = vec![0]).contains("size 0"));
        assert!(bad(|c| c.rounds = 0).contains("--rounds"));
        assert!(bad(|c| c.iters = Some(0)).contains("--iters"));
        assert!(bad(|c| c.signal_every = SQ_DEPTH + 1).contains("--signal-every"));
        assert!(run_send_rate(&SendRateConfig { msgs: 0, rounds: 1 }).is_err());
    }

    #[test]
    fn auto_iterations_move_a_fixed_volume() {
        let c = WriteBwConfig::default();
        assert_eq!(c.iters_for(1 << 20), 256);
        assert_eq!(c.iters_for(64 << 10), 4096);
        assert_eq!(c.iters_for(1 << 30), 16);
    }
}
