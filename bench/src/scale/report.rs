//! What `perf scale` measured, as a table or JSON.

use std::fmt::Write as _;
use std::time::Duration;

use ibal::prelude::WcStatus;

use super::config::{ScaleConfig, ScaleTransport};
use super::peer::{PeerClose, PeerReport};
use crate::json_f64;

/// One tenth of the connections (in `connect` order).
#[derive(Debug, Clone)]
pub struct Decile {
    /// Connections in it.
    pub count: u64,
    /// Median and 99th percentile connect latency (`connect` call to the
    /// active `Established`), us.
    pub median_us: f64,
    pub p99_us: f64,
    /// Connections per second: its count over the time from the previous
    /// decile's last `Established` to its own last.
    pub rate: f64,
}

/// The deciles of `times` (per connection: latency ns, established at
/// ns), whose connects started at `start` ns.
pub(crate) fn deciles(times: &[(u64, u64)], start: u64) -> Vec<Decile> {
    let n = times.len();
    let mut out = Vec::new();
    let mut prev_end = start;
    for d in 0..10 {
        let part = &times[d * n / 10..(d + 1) * n / 10];
        if part.is_empty() {
            continue;
        }
        let mut lat: Vec<u64> = part.iter().map(|t| t.0).collect();
        lat.sort_unstable();
        let end = part
            .iter()
            .map(|t| t.1)
            .max()
            .unwrap_or(prev_end)
            .max(prev_end);
        let secs = (end - prev_end) as f64 / 1e9;
        out.push(Decile {
            count: part.len() as u64,
            median_us: lat[lat.len() / 2] as f64 / 1e3,
            p99_us: lat[(lat.len() * 99 / 100).min(lat.len() - 1)] as f64 / 1e3,
            rate: if secs > 0.0 {
                part.len() as f64 / secs
            } else {
                f64::INFINITY
            },
        });
        prev_end = end;
    }
    out
}

/// The library's own accounting of one connection end, bytes.
#[derive(Debug, Clone)]
pub struct Accounting {
    /// A QP at the active end and at the listener: (access layer object,
    /// slot and child entry; provider state and queues).
    pub active_qp: (u64, u64),
    pub listener_qp: (u64, u64),
    /// A CEP (the same at both ends).
    pub cep: cep::cm::CepFootprint,
    /// The active end's per-connection CM handler (the benchmark's closure:
    /// a consumer's per-connection context).
    pub handler: u64,
}

impl Accounting {
    /// (active, listener) bytes per connection end.
    pub fn per_end(&self) -> (u64, u64) {
        let cep = self.cep.total() as u64;
        (
            self.active_qp.0 + self.active_qp.1 + cep + self.handler,
            self.listener_qp.0 + self.listener_qp.1 + cep,
        )
    }
}

/// The listener killed: how the survivor's connections ended.
#[derive(Debug, Clone)]
pub struct KillReport {
    /// From the first SEND posted to the last error completion.
    pub took: Duration,
    /// Completion statuses of the SENDs, with their counts.
    pub statuses: Vec<(WcStatus, u64)>,
    /// The transport's retry bound: (retry count + 1) ACK timeouts.
    pub bound: Duration,
    /// Per SEND, from its post to its error completion: median and most.
    pub each_median: Duration,
    pub each_max: Duration,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct ScaleReport {
    pub config: ScaleConfig,
    /// Connections established (the ping-pong's included).
    pub established: u32,
    /// Time to establish all but the first.
    pub connect_time: Duration,
    pub deciles: Vec<Decile>,
    /// This process's resident memory before and after the N - 1
    /// connections.
    pub rss_before: u64,
    pub rss_after: u64,
    /// The listener process's (two processes; else 0).
    pub peer_rss_before: u64,
    pub peer_rss_after: u64,
    /// The active end's live objects by kind with everything held.
    pub active_objects: Vec<(String, u64)>,
    pub active_cm_connections: u64,
    /// The listening end with everything held.
    pub peer_held: PeerReport,
    pub idle: Duration,
    /// CPU time of this process (both ends in one process) and of the
    /// listener process over `idle`.
    pub idle_cpu: Duration,
    pub peer_idle_cpu: Duration,
    /// Median 64-byte ping-pong round trip with one connection and with
    /// all N, us.
    pub ping_one_us: f64,
    pub ping_all_us: f64,
    /// Time to disconnect all (DREQ sent to DREP received).
    pub disconnect: Option<Duration>,
    /// The active end's AL close, and what it left live.
    pub close: Duration,
    pub left_live: u64,
    pub peer_close: Option<PeerClose>,
    pub kill: Option<KillReport>,
    pub peer_errors: u64,
    pub active_errors: u32,
    /// MADs sent by (active, listener) up to every connection established
    /// (3 per connection without loss: REQ, REP, RTU), and during the
    /// disconnect (2: DREQ, DREP); more means retransmissions.
    pub mads_connect: (u64, u64),
    pub mads_teardown: Option<(u64, u64)>,
    /// What the library says one connection end costs.
    pub accounting: Accounting,
}

impl ScaleReport {
    /// Connections the memory figures are over (all but the first).
    fn held(&self) -> f64 {
        f64::from(self.established.saturating_sub(1).max(1))
    }

