//! `ibal perf send-lat|send-rate|write-bw --transport udp`: the RoCEv2
//! provider between two ports on loopback (127.0.0.1 and 127.0.0.2, each
//! its own UDP socket), against raw UDP sockets measured in the same run
//! with the same datagram sizes and the same waiting.
//!
//! How each side waits, so the baseline does the same work the same way:
//! the provider's receive threads block in `recv_from` and the benchmark's
//! threads busy-poll their CQs, so the raw UDP baseline also blocks in
//! `recv_from` (a busy-polled socket would compare a thread wake-up
//! against none). Datagram sizes are those the provider puts on the wire:
//! a 64-byte SEND is BTH 12 + 64 + ICRC 4 = 80 bytes of UDP payload; a
//! WRITE packet at MTU 4096 is 4096 + 12 (+ RETH 16 on the first) + 4.
//!
//! * send-lat: 64-byte RC SEND ping-pong, median and mean round trip,
//!   against a raw UDP ping-pong of 80-byte datagrams (target <= 1.5x).
//! * send-rate: 64-byte RC SENDs streamed from A to B (a window of
//!   outstanding sends, receives replenished), messages per second
//!   completed at B, against 80-byte datagrams streamed between two
//!   sockets, received per second (target >= 0.5x).
//! * write-bw: RC WRITEs of 64 KiB and 1 MiB at MTU 4096, against
//!   4112-byte datagrams streamed one way, bytes received per second
//!   (target >= 0.7x).
//!
//! Two more raw UDP runs are reported for what they explain, not as the
//! targets' baselines: send-lat's ping-pong with a 20-byte datagram each
//! way after the answer (the ACK an RC responder must send), and
//! write-bw's stream doing the user-space work RoCE cannot skip (each
//! packet copied from a message buffer and CRC-32'd by the sender,
//! CRC-32'd and copied into a destination buffer by the receiver).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig};
use ibal::verbs::QpCaps;

use super::placement::{on_cpu, pin_this_thread, two_cpus};
use super::{json_f64, BenchResult};

/// Payload of the latency and rate messages.
pub const MSG: usize = 64;
/// UDP payload of one 64-byte RoCEv2 SEND-only packet (BTH + data + ICRC).
pub const SEND_DATAGRAM: usize = 12 + MSG + 4;
/// UDP payload of one full WRITE-middle packet at MTU 4096.
pub const WRITE_DATAGRAM: usize = 12 + 4096 + 4;
/// How the streaming benchmarks' threads wait for completions.
const STREAM_WAIT: Wait = Wait::Sleep(Duration::from_micros(50));
/// Longest any wait of a benchmark may take.
const STALL: Duration = Duration::from_secs(10);

fn err(what: &'static str) -> impl FnOnce(Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Two RoCE ports on loopback with an RC QP each, connected by hand.
pub(super) struct Pair {
    pub(super) al: Al,
    pub(super) ends: [End; 2],
}

pub(super) struct End {
    pub(super) ca: Handle<Ca>,
    pub(super) cq: Handle<Cq>,
    pub(super) qp: Handle<Qp>,
    lkey: u32,
    rkey: u32,
    /// The UDP address of its RoCEv2 port (our provider only).
    pub(super) addr: Option<SocketAddr>,
}

/// Where a benchmark's two ends run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Two RoCEv2 ports of our provider on loopback (127.0.0.1, 127.0.0.2).
    Loopback,
    /// Two contexts of one RDMA device (feature `rdma`), looping back
    /// through its port 1 as perftest's tools do on one host.
    Device(String),
}

/// How one end is reached: by LID (InfiniBand) or by GID at an index;
/// and, on our RoCEv2 provider, the UDP address of its port.
#[derive(Clone, Copy)]
struct Route {
    lid: u16,
    gid: Option<([u8; 16], u8)>,
    addr: Option<SocketAddr>,
}

