//! `ibal perf conn-rate --transport udp`: how fast the CM connects two RC
//! QPs between two RoCEv2 ports over real UDP sockets, against the UDP
//! round trip of one MAD-sized datagram between the same two addresses,
//! measured in the same run.
//!
//! One AL instance; one [`RoceProvider`](ibal::roce::RoceProvider) with two devices, one port each,
//! on [`ADDRS`](crate::conn::udp::ADDRS) (127.0.0.1 and 127.0.0.2, ephemeral UDP ports that the
//! provider's directory resolves); the CM attached to both ports; an
//! rdma_cm-style listen (`cep::ip`) on 127.0.0.2:[`LISTEN_PORT`](crate::conn::udp::LISTEN_PORT) whose
//! request callback accepts on the passive QP reserved for the requesting
//! active QP; the active side connects by address (a REQ with rdma_cm's
//! header, LAN timers) and answers the REP with `rtu`. Every CM message is
//! a 256-byte MAD in a RoCEv2 UD SEND to QP1: 280 bytes of UDP payload
//! (BTH 12 + DETH 8 + MAD 256 + ICRC 4).
//!
//! The rounds, the batches, the legs and the REQ -> REJ probes (to
//! 127.0.0.2:[`UNLISTENED_PORT`](crate::conn::udp::UNLISTENED_PORT): the peer's CM answers REJ "invalid
//! service ID") are those of the soft-fabric mode (`super`), on the same
//! code.
//!
//! # The floor: one datagram's UDP round trip, blocking to blocking
//!
//! Two plain UDP sockets on the same two addresses; A sends a 280-byte
//! datagram to B, a thread blocked in `recv_from` on B sends it back, and
//! A's thread, blocked in `recv_from`, takes it: two thread wake-ups per
//! round trip. That is how the CM waits: the provider's receive threads
//! block on their sockets, the CM agent threads and the AL executor on
//! condition variables. The target ratio uses this floor. A busy-polled
//! floor (non-blocking sockets polled with a yield between tries, no
//! wake-up) is shown for context: it is the wire and the kernel's UDP path
//! alone. Both are sampled inside every round, between the connections.
//!
//! The blocking floor's two threads share one CPU: its echo thread is
//! spawned by the measuring thread and the kernel keeps a ping-pong pair
//! together, so each wake-up is a switch on that CPU. The CM's threads (the
//! two ports' receive threads, the executor, the measuring thread) are not
//! kept together, and a wake-up of a thread whose CPU is idle costs much
//! more on a VM (the hypervisor must wake the halted vCPU). So a third
//! floor, for context, pins the two ends to two CPUs: the same blocking
//! round trip with both wake-ups crossing CPUs.
//!
//! # What the exchange costs before the CM: busy-polled contexts
//!
//! In the polled mode's rounds (the measuring thread busy-polls there
//! anyway), two more samples per connection: a 256-byte MAD's round trip
//! between UD QPs of the two RoCEv2 ports (the provider's datagram path),
//! and the bare exchange (`super::bare`): REQ, REP and RTU encoded,
//! sent, received and decoded, and both QPs moved to RTS with the CM's own
//! attributes, with no CEP, comm id, table, timer or callback. Its ratio to
//! the floor bounds from below what any CM on this provider can reach.
//!
//! Aim (issue 15): median threaded connect <= [`TARGET_RATIO`] x the
//! blocking floor; the exchange itself is REQ, REP and RTU, 1.5 round
//! trips.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cep::cm::CmDrive;

use super::bare::{Route, UdPair};
use super::bench::{Bench, Net};
use super::config::{ConnRateConfig, GRH_SIZE, MAD_SIZE};
use super::report::{name_key, row, us, Dist, ModeFigures};
pub use super::roce_ports::{ADDRS, GUIDS, LISTEN_PORT, UNLISTENED_PORT};
use super::rounds::{run_rounds, Floor};
use crate::{al_err, json_f64, BenchResult};

/// Aim: median threaded connect / blocking UDP round trip at most this.
pub const TARGET_RATIO: f64 = 2.5;
/// UDP payload of one CM MAD in RoCEv2: BTH, DETH, the MAD, ICRC.
pub const DATAGRAM: usize = 12 + 8 + MAD_SIZE + 4;
/// Floor round trips (of each kind) per serial connection.
const FLOOR_RTTS_PER_CONNECTION: usize = 20;
/// Longest a floor receive may wait before the run fails.
const FLOOR_WAIT: Duration = Duration::from_secs(5);

