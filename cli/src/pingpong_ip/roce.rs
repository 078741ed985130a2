//! The IP ping-pong on our RoCEv2 port: open a RoCEv2 device on our
//! address, connect through the CM with rdma_cm addressing (`cep::ip`) or
//! listen and serve `count` connections, and close with nothing live.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use al::{Al, Handle};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ListenHandler};
use cep::ip::{self, IpConnect};
use cep::proto::Event;
use cep::wire::ip_cm::PortSpace;
use cep::wire::RejectReason;
use hca::verbs::{self, Ca};
use ibal::roce::{DeviceConfig, PortConfig, RoceProvider};

use super::config::{IpPingPongConfig, Role};
use super::connect::{connect_and_answer, local_address_for, wait_event};
use super::hello::{decode_reply, encode_hello, encode_reply, read_hello, MAX_SIZE};
use super::report::{percentiles, ConnectionReport, IpPingPongReport, QpNumbers};
use super::side::{hold, Side};
use crate::devinfo::CounterList;

/// Runs the job on a RoCEv2 port of our provider.
pub(super) fn run(cfg: &IpPingPongConfig) -> Result<IpPingPongReport, String> {
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
    if let Some(n) = cfg.max_qp {
        device.limits.max_qp = n;
    }
    let provider = RoceProvider::new(vec![device]);
    let al = Al::open().map_err(|e| e.to_string())?;
    let status = crate::status::StatusPrinter::for_al(al.instance(), cfg.status);
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
    drop(status);
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

/// What the CM negotiated for our end of `cep` (`cm::connection_attrs`).
fn qp_numbers(al: &Al, cep: Handle<Cep>) -> Result<QpNumbers, String> {
    let a = cm::connection_attrs(al.instance(), cep)
        .map_err(|e| format!("the connection's attributes: {e}"))?;
    Ok(QpNumbers {
        local_qpn: a.local_qpn,
        local_psn: a.local_starting_psn,
        peer_qpn: a.peer_qpn,
        peer_psn: a.peer_starting_psn,
    })
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
    let qp = qp_numbers(al, cep)?;
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
    let qp = qp_numbers(al, cep)?;
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
