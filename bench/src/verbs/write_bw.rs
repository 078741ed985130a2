//! `perf write-bw` (soft): RC RDMA WRITEs between the pair against
//! `copy_from_slice`, rounds interleaved, the fastest of each kept.

use std::hint::black_box;
use std::time::{Duration, Instant};

use provider::RegisteredBuffer;
use provider::{Access, SendOp, SendWr, Sge, Wc};
use qp::post_send;

use super::pair::{
    gb_per_sec, pattern, RcPair, AUTO_BYTES_PER_ROUND, MAX_SIZE, SQ_DEPTH, WRITE_BW_TARGET,
    WRITE_SIGNAL_EVERY,
};
use crate::{al_err, json_f64, poll_one, BenchResult};

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

    pub(super) fn validate(&self) -> BenchResult<()> {
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
pub(super) struct WriteSet {
    pub(super) size: usize,
    pub(super) iters: u64,
    pub(super) src: RegisteredBuffer,
    pub(super) dst: RegisteredBuffer,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) vsrc: Vec<u8>,
    pub(super) vdst: Vec<u8>,
}

/// `iters` WRITEs of `w.size` bytes, every `signal_every`-th (and the last)
/// signaled and its completion polled.
pub(super) fn time_writes(
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

pub(super) fn time_memcpy(w: &mut WriteSet) -> Duration {
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
