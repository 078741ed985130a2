//! `ibal qp-exchange`: a ping-pong between two processes (or hosts) over
//! the RoCEv2 provider, with the QP addresses exchanged over TCP in the
//! format of rdma-core's `ibv_rc_pingpong`/`ibv_ud_pingpong`
//! ([`crate::oob`]), so either side may be one of those tools.
//!
//! One RoCE CA is opened through the object layer (a [`RoceProvider`]
//! device on `--local`), with a PD, a CQ, an RC or UD QP and registered
//! buffers. The loop is the tools' loop: the client posts the first SEND;
//! a side posts its next SEND when its previous SEND completed and a
//! receive arrived; `iters` round trips. Every received message is checked
//! byte for byte: against the peer's pattern when the peer is ibal (it
//! says so in the extension), or against what we sent when the peer is an
//! ibv tool (they receive into the buffer they send from, so they echo;
//! their first message is their buffer's fill byte 0x7b). With `--write`
//! (ibal peers only) each SEND follows an RDMA WRITE into the peer's
//! target buffer, checked when the SEND arrives. At the end everything is
//! destroyed and the AL must report zero live objects.

use std::hash::BuildHasher;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::{gid_of, DeviceConfig, PortConfig, RoceProvider};

use crate::oob::{self, Dest, Ext};

/// Which end of the TCP side channel this process is.
#[derive(Clone, Debug)]
pub enum Role {
    /// Wait for one client on this address.
    Listen(SocketAddr),
    /// Connect to this host and TCP port.
    Connect(String, u16),
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct QpxConfig {
    /// Server or client.
    pub role: Role,
    /// The RoCEv2 port's IP address (its GID).
    pub local: IpAddr,
    /// UDP port the RoCEv2 port binds.
    pub udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    pub peer_udp_port: u16,
    /// UD instead of RC.
    pub ud: bool,
    /// Round trips.
    pub iters: u32,
    /// Bytes per message.
    pub size: usize,
    /// Path MTU (and the port's MTU).
    pub mtu: Mtu,
    /// Receives kept posted.
    pub rx_depth: u32,
    /// The GID index we report (informational).
    pub gid_index: i32,
    /// RDMA WRITE before every SEND (ibal peers only).
    pub write: bool,
    /// Behave as the ibv tools do (for tests without them): no extension,
    /// the socket closed after the exchange, a buffer filled with 0x7b
    /// that each SEND sends and each receive overwrites (so it echoes); the
    /// data is not checked.
    pub plain: bool,
    /// Bound on every wait (TCP connect, accept, reads, completions).
    pub timeout: Duration,
    /// RC: the local ACK timeout attribute (4.096 us * 2^N; the tools' 14
    /// is about 67 ms). Must exceed the path's longest delay.
    pub ack_timeout: u8,
    /// RC: transport retries before a SEND fails with RETRY_EXC (0..=7).
    pub retry_cnt: u8,
    /// `--rdma-bulk SIZE` (RC, ibal extension peers: another ibal or
    /// `.ci/rxe-peer/rdma_peer.c`): instead of the ping-pong, each side
    /// exposes a buffer of `2 * SIZE` bytes (REMOTE_WRITE and REMOTE_READ)
    /// whose second half holds its [`oob::bulk_pattern`]; the client RDMA
    /// WRITEs SIZE bytes of its pattern into the first half of the
    /// server's, RDMA READs the server's second half and checks it, sends
    /// `ibal-qpx/1 bulk-done ...`, and the server checks what was written
    /// and answers with its verdict line.
    pub bulk: Option<usize>,
}

/// What a `--rdma-bulk` run did.
#[derive(Clone, Debug, Default)]
pub struct BulkReport {
    /// Bytes written and bytes read.
    pub size: usize,
    /// Client: seconds from posting the WRITE to its completion.
    pub write_seconds: f64,
    /// Client: seconds from posting the READ to its completion.
    pub read_seconds: f64,
    /// Bytes of the READ checked (client) or of the WRITE (server).
    pub checked: usize,
    /// Packets each way at the path MTU (ceil(size / MTU)).
    pub packets: usize,
    /// The verdict line the peer (server) sent back, or the one we sent.
    pub verdict: String,
    /// Client: the peer's buffer address and R_Key (our WRITE's RETH
    /// carries them; the READ's address is `size` further).
    pub peer_buffer: (u64, u32),
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct QpxReport {
    /// `rc` or `ud`.
    pub mode: &'static str,
    /// `server` or `client`.
    pub role: &'static str,
    /// `ibal` (extension seen) or `ibv` (plain ibv_*_pingpong peer).
    pub peer: &'static str,
    /// Our address.
    pub local: Dest,
    /// The peer's address.
    pub remote: Dest,
    /// Round trips done.
    pub iters: u32,
    /// Message size.
    pub size: usize,
    /// SEND payload bytes moved both ways (the tools' count).
    pub bytes: u64,
    /// RDMA WRITEs received and checked.
    pub writes_checked: u32,
    /// Messages received and checked byte for byte.
    pub messages_checked: u32,
    /// Seconds from the first SEND to the last completion.
    pub seconds: f64,
    /// With `--write`: the R_Key of our WRITE target (the peer's RETHs
    /// carry it) and the peer's (ours carry it); 0 otherwise.
    pub write_rkeys: (u32, u32),
    /// The AL's object counts at close.
    pub close_stats: String,
    /// `--rdma-bulk`: what moved.
    pub bulk: Option<BulkReport>,
}

impl QpxReport {
    /// Megabits per second as the ibv tools print it.
    pub fn mbit_per_sec(&self) -> f64 {
        self.bytes as f64 * 8.0 / (self.seconds * 1e6)
    }

    /// Megabytes (10^6) per second.
    pub fn mbyte_per_sec(&self) -> f64 {
        self.bytes as f64 / (self.seconds * 1e6)
    }

    /// Microseconds per round trip.
    pub fn usec_per_iter(&self) -> f64 {
        self.seconds * 1e6 / f64::from(self.iters.max(1))
    }

    /// Human-readable, in the tools' words.
    pub fn to_text(&self) -> String {
        if let Some(b) = &self.bulk {
            return self.bulk_text(b);
        }
        let d = |x: &Dest| {
            format!(
                "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
                x.lid,
                x.qpn,
                x.psn,
                std::net::Ipv6Addr::from(x.gid)
            )
        };
        let mut s = String::new();
        s += &format!("  local address:  {}\n", d(&self.local));
        s += &format!("  remote address: {}\n", d(&self.remote));
        s += &format!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec ({:.2} MB/s)\n",
            self.bytes,
            self.seconds,
            self.mbit_per_sec(),
            self.mbyte_per_sec()
        );
        s += &format!(
            "{} iters in {:.2} seconds = {:.2} usec/iter\n",
            self.iters,
            self.seconds,
            self.usec_per_iter()
        );
        s += &format!(
            "checked: {} {} messages from an {} peer byte for byte{}\n",
            self.messages_checked,
            self.mode.to_uppercase(),
            self.peer,
            if self.writes_checked > 0 {
                format!(", and {} RDMA WRITEs", self.writes_checked)
            } else {
                String::new()
            }
        );
        s += &format!("closed: {}\n", self.close_stats);
        s
    }

