//! `perf send-lat --transport udp`: the 64-byte RC SEND ping-pong between
//! our two ports against a raw UDP ping-pong of the same datagrams (and,
//! for context, one with the ACK an RC responder sends), or on one thread
//! (`--one-thread`, a profiling aid).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use ibal::prelude::*;

use super::ends::{
    err, median, poll_some, recv_wr, udp_pair, Pair, Target, Wait, MSG, SEND_DATAGRAM, STALL,
};
use crate::placement::{on_cpu, pin_this_thread, two_cpus};
use crate::{json_f64, BenchResult};

/// Round trips, both ways measured per iteration (microseconds).
#[derive(Debug, Clone)]
pub struct LatReport {
    /// Round trips per contender.
    pub iters: u32,
    /// The CPUs each contender's two polling threads were pinned to
    /// (`perf::placement`), or None (left to the scheduler).
    pub cpus: Option<[usize; 2]>,
    /// RC SEND ping-pong: median round trip, us.
    pub roce_median_us: f64,
    /// Raw UDP ping-pong, blocking receive: median round trip, us.
    pub udp_median_us: f64,
    /// Raw UDP ping-pong, non-blocking sockets polled with a yield (as the
    /// RoCE benchmark polls its CQs): median round trip, us.
    pub udp_busy_median_us: f64,
    /// Raw UDP ping-pong polled as above, where each side also sends a
    /// 20-byte datagram after its answer, as an RC responder's ACK leaves
    /// after the answering SEND (the receiver goes on at the answer and
    /// takes the ACKs when they come): median, us. Not the target's
    /// baseline: what the datagrams RC needs cost on this host.
    pub udp_acked_median_us: f64,
    /// RC SEND ping-pong: mean, us.
    pub roce_mean_us: f64,
    /// Raw UDP: mean, us.
    pub udp_mean_us: f64,
}

impl LatReport {
    /// Median RoCE round trip over the faster raw UDP median (blocking or
    /// polled): the provider's receive threads block and the benchmark's
    /// threads poll, so the stricter of the two baselines is the target's.
    pub fn ratio(&self) -> f64 {
        self.roce_median_us / self.udp_median_us.min(self.udp_busy_median_us)
    }
    /// Where the polling threads ran, in words.
    fn placement(&self) -> String {
        match self.cpus {
            Some([a, b]) => format!("each contender's two threads pinned to CPUs {a} and {b}"),
            None => "threads placed by the scheduler (not pinned)".into(),
        }
    }

    /// A table.
    pub fn to_text(&self) -> String {
        format!(
            "perf send-lat --transport udp: {MSG}-byte RC SEND ping-pong between two RoCEv2 ports on\n\
             loopback vs a raw UDP ping-pong of {SEND_DATAGRAM}-byte datagrams, blocking and polled;\n\
             {} round trips each; {}\n\n\
             {:>16} {:>12} {:>12}\n{:>16} {:>12.2} {:>12.2}\n{:>16} {:>12.2} {:>12.2}\n{:>16} {:>12.2}\n\
             {:>16} {:>12.2}   (an ACK datagram each way after the answer, as RC sends)\n\n\
             ratio (median, vs the faster UDP): {:.2}x (target <= 1.5x); vs UDP + ACKs: {:.2}x\n",
            self.iters,
            self.placement(),
            "",
            "median us",
            "mean us",
            "RoCEv2",
            self.roce_median_us,
            self.roce_mean_us,
            "raw UDP blocking",
            self.udp_median_us,
            self.udp_mean_us,
            "raw UDP polled",
            self.udp_busy_median_us,
            "UDP polled + ACK",
            self.udp_acked_median_us,
            self.ratio(),
            self.roce_median_us / self.udp_acked_median_us
        )
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"benchmark\":\"send-lat\",\"transport\":\"udp\",\"iters\":{},\"pinned_cpus\":{},\"roce_median_us\":{},\
             \"roce_mean_us\":{},\"udp_median_us\":{},\"udp_mean_us\":{},\"udp_busy_median_us\":{},\
             \"udp_acked_median_us\":{},\"ratio\":{},\"target_ratio\":1.5,\"target_met\":{}}}",
            self.iters,
            self.cpus
                .map_or("null".to_string(), |[a, b]| format!("[{a},{b}]")),
            json_f64(self.roce_median_us, 3),
            json_f64(self.roce_mean_us, 3),
            json_f64(self.udp_median_us, 3),
            json_f64(self.udp_mean_us, 3),
            json_f64(self.udp_busy_median_us, 3),
            json_f64(self.udp_acked_median_us, 3),
            json_f64(self.ratio(), 4),
            self.ratio() <= 1.5
        )
    }
}

