//! One `perf scale` run, step by step (see the module documentation).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use ibal::roce::{gid_of, RoceProvider};

use super::active::{Active, Target};
use super::config::{ScaleConfig, ScaleTransport, LISTEN_PORT, WAIT};
use super::end::{roce_device, soft_provider, End, Net, ADDRS};
use super::measure::{cpu_time, rss_bytes};
use super::passive::Passive;
use super::peer::{ChildPeer, Peer, PeerReport};
use super::report::{deciles, Accounting, KillReport, ScaleReport};
use crate::BenchResult;

/// The provider of a run, kept until both ends have closed.
type Kept = Box<dyn std::any::Any>;

/// Runs `cfg`; `exe` is the `ibal` binary that runs the listener of a
/// two-process run (`ibal perf scale-listener`).
pub fn run_scale(cfg: &ScaleConfig, exe: Option<&Path>) -> BenchResult<ScaleReport> {
    cfg.check()?;
    let n = cfg.connections;
    let ip = |i: usize| -> IpAddr { ADDRS[i].parse().expect("ADDRS are IP addresses") };
    // A CQ entry for every connection's SEND when the listener is killed
    // (they all fail within the same retry bound); otherwise the
    // ping-pong's few.
    let cq_depth = if cfg.kill_listener { n + 64 } else { 256 };
    let (providers, end, mut peer, target) = match (cfg.transport, cfg.processes) {
        (ScaleTransport::Soft, _) => {
            let p = soft_provider(n)?;
            let active = End::open(Net::Soft(&p), 0, cq_depth)?;
            let passive = Passive::listen(End::open(Net::Soft(&p), 1, 256)?, None)?;
            let peer = Peer::Local {
                passive,
                posted: false,
            };
            (Box::new(p) as Kept, active, peer, Target::Soft)
        }
        (ScaleTransport::Udp, 1) => {
            let p = RoceProvider::new(vec![roce_device(0, ip(0), n), roce_device(1, ip(1), n)]);
            let active = End::open(Net::Udp(&p), 0, cq_depth)?;
            let listen = SocketAddr::new(ip(1), LISTEN_PORT);
            let passive = Passive::listen(End::open(Net::Udp(&p), 1, 256)?, Some(listen))?;
            let peer = Peer::Local {
                passive,
                posted: false,
            };
            let target = Target::Udp {
                local: ip(0),
                to: listen,
            };
            (Box::new(p) as Kept, active, peer, target)
        }
        (ScaleTransport::Udp, _) => {
            let exe = exe.ok_or("a two-process run needs the ibal binary")?;
            let p = RoceProvider::new(vec![roce_device(0, ip(0), n)]);
            let active = End::open(Net::Udp(&p), 0, cq_depth)?;
            let me = p.address_of(&gid_of(ip(0)));
            let child = ChildPeer::spawn(exe, ip(1), me, n)?;
            p.add_peer(gid_of(ip(1)), child.addr);
            let target = Target::Udp {
                local: ip(0),
                to: SocketAddr::new(ip(1), LISTEN_PORT),
            };
            (Box::new(p) as Kept, active, Peer::Child(child), target)
        }
    };
    let mut active = Active::new(end, target, n);

    // The ping-pong's connection alone, and its round trip with N = 1
    // (a first short run warms both ends up).
    active.connect_upto(1, 1)?;
    // The listener's QP answers once it is RTS, i.e. once its end has
    // taken the RTU.
    wait_for_peer(&mut peer, |r| r.established >= 1)?;
    ping(&mut active, &mut peer, cfg.ping_iters.div_ceil(10))?;
    let ping_one_us = ping(&mut active, &mut peer, cfg.ping_iters)?;

    // The other N - 1, held.
    let (rss_before, peer_before) = (rss_bytes(), peer.report()?);
    let connect_start = active.now_ns();
    let started = Instant::now();
    active.connect_upto(n, cfg.in_flight)?;
    let connect_time = started.elapsed();
    // The listener's `Established` runs when the RTU arrives, a little
    // after the active end's.
    let peer_after = wait_for_peer(&mut peer, |r| r.established >= u64::from(n))?;
    let rss_after = rss_bytes();
    let active_stats = active.end.stats();
    let active_cm = active.end.cm_connections() as u64;

    // An idle while with everything held.
    let (cpu0, peer_cpu0) = (cpu_time(), peer.report()?.cpu);
    std::thread::sleep(cfg.idle);
    let (cpu1, peer_cpu1) = (cpu_time(), peer.report()?.cpu);
    let ping_all_us = ping(&mut active, &mut peer, cfg.ping_iters)?;

    let mads_connect = (active.end.mads_sent(), peer_after.mads_sent);
    // The last connection's QP: idle, unlike the ping-pong's, which keeps
    // packet buffers for reuse.
    let idle_qp = *active.qps.last().ok_or("no connection")?;
    let (qp_al, qp_provider) = active.end.qp_footprint(idle_qp)?;
    let accounting = Accounting {
        active_qp: (qp_al as u64, qp_provider as u64),
        listener_qp: peer_after.qp_footprint,
        cep: cep::cm::cep_footprint(),
        handler: al::footprint::arc_bytes::<(usize, u32)>() as u64,
    };
    let mut report = ScaleReport {
        mads_connect,
        mads_teardown: None,
        accounting,
        config: cfg.clone(),
        established: active.established(),
        connect_time,
        deciles: deciles(&active.times()[1..], connect_start),
        rss_before,
        rss_after,
        peer_rss_before: peer_before.rss,
        peer_rss_after: peer_after.rss,
        active_objects: object_counts(&active_stats),
        active_cm_connections: active_cm,
        peer_held: peer_after.clone(),
        idle: cfg.idle,
        idle_cpu: cpu1.saturating_sub(cpu0),
        peer_idle_cpu: peer_cpu1.saturating_sub(peer_cpu0),
        ping_one_us,
        ping_all_us,
        disconnect: None,
        close: Duration::ZERO,
        left_live: 0,
        peer_close: None,
        kill: None,
        peer_errors: peer_after.errors,
        active_errors: active.errors(),
    };
    if cfg.kill_listener {
        let bound = active.retry_bound()?;
        peer.kill()?;
        let dead = active.send_to_the_dead()?;
        let pick = |q: usize| {
            dead.each
                .get((dead.each.len() * q / 100).min(dead.each.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        report.kill = Some(KillReport {
            took: dead.took,
            statuses: dead.statuses.clone(),
            bound,
            each_median: pick(50),
            each_max: dead.each.last().copied().unwrap_or_default(),
        });
    } else {
        report.disconnect = Some(active.disconnect_all()?);
        let after = peer.report()?;
        report.peer_errors = after.errors;
        report.mads_teardown = Some((
            active.end.mads_sent() - mads_connect.0,
            after.mads_sent - mads_connect.1,
        ));
        report.peer_close = Some(peer.close()?);
    }
    report.active_errors = active.errors();
    let (close, stats) = active.end.close()?;
    report.close = close;
    report.left_live = stats.total_live() as u64;
    drop(providers);
    Ok(report)
}

/// Asks the listening end for its report until `done` holds (bounded by
/// [`WAIT`]).
fn wait_for_peer(peer: &mut Peer, done: impl Fn(&PeerReport) -> bool) -> BenchResult<PeerReport> {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = peer.report()?;
        if done(&r) || r.errors > 0 {
            return Ok(r);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the listener established {} of the connections in {WAIT:?}",
                r.established
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A ping-pong of `iters` round trips on the first connection: median, us.
fn ping(active: &mut Active, peer: &mut Peer, iters: u32) -> BenchResult<f64> {
    let run = peer.echo(iters)?;
    let rtt = active.ping(iters);
    let echoed = peer.echo_done(run);
    let rtt = rtt?;
    echoed?;
    Ok(rtt)
}

/// Live objects by kind name.
fn object_counts(stats: &al::Stats) -> Vec<(String, u64)> {
    (1..=u8::MAX)
        .map_while(al::Kind::from_id)
        .filter(|&k| stats.live(k) > 0)
        .map(|k| (k.to_string(), stats.live(k) as u64))
        .collect()
}