    fn bulk_text(&self, b: &BulkReport) -> String {
        let mut s = format!(
            "  local address:  QPN 0x{:06x}, PSN 0x{:06x}\n  remote address: QPN 0x{:06x}, PSN 0x{:06x}\n",
            self.local.qpn, self.local.psn, self.remote.qpn, self.remote.psn
        );
        if self.role == "client" {
            let rate = |secs: f64| b.size as f64 / (secs.max(1e-9) * 1e6);
            s += &format!(
                "RDMA WRITE {} bytes ({} packets) in {:.3} s = {:.2} MB/s\n",
                b.size,
                b.packets,
                b.write_seconds,
                rate(b.write_seconds)
            );
            s += &format!(
                "RDMA READ  {} bytes ({} packets) in {:.3} s = {:.2} MB/s, {} bytes checked\n",
                b.size,
                b.packets,
                b.read_seconds,
                rate(b.read_seconds),
                b.checked
            );
            s += &format!("peer's verdict on our WRITE: {}\n", b.verdict);
        } else {
            s += &format!("checked the peer's RDMA WRITE: {}\n", b.verdict);
        }
        s += &format!("closed: {}\n", self.close_stats);
        s
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let bulk = match &self.bulk {
            Some(b) => format!(
                concat!(
                    ",\"bulk\":{{\"size\":{},\"packets\":{},\"write_seconds\":{:.6},",
                    "\"read_seconds\":{:.6},\"checked\":{},\"peer_addr\":{},\"peer_rkey\":{},",
                    "\"verdict\":\"{}\"}}"
                ),
                b.size,
                b.packets,
                b.write_seconds,
                b.read_seconds,
                b.checked,
                b.peer_buffer.0,
                b.peer_buffer.1,
                json_escape(&b.verdict)
            ),
            None => String::new(),
        };
        format!(
            concat!(
                "{{\"command\":\"qp-exchange\",\"mode\":\"{}\",\"role\":\"{}\",\"peer\":\"{}\",",
                "\"local\":{{\"qpn\":{},\"psn\":{},\"gid\":\"{}\"}},",
                "\"remote\":{{\"qpn\":{},\"psn\":{},\"gid\":\"{}\"}},",
                "\"iters\":{},\"size\":{},\"bytes\":{},\"messages_checked\":{},",
                "\"writes_checked\":{},\"local_write_rkey\":{},\"remote_write_rkey\":{},",
                "\"seconds\":{:.6},\"mbit_per_sec\":{:.3},",
                "\"mbyte_per_sec\":{:.3},\"usec_per_iter\":{:.3}{},\"clean\":true}}"
            ),
            self.mode,
            self.role,
            self.peer,
            self.local.qpn,
            self.local.psn,
            std::net::Ipv6Addr::from(self.local.gid),
            self.remote.qpn,
            self.remote.psn,
            std::net::Ipv6Addr::from(self.remote.gid),
            self.iters,
            self.size,
            self.bytes,
            self.messages_checked,
            self.writes_checked,
            self.write_rkeys.0,
            self.write_rkeys.1,
            self.seconds,
            self.mbit_per_sec(),
            self.mbyte_per_sec(),
            self.usec_per_iter(),
            bulk,
        )
    }
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const WRITE_IOVA: u64 = 0x1000_0000;

fn random_u32() -> u32 {
    let h = std::collections::hash_map::RandomState::new()
        .hash_one((std::process::id(), Instant::now()));
    (h ^ (h >> 32)) as u32
}

fn io_err(what: &str, e: std::io::Error) -> String {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => format!("timed out {what}"),
        ErrorKind::UnexpectedEof => format!("{what}: the peer closed the connection"),
        _ => format!("{what}: {e}"),
    }
}

/// Connect to the side channel, bounded by `timeout`.
fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?
        .collect();
    let mut last = format!("no address for {host}:{port}");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => {
                last = io_err(
                    &format!("connecting to {a} (the peer's TCP side channel)"),
                    e,
                )
            }
        }
    }
    Err(format!("the peer is unreachable: {last}"))
}

/// Accept one client, bounded by `timeout`.
fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listen socket: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| format!("accepted socket: {e}"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "timed out after {:.1} s waiting for a client on {}",
                        timeout.as_secs_f64(),
                        listener
                            .local_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

/// Read the extension line, or learn the peer is a plain ibv tool (EOF or
/// a reset before any byte). At most 256 bytes.
fn read_ext(s: &mut TcpStream) -> Result<Option<Ext>, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return Err("the peer closed the connection inside its extension line".into()),
            Ok(_) => {
                if byte[0] == b'\n' {
                    break;
                }
                line.push(byte[0]);
                if line.len() > 256 {
                    return Err("the peer's extension line is longer than 256 bytes".into());
                }
            }
            Err(e)
                if line.is_empty()
                    && matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(io_err("reading the peer's extension line", e)),
        }
    }
    let text = String::from_utf8(line).map_err(|_| "the peer's extension line is not text")?;
    Ext::decode(&text).map(Some).map_err(|e| e.to_string())
}

