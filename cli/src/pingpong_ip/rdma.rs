//! `ibal pingpong --device NAME --listen/--connect IP[:PORT]`: the IP
//! ping-pong job of [`super`] on an RDMA device (a NIC, or
//! Linux rxe/siw) through libibverbs, connected through librdmacm-backed
//! CEPs (`ibal::rdma::cm`): the same hello in the REQ, reply in the REP,
//! RDMA WRITE + SEND round trips with every byte checked, disconnect,
//! destroy, and no object left live at AL close. The peer may be another
//! `ibal pingpong --device`, or `ibal pingpong --listen/--connect` on our
//! userspace RoCEv2 provider (the wire is the same).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Instant;

use al::Al;
use al::Handle;
use cep::cm::AcceptReply;
use cep::ip::IpConnect;
use cep::proto::{Event, TimedOut};
use cep::wire::ip_cm::PortSpace;
use cep::wire::RejectReason;
use hca::verbs::{self, Ca};
use ibal::rdma::cm::{self as rdmacm, RdmaCep, RdmaCmHandler, RdmaListenHandler};
use ibal::rdma::RdmaProvider;

use super::config::{IpPingPongConfig, Role};
use super::connect::reject_text;
use super::hello::{decode_reply, encode_hello, encode_reply, read_hello, MAX_SIZE};
use super::report::{percentiles, ConnectionReport, IpPingPongReport, QpNumbers};
use super::side::{hold, Side};

/// Runs the job on `device`.
pub fn run(cfg: &IpPingPongConfig, device: &str) -> Result<IpPingPongReport, String> {
    if cfg.iterations == 0 || cfg.size == 0 || cfg.size > MAX_SIZE {
        return Err(format!(
            "--iterations must be >= 1 and --size between 1 and {MAX_SIZE} bytes"
        ));
    }
    let provider = RdmaProvider::new();
    let guid = ibal_testkit::devices::rdma_device_guid(&provider, device)?;
    ibal::rdma::rdma_cm_available().map_err(|e| format!("librdmacm: {e}"))?;
    let al = Al::open().map_err(|e| e.to_string())?;
    let local = match &cfg.role {
        Role::Listen(a) => *a,
        Role::Connect(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let result = (|| -> Result<(Vec<ConnectionReport>, SocketAddr), String> {
        let ca = verbs::open_ca(al.instance(), &provider, guid)
            .map_err(|e| format!("cannot open {device}: {e}"))?;
        let mut connections = Vec::new();
        let mut local = local;
        match &cfg.role {
            Role::Connect(remote) => {
                let (c, ours) = connect_once(&al, ca, *remote, cfg)?;
                local = ours.unwrap_or(local);
                connections.push(c);
            }
            Role::Listen(addr) => {
                let listener = Listener::start(&al, ca, *addr)?;
                for _ in 0..cfg.count.max(1) {
                    connections.push(serve_once(&al, ca, &listener, cfg)?);
                }
                al.destroy_sync(listener.handle)
                    .map_err(|e| e.to_string())?;
            }
        }
        al.destroy_sync(ca).map_err(|e| e.to_string())?;
        Ok((connections, local))
    })();
    let closed = al.close();
    let (connections, local) = result.map_err(|e| match &closed {
        Ok(s) if s.total_live() == 0 => format!("{e}; AL closed: no objects left live"),
        Ok(s) => format!("{e}; AL closed: objects leaked: {s}"),
        Err(c) => format!("{e}; closing the AL: {c}"),
    })?;
    let stats = closed.map_err(|e| format!("closing the AL: {e}"))?;
    if stats.total_live() != 0 {
        return Err(format!("objects leaked: {stats}"));
    }
    Ok(IpPingPongReport {
        transport: format!("{device} (librdmacm)"),
        role: match cfg.role {
            Role::Listen(_) => "listen",
            Role::Connect(_) => "connect",
        },
        local,
        connections,
        live_after_close: stats.total_live(),
        port_counters: None,
    })
}

type Events = mpsc::Receiver<(Handle<RdmaCep>, Event)>;

fn channel() -> (RdmaCmHandler, Events) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let h: RdmaCmHandler = std::sync::Arc::new(move |cep, ev| {
        let _ = tx.lock().map(|t| t.send((cep, ev.clone())));
    });
    (h, rx)
}

/// Waits for an event of `cep` that `want` answers.
fn wait_for(
    events: &Events,
    cep: Handle<RdmaCep>,
    deadline: Instant,
    what: &str,
    mut want: impl FnMut(&Event) -> Option<Result<(), String>>,
) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok((c, ev)) if c == cep => {
                if let Some(r) = want(&ev) {
                    return r;
                }
            }
            Ok(_) => {}
            Err(_) => return Err(format!("timed out waiting for {what}")),
        }
    }
}

