//! What a run of the IP ping-pong reports, for people and as JSON.

use std::net::SocketAddr;

use crate::devinfo::CounterList;

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

/// Median and 99th percentile of `v` (sorted in place); zeros when empty.
pub(crate) fn percentiles(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}