/// Runs send-lat: `iters` round trips of each contender.
pub fn run_send_lat(iters: u32, pin: bool) -> BenchResult<LatReport> {
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let cpus = if pin { two_cpus() } else { None };
    let (roce_median_us, roce_mean_us) = roce_pingpong(&Target::Loopback, iters, cpus)?;
    let (udp_median_us, udp_mean_us) = udp_pingpong(iters, false, cpus)?;
    let (udp_busy_median_us, _) = udp_pingpong(iters, true, cpus)?;
    let udp_acked_median_us = udp_pingpong_acked(iters, cpus)?;
    Ok(LatReport {
        iters,
        cpus,
        roce_median_us,
        udp_median_us,
        udp_busy_median_us,
        udp_acked_median_us,
        roce_mean_us,
        udp_mean_us,
    })
}

/// `send-lat --one-thread`: the RC SEND ping-pong with one thread driving
/// both ends in turn. Not a latency (nothing overlaps, and the two ends'
/// work adds up on one core): a profiling aid in which a poll finds the
/// datagram the other end just sent, so every function on the
/// per-message path runs once or twice per round trip (their posts, the
/// feeds, the ACKs, the CQ hand-offs). Under `valgrind --tool=callgrind`
/// time runs tens of times slower, the busy-poll detection (empty polls
/// 50 us apart) fails and the receive threads take some datagrams: read
/// callgrind's cost per call of each function, not its total over the
/// round trips (`empty_polls_per_round_trip` shows how far a run is from
/// the ideal 0).
#[derive(Debug, Clone)]
pub struct OneThreadReport {
    /// Round trips.
    pub iters: u32,
    /// Mean wall time per round trip, us (both ends' work in series).
    pub mean_us: f64,
    /// Polls that found nothing (a datagram not yet fed: taken by a
    /// receive thread, or not yet arrived), per round trip.
    pub empty_polls_per_round_trip: f64,
}

impl OneThreadReport {
    /// A table.
    pub fn to_text(&self) -> String {
        format!(
            "perf send-lat --transport udp --one-thread: {MSG}-byte RC SEND ping-pong, both ends\n\
             driven by one thread in turn (a profiling aid: run it under\n\
             `valgrind --tool=callgrind` and read each function's cost per call; not a latency)\n\n\
             round trips {}\nmean us per round trip (both ends in series) {:.2}\n\
             empty polls per round trip {:.3}\n",
            self.iters, self.mean_us, self.empty_polls_per_round_trip
        )
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"benchmark\":\"send-lat\",\"transport\":\"udp\",\"mode\":\"one-thread\",\
             \"iters\":{},\"mean_us\":{},\"empty_polls_per_round_trip\":{}}}",
            self.iters,
            json_f64(self.mean_us, 3),
            json_f64(self.empty_polls_per_round_trip, 4)
        )
    }
}

