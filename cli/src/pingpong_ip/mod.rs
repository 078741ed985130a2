//! `ibal pingpong --listen IP[:PORT]` / `--connect IP[:PORT]`: the main
//! job between two processes (or hosts) over RoCEv2, connected through the
//! CM with rdma_cm-style addressing (`cep::ip`).
//!
//! Each process opens one RoCEv2 port on its address (UDP 4791 unless told
//! otherwise). The connecting side sends a REQ for the rdma_cm TCP service
//! id of PORT, with rdma_cm's header and, after it, this job's parameters
//! (iterations, size, its buffer's address and R_Key); the listener answers
//! with its own buffer in the REP. Then an RDMA WRITE + SEND ping-pong with
//! every byte checked each way (the patterns of [`crate::pingpong`]), a
//! disconnect (DREQ/DREP), destroy, and a check that the AL closes with
//! nothing live. A listener serves `count` connections one after another.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ListenHandler};
use cep::ip::{self, IpConnect};
use cep::proto::{Event, TimedOut};
use cep::wire::ip_cm::PortSpace;
use cep::wire::RejectReason;
use hca::provider::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus};
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use hca::RegisteredBuffer;
use ibal::roce::{DeviceConfig, PortConfig, RoceProvider};
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};

use crate::devinfo::CounterList;
use crate::pingpong::pattern_byte;

#[cfg(feature = "rdma")]
mod rdma;

/// The rdma_cm port a listener uses when none is given (librdmacm's
/// examples use 7471).
pub const DEFAULT_PORT: u16 = 7471;

/// What this job puts after rdma_cm's header in the REQ, and in the REP.
const MAGIC: &[u8; 4] = b"IBPP";
const VERSION: u8 = 1;

/// Which side this process plays.
#[derive(Clone, Debug)]
pub enum Role {
    /// Wait for connections on this address.
    Listen(SocketAddr),
    /// Connect to this address.
    Connect(SocketAddr),
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct IpPingPongConfig {
    /// Listen or connect.
    pub role: Role,
    /// Our RoCEv2 port's address (the connecting side's default: the
    /// address the kernel routes from; on loopback, the next 127.x address).
    pub local: Option<IpAddr>,
    /// UDP port our RoCEv2 port binds.
    pub udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    pub peer_udp_port: u16,
    /// Round trips (the connecting side's choice; the listener follows it).
    pub iterations: u32,
    /// Bytes written each way per round trip (the connecting side's choice).
    pub size: usize,
    /// Path MTU.
    pub mtu: Mtu,
    /// Connections a listener serves before it exits.
    pub count: u32,
    /// How long to wait for the peer at any step.
    pub timeout: Duration,
    /// How long each connection stays up after the ping-pong: the
    /// connecting side waits this long before its DREQ, the listener before
    /// it answers the peer's DREQ (so a test can kill a peer in that
    /// window). 0 by default.
    pub hold: Duration,
    /// Our device's node GUID (default: from the process id).
    pub guid: Option<u64>,
    /// Our device's first QPN (default: random).
    pub first_qpn: Option<u32>,
    /// Run on this RDMA device (libibverbs name, `rxe0`, `mlx5_0`) with
    /// librdmacm-backed CEPs instead of our RoCEv2 port (feature `rdma`;
    /// `rdma`).
    pub device: Option<String>,
}

impl IpPingPongConfig {
    /// Defaults for `role`.
    pub fn new(role: Role) -> Self {
        IpPingPongConfig {
            role,
            local: None,
            udp_port: ibal::roce::ROCE_PORT,
            peer_udp_port: ibal::roce::ROCE_PORT,
            iterations: 1000,
            size: 4096,
            mtu: Mtu::Mtu1024,
            count: 1,
            timeout: Duration::from_secs(30),
            hold: Duration::ZERO,
            guid: None,
            first_qpn: None,
            device: None,
        }
    }
}

/// One connection's results.
#[derive(Clone, Debug)]
pub struct ConnectionReport {
    /// The peer's address and rdma_cm port.
    pub peer: SocketAddr,
    /// Round trips.
    pub iterations: u32,
    /// Bytes each way per round trip.
    pub size: usize,
    /// REQ sent (or received) to ESTABLISHED, microseconds.
    pub connect_us: f64,
    /// Round trip median, microseconds.
    pub rtt_median_us: f64,
    /// Round trip 99th percentile, microseconds.
    pub rtt_p99_us: f64,
    /// DREQ sent to DREP received (connecting side), or last SEND to DREP
    /// sent (listener), microseconds.
    pub disconnect_us: f64,
    /// What the CM negotiated for this end (`cm::connection_attrs`): our
    /// QPN and starting PSN (the REQ's or the REP's), the peer's.
    pub qp: QpNumbers,
    /// The CM found the connection stale (listener: a new REQ from the
    /// peer's CA GUID named the same QPN, as a restarted peer's does) and
    /// ended it (DREQ; the dead peer never answers, so no DREP).
    pub stale: bool,
}

/// QPNs and starting PSNs of one end of a connection, as the REQ and REP
/// carried them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpNumbers {
    /// Our QPN.
    pub local_qpn: u32,
    /// Our starting PSN (our QP's send PSN).
    pub local_psn: u32,
    /// The peer's QPN.
    pub peer_qpn: u32,
    /// The peer's starting PSN.
    pub peer_psn: u32,
}

impl QpNumbers {
    fn of(al: &Al, cep: Handle<Cep>) -> Result<QpNumbers, String> {
        let a = cm::connection_attrs(al.instance(), cep)
            .map_err(|e| format!("the connection's attributes: {e}"))?;
        Ok(QpNumbers {
            local_qpn: a.local_qpn,
            local_psn: a.local_starting_psn,
            peer_qpn: a.peer_qpn,
            peer_psn: a.peer_starting_psn,
        })
    }
}