// -------------------------------------------------------------- the floor --

/// Two UDP sockets on [`ADDRS`] (ephemeral ports).
struct UdpFloor {
    a: UdpSocket,
    b: UdpSocket,
}

impl UdpFloor {
    fn open() -> BenchResult<UdpFloor> {
        let bind = |ip: IpAddr| -> BenchResult<UdpSocket> {
            let s = UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"))?;
            s.set_read_timeout(Some(FLOOR_WAIT))
                .map_err(|e| e.to_string())?;
            Ok(s)
        };
        Ok(UdpFloor {
            a: bind(ADDRS[0])?,
            b: bind(ADDRS[1])?,
        })
    }

    /// `k` round trips of a [`DATAGRAM`]-byte datagram A -> B -> A, each
    /// timed; blocking receives on both sides, or (`busy`) non-blocking
    /// receives polled with a yield between tries.
    fn round_trips(&self, k: usize, busy: bool) -> BenchResult<Vec<f64>> {
        self.round_trips_on(k, busy, None)
    }

    /// [`Self::round_trips`] with A's end (this thread) and B's (the echo
    /// thread) pinned to `cpus[0]` and `cpus[1]`; this thread gets its
    /// CPUs back afterwards.
    fn round_trips_on(
        &self,
        k: usize,
        busy: bool,
        cpus: Option<[usize; 2]>,
    ) -> BenchResult<Vec<f64>> {
        for s in [&self.a, &self.b] {
            s.set_nonblocking(busy).map_err(|e| e.to_string())?;
        }
        let b_addr = self.b.local_addr().map_err(|e| e.to_string())?;
        std::thread::scope(|scope| {
            let echo = scope.spawn(|| -> BenchResult<()> {
                if let Some([_, cpu]) = cpus {
                    crate::placement::pin_this_thread(cpu);
                }
                let mut buf = [0u8; 2048];
                for _ in 0..k {
                    let (n, from) =
                        recv_one(&self.b, &mut buf, busy).map_err(|e| format!("echo: {e}"))?;
                    self.b
                        .send_to(&buf[..n], from)
                        .map_err(|e| format!("echo send: {e}"))?;
                }
                Ok(())
            });
            let msg = [0x5au8; DATAGRAM];
            let mut buf = [0u8; 2048];
            let mut out = Vec::with_capacity(k);
            let run = || -> BenchResult<()> {
                for _ in 0..k {
                    let t0 = Instant::now();
                    self.a
                        .send_to(&msg, b_addr)
                        .map_err(|e| format!("floor send: {e}"))?;
                    let (n, _) =
                        recv_one(&self.a, &mut buf, busy).map_err(|e| format!("floor: {e}"))?;
                    out.push(us(t0.elapsed()));
                    if n != DATAGRAM {
                        return Err(format!("the floor's echo has {n} bytes, not {DATAGRAM}"));
                    }
                }
                Ok(())
            };
            let r = crate::placement::on_cpu(cpus.map(|c| c[0]), run);
            let e = echo
                .join()
                .map_err(|_| "the floor's echo thread panicked".to_string())?;
            r.and(e).map(|()| out)
        })
    }
}