/// Runs `send-lat --one-thread` ([`OneThreadReport`]).
pub fn run_send_lat_one_thread(iters: u32) -> BenchResult<OneThreadReport> {
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let (pair, sges) = pingpong_pair(&Target::Loopback)?;
    let Pair { al, ends } = &pair;
    let mut wc = [Wc::default(); 4];
    let mut empty = 0u64;
    // Polls `cq` until a poll finds it empty (send completions only: no
    // SEND is on its way now).
    let keep_busy = |cq: Handle<Cq>| -> BenchResult<()> {
        let mut spare = [Wc::default(); 4];
        loop {
            let n = cq.poll(al, &mut spare).map_err(err("poll"))?;
            if n == 0 {
                return Ok(());
            }
            if let Some(bad) = spare[..n]
                .iter()
                .find(|w| w.status != WcStatus::Success || w.opcode == WcOpcode::Recv)
            {
                return Err(format!(
                    "work request {} completed with {:?} ({:?})",
                    bad.wr_id, bad.status, bad.opcode
                ));
            }
        }
    };
    // Polls `end`'s CQ until its SEND arrives, reposting that receive.
    let mut await_recv = |end: usize| -> BenchResult<()> {
        let (e, (_, recv)) = (&ends[end], &sges[end]);
        let stall = Instant::now() + STALL;
        loop {
            let n = e.cq.poll(al, &mut wc).map_err(err("poll"))?;
            if n == 0 {
                empty += 1;
                if Instant::now() > stall {
                    return Err(format!("no completion within {STALL:?}"));
                }
                std::thread::yield_now();
            }
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    return Err(format!(
                        "work request {} completed with {:?}",
                        w.wr_id, w.status
                    ));
                }
                if w.opcode == WcOpcode::Recv {
                    e.qp.post_recv(al, &[recv_wr(recv, w.wr_id)])
                        .map_err(err("post_recv"))?;
                    return Ok(());
                }
            }
        }
    };
    let t0 = Instant::now();
    for _ in 0..iters {
        // An empty poll of each end's CQ per round trip keeps both devices
        // marked as busy-polled (a spinning application's empty polls do
        // that), so their receive threads nap and leave every datagram to
        // these polls: the path profiled is the busy-polling application's.
        keep_busy(ends[0].cq)?;
        keep_busy(ends[1].cq)?;
        for (from, to) in [(0, 1), (1, 0)] {
            ends[from]
                .qp
                .post_send(al, &[SendWr::new(1, SendOp::Send, &sges[from].0)])
                .map_err(err("post_send"))?;
            await_recv(to)?;
        }
    }
    let mean_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
    drop(pair);
    Ok(OneThreadReport {
        iters,
        mean_us,
        empty_polls_per_round_trip: empty as f64 / f64::from(iters),
    })
}

/// A ping-pong's send (offset 0) and receive (offset [`MSG`]) SGEs of one
/// end.
pub(crate) type PingSges = ([Sge; 1], [Sge; 1]);

/// The two ends of a [`MSG`]-byte ping-pong on `target`: the pair, each
/// end's SGEs, and 64 receives posted on each.
pub(crate) fn pingpong_pair(target: &Target) -> BenchResult<(Pair, [PingSges; 2])> {
    const DEPTH: u32 = 64;
    let pair = Pair::on(target, Mtu::Mtu1024, 2 * MSG, DEPTH)?;
    let sges = pair.ends.each_ref().map(|e| {
        let sge = |off: u64| {
            [Sge {
                addr: off,
                length: MSG as u32,
                lkey: e.lkey,
            }]
        };
        (sge(0), sge(MSG as u64))
    });
    for (e, (_, recv)) in pair.ends.iter().zip(&sges) {
        let wrs: Vec<RecvWr> = (0..DEPTH).map(|i| recv_wr(recv, u64::from(i))).collect();
        e.qp.post_recv(&pair.al, &wrs).map_err(err("post_recv"))?;
    }
    Ok((pair, sges))
}

pub(super) fn roce_pingpong(
    target: &Target,
    iters: u32,
    cpus: Option<[usize; 2]>,
) -> BenchResult<(f64, f64)> {
    let (pair, sges) = pingpong_pair(target)?;
    roce_pingpong_on(&pair, sges, iters, cpus)
}