fn read_msg(s: &mut TcpStream) -> Result<Dest, String> {
    let mut msg = [0u8; oob::MSG_LEN];
    let mut got = 0;
    while got < msg.len() {
        match s.read(&mut msg[got..]) {
            Ok(0) => {
                return Err(format!(
                    "the peer closed the side channel after {got} of the {} bytes of its address message",
                    oob::MSG_LEN
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("reading the peer's address message", e)),
        }
    }
    oob::decode(&msg).map_err(|e| format!("bad message from the peer: {e}"))
}

/// Whether the peer has closed the side channel (EOF or a reset waiting
/// to be read), without consuming anything.
fn side_channel_closed(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    let _ = s.set_nonblocking(false);
    match r {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
        ),
    }
}

/// The objects of one side.
struct Side {
    ca: Handle<Ca>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    mr: Handle<Mr>,
    wmr: Handle<Mr>,
    av: Option<Handle<Av>>,
    buf: RegisteredBuffer,
    wbuf: RegisteredBuffer,
    lkey: u32,
    wlkey: u32,
    wrkey: u32,
}

// Buffer layout: [send area: size][receive area: (40 +) size][WRITE source: size]
struct Layout {
    size: usize,
    recv_at: usize,
    recv_len: usize,
    wsrc_at: usize,
    total: usize,
}

impl Layout {
    fn new(size: usize, ud: bool) -> Layout {
        let recv_len = size + if ud { oob::GRH_BYTES } else { 0 };
        Layout {
            size,
            recv_at: size,
            recv_len,
            wsrc_at: size + recv_len,
            total: 2 * size + recv_len,
        }
    }
}

fn mtu_bytes(m: Mtu) -> usize {
    match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

/// How the AL closed after a failed run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The run failed before the AL was opened.
    NotOpened,
    /// Nothing was left live (the AL's object counts).
    Clean(String),
    /// Objects were left live (the AL's object counts).
    Leaked(String),
    /// The close itself failed (its error).
    Failed(String),
}

/// A failed run: what went wrong, and how the AL closed afterwards (a
/// failure is never mistaken for a leak, and a leak never hides behind a
/// failure).
#[derive(Clone, Debug)]
pub struct QpxFailure {
    /// What went wrong (empty when only the close went wrong).
    pub error: String,
    /// The close.
    pub closed: Closed,
}

impl QpxFailure {
    fn before_open(error: impl Into<String>) -> QpxFailure {
        QpxFailure {
            error: error.into(),
            closed: Closed::NotOpened,
        }
    }

    /// Whether nothing was left live.
    pub fn clean(&self) -> bool {
        matches!(self.closed, Closed::NotOpened | Closed::Clean(_))
    }

    /// One JSON object: `error`, `close` (`not-opened`, `clean`, `leaked`
    /// or `failed`), `close_detail` and `clean`.
    pub fn to_json(&self) -> String {
        let (close, detail) = match &self.closed {
            Closed::NotOpened => ("not-opened", ""),
            Closed::Clean(s) => ("clean", s.as_str()),
            Closed::Leaked(s) => ("leaked", s.as_str()),
            Closed::Failed(s) => ("failed", s.as_str()),
        };
        format!(
            "{{\"command\":\"qp-exchange\",\"error\":\"{}\",\"close\":\"{close}\",\"close_detail\":\"{}\",\"clean\":{}}}",
            json_escape(&self.error),
            json_escape(detail),
            self.clean()
        )
    }
}

impl std::fmt::Display for QpxFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)?;
        let sep = if self.error.is_empty() { "" } else { "\n" };
        match &self.closed {
            Closed::NotOpened => Ok(()),
            Closed::Clean(s) => write!(f, "{sep}closed: no objects left live ({s})"),
            Closed::Leaked(s) => write!(f, "{sep}objects left live at close: {s}"),
            Closed::Failed(s) => write!(f, "{sep}closing the AL: {s}"),
        }
    }
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Run one exchange. Progress lines go to stderr; the report is returned.
pub fn run(cfg: &QpxConfig) -> Result<QpxReport, QpxFailure> {
    if cfg.size == 0 || cfg.iters == 0 || cfg.rx_depth < 2 {
        return Err(QpxFailure::before_open(
            "--size and --iters must be at least 1 (and rx depth at least 2)",
        ));
    }
    if cfg.ud && cfg.size > mtu_bytes(cfg.mtu) {
        return Err(QpxFailure::before_open(format!(
            "UD messages must fit the MTU: --size {} > --mtu {}",
            cfg.size,
            mtu_bytes(cfg.mtu)
        )));
    }
    if cfg.ud && cfg.write {
        return Err(QpxFailure::before_open("--write needs --mode rc"));
    }
    if let Some(b) = cfg.bulk {
        if cfg.ud || cfg.write || cfg.plain {
            return Err(QpxFailure::before_open(
                "--rdma-bulk needs --mode rc (and neither --write nor --plain)",
            ));
        }
        if b == 0 || b > (1 << 30) {
            return Err(QpxFailure::before_open(
                "--rdma-bulk SIZE must be 1 byte to 1 GiB",
            ));
        }
    }
    let guid = 0x0249_4241_4c00_0000u64 | u64::from(random_u32() & 0xffff);
    let port = PortConfig::new(SocketAddr::new(cfg.local, cfg.udp_port))
        .peer_udp_port(cfg.peer_udp_port)
        .mtu(cfg.mtu);
    let provider = RoceProvider::new(vec![DeviceConfig::new("roce0", guid, vec![port])]);
    let al = Al::open().map_err(|err| QpxFailure::before_open(err.to_string()))?;
    let result = exchange(&al, &provider, guid, cfg);
    // Close whatever happened: a failed run still must not leak.
    let closed = match al.close() {
        Ok(stats) if stats.is_clean() => Closed::Clean(stats.to_string()),
        Ok(stats) => Closed::Leaked(stats.to_string()),
        Err(err) => Closed::Failed(err.to_string()),
    };
    match (result, closed) {
        (Ok(mut report), Closed::Clean(stats)) => {
            report.close_stats = stats;
            Ok(report)
        }
        (Ok(_), closed) => Err(QpxFailure {
            error: String::new(),
            closed,
        }),
        (Err(error), closed) => Err(QpxFailure { error, closed }),
    }
}

fn open_side(
    al: &Al,
    provider: &RoceProvider,
    guid: u64,
    cfg: &QpxConfig,
    lay: &Layout,
) -> Result<Side, Error> {
    let ca = al.open_ca(provider, guid).map_err(|err| {
        Error::Other(
            format!(
                "cannot open the RoCE port on {}:{}: {err}",
                cfg.local, cfg.udp_port
            )
            .into(),
        )
    })?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, cfg.rx_depth + 8)?;
    let caps = hca::provider::QpCaps {
        max_send_wr: 4,
        max_recv_wr: cfg.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let qp_type = if cfg.ud { QpType::Ud } else { QpType::Rc };
    let qp = pd.create_qp(
        al,
        QpCreate {
            caps,
            ..QpCreate::new(qp_type, cq)
        },
    )?;
    let buf = RegisteredBuffer::new(lay.total);
    let mr = pd.register(al, &buf, Access::LOCAL_WRITE)?;
    let (lkey, _) = mr.keys(al)?;
    // With --rdma-bulk: [WRITE target / our WRITE source: bulk][READ
    // source / our READ sink: bulk], open to the peer for both.
    let (wlen, waccess) = match cfg.bulk {
        Some(b) => (
            2 * b,
            Access::LOCAL_WRITE
                .union(Access::REMOTE_WRITE)
                .union(Access::REMOTE_READ),
        ),
        None => (lay.size, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)),
    };
    let wbuf = RegisteredBuffer::new(wlen);
    let wmr = pd.register_range(al, &wbuf, 0, wlen, WRITE_IOVA, waccess)?;
    let (wlkey, wrkey) = wmr.keys(al)?;
    let mut init = QpModify::to(QpState::Init).pkey_index(0).port(1);
    init = if cfg.ud {
        init.qkey(oob::UD_QKEY)
    } else if cfg.bulk.is_some() {
        init.access(Access::REMOTE_WRITE.union(Access::REMOTE_READ))
    } else if cfg.write {
        init.access(Access::REMOTE_WRITE)
    } else {
        init.access(Access::NONE)
    };
    qp.modify(al, &init)?;
    Ok(Side {
        ca,
        pd,
        cq,
        qp,
        mr,
        wmr,
        av: None,
        buf,
        wbuf,
        lkey,
        wlkey,
        wrkey,
    })
}