/// The run's results.
#[derive(Clone, Debug)]
pub struct IpPingPongReport {
    /// What carried the connection: `RoCEv2` (our provider), or an RDMA
    /// device through librdmacm (`rxe0 (librdmacm)`).
    pub transport: String,
    /// `listen` or `connect`.
    pub role: &'static str,
    /// Our RoCEv2 port's address.
    pub local: SocketAddr,
    /// One per connection.
    pub connections: Vec<ConnectionReport>,
    /// The AL's objects left at close (must be 0).
    pub live_after_close: usize,
    /// Our RoCEv2 port's counters at the end (traffic, and datagrams
    /// dropped by reason: a stranger's show as `rx_wrong_source`); None
    /// over an RDMA device.
    pub port_counters: Option<CounterList>,
}

impl IpPingPongReport {
    /// Lines for people.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "ibal pingpong over {} ({}), our port {}\n",
            self.transport, self.role, self.local
        );
        for c in &self.connections {
            s.push_str(&format!(
                "  peer {}: connected in {:.0} us; {} round trips of {} bytes each way, \
                 every byte checked: median {:.1} us, p99 {:.1} us; disconnected in {:.0} us\n",
                c.peer,
                c.connect_us,
                c.iterations,
                c.size,
                c.rtt_median_us,
                c.rtt_p99_us,
                c.disconnect_us
            ));
        }
        s.push_str(&format!(
            "  AL closed with {} objects live\n",
            self.live_after_close
        ));
        if let Some(c) = &self.port_counters {
            // Drops and retries only when there were any: what an operator
            // looks for.
            let odd: Vec<String> = c
                .iter()
                .filter(|(k, v)| {
                    *v > 0
                        && !matches!(
                            *k,
                            "rx_datagrams"
                                | "rx_packets"
                                | "rx_bytes"
                                | "tx_packets"
                                | "tx_bytes"
                                | "rx_thread_naps"
                        )
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            if !odd.is_empty() {
                s.push_str(&format!("  port counters: {}\n", odd.join(", ")));
            }
        }
        s
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let conns: Vec<String> = self
            .connections
            .iter()
            .map(|c| {
                format!(
                    "{{\"peer\":\"{}\",\"iterations\":{},\"size\":{},\"connect_us\":{:.1},\
                     \"rtt_median_us\":{:.2},\"rtt_p99_us\":{:.2},\"disconnect_us\":{:.1},\
                     \"local_qpn\":{},\"local_psn\":{},\"peer_qpn\":{},\"peer_psn\":{},\
                     \"stale\":{}}}",
                    c.peer,
                    c.iterations,
                    c.size,
                    c.connect_us,
                    c.rtt_median_us,
                    c.rtt_p99_us,
                    c.disconnect_us,
                    c.qp.local_qpn,
                    c.qp.local_psn,
                    c.qp.peer_qpn,
                    c.qp.peer_psn,
                    c.stale
                )
            })
            .collect();
        let counters = match &self.port_counters {
            Some(c) => format!(",\"port_counters\":{}", crate::devinfo::counters_json(c)),
            None => String::new(),
        };
        format!(
            "{{\"command\":\"pingpong\",\"transport\":\"{}\",\"role\":\"{}\",\"local\":\"{}\",\
             \"connections\":[{}],\"live_after_close\":{}{counters}}}",
            if self.transport == "RoCEv2" {
                "roce"
            } else {
                "rdma"
            },
            self.role,
            self.local,
            conns.join(","),
            self.live_after_close
        )
    }
}