/// One datagram: a blocking receive, or a non-blocking one polled with a
/// yield between tries; either gives up after [`FLOOR_WAIT`].
fn recv_one(s: &UdpSocket, buf: &mut [u8], busy: bool) -> std::io::Result<(usize, SocketAddr)> {
    let end = Instant::now() + FLOOR_WAIT;
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

// ----------------------------------------------------------------- report --

/// One drive mode over UDP.
#[derive(Clone, Debug)]
pub struct UdpModeFigures {
    /// What the rounds measured (legs, throughput, probes, MADs).
    pub figures: ModeFigures,
    /// MADs the agents received (both ports).
    pub cm_mads_received: u64,
    /// Agent rounds served inline by the thread that delivered a MAD (the
    /// provider's receive thread) instead of a woken agent thread.
    pub served_inline: u64,
    /// Naps of the two ports' receive threads (`rx_thread_naps`: they
    /// stepped aside for a busy-polling application). The polled CM's
    /// measuring thread busy-polls; in the threaded CM nothing does, and
    /// a nap there is a MAD waiting in a socket for 100 us or more.
    pub receive_thread_naps: u64,
}

/// Everything one `conn-rate --transport udp` run measured.
#[derive(Clone, Debug)]
pub struct UdpConnRateReport {
    /// The settings.
    pub config: ConnRateConfig,
    /// The default CM: agent threads and an executor thread.
    pub threaded: Option<UdpModeFigures>,
    /// The polled CM: the measuring thread drives agents and callbacks;
    /// while it polls, it also takes the datagrams from the sockets (the
    /// provider's receive threads step aside: `receive_thread_naps`).
    pub polled: Option<UdpModeFigures>,
    /// The floor: UDP round trip, blocking receives on both sides.
    pub udp_rtt: Dist,
    /// Context: UDP round trip, busy-polled receives.
    pub udp_rtt_busy: Dist,
    /// Context: mpsc round trip through an echo thread (two wake-ups).
    pub thread_echo_rtt: Dist,
    /// Context: the blocking UDP round trip with its two ends pinned to
    /// two CPUs (both wake-ups cross CPUs); `None` when the process may
    /// use only one CPU.
    pub udp_rtt_apart: Option<Dist>,
    /// Context: a 256-byte MAD's round trip between UD QPs of the two
    /// RoCEv2 ports, busy-polled (the provider's datagram path alone).
    /// Sampled in the polled mode's rounds only (busy-polling makes the
    /// receive threads step aside, which the threaded CM must not see);
    /// `None` without it.
    pub roce_ud_rtt: Option<Dist>,
    /// Context: the bare exchange over the two RoCEv2 ports
    /// (`UdPair::bare_connect`: REQ, REP, RTU through the codec and the
    /// QP transitions, busy-polled, no CM object, table, timer or
    /// callback): what any CM on this provider pays before its own work.
    /// Polled mode only, like [`Self::roce_ud_rtt`].
    pub bare_connect: Option<Dist>,
}

impl UdpConnRateReport {
    /// Median threaded connect over the blocking UDP round trip (NaN when
    /// the threaded mode was not measured). The aim applies here.
    pub fn ratio(&self) -> f64 {
        self.threaded.as_ref().map_or(f64::NAN, |m| {
            m.figures.connect.median_us / self.udp_rtt.median_us
        })
    }

    /// Median polled connect over the blocking UDP round trip (NaN when not
    /// measured).
    pub fn ratio_polled(&self) -> f64 {
        self.polled.as_ref().map_or(f64::NAN, |m| {
            m.figures.connect.median_us / self.udp_rtt.median_us
        })
    }

    /// Whether [`Self::ratio`] is at most [`TARGET_RATIO`].
    pub fn target_met(&self) -> bool {
        self.ratio() <= TARGET_RATIO
    }

    /// Human-readable table.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "perf conn-rate --transport udp: RC connect through the CM (REQ, REP, RTU as 256-byte\n\
             MADs in {DATAGRAM}-byte RoCEv2 datagrams to QP1) between two RoCEv2 ports on {} and {},\n\
             vs the UDP round trip of one {DATAGRAM}-byte datagram between the same addresses\n\
             ({} serial connections, {} batches of {} in flight, per drive mode)\n\n",
            ADDRS[0], ADDRS[1], c.connections, c.batches, c.in_flight
        );
        out.push_str(&format!(
            "  {:<52} {:>8} {:>11} {:>11}\n",
            "measurement", "samples", "median us", "p99 us"
        ));
        out.push_str(&row(
            "floor: UDP round trip, blocking recv both sides",
            &self.udp_rtt,
        ));
        out.push_str(&row(
            "context: UDP round trip, busy-polled recv",
            &self.udp_rtt_busy,
        ));
        out.push_str(&row(
            "context: mpsc round trip via an echo thread",
            &self.thread_echo_rtt,
        ));
        if let Some(apart) = &self.udp_rtt_apart {
            out.push_str(&row(
                "context: UDP round trip, blocking, ends on 2 CPUs",
                apart,
            ));
        }
        if let (Some(ud), Some(bare)) = (&self.roce_ud_rtt, &self.bare_connect) {
            out.push_str(&row("context: RoCEv2 UD MAD round trip, busy-polled", ud));
            out.push_str(&row(
                "context: bare REQ/REP/RTU + QP transitions, no CM",
                bare,
            ));
            out.push_str(&format!(
                "  (bare exchange / blocking UDP round trip: {:.2}x, / busy-polled: {:.2}x: the\n   \
                 exchange over this provider, busy-polled, before any CM object, table, timer or callback)\n",
                bare.median_us / self.udp_rtt.median_us,
                bare.median_us / self.udp_rtt_busy.median_us,
            ));
        }
        let one_way = self.udp_rtt.median_us / 2.0;
        for m in [&self.threaded, &self.polled].into_iter().flatten() {
            let f = &m.figures;
            out.push('\n');
            out.push_str(match f.drive {
                CmDrive::Thread => {
                    "threaded CM (the default: agents served inline on the provider's receive\n\
                     threads, else an agent thread; callbacks on the AL's executor thread)\n"
                }
                CmDrive::Poll => {
                    "polled CM (CmDrive::Poll and a manual-executor AL driven by the measuring\n\
                     thread, which also takes the datagrams while it polls: the provider's\n\
                     receive threads step aside)\n"
                }
            });
            out.push_str(&row("connect -> ESTABLISHED on both sides", &f.connect));
            out.push_str(&row("REQ -> REJ through both CM agents", &f.rej_rtt));
            out.push_str(&format!(
                "  legs of a serial connect (median; over one way = half the blocking floor, {one_way:.1} us):\n"
            ));
            for (i, (name, leg)) in f.legs.iter().enumerate() {
                // The first three legs each carry one MAD one way; the
                // last is a local event.
                let extra = if i < 3 {
                    format!("  (+{:.1} over one way)", leg - one_way)
                } else {
                    String::new()
                };
                out.push_str(&format!("    {name:<70} {leg:>9.2} us{extra}\n"));
            }
            out.push_str(&format!(
                "  throughput: {:.0} connections/s with {} in flight (best batch {:.0}/s; serial median alone: {:.0}/s)\n",
                f.conns_per_sec,
                c.in_flight,
                f.best_batch_conns_per_sec,
                f.serial_conns_per_sec()
            ));
            out.push_str(&format!(
                "  median connect / blocking UDP round trip: {:.2}x; / busy-polled: {:.2}x; / REQ->REJ: {:.2}x\n",
                f.connect.median_us / self.udp_rtt.median_us,
                f.connect.median_us / self.udp_rtt_busy.median_us,
                f.connect.median_us / f.rej_rtt.median_us,
            ));
            out.push_str(&format!(
                "  CM MADs sent {}, received {}; agent rounds served inline {}; QP1 datagrams dropped for want of a receive: {} ({} inside timed windows)\n",
                f.cm_mads_sent,
                m.cm_mads_received,
                m.served_inline,
                f.dropped_no_recv,
                f.dropped_no_recv_timed
            ));
            out.push_str(&format!(
                "  receive-thread naps (stepping aside for a busy poller): {}\n",
                m.receive_thread_naps
            ));
        }
        out.push('\n');
        if self.threaded.is_some() {
            out.push_str(&format!(
                "median threaded connect / blocking UDP round trip: {:.2}x (aim <= {TARGET_RATIO:.1}x; the exchange is 1.5 round trips): {}\n",
                self.ratio(),
                if self.target_met() { "met" } else { "NOT met" }
            ));
        } else {
            out.push_str(
                "the threaded mode, which the aim is judged on, was not measured (--mode)\n",
            );
        }
        if self.polled.is_some() {
            out.push_str(&format!(
                "median polled connect / blocking UDP round trip: {:.2}x\n",
                self.ratio_polled()
            ));
        }
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let c = &self.config;
        let head = self.threaded.as_ref().map_or((f64::NAN, f64::NAN), |m| {
            (m.figures.connect.median_us, m.figures.connect.p99_us)
        });
        let mut s = format!(
            "{{\"benchmark\":\"conn-rate\",\"transport\":\"udp\",\"connections\":{},\"in_flight\":{},\
             \"batches\":{},\"datagram_bytes\":{DATAGRAM},\
             \"connect_median_us\":{},\"connect_p99_us\":{},\
             \"udp_rtt_median_us\":{},\"udp_rtt_p99_us\":{},\"udp_rtt_samples\":{},\
             \"udp_rtt_busy_median_us\":{},\"udp_rtt_busy_p99_us\":{},\
             \"thread_echo_rtt_median_us\":{},\"thread_echo_rtt_p99_us\":{},\
             \"udp_rtt_apart_median_us\":{},\"udp_rtt_apart_p99_us\":{},\
             \"roce_ud_rtt_median_us\":{},\"bare_connect_median_us\":{},\"bare_connect_p99_us\":{},\
             \"ratio_connect_vs_udp_rtt\":{},\"ratio_polled_connect_vs_udp_rtt\":{},\
             \"target_ratio\":{},\"target_met\":{}",
            c.connections,
            c.in_flight,
            c.batches,
            json_f64(head.0, 3),
            json_f64(head.1, 3),
            json_f64(self.udp_rtt.median_us, 3),
            json_f64(self.udp_rtt.p99_us, 3),
            self.udp_rtt.n,
            json_f64(self.udp_rtt_busy.median_us, 3),
            json_f64(self.udp_rtt_busy.p99_us, 3),
            json_f64(self.thread_echo_rtt.median_us, 3),
            json_f64(self.thread_echo_rtt.p99_us, 3),
            json_f64(self.udp_rtt_apart.as_ref().map_or(f64::NAN, |d| d.median_us), 3),
            json_f64(self.udp_rtt_apart.as_ref().map_or(f64::NAN, |d| d.p99_us), 3),
            json_f64(self.roce_ud_rtt.as_ref().map_or(f64::NAN, |d| d.median_us), 3),
            json_f64(self.bare_connect.as_ref().map_or(f64::NAN, |d| d.median_us), 3),
            json_f64(self.bare_connect.as_ref().map_or(f64::NAN, |d| d.p99_us), 3),
            json_f64(self.ratio(), 3),
            json_f64(self.ratio_polled(), 3),
            json_f64(TARGET_RATIO, 3),
            self.target_met(),
        );
        for m in [&self.threaded, &self.polled].into_iter().flatten() {
            let f = &m.figures;
            let p = f.name();
            let legs: Vec<String> = f
                .legs
                .iter()
                .map(|(name, us)| format!("\"{}\":{}", name_key(name), json_f64(*us, 3)))
                .collect();
            s.push_str(&format!(
                ",\"{p}_connect_median_us\":{},\"{p}_connect_p99_us\":{},\"{p}_legs_median_us\":{{{}}},\
                 \"{p}_conns_per_sec\":{},\"{p}_best_batch_conns_per_sec\":{},\"{p}_serial_conns_per_sec\":{},\
                 \"{p}_rej_rtt_median_us\":{},\"{p}_rej_rtt_p99_us\":{},\"{p}_cm_mads_sent\":{},\
                 \"{p}_cm_mads_received\":{},\"{p}_served_inline\":{},\"{p}_dropped_no_recv\":{},\
                 \"{p}_dropped_no_recv_timed\":{},\"{p}_receive_thread_naps\":{}",
                json_f64(f.connect.median_us, 3),
                json_f64(f.connect.p99_us, 3),
                legs.join(","),
                json_f64(f.conns_per_sec, 3),
                json_f64(f.best_batch_conns_per_sec, 3),
                json_f64(f.serial_conns_per_sec(), 3),
                json_f64(f.rej_rtt.median_us, 3),
                json_f64(f.rej_rtt.p99_us, 3),
                f.cm_mads_sent,
                m.cm_mads_received,
                m.served_inline,
                f.dropped_no_recv,
                f.dropped_no_recv_timed,
                m.receive_thread_naps,
            ));
        }
        s.push('}');
        s
    }
}

