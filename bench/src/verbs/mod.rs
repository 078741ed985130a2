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

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::{Al, Handle};
use hca::provider::{
    Access, AvAttr, Mtu, QpCaps, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, Wc,
};
use hca::verbs::{self, Cq, Pd};
use hca::RegisteredBuffer;
use ibal::verbs::SoftProvider;
use qp::{create_qp, modify_qp, post_recv, post_send, Qp, QpCreate};

use ibal_testkit::devices;

pub use super::BenchResult;
use super::{al_err, json_f64, poll_one};

/// The write-bw target: ibal bandwidth at least this fraction of memcpy's.
pub const WRITE_BW_TARGET: f64 = 0.8;
/// The send-rate target: ibal message rate at least this multiple of mpsc's.
pub const SEND_RATE_TARGET: f64 = 1.0;
/// Payload of send-rate messages, in bytes.
pub const MSG_SIZE: usize = 64;
/// write-bw's default completion moderation: one signaled WRITE in 16.
pub const WRITE_SIGNAL_EVERY: u32 = 16;

/// Send queue depth of the benchmark QPs (bounds `signal_every`).
pub const SQ_DEPTH: u32 = 64;
/// Bytes moved per round per size when `iters` is not given.
pub const AUTO_BYTES_PER_ROUND: u64 = 256 << 20;
/// Largest message size accepted (the MR and `Sge::length` limit is u32).
pub const MAX_SIZE: usize = 1 << 30;

// ------------------------------------------------------------ the RC pair --

struct Side {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    lid: u16,
}

/// One RC QP on each HCA of the default fabric, connected by hand.
struct RcPair {
    al: Al,
    a: Side,
    b: Side,
    qa: Handle<Qp>,
    qb: Handle<Qp>,
    // Keeps the fabric alive for the run.
    _provider: SoftProvider,
}

impl RcPair {
    fn open() -> BenchResult<RcPair> {
        let provider = devices::default_provider();
        let al = Al::open().map_err(al_err("opening the AL"))?;
        let side = |i: usize| -> BenchResult<Side> {
            let guid = devices::DEFAULT_NODE_GUIDS[i];
            let ca = verbs::open_ca(al.instance(), &provider, guid).map_err(al_err("open_ca"))?;
            let pd = verbs::alloc_pd(al.instance(), ca).map_err(al_err("alloc_pd"))?;
            let cq = verbs::create_cq(al.instance(), ca, 256, None, None)
                .map_err(al_err("create_cq"))?;
            Ok(Side {
                pd,
                cq,
                lid: devices::DEFAULT_LIDS[i],
            })
        };
        let (a, b) = (side(0)?, side(1)?);
        let rc_qp = |s: &Side| {
            create_qp(
                al.instance(),
                s.pd,
                QpCreate {
                    caps: QpCaps {
                        max_send_wr: SQ_DEPTH,
                        ..QpCaps::default()
                    },
                    ..QpCreate::new(QpType::Rc, s.cq)
                },
            )
            .map_err(al_err("create_qp"))
        };
        let (qa, qb) = (rc_qp(&a)?, rc_qp(&b)?);
        let qpn = |q: Handle<Qp>| -> BenchResult<u32> {
            Ok(al.resolve(q).map_err(al_err("resolving a QP"))?.qpn())
        };
        let (qpn_a, qpn_b) = (qpn(qa)?, qpn(qb)?);
        // a sends with PSN 0x100 and expects 0x200; b the reverse.
        to_rts(&al, qa, b.lid, qpn_b, 0x200, 0x100)?;
        to_rts(&al, qb, a.lid, qpn_a, 0x100, 0x200)?;
        Ok(RcPair {
            al,
            a,
            b,
            qa,
            qb,
            _provider: provider,
        })
    }

    /// Register all of `buf` in `pd` (iova 0); returns (lkey, rkey).
    fn register(
        &self,
        pd: Handle<Pd>,
        buf: &RegisteredBuffer,
        access: Access,
    ) -> BenchResult<(u32, u32)> {
        let h = verbs::register_mr(self.al.instance(), pd, buf, 0, buf.len(), 0, access)
            .map_err(al_err("register_mr"))?;
        let mr = self.al.resolve(h).map_err(al_err("resolving an MR"))?;
        Ok((mr.lkey(), mr.rkey()))
    }

    /// Close the AL (destroying every object) and insist nothing is left.
    fn close(self) -> BenchResult<()> {
        let stats = self.al.close().map_err(al_err("closing the AL"))?;
        if stats.is_clean() {
            Ok(())
        } else {
            Err(format!("the AL closed with live objects: {stats}"))
        }
    }
}