/// The address our RoCEv2 port takes to reach `remote`: the kernel's
/// route source (a connected UDP socket sends nothing), except that on
/// loopback, where that is the peer's own address, the next 127.x address
/// (two ports cannot share an address and UDP port).
pub fn local_address_for(remote: IpAddr, peer_udp_port: u16) -> Result<IpAddr, String> {
    if let IpAddr::V4(v4) = remote {
        if v4.is_loopback() {
            let [a, b, c, d] = v4.octets();
            let next = if d >= 254 { 1 } else { d + 1 };
            return Ok(IpAddr::V4(Ipv4Addr::new(a, b, c, next)));
        }
    }
    let any: SocketAddr = match remote {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = UdpSocket::bind(any).map_err(|e| format!("cannot open a UDP socket: {e}"))?;
    probe
        .connect((remote, peer_udp_port))
        .map_err(|e| format!("no route to {remote}: {e}"))?;
    let ip = probe
        .local_addr()
        .map_err(|e| format!("no route to {remote}: {e}"))?
        .ip();
    if ip == remote {
        return Err(format!(
            "{remote} is this host's own address: give --local another address for our port"
        ));
    }
    Ok(ip)
}

/// Runs the job.
pub fn run(cfg: &IpPingPongConfig) -> Result<IpPingPongReport, String> {
    if let Some(device) = &cfg.device {
        #[cfg(feature = "rdma")]
        return rdma::run(cfg, device);
        #[cfg(not(feature = "rdma"))]
        return Err(format!(
            "--device {device}: this ibal was built without the rdma feature \
             (cargo build --features rdma -p ibal-cli; docs/rdma-provider.md)"
        ));
    }
    if cfg.iterations == 0 || cfg.size == 0 || cfg.size > MAX_SIZE {
        return Err(format!(
            "--iterations must be >= 1 and --size between 1 and {MAX_SIZE} bytes"
        ));
    }
    let local_ip = match (&cfg.role, cfg.local) {
        (_, Some(ip)) => ip,
        (Role::Listen(addr), None) => addr.ip(),
        (Role::Connect(remote), None) => local_address_for(remote.ip(), cfg.peer_udp_port)?,
    };
    if local_ip.is_unspecified() {
        return Err("our RoCEv2 port needs a real address (its GID): give IP in --listen IP[:PORT] or --local".into());
    }
    let local = SocketAddr::new(local_ip, cfg.udp_port);
    let guid = cfg
        .guid
        .unwrap_or(0x0249_4241_4c50_0000u64 | u64::from(std::process::id() & 0xffff));
    let port = PortConfig::new(local)
        .peer_udp_port(cfg.peer_udp_port)
        .mtu(cfg.mtu);
    let mut device = DeviceConfig::new("roce0", guid, vec![port]);
    device.first_qpn = cfg.first_qpn;
    let provider = RoceProvider::new(vec![device]);
    let al = Al::open().map_err(|e| e.to_string())?;
    let result = (|| -> Result<(Vec<ConnectionReport>, CounterList), String> {
        let ca = verbs::open_ca(al.instance(), &provider, guid)
            .map_err(|e| format!("cannot open a RoCEv2 port on {local}: {e}"))?;
        cm::attach_ca(al.instance(), ca).map_err(|e| e.to_string())?;
        let mut connections = Vec::new();
        match &cfg.role {
            Role::Connect(remote) => connections.push(connect_once(&al, ca, *remote, cfg)?),
            Role::Listen(addr) => {
                let listener = Listener::start(&al, ca, SocketAddr::new(local_ip, addr.port()))?;
                for _ in 0..cfg.count.max(1) {
                    connections.push(serve_once(&al, ca, &listener, cfg)?);
                }
                al.destroy_sync(listener.handle)
                    .map_err(|e| e.to_string())?;
            }
        }
        let counters = match al.resolve(ca).map_err(|e| e.to_string())?.device() {
            hca::any::AnyDevice::Roce(d) => d.port_counters(1).map(|c| c.fields()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
        .unwrap_or_default();
        al.destroy_sync(ca).map_err(|e| e.to_string())?;
        Ok((connections, counters))
    })();
    // Close whatever happened: a failed run must not leak either, and its
    // error says how the close went.
    let closed = al.close();
    let (connections, counters) = result.map_err(|e| match &closed {
        Ok(s) if s.total_live() == 0 => format!("{e}; AL closed: no objects left live"),
        Ok(s) => format!("{e}; AL closed: objects leaked: {s}"),
        Err(c) => format!("{e}; closing the AL: {c}"),
    })?;
    let stats = closed.map_err(|e| format!("closing the AL: {e}"))?;
    if stats.total_live() != 0 {
        return Err(format!("objects leaked: {stats}"));
    }
    Ok(IpPingPongReport {
        transport: "RoCEv2".into(),
        role: match cfg.role {
            Role::Listen(_) => "listen",
            Role::Connect(_) => "connect",
        },
        local,
        connections,
        live_after_close: stats.total_live(),
        port_counters: Some(counters),
    })
}

/// Largest --size (the whole MR is 2 * size + 16 bytes).
pub(crate) const MAX_SIZE: usize = 64 << 20;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// One side's verbs objects. The MR: `[0, size)` where the peer writes,
/// `[size, 2 size)` what we write, `[2 size, +8)` where the peer's SEND
/// lands, `[2 size + 8, +8)` our SEND.
pub(crate) struct Side {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    pub(crate) qp: Handle<Qp>,
    mr: Handle<Mr>,
    buf: RegisteredBuffer,
    lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) size: usize,
    /// Completions taken by a poll that waited for another one.
    early: std::cell::RefCell<Vec<u64>>,
}

impl Side {
    pub(crate) fn open(al: &Al, ca: Handle<Ca>, size: usize) -> Result<Side, String> {
        let e = |e: al::Error| e.to_string();
        let inst = al.instance();
        let pd = verbs::alloc_pd(inst, ca).map_err(e)?;
        let cq = verbs::create_cq(inst, ca, 64, None, None).map_err(e)?;
        let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).map_err(e)?;
        let len = 2 * size + 16;
        let buf = RegisteredBuffer::new(len);
        let mr = verbs::register_mr(inst, pd, &buf, 0, len, 0, ALL).map_err(e)?;
        let (lkey, rkey) = {
            let m = al.resolve(mr).map_err(e)?;
            (m.lkey(), m.rkey())
        };
        Ok(Side {
            pd,
            cq,
            qp,
            mr,
            buf,
            lkey,
            rkey,
            size,
            early: std::cell::RefCell::new(Vec::new()),
        })
    }

    pub(crate) fn destroy(&self, al: &Al) -> Result<(), String> {
        for r in [
            al.destroy_sync(self.qp),
            al.destroy_sync(self.mr),
            al.destroy_sync(self.cq),
            al.destroy_sync(self.pd),
        ] {
            r.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Opens a side on `ca`, runs `job` with it, and destroys it whatever
    /// the job's outcome (the job's error first, then the destroy's).
    pub(crate) fn with<T>(
        al: &Al,
        ca: Handle<Ca>,
        size: usize,
        job: impl FnOnce(&Side) -> Result<T, String>,
    ) -> Result<T, String> {
        let side = Side::open(al, ca, size)?;
        let r = job(&side);
        let d = side.destroy(al);
        let report = r?;
        d?;
        Ok(report)
    }

    /// The connecting side's round trips: WRITE + SEND, then take the
    /// peer's answer; the round-trip times in microseconds.
    pub(crate) fn lead_round_trips(
        &self,
        al: &Al,
        iterations: u32,
        peer_buf: (u64, u32),
        timeout: Duration,
    ) -> Result<Vec<f64>, String> {
        let mut rtts = Vec::with_capacity(iterations as usize);
        for i in 0..iterations {
            let start = Instant::now();
            if i > 0 {
                self.post_seq_recv(al, i)?;
            }
            self.write_and_send(al, i, 0, peer_buf, Instant::now() + timeout)?;
            self.take(al, i, 1, Instant::now() + timeout)?;
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(rtts)
    }

    /// The listening side's round trips: take the peer's WRITE + SEND, then
    /// answer with ours; the round-trip times in microseconds, and whether
    /// the peer's DREQ already came. A failed take names the CM events seen
    /// (`cm_events`). The last SEND flushed is handed to `last_flushed`:
    /// the peer checked it and sent its DREQ at once, and the DREQ (which
    /// moves our QP to ERR) overtook the SEND's ACK (a dropped or held ACK;
    /// docs/capture.md, "Known flake"). The peer disconnects only after
    /// checking our last SEND (or after failing, which it reports itself),
    /// so `last_flushed` waits for that DREQ; without it the flush stands
    /// (its error).
    pub(crate) fn answer_round_trips(
        &self,
        al: &Al,
        iterations: u32,
        peer_buf: (u64, u32),
        timeout: Duration,
        cm_events: impl Fn() -> String,
        mut last_flushed: impl FnMut(String) -> Result<(), String>,
    ) -> Result<(Vec<f64>, bool), String> {
        let mut rtts = Vec::with_capacity(iterations as usize);
        let mut dreq_first = false;
        for i in 0..iterations {
            let start = Instant::now();
            if let Err(e) = self.take(al, i, 0, Instant::now() + timeout) {
                return Err(format!("{e} [CM events: {}]", cm_events()));
            }
            if i + 1 < iterations {
                self.post_seq_recv(al, i + 1)?;
            }
            match self.write_and_send(al, i, 1, peer_buf, Instant::now() + timeout) {
                Err(e) if i + 1 == iterations && e.contains("WrFlushError") => {
                    last_flushed(e)?;
                    dreq_first = true;
                }
                r => r?,
            }
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok((rtts, dreq_first))
    }

    pub(crate) fn post_seq_recv(&self, al: &Al, i: u32) -> Result<(), String> {
        let sge = [Sge {
            addr: 2 * self.size as u64,
            length: 8,
            lkey: self.lkey,
        }];
        post_recv(
            al,
            self.qp,
            &[RecvWr {
                wr_id: RECV_BASE + u64::from(i),
                sg_list: &sge,
            }],
        )
        .map_err(|e| format!("post_recv: {e}"))
    }

    /// Fills our write area with iteration `i`'s pattern of `side`, then
    /// WRITEs it to the peer's `(addr, rkey)` and SENDs `i`.
    pub(crate) fn write_and_send(
        &self,
        al: &Al,
        i: u32,
        side: u8,
        peer: (u64, u32),
        deadline: Instant,
    ) -> Result<(), String> {
        let n = self.size;
        self.buf
            .with_range_mut(n, n, |b| {
                for (k, out) in b.iter_mut().enumerate() {
                    *out = pattern_byte(k, i, side);
                }
            })
            .map_err(|e| format!("fill the write area: {e}"))?;
        self.buf
            .write(2 * n + 8, &u64::from(i).to_le_bytes())
            .map_err(|e| e.to_string())?;
        let ws = [Sge {
            addr: n as u64,
            length: n as u32,
            lkey: self.lkey,
        }];
        let ss = [Sge {
            addr: 2 * n as u64 + 8,
            length: 8,
            lkey: self.lkey,
        }];
        let write = SendOp::Write {
            remote_addr: peer.0,
            rkey: peer.1,
        };
        post_send(
            al,
            self.qp,
            &[
                SendWr::new(WRITE_ID, write, &ws).unsignaled(),
                SendWr::new(SEND_ID, SendOp::Send, &ss),
            ],
        )
        .map_err(|e| format!("post_send: {e}"))?;
        self.wait_for(al, SEND_ID, deadline, i)
    }

    /// Waits for the peer's SEND `i` and checks it and the WRITE before it
    /// (the peer's `side` pattern of iteration `i`).
    pub(crate) fn take(&self, al: &Al, i: u32, side: u8, deadline: Instant) -> Result<(), String> {
        self.wait_for(al, RECV_BASE + u64::from(i), deadline, i)?;
        let mut seq = [0u8; 8];
        self.buf
            .read(2 * self.size, &mut seq)
            .map_err(|e| e.to_string())?;
        if u64::from_le_bytes(seq) != u64::from(i) {
            return Err(format!(
                "iteration {i}: the SEND carried {} instead of {i}",
                u64::from_le_bytes(seq)
            ));
        }
        let bad = self.buf.with(|b| {
            b[..self.size]
                .iter()
                .enumerate()
                .find(|(k, &v)| v != pattern_byte(*k, i, side))
                .map(|(k, &v)| (k, v))
        });
        if let Some((k, v)) = bad {
            return Err(format!(
                "iteration {i}: RDMA WRITE data differs at byte {k}: {v:#04x}, expected {:#04x}",
                pattern_byte(k, i, side)
            ));
        }
        Ok(())
    }

    /// One poll of the CQ, keeping what it finds for later waits. On a
    /// RoCEv2 port it also sends the positive ACKs the last polls held
    /// back (they otherwise leave at the receive thread's next turn, which
    /// a loaded machine can delay), so that the connection is idle, with
    /// nothing unacknowledged, when `--hold` says so.
    fn settle(&self, al: &Al) {
        let mut wc = [hca::provider::Wc::default(); 4];
        if let Ok(n) = verbs::poll_cq(al, self.cq, &mut wc) {
            let mut early = self.early.borrow_mut();
            early.extend(
                wc[..n]
                    .iter()
                    .filter(|w| w.wr_id != WRITE_ID)
                    .map(|w| w.wr_id),
            );
        }
    }

    pub(crate) fn wait_for(
        &self,
        al: &Al,
        wr_id: u64,
        deadline: Instant,
        i: u32,
    ) -> Result<(), String> {
        // The peer's SEND can complete before our own: a completion that
        // is not the one waited for is kept for its own wait.
        let mut early = self.early.borrow_mut();
        if let Some(at) = early.iter().position(|&w| w == wr_id) {
            early.swap_remove(at);
            return Ok(());
        }
        let mut wc = [hca::provider::Wc::default(); 4];
        loop {
            let n = verbs::poll_cq(al, self.cq, &mut wc).map_err(|e| e.to_string())?;
            // The first failure names the cause (flushes follow it).
            if let Some(w) = wc[..n]
                .iter()
                .find(|w| !matches!(w.status, WcStatus::Success | WcStatus::WrFlushError))
                .or_else(|| wc[..n].iter().find(|w| w.status != WcStatus::Success))
            {
                return Err(format!(
                    "iteration {i}: work request {} completed with {:?}",
                    w.wr_id, w.status
                ));
            }
            let mut found = false;
            for w in &wc[..n] {
                if w.wr_id == wr_id {
                    found = true;
                } else if w.wr_id != WRITE_ID {
                    early.push(w.wr_id);
                }
            }
            if found {
                return Ok(());
            }
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!(
                        "iteration {i}: the peer stopped answering (no completion in time)"
                    ));
                }
                std::thread::yield_now();
            }
        }
    }
}

const WRITE_ID: u64 = 1;
const SEND_ID: u64 = 2;
const RECV_BASE: u64 = 1 << 32;

/// The job's parameters after rdma_cm's header in the REQ: magic,
/// version, iterations, size, the connecting side's buffer (address of its
/// write target, R_Key).
pub(crate) fn encode_hello(iterations: u32, size: usize, rkey: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(25);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    v.extend_from_slice(&iterations.to_be_bytes());
    v.extend_from_slice(&(size as u32).to_be_bytes());
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&rkey.to_be_bytes());
    v
}

/// `(iterations, size, addr, rkey)` of a hello, or why not.
/// A request's hello: iterations, size, the peer's buffer address and
/// rkey.
pub(crate) type Hello = (u32, usize, u64, u32);

/// The hello of a request from `source`, checked. Otherwise what to
/// reject it with (the REJ's private data) and why, in words.
pub(crate) fn read_hello(
    user_data: &[u8],
    source: SocketAddr,
) -> Result<Hello, (&'static [u8], String)> {
    match decode_hello(user_data) {
        Ok(h) if h.0 > 0 && h.1 > 0 && h.1 <= MAX_SIZE => Ok(h),
        Ok(_) => Err((
            b"bad size",
            format!("{source} asked for a size or count out of range"),
        )),
        Err(e) => Err((b"not ibal pingpong", format!("{source}: {e}"))),
    }
}

pub(crate) fn decode_hello(b: &[u8]) -> Result<Hello, String> {
    if b.len() < 25 || &b[..4] != MAGIC {
        return Err("the request does not come from `ibal pingpong --connect`".into());
    }
    if b[4] != VERSION {
        return Err(format!("ping-pong version {} (we speak {VERSION})", b[4]));
    }
    let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let addr = u64::from_be_bytes(b[13..21].try_into().expect("8 bytes"));
    Ok((u32_at(5), u32_at(9) as usize, addr, u32_at(21)))
}

/// The listener's answer in the REP: magic, the address and R_Key of its
/// write target.
pub(crate) fn encode_reply(rkey: u32) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&rkey.to_be_bytes());
    v
}

