//! `ibal perf send-lat --flood`: the RC SEND ping-pong of `send-lat`
//! between two RoCEv2 ports on loopback while a stranger on a third
//! loopback address (127.0.0.77, neither port's) floods the receiving
//! port with 1000-byte datagrams whose ICRC is wrong, at full speed, and
//! the same ping-pong without the flood, in one run (issue 26: target,
//! median under flood <= 2x quiet).
//!
//! Two floods: at the connection (RC SEND headers naming the live QP,
//! which the receive stage refuses on the source address before any CRC)
//! and at QP1 (UD SEND headers with the GSI Q_Key, which any host may
//! send: the stage computes the ICRC and refuses it, and the identification
//! solver runs only within its first-contact budget). And the raw UDP
//! baseline of `send-lat` (busy-polled, 80-byte datagrams) quiet and under
//! the same flood, whose echo drops the flood's datagrams by their source
//! address: what the flood costs any UDP program on this machine.
//!
//! Every flood is bounded: it stops when its ping-pong ends, and at the
//! latest after [`FLOOD_MAX_TIME`] or [`FLOOD_MAX_DATAGRAMS`].

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::wire::{Bth, Deth, Endpoints, Headers, Opcode, Packet};
use ibal::roce::PortCounters;

use super::placement::{pin_this_thread, three_cpus, two_cpus};
use super::udp::{pingpong_pair, roce_pingpong_on, udp_pair, udp_pingpong_on, Pair, Target};
use super::{json_f64, BenchResult};

/// The stranger's address.
pub const STRANGER: &str = "127.0.0.77";
/// UDP payload of each flood datagram.
pub const FLOOD_DATAGRAM: usize = 1000;
/// A flood stops by itself after this long...
pub const FLOOD_MAX_TIME: Duration = Duration::from_secs(120);
/// ... or this many datagrams.
pub const FLOOD_MAX_DATAGRAMS: u64 = 200_000_000;
/// The target: median round trip under flood over quiet.
pub const TARGET_RATIO: f64 = 2.0;

/// What a flood aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodKind {
    /// RC SEND headers naming the ping-pong's QP on the receiving port.
    Connection,
    /// UD SEND headers naming QP1 with the GSI Q_Key.
    Gsi,
}

impl FloodKind {
    fn name(self) -> &'static str {
        match self {
            FloodKind::Connection => "at the connection's QP",
            FloodKind::Gsi => "at QP1 (GSI)",
        }
    }
    fn key(self) -> &'static str {
        match self {
            FloodKind::Connection => "qp",
            FloodKind::Gsi => "gsi",
        }
    }
}

/// One flooded ping-pong, with what the receiving port saw meanwhile.
#[derive(Debug, Clone)]
pub struct FloodRun {
    /// What the flood aimed at.
    pub kind: FloodKind,
    /// Median and mean round trip, us.
    pub median_us: f64,
    /// Mean round trip, us.
    pub mean_us: f64,
    /// Flood datagrams sent per second.
    pub flood_per_sec: f64,
    /// The receiving port's counters over the run (differences).
    pub port: PortCounters,
    /// Retransmissions by the pinging end over the run: pings (or
    /// answers' ACKs) the flood made the kernel drop cost a transport
    /// timeout each.
    pub sender_retries: u64,
    /// Resident memory before and after the run, KiB.
    pub rss_kib: (u64, u64),
}

/// `perf send-lat --flood`.
#[derive(Debug, Clone)]
pub struct FloodReport {
    /// Round trips per contender.
    pub iters: u32,
    /// CPUs of the two polling threads (pinned), or None.
    pub cpus: Option<[usize; 2]>,
    /// The flood's CPU (pinned), or None.
    pub flood_cpu: Option<usize>,
    /// The RoCE ping-pong without a flood: median, mean, us.
    pub quiet: (f64, f64),
    /// The RoCE ping-pong under each flood.
    pub floods: Vec<FloodRun>,
    /// The raw UDP ping-pong (busy-polled) quiet and under a flood of its
    /// receiving socket: medians, us, and the flood's rate.
    pub udp: (f64, f64, f64),
}