fn why_failed(al: &Al, cep: Handle<RdmaCep>) -> String {
    al.instance()
        .resolve(cep)
        .ok()
        .and_then(|c| c.error())
        .map_or_else(String::new, |e| format!(": {e}"))
}

/// QPNs and PSNs of our end, from the QP (rdma_cm does not report the
/// peer's starting PSN; the QP's send PSN is it).
fn numbers(al: &Al, side: &Side) -> Result<QpNumbers, String> {
    let a = qp::query_qp(al.instance(), side.qp).map_err(|e| format!("query QP: {e}"))?;
    Ok(QpNumbers {
        local_qpn: a.qpn,
        local_psn: a.rq_psn,
        peer_qpn: a.dest_qpn,
        peer_psn: a.sq_psn,
    })
}

fn connect_once(
    al: &Al,
    ca: Handle<Ca>,
    remote: SocketAddr,
    cfg: &IpPingPongConfig,
) -> Result<(ConnectionReport, Option<SocketAddr>), String> {
    Side::with(al, ca, cfg.size, |side| connect_on(al, side, remote, cfg))
}

fn connect_on(
    al: &Al,
    side: &Side,
    remote: SocketAddr,
    cfg: &IpPingPongConfig,
) -> Result<(ConnectionReport, Option<SocketAddr>), String> {
    let inst = al.instance();
    let request = IpConnect::new(remote)
        .path_mtu(cfg.mtu)
        .private_data(&encode_hello(cfg.iterations, cfg.size, side.rkey));
    let (handler, events) = channel();
    let t = Instant::now();
    let cep = rdmacm::connect(inst, side.qp, &request, handler)
        .map_err(|e| format!("connect to {remote}: {e}"))?;
    let mut peer_buf = None;
    let r = wait_for(&events, cep, t + cfg.timeout, "the peer's reply", |ev| {
        match ev {
        Event::ReplyReceived { rep, .. } => Some(
            decode_reply(rep.private_data.as_bytes())
                .map(|b| peer_buf = Some(b))
                .and_then(|()| side.post_seq_recv(al, 0))
                .and_then(|()| rdmacm::rtu(inst, cep, &[]).map_err(|e| format!("RTU: {e}"))),
        ),
        Event::Rejected { reason, .. } if *reason == RejectReason::InvalidServiceId => {
            Some(Err(format!(
                "connection refused by {remote}: nobody listens on port {} there (REJ: invalid service ID)",
                remote.port()
            )))
        }
        Event::Rejected {
            reason,
            rej,
            origin: cep::proto::RejectOrigin::Remote,
            ..
        } => Some(Err(format!(
            "{remote} rejected the connection: {reason:?}{}",
            reject_text(rej.private_data.as_bytes())
        ))),
        Event::Rejected { .. } => Some(Err(format!(
            "connect to {remote} failed here{}",
            why_failed(al, cep)
        ))),
        Event::Timeout {
            message: TimedOut::Req,
            ..
        } => Some(Err(format!(
            "no answer from {remote} (rdma_cm: REQ unanswered after its retries); is \
             `ibal pingpong --listen` running there?"
        ))),
        _ => None,
    }
    });
    if let Err(e) = r {
        let _ = al.destroy_sync(cep);
        return Err(e);
    }
    let connect_us = t.elapsed().as_secs_f64() * 1e6;
    let ours = inst.resolve(cep).ok().and_then(|c| c.addrs().0);
    let qp = numbers(al, side)?;
    let peer_buf = peer_buf.expect("set with the reply");
    let deadline = || Instant::now() + cfg.timeout;
    let mut rtts = match side.lead_round_trips(al, cfg.iterations, peer_buf, cfg.timeout) {
        Ok(rtts) => rtts,
        Err(e) => {
            let seen: Vec<&str> = events.try_iter().map(|e| e.1.name()).collect();
            let _ = al.destroy_sync(cep);
            return Err(format!("{e} [CM events: {seen:?}]"));
        }
    };
    hold(cfg, al, side);
    let t = Instant::now();
    let ended = rdmacm::disconnect(inst, cep, &[])
        .map_err(|e| format!("disconnect: {e}"))
        .and_then(|()| {
            wait_for(&events, cep, deadline(), "the peer's DREP", |ev| {
                matches!(ev, Event::Disconnected { .. }).then_some(Ok(()))
            })
        });
    let disconnect_us = t.elapsed().as_secs_f64() * 1e6;
    let released = ended.and_then(|()| {
        wait_for(&events, cep, deadline(), "the release", |ev| {
            matches!(ev, Event::Released { .. }).then_some(Ok(()))
        })
    });
    if let Err(e) = released {
        let _ = al.destroy_sync(cep);
        return Err(e);
    }
    let (median, p99) = percentiles(&mut rtts);
    Ok((
        ConnectionReport {
            peer: remote,
            iterations: cfg.iterations,
            size: cfg.size,
            connect_us,
            rtt_median_us: median,
            rtt_p99_us: p99,
            disconnect_us,
            qp,
            stale: false,
        },
        ours,
    ))
}

