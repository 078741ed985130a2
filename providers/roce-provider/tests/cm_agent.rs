//! The CM agent of `cep`, unchanged, on QP1 of RoCEv2 ports: REQ, REP,
//! RTU and DREQ/DREP between two devices over loopback UDP.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cep::agent::{AgentConfig, CmAgent, Delivery, EventSink};
use cep::proto::{ConnectParams, Event};
use cep::wire::{PathInfo, Rep, Req};
use provider::Provider;
use roce_provider::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};

type Agent = CmAgent<RoceDevice>;

const SVC: u64 = 0x1000_0000_0000_0001;
const DEADLINE: Duration = Duration::from_secs(10);

fn forward(tx: mpsc::Sender<Event>) -> EventSink {
    let tx = Mutex::new(tx);
    al::sync::Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
        Delivery::Taken
    })
}

fn expect(rx: &mpsc::Receiver<Event>, what: &str, f: impl Fn(&Event) -> bool) -> Event {
    let end = Instant::now() + DEADLINE;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if f(&e) => return e,
            Ok(_) => {}
            Err(_) => panic!("no {what} within {DEADLINE:?}"),
        }
    }
}

fn agents(ip_a: &str, ip_b: &str, v6_grh: bool) -> (Agent, Agent) {
    let port = |ip: &str| {
        PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0)).ipv4_grh_as_ipv6(v6_grh)
    };
    let p = RoceProvider::new(vec![
        DeviceConfig::new("a", 0xa0, vec![port(ip_a)]),
        DeviceConfig::new("b", 0xb0, vec![port(ip_b)]),
    ]);
    let a = CmAgent::new(p.open(0xa0).unwrap(), 1, AgentConfig::default()).unwrap();
    let b = CmAgent::new(p.open(0xb0).unwrap(), 1, AgentConfig::default()).unwrap();
    (a, b)
}

fn req(from: &Agent, to: &Agent) -> Req {
    Req {
        service_id: SVC,
        local_qpn: 0x11,
        local_qkey: 0x1111,
        starting_psn: 0x100,
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: 12,
        local_cm_response_timeout: 12,
        max_cm_retries: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        primary_path: PathInfo {
            local_gid: from.local_addr().gid,
            remote_gid: to.local_addr().gid,
            hop_limit: 64,
            local_ack_timeout: 11,
            ..PathInfo::default()
        },
        ..Req::default()
    }
}

fn connect_and_disconnect(a: Agent, b: Agent) {
    let b = Arc::new(b);
    let (tx_a, rx_a) = mpsc::channel();
    let (tx_b, rx_b) = mpsc::channel();
    a.set_event_sink(Some(forward(tx_a)));
    let weak_b = Arc::downgrade(&b);
    let tx_b = Mutex::new(tx_b);
    b.set_event_sink(Some(al::sync::Arc::new(move |e: Event| {
        if let Some(b) = weak_b.upgrade() {
            match &e {
                Event::ConnectRequest { conn, .. } => b
                    .accept(
                        *conn,
                        Rep {
                            local_qpn: 0x22,
                            starting_psn: 0x200,
                            target_ack_delay: 8,
                            responder_resources: 4,
                            initiator_depth: 4,
                            rnr_retry_count: 7,
                            ..Rep::default()
                        },
                    )
                    .unwrap(),
                Event::DisconnectRequest { conn, .. } => b.disconnect_reply(*conn, &[]).unwrap(),
                _ => {}
            }
        }
        let _ = tx_b.lock().unwrap().send(e);
        Delivery::Taken
    })));
    let listener = b.listen(SVC).unwrap();
    a.spawn().unwrap();
    b.spawn().unwrap();
    let ca = a
        .connect(ConnectParams::new(b.local_addr(), req(&a, &b)))
        .unwrap();
    expect(
        &rx_a,
        "REP",
        |e| matches!(e, Event::ReplyReceived { conn, .. } if *conn == ca),
    );
    a.send_rtu(ca, &[]).unwrap();
    expect(&rx_a, "Established (A)", |e| {
        *e == Event::Established { conn: ca }
    });
    expect(&rx_b, "Established (B)", |e| {
        matches!(e, Event::Established { .. })
    });
    a.disconnect(ca, &[]).unwrap();
    expect(
        &rx_a,
        "Disconnected",
        |e| matches!(e, Event::Disconnected { conn, .. } if *conn == ca),
    );
    b.cancel_listen(listener).unwrap();
    a.shutdown();
    b.shutdown();
}

/// IPv4 ports, default GRH area (rxe's layout: 20 zero bytes, then the
/// IPv4 header). The agent reads the requester's address from the IPv4
/// source there (`cep::agent::io::source_gid`), as `ibv_init_ah_from_wc`
/// does, and answers it.
#[test]
fn cm_agent_connects_over_ipv4_roce() {
    let (a, b) = agents("127.0.0.1", "127.0.0.2", false);
    connect_and_disconnect(a, b);
}

/// The same with `PortConfig::ipv4_grh_as_ipv6`: the GRH area carries the
/// IPv4-mapped GIDs where the agent reads them, and the unchanged agent
/// connects and disconnects.
#[test]
fn cm_agent_connects_over_ipv4_roce_with_ipv6_style_grh() {
    let (a, b) = agents("127.0.0.1", "127.0.0.2", true);
    connect_and_disconnect(a, b);
}