// -------------------------------------------------------------------- run --

/// How the bench's two RoCEv2 ports reach each other: by GID, with the
/// permissive LID in the REQ's path as the CM writes it on RoCE.
fn roce_route(bench: &Bench) -> BenchResult<Route> {
    let Net::Udp { cas, .. } = &bench.net else {
        return Err("the bench is not on RoCEv2 ports".into());
    };
    let mut gids = [[0u8; 16]; 2];
    let mut path_mtu = provider::Mtu::Mtu4096;
    for (gid, ca) in gids.iter_mut().zip(cas) {
        let port = bench
            .al
            .resolve(*ca)
            .and_then(|ca| ca.port(1))
            .map_err(al_err("querying a RoCEv2 port"))?;
        *gid = *port.gid_table.first().ok_or("a RoCEv2 port with no GID")?;
        path_mtu = path_mtu.min(port.active_mtu);
    }
    Ok(Route {
        lids: [0xFFFF; 2],
        gids: Some(gids),
        path_mtu,
    })
}

/// Agent counters of both ports: (MADs received, rounds served inline).
fn agent_counters(bench: &Bench) -> (u64, u64) {
    bench
        .ports
        .iter()
        .filter_map(|p| bench.al.resolve(*p).ok().map(|p| p.stats()))
        .fold((0, 0), |(r, i), s| {
            (r + s.mads_received, i + s.served_inline)
        })
}