/// RTR and RTS with the tools' attributes (RC), or plain RTR/RTS and an
/// address vector to the peer (UD).
fn connect_qp(
    al: &Al,
    side: &mut Side,
    cfg: &QpxConfig,
    me: &Dest,
    peer: &Dest,
) -> Result<(), String> {
    let e = |err: Error| err.to_string();
    if !oob::has_interface_id(&peer.gid) {
        return Err(format!(
            "the peer sent GID {} (no interface id): a RoCE peer must send its GID (run ibv_*_pingpong with -g INDEX)",
            std::net::Ipv6Addr::from(peer.gid)
        ));
    }
    let av = AvAttr {
        port: 1,
        dlid: peer.lid,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        grh: Some(hca::provider::GrhAttr {
            dgid: peer.gid,
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 1,
            traffic_class: 0,
        }),
    };
    if cfg.ud {
        side.qp.modify(al, &QpModify::to(QpState::Rtr)).map_err(e)?;
        side.qp
            .modify(al, &QpModify::to(QpState::Rts).sq_psn(me.psn))
            .map_err(e)?;
        side.av = Some(side.pd.create_av(al, av).map_err(e)?);
    } else {
        let rtr = QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(cfg.mtu)
            .dest_qpn(peer.qpn)
            .rq_psn(peer.psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12);
        side.qp.modify(al, &rtr).map_err(e)?;
        let rts = QpModify::to(QpState::Rts)
            .timeout(cfg.ack_timeout)
            .retry_cnt(cfg.retry_cnt)
            .rnr_retry(7)
            .sq_psn(me.psn)
            .max_rd_atomic(1);
        side.qp.modify(al, &rts).map_err(e)?;
    }
    Ok(())
}

fn exchange(
    al: &Al,
    provider: &RoceProvider,
    guid: u64,
    cfg: &QpxConfig,
) -> Result<QpxReport, String> {
    let e = |err: Error| err.to_string();
    let lay = Layout::new(cfg.size, cfg.ud);
    let mut side = open_side(al, provider, guid, cfg, &lay).map_err(e)?;
    let out = pingpong(al, &mut side, cfg, &lay);
    // Tear down in reverse order, whatever happened.
    let destroy = (|| -> Result<(), Error> {
        side.qp.destroy(al)?;
        if let Some(av) = side.av {
            av.destroy(al)?;
        }
        side.wmr.destroy(al)?;
        side.mr.destroy(al)?;
        side.cq.destroy(al)?;
        side.pd.destroy(al)?;
        side.ca.destroy(al)
    })();
    let report = out?;
    destroy.map_err(e)?;
    Ok(report)
}

