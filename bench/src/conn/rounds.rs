//! The timed rounds of serial connections and of in-flight batches, with
//! the floor (a MAD round trip, the bare exchange, a thread echo) sampled
//! between the connections.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::Handle;
use cep::cm::CmDrive;
use ibal_testkit::devices;
use provider::Wc;
use qp::Qp;

use super::bare::{Route, UdPair};
use super::bench::Bench;
use super::config::{ConnRateConfig, GRH_SIZE, MAD_RTTS_PER_CONNECTION, MAD_SIZE, ROUND};
use super::report::{us, Dist, ModeFigures};
use crate::BenchResult;

/// The floor and the thread echo, sampled in both phases.
pub(super) struct Floor {
    pub(super) mad: Vec<f64>,
    pub(super) echo: Vec<f64>,
    /// The bare exchange ([`UdPair::bare_connect`]).
    pub(super) bare: Vec<f64>,
    pub(super) ping: mpsc::Sender<[u8; MAD_SIZE]>,
    pub(super) pong: mpsc::Receiver<[u8; MAD_SIZE]>,
}

impl Floor {
    /// Empty samples and the echo thread (it ends when `ping` is dropped).
    pub(super) fn start() -> BenchResult<(Floor, std::thread::JoinHandle<()>)> {
        let (ping_tx, ping_rx) = mpsc::channel::<[u8; MAD_SIZE]>();
        let (pong_tx, pong_rx) = mpsc::channel::<[u8; MAD_SIZE]>();
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
        let floor = Floor {
            mad: Vec::new(),
            echo: Vec::new(),
            bare: Vec::new(),
            ping: ping_tx,
            pong: pong_rx,
        };
        Ok((floor, echo))
    }

    pub(super) fn echo_rtt(&self) -> BenchResult<Duration> {
        let t0 = Instant::now();
        self.ping
            .send([0x5a; MAD_SIZE])
            .map_err(|_| "echo thread gone".to_string())?;
        self.pong
            .recv()
            .map_err(|_| "echo thread gone".to_string())?;
        Ok(t0.elapsed())
    }
}

/// One drive mode: serial connects (with REJ probes, MAD floor and echo
/// samples interleaved), then the throughput batches, then close.
pub(super) fn measure(
    cfg: &ConnRateConfig,
    drive: CmDrive,
    floor: &mut Floor,
) -> BenchResult<ModeFigures> {
    let bench = Bench::open(drive)?;
    let route = Route {
        lids: devices::DEFAULT_LIDS,
        gids: None,
        path_mtu: provider::Mtu::Mtu4096,
    };
    let ud = UdPair::open(&bench, route)?;
    let mut wc = [Wc::default()];
    // Warm up the UD pair and check that the payload arrived whole.
    ud.round_trip(&bench.al, &mut wc)?;
    let got = ud.bufs[1].to_vec();
    if got[MAD_SIZE + GRH_SIZE..] != ud.bufs[0].to_vec()[..MAD_SIZE] {
        return Err("the UD SEND did not deliver its 256 bytes".into());
    }
    let figures = run_rounds(cfg, &bench, |bench, qps, n| {
        for _ in 0..n * MAD_RTTS_PER_CONNECTION {
            floor.mad.push(us(ud.round_trip(&bench.al, &mut wc)?));
        }
        for _ in 0..n {
            floor.echo.push(us(floor.echo_rtt()?));
        }
        ud.sample_bare(bench, qps, n, &mut floor.bare)?;
        Ok(())
    })?;
    drop(ud);
    bench.close()?;
    Ok(figures)
}