impl Pair {
    fn on(target: &Target, mtu: Mtu, buf_len: usize, depth: u32) -> BenchResult<Pair> {
        let al = Al::open().map_err(err("open AL"))?;
        let (cas, mtu) = open_cas(&al, target, mtu)?;
        let mut ends = Vec::new();
        let mut routes = Vec::new();
        for (ca, route) in cas {
            let pd = ca.alloc_pd(&al).map_err(err("alloc PD"))?;
            let cq = ca
                .create_cq(&al, 4 * depth + 64)
                .map_err(err("create CQ"))?;
            let caps = QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
            };
            let create = QpCreate::new(QpType::Rc, cq).caps(caps);
            let qp = pd.create_qp(&al, create).map_err(err("create QP"))?;
            let buf = RegisteredBuffer::new(buf_len);
            let access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
            let (lkey, rkey) = pd
                .register(&al, &buf, access)
                .and_then(|mr| mr.keys(&al))
                .map_err(err("register"))?;
            routes.push(route);
            // The MR keeps the buffer's memory alive.
            ends.push(End {
                ca,
                cq,
                qp,
                lkey,
                rkey,
                addr: route.addr,
            });
        }
        let qpns: Vec<u32> = ends
            .iter()
            .map(|e| e.qp.query(&al).map(|a| a.qpn))
            .collect::<Result<_>>()
            .map_err(err("query QP"))?;
        for i in 0..2 {
            connect(&al, ends[i].qp, mtu, qpns[1 - i], routes[1 - i]).map_err(err("connect"))?;
        }
        let ends: [End; 2] = ends.try_into().map_err(|_| "two ends".to_string())?;
        Ok(Pair { al, ends })
    }
}

/// The two CAs of `target`, how each is reached, and the path MTU (at
/// most `mtu`, at most the device port's active MTU).
/// The two ends' CAs and routes.
type Ends = Vec<(Handle<Ca>, Route)>;