pub(crate) fn decode_reply(b: &[u8]) -> Result<(u64, u32), String> {
    if b.len() < 16 || &b[..4] != MAGIC {
        return Err("the peer's reply is not from `ibal pingpong --listen`".into());
    }
    let addr = u64::from_be_bytes(b[4..12].try_into().expect("8 bytes"));
    Ok((addr, u32::from_be_bytes(b[12..16].try_into().expect("4"))))
}

/// CM events of one CEP, as a channel.
pub(crate) fn event_channel() -> (CmHandler, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let h: CmHandler = Arc::new(move |_cep, ev| {
        let _ = tx.lock().map(|t| t.send(ev.clone()));
    });
    (h, rx)
}

pub(crate) fn wait_event(
    rx: &mpsc::Receiver<Event>,
    deadline: Instant,
    what: &str,
    mut want: impl FnMut(&Event) -> Option<Result<(), String>>,
) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ev) => {
                if let Some(r) = want(&ev) {
                    return r;
                }
            }
            Err(_) => return Err(format!("timed out waiting for {what}")),
        }
    }
}

fn connect_once(
    al: &Al,
    ca: Handle<Ca>,
    remote: SocketAddr,
    cfg: &IpPingPongConfig,
) -> Result<ConnectionReport, String> {
    Side::with(al, ca, cfg.size, |side| connect_on(al, side, remote, cfg))
}