    /// Resident bytes per connection end: (active, listener). In one
    /// process both ends share the delta.
    pub fn bytes_per_end(&self) -> (f64, f64) {
        let delta = |a: u64, b: u64| b.saturating_sub(a) as f64;
        if self.config.processes == 1 {
            let per = delta(self.rss_before, self.rss_after) / (2.0 * self.held());
            (per, per)
        } else {
            (
                delta(self.rss_before, self.rss_after) / self.held(),
                delta(self.peer_rss_before, self.peer_rss_after) / self.held(),
            )
        }
    }

    /// Idle CPU as a percentage of one core: (this process, listener).
    pub fn idle_cpu_pct(&self) -> (f64, f64) {
        let pct = |d: Duration| 100.0 * d.as_secs_f64() / self.idle.as_secs_f64();
        (pct(self.idle_cpu), pct(self.peer_idle_cpu))
    }

    /// Last decile's connect rate over the first's.
    pub fn rate_flatness(&self) -> f64 {
        match (self.deciles.first(), self.deciles.last()) {
            (Some(f), Some(l)) => l.rate / f.rate,
            _ => f64::NAN,
        }
    }

    pub fn ping_ratio(&self) -> f64 {
        self.ping_all_us / self.ping_one_us
    }

    /// Whether both ends ended with nothing live and no error.
    pub fn clean(&self) -> bool {
        self.left_live == 0
            && self.peer_close.as_ref().is_none_or(|c| c.left_live == 0)
            && self.peer_errors == 0
            && self.active_errors == 0
    }