impl FloodReport {
    /// Each flooded median over the quiet one.
    pub fn ratios(&self) -> Vec<f64> {
        self.floods
            .iter()
            .map(|f| f.median_us / self.quiet.0)
            .collect()
    }
    /// Whether every flood kept the median within [`TARGET_RATIO`].
    pub fn met(&self) -> bool {
        self.ratios().iter().all(|r| *r <= TARGET_RATIO)
    }

    /// A table.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf send-lat --flood: 64-byte RC SEND ping-pong between two RoCEv2 ports on loopback,\n\
             quiet and while {STRANGER} floods the receiving port with {FLOOD_DATAGRAM}-byte datagrams\n\
             (wrong ICRC) at full speed; {} round trips each; polling threads {}\n\n\
             {:>34} {:>10} {:>10} {:>12} {:>8}\n\
             {:>34} {:>10.2} {:>10.2} {:>12} {:>8}\n",
            self.iters,
            match (self.cpus, self.flood_cpu) {
                (Some([a, b]), Some(f)) if a == b => format!("both pinned to CPU {a}, the flood to CPU {f}"),
                (Some([a, b]), Some(f)) => format!("pinned to CPUs {a} and {b}, the flood to CPU {f}"),
                _ => "not pinned".into(),
            },
            "",
            "median us",
            "mean us",
            "flood dgrams/s",
            "ratio",
            "RoCEv2 quiet",
            self.quiet.0,
            self.quiet.1,
            "-",
            "1.00"
        );
        for (f, r) in self.floods.iter().zip(self.ratios()) {
            out += &format!(
                "{:>34} {:>10.2} {:>10.2} {:>12.0} {:>8.2}\n",
                format!("RoCEv2, flood {}", f.kind.name()),
                f.median_us,
                f.mean_us,
                f.flood_per_sec,
                r
            );
        }
        out += &format!(
            "{:>34} {:>10.2}\n{:>34} {:>10.2} {:>10} {:>12.0} {:>8.2}\n\n",
            "raw UDP polled, quiet",
            self.udp.0,
            "raw UDP polled, flooded",
            self.udp.1,
            "",
            self.udp.2,
            self.udp.1 / self.udp.0
        );
        for f in &self.floods {
            let c = &f.port;
            out += &format!(
                "flood {}: the receiving port took {} datagrams: {} delivered to QPs, dropped {} wrong source, \
                 {} bad ICRC, {} ICRC unsolved (solver budget spent); retransmissions {} + {}; resident memory {} -> {} KiB\n",
                f.kind.name(),
                c.rx_datagrams,
                c.rx_packets,
                c.rx_wrong_source,
                c.rx_bad_icrc,
                c.rx_icrc_unsolved,
                f.sender_retries,
                c.retries,
                f.rss_kib.0,
                f.rss_kib.1
            );
        }
        out += &format!(
            "\nratio under flood (median, vs quiet): {} (target <= {TARGET_RATIO}x): {}\n",
            self.ratios()
                .iter()
                .map(|r| format!("{r:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
            if self.met() { "met" } else { "NOT met" }
        );
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let floods: Vec<String> = self
            .floods
            .iter()
            .zip(self.ratios())
            .map(|(f, r)| {
                format!(
                    "{{\"target\":\"{}\",\"median_us\":{},\"mean_us\":{},\"flood_per_sec\":{},\"ratio\":{},\
                     \"rx_datagrams\":{},\"rx_packets\":{},\"rx_wrong_source\":{},\"rx_bad_icrc\":{},\
                     \"rx_icrc_unsolved\":{},\"rx_ipv4_id_solved\":{},\"retries\":{},\"sender_retries\":{},\
                     \"rss_kib_before\":{},\"rss_kib_after\":{}}}",
                    f.kind.key(),
                    json_f64(f.median_us, 3),
                    json_f64(f.mean_us, 3),
                    json_f64(f.flood_per_sec, 0),
                    json_f64(r, 4),
                    f.port.rx_datagrams,
                    f.port.rx_packets,
                    f.port.rx_wrong_source,
                    f.port.rx_bad_icrc,
                    f.port.rx_icrc_unsolved,
                    f.port.rx_ipv4_id_solved,
                    f.port.retries,
                    f.sender_retries,
                    f.rss_kib.0,
                    f.rss_kib.1
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"send-lat\",\"mode\":\"flood\",\"transport\":\"udp\",\"iters\":{},\"pinned_cpus\":{},\"flood_cpu\":{},\
             \"quiet_median_us\":{},\"quiet_mean_us\":{},\"floods\":[{}],\"udp_quiet_median_us\":{},\
             \"udp_flood_median_us\":{},\"udp_flood_per_sec\":{},\"target_ratio\":{TARGET_RATIO},\"target_met\":{}}}",
            self.iters,
            self.cpus
                .map_or("null".to_string(), |[a, b]| format!("[{a},{b}]")),
            self.flood_cpu.map_or("null".to_string(), |f| f.to_string()),
            json_f64(self.quiet.0, 3),
            json_f64(self.quiet.1, 3),
            floods.join(","),
            json_f64(self.udp.0, 3),
            json_f64(self.udp.1, 3),
            json_f64(self.udp.2, 0),
            self.met()
        )
    }
}

/// A flood running on its own thread until dropped (or its bounds).
struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    started: Instant,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    /// Floods `to` from [`STRANGER`] with `datagram` (its ICRC wrong).
    fn start(to: SocketAddr, datagram: Vec<u8>, cpu: Option<usize>) -> BenchResult<Flood> {
        let sock = UdpSocket::bind((STRANGER, 0)).map_err(|e| format!("bind {STRANGER}: {e}"))?;
        let _ = socket2::SockRef::from(&sock).set_send_buffer_size(4 << 20);
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (flag, count) = (stop.clone(), sent.clone());
        let started = Instant::now();
        let thread = std::thread::Builder::new()
            .name("flood".into())
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin_this_thread(cpu);
                }
                let end = started + FLOOD_MAX_TIME;
                let mut n = 0u64;
                while n < FLOOD_MAX_DATAGRAMS && !flag.load(Ordering::Relaxed) {
                    // A full socket buffer refuses (ENOBUFS) or blocks: the
                    // flood goes on either way.
                    if sock.send_to(&datagram, to).is_ok() {
                        n += 1;
                    }
                    if n % 1024 == 0 {
                        count.store(n, Ordering::Relaxed);
                        if Instant::now() > end {
                            break;
                        }
                    }
                }
                count.store(n, Ordering::Relaxed);
            })
            .map_err(|e| format!("flood thread: {e}"))?;
        Ok(Flood {
            stop,
            sent,
            started,
            thread: Some(thread),
        })
    }

    /// Stops the flood; its rate, datagrams per second.
    fn finish(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.sent.load(Ordering::Relaxed) as f64 / self.started.elapsed().as_secs_f64()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A [`FLOOD_DATAGRAM`]-byte RoCEv2 packet from [`STRANGER`] to `to`
/// aimed as `kind` says (`qpn`: the connection's QP), its ICRC wrong.
fn flood_datagram(kind: FloodKind, to: SocketAddr, qpn: u32) -> BenchResult<Vec<u8>> {
    let headers = match kind {
        FloodKind::Connection => Headers::new(Bth::new(Opcode::RcSendOnly, qpn, 0)),
        FloodKind::Gsi => {
            let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, 1, 0));
            h.deth = Some(Deth {
                qkey: provider::GSI_QKEY,
                src_qp: 1,
            });
            h
        }
    };
    let payload = vec![0xa5; FLOOD_DATAGRAM - headers.encoded_len() - ibal::roce::wire::ICRC_LEN];
    let from: SocketAddr = SocketAddr::new(STRANGER.parse().expect("literal"), 9);
    let ep = Endpoints::new(from, to).map_err(|e| e.to_string())?;
    let mut bytes = Packet::new(headers, &payload)
        .encode(&ep)
        .map_err(|e| e.to_string())?;
    if let Some(last) = bytes.last_mut() {
        *last ^= 0xff;
    }
    Ok(bytes)
}