fn pingpong(al: &Al, side: &mut Side, cfg: &QpxConfig, lay: &Layout) -> Result<QpxReport, String> {
    let e = |err: Error| err.to_string();
    let recv_sge = [Sge {
        addr: lay.recv_at as u64,
        length: lay.recv_len as u32,
        lkey: side.lkey,
    }];
    for _ in 0..cfg.rx_depth {
        side.qp
            .post_recv(
                al,
                &[RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &recv_sge,
                }],
            )
            .map_err(e)?;
    }
    let seed = (random_u32() & 0xff) as u8;
    let me = Dest {
        lid: 0,
        qpn: side.qp.query(al).map_err(e)?.qpn,
        psn: random_u32() & 0xff_ffff,
        gid: gid_of(cfg.local),
    };
    let my_ext = Ext {
        ud: cfg.ud,
        size: cfg.size as u32,
        iters: cfg.iters,
        seed,
        write: (cfg.write || cfg.bulk.is_some()).then_some((WRITE_IOVA, side.wrkey)),
        bulk: cfg.bulk.unwrap_or(0) as u64,
    };
    if let Some(b) = cfg.bulk {
        // Our READ source (the peer reads it); the WRITE target is zeroed
        // so that a WRITE that never landed fails the check.
        side.wbuf.write(0, &vec![0u8; b]).map_err(e)?;
        side.wbuf.write(b, &oob::bulk_pattern(seed, b)).map_err(e)?;
    }
    eprintln!(
        "qp-exchange: {} QPN {:#08x} PSN {:#08x} on {}:{} (GID {}, reported as index {})",
        if cfg.ud { "UD" } else { "RC" },
        me.qpn,
        me.psn,
        cfg.local,
        cfg.udp_port,
        std::net::Ipv6Addr::from(me.gid),
        cfg.gid_index
    );

    // The side channel.
    let (mut sock, peer, peer_ext, server) = match &cfg.role {
        Role::Listen(addr) => {
            let listener =
                TcpListener::bind(addr).map_err(|err| format!("cannot listen on {addr}: {err}"))?;
            eprintln!(
                "qp-exchange: listening on {}",
                listener.local_addr().map_err(|err| err.to_string())?
            );
            let mut s = accept(&listener, cfg.timeout)?;
            drop(listener);
            s.set_read_timeout(Some(cfg.timeout))
                .map_err(|err| err.to_string())?;
            let peer = read_msg(&mut s)?;
            connect_qp(al, side, cfg, &me, &peer)?;
            s.write_all(&oob::encode(&me))
                .map_err(|err| io_err("sending our address message", err))?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done)
                .map_err(|err| io_err("reading the client's final \"done\"", err))?;
            if &done != oob::DONE {
                return Err(format!(
                    "bad message from the peer: expected \"done\\0\", got {done:?}"
                ));
            }
            // Offer the extension; a plain ibv client has closed by now.
            let ext = if cfg.plain {
                None
            } else {
                match s.write_all(my_ext.encode().as_bytes()) {
                    Ok(()) => read_ext(&mut s)?,
                    Err(_) => None,
                }
            };
            (s, peer, ext, true)
        }
        Role::Connect(host, port) => {
            let mut s = connect(host, *port, cfg.timeout)?;
            s.set_read_timeout(Some(cfg.timeout))
                .map_err(|err| err.to_string())?;
            s.write_all(&oob::encode(&me))
                .map_err(|err| io_err("sending our address message", err))?;
            let peer = read_msg(&mut s)?;
            s.write_all(oob::DONE)
                .map_err(|err| io_err("sending \"done\"", err))?;
            let ext = if cfg.plain { None } else { read_ext(&mut s)? };
            if ext.is_some() {
                s.write_all(my_ext.encode().as_bytes())
                    .map_err(|err| io_err("sending our extension line", err))?;
            }
            connect_qp(al, side, cfg, &me, &peer)?;
            (s, peer, ext, false)
        }
    };
    let peer_is_ibal = peer_ext.is_some();
    eprintln!(
        "qp-exchange: peer QPN {:#08x} PSN {:#08x} GID {} ({})",
        peer.qpn,
        peer.psn,
        std::net::Ipv6Addr::from(peer.gid),
        if peer_is_ibal {
            "ibal"
        } else {
            "plain ibv tool"
        }
    );
    if let Some(b) = cfg.bulk {
        let x = match peer_ext {
            Some(x) if x.bulk == b as u64 && !x.ud && x.write.is_some() => x,
            Some(x) => {
                return Err(format!(
                    "--rdma-bulk {b}: the peer runs mode={} bulk={} write={} (it must run --rdma-bulk {b} too)",
                    if x.ud { "ud" } else { "rc" },
                    x.bulk,
                    u8::from(x.write.is_some())
                ))
            }
            None => {
                return Err(
                    "--rdma-bulk needs a peer that speaks the ibal extension (ibal --rdma-bulk or rdma_peer); the peer is a plain ibv tool"
                        .into(),
                )
            }
        };
        let report = if server {
            bulk_passive(al, side, &mut sock, cfg, b, &x)?
        } else {
            bulk_active(al, side, &mut sock, cfg, b, seed, &x)?
        };
        return Ok(QpxReport {
            mode: "rc",
            role: if server { "server" } else { "client" },
            peer: "ibal",
            local: me,
            remote: peer,
            iters: 0,
            size: b,
            bytes: 2 * b as u64,
            writes_checked: 0,
            messages_checked: 0,
            seconds: report.write_seconds + report.read_seconds,
            write_rkeys: (side.wrkey, x.write.map_or(0, |w| w.1)),
            close_stats: String::new(),
            bulk: Some(report),
        });
    }
    let peer_write = match peer_ext {
        Some(x) => {
            if x.ud != cfg.ud || x.size as usize != cfg.size || x.iters != cfg.iters {
                return Err(format!(
                    "the peer runs mode={} size={} iters={}, we run mode={} size={} iters={}",
                    if x.ud { "ud" } else { "rc" },
                    x.size,
                    x.iters,
                    if cfg.ud { "ud" } else { "rc" },
                    cfg.size,
                    cfg.iters
                ));
            }
            if x.write.is_some() != cfg.write {
                return Err("--write must be given on both sides".into());
            }
            x.write
        }
        None if cfg.write => {
            return Err(
                "--write needs an ibal peer (the peer is a plain ibv tool: no extension)".into(),
            )
        }
        None => None,
    };

    // The loop.
    let send_sge = [Sge {
        addr: 0,
        length: cfg.size as u32,
        lkey: side.lkey,
    }];
    let wsrc_sge = [Sge {
        addr: lay.wsrc_at as u64,
        length: cfg.size as u32,
        lkey: side.lkey,
    }];
    if cfg.plain {
        // As the tools: the side channel is done.
        let _ = sock.shutdown(std::net::Shutdown::Both);
    }
    let echo = std::cell::RefCell::new(vec![oob::IBV_FILL; cfg.size]);
    let post_round = |round: u32| -> Result<(), String> {
        if cfg.plain {
            side.buf.write(0, &echo.borrow()).map_err(e)?;
        } else {
            side.buf
                .write(0, &oob::pattern(seed, round, cfg.size))
                .map_err(e)?;
        }
        if let Some((addr, rkey)) = peer_write {
            side.buf
                .write(
                    lay.wsrc_at,
                    &oob::pattern(oob::write_seed(seed), round, cfg.size),
                )
                .map_err(e)?;
            let w = SendWr::new(
                3,
                SendOp::Write {
                    remote_addr: addr,
                    rkey,
                },
                &wsrc_sge,
            )
            .unsignaled();
            side.qp.post_send(al, &[w]).map_err(e)?;
        }
        let wr = SendWr::new(SEND_WRID, SendOp::Send, &send_sge);
        match side.av {
            Some(av) => {
                let dest = UdDest {
                    av: &av,
                    remote_qpn: peer.qpn,
                    remote_qkey: oob::UD_QKEY,
                    pkey_index: 0,
                };
                side.qp.post_send(al, &[wr.to(dest)]).map_err(e)?;
            }
            None => side.qp.post_send(al, &[wr]).map_err(e)?,
        }
        Ok(())
    };
    let expected = |r: u32| -> Vec<u8> {
        match (&peer_ext, server) {
            (Some(x), _) => oob::pattern(x.seed, r, cfg.size),
            (None, false) => oob::pattern(seed, r, cfg.size),
            (None, true) if r == 0 => vec![oob::IBV_FILL; cfg.size],
            (None, true) => oob::pattern(seed, r - 1, cfg.size),
        }
    };
    let payload_at = lay.recv_at + if cfg.ud { oob::GRH_BYTES } else { 0 };

    let start = Instant::now();
    let (mut scnt, mut rcnt, mut writes_checked) = (0u32, 0u32, 0u32);
    let (mut send_pending, mut recv_pending) = (false, true);
    if !server {
        post_round(0)?;
        send_pending = true;
    }
    let mut wcs = [Wc::default(); 16];
    let mut last_progress = Instant::now();
    // An ibal peer keeps the side channel open until the end lines, so
    // its closing mid-transfer means its process ended (the kernel closes
    // a killed process's sockets): nothing more will arrive.
    let (mut peer_gone, mut last_check) = (false, Instant::now());
    while rcnt < cfg.iters || scnt < cfg.iters {
        let n = side.cq.poll(al, &mut wcs).map_err(e)?;
        if n == 0 {
            if peer_is_ibal && !peer_gone && last_check.elapsed() >= Duration::from_millis(100) {
                last_check = Instant::now();
                peer_gone = side_channel_closed(&sock);
            }
            // With a SEND in flight its completion (RETRY_EXC, within the
            // retry budget) says more; otherwise waiting cannot help.
            if peer_gone && !send_pending {
                return Err(format!(
                    "the peer closed the side channel mid-transfer (sent {scnt}, received {rcnt} of {}): its process ended, nothing more will arrive",
                    cfg.iters
                ));
            }
            if last_progress.elapsed() > cfg.timeout {
                return Err(format!(
                    "timed out: no completion for {:.1} s (sent {scnt}, received {rcnt} of {}); the {} stopped answering",
                    cfg.timeout.as_secs_f64(),
                    cfg.iters,
                    if send_pending && !recv_pending { "peer's RoCE stack (our SEND is not acknowledged)" } else { "peer" }
                ));
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                let hint = match wc.status {
                    WcStatus::RetryExceeded if scnt == 0 && rcnt == 0 => {
                        " (IBV_WC_RETRY_EXC_ERR): the peer's RoCE stack never acknowledged our \
                         SEND: nothing listens on its UDP port, the GID or QPN is wrong, or it \
                         drops our packets (a real RoCE receiver drops a bad ICRC silently)"
                    }
                    WcStatus::RetryExceeded => {
                        " (IBV_WC_RETRY_EXC_ERR): the peer's RoCE stack stopped acknowledging \
                         mid-transfer (retries exhausted): the peer process or the path to it \
                         is gone"
                    }
                    WcStatus::RnrRetryExceeded => {
                        " (IBV_WC_RNR_RETRY_EXC_ERR): the peer had no receive posted"
                    }
                    _ => "",
                };
                let what = match wc.wr_id {
                    SEND_WRID => "SEND",
                    RECV_WRID => "receive",
                    _ => "RDMA WRITE",
                };
                return Err(format!(
                    "completion failed: {:?} for a {what} (wr_id {}; sent {scnt}, received {rcnt} of {}){hint}{}",
                    wc.status,
                    wc.wr_id,
                    cfg.iters,
                    if peer_gone {
                        "; the peer's side channel closed too (its process ended)"
                    } else {
                        ""
                    }
                ));
            }
            match wc.wr_id {
                SEND_WRID => {
                    scnt += 1;
                    send_pending = false;
                }
                RECV_WRID => {
                    if wc.byte_len as usize != lay.recv_len {
                        return Err(format!(
                            "message {rcnt}: {} bytes received, expected {}",
                            wc.byte_len, lay.recv_len
                        ));
                    }
                    let mut got = vec![0u8; cfg.size];
                    side.buf.read(payload_at, &mut got).map_err(e)?;
                    let want = if cfg.plain {
                        got.clone()
                    } else {
                        expected(rcnt)
                    };
                    echo.borrow_mut().copy_from_slice(&got);
                    if let Some(at) = oob::first_difference(&got, &want) {
                        return Err(format!(
                            "message {rcnt} differs at byte {at}: got {:#04x}, expected {:#04x}",
                            got[at], want[at]
                        ));
                    }
                    if let Some(x) = &peer_ext {
                        if x.write.is_some() {
                            let mut w = vec![0u8; cfg.size];
                            side.wbuf.read(0, &mut w).map_err(e)?;
                            let want = oob::pattern(oob::write_seed(x.seed), rcnt, cfg.size);
                            if let Some(at) = oob::first_difference(&w, &want) {
                                return Err(format!(
                                    "RDMA WRITE {rcnt} differs at byte {at}: got {:#04x}, expected {:#04x}",
                                    w[at], want[at]
                                ));
                            }
                            writes_checked += 1;
                        }
                    }
                    rcnt += 1;
                    recv_pending = false;
                    side.qp
                        .post_recv(
                            al,
                            &[RecvWr {
                                wr_id: RECV_WRID,
                                sg_list: &recv_sge,
                            }],
                        )
                        .map_err(e)?;
                }
                other => return Err(format!("completion for unknown wr_id {other}")),
            }
            if scnt < cfg.iters && !send_pending && !recv_pending {
                post_round(scnt)?;
                send_pending = true;
                recv_pending = true;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();

    // ibal peers confirm the end to each other (so neither tears its QP
    // down while the other still waits); plain tools just close.
    if peer_is_ibal {
        sock.write_all(format!("ibal-qpx/1 end received={rcnt}\n").as_bytes())
            .map_err(|err| io_err("sending the end line", err))?;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.len() < 128 {
            match sock.read(&mut b) {
                Ok(0) => break,
                Ok(_) if b[0] == b'\n' => break,
                Ok(_) => line.push(b[0]),
                Err(err) => return Err(io_err("reading the peer's end line", err)),
            }
        }
        let text = String::from_utf8_lossy(&line);
        if line.is_empty() {
            return Err(
                "the peer closed the side channel instead of sending its end line (its process ended)"
                    .into(),
            );
        }
        if text != format!("ibal-qpx/1 end received={}", cfg.iters) {
            return Err(format!("the peer did not finish: {text:?}"));
        }
    } else {
        // Let the last ACK leave before the QP goes.
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(QpxReport {
        mode: if cfg.ud { "ud" } else { "rc" },
        role: if server { "server" } else { "client" },
        peer: if peer_is_ibal { "ibal" } else { "ibv" },
        local: me,
        remote: peer,
        iters: cfg.iters,
        size: cfg.size,
        bytes: cfg.size as u64 * u64::from(cfg.iters) * 2,
        writes_checked,
        messages_checked: if cfg.plain { 0 } else { rcnt },
        seconds,
        write_rkeys: match peer_write {
            Some((_, rkey)) => (side.wrkey, rkey),
            None => (0, 0),
        },
        close_stats: String::new(),
        bulk: None,
    })
}

const BULK_WRITE_WRID: u64 = 10;
/// Pause between empty polls while a bulk WRITE or READ is in flight.
const BULK_POLL_SLEEP: Duration = Duration::from_millis(2);
/// While a bulk READ's data has not all landed, the CQ is polled only this
/// often: a poll of an empty CQ makes the provider take what has arrived
/// on the port on the polling thread, racing the port's receive thread,
/// and with rxe's 1024-packet READ response burst that lost or reordered
/// a response in 9 of 10 runs when spinning (21 of 24 passed polling
/// every 2 ms); the re-issued READ then never completed
/// (docs/two-process.md, "RDMA WRITE and READ against rxe").
const BULK_FALLBACK_POLL: Duration = Duration::from_millis(250);
const BULK_READ_WRID: u64 = 11;

/// Wait for the completion of `wr_id` (nothing else is outstanding),
/// bounded by `timeout`; returns the seconds it took. With `landed`, the
/// CQ is polled only once `landed()` says the data is there, or every
/// [`BULK_FALLBACK_POLL`] (which still catches a failed completion).
fn wait_one(
    al: &Al,
    side: &Side,
    wr_id: u64,
    what: &str,
    timeout: Duration,
    landed: Option<&dyn Fn() -> bool>,
) -> Result<f64, String> {
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    let mut last_poll = Instant::now();
    let mut seen = false;
    loop {
        if let Some(landed) = landed {
            if !seen && !landed() && last_poll.elapsed() < BULK_FALLBACK_POLL {
                if start.elapsed() > timeout {
                    return Err(format!(
                        "{what}: timed out: no completion for {:.1} s",
                        timeout.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            seen = true;
        }
        last_poll = Instant::now();
        let n = side.cq.poll(al, &mut wcs).map_err(|e| e.to_string())?;
        for wc in &wcs[..n] {
            if wc.wr_id == RECV_WRID {
                return Err(format!(
                    "{what}: a receive completed ({:?}): the peer SENT something, which --rdma-bulk never does",
                    wc.status
                ));
            }
            if wc.status != WcStatus::Success {
                let hint = match wc.status {
                    WcStatus::RetryExceeded => {
                        " (IBV_WC_RETRY_EXC_ERR): retries exhausted: the peer's RoCE stack stopped \
                         answering (it dropped our request packets, or its ACKs/READ responses \
                         did not reach us)"
                    }
                    WcStatus::RemoteAccessError => {
                        " (IBV_WC_REM_ACCESS_ERR): the peer NAKed the R_Key, address or length \
                         (its MR is not open to this access)"
                    }
                    WcStatus::RemoteInvalidRequest => {
                        " (IBV_WC_REM_INV_REQ_ERR): the peer refused the request (its QP \
                         lacks REMOTE_WRITE/REMOTE_READ, or the length is over its limit)"
                    }
                    _ => "",
                };
                return Err(format!(
                    "{what} failed after {:.3} s: {:?}{hint}",
                    start.elapsed().as_secs_f64(),
                    wc.status
                ));
            }
            if wc.wr_id == wr_id {
                return Ok(start.elapsed().as_secs_f64());
            }
        }
        if n == 0 {
            if start.elapsed() > timeout {
                return Err(format!(
                    "{what}: timed out: no completion for {:.1} s",
                    timeout.as_secs_f64()
                ));
            }
            // Not a spin: a poll of an empty CQ makes the provider take
            // what has arrived on the port on this thread, racing its
            // receive thread (docs/two-process.md, "RDMA WRITE and READ
            // against rxe").
            std::thread::sleep(BULK_POLL_SLEEP);
        }
    }
}

/// Read one `\n`-terminated line of at most 512 bytes (the socket's read
/// timeout bounds each read).
fn read_line(s: &mut TcpStream, what: &str) -> Result<String, String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => {
                return Err(format!(
                    "{what}: the peer closed the side channel{}",
                    if line.is_empty() {
                        " (its process ended or gave up)"
                    } else {
                        " mid-line"
                    }
                ))
            }
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => {
                line.push(b[0]);
                if line.len() > 512 {
                    return Err(format!("{what}: the peer's line is longer than 512 bytes"));
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => return Err(io_err(what, err)),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Where `got` first differs from the [`oob::bulk_pattern`] of `seed`, in
/// words a reader can act on: the offset, the packet at `mtu`, what was
/// there and where those bytes belonged.
fn bulk_mismatch(got: &[u8], seed: u8, mtu: usize) -> Option<String> {
    let at = (0..got.len()).find(|&k| got[k] != oob::bulk_byte(seed, k))?;
    let bad = got[at..]
        .iter()
        .enumerate()
        .filter(|&(i, &g)| g != oob::bulk_byte(seed, at + i))
        .count();
    let w = at & !3;
    let origin = if w + 4 <= got.len() {
        let word = [got[w], got[w + 1], got[w + 2], got[w + 3]];
        if word == [0; 4] {
            "zeros there: nothing was placed".to_string()
        } else {
            match oob::bulk_origin(seed, word) {
                o if (o as usize) < got.len() => format!("the word there belongs at offset {o}"),
                _ => "the word there is not from the pattern".to_string(),
            }
        }
    } else {
        String::new()
    };
    Some(format!(
        "first mismatch at offset {at} (packet {} of {} at MTU {mtu}): got {:#04x}, expected {:#04x}; {origin}; {bad} bytes differ from there on",
        at / mtu,
        got.len().div_ceil(mtu),
        got[at],
        oob::bulk_byte(seed, at)
    ))
}

/// The client's part of `--rdma-bulk`.
fn bulk_active(
    al: &Al,
    side: &mut Side,
    sock: &mut TcpStream,
    cfg: &QpxConfig,
    size: usize,
    seed: u8,
    peer: &Ext,
) -> Result<BulkReport, String> {
    let e = |err: Error| err.to_string();
    let (addr, rkey) = peer.write.expect("checked");
    let mtu = mtu_bytes(cfg.mtu);
    let packets = size.div_ceil(mtu);
    let src = [Sge {
        addr: WRITE_IOVA,
        length: size as u32,
        lkey: side.wlkey,
    }];
    let sink = [Sge {
        addr: WRITE_IOVA + size as u64,
        length: size as u32,
        lkey: side.wlkey,
    }];
    // The WRITE carries our pattern (the server checks it with the seed
    // of our extension line); the READ sink starts zeroed.
    side.wbuf
        .write(0, &oob::bulk_pattern(seed, size))
        .map_err(e)?;
    side.wbuf.write(size, &vec![0u8; size]).map_err(e)?;
    eprintln!(
        "qp-exchange: RDMA WRITE of {size} bytes ({packets} packets at MTU {mtu}) to the peer's {addr:#x} R_Key {rkey:#x}"
    );
    let w = SendWr::new(
        BULK_WRITE_WRID,
        SendOp::Write {
            remote_addr: addr,
            rkey,
        },
        &src,
    );
    side.qp.post_send(al, &[w]).map_err(e)?;
    let write_seconds = wait_one(
        al,
        side,
        BULK_WRITE_WRID,
        &format!("RDMA WRITE of {size} bytes ({packets} packets) to the peer"),
        cfg.timeout,
        None,
    )?;
    eprintln!(
        "qp-exchange: RDMA WRITE acknowledged in {write_seconds:.3} s; RDMA READ of {size} bytes from {:#x}",
        addr + size as u64
    );
    let r = SendWr::new(
        BULK_READ_WRID,
        SendOp::Read {
            remote_addr: addr + size as u64,
            rkey,
        },
        &sink,
    );
    // The last aligned word of the READ is known (the peer's pattern):
    // once it is in our sink, the last response has been placed.
    let last = size.saturating_sub(4) & !3;
    let want: Vec<u8> = (last..size.min(last + 4))
        .map(|k| oob::bulk_byte(peer.seed, k))
        .collect();
    let wbuf = &side.wbuf;
    let landed = move || {
        let mut got = vec![0u8; want.len()];
        wbuf.read(size + last, &mut got).is_ok() && got == want
    };
    side.qp.post_send(al, &[r]).map_err(e)?;
    let read_seconds = wait_one(
        al,
        side,
        BULK_READ_WRID,
        &format!("RDMA READ of {size} bytes ({packets} response packets) from the peer"),
        cfg.timeout,
        Some(&landed),
    )?;
    let mut got = vec![0u8; size];
    side.wbuf.read(size, &mut got).map_err(e)?;
    let read_bad = bulk_mismatch(&got, peer.seed, mtu);
    eprintln!(
        "qp-exchange: RDMA READ completed in {read_seconds:.3} s, data {}",
        if read_bad.is_some() {
            "WRONG"
        } else {
            "checked"
        }
    );
    sock.write_all(
        format!(
            "ibal-qpx/1 bulk-done wrote={size} read={size} read_ok={}\n",
            u8::from(read_bad.is_none())
        )
        .as_bytes(),
    )
    .map_err(|err| io_err("sending bulk-done", err))?;
    let verdict = read_line(sock, "reading the peer's verdict on our RDMA WRITE")?;
    let write_ok = verdict.starts_with("ibal-qpx/1 bulk-verdict ok");
    match (read_bad, write_ok) {
        (None, true) => Ok(BulkReport {
            size,
            write_seconds,
            read_seconds,
            checked: size,
            packets,
            verdict,
            peer_buffer: (addr, rkey),
        }),
        (read_bad, _) => {
            let mut err = String::new();
            if let Some(m) = read_bad {
                err += &format!(
                    "the RDMA READ completed but its data is wrong (the peer's responses, or our placement of them): {m}"
                );
            }
            if !write_ok {
                if !err.is_empty() {
                    err += "; ";
                }
                err += &format!(
                    "the peer says our RDMA WRITE (acknowledged) did not land right: {verdict:?}"
                );
            }
            Err(err)
        }
    }
}

/// The server's part of `--rdma-bulk`: wait (polling the CQ, which should
/// stay empty) for the client's `bulk-done`, check the WRITE target, send
/// the verdict.
fn bulk_passive(
    al: &Al,
    side: &mut Side,
    sock: &mut TcpStream,
    cfg: &QpxConfig,
    size: usize,
    peer: &Ext,
) -> Result<BulkReport, String> {
    let e = |err: Error| err.to_string();
    // The client gets cfg.timeout per operation; allow for both, and the
    // TCP round trip.
    let limit = cfg.timeout * 3 + Duration::from_secs(5);
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    loop {
        let n = side.cq.poll(al, &mut wcs).map_err(e)?;
        if let Some(wc) = wcs[..n].first() {
            return Err(format!(
                "unexpected completion while the peer did RDMA: {:?} wr_id {}",
                wc.status, wc.wr_id
            ));
        }
        sock.set_nonblocking(true).map_err(|err| err.to_string())?;
        let mut b = [0u8; 1];
        let r = sock.peek(&mut b);
        sock.set_nonblocking(false).map_err(|err| err.to_string())?;
        match r {
            Ok(_) => break, // a line (or EOF: read_line says so)
            Err(err) if err.kind() == ErrorKind::WouldBlock => {}
            Err(err) => return Err(io_err("waiting for the peer's bulk-done", err)),
        }
        if start.elapsed() > limit {
            return Err(format!(
                "timed out: no bulk-done from the peer for {:.1} s",
                limit.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = read_line(sock, "reading the peer's bulk-done")?;
    if !done.starts_with("ibal-qpx/1 bulk-done ") {
        return Err(format!(
            "bad message from the peer: expected bulk-done, got {done:?}"
        ));
    }
    let mut got = vec![0u8; size];
    side.wbuf.read(0, &mut got).map_err(e)?;
    let mtu = mtu_bytes(cfg.mtu);
    let bad = bulk_mismatch(&got, peer.seed, mtu);
    let verdict = match &bad {
        None => format!("ibal-qpx/1 bulk-verdict ok checked={size}"),
        Some(m) => format!("ibal-qpx/1 bulk-verdict FAIL {m}"),
    };
    sock.write_all(format!("{verdict}\n").as_bytes())
        .map_err(|err| io_err("sending our verdict", err))?;
    let read_ok = done.contains("read_ok=1");
    match bad {
        None if read_ok => Ok(BulkReport {
            size,
            write_seconds: 0.0,
            read_seconds: 0.0,
            checked: size,
            packets: size.div_ceil(mtu),
            verdict,
            peer_buffer: (0, 0),
        }),
        None => Err(format!(
            "the peer's RDMA WRITE landed right, but it says its RDMA READ of our buffer did not: {done:?}"
        )),
        Some(m) => Err(format!(
            "the peer's RDMA WRITE (which it saw acknowledged) did not land right in our buffer: {m}{}",
            if read_ok { "" } else { "; and the peer says its RDMA READ was wrong too" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_mismatch_names_offset_packet_and_origin() {
        let size = 8 * 1024;
        let good = oob::bulk_pattern(7, size);
        assert_eq!(bulk_mismatch(&good, 7, 1024), None);
        // Packet 3 never placed.
        let mut hole = good.clone();
        hole[3 * 1024..4 * 1024].fill(0);
        let m = bulk_mismatch(&hole, 7, 1024).unwrap();
        assert!(
            m.starts_with("first mismatch at offset 3072 (packet 3 of 8 at MTU 1024)")
                && m.contains("zeros there: nothing was placed"),
            "{m}"
        );
        // Packet 5's payload placed where packet 2 belongs.
        let mut moved = good.clone();
        moved.copy_within(5 * 1024..6 * 1024, 2 * 1024);
        let m = bulk_mismatch(&moved, 7, 1024).unwrap();
        assert!(
            // (bytes that happen to agree are not counted)
            m.contains("(packet 2 of 8 at MTU 1024)")
                && m.contains("the word there belongs at offset 5120")
                && m.ends_with("bytes differ from there on"),
            "{m}"
        );
        // Another side's pattern (wrong seed).
        let m = bulk_mismatch(&oob::bulk_pattern(8, size), 7, 1024).unwrap();
        assert!(m.contains("offset 0 (packet 0 of 8"), "{m}");
    }

    #[test]
    fn a_failure_says_how_the_al_closed_in_text_and_json() {
        let f = QpxFailure {
            error: "bad message from the peer: expected \"done\\0\"".into(),
            closed: Closed::Clean("PD: 0 live / 1 created".into()),
        };
        assert!(f.clean());
        assert_eq!(
            f.to_string(),
            "bad message from the peer: expected \"done\\0\"\nclosed: no objects left live (PD: 0 live / 1 created)"
        );
        assert_eq!(
            f.to_json(),
            r#"{"command":"qp-exchange","error":"bad message from the peer: expected \"done\\0\"","close":"clean","close_detail":"PD: 0 live / 1 created","clean":true}"#
        );
        let leak = QpxFailure {
            error: String::new(),
            closed: Closed::Leaked("QP: 1 live / 1 created".into()),
        };
        assert!(!leak.clean());
        assert_eq!(
            leak.to_string(),
            "objects left live at close: QP: 1 live / 1 created"
        );
        assert!(leak.to_json().ends_with(
            r#""close":"leaked","close_detail":"QP: 1 live / 1 created","clean":false}"#
        ));
        let early = QpxFailure::before_open("--write needs --mode rc");
        assert_eq!(early.to_string(), "--write needs --mode rc");
        assert!(early.to_json().contains(r#""close":"not-opened""#));
    }
}
