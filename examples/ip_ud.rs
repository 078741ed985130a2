//! UD by IP address over RoCEv2 in rdma_cm's UDP port space: the client
//! resolves the server's `ip:7475` with SIDR (rdma_cm's header, Q_Key
//! `RDMA_UDP_QKEY`) and sends datagrams to the QP it names; the server
//! answers each one on an address vector built from its completion. With
//! no argument both run in this process; non-zero exit on failure.
//!
//! ```text
//! cargo run --example ip_ud -- --listen 127.0.0.1
//! cargo run --example ip_ud -- --connect 127.0.0.1 [--local 127.0.0.2]
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;

const SERVICE_PORT: u16 = 7475; // in the UDP port space
/// RoCEv2 UDP ports of the server's and the client's device.
const SERVER_UDP: u16 = 26211;
const CLIENT_UDP: u16 = 26212;
const ROUNDS: usize = 16;
const MSG: usize = 64;
/// A receive slot: the GRH area, then the datagram.
const SLOT: usize = GRH_SIZE + MSG;
const LIMIT: Duration = Duration::from_secs(20);

/// A UD QP in RTS with rdma_cm's Q_Key on a RoCEv2 device, and a buffer
/// of `ROUNDS` receive slots, then `ROUNDS` send slots of `MSG` bytes.
struct Ud {
    al: Al,
    ca: Handle<Ca>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

fn ud(guid: u64, ip: IpAddr, udp: u16, peer_udp: u16) -> Result<(RoceProvider, Ud)> {
    let port = PortConfig::new(SocketAddr::new(ip, udp)).peer_udp_port(peer_udp);
    let provider = RoceProvider::new(vec![DeviceConfig::new("ip-ud", guid, vec![port])]);
    let al = Al::open()?;
    let ca = al.open_ca(&provider, guid)?;
    let (pd, cq) = (ca.alloc_pd(&al)?, ca.create_cq(&al, 4 * ROUNDS as u32)?);
    let qp = pd.create_qp(&al, QpCreate::new(QpType::Ud, cq))?;
    qp.ready_ud(&al, 1)?;
    let buf = RegisteredBuffer::new(ROUNDS * (SLOT + MSG));
    let (lkey, _) = pd.register(&al, &buf, Access::LOCAL_WRITE)?.keys(&al)?;
    let ud = Ud {
        al,
        ca,
        pd,
        cq,
        qp,
        buf,
        lkey,
    };
    Ok((provider, ud))
}

impl Ud {
    fn sge(&self, at: usize, len: usize) -> [Sge; 1] {
        let (addr, length, lkey) = (at as u64, len as u32, self.lkey);
        [Sge { addr, length, lkey }]
    }
    fn post_recv(&self, slot: usize) -> Result<()> {
        let (wr_id, sg_list) = (slot as u64, &self.sge(slot * SLOT, SLOT));
        self.qp.post_recv(&self.al, &[RecvWr { wr_id, sg_list }])
    }
    /// Send `data` from send slot `slot` through `av` to a (QPN, Q_Key).
    fn send(&self, slot: usize, data: &[u8], av: Handle<Av>, to: (u32, u32)) -> Result<()> {
        let at = ROUNDS * SLOT + slot * MSG;
        self.buf.write(at, data)?;
        let (sge, av) = (self.sge(at, data.len()), &av);
        let ((remote_qpn, remote_qkey), pkey_index) = (to, 0);
        let dest = UdDest {
            av,
            remote_qpn,
            remote_qkey,
            pkey_index,
        };
        let wr = SendWr::new(slot as u64, SendOp::Send, &sge).to(dest);
        self.qp.post_send(&self.al, &[wr])
    }
    /// The next completion, or `Timeout` past `until`.
    fn next(&self, until: Instant) -> Result<Wc> {
        let mut wc = [Wc::default()];
        while self.cq.poll(&self.al, &mut wc)? == 0 {
            if Instant::now() > until {
                return Err(Error::Timeout("no completion in time".into()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        match wc[0].status {
            WcStatus::Success => Ok(wc[0]),
            s => Err(Error::RemoteError(format!("completion {s:?}").into())),
        }
    }
    /// Receive slot `slot`: its GRH area and its datagram.
    fn slot(&self, slot: usize, wc: &Wc) -> Result<([u8; GRH_SIZE], Vec<u8>)> {
        let mut grh = [0u8; GRH_SIZE];
        self.buf.read(slot * SLOT, &mut grh)?;
        let mut data = vec![0u8; (wc.byte_len as usize).saturating_sub(GRH_SIZE)];
        self.buf.read(slot * SLOT + GRH_SIZE, &mut data)?;
        Ok((grh, data))
    }
}

/// What the server answers: the datagram reversed.
fn answer(data: &[u8]) -> Vec<u8> {
    data.iter().rev().copied().collect()
}

fn server(ip: IpAddr) -> Result<()> {
    let (_provider, s) = ud(0x5e, ip, SERVER_UDP, CLIENT_UDP)?;
    (0..ROUNDS).try_for_each(|slot| s.post_recv(slot))?;
    let (inst, qp) = (Arc::clone(&s.al), s.qp);
    let on_request: ListenHandler = Arc::new(move |_listen, cep, ev| {
        if let Event::SidrRequest { req, .. } = ev {
            let from = IpRequestInfo::from_sidr_req(req).map(|i| i.source);
            println!("server: SIDR request from {from:?}");
            let _ = cep.sidr_accept(&inst, qp, &[]);
        }
    });
    let at = SocketAddr::new(ip, SERVICE_PORT);
    s.ca.listen_ip_ud(&s.al, at, on_request, Arc::new(|_, _| {}))?;
    println!("server: UD QP {:#x} serving {at}", s.qp.query(&s.al)?.qpn);
    let (until, mut sent) = (Instant::now() + LIMIT, 0);
    while sent < ROUNDS {
        let wc = s.next(until)?;
        if wc.opcode == WcOpcode::Recv {
            let (grh, data) = s.slot(wc.wr_id as usize, &wc)?;
            // Back to the sender on the AV its datagram's completion gives.
            let back = s.pd.create_av_from_wc(&s.al, &wc, &grh, 1)?;
            let to = (wc.src_qp, RDMA_UDP_QKEY);
            s.send(wc.wr_id as usize, &answer(&data), back, to)?;
        } else {
            sent += 1;
        }
    }
    println!("server: answered {sent} datagrams");
    assert!(s.al.close()?.is_clean());
    Ok(())
}

fn client(server_ip: IpAddr, local: IpAddr) -> Result<()> {
    let (_provider, c) = ud(0xc1, local, CLIENT_UDP, SERVER_UDP)?;
    let service = SocketAddr::new(server_ip, SERVICE_PORT);
    let (tx, rx) = mpsc::channel();
    let on_result: ResolveHandler = Arc::new(move |r| drop(tx.send(r)));
    // The server may still be starting: up to 61 SIDR_REQs, 34 ms apart.
    let request = IpResolve::new(service).timeouts(13, 60);
    c.ca.resolve_ip(&c.al, 1, &request, on_result)?;
    let found = rx.recv_timeout(LIMIT).expect("a resolve outcome")?;
    println!("client: {service} is QP {:#x}", found.qpn);
    let av = c.pd.create_av(&c.al, found.av)?;
    let until = Instant::now() + LIMIT;
    for round in 0..ROUNDS {
        c.post_recv(round)?;
        let ping: Vec<u8> = (0..MSG).map(|i| (i * 7 + round * 13) as u8).collect();
        c.send(round, &ping, av, (found.qpn, found.qkey))?;
        let mut wc = c.next(until)?;
        while wc.opcode != WcOpcode::Recv {
            wc = c.next(until)?;
        }
        let (_, pong) = c.slot(wc.wr_id as usize, &wc)?;
        assert_eq!(pong, answer(&ping), "round {round}: the server's answer");
        assert_eq!(wc.src_qp, found.qpn, "round {round}: from the resolved QP");
    }
    println!("client: {ROUNDS} datagrams of {MSG} bytes answered, every byte checked");
    assert!(c.al.close()?.is_clean());
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| -> Option<IpAddr> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1).and_then(|v| v.parse().ok())
    };
    let local = arg("--local").unwrap_or_else(|| "127.0.0.2".parse().unwrap());
    match (arg("--listen"), arg("--connect")) {
        (Some(ip), None) => server(ip),
        (None, Some(ip)) => client(ip, local),
        (None, None) if args.is_empty() => {
            let ip: IpAddr = "127.0.0.1".parse().unwrap();
            let listener = std::thread::spawn(move || server(ip));
            client(ip, local)?;
            listener.join().expect("the server thread")
        }
        _ => Err(Error::invalid_parameter(
            "--listen IP | --connect IP [--local IP]",
        )),
    }
}