/// `iters` round trips of a [`MSG`]-byte SEND ping-pong on `pair` (made
/// by [`pingpong_pair`], with its SGEs): the median and mean round trip,
/// us.
pub(crate) fn roce_pingpong_on(
    pair: &Pair,
    [(a_send, a_recv), (b_send, b_recv)]: [PingSges; 2],
    iters: u32,
    cpus: Option<[usize; 2]>,
) -> BenchResult<(f64, f64)> {
    let Pair { al, ends: [a, b] } = pair;
    let echo = {
        let (al, qp, cq) = (Arc::clone(al), b.qp, b.cq);
        std::thread::spawn(move || -> BenchResult<()> {
            pin_echo(cpus);
            let mut wc = [Wc::default(); 4];
            let mut received = 0;
            while received < iters {
                let n = poll_some(&al, cq, &mut wc, Wait::Yield)?;
                for w in &wc[..n] {
                    if w.opcode == WcOpcode::Recv {
                        received += 1;
                        qp.post_recv(&al, &[recv_wr(&b_recv, w.wr_id)])
                            .map_err(err("post_recv"))?;
                        qp.post_send(&al, &[SendWr::new(1, SendOp::Send, &b_send)])
                            .map_err(err("post_send"))?;
                    }
                }
            }
            Ok(())
        })
    };
    let mut wc = [Wc::default(); 4];
    let timed = on_cpu(cpus.map(|c| c[0]), || -> BenchResult<(Vec<f64>, f64)> {
        let mut rtts = Vec::with_capacity(iters as usize);
        let t0 = Instant::now();
        for _ in 0..iters {
            let start = Instant::now();
            a.qp.post_send(al, &[SendWr::new(1, SendOp::Send, &a_send)])
                .map_err(err("post_send"))?;
            let mut got = false;
            while !got {
                let n = poll_some(al, a.cq, &mut wc, Wait::Yield)?;
                for w in &wc[..n] {
                    if w.opcode == WcOpcode::Recv {
                        got = true;
                        a.qp.post_recv(al, &[recv_wr(&a_recv, w.wr_id)])
                            .map_err(err("post_recv"))?;
                    }
                }
            }
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let mean = t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        Ok((rtts, mean))
    });
    let (mut rtts, mean) = timed?;
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())??;
    Ok((median(&mut rtts), mean))
}

/// Pins a contender's echo thread to the second of `cpus`, if given.
fn pin_echo(cpus: Option<[usize; 2]>) {
    if let Some([_, cpu]) = cpus {
        pin_this_thread(cpu);
    }
}

/// Receives one datagram: blocking, or (`busy`) polling a non-blocking
/// socket and yielding between tries, as the RoCE benchmark polls its CQ.
fn recv_one(s: &UdpSocket, buf: &mut [u8], busy: bool) -> std::io::Result<(usize, SocketAddr)> {
    let end = Instant::now() + STALL;
    loop {
        match s.recv_from(buf) {
            Err(e)
                if busy && e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < end =>
            {
                std::thread::yield_now()
            }
            r => return r,
        }
    }
}

fn udp_pingpong(iters: u32, busy: bool, cpus: Option<[usize; 2]>) -> BenchResult<(f64, f64)> {
    let (a, b) = udp_pair()?;
    udp_pingpong_on(a, b, iters, busy, cpus)
}