/// The UDP run's own samples, beside the soft run's [`Floor`] (the blocking
/// floor, the echo and the bare exchange), gathered over both modes.
#[derive(Default)]
struct UdpSamples {
    /// UDP round trips, busy-polled.
    busy: Vec<f64>,
    /// UDP round trips, blocking, ends pinned to two CPUs.
    apart: Vec<f64>,
    /// RoCEv2 UD MAD round trips, busy-polled (polled mode only).
    roce_ud: Vec<f64>,
}

fn measure(
    cfg: &ConnRateConfig,
    drive: CmDrive,
    floor: &mut Floor,
    udp: &UdpFloor,
    samples: &mut UdpSamples,
) -> BenchResult<UdpModeFigures> {
    let cpus = crate::placement::two_cpus();
    let bench = Bench::open_on(drive, true)?;
    // The busy-polled contexts, in the polled mode only.
    let ud = match drive {
        CmDrive::Poll => Some(UdPair::open(&bench, roce_route(&bench)?)?),
        CmDrive::Thread => None,
    };
    let mut wc = [provider::Wc::default()];
    if let Some(ud) = &ud {
        // Warm up the UD pair and check that the payload arrived whole.
        ud.round_trip(&bench.al, &mut wc)?;
        if ud.bufs[1].to_vec()[MAD_SIZE + GRH_SIZE..] != ud.bufs[0].to_vec()[..MAD_SIZE] {
            return Err("the RoCEv2 UD SEND did not deliver its 256 bytes".into());
        }
    }
    let before = agent_counters(&bench);
    let naps = || bench.roce_ports_sum(|c| c.rx_thread_naps);
    let naps_before = naps();
    let figures = run_rounds(cfg, &bench, |bench, qps, n| {
        floor
            .mad
            .extend(udp.round_trips(n * FLOOR_RTTS_PER_CONNECTION, false)?);
        let k = n * FLOOR_RTTS_PER_CONNECTION;
        samples.busy.extend(udp.round_trips(k, true)?);
        if cpus.is_some() {
            samples.apart.extend(udp.round_trips_on(k, false, cpus)?);
        }
        for _ in 0..n {
            floor.echo.push(us(floor.echo_rtt()?));
        }
        let Some(ud) = &ud else {
            return Ok(());
        };
        for _ in 0..n * FLOOR_RTTS_PER_CONNECTION {
            samples.roce_ud.push(us(ud.round_trip(&bench.al, &mut wc)?));
        }
        ud.sample_bare(bench, qps, n, &mut floor.bare)?;
        Ok(())
    })?;
    drop(ud);
    let after = agent_counters(&bench);
    let receive_thread_naps = naps() - naps_before;
    bench.close()?;
    Ok(UdpModeFigures {
        figures,
        cm_mads_received: after.0 - before.0,
        served_inline: after.1 - before.1,
        receive_thread_naps,
    })
}

