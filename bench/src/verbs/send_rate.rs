//! `perf send-rate` (soft): 64-byte RC SENDs in batches between the pair
//! against `std::sync::mpsc` (one at a time and batched), with one-at-a-time
//! SENDs and an echo thread's round trip for context.

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use provider::RegisteredBuffer;
use provider::{Access, RecvWr, SendOp, SendWr, Sge, Wc};
use qp::{post_recv, post_send};

use super::pair::{pattern, RcPair, MSG_SIZE, SEND_RATE_TARGET};
use crate::{al_err, json_f64, poll_one, BenchResult};

/// Settings of one `perf send-rate` run.
#[derive(Clone, Debug)]
pub struct SendRateConfig {
    /// Messages per round (each contender).
    pub msgs: u64,
    /// Rounds; the fastest round of each contender is kept.
    pub rounds: usize,
}

impl Default for SendRateConfig {
    fn default() -> Self {
        SendRateConfig {
            msgs: 200_000,
            rounds: 5,
        }
    }
}

impl SendRateConfig {
    /// Round trips per round of the informational echo-thread ping-pong.
    pub fn pingpong_round_trips(&self) -> u64 {
        (self.msgs / 10).max(1)
    }
}

/// Everything one send-rate run measured (best rounds, ns per message).
#[derive(Clone, Debug)]
pub struct SendRateReport {
    /// The settings.
    pub config: SendRateConfig,
    /// The message rate: SENDs posted and polled [`SEND_BATCH`] at a time
    /// (one `post_recv`, one `post_send`, CQ polls with room for the whole
    /// batch).
    pub ibal_ns_per_msg: f64,
    /// Context (latency-bound): post recv + post one SEND + poll both
    /// completions, per message.
    pub ibal_one_at_a_time_ns_per_msg: f64,
    /// Same-thread `mpsc` send + recv of one `[u8; 64]` at a time.
    pub mpsc_one_at_a_time_ns_per_msg: f64,
    /// Same-thread `mpsc`: [`SEND_BATCH`] sends, then as many recvs.
    pub mpsc_batched_ns_per_msg: f64,
    /// Informational: `mpsc` round trip through an echo thread.
    pub pingpong_ns_per_round_trip: f64,
}

impl SendRateReport {
    /// The baseline: the faster of the two mpsc measurements.
    pub fn mpsc_ns_per_msg(&self) -> f64 {
        self.mpsc_one_at_a_time_ns_per_msg
            .min(self.mpsc_batched_ns_per_msg)
    }
    /// ibal messages per second.
    pub fn ibal_msgs_per_sec(&self) -> f64 {
        1e9 / self.ibal_ns_per_msg
    }
    /// Baseline mpsc messages per second.
    pub fn mpsc_msgs_per_sec(&self) -> f64 {
        1e9 / self.mpsc_ns_per_msg()
    }
    /// ibal message rate over the mpsc message rate.
    pub fn ratio(&self) -> f64 {
        self.mpsc_ns_per_msg() / self.ibal_ns_per_msg
    }
    /// Whether the ratio reached [`SEND_RATE_TARGET`].
    pub fn target_met(&self) -> bool {
        self.ratio() >= SEND_RATE_TARGET
    }

    /// Human-readable table.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "perf send-rate: {MSG_SIZE}-byte RC SEND message rate between two soft HCAs through the\n\
             object layer ({SEND_BATCH} per post_recv / post_send, CQs polled {SEND_BATCH} at a time) vs\n\
             same-thread std::sync::mpsc of a [u8; {MSG_SIZE}]; {} messages per round, best of {}\n\
             interleaved rounds\n\n",
            c.msgs, c.rounds
        );
        let row = |out: &mut String, name: &str, ns: f64| {
            out.push_str(&format!(
                "{name:<46} {ns:>10.1} {:>14.0}
",
                1e9 / ns
            ));
        };
        out.push_str(&format!(
            "{:<46} {:>10} {:>14}
",
            "contender", "ns/msg", "msgs/s"
        ));
        row(
            &mut out,
            &format!("ibal RC SEND, {SEND_BATCH} per call (message rate)"),
            self.ibal_ns_per_msg,
        );
        row(
            &mut out,
            "mpsc send+recv, same thread, one at a time",
            self.mpsc_one_at_a_time_ns_per_msg,
        );
        row(
            &mut out,
            &format!("mpsc, same thread, {SEND_BATCH} sends then {SEND_BATCH} recvs"),
            self.mpsc_batched_ns_per_msg,
        );
        out.push_str(&format!(
            "
ibal / mpsc message rate (the faster mpsc row): {:.2}x (target >= {SEND_RATE_TARGET:.2}): {}
",
            self.ratio(),
            if self.target_met() { "met" } else { "NOT met" }
        ));
        out.push_str(&format!(
            "for context: ibal one SEND at a time (post recv, post send, poll, poll) {:.1} ns per message
",
            self.ibal_one_at_a_time_ns_per_msg
        ));
        out.push_str(&format!(
            "for context: mpsc round trip through an echo thread {:.0} ns ({} round trips per round)
",
            self.pingpong_ns_per_round_trip,
            c.pingpong_round_trips()
        ));
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"benchmark\":\"send-rate\",\"msg_size\":{MSG_SIZE},\"msgs\":{},\"rounds\":{},\
             \"batch\":{SEND_BATCH},\"ibal_ns_per_msg\":{},\"ibal_msgs_per_sec\":{},\
             \"mpsc_ns_per_msg\":{},\"mpsc_msgs_per_sec\":{},\"ratio\":{},\"target_ratio\":{},\
             \"target_met\":{},\"mpsc_one_at_a_time_ns_per_msg\":{},\"mpsc_batched_ns_per_msg\":{},\
             \"ibal_one_at_a_time_ns_per_msg\":{},\"pingpong_round_trips\":{},\
             \"mpsc_pingpong_ns_per_round_trip\":{}}}",
            self.config.msgs,
            self.config.rounds,
            json_f64(self.ibal_ns_per_msg, 4),
            json_f64(self.ibal_msgs_per_sec(), 4),
            json_f64(self.mpsc_ns_per_msg(), 4),
            json_f64(self.mpsc_msgs_per_sec(), 4),
            json_f64(self.ratio(), 4),
            json_f64(SEND_RATE_TARGET, 4),
            self.target_met(),
            json_f64(self.mpsc_one_at_a_time_ns_per_msg, 4),
            json_f64(self.mpsc_batched_ns_per_msg, 4),
            json_f64(self.ibal_one_at_a_time_ns_per_msg, 4),
            self.config.pingpong_round_trips(),
            json_f64(self.pingpong_ns_per_round_trip, 4),
        )
    }
}