fn connect_on(
    al: &Al,
    side: &Side,
    remote: SocketAddr,
    cfg: &IpPingPongConfig,
) -> Result<ConnectionReport, String> {
    let inst = al.instance();
    let request = IpConnect::new(remote)
        .path_mtu(cfg.mtu)
        .private_data(&encode_hello(cfg.iterations, cfg.size, side.rkey));
    let t = Instant::now();
    let mut peer_buf = None;
    let (cep, events) = connect_and_answer(
        al,
        side.qp,
        &request,
        cfg.timeout,
        (cfg.peer_udp_port, "ibal pingpong --listen"),
        |rep| {
            peer_buf = Some(decode_reply(rep.private_data.as_bytes())?);
            side.post_seq_recv(al, 0)
        },
    )?;
    let connect_us = t.elapsed().as_secs_f64() * 1e6;
    let qp = QpNumbers::of(al, cep)?;
    let peer_buf = peer_buf.expect("set with the reply");
    let deadline = || Instant::now() + cfg.timeout;
    let mut rtts = match side.lead_round_trips(al, cfg.iterations, peer_buf, cfg.timeout) {
        Ok(rtts) => rtts,
        Err(e) => {
            let seen: Vec<&str> = events.try_iter().map(|e| e.name()).collect();
            let _ = al.destroy_sync(cep);
            return Err(format!("{e} [CM events: {seen:?}]"));
        }
    };
    hold(cfg, al, side);
    let t = Instant::now();
    cm::disconnect(inst, cep, &[]).map_err(|e| format!("disconnect: {e}"))?;
    let ended = wait_event(&events, deadline(), "the peer's DREP", |ev| match ev {
        Event::Disconnected { cause, .. } => {
            if *cause == cep::proto::DisconnectCause::DreqTimeout {
                // Every byte was checked; only the goodbye went unanswered.
                eprintln!(
                    "pingpong: {remote} never answered our DREQ (timed out after the CM's \
                     retries); the connection is closed on our side"
                );
            }
            Some(Ok(()))
        }
        _ => None,
    });
    let disconnect_us = t.elapsed().as_secs_f64() * 1e6;
    // Then timewait (a packet lifetime or two), and the CEP is released
    // with its comm id. A wait that runs out destroys the CEP itself, so
    // the AL still closes with nothing live.
    let released = ended.and_then(|_| {
        wait_event(&events, deadline(), "the end of timewait", |ev| {
            matches!(ev, Event::Released { .. }).then_some(Ok(()))
        })
    });
    if let Err(e) = released {
        let _ = al.destroy_sync(cep);
        return Err(e);
    }
    let (median, p99) = percentiles(&mut rtts);
    Ok(ConnectionReport {
        peer: remote,
        iterations: cfg.iterations,
        size: cfg.size,
        connect_us,
        rtt_median_us: median,
        rtt_p99_us: p99,
        disconnect_us,
        qp,
        stale: false,
    })
}