fn to_rts(
    al: &Al,
    qp: Handle<Qp>,
    dlid: u16,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
) -> BenchResult<()> {
    let steps = [
        QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        QpModify::to(QpState::Rtr)
            .av(AvAttr::lid(1, dlid))
            .path_mtu(Mtu::Mtu4096)
            .dest_qpn(dest_qpn)
            .rq_psn(rq_psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12),
        QpModify::to(QpState::Rts)
            .sq_psn(sq_psn)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    ];
    for m in &steps {
        modify_qp(al, qp, m).map_err(al_err("modify_qp"))?;
    }
    Ok(())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn gb_per_sec(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9
}

// --------------------------------------------------------------- write-bw --

/// Settings of one `perf write-bw` run.
#[derive(Clone, Debug)]
pub struct WriteBwConfig {
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// Operations per round per size; `None`: [`AUTO_BYTES_PER_ROUND`] / size,
    /// at least 16.
    pub iters: Option<u64>,
    /// Rounds; the fastest round of each contender is kept.
    pub rounds: usize,
    /// Signal (and poll) every k-th WRITE and the last one; 1 = every WRITE.
    pub signal_every: u32,
}

impl Default for WriteBwConfig {
    fn default() -> Self {
        WriteBwConfig {
            sizes: vec![64 << 10, 1 << 20],
            iters: None,
            rounds: 5,
            signal_every: WRITE_SIGNAL_EVERY,
        }
    }
}

impl WriteBwConfig {
    /// Operations per round at `size`.
    pub fn iters_for(&self, size: usize) -> u64 {
        self.iters
            .unwrap_or_else(|| (AUTO_BYTES_PER_ROUND / size.max(1) as u64).max(16))
    }

    fn validate(&self) -> BenchResult<()> {
        if self.sizes.is_empty() {
            return Err("give at least one size".into());
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
            return Err(format!("size {s} is outside 1..={MAX_SIZE} bytes"));
        }
        if self.rounds == 0 || self.iters == Some(0) {
            return Err("--rounds and --iters must be at least 1".into());
        }
        if self.signal_every == 0 || self.signal_every > SQ_DEPTH {
            return Err(format!(
                "--signal-every must be in 1..={SQ_DEPTH} (the send queue depth)"
            ));
        }
        Ok(())
    }
}

/// One size's result.
#[derive(Clone, Debug)]
pub struct WritePoint {
    /// Bytes per WRITE / per copy.
    pub size: usize,
    /// Operations per round.
    pub iters: u64,
    /// RDMA WRITE through the object layer, best round.
    pub ibal_gbps: f64,
    /// `copy_from_slice`, best round.
    pub memcpy_gbps: f64,
}

impl WritePoint {
    /// ibal bandwidth over memcpy bandwidth.
    pub fn ratio(&self) -> f64 {
        self.ibal_gbps / self.memcpy_gbps
    }
}

/// Everything one write-bw run measured.
#[derive(Clone, Debug)]
pub struct WriteBwReport {
    /// The settings.
    pub config: WriteBwConfig,
    /// One point per size, in the order given.
    pub points: Vec<WritePoint>,
}

impl WriteBwReport {
    /// The smallest ratio over all sizes.
    pub fn min_ratio(&self) -> f64 {
        self.points
            .iter()
            .map(WritePoint::ratio)
            .fold(f64::INFINITY, f64::min)
    }

    /// Whether every size reached [`WRITE_BW_TARGET`].
    pub fn target_met(&self) -> bool {
        self.min_ratio() >= WRITE_BW_TARGET
    }

    /// Human-readable table.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let signal = if c.signal_every == 1 {
            "every WRITE signaled and its completion polled".to_string()
        } else {
            format!(
                "1 WRITE in {} (and the last) signaled and polled, the rest unsignaled",
                c.signal_every
            )
        };
        let mut out = format!(
            "perf write-bw: RC RDMA WRITE between two soft HCAs through the object layer ({signal}),\n\
             vs copy_from_slice between two Vec<u8>; best of {} interleaved rounds\n\n",
            c.rounds
        );
        out.push_str(&format!(
            "{:>10} {:>8} {:>12} {:>13} {:>8}\n",
            "size", "iters", "ibal GB/s", "memcpy GB/s", "ratio"
        ));
        for p in &self.points {
            out.push_str(&format!(
                "{:>10} {:>8} {:>12.2} {:>13.2} {:>7.2}x\n",
                p.size,
                p.iters,
                p.ibal_gbps,
                p.memcpy_gbps,
                p.ratio()
            ));
        }
        out.push_str(&format!(
            "\nibal / memcpy bandwidth, worst size: {:.2}x (target >= {WRITE_BW_TARGET:.2}): {}\n",
            self.min_ratio(),
            if self.target_met() { "met" } else { "NOT met" }
        ));
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "{{\"benchmark\":\"write-bw\",\"rounds\":{},\"signal_every\":{},\"results\":[",
            c.rounds, c.signal_every
        );
        for (i, p) in self.points.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                "{{\"size\":{},\"iters\":{},\"ibal_gbps\":{},\"memcpy_gbps\":{},\"ratio\":{}}}",
                p.size,
                p.iters,
                json_f64(p.ibal_gbps, 4),
                json_f64(p.memcpy_gbps, 4),
                json_f64(p.ratio(), 4)
            ));
        }
        s.push_str(&format!(
            "],\"min_ratio\":{},\"target_ratio\":{},\"target_met\":{}}}",
            json_f64(self.min_ratio(), 4),
            json_f64(WRITE_BW_TARGET, 4),
            self.target_met()
        ));
        s
    }
}