/// The rounds of one drive mode on an open bench: serial connects, each
/// round followed by as many REQ -> REJ probes and then `per_round(bench,
/// qps, n)` (the run's floor samples for `n` connections; QPs it creates go
/// into `qps`, destroyed at the round's teardown), then the throughput
/// batches. The bench stays open.
pub(super) fn run_rounds(
    cfg: &ConnRateConfig,
    bench: &Bench,
    mut per_round: impl FnMut(&Bench, &mut Vec<Handle<Qp>>, usize) -> BenchResult<()>,
) -> BenchResult<ModeFigures> {
    let drive = bench.drive;
    let mads_before = bench.mads_sent();
    let drops = || bench.dropped_no_recv();
    let drops_before = drops();
    let mut drops_timed = 0;

    // Serial rounds, interleaving the contenders.
    let (mut connect, mut rej) = (vec![], vec![]);
    let mut legs: [Vec<f64>; 4] = Default::default();
    let mut qps = Vec::new();
    let mut done = 0;
    while done < cfg.connections {
        let n = ROUND.min(cfg.connections - done);
        let mut pairs = Vec::with_capacity(n);
        let mut probes = Vec::with_capacity(n);
        for _ in 0..n {
            pairs.push(bench.prepare(&mut qps, true)?);
            probes.push(bench.prepare(&mut qps, false)?);
        }
        for &(slot, qp) in &pairs {
            let d0 = drops();
            bench.connect(slot, qp, true)?;
            bench.wait("both sides ESTABLISHED", |s| {
                s.slots[slot].established().is_some()
            })?;
            drops_timed += drops() - d0;
            let t = bench.times(slot);
            let (Some(start), Some(req), Some(rep), Some(a), Some(b)) = (
                t.start,
                t.request,
                t.reply,
                t.active_established,
                t.passive_established,
            ) else {
                return Err(format!("connection {slot}: a callback left no time"));
            };
            connect.push(us(a.max(b) - start));
            legs[0].push(us(req.saturating_duration_since(start)));
            legs[1].push(us(rep.saturating_duration_since(req)));
            legs[2].push(us(b.saturating_duration_since(rep)));
            legs[3].push(us(a.saturating_duration_since(rep)));
        }
        for &(slot, qp) in &probes {
            bench.connect(slot, qp, false)?;
            bench.wait("the REJ", |s| s.slots[slot].rejected.is_some())?;
            let t = bench.times(slot);
            match (t.start, t.rejected) {
                (Some(s), Some(r)) => rej.push(us(r - s)),
                _ => return Err(format!("probe {slot}: a callback left no time")),
            }
        }
        per_round(bench, &mut qps, n)?;
        bench.teardown(&mut qps)?;
        done += n;
    }

    // Throughput.
    let mut total = Duration::ZERO;
    let mut best = Duration::MAX;
    for _ in 0..cfg.batches {
        let mut batch = Vec::with_capacity(cfg.in_flight);
        for _ in 0..cfg.in_flight {
            batch.push(bench.prepare(&mut qps, true)?);
        }
        let target = bench.track.with(|s| s.completed) + cfg.in_flight;
        let d0 = drops();
        let t0 = Instant::now();
        for &(slot, qp) in &batch {
            bench.connect(slot, qp, true)?;
        }
        bench.wait("a batch ESTABLISHED", |s| s.completed >= target)?;
        drops_timed += drops() - d0;
        let last = batch
            .iter()
            .filter_map(|&(slot, _)| bench.times(slot).established())
            .max()
            .ok_or("a batch with no connection")?;
        let t = last - t0;
        total += t;
        best = best.min(t);
        bench.teardown(&mut qps)?;
    }

    let cm_mads_sent = bench.mads_sent() - mads_before;
    let dropped_no_recv = drops() - drops_before;
    let k = (cfg.batches * cfg.in_flight) as f64;
    let [l0, l1, l2, l3] = legs;
    Ok(ModeFigures {
        drive,
        connect: Dist::of(connect),
        legs: [
            (
                "req_to_listener: connect (REQ) -> listener callback",
                Dist::of(l0).median_us,
            ),
            (
                "listener_to_reply: accept (REP) -> active ReplyReceived callback",
                Dist::of(l1).median_us,
            ),
            (
                "reply_to_passive_established: rtu (RTU) -> passive Established",
                Dist::of(l2).median_us,
            ),
            (
                "reply_to_active_established: rtu -> active Established (local event)",
                Dist::of(l3).median_us,
            ),
        ],
        conns_per_sec: k / total.as_secs_f64().max(1e-12),
        best_batch_conns_per_sec: cfg.in_flight as f64 / best.as_secs_f64().max(1e-12),
        rej_rtt: Dist::of(rej),
        cm_mads_sent,
        dropped_no_recv,
        dropped_no_recv_timed: drops_timed,
    })
}