struct Listener {
    handle: Handle<rdmacm::RdmaListen>,
    requests: Events,
    events: Events,
}

impl Listener {
    fn start(al: &Al, ca: Handle<Ca>, addr: SocketAddr) -> Result<Listener, String> {
        let (rtx, requests) = mpsc::channel();
        let rtx = std::sync::Mutex::new(rtx);
        let on_request: RdmaListenHandler = std::sync::Arc::new(move |_l, cep, ev| {
            let _ = rtx.lock().map(|t| t.send((cep, ev.clone())));
        });
        let (handler, events) = channel();
        let handle = rdmacm::listen(al.instance(), ca, addr, PortSpace::Tcp, on_request, handler)
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
            return Err("an unexpected event on the listen".into());
        }
        Err(_) => return Err(format!("no connection request within {:?}", cfg.timeout)),
    };
    let t = Instant::now();
    let refuse = |why: &[u8], e: String| {
        let _ = rdmacm::reject(inst, cep, RejectReason::ConsumerReject, why);
        let _ = al.destroy_sync(cep);
        Err(e)
    };
    let info = match cep::ip::request_info(&req) {
        Ok(info) => info,
        Err(e) => return refuse(b"not rdma_cm", format!("a request we cannot read: {e}")),
    };
    let (iterations, size, peer_addr, peer_rkey) = match read_hello(&info.user_data, info.source) {
        Ok(h) => h,
        Err((why, e)) => return refuse(why, e),
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
    cep: Handle<RdmaCep>,
    (iterations, peer_buf): (u32, (u64, u32)),
    peer: SocketAddr,
    t: Instant,
    cfg: &IpPingPongConfig,
) -> Result<ConnectionReport, String> {
    let inst = al.instance();
    rdmacm::accept(
        inst,
        cep,
        side.qp,
        &AcceptReply::default().private_data(&encode_reply(side.rkey)),
    )
    .map_err(|e| format!("accept: {e}"))?;
    // The QP is in RTR now; the peer sends only after our REP reached it.
    side.post_seq_recv(al, 0)?;
    let deadline = || Instant::now() + cfg.timeout;
    let events = &listener.events;
    wait_for(events, cep, deadline(), "the peer's RTU", |ev| match ev {
        Event::Established { .. } => Some(Ok(())),
        Event::Rejected { reason, .. } => Some(Err(format!(
            "{peer} rejected our reply: {reason:?}{}",
            why_failed(al, cep)
        ))),
        Event::Timeout { .. } => Some(Err(format!("{peer} never sent its RTU"))),
        _ => None,
    })?;
    let connect_us = t.elapsed().as_secs_f64() * 1e6;
    let qp = numbers(al, side)?;
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
            wait_for(events, cep, deadline(), "the peer's DREQ", |ev| {
                matches!(ev, Event::DisconnectRequest { .. }).then_some(Ok(()))
            })
            .map_err(|w| format!("{e} ({w})"))
        },
    )?;
    let t = Instant::now();
    if !dreq_first {
        wait_for(events, cep, deadline(), "the peer's DREQ", |ev| {
            matches!(ev, Event::DisconnectRequest { .. }).then_some(Ok(()))
        })?;
    }
    hold(cfg, al, side);
    rdmacm::disconnect_reply(inst, cep, &[]).map_err(|e| format!("DREP: {e}"))?;
    let disconnect_us = t.elapsed().as_secs_f64() * 1e6;
    wait_for(events, cep, deadline(), "the release", |ev| {
        matches!(ev, Event::Released { .. }).then_some(Ok(()))
    })?;
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
        stale: false,
    })
}