/// `--hold`: keep the connection up, saying so on stderr (a test waits
/// for the line to kill this process in the window).
pub(crate) fn hold(cfg: &IpPingPongConfig, al: &Al, side: &Side) {
    if !cfg.hold.is_zero() {
        side.settle(al);
        eprintln!(
            "pingpong: holding the connection for {:.1} s",
            cfg.hold.as_secs_f64()
        );
        std::thread::sleep(cfg.hold);
    }
}

/// How long the CM tries before it reports a REQ timed out: every try
/// waits the response timeout (and the packet lifetime, not counted).
/// Connects `qp` to `request.remote` and answers the reply: on the REP,
/// `on_reply` (what must be ready before the RTU: receives posted, the
/// peer's buffer read) and then the RTU. A REJ or a REQ that ran out of
/// tries becomes an error in plain words (`peer`: the peer's UDP port and
/// the program that should listen there). Returns the CEP and its events;
/// on an error the CEP is destroyed.
pub(crate) fn connect_and_answer(
    al: &Al,
    qp: Handle<Qp>,
    request: &IpConnect,
    timeout: Duration,
    peer: (u16, &str),
    mut on_reply: impl FnMut(&cep::wire::Rep) -> Result<(), String>,
) -> Result<(Handle<Cep>, mpsc::Receiver<Event>), String> {
    let inst = al.instance();
    let remote = request.remote;
    let (handler, events) = event_channel();
    let t = Instant::now();
    let cep = ip::connect(inst, qp, 1, request, handler)
        .map_err(|e| format!("connect to {remote}: {e}"))?;
    let timers = request.timers;
    let cm_wait = cm_give_up(timers.cm_response_timeout, timers.max_cm_retries);
    let r = wait_event(
        &events,
        t + timeout.max(cm_wait),
        "the peer's reply",
        |ev| {
            match ev {
        Event::ReplyReceived { rep, .. } => Some(
            on_reply(rep).and_then(|_| cm::rtu(inst, cep, &[]).map_err(|e| format!("RTU: {e}"))),
        ),
        Event::Rejected { reason, .. } if *reason == RejectReason::InvalidServiceId => {
            Some(Err(format!(
                "connection refused by {remote}: nobody listens on port {} there (REJ: invalid service ID)",
                remote.port()
            )))
        }
        Event::Rejected { reason, rej, .. } => Some(Err(format!(
            "{remote} rejected the connection: {reason:?}{}",
            reject_text(rej.private_data.as_bytes())
        ))),
        Event::Timeout {
            message: TimedOut::Req,
            ..
        } => Some(Err(format!(
            "no answer from {remote}: the CM request was sent {} times over {:.1} s; \
             is `{}` running there, and does UDP {} reach it?",
            u32::from(timers.max_cm_retries) + 1,
            cm_wait.as_secs_f64(),
            peer.1,
            peer.0
        ))),
        _ => None,
    }
        },
    );
    match r {
        Ok(()) => Ok((cep, events)),
        Err(e) => {
            let _ = al.destroy_sync(cep);
            Err(e)
        }
    }
}

