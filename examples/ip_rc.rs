//! An IP client/server RC exchange over RoCEv2, rdma_cm style, as two processes on loopback:
//! `cargo run --example ip_rc -- --listen 127.0.0.1`, then `-- --connect 127.0.0.1` (client
//! on `--local` 127.0.0.2; `--port` 7471, `--udp-port`/`--peer-udp-port` 4791). Every QP has
//! its receive posted before it connects or accepts. The client sends 64 KiB on each of `CONNS`
//! connections, the server checks and answers each with its complement, the client checks the
//! answers and disconnects. Any failure or a wait past the deadline exits nonzero.

use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc::channel, mpsc::Receiver, mpsc::Sender, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ibal::prelude::*;

const CONNS: usize = 4;
const MSG: usize = 64 << 10;
const USAGE: &str = "usage: ip_rc --listen IP | --connect IP [--local IP] [--port N] [--udp-port N] [--peer-udp-port N]";

fn fail(what: String) -> Error {
    Error::invalid_state(what)
}

/// Every wait of the run ends by this time.
fn deadline() -> Instant {
    static AT: OnceLock<Instant> = OnceLock::new();
    *AT.get_or_init(|| Instant::now() + Duration::from_secs(30))
}

/// One connection's QP and buffer: a receive area, then a send area.
struct Conn {
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

impl Conn {
    fn sge(&self, at: usize) -> [Sge; 1] {
        let (addr, length, lkey) = (at as u64, MSG as u32, self.lkey);
        [Sge { addr, length, lkey }]
    }
    fn send(&self, al: &Al, data: &[u8]) -> Result<()> {
        self.buf.write(MSG, data)?;
        let sge = self.sge(MSG);
        let wr = [SendWr::new(!0, SendOp::Send, &sge)]; // !0: not a receive's index
        self.qp.post_send(al, &wr)
    }
    fn received(&self) -> Vec<u8> {
        self.buf.to_vec()[..MSG].to_vec()
    }
}

/// A CQ and `CONNS` QPs readied for a connection on port 1, each with its
/// receive (`wr_id` = its index) posted before there is any connection.
fn qps(al: &Al, ca: Handle<Ca>) -> Result<(Handle<Cq>, Vec<Conn>)> {
    let (pd, cq) = (ca.alloc_pd(al)?, ca.create_cq(al, 4 * CONNS as u32)?);
    let caps = QpCaps {
        max_recv_wr: 2,
        ..QpCaps::default()
    };
    let mut conns = Vec::new();
    for wr_id in 0..CONNS as u64 {
        let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq).caps(caps))?;
        let buf = RegisteredBuffer::new(2 * MSG);
        let (lkey, _) = pd.register(al, &buf, Access::LOCAL_WRITE)?.keys(al)?;
        let c = Conn { qp, buf, lkey };
        qp.ready_for_connection(al, 1)?;
        let sg_list = &c.sge(0);
        qp.post_recv(al, &[RecvWr { wr_id, sg_list }])?;
        conns.push(c);
    }
    Ok((cq, conns))
}

/// The client's message on connection `i` (byte 0 is `i`), or the answer (the rest inverted).
fn message(i: usize, answer: bool) -> Vec<u8> {
    let mask = (answer as u8).wrapping_neg();
    let mut m: Vec<u8> = (0..MSG).map(|k| (k % 251) as u8 ^ mask).collect();
    m[0] = i as u8;
    m
}

/// Take `n` successful completions from `cq`, each to `f`.
fn poll_n(al: &Al, cq: Handle<Cq>, n: usize, mut f: impl FnMut(Wc) -> Result<()>) -> Result<()> {
    let (mut wc, mut seen) = ([Wc::default(); 8], 0);
    while seen < n {
        if Instant::now() > deadline() {
            return Err(fail(format!("{seen} of {n} completions in time")));
        }
        let k = cq.poll(al, &mut wc)?;
        for w in &wc[..k] {
            if w.status != WcStatus::Success {
                return Err(fail(format!("completion failed: {w:?}")));
            }
            f(*w)?;
        }
        seen += k;
        std::thread::sleep(Duration::from_micros(if k == 0 { 100 } else { 0 }));
    }
    Ok(())
}

/// Both roles' CEP handler: RTU on a REP, DREP on a DREQ, every event's name to `tx`.
fn handler(al: &Al, tx: Sender<&'static str>) -> CmHandler {
    let inst = Arc::clone(al);
    Arc::new(move |cep, ev| {
        let _ = match ev {
            Event::ReplyReceived { .. } => cep.rtu(&inst, &[]),
            Event::DisconnectRequest { .. } => cep.disconnect_reply(&inst, &[]),
            _ => Ok(()),
        };
        let _ = tx.send(ev.name());
    })
}

