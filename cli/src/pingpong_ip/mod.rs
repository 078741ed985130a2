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
//!
//! By job: `config` what a run is told ([`IpPingPongConfig`]), `hello`
//! the job's private data in the REQ and REP, `side` one side's verbs objects
//! and round trips, `connect` the connecting side's CM steps (also
//! rping's), `report` what a run reports, `roce` the job on our RoCEv2
//! port, `rdma` the same on an RDMA device through librdmacm (feature
//! `rdma`). This file only chooses between the last two.

mod config;
mod connect;
mod hello;
#[cfg(feature = "rdma")]
mod rdma;
mod report;
mod roce;
mod side;

pub use config::{IpPingPongConfig, Role, DEFAULT_PORT};
pub use connect::local_address_for;
pub(crate) use connect::{connect_and_answer, wait_event};
pub use report::{ConnectionReport, IpPingPongReport, QpNumbers};

/// Runs the job: on `cfg.device` through librdmacm when one is named,
/// otherwise on our RoCEv2 port.
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
    roce::run(cfg)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;

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