pub(crate) fn cm_give_up(cm_response_timeout: u8, max_cm_retries: u8) -> Duration {
    let one = Duration::from_nanos(4096u64 << cm_response_timeout.min(31));
    one * (u32::from(max_cm_retries) + 1) + Duration::from_secs(1)
}

pub(crate) fn reject_text(private: &[u8]) -> String {
    let text: String = private
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .filter(|c| !c.is_control())
        .collect();
    if text.is_empty() {
        String::new()
    } else {
        format!(" ({text})")
    }
}

pub(crate) fn percentiles(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// A listen whose requests arrive on a channel.
struct Listener {
    handle: Handle<cm::Listen>,
    requests: mpsc::Receiver<(Handle<Cep>, Event)>,
    /// Events of the accepted CEPs.
    events: mpsc::Receiver<(Handle<Cep>, Event)>,
}

impl Listener {
    fn start(al: &Al, ca: Handle<Ca>, addr: SocketAddr) -> Result<Listener, String> {
        let (rtx, requests) = mpsc::channel();
        let rtx = std::sync::Mutex::new(rtx);
        let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
            let _ = rtx.lock().map(|t| t.send((cep, ev.clone())));
        });
        let (etx, events) = mpsc::channel();
        let etx = std::sync::Mutex::new(etx);
        let handler: CmHandler = Arc::new(move |cep, ev| {
            let _ = etx.lock().map(|t| t.send((cep, ev.clone())));
        });
        let handle = ip::listen(al.instance(), ca, addr, PortSpace::Tcp, on_request, handler)
            .map_err(|e| format!("listen on {addr}: {e}"))?;
        Ok(Listener {
            handle,
            requests,
            events,
        })
    }
}

fn serve_once(
    al: &Al,
    ca: Handle<Ca>,
    listener: &Listener,
    cfg: &IpPingPongConfig,
) -> Result<ConnectionReport, String> {
    let inst = al.instance();
    let (cep, req) = match listener.requests.recv_timeout(cfg.timeout) {
        Ok((cep, Event::ConnectRequest { req, .. })) => (cep, req),
        Ok((cep, _)) => {
            let _ = al.destroy_sync(cep);
            return Err("a SIDR request arrived; this job serves connections".into());
        }
        Err(_) => return Err(format!("no connection request within {:?}", cfg.timeout)),
    };
    let t = Instant::now();
    let info = match ip::request_info(&req) {
        Ok(info) => info,
        Err(e) => {
            let _ = cm::reject(inst, cep, RejectReason::ConsumerReject, b"not rdma_cm");
            let _ = al.destroy_sync(cep);
            return Err(format!("a request without rdma_cm addressing: {e}"));
        }
    };
    let (iterations, size, peer_addr, peer_rkey) = match read_hello(&info.user_data, info.source) {
        Ok(h) => h,
        Err((why, e)) => {
            let _ = cm::reject(inst, cep, RejectReason::ConsumerReject, why);
            let _ = al.destroy_sync(cep);
            return Err(e);
        }
    };
    Side::with(al, ca, size, |side| {
        let r = serve_on(
            al,
            side,
            listener,
            cep,
            (iterations, (peer_addr, peer_rkey)),
            info.source,
            t,
            cfg,
        );
        let _ = al.destroy_sync(cep);
        r
    })
}

