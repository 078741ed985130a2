//! The connecting side's CM steps over rdma_cm-style addressing
//! (`cep::ip`), shared with `ibal rping`: our port's address for a peer,
//! the CEP's events as a channel, the REQ and its answer (REP then RTU, or
//! a REJ or time-out in plain words).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, Cep, CmHandler};
use cep::ip::{self, IpConnect};
use cep::proto::{Event, TimedOut};
use cep::wire::RejectReason;
use qp::Qp;

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

/// CM events of one CEP, as a channel.
fn event_channel() -> (CmHandler, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let h: CmHandler = Arc::new(move |_cep, ev| {
        let _ = tx.lock().map(|t| t.send(ev.clone()));
    });
    (h, rx)
}

/// Waits until `want` decides on an event of `rx` (its answer is the
/// result), or `deadline` passes (an error naming `what`).
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

/// How long the CM tries before it reports a REQ timed out: every try
/// waits the response timeout (and the packet lifetime, not counted).
fn cm_give_up(cm_response_timeout: u8, max_cm_retries: u8) -> Duration {
    let one = Duration::from_nanos(4096u64 << cm_response_timeout.min(31));
    one * (u32::from(max_cm_retries) + 1) + Duration::from_secs(1)
}

/// A REJ's private data as words for an error message (` (text)`), or
/// nothing when it holds no text.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_peers_get_the_next_loopback_address() {
        let l = |s: &str| local_address_for(s.parse().unwrap(), 4791).unwrap();
        assert_eq!(l("127.0.0.1"), "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(l("127.0.0.254"), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