/// The send-side SGE (`lkey_a`) and receive-side SGE (`lkey_b`) of one
/// `MSG_SIZE` message at offset 0.
pub(super) fn message_sges(lkey_a: u32, lkey_b: u32) -> ([Sge; 1], [Sge; 1]) {
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: MSG_SIZE as u32,
            lkey,
        }]
    };
    (sge(lkey_a), sge(lkey_b))
}

pub(super) fn time_sends(
    pair: &RcPair,
    msgs: u64,
    lkey_a: u32,
    lkey_b: u32,
) -> BenchResult<Duration> {
    let (ssge, rsge) = message_sges(lkey_a, lkey_b);
    let mut wc = [Wc::default()];
    let t0 = Instant::now();
    for i in 0..msgs {
        post_recv(
            &pair.al,
            pair.qb,
            &[RecvWr {
                wr_id: i,
                sg_list: &rsge,
            }],
        )
        .map_err(al_err("post_recv"))?;
        post_send(&pair.al, pair.qa, &[SendWr::new(i, SendOp::Send, &ssge)])
            .map_err(al_err("post_send"))?;
        let r = poll_one(&pair.al, pair.b.cq, &mut wc)?;
        if r.byte_len as usize != MSG_SIZE {
            return Err(format!("received {} bytes, sent {MSG_SIZE}", r.byte_len));
        }
        poll_one(&pair.al, pair.a.cq, &mut wc)?;
    }
    Ok(t0.elapsed())
}

/// SENDs per post / poll call in the message-rate measurement (perftest
/// polls CQs 16 completions at a time, too).
pub const SEND_BATCH: usize = 16;

/// `msgs` SENDs, [`SEND_BATCH`] per call: one `post_recv` of the batch's
/// receives, one `post_send` of its SENDs, then CQ polls (room for the
/// whole batch) until every receive and every send has completed.
pub(super) fn time_sends_batched(
    pair: &RcPair,
    msgs: u64,
    lkey_a: u32,
    lkey_b: u32,
) -> BenchResult<Duration> {
    let (ssge, rsge) = message_sges(lkey_a, lkey_b);
    let rwrs: [RecvWr; SEND_BATCH] = std::array::from_fn(|i| RecvWr {
        wr_id: i as u64,
        sg_list: &rsge,
    });
    let swrs: [SendWr<_>; SEND_BATCH] =
        std::array::from_fn(|i| SendWr::new(i as u64, SendOp::Send, &ssge));
    let mut wc: [Wc; SEND_BATCH] = std::array::from_fn(|_| Wc::default());
    let t0 = Instant::now();
    let mut done = 0u64;
    while done < msgs {
        let n = usize::try_from(msgs - done)
            .unwrap_or(SEND_BATCH)
            .min(SEND_BATCH);
        post_recv(&pair.al, pair.qb, &rwrs[..n]).map_err(al_err("post_recv"))?;
        post_send(&pair.al, pair.qa, &swrs[..n]).map_err(al_err("post_send"))?;
        for (cq, receive) in [(pair.b.cq, true), (pair.a.cq, false)] {
            let mut got = 0;
            let mut polls = 0u32;
            while got < n {
                let k = hca::verbs::poll_cq(&pair.al, cq, &mut wc[..n - got])
                    .map_err(al_err("poll_cq"))?;
                for w in &wc[..k] {
                    if w.status != provider::WcStatus::Success {
                        return Err(format!(
                            "work request {} completed with {:?}",
                            w.wr_id, w.status
                        ));
                    }
                    if receive && w.byte_len as usize != MSG_SIZE {
                        return Err(format!("received {} bytes, sent {MSG_SIZE}", w.byte_len));
                    }
                }
                got += k;
                polls += 1;
                if polls > 1_000_000 {
                    return Err("a batch of SENDs did not complete".into());
                }
            }
        }
        done += n as u64;
    }
    Ok(t0.elapsed())
}