#[allow(clippy::too_many_arguments)]
fn serve_on(
    al: &Al,
    side: &Side,
    listener: &Listener,
    cep: Handle<Cep>,
    (iterations, peer_buf): (u32, (u64, u32)),
    peer: SocketAddr,
    t: Instant,
    cfg: &IpPingPongConfig,
) -> Result<ConnectionReport, String> {
    let inst = al.instance();
    cm::accept(
        inst,
        cep,
        side.qp,
        &AcceptReply::default().private_data(&encode_reply(side.rkey)),
    )
    .map_err(|e| format!("accept: {e}"))?;
    let qp = QpNumbers::of(al, cep)?;
    // The QP is in RTR now; the peer sends only after our REP reached it.
    side.post_seq_recv(al, 0)?;
    let events = &listener.events;
    let ours = |ev: &(Handle<Cep>, Event)| ev.0 == cep;
    loop {
        match events.recv_timeout(cfg.timeout) {
            Ok(ev) if ours(&ev) => match ev.1 {
                Event::Established { .. } => break,
                Event::Rejected { reason, .. } => {
                    return Err(format!("{peer} rejected our reply: {reason:?}"))
                }
                Event::Timeout { .. } => return Err(format!("{peer} never sent its RTU")),
                _ => {}
            },
            Ok(_) => {}
            Err(_) => return Err(format!("{peer} never completed the connection")),
        }
    }
    let connect_us = t.elapsed().as_secs_f64() * 1e6;
    let (mut rtts, dreq_first) = side.answer_round_trips(
        al,
        iterations,
        peer_buf,
        cfg.timeout,
        || {
            format!(
                "{:?}",
                events.try_iter().map(|e| e.1.name()).collect::<Vec<_>>()
            )
        },
        |e| {
            let until = Instant::now() + cfg.timeout;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                match events.recv_timeout(left) {
                    Ok((c, Event::DisconnectRequest { .. })) if c == cep => return Ok(()),
                    Ok(_) => {}
                    Err(_) => return Err(format!("{e} (and no DREQ from {peer} followed)")),
                }
            }
        },
    )?;
    // The peer disconnects: answer its DREQ, wait for the release (after
    // timewait). The time reported is from our last SEND to the DREP.
    let t = Instant::now();
    let mut answered = false;
    let mut stale = false;
    let mut disconnect_us = 0.0;
    if dreq_first {
        hold(cfg, al, side);
        cm::disconnect_reply(inst, cep, &[]).map_err(|e| format!("DREP: {e}"))?;
        disconnect_us = t.elapsed().as_secs_f64() * 1e6;
        answered = true;
    }
    loop {
        match events.recv_timeout(cfg.timeout) {
            Ok((c, Event::DisconnectRequest { .. })) if c == cep => {
                hold(cfg, al, side);
                cm::disconnect_reply(inst, cep, &[]).map_err(|e| format!("DREP: {e}"))?;
                disconnect_us = t.elapsed().as_secs_f64() * 1e6;
                answered = true;
            }
            // A new REQ from the peer's GUID named this connection's QPN:
            // the peer restarted, this connection is dead; the CM sends
            // the DREQ and releases it when that is answered or times out.
            Ok((c, Event::StaleConnection { .. })) if c == cep => stale = true,
            Ok((c, Event::Released { .. })) if c == cep => break,
            Ok(_) => {}
            Err(_) => {
                return Err(format!(
                    "{peer} did not disconnect (DREQ {})",
                    if answered {
                        "answered, no release"
                    } else {
                        "never came"
                    }
                ))
            }
        }
    }
    let (median, p99) = percentiles(&mut rtts);
    Ok(ConnectionReport {
        peer,
        iterations,
        size: side.size,
        connect_us,
        rtt_median_us: median,
        rtt_p99_us: p99,
        disconnect_us,
        qp,
        stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_reply_round_trip_and_strangers_are_refused() {
        let h = encode_hello(7, 4096, 0xabcd);
        assert!(h.len() <= cep::wire::ip_cm::MAX_REQ_USER_DATA);
        let mut padded = h.clone();
        padded.resize(56, 0);
        assert_eq!(decode_hello(&padded).unwrap(), (7, 4096, 0, 0xabcd));
        assert!(decode_hello(b"IBPQ and more bytes than twenty-five").is_err());
        let mut old = h;
        old[4] = 9;
        assert!(decode_hello(&old).is_err());
        assert_eq!(decode_reply(&encode_reply(5)).unwrap(), (0, 5));
        assert!(decode_reply(&[0; 16]).is_err());
    }

    #[test]
    fn loopback_peers_get_the_next_loopback_address() {
        let l = |s: &str| local_address_for(s.parse().unwrap(), 4791).unwrap();
        assert_eq!(l("127.0.0.1"), "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(l("127.0.0.254"), "127.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn two_endpoints_in_one_process_run_the_whole_job() {
        // The two roles on two loopback addresses and UDP ports of their
        // own, in two threads: the same code the two processes run.
        let listen: SocketAddr = "127.0.0.61:7471".parse().unwrap();
        let mut server = IpPingPongConfig::new(Role::Listen(listen));
        server.udp_port = 25_861;
        server.peer_udp_port = 25_862;
        server.timeout = Duration::from_secs(20);
        let mut client = IpPingPongConfig::new(Role::Connect(listen));
        client.local = Some("127.0.0.62".parse().unwrap());
        client.udp_port = 25_862;
        client.peer_udp_port = 25_861;
        client.iterations = 50;
        client.size = 5000;
        let s = std::thread::spawn(move || run(&server));
        // The listener must be up before the REQ's retries run out.
        std::thread::sleep(Duration::from_millis(100));
        let c = run(&client);
        let s = s.join().unwrap();
        let (c, s) = match (c, s) {
            (Ok(c), Ok(s)) => (c, s),
            other => panic!("{other:?}"),
        };
        assert_eq!(c.connections[0].iterations, 50);
        assert_eq!(s.connections[0].iterations, 50);
        assert_eq!(s.connections[0].size, 5000);
        assert_eq!(c.live_after_close, 0);
        assert_eq!(s.live_after_close, 0);
        assert!(c.to_json().contains("\"role\":\"connect\""));
        // The port's counters close the report; nothing came from anyone
        // but the peer.
        let counters = c.port_counters.as_ref().unwrap();
        let count = |name: &str| counters.iter().find(|(k, _)| *k == name).unwrap().1;
        assert!(count("rx_packets") > 100, "{counters:?}");
        assert_eq!(count("rx_wrong_source"), 0);
        assert!(c.to_json().contains("\"port_counters\":{\"rx_datagrams\":"));
    }

    #[test]
    fn an_unreachable_peer_and_a_refused_service_are_reported_clearly() {
        // Nobody on 127.0.0.63: the REQ times out.
        let mut cfg = IpPingPongConfig::new(Role::Connect("127.0.0.63:7471".parse().unwrap()));
        cfg.local = Some("127.0.0.64".parse().unwrap());
        cfg.udp_port = 25_864;
        cfg.peer_udp_port = 25_863;
        let e = run(&cfg).unwrap_err();
        assert!(e.contains("no answer from 127.0.0.63:7471"), "{e}");

        // A listener on another port: Linux's answer, REJ invalid service ID.
        let listen: SocketAddr = "127.0.0.65:7000".parse().unwrap();
        let mut server = IpPingPongConfig::new(Role::Listen(listen));
        server.udp_port = 25_865;
        server.peer_udp_port = 25_866;
        server.timeout = Duration::from_secs(3);
        let s = std::thread::spawn(move || run(&server));
        std::thread::sleep(Duration::from_millis(100));
        let mut cfg = IpPingPongConfig::new(Role::Connect("127.0.0.65:7001".parse().unwrap()));
        cfg.local = Some("127.0.0.66".parse().unwrap());
        cfg.udp_port = 25_866;
        cfg.peer_udp_port = 25_865;
        let e = run(&cfg).unwrap_err();
        assert!(e.contains("connection refused"), "{e}");
        let s = s.join().unwrap().unwrap_err();
        assert!(s.contains("no connection request"), "{s}");
    }
}