    fn transport(&self) -> &'static str {
        match self.config.transport {
            ScaleTransport::Soft => "soft",
            ScaleTransport::Udp => "udp",
        }
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let c = &self.config;
        let _ = writeln!(
            s,
            "perf scale: {} RC connections over {} ({} process{}), {} connects in flight, {}-deep queues",
            self.established,
            self.transport(),
            c.processes,
            if c.processes == 1 { "" } else { "es" },
            c.in_flight,
            super::config::QUEUE_DEPTH
        );
        let _ = writeln!(
            s,
            "  connect: {:.2} s for {} ({:.0}/s)",
            self.connect_time.as_secs_f64(),
            self.established.saturating_sub(1),
            self.held() / self.connect_time.as_secs_f64()
        );
        let _ = writeln!(s, "  decile  connections  median us  p99 us  conn/s");
        for (i, d) in self.deciles.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {:>6}  {:>11}  {:>9.1}  {:>6.1}  {:>6.0}",
                i + 1,
                d.count,
                d.median_us,
                d.p99_us,
                d.rate
            );
        }
        let _ = writeln!(
            s,
            "  connect rate, last decile / first: {:.2}x (target >= 0.67x)",
            self.rate_flatness()
        );
        let (a, p) = self.bytes_per_end();
        let _ = writeln!(
            s,
            "  resident memory per connection end: active {:.0} B, listener {:.0} B{} (target <= 3072 B)",
            a,
            p,
            if c.processes == 1 {
                " (one process: the delta over both ends)"
            } else {
                ""
            }
        );
        let acc = &self.accounting;
        let (ea, ep) = acc.per_end();
        let o = &acc.cep.object;
        let _ = writeln!(
            s,
            "  the library's accounting per connection end: QP {} B in the access layer + {} B in the provider (listener: {} + {}); \
             CEP {} B (object {}, core {}, handle slot {}, child entry {}) + CM state {} B + route {} B; active handler {} B; \
             total active {} B, listener {} B; resident memory not accounted: active {:.0} B, listener {:.0} B",
            acc.active_qp.0,
            acc.active_qp.1,
            acc.listener_qp.0,
            acc.listener_qp.1,
            o.total(),
            o.object,
            o.core,
            o.slot,
            o.child_entry,
            acc.cep.endpoint,
            acc.cep.route,
            acc.handler,
            ea,
            ep,
            a - ea as f64,
            p - ep as f64
        );
        let objs: Vec<String> = self
            .active_objects
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            s,
            "  held: active end {} (CM connections {}); listener {} live objects, CM connections {}, accepted {}, established {}",
            objs.join(", "),
            self.active_cm_connections,
            self.peer_held.live_objects,
            self.peer_held.cm_connections,
            self.peer_held.accepted,
            self.peer_held.established
        );
        let (ia, ip) = self.idle_cpu_pct();
        if c.processes == 1 {
            let _ = writeln!(
                s,
                "  idle CPU over {:.1} s with all held: {:.2}% of one core (both ends) (target < 2%)",
                self.idle.as_secs_f64(),
                ia
            );
        } else {
            let _ = writeln!(
                s,
                "  idle CPU over {:.1} s with all held: active {:.2}%, listener {:.2}% of one core (target < 2%)",
                self.idle.as_secs_f64(),
                ia,
                ip
            );
        }
        let _ = writeln!(
            s,
            "  64-byte ping-pong, median of {}: {:.1} us with N = 1, {:.1} us with N = {}: {:.2}x (target <= 1.2x)",
            c.ping_iters,
            self.ping_one_us,
            self.ping_all_us,
            self.established,
            self.ping_ratio()
        );
        let _ = writeln!(
            s,
            "  CM MADs sent to establish all: active {}, listener {} (3 per connection without retransmission: {})",
            self.mads_connect.0,
            self.mads_connect.1,
            3 * u64::from(self.established)
        );
        if let Some(d) = self.disconnect {
            let (a, p) = self.mads_teardown.unwrap_or_default();
            let _ = writeln!(
                s,
                "  disconnect all: {:.2} s, MADs sent: active {a}, listener {p} (2 per connection without retransmission)",
                d.as_secs_f64()
            );
        }
        if let Some(k) = &self.kill {
            let st: Vec<String> = k
                .statuses
                .iter()
                .map(|(s, n)| format!("{s:?} {n}"))
                .collect();
            let _ = writeln!(
                s,
                "  listener killed (-9): every SEND ended with an error in {:.2} s ({}); each from its post: median {:.2} s, most {:.2} s; retry bound {:.2} s",
                k.took.as_secs_f64(),
                st.join(", "),
                k.each_median.as_secs_f64(),
                k.each_max.as_secs_f64(),
                k.bound.as_secs_f64()
            );
        }
        let _ = write!(
            s,
            "  AL close: active {:.2} s, {} left live",
            self.close.as_secs_f64(),
            self.left_live
        );
        if let Some(pc) = &self.peer_close {
            let _ = write!(
                s,
                "; listener {:.2} s, {} left live",
                pc.took.as_secs_f64(),
                pc.left_live
            );
        }
        let _ = writeln!(s);
        let _ = write!(
            s,
            "  errors: active {}, listener {}{}",
            self.active_errors,
            self.peer_errors,
            self.peer_held
                .first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
        s
    }

    pub fn to_json(&self) -> String {
        let c = &self.config;
        let deciles: Vec<String> = self
            .deciles
            .iter()
            .map(|d| {
                format!(
                    "{{\"count\":{},\"median_us\":{},\"p99_us\":{},\"rate\":{}}}",
                    d.count,
                    json_f64(d.median_us, 2),
                    json_f64(d.p99_us, 2),
                    json_f64(d.rate, 1)
                )
            })
            .collect();
        let objs: Vec<String> = self
            .active_objects
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        let (a, p) = self.bytes_per_end();
        let (ia, ip) = self.idle_cpu_pct();
        let secs = |d: Option<Duration>| json_f64(d.map_or(f64::NAN, |d| d.as_secs_f64()), 4);
        format!(
            "{{\"transport\":\"{}\",\"processes\":{},\"connections\":{},\"in_flight\":{},\
             \"established\":{},\"connect_s\":{},\"deciles\":[{}],\"rate_flatness\":{},\
             \"rss_before\":{},\"rss_after\":{},\"peer_rss_before\":{},\"peer_rss_after\":{},\
             \"bytes_per_end_active\":{},\"bytes_per_end_listener\":{},\"active_objects\":{{{}}},\
             \"active_cm_connections\":{},\"listener_live_objects\":{},\"listener_cm_connections\":{},\
             \"idle_s\":{},\"idle_cpu_pct\":{},\"listener_idle_cpu_pct\":{},\
             \"ping_one_us\":{},\"ping_all_us\":{},\"ping_ratio\":{},\"disconnect_s\":{},\
             \"close_s\":{},\"left_live\":{},\"listener_close_s\":{},\"listener_left_live\":{},\
             \"kill_s\":{},\"kill_bound_s\":{},\"kill_each_median_s\":{},\"kill_each_max_s\":{},\"active_errors\":{},\"listener_errors\":{},\"clean\":{},\
             \"mads_connect\":[{},{}],\"mads_teardown\":[{},{}],\
             \"accounting\":{{\"active_qp_al\":{},\"active_qp_provider\":{},\"listener_qp_al\":{},\
             \"listener_qp_provider\":{},\"cep_al\":{},\"cep_cm\":{},\"cep_route\":{},\"handler\":{},\
             \"active_total\":{},\"listener_total\":{}}}}}",
            self.transport(),
            c.processes,
            c.connections,
            c.in_flight,
            self.established,
            json_f64(self.connect_time.as_secs_f64(), 4),
            deciles.join(","),
            json_f64(self.rate_flatness(), 3),
            self.rss_before,
            self.rss_after,
            self.peer_rss_before,
            self.peer_rss_after,
            json_f64(a, 1),
            json_f64(p, 1),
            objs.join(","),
            self.active_cm_connections,
            self.peer_held.live_objects,
            self.peer_held.cm_connections,
            json_f64(self.idle.as_secs_f64(), 3),
            json_f64(ia, 3),
            json_f64(ip, 3),
            json_f64(self.ping_one_us, 2),
            json_f64(self.ping_all_us, 2),
            json_f64(self.ping_ratio(), 3),
            secs(self.disconnect),
            json_f64(self.close.as_secs_f64(), 4),
            self.left_live,
            secs(self.peer_close.as_ref().map(|c| c.took)),
            self.peer_close.as_ref().map_or(0, |c| c.left_live),
            secs(self.kill.as_ref().map(|k| k.took)),
            secs(self.kill.as_ref().map(|k| k.bound)),
            secs(self.kill.as_ref().map(|k| k.each_median)),
            secs(self.kill.as_ref().map(|k| k.each_max)),
            self.active_errors,
            self.peer_errors,
            self.clean(),
            self.mads_connect.0,
            self.mads_connect.1,
            self.mads_teardown.map_or(0, |m| m.0),
            self.mads_teardown.map_or(0, |m| m.1),
            self.accounting.active_qp.0,
            self.accounting.active_qp.1,
            self.accounting.listener_qp.0,
            self.accounting.listener_qp.1,
            self.accounting.cep.object.total(),
            self.accounting.cep.endpoint,
            self.accounting.cep.route,
            self.accounting.handler,
            self.accounting.per_end().0,
            self.accounting.per_end().1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deciles_split_in_connect_order_and_rate_from_the_previous_end() {
        // 20 connections, each 1 ms after the last, latency 5 us.
        let times: Vec<(u64, u64)> = (1..=20).map(|i| (5_000, i * 1_000_000)).collect();
        let d = deciles(&times, 0);
        assert_eq!(d.len(), 10);
        assert!(d.iter().all(|d| d.count == 2));
        assert!((d[0].rate - 1000.0).abs() < 1e-6, "{}", d[0].rate);
        assert!((d[9].rate - 1000.0).abs() < 1e-6);
        assert_eq!(d[0].median_us, 5.0);
        // Fewer than ten: the empty deciles are left out.
        assert_eq!(deciles(&times[..3], 0).len(), 3);
        assert!(deciles(&[], 0).is_empty());
    }
}
