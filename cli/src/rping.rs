//! `ibal rping`: librdmacm's `rping` exchange over the RoCEv2 provider and
//! the CM with rdma_cm addressing, so that `ibal` and Linux's `rping`
//! (rdma-core) run it against each other.
//!
//! The exchange (facts from rdma-core's `librdmacm/examples/rping.c`):
//! the client connects to the server's rdma_cm port (TCP port space,
//! 7174 by default). Each message is 16 bytes, `struct rping_rdma_info`:
//! a buffer's address (big-endian u64), its R_Key and its length (BE u32).
//! Per ping the client fills its source buffer with `rdma-ping-N: ` and
//! then letters cycling from 'A' + N to 'z' (the last byte 0), and SENDs
//! the source's info; the server RDMA READs it and SENDs a go-ahead; the
//! client SENDs its sink's info; the server RDMA WRITEs what it read
//! (its C string and the terminating 0) into the sink and SENDs a second
//! go-ahead; the client compares sink and source (`-V`). After the count
//! the client disconnects. The server's go-ahead messages are 16 bytes it
//! never fills (zeros here).

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ListenHandler};
use cep::ip::{self, IpConnect};
use cep::proto::Event;
use cep::wire::ip_cm::PortSpace;
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use ibal::roce::{DeviceConfig, PortConfig, RoceProvider};
use provider::RegisteredBuffer;
use provider::{Access, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};

use crate::pingpong_ip::{connect_and_answer, local_address_for, wait_event};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's buffer limit (`RPING_BUFSIZE`): sizes below it are valid.
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// rping's smallest size: room for `rdma-ping-2147483647: ` and the 0.
pub const MIN_SIZE: usize = 26;
/// The size of every message (`struct rping_rdma_info`).
const INFO_LEN: usize = 16;

/// Settings of one run (rping's flags).
#[derive(Clone, Debug)]
pub struct RpingConfig {
    /// Server (`-s`) or client (`-c`).
    pub server: bool,
    /// `-a`: the server's address (the client's destination).
    pub addr: IpAddr,
    /// `-p`: the rdma_cm port.
    pub port: u16,
    /// The client's own address (`-I`; default: the route's source, on
    /// loopback the next 127.x address).
    pub local: Option<IpAddr>,
    /// UDP port our RoCEv2 port binds.
    pub udp_port: u16,
    /// UDP port of the peer's RoCEv2 port.
    pub peer_udp_port: u16,
    /// `-C`: pings (client).
    pub count: u32,
    /// `-S`: ping data size (client).
    pub size: usize,
    /// `-v`: print the ping data.
    pub verbose: bool,
    /// `-V`: check that what came back is what was sent (client).
    pub validate: bool,
    /// How long to wait for the peer at any step.
    pub timeout: Duration,
    /// Our RoCEv2 device's `max_qp` (default: `RoceLimits`').
    pub max_qp: Option<u32>,
    /// Print snapshots of our objects on stderr, at an interval
    /// (`--status`) and on SIGUSR1. `None`: never.
    pub status: Option<crate::status::StatusConfig>,
}