/// Run conn-rate over UDP: the threaded CM, then the polled CM (as
/// `cfg.modes` asks), each on a fresh provider, with the floors sampled in
/// every round of both.
pub fn run(cfg: &ConnRateConfig) -> BenchResult<UdpConnRateReport> {
    cfg.validate()?;
    let (mut floor, echo) = Floor::start()?;
    let udp = UdpFloor::open()?;
    // Warm up both floors (and check the echo) before anything is timed.
    udp.round_trips(10, false)?;
    udp.round_trips(10, true)?;
    let mut samples = UdpSamples::default();
    let mut mode = |wanted: bool, drive| {
        wanted
            .then(|| measure(cfg, drive, &mut floor, &udp, &mut samples))
            .transpose()
    };
    let threaded = mode(cfg.modes.threaded(), CmDrive::Thread)?;
    let polled = mode(cfg.modes.polled(), CmDrive::Poll)?;
    let UdpSamples {
        busy,
        apart,
        roce_ud,
    } = samples;
    let Floor {
        mad,
        echo: echo_v,
        bare,
        ping,
        ..
    } = floor;
    drop(ping);
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())?;
    Ok(UdpConnRateReport {
        config: cfg.clone(),
        threaded,
        polled,
        udp_rtt: Dist::of(mad),
        udp_rtt_busy: Dist::of(busy),
        thread_echo_rtt: Dist::of(echo_v),
        udp_rtt_apart: (!apart.is_empty()).then(|| Dist::of(apart)),
        roce_ud_rtt: (!roce_ud.is_empty()).then(|| Dist::of(roce_ud)),
        bare_connect: (!bare.is_empty()).then(|| Dist::of(bare)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::super::balanced;
    use super::super::ConnModes;
    use super::*;

    #[test]
    fn a_tiny_udp_run_connects_over_roce_and_reports_the_floors() {
        let cfg = ConnRateConfig {
            connections: 4,
            in_flight: 3,
            batches: 2,
            modes: ConnModes::Both,
        };
        let r = run(&cfg).unwrap();
        // Both modes sample both floors in their rounds.
        assert_eq!(r.udp_rtt.n, 2 * 4 * FLOOR_RTTS_PER_CONNECTION);
        assert_eq!(r.udp_rtt_busy.n, 2 * 4 * FLOOR_RTTS_PER_CONNECTION);
        assert!(r.udp_rtt.median_us > 0.0 && r.udp_rtt_busy.median_us > 0.0);
        if crate::placement::two_cpus().is_some() {
            let apart = r.udp_rtt_apart.as_ref().expect("two CPUs: the apart floor");
            assert_eq!(apart.n, 2 * 4 * FLOOR_RTTS_PER_CONNECTION);
            assert!(apart.median_us > 0.0);
        }
        let (t, p) = (r.threaded.as_ref().unwrap(), r.polled.as_ref().unwrap());
        assert_eq!(t.figures.drive, CmDrive::Thread);
        assert_eq!(p.figures.drive, CmDrive::Poll);
        for m in [t, p] {
            let f = &m.figures;
            assert_eq!(f.connect.n, 4);
            assert_eq!(f.rej_rtt.n, 4);
            assert!(f.connect.median_us > 0.0 && f.connect.p99_us >= f.connect.median_us);
            assert!(f.conns_per_sec > 0.0);
            // REQ, REP, RTU per connection (serial and batched), a REQ and
            // a REJ per probe, all received by the other agent.
            assert!(f.cm_mads_sent >= 3 * (4 + 6) + 2 * 4, "{}", f.cm_mads_sent);
            assert!(m.cm_mads_received >= 3 * (4 + 6) + 2 * 4);
        }
        // Nothing busy-polls the threaded CM's devices: its receive
        // threads never step aside (the CM's own polls, made on them, do
        // not count).
        assert_eq!(t.receive_thread_naps, 0);
        // The polled rounds sampled the busy-polled contexts: a RoCEv2 UD
        // round trip and the bare exchange per connection.
        assert_eq!(
            r.roce_ud_rtt.as_ref().map(|d| d.n),
            Some(4 * FLOOR_RTTS_PER_CONNECTION)
        );
        let bare = r.bare_connect.as_ref().expect("the bare exchange");
        assert_eq!(bare.n, 4);
        assert!(bare.median_us > 0.0);
        assert!(r.ratio() > 0.0 && r.ratio_polled() > 0.0);
        let json = r.to_json();
        assert!(json.starts_with('{') && json.ends_with('}') && balanced(&json));
        for key in [
            "\"transport\":\"udp\"",
            "\"connect_median_us\":",
            "\"udp_rtt_median_us\":",
            "\"udp_rtt_busy_median_us\":",
            "\"udp_rtt_apart_median_us\":",
            "\"bare_connect_median_us\":",
            "\"ratio_connect_vs_udp_rtt\":",
            "\"threaded_legs_median_us\":{\"req_to_listener\":",
            "\"threaded_conns_per_sec\":",
            "\"polled_connect_median_us\":",
            "\"threaded_served_inline\":",
            "\"threaded_receive_thread_naps\":0",
        ] {
            assert!(json.contains(key), "{key} missing from {json}");
        }
        assert!(r
            .to_text()
            .contains("median threaded connect / blocking UDP round trip"));
    }
}