fn open_cas(al: &Al, target: &Target, mtu: Mtu) -> BenchResult<(Ends, Mtu)> {
    match target {
        Target::Loopback => {
            let port = |ip: &str| {
                PortConfig::new(SocketAddr::new(ip.parse().expect("literal"), 0)).mtu(mtu)
            };
            let provider = RoceProvider::new(vec![
                DeviceConfig::new("bench-a", 0xbe0a, vec![port("127.0.0.1")]),
                DeviceConfig::new("bench-b", 0xbe0b, vec![port("127.0.0.2")]),
            ]);
            let mut cas = Vec::new();
            for guid in [0xbe0a, 0xbe0b] {
                let ca = al.open_ca(&provider, guid).map_err(err("open CA"))?;
                let gid = ca.port(al, 1).map_err(err("query port"))?.gid_table[0];
                cas.push((
                    ca,
                    Route {
                        lid: 0,
                        gid: Some((gid, 0)),
                        addr: Some(provider.address_of(&gid)),
                    },
                ));
            }
            Ok((cas, mtu))
        }
        #[cfg(feature = "rdma")]
        Target::Device(name) => {
            use hca::provider::LinkLayer;
            let provider = ibal::rdma::RdmaProvider::new();
            let guid = ibal_testkit::devices::rdma_device_guid(&provider, name)?;
            let mut cas = Vec::new();
            let mut path_mtu = mtu;
            for _ in 0..2 {
                let ca = al
                    .open_ca(&provider, guid)
                    .map_err(err("open the device"))?;
                let port = ca.port(al, 1).map_err(err("query port 1"))?;
                path_mtu = path_mtu.min(port.active_mtu);
                let route = if port.link_layer == LinkLayer::InfiniBand {
                    Route {
                        lid: port.lid,
                        gid: None,
                        addr: None,
                    }
                } else {
                    // RoCE: the first IPv4-mapped GID (RoCEv2 over IPv4),
                    // as the conformance fixture and perftest's -x pick.
                    let idx = port
                        .gid_table
                        .iter()
                        .position(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
                        .unwrap_or(0);
                    Route {
                        lid: 0,
                        gid: Some((port.gid_table[idx], idx as u8)),
                        addr: None,
                    }
                };
                cas.push((ca, route));
            }
            Ok((cas, path_mtu))
        }
        #[cfg(not(feature = "rdma"))]
        Target::Device(name) => Err(format!(
            "--device {name}: this ibal was built without the rdma feature \
             (cargo build --features rdma -p ibal-cli; docs/rdma-provider.md)"
        )),
    }
}

/// RESET -> RTS towards `peer_qpn` by `peer`'s route, both PSNs 0.
fn connect(al: &Al, qp: Handle<Qp>, mtu: Mtu, peer_qpn: u32, peer: Route) -> Result<()> {
    let access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    qp.modify(
        al,
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(access),
    )?;
    let mut av = AvAttr::lid(1, peer.lid);
    av.grh = peer.gid.map(|(dgid, sgid_index)| GrhAttr {
        dgid,
        sgid_index,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    qp.modify(
        al,
        &QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(mtu)
            .dest_qpn(peer_qpn)
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )?;
    qp.modify(
        al,
        &QpModify::to(QpState::Rts)
            .sq_psn(0)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    )
}

/// Busy-polls `cq` for up to `out.len()` completions (at least one);
/// fails on an error completion or after [`STALL`].
/// How a benchmark thread waits between empty polls of its CQ.
#[derive(Clone, Copy)]
enum Wait {
    /// Yield the core and poll again (latency: a ping-pong).
    Yield,
    /// Sleep this long (streams with a deep window: leave the cores to the
    /// provider's receive threads, as the raw UDP baseline's blocking
    /// receiver does).
    Sleep(Duration),
}

fn poll_some(
    al: &Arc<AlInstance>,
    cq: Handle<Cq>,
    out: &mut [Wc],
    wait: Wait,
) -> BenchResult<usize> {
    let end = Instant::now() + STALL;
    loop {
        let n = cq.poll(al, out).map_err(err("poll"))?;
        if n > 0 {
            if let Some(bad) = out[..n].iter().find(|w| w.status != WcStatus::Success) {
                return Err(format!(
                    "work request {} completed with {:?}",
                    bad.wr_id, bad.status
                ));
            }
            return Ok(n);
        }
        if Instant::now() > end {
            return Err(format!("no completion within {STALL:?}"));
        }
        // The provider's receive threads need a core: on a machine with
        // fewer cores than busy-polling threads a spinning poller would
        // hold them off until the scheduler's next tick (~4 ms here).
        match wait {
            Wait::Yield => std::thread::yield_now(),
            Wait::Sleep(d) => std::thread::sleep(d),
        }
    }
}

fn recv_wr(sge: &[Sge; 1], wr_id: u64) -> RecvWr<'_> {
    RecvWr {
        wr_id,
        sg_list: sge,
    }
}

/// A UDP socket pair on 127.0.0.1 / 127.0.0.2, each with a read timeout.
pub(super) fn udp_pair() -> BenchResult<(UdpSocket, UdpSocket)> {
    let bind = |ip: &str| -> BenchResult<UdpSocket> {
        let s = UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"))?;
        // The buffers the provider asks for on its sockets, so both sides
        // of the comparison queue the same.
        let sock = socket2::SockRef::from(&s);
        let _ = sock.set_recv_buffer_size(4 << 20);
        let _ = sock.set_send_buffer_size(4 << 20);
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(|e| e.to_string())?;
        Ok(s)
    };
    Ok((bind("127.0.0.1")?, bind("127.0.0.2")?))
}

pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

// ------------------------------------------------------------ send-lat --

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
pub(super) type PingSges = ([Sge; 1], [Sge; 1]);

/// The two ends of a [`MSG`]-byte ping-pong on `target`: the pair, each
/// end's SGEs, and 64 receives posted on each.
pub(super) fn pingpong_pair(target: &Target) -> BenchResult<(Pair, [PingSges; 2])> {
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

fn roce_pingpong(target: &Target, iters: u32, cpus: Option<[usize; 2]>) -> BenchResult<(f64, f64)> {
    let (pair, sges) = pingpong_pair(target)?;
    roce_pingpong_on(&pair, sges, iters, cpus)
}

/// `iters` round trips of a [`MSG`]-byte SEND ping-pong on `pair` (made
/// by [`pingpong_pair`], with its SGEs): the median and mean round trip,
/// us.
pub(super) fn roce_pingpong_on(
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
pub(super) fn udp_pingpong_on(
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

// ----------------------------------------------------------- send-rate --

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

/// Streams `count` messages of `size` bytes from A to B (SENDs into
/// posted receives, or WRITEs when `write`); returns payload bytes per
/// second, timed from the first post to the last completion at B (SEND)
/// or at A (WRITE, whose completion follows the ACK of its last packet).
fn roce_stream(
    target: &Target,
    count: u64,
    size: usize,
    mtu: Mtu,
    write: bool,
) -> BenchResult<f64> {
    const DEPTH: u32 = 512;
    let pair = Pair::on(target, mtu, size.max(64), DEPTH)?;
    let Pair { al, ends: [a, b] } = &pair;
    let sge = [Sge {
        addr: 0,
        length: size as u32,
        lkey: a.lkey,
    }];
    let rsge = [Sge {
        addr: 0,
        length: size as u32,
        lkey: b.lkey,
    }];
    let op = if write {
        SendOp::Write {
            remote_addr: 0,
            rkey: b.rkey,
        }
    } else {
        SendOp::Send
    };
    // Receives on B, replenished by a thread that counts completions.
    let done = Arc::new(AtomicBool::new(false));
    let receiver = (!write).then(|| -> BenchResult<_> {
        let wrs: Vec<RecvWr> = (0..DEPTH).map(|i| recv_wr(&rsge, u64::from(i))).collect();
        b.qp.post_recv(al, &wrs).map_err(err("post_recv"))?;
        let (al, qp, cq, done) = (Arc::clone(al), b.qp, b.cq, Arc::clone(&done));
        Ok(std::thread::spawn(move || -> BenchResult<Instant> {
            let mut wc = [Wc::default(); 64];
            let mut got = 0u64;
            while got < count {
                let n = poll_some(&al, cq, &mut wc, STREAM_WAIT)?;
                got += n as u64;
                let wrs: Vec<RecvWr> = wc[..n].iter().map(|w| recv_wr(&rsge, w.wr_id)).collect();
                qp.post_recv(&al, &wrs).map_err(err("post_recv"))?;
            }
            done.store(true, Ordering::Release);
            Ok(Instant::now())
        }))
    });
    let receiver = receiver.transpose()?;
    // Signal one request in 16 so the send queue is reaped in batches.
    const SIGNAL: u64 = 16;
    let window = u64::from(DEPTH) / SIGNAL * SIGNAL;
    let mut wc = [Wc::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    let t0 = Instant::now();
    while completed < count {
        while posted < count && posted - completed < window {
            let mut wr = SendWr::new(posted, op, &sge);
            if (posted + 1) % SIGNAL != 0 && posted + 1 != count {
                wr = wr.unsignaled();
            }
            a.qp.post_send(al, &[wr]).map_err(err("post_send"))?;
            posted += 1;
        }
        let n = poll_some(al, a.cq, &mut wc, STREAM_WAIT)?;
        for w in &wc[..n] {
            completed = w.wr_id + 1;
        }
    }
    let end = match receiver {
        Some(h) => h
            .join()
            .map_err(|_| "the receiver panicked".to_string())??,
        None => Instant::now(),
    };
    let _ = done.load(Ordering::Acquire);
    let secs = end.duration_since(t0).as_secs_f64();
    Ok(count as f64 * size as f64 / secs)
}

/// Streams `count` datagrams of `size` bytes between two sockets; returns
/// (datagrams received per second, datagrams lost).
fn udp_stream(count: u64, size: usize) -> BenchResult<(f64, u64)> {
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(|e| e.to_string())?;
    let ready = Arc::new(Barrier::new(2));
    let receiver = {
        let ready = Arc::clone(&ready);
        std::thread::spawn(move || -> (u64, Option<Instant>, Option<Instant>) {
            let mut buf = vec![0u8; size + 64];
            let (mut got, mut first, mut last) = (0u64, None, None);
            ready.wait();
            // Ends when everything arrived or after 200 ms of silence
            // (datagrams lost: UDP has no flow control).
            while got < count {
                match b.recv_from(&mut buf) {
                    Ok(_) => {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = Some(now);
                        got += 1;
                    }
                    Err(_) => break,
                }
            }
            (got, first, last)
        })
    };
    let msg = vec![0x5au8; size];
    ready.wait();
    let t0 = Instant::now();
    for _ in 0..count {
        a.send_to(&msg, b_addr).map_err(|e| e.to_string())?;
    }
    let (got, _first, last) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())?;
    let secs = last.map_or(f64::NAN, |l| l.duration_since(t0).as_secs_f64());
    Ok((got as f64 / secs, count - got))
}

/// As [`udp_stream`] with `count` WRITE-sized datagrams carrying messages
/// of `size` bytes, doing per packet the user-space work RoCE must: the
/// sender gathers the packet's 4 KiB from its message into the datagram
/// and computes a CRC-32 over it, the receiver computes the CRC-32 and
/// copies the payload to its place in a destination buffer. Returns
/// (datagrams received per second, datagrams lost).
fn udp_stream_working(count: u64, size: usize) -> BenchResult<(f64, u64)> {
    const MTU: usize = 4096;
    let (a, b) = udp_pair()?;
    let b_addr = b.local_addr().map_err(|e| e.to_string())?;
    let ready = Arc::new(Barrier::new(2));
    let size = size.max(MTU);
    let receiver = {
        let ready = Arc::clone(&ready);
        std::thread::spawn(move || -> (u64, Option<Instant>, u32) {
            let mut buf = vec![0u8; WRITE_DATAGRAM + 64];
            let mut dst = vec![0u8; size];
            let (mut got, mut last, mut crcs) = (0u64, None, 0u32);
            ready.wait();
            while got < count {
                match b.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        crcs ^= ibal_roce_crc(&buf[..n]);
                        let at = (got as usize * MTU) % size;
                        let len = (n.saturating_sub(16)).min(MTU).min(size - at);
                        dst[at..at + len].copy_from_slice(&buf[12..12 + len]);
                        last = Some(Instant::now());
                        got += 1;
                    }
                    Err(_) => break,
                }
            }
            (got, last, crcs ^ u32::from(dst[0]))
        })
    };
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut datagram = vec![0u8; WRITE_DATAGRAM];
    ready.wait();
    let t0 = Instant::now();
    for k in 0..count {
        let at = (k as usize * MTU) % size;
        let len = MTU.min(size - at);
        datagram[12..12 + len].copy_from_slice(&src[at..at + len]);
        let crc = ibal_roce_crc(&datagram[..WRITE_DATAGRAM - 4]);
        datagram[WRITE_DATAGRAM - 4..].copy_from_slice(&crc.to_le_bytes());
        a.send_to(&datagram, b_addr).map_err(|e| e.to_string())?;
    }
    let (got, last, _) = receiver
        .join()
        .map_err(|_| "the receiver panicked".to_string())?;
    let secs = last.map_or(f64::NAN, |l| l.duration_since(t0).as_secs_f64());
    Ok((got as f64 / secs, count - got))
}

/// The CRC-32 the ICRC costs (the same routine, `ibal::roce::wire::icrc`).
fn ibal_roce_crc(bytes: &[u8]) -> u32 {
    ibal::roce::wire::icrc::crc32(bytes)
}

// ------------------------------------------------------------ write-bw --

/// One message size.
#[derive(Debug, Clone)]
pub struct BwPoint {
    /// WRITE size in bytes.
    pub size: usize,
    /// WRITEs per round.
    pub iters: u64,
    /// RoCE WRITE payload, Gbit/s.
    pub roce_gbps: f64,
    /// Raw UDP payload received, Gbit/s.
    pub udp_gbps: f64,
    /// Raw UDP doing the user-space work RoCE cannot skip: the sender
    /// copies each packet's 4 KiB from a source buffer into the datagram
    /// and computes its CRC-32, the receiver computes the CRC-32 and
    /// copies the payload into a destination buffer; Gbit/s. Not the
    /// target's baseline.
    pub udp_work_gbps: f64,
}

/// RC WRITE bandwidth against raw UDP one-way throughput.
#[derive(Debug, Clone)]
pub struct BwReport {
    /// Rounds (best of each contender).
    pub rounds: usize,
    /// One per size.
    pub points: Vec<BwPoint>,
}

impl BwReport {
    /// The lowest ratio of the sizes.
    pub fn min_ratio(&self) -> f64 {
        self.points
            .iter()
            .map(|p| p.roce_gbps / p.udp_gbps)
            .fold(f64::INFINITY, f64::min)
    }
    /// A table.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf write-bw --transport udp: RC RDMA WRITE at MTU 4096 between two RoCEv2 ports on\n\
             loopback vs {WRITE_DATAGRAM}-byte raw UDP datagrams streamed one way (blocking receive);\n\
             payload Gbit/s, best of {} rounds; \"UDP+work\": raw UDP that also copies and CRCs\n\
             each packet on both sides, as RoCE must\n\n{:>10} {:>8} {:>12} {:>12} {:>8} {:>12} {:>8}\n",
            self.rounds, "size", "iters", "RoCE Gb/s", "UDP Gb/s", "ratio", "UDP+work", "ratio"
        );
        for p in &self.points {
            out.push_str(&format!(
                "{:>10} {:>8} {:>12.2} {:>12.2} {:>7.2}x {:>12.2} {:>7.2}x\n",
                p.size,
                p.iters,
                p.roce_gbps,
                p.udp_gbps,
                p.roce_gbps / p.udp_gbps,
                p.udp_work_gbps,
                p.roce_gbps / p.udp_work_gbps
            ));
        }
        out.push_str(&format!(
            "\nlowest ratio: {:.2}x (target >= 0.7x)\n",
            self.min_ratio()
        ));
        out
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        let points: Vec<String> = self
            .points
            .iter()
            .map(|p| {
                format!(
                    "{{\"size\":{},\"iters\":{},\"roce_gbps\":{},\"udp_gbps\":{},\"ratio\":{},\
                     \"udp_work_gbps\":{}}}",
                    p.size,
                    p.iters,
                    json_f64(p.roce_gbps, 3),
                    json_f64(p.udp_gbps, 3),
                    json_f64(p.roce_gbps / p.udp_gbps, 4),
                    json_f64(p.udp_work_gbps, 3)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"write-bw\",\"transport\":\"udp\",\"rounds\":{},\"results\":[{}],\
             \"min_ratio\":{},\"target_ratio\":0.7,\"target_met\":{}}}",
            self.rounds,
            points.join(","),
            json_f64(self.min_ratio(), 4),
            self.min_ratio() >= 0.7
        )
    }
}

/// Runs write-bw for each size: `bytes_per_round` of WRITEs (at least 4).
pub fn run_write_bw(sizes: &[usize], bytes_per_round: u64, rounds: usize) -> BenchResult<BwReport> {
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
        return Err(format!("size {bad}: between 1 byte and 64 MiB"));
    }
    let mut points = Vec::new();
    for &size in sizes {
        let iters = (bytes_per_round / size as u64).max(4);
        let packets = iters * (size as u64).div_ceil(4096);
        let (mut roce, mut udp, mut work) = (0f64, 0f64, 0f64);
        for _ in 0..rounds.max(1) {
            roce = roce
                .max(roce_stream(&Target::Loopback, iters, size, Mtu::Mtu4096, true)? * 8.0 / 1e9);
            let (rate, _) = udp_stream(packets, WRITE_DATAGRAM)?;
            udp = udp.max(rate * 4096.0 * 8.0 / 1e9);
            let (rate, _) = udp_stream_working(packets, size)?;
            work = work.max(rate * 4096.0 * 8.0 / 1e9);
        }
        points.push(BwPoint {
            size,
            iters,
            roce_gbps: roce,
            udp_gbps: udp,
            udp_work_gbps: work,
        });
    }
    Ok(BwReport {
        rounds: rounds.max(1),
        points,
    })
}

// ------------------------------------------------------- on a device --

/// One benchmark on an RDMA device (`--device NAME`): the same runs as on
/// loopback, with no baseline in the same run (compare with perftest on
/// the same device: `docs/benchmarks.md`, "Issue 16: on a NIC, against perftest").
#[derive(Debug, Clone)]
pub struct DeviceReport {
    /// `send-lat`, `send-rate` or `write-bw`.
    pub bench: &'static str,
    /// The device.
    pub device: String,
    /// Rounds (best of) or round trips.
    pub rounds: usize,
    /// `(what, value, unit)`.
    pub results: Vec<(String, f64, &'static str)>,
}

impl DeviceReport {
    /// Lines for people.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf {} on {} (two contexts of the device, looping back through port 1; \
             compare with perftest: docs/benchmarks.md)\n",
            self.bench, self.device
        );
        for (what, v, unit) in &self.results {
            out.push_str(&format!("  {what:<34} {v:>12.2} {unit}\n"));
        }
        out
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        let r: Vec<String> = self
            .results
            .iter()
            .map(|(w, v, u)| {
                format!(
                    "{{\"what\":\"{w}\",\"value\":{},\"unit\":\"{u}\"}}",
                    json_f64(*v, 3)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"{}\",\"device\":\"{}\",\"rounds\":{},\"results\":[{}]}}",
            self.bench,
            self.device,
            self.rounds,
            r.join(",")
        )
    }
}

/// send-lat on `device`: 64-byte RC SEND ping-pong, median and mean.
pub fn run_device_send_lat(device: &str, iters: u32) -> BenchResult<DeviceReport> {
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let (median, mean) = roce_pingpong(&Target::Device(device.into()), iters, None)?;
    Ok(DeviceReport {
        bench: "send-lat",
        device: device.into(),
        rounds: 1,
        results: vec![
            (format!("{MSG}-byte SEND round trip, median"), median, "us"),
            (format!("{MSG}-byte SEND round trip, mean"), mean, "us"),
            (
                format!("{MSG}-byte SEND one way (median / 2)"),
                median / 2.0,
                "us",
            ),
        ],
    })
}

/// send-rate on `device`: 64-byte RC SENDs streamed, messages per second.
pub fn run_device_send_rate(device: &str, msgs: u64, rounds: usize) -> BenchResult<DeviceReport> {
    if msgs == 0 {
        return Err("--msgs must be at least 1".into());
    }
    let target = Target::Device(device.into());
    let mut best = 0f64;
    for _ in 0..rounds.max(1) {
        best = best.max(roce_stream(&target, msgs, MSG, Mtu::Mtu4096, false)? / MSG as f64);
    }
    Ok(DeviceReport {
        bench: "send-rate",
        device: device.into(),
        rounds: rounds.max(1),
        results: vec![
            (format!("{MSG}-byte SENDs"), best / 1e6, "M msg/s"),
            (
                format!("{MSG}-byte SEND payload"),
                best * MSG as f64 * 8.0 / 1e9,
                "Gbit/s",
            ),
        ],
    })
}

/// write-bw on `device`: RC WRITEs of each size, `bytes_per_round` per
/// round (at least 4 WRITEs), at the port's active MTU.
pub fn run_device_write_bw(
    device: &str,
    sizes: &[usize],
    bytes_per_round: u64,
    rounds: usize,
) -> BenchResult<DeviceReport> {
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
        return Err(format!("size {bad}: between 1 byte and 64 MiB"));
    }
    let target = Target::Device(device.into());
    let mut results = Vec::new();
    for &size in sizes {
        let iters = (bytes_per_round / size as u64).max(4);
        let mut best = 0f64;
        for _ in 0..rounds.max(1) {
            best = best.max(roce_stream(&target, iters, size, Mtu::Mtu4096, true)? * 8.0 / 1e9);
        }
        results.push((format!("WRITE {size} B x {iters}"), best, "Gbit/s"));
    }
    Ok(DeviceReport {
        bench: "write-bw",
        device: device.into(),
        rounds: rounds.max(1),
        results,
    })
}