/// `msgs` `[u8; 64]` messages through the channel on this thread, `batch`
/// sends then as many receives at a time (1: send, receive, send, ...).
pub(super) fn time_mpsc(
    tx: &mpsc::Sender<[u8; MSG_SIZE]>,
    rx: &mpsc::Receiver<[u8; MSG_SIZE]>,
    msgs: u64,
    batch: u64,
) -> BenchResult<Duration> {
    let payload = [0x5au8; MSG_SIZE];
    let t0 = Instant::now();
    let mut done = 0u64;
    while done < msgs {
        let n = (msgs - done).min(batch);
        for _ in 0..n {
            tx.send(black_box(payload))
                .map_err(|_| "mpsc send failed".to_string())?;
        }
        for _ in 0..n {
            black_box(rx.recv().map_err(|_| "mpsc recv failed".to_string())?);
        }
        done += n;
    }
    Ok(t0.elapsed())
}

/// Run send-rate.
pub fn run_send_rate(cfg: &SendRateConfig) -> BenchResult<SendRateReport> {
    if cfg.msgs == 0 || cfg.rounds == 0 {
        return Err("--msgs and --rounds must be at least 1".into());
    }
    let pair = RcPair::open()?;
    let sbuf = RegisteredBuffer::from_vec(pattern(MSG_SIZE, 7));
    let rbuf = RegisteredBuffer::new(MSG_SIZE);
    let (lkey_a, _) = pair.register(pair.a.pd, &sbuf, Access::LOCAL_WRITE)?;
    let (lkey_b, _) = pair.register(pair.b.pd, &rbuf, Access::LOCAL_WRITE)?;
    // Warm up and check that both ways of posting deliver the payload.
    time_sends(&pair, 1, lkey_a, lkey_b)?;
    if rbuf.to_vec() != sbuf.to_vec() {
        return Err("the SEND did not deliver its payload".into());
    }
    rbuf.fill(0).map_err(|e| e.to_string())?;
    time_sends_batched(&pair, SEND_BATCH as u64, lkey_a, lkey_b)?;
    if rbuf.to_vec() != sbuf.to_vec() {
        return Err("the batched SENDs did not deliver their payload".into());
    }

    let (tx, rx) = mpsc::channel::<[u8; MSG_SIZE]>();
    time_mpsc(&tx, &rx, 64, 1)?;
    // The echo thread for the informational ping-pong.
    let (ping_tx, ping_rx) = mpsc::channel::<[u8; MSG_SIZE]>();
    let (pong_tx, pong_rx) = mpsc::channel::<[u8; MSG_SIZE]>();
    let echo = std::thread::Builder::new()
        .name("ibal-perf-echo".into())
        .spawn(move || {
            while let Ok(m) = ping_rx.recv() {
                if pong_tx.send(m).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| format!("spawning the echo thread: {e}"))?;
    let pingpong = |n: u64| -> BenchResult<Duration> {
        let payload = [0xa5u8; MSG_SIZE];
        let t0 = Instant::now();
        for _ in 0..n {
            ping_tx
                .send(black_box(payload))
                .map_err(|_| "echo thread gone".to_string())?;
            black_box(pong_rx.recv().map_err(|_| "echo thread gone".to_string())?);
        }
        Ok(t0.elapsed())
    };

    // Rounds interleave the contenders. On an error the echo thread sees
    // its channel close when `ping_tx` is dropped and ends by itself.
    let mut best = [Duration::MAX; 5];
    for _ in 0..cfg.rounds {
        let t = [
            time_sends_batched(&pair, cfg.msgs, lkey_a, lkey_b)?,
            time_mpsc(&tx, &rx, cfg.msgs, 1)?,
            time_mpsc(&tx, &rx, cfg.msgs, SEND_BATCH as u64)?,
            time_sends(&pair, cfg.msgs, lkey_a, lkey_b)?,
            pingpong(cfg.pingpong_round_trips())?,
        ];
        for (b, t) in best.iter_mut().zip(t) {
            *b = (*b).min(t);
        }
    }
    drop(ping_tx);
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())?;
    pair.close()?;
    let per = |t: Duration, n: u64| t.as_nanos() as f64 / n as f64;
    Ok(SendRateReport {
        config: cfg.clone(),
        ibal_ns_per_msg: per(best[0], cfg.msgs),
        mpsc_one_at_a_time_ns_per_msg: per(best[1], cfg.msgs),
        mpsc_batched_ns_per_msg: per(best[2], cfg.msgs),
        ibal_one_at_a_time_ns_per_msg: per(best[3], cfg.msgs),
        pingpong_ns_per_round_trip: per(best[4], cfg.pingpong_round_trips()),
    })
}