impl RpingConfig {
    /// rping's defaults for a server (`server`) or client of `addr`.
    pub fn new(server: bool, addr: IpAddr) -> Self {
        RpingConfig {
            server,
            addr,
            port: DEFAULT_PORT,
            local: None,
            udp_port: ibal::roce::ROCE_PORT,
            peer_udp_port: ibal::roce::ROCE_PORT,
            count: 10,
            size: 64,
            verbose: false,
            validate: false,
            timeout: Duration::from_secs(30),
            max_qp: None,
            status: None,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct RpingReport {
    /// Pings completed (client) or served (server).
    pub pings: u32,
    /// The peer's address and rdma_cm port.
    pub peer: SocketAddr,
    /// Objects live when the AL closed (0).
    pub live_after_close: usize,
}

/// Layout of the one MR: two receive buffers, the send buffer, the RDMA
/// buffer (the server's READ target, the client's sink) and the client's
/// source. `iova` is what the peer sees as addresses.
struct Layout {
    size: usize,
}

const IOVA: u64 = 0x7170_0000_0000;
const RECV: [usize; 2] = [0, 16];
const SEND: usize = 32;
const RDMA: usize = 64;

impl Layout {
    fn start(&self) -> usize {
        RDMA + self.size
    }
    fn len(&self) -> usize {
        RDMA + 2 * self.size
    }
}

/// The verbs objects of one connection.
struct Conn {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    mr: Handle<Mr>,
    buf: RegisteredBuffer,
    lkey: u32,
    rkey: u32,
    lay: Layout,
    next_wr: u64,
    recvs_posted: u64,
    recvs_done: u64,
    early: Vec<Wc>,
}

impl Conn {
    fn open(al: &Al, ca: Handle<Ca>, size: usize) -> Result<Conn, String> {
        let e = |e: al::Error| e.to_string();
        let inst = al.instance();
        let lay = Layout { size };
        let pd = verbs::alloc_pd(inst, ca).map_err(e)?;
        let cq = verbs::create_cq(inst, ca, 64, None, None).map_err(e)?;
        let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).map_err(e)?;
        let buf = RegisteredBuffer::new(lay.len());
        let access = Access::LOCAL_WRITE
            .union(Access::REMOTE_READ)
            .union(Access::REMOTE_WRITE);
        let mr = verbs::register_mr(inst, pd, &buf, 0, lay.len(), IOVA, access).map_err(e)?;
        let (lkey, rkey) = {
            let m = al.resolve(mr).map_err(e)?;
            (m.lkey(), m.rkey())
        };
        Ok(Conn {
            pd,
            cq,
            qp,
            mr,
            buf,
            lkey,
            rkey,
            lay,
            next_wr: 1,
            recvs_posted: 0,
            recvs_done: 0,
            early: Vec::new(),
        })
    }

    fn destroy(&self, al: &Al) {
        let _ = al.destroy_sync(self.qp);
        let _ = al.destroy_sync(self.mr);
        let _ = al.destroy_sync(self.cq);
        let _ = al.destroy_sync(self.pd);
    }

    fn sge(&self, at: usize, len: usize) -> [Sge; 1] {
        [Sge {
            addr: IOVA + at as u64,
            length: len as u32,
            lkey: self.lkey,
        }]
    }

    /// Keeps a receive posted on each of the two receive buffers, used in
    /// turn (completions come in posting order).
    fn post_recv(&mut self, al: &Al) -> Result<(), String> {
        let k = self.recvs_posted;
        let sge = self.sge(RECV[(k % 2) as usize], INFO_LEN);
        post_recv(
            al,
            self.qp,
            &[RecvWr {
                wr_id: RECV_ID | k,
                sg_list: &sge,
            }],
        )
        .map_err(|e| format!("post_recv: {e}"))?;
        self.recvs_posted += 1;
        Ok(())
    }

    /// Posts one send work request and waits for its completion.
    fn send(
        &mut self,
        al: &Al,
        op: SendOp,
        at: usize,
        len: usize,
        d: Instant,
    ) -> Result<(), String> {
        let id = self.next_wr;
        self.next_wr += 1;
        let sge = self.sge(at, len);
        post_send(al, self.qp, &[SendWr::new(id, op, &sge)])
            .map_err(|e| format!("post_send: {e}"))?;
        self.wait(al, |w| w.wr_id == id, d, "a send completion")
            .map(|_| ())
    }

    /// SENDs the info of our buffer at `at` of `len` bytes.
    fn send_info(&mut self, al: &Al, at: usize, len: usize, d: Instant) -> Result<(), String> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&(IOVA + at as u64).to_be_bytes());
        info[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        info[12..].copy_from_slice(&(len as u32).to_be_bytes());
        self.buf.write(SEND, &info).map_err(|e| e.to_string())?;
        self.send(al, SendOp::Send, SEND, INFO_LEN, d)
    }

    /// The next message from the peer (16 bytes, else an error), its
    /// receive re-posted; `None` if the connection ended (flush).
    fn recv(&mut self, al: &Al, d: Instant) -> Result<Option<[u8; INFO_LEN]>, String> {
        let k = self.recvs_done;
        let wc = self.wait(al, |w| w.wr_id == RECV_ID | k, d, "the peer's message")?;
        self.recvs_done += 1;
        if wc.status == WcStatus::WrFlushError {
            return Ok(None);
        }
        if wc.byte_len as usize != INFO_LEN {
            return Err(format!(
                "received bogus data: {} bytes (an rping message is {INFO_LEN})",
                wc.byte_len
            ));
        }
        let mut m = [0u8; INFO_LEN];
        self.buf
            .read(RECV[(k % 2) as usize], &mut m)
            .map_err(|e| e.to_string())?;
        self.post_recv(al)?;
        Ok(Some(m))
    }

    /// Polls until a completion `want` accepts; others are kept for their
    /// own wait. A failed completion other than a receive's flush is an
    /// error.
    fn wait(
        &mut self,
        al: &Al,
        want: impl Fn(&Wc) -> bool,
        deadline: Instant,
        what: &str,
    ) -> Result<Wc, String> {
        self.poll_for(al, want, deadline)?
            .ok_or_else(|| format!("timed out waiting for {what}"))
    }

    /// As [`Conn::wait`], `None` at the deadline.
    fn poll_for(
        &mut self,
        al: &Al,
        want: impl Fn(&Wc) -> bool,
        deadline: Instant,
    ) -> Result<Option<Wc>, String> {
        if let Some(at) = self.early.iter().position(&want) {
            return Ok(Some(self.early.remove(at)));
        }
        let mut wc = [Wc::default(); 4];
        loop {
            let n = verbs::poll_cq(al, self.cq, &mut wc).map_err(|e| e.to_string())?;
            let mut found = None;
            for w in &wc[..n] {
                let flushed_recv = w.status == WcStatus::WrFlushError && w.wr_id & RECV_ID != 0;
                if w.status != WcStatus::Success && !flushed_recv {
                    return Err(format!(
                        "work request {:#x} ({:?}) completed with {:?}",
                        w.wr_id, w.opcode, w.status
                    ));
                }
                if found.is_none() && want(w) {
                    found = Some(*w);
                } else {
                    self.early.push(*w);
                }
            }
            if found.is_some() {
                return Ok(found);
            }
            if n == 0 {
                if Instant::now() > deadline {
                    return Ok(None);
                }
                std::thread::yield_now();
            }
        }
    }

    fn c_string(&self, at: usize, max: usize) -> String {
        self.buf.with(|b| {
            let s = &b[at..at + max];
            let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        })
    }
}

const RECV_ID: u64 = 1 << 62;

/// A peer's buffer as its message names it.
fn parse_info(m: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let addr = u64::from_be_bytes(m[..8].try_into().expect("8 bytes"));
    let rkey = u32::from_be_bytes(m[8..12].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(m[12..].try_into().expect("4 bytes"));
    (addr, rkey, len)
}

/// Ping `ping`'s data as rping writes it (`start` is the first letter).
pub fn ping_data(ping: u32, start: u8, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{ping}: ").into_bytes();
    v.truncate(size.saturating_sub(1));
    let mut c = start;
    while v.len() < size {
        v.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = v.last_mut() {
        *last = 0;
    }
    v
}

/// Runs the server or the client; `print` gets each line rping would
/// print with `-v` (and the disconnect line).
pub fn run(cfg: &RpingConfig, print: &mut dyn FnMut(&str)) -> Result<RpingReport, String> {
    if !cfg.server && !(MIN_SIZE..=MAX_SIZE).contains(&cfg.size) {
        return Err(format!(
            "invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
            cfg.size
        ));
    }
    if !cfg.server && cfg.count == 0 {
        return Err("-C must be at least 1 (this rping does not ping forever)".into());
    }
    let local_ip = match (cfg.server, cfg.local) {
        (_, Some(ip)) => ip,
        (true, None) => cfg.addr,
        (false, None) => local_address_for(cfg.addr, cfg.peer_udp_port)?,
    };
    if local_ip.is_unspecified() {
        return Err("our RoCEv2 port needs a real address (its GID): give -a ADDR".into());
    }
    let local = SocketAddr::new(local_ip, cfg.udp_port);
    let guid = 0x0249_4241_5250_0000u64 | u64::from(std::process::id() & 0xffff);
    let port = PortConfig::new(local)
        .peer_udp_port(cfg.peer_udp_port)
        .mtu(Mtu::Mtu1024);
    let mut device = DeviceConfig::new("roce0", guid, vec![port]);
    if let Some(n) = cfg.max_qp {
        device.limits.max_qp = n;
    }
    let provider = RoceProvider::new(vec![device]);
    let al = Al::open().map_err(|e| e.to_string())?;
    let status = crate::status::StatusPrinter::for_al(al.instance(), cfg.status);
    let result = (|| -> Result<(u32, SocketAddr), String> {
        let ca = verbs::open_ca(al.instance(), &provider, guid)
            .map_err(|e| format!("cannot open a RoCEv2 port on {local}: {e}"))?;
        cm::attach_ca(al.instance(), ca).map_err(|e| e.to_string())?;
        let r = if cfg.server {
            serve(&al, ca, SocketAddr::new(local_ip, cfg.port), cfg, print)
        } else {
            ping(&al, ca, SocketAddr::new(cfg.addr, cfg.port), cfg, print)
        };
        let _ = al.destroy_sync(ca);
        r
    })();
    drop(status);
    let closed = al.close();
    let (pings, peer) = result?;
    let stats = closed.map_err(|e| format!("closing the AL: {e}"))?;
    if stats.total_live() != 0 {
        return Err(format!("objects leaked: {stats}"));
    }
    Ok(RpingReport {
        pings,
        peer,
        live_after_close: 0,
    })
}

fn ping(
    al: &Al,
    ca: Handle<Ca>,
    server: SocketAddr,
    cfg: &RpingConfig,
    print: &mut dyn FnMut(&str),
) -> Result<(u32, SocketAddr), String> {
    let mut c = Conn::open(al, ca, cfg.size)?;
    let r = ping_on(al, &mut c, server, cfg, print);
    c.destroy(al);
    r.map(|n| (n, server))
}

fn ping_on(
    al: &Al,
    c: &mut Conn,
    server: SocketAddr,
    cfg: &RpingConfig,
    print: &mut dyn FnMut(&str),
) -> Result<u32, String> {
    let inst = al.instance();
    // rping's connection parameters: one READ each way, retries 7.
    let request = IpConnect::new(server).rdma_depth(1, 1);
    let (cep, events) = connect_and_answer(
        al,
        c.qp,
        &request,
        cfg.timeout,
        (cfg.peer_udp_port, "rping -s"),
        // Both receives before the RTU: the server may send as soon as
        // it is established.
        |_| c.post_recv(al).and_then(|_| c.post_recv(al)),
    )?;
    let deadline = || Instant::now() + cfg.timeout;
    let size = cfg.size;
    let (start_at, sink_at) = (c.lay.start(), RDMA);
    let mut start = b'A';
    let mut done = 0;
    let run = (|| -> Result<(), String> {
        for n in 0..cfg.count {
            let data = ping_data(n, start, size);
            start = if start >= b'z' { b'A' } else { start + 1 };
            c.buf.write(start_at, &data).map_err(|e| e.to_string())?;
            c.send_info(al, start_at, size, deadline())?;
            c.recv(al, deadline())?
                .ok_or("the server went away before its go-ahead")?;
            c.send_info(al, sink_at, size, deadline())?;
            c.recv(al, deadline())?
                .ok_or("the server went away before its RDMA WRITE was done")?;
            if cfg.validate {
                let mut back = vec![0u8; size];
                c.buf.read(sink_at, &mut back).map_err(|e| e.to_string())?;
                if back != data {
                    return Err(format!("data mismatch in ping {n}"));
                }
            }
            if cfg.verbose {
                print(&format!("ping data: {}", c.c_string(sink_at, size)));
            }
            done += 1;
        }
        Ok(())
    })();
    if let Err(e) = run {
        let _ = al.destroy_sync(cep);
        return Err(e);
    }
    cm::disconnect(inst, cep, &[]).map_err(|e| format!("disconnect: {e}"))?;
    wait_event(&events, deadline(), "the server's DREP", |ev| {
        matches!(ev, Event::Disconnected { .. } | Event::Released { .. }).then_some(Ok(()))
    })?;
    print("client DISCONNECT EVENT...");
    Ok(done)
}

fn serve(
    al: &Al,
    ca: Handle<Ca>,
    at: SocketAddr,
    cfg: &RpingConfig,
    print: &mut dyn FnMut(&str),
) -> Result<(u32, SocketAddr), String> {
    let inst = al.instance();
    let (rtx, requests) = mpsc::channel();
    let rtx = std::sync::Mutex::new(rtx);
    let on_request: ListenHandler = std::sync::Arc::new(move |_l, cep, ev| {
        let _ = rtx.lock().map(|t| t.send((cep, ev.clone())));
    });
    let (etx, events) = mpsc::channel();
    let etx = std::sync::Mutex::new(etx);
    let handler: CmHandler = std::sync::Arc::new(move |cep, ev| {
        let _ = etx.lock().map(|t| t.send((cep, ev.clone())));
    });
    let listen = ip::listen(inst, ca, at, PortSpace::Tcp, on_request, handler)
        .map_err(|e| format!("listen on {at}: {e}"))?;
    let r = (|| {
        let (cep, req) = match requests.recv_timeout(cfg.timeout) {
            Ok((cep, Event::ConnectRequest { req, .. })) => (cep, req),
            Ok((cep, _)) => {
                let _ = al.destroy_sync(cep);
                return Err("a SIDR request arrived; rping serves connections".to_string());
            }
            Err(_) => return Err(format!("no connection request within {:?}", cfg.timeout)),
        };
        let peer = ip::request_info(&req)
            .map(|i| i.source)
            .unwrap_or_else(|_| SocketAddr::new(at.ip(), 0));
        // The READ target takes whatever size a client asks for.
        let mut c = Conn::open(al, ca, MAX_SIZE + 1)?;
        let r = serve_on(al, &mut c, cep, &events, cfg, print);
        let _ = al.destroy_sync(cep);
        c.destroy(al);
        r.map(|n| (n, peer))
    })();
    let _ = al.destroy_sync(listen);
    r
}

fn serve_on(
    al: &Al,
    c: &mut Conn,
    cep: Handle<Cep>,
    events: &mpsc::Receiver<(Handle<Cep>, Event)>,
    cfg: &RpingConfig,
    print: &mut dyn FnMut(&str),
) -> Result<u32, String> {
    let inst = al.instance();
    // rping accepts with the request's parameters: one READ each way.
    let reply = AcceptReply::default().rdma_depth(1, 1);
    cm::accept(inst, cep, c.qp, &reply).map_err(|e| format!("accept: {e}"))?;
    c.post_recv(al)?;
    c.post_recv(al)?;
    let deadline = || Instant::now() + cfg.timeout;
    let mut served = 0;
    let (mut established, mut disconnected) = (false, false);
    // The RTU makes the QP ready to send (RTS); the client's DREQ ends the
    // loop: answer it, and the receives flush.
    let watch = |established: &mut bool, disconnected: &mut bool| -> Result<(), String> {
        for (from, ev) in events.try_iter() {
            if from != cep {
                continue;
            }
            match ev {
                Event::Established { .. } => *established = true,
                Event::DisconnectRequest { .. } => {
                    let _ = cm::disconnect_reply(inst, cep, &[]);
                    *disconnected = true;
                }
                Event::Rejected { reason, .. } => {
                    return Err(format!("the client rejected our reply: {reason:?}"))
                }
                Event::Timeout { .. } => return Err("the client never sent its RTU".into()),
                _ => {}
            }
        }
        Ok(())
    };
    loop {
        // The next message, or the end of the connection.
        let give_up = deadline();
        let m = loop {
            watch(&mut established, &mut disconnected)?;
            if disconnected {
                break None;
            }
            let next = RECV_ID | c.recvs_done;
            let tick = Instant::now() + Duration::from_millis(20);
            if let Some(w) = c.poll_for(al, |w| w.wr_id == next, tick)? {
                c.early.insert(0, w);
                break c.recv(al, deadline())?;
            }
            if Instant::now() > give_up {
                return Err("timed out waiting for the client's next message".into());
            }
        };
        let Some(m) = m else { break };
        // The client sends right after its RTU: the RTU may still be on
        // its way (our QP in RTR cannot send yet).
        while !established {
            watch(&mut established, &mut disconnected)?;
            if disconnected || Instant::now() > give_up {
                return Err("the connection was never established".into());
            }
            std::thread::yield_now();
        }
        let (addr, rkey, len) = parse_info(&m);
        if len as usize > MAX_SIZE {
            return Err(format!(
                "the client asked for a {len}-byte READ (at most {MAX_SIZE})"
            ));
        }
        c.send(
            al,
            SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            RDMA,
            len as usize,
            deadline(),
        )?;
        let text = c.c_string(RDMA, len as usize);
        if cfg.verbose {
            print(&format!("server ping data: {text}"));
        }
        c.send(al, SendOp::Send, SEND, INFO_LEN, deadline())?;
        let Some(sink) = c.recv(al, deadline())? else {
            break;
        };
        let (addr, rkey, _) = parse_info(&sink);
        let n = (text.len() + 1).min(len as usize);
        c.send(
            al,
            SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            RDMA,
            n,
            deadline(),
        )?;
        c.send(al, SendOp::Send, SEND, INFO_LEN, deadline())?;
        served += 1;
    }
    print("server DISCONNECT EVENT...");
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_data_is_rpings() {
        let d = ping_data(3, b'y', 30);
        assert_eq!(&d[..14], b"rdma-ping-3: y");
        assert_eq!(&d[14..16], b"zA");
        assert_eq!(d.len(), 30);
        assert_eq!(d[29], 0);
    }

    #[test]
    fn an_ibal_client_pings_an_ibal_server() {
        let mut server = RpingConfig::new(true, "127.0.0.71".parse().unwrap());
        server.udp_port = 25_871;
        server.peer_udp_port = 25_872;
        server.timeout = Duration::from_secs(20);
        server.verbose = true;
        let s = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let r = run(&server, &mut |l| lines.push(l.to_string()));
            (r, lines)
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut client = RpingConfig::new(false, "127.0.0.71".parse().unwrap());
        client.local = Some("127.0.0.72".parse().unwrap());
        client.udp_port = 25_872;
        client.peer_udp_port = 25_871;
        client.count = 12;
        client.size = 100;
        client.validate = true;
        client.verbose = true;
        let mut lines = Vec::new();
        let c = run(&client, &mut |l| lines.push(l.to_string()));
        let (s, slines) = s.join().unwrap();
        let (c, s) = match (c, s) {
            (Ok(c), Ok(s)) => (c, s),
            other => panic!("{other:?}"),
        };
        assert_eq!((c.pings, s.pings), (12, 12));
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("ping data: rdma-ping-"))
                .count(),
            12
        );
        assert!(slines[0].starts_with("server ping data: rdma-ping-0: ABCD"));
        assert_eq!(c.live_after_close + s.live_after_close, 0);
    }
}