/// `iters` round trips of an [`SEND_DATAGRAM`]-byte ping-pong between the
/// sockets `a` and `b` (blocking, or `busy`-polled); the echo answers only
/// datagrams from `a`'s address (others, a flood's, are taken and
/// dropped, as the RoCE port's receive stage drops them). Median and mean
/// round trip, us.
pub(crate) fn udp_pingpong_on(
    a: UdpSocket,
    b: UdpSocket,
    iters: u32,
    busy: bool,
    cpus: Option<[usize; 2]>,
) -> BenchResult<(f64, f64)> {
    for s in [&a, &b] {
        s.set_nonblocking(busy).map_err(|e| e.to_string())?;
    }
    let (a_addr, b_addr) = (
        a.local_addr().map_err(|e| e.to_string())?,
        b.local_addr().map_err(|e| e.to_string())?,
    );
    let echo = std::thread::spawn(move || -> BenchResult<()> {
        pin_echo(cpus);
        let mut buf = [0u8; 2048];
        let mut answered = 0;
        while answered < iters {
            let (n, from) = recv_one(&b, &mut buf, busy).map_err(|e| format!("echo recv: {e}"))?;
            if from == a_addr {
                b.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
                answered += 1;
            }
        }
        Ok(())
    });
    let timed = on_cpu(cpus.map(|c| c[0]), || -> BenchResult<(Vec<f64>, f64)> {
        let msg = [0x5au8; SEND_DATAGRAM];
        let mut buf = [0u8; 2048];
        let mut rtts = Vec::with_capacity(iters as usize);
        let t0 = Instant::now();
        for _ in 0..iters {
            let start = Instant::now();
            a.send_to(&msg, b_addr).map_err(|e| e.to_string())?;
            let (n, _) =
                recv_one(&a, &mut buf, busy).map_err(|e| format!("ping recv on {a_addr}: {e}"))?;
            if n != SEND_DATAGRAM {
                return Err(format!("echo of {n} bytes"));
            }
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let mean = t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        Ok((rtts, mean))
    });
    let (mut rtts, mean) = timed?;
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())??;
    Ok((median(&mut rtts), mean))
}

/// UDP payload of an RC ACK (BTH + AETH + ICRC).
const ACK_DATAGRAM: usize = 12 + 4 + 4;

/// Takes datagrams off the polled non-blocking `s` until an answer (not an
/// ACK-sized one) came; ACKs are just taken.
fn recv_answer(s: &UdpSocket, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        let (n, _) = recv_one(s, buf, true)?;
        if n != ACK_DATAGRAM {
            return Ok(());
        }
    }
}

/// The polled raw ping-pong with an ACK datagram each way after the answer
/// (as the provider's held ACKs leave); median round trip, us.
fn udp_pingpong_acked(iters: u32, cpus: Option<[usize; 2]>) -> BenchResult<f64> {
    let (a, b) = udp_pair()?;
    for s in [&a, &b] {
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    let (a_addr, b_addr) = (
        a.local_addr().map_err(|e| e.to_string())?,
        b.local_addr().map_err(|e| e.to_string())?,
    );
    let ack = [0x11u8; ACK_DATAGRAM];
    let echo = std::thread::spawn(move || -> BenchResult<()> {
        pin_echo(cpus);
        let mut buf = [0u8; 2048];
        let msg = [0x5au8; SEND_DATAGRAM];
        for _ in 0..iters {
            recv_answer(&b, &mut buf).map_err(|e| format!("echo recv: {e}"))?;
            b.send_to(&msg, a_addr).map_err(|e| e.to_string())?;
            b.send_to(&ack, a_addr).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let timed = on_cpu(cpus.map(|c| c[0]), || -> BenchResult<Vec<f64>> {
        let msg = [0x5au8; SEND_DATAGRAM];
        let mut buf = [0u8; 2048];
        let mut rtts = Vec::with_capacity(iters as usize);
        for i in 0..iters {
            let start = Instant::now();
            a.send_to(&msg, b_addr).map_err(|e| e.to_string())?;
            if i > 0 {
                // The ACK of the answer just taken.
                a.send_to(&ack, b_addr).map_err(|e| e.to_string())?;
            }
            recv_answer(&a, &mut buf).map_err(|e| format!("ping recv: {e}"))?;
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(rtts)
    });
    let mut rtts = timed?;
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())??;
    Ok(median(&mut rtts))
}