/// Wait for `n` events named `name`; a failed connection fails.
fn wait_events(events: &Receiver<&'static str>, n: usize, name: &str) -> Result<()> {
    let mut seen = 0;
    while seen < n {
        match events.recv_timeout(deadline().saturating_duration_since(Instant::now())) {
            Ok(ev) if ev == name => seen += 1,
            Ok("Rejected" | "Timeout" | "StaleConnection" | "AcceptFailed") | Err(_) => {
                return Err(fail(format!("a connection failed waiting for {name}")))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

fn serve(al: &Al, ca: Handle<Ca>, at: SocketAddr) -> Result<()> {
    let (cq, conns) = qps(al, ca)?;
    let free = Mutex::new(conns.iter().map(|c| c.qp).collect::<Vec<_>>());
    let (tx, events) = channel();
    let (inst, tx_req) = (Arc::clone(al), tx.clone());
    let on_request: ListenHandler = Arc::new(move |_listen, cep, _req| {
        let qp = free.lock().unwrap().pop().ok_or(fail("no QP left".into()));
        let r = qp.and_then(|qp| cep.accept(&inst, qp, &AcceptReply::default()));
        let _ = r.map_err(|_| tx_req.send("AcceptFailed"));
    });
    let listen = ca.listen_ip(al, at, on_request, handler(al, tx))?;
    println!("listening on {at}, {CONNS} QPs with a receive posted each");
    // Each message that lands is checked and answered on its connection.
    poll_n(al, cq, 2 * CONNS, |wc| match conns.get(wc.wr_id as usize) {
        Some(c) if c.received() != message(c.received()[0] as usize, false) => {
            Err(fail(format!("QP {:#x}: the message differs", wc.qp_num)))
        }
        Some(c) => c.send(al, &message(c.received()[0] as usize, true)),
        None => Ok(()),
    })?;
    wait_events(&events, CONNS, "DisconnectRequest")?;
    listen.destroy(al)
}

fn client(al: &Al, ca: Handle<Ca>, server: SocketAddr) -> Result<()> {
    let (cq, conns) = qps(al, ca)?;
    let (req, (tx, events)) = (IpConnect::new(server), channel());
    let connect = |c: &Conn| c.qp.connect_ip(al, 1, &req, handler(al, tx.clone()));
    let ceps = conns.iter().map(connect).collect::<Result<Vec<_>>>()?;
    wait_events(&events, CONNS, "Established")?;
    println!("{CONNS} connections to {server} established");
    (conns.iter().enumerate()).try_for_each(|(i, c)| c.send(al, &message(i, false)))?;
    poll_n(al, cq, 2 * CONNS, |wc| match conns.get(wc.wr_id as usize) {
        Some(c) if c.received() != message(wc.wr_id as usize, true) => {
            Err(fail(format!("connection {}: the answer differs", wc.wr_id)))
        }
        _ => Ok(()),
    })?;
    println!("{CONNS} x {MSG} bytes sent, every answer checked");
    ceps.iter().try_for_each(|cep| cep.disconnect(al, &[]))?;
    wait_events(&events, CONNS, "Disconnected")
}

fn opt<T: std::str::FromStr>(args: &[String], name: &str, default: &str) -> Result<T> {
    let at = args.iter().position(|a| a == name);
    let s = at.and_then(|i| args.get(i + 1)).map_or(default, |s| s);
    s.parse().map_err(|_| fail(format!("{name}? {USAGE}")))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listening = args.iter().any(|a| a == "--listen");
    let server: IpAddr = opt(&args, if listening { "--listen" } else { "--connect" }, "")?;
    let local = opt(&args, "--local", "127.0.0.2").map(|ip| if listening { server } else { ip })?;
    let udp = SocketAddr::new(local, opt(&args, "--udp-port", "4791")?);
    let udp = PortConfig::new(udp).peer_udp_port(opt(&args, "--peer-udp-port", "4791")?);
    let guid = if listening { 0x5e } else { 0xc1 };
    let provider = RoceProvider::new(vec![DeviceConfig::new("roce0", guid, vec![udp])]);
    let at = SocketAddr::new(server, opt(&args, "--port", "7471")?);
    let al = Al::open()?;
    let result = al.open_ca(&provider, guid).and_then(|ca| match listening {
        true => serve(&al, ca, at),
        false => client(&al, ca, at),
    });
    let stats = al.close()?; // whatever happened: a failed run must not leak either
    result?;
    println!("AL closed: {stats}");
    let clean = stats.is_clean().then_some(());
    clean.ok_or_else(|| fail(format!("objects left after close: {stats}")))
}