/// Buffers and keys of one size.
struct WriteSet {
    size: usize,
    iters: u64,
    src: RegisteredBuffer,
    dst: RegisteredBuffer,
    lkey: u32,
    rkey: u32,
    vsrc: Vec<u8>,
    vdst: Vec<u8>,
}

/// `iters` WRITEs of `w.size` bytes, every `signal_every`-th (and the last)
/// signaled and its completion polled.
fn time_writes(
    pair: &RcPair,
    w: &WriteSet,
    iters: u64,
    signal_every: u32,
) -> BenchResult<Duration> {
    let sge = [Sge {
        addr: 0,
        length: w.size as u32,
        lkey: w.lkey,
    }];
    let k = u64::from(signal_every);
    let mut wc = [Wc::default()];
    let t0 = Instant::now();
    for i in 0..iters {
        let signaled = (i + 1) % k == 0 || i + 1 == iters;
        let mut wr = SendWr::new(
            i,
            SendOp::Write {
                remote_addr: 0,
                rkey: w.rkey,
            },
            &sge,
        );
        if !signaled {
            wr = wr.unsignaled();
        }
        post_send(&pair.al, pair.qa, &[wr]).map_err(al_err("post_send"))?;
        if signaled {
            poll_one(&pair.al, pair.a.cq, &mut wc)?;
        }
    }
    Ok(t0.elapsed())
}

fn time_memcpy(w: &mut WriteSet) -> Duration {
    let t0 = Instant::now();
    for _ in 0..w.iters {
        w.vdst.copy_from_slice(black_box(&w.vsrc));
        black_box(&mut w.vdst);
    }
    t0.elapsed()
}

/// Run write-bw.
pub fn run_write_bw(cfg: &WriteBwConfig) -> BenchResult<WriteBwReport> {
    cfg.validate()?;
    let pair = RcPair::open()?;
    let mut sets = Vec::with_capacity(cfg.sizes.len());
    for (i, &size) in cfg.sizes.iter().enumerate() {
        let src = RegisteredBuffer::from_vec(pattern(size, i as u8));
        let dst = RegisteredBuffer::new(size);
        let (lkey, _) = pair.register(pair.a.pd, &src, Access::LOCAL_WRITE)?;
        let (_, rkey) =
            pair.register(pair.b.pd, &dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        sets.push(WriteSet {
            size,
            iters: cfg.iters_for(size),
            src,
            dst,
            lkey,
            rkey,
            vsrc: pattern(size, i as u8),
            vdst: vec![0; size],
        });
    }
    // Warm up (first touch of every page) and check the bytes arrived.
    for w in &mut sets {
        time_writes(&pair, w, 1, 1)?;
        if w.dst.to_vec() != w.src.to_vec() {
            return Err(format!(
                "RDMA WRITE of {} bytes did not copy the data",
                w.size
            ));
        }
        w.vdst.copy_from_slice(&w.vsrc);
    }
    let mut best_ibal = vec![Duration::MAX; sets.len()];
    let mut best_memcpy = vec![Duration::MAX; sets.len()];
    for _ in 0..cfg.rounds {
        for (i, w) in sets.iter_mut().enumerate() {
            best_ibal[i] = best_ibal[i].min(time_writes(&pair, w, w.iters, cfg.signal_every)?);
            best_memcpy[i] = best_memcpy[i].min(time_memcpy(w));
        }
    }
    let points = sets
        .iter()
        .zip(best_ibal.iter().zip(&best_memcpy))
        .map(|(w, (&ti, &tm))| {
            let bytes = w.size as u64 * w.iters;
            WritePoint {
                size: w.size,
                iters: w.iters,
                ibal_gbps: gb_per_sec(bytes, ti),
                memcpy_gbps: gb_per_sec(bytes, tm),
            }
        })
        .collect();
    drop(sets);
    pair.close()?;
    Ok(WriteBwReport {
        config: cfg.clone(),
        points,
    })
}

// -------------------------------------------------------------- send-rate --

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
fn message_sges(lkey_a: u32, lkey_b: u32) -> ([Sge; 1], [Sge; 1]) {
    let sge = |lkey| {
        [Sge {
            addr: 0,
            length: MSG_SIZE as u32,
            lkey,
        }]
    };
    (sge(lkey_a), sge(lkey_b))
}

fn time_sends(pair: &RcPair, msgs: u64, lkey_a: u32, lkey_b: u32) -> BenchResult<Duration> {
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
fn time_sends_batched(pair: &RcPair, msgs: u64, lkey_a: u32, lkey_b: u32) -> BenchResult<Duration> {
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
                    if w.status != hca::provider::WcStatus::Success {
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
fn time_mpsc(
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