/// Resident memory of this process, KiB (0 where /proc is missing).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// End `end`'s port counters (1: the receiving end).
fn counters(pair: &Pair, end: usize) -> BenchResult<PortCounters> {
    let ca = pair
        .al
        .resolve(pair.ends[end].ca)
        .map_err(|e| format!("resolve CA: {e}"))?;
    match ca.device() {
        hca::any::AnyDevice::Roce(d) => d.port_counters(1).ok_or_else(|| "no port 1".into()),
        #[allow(unreachable_patterns)]
        _ => Err("not a RoCEv2 device".into()),
    }
}

/// Runs `send-lat --flood`: `iters` round trips quiet, under each flood,
/// and the raw UDP baseline quiet and flooded.
///
/// Placement (`pin`): the flood has a CPU to itself, the ping-pong's two
/// polling threads one each of two others where the machine has three, or
/// share the other where it has two (these VMs), in every run, quiet or
/// not. The flood stands for a stranger on another host: its own work
/// (building and sending datagrams, and on loopback the kernel's receive
/// path up to the socket, which runs in the sender's context) is not the
/// victim's. On two CPUs a flood left free to share the pollers' CPUs
/// takes them for whole scheduler slices, and every contender (raw UDP
/// too) then waits milliseconds: that measures the machine, not the
/// code. Unpinned (`--no-pin`), it is shown as it is.
pub fn run_send_lat_flood(iters: u32, pin: bool) -> BenchResult<FloodReport> {
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let (pollers, flood_cpu) = match (pin, three_cpus(), two_cpus()) {
        (false, _, _) => (None, None),
        (true, Some([a, b, f]), _) => (Some([a, b]), Some(f)),
        (true, None, Some([p, f])) => (Some([p, p]), Some(f)),
        (true, None, None) => (None, None),
    };
    let (pair, sges) = pingpong_pair(&Target::Loopback)?;
    let victim = pair.ends[1]
        .addr
        .ok_or("the receiving end has no UDP address")?;
    let qpn = pair.ends[1]
        .qp
        .query(&pair.al)
        .map_err(|e| format!("query QP: {e}"))?
        .qpn;
    // The receiving port has a GSI QP (as a CM would open), so the flood
    // at QP1 reaches the ICRC check.
    let _gsi = gsi_qp(&pair)?;
    // Warm up, then quiet.
    roce_pingpong_on(&pair, sges, iters.min(1000), pollers)?;
    let quiet = roce_pingpong_on(&pair, sges, iters, pollers)?;
    let mut floods = Vec::new();
    for kind in [FloodKind::Connection, FloodKind::Gsi] {
        let before = counters(&pair, 1)?;
        let sender_before = counters(&pair, 0)?;
        let rss_before = rss_kib();
        let flood = Flood::start(victim, flood_datagram(kind, victim, qpn)?, flood_cpu)?;
        // Let the flood reach full speed first.
        std::thread::sleep(Duration::from_millis(200));
        let measured = roce_pingpong_on(&pair, sges, iters, pollers);
        let flood_per_sec = flood.finish();
        let (median_us, mean_us) = measured?;
        floods.push(FloodRun {
            kind,
            median_us,
            mean_us,
            flood_per_sec,
            port: counters(&pair, 1)?.since(&before),
            sender_retries: counters(&pair, 0)?.since(&sender_before).retries,
            rss_kib: (rss_before, rss_kib()),
        });
    }
    drop(pair);
    let (a, b) = udp_pair()?;
    let (udp_quiet, _) = udp_pingpong_on(a, b, iters, true, pollers)?;
    let (a, b) = udp_pair()?;
    let to = b.local_addr().map_err(|e| e.to_string())?;
    let flood = Flood::start(to, vec![0x5a; FLOOD_DATAGRAM], flood_cpu)?;
    std::thread::sleep(Duration::from_millis(200));
    let measured = udp_pingpong_on(a, b, iters, true, pollers);
    let udp_rate = flood.finish();
    let (udp_flood, _) = measured?;
    Ok(FloodReport {
        iters,
        cpus: pollers,
        flood_cpu,
        quiet,
        floods,
        udp: (udp_quiet, udp_flood, udp_rate),
    })
}

/// A CM agent on the receiving end's CA: its GSI QP (QP1) on the port,
/// in RTS with receives posted, as any CM user has.
fn gsi_qp(pair: &Pair) -> BenchResult<Vec<Handle<cep::cm::CmPort>>> {
    cep::cm::attach_ca(pair.al.instance(), pair.ends[1].ca)
        .map_err(|e| format!("attach the CM: {e}"))
}
