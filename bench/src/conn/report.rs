//! What `perf conn-rate` reports: distributions per leg and mode, the
//! floors, as a table or one JSON object.

use std::time::Duration;

use cep::cm::CmDrive;

use super::config::{ConnRateConfig, KRCORE_CONNECT_US, TARGET_RATIO};
use crate::json_f64;

/// Median and p99 of a sample, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dist {
    /// Samples.
    pub n: usize,
    /// Median.
    pub median_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl Dist {
    pub(super) fn of(mut v: Vec<f64>) -> Dist {
        if v.is_empty() {
            return Dist::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Dist {
            n: v.len(),
            median_us: v[v.len() / 2],
            p99_us: v[((v.len() * 99) / 100).min(v.len() - 1)],
        }
    }
}

/// What one drive mode of the CM measured.
#[derive(Clone, Debug)]
pub struct ModeFigures {
    /// How the CM agents ran.
    pub drive: CmDrive,
    /// Serial connect, `connect` to both sides `Established`.
    pub connect: Dist,
    /// Legs of the serial connect (medians of each leg, in order).
    pub legs: [(&'static str, f64); 4],
    /// Throughput: connections per second over all batches.
    pub conns_per_sec: f64,
    /// Throughput of the fastest batch.
    pub best_batch_conns_per_sec: f64,
    /// REQ to an unlistened service -> REJ, through both agents.
    pub rej_rtt: Dist,
    /// MADs the CM agents sent (both ports).
    pub cm_mads_sent: u64,
    /// Datagrams the fabric dropped for want of a receive buffer (whole
    /// run, including teardown bursts).
    pub dropped_no_recv: u64,
    /// Of those, dropped inside a timed connect window or batch (each is a
    /// CM retry inside a measurement).
    pub dropped_no_recv_timed: u64,
}

impl ModeFigures {
    /// What the serial median alone would allow, in connections per second.
    pub fn serial_conns_per_sec(&self) -> f64 {
        1e6 / self.connect.median_us
    }

    pub(super) fn name(&self) -> &'static str {
        match self.drive {
            CmDrive::Thread => "threaded",
            CmDrive::Poll => "polled",
        }
    }

    pub(super) fn to_text(&self, c: &ConnRateConfig, mad_rtt: &Dist) -> String {
        let mut out = match self.drive {
            CmDrive::Thread => String::from(
                "threaded CM (the default: an agent thread per port, callbacks on the AL's\n\
                 executor thread; every MAD and every callback is a thread wake-up)\n",
            ),
            CmDrive::Poll => String::from(
                "polled CM (CmDrive::Poll ports and a manual-executor AL, all driven by the\n\
                 measuring thread: cm::poll on both ports, then run_callbacks; no thread hand-off)\n",
            ),
        };
        out.push_str(&row("connect -> ESTABLISHED on both sides", &self.connect));
        out.push_str(&row("REQ -> REJ through both CM agents", &self.rej_rtt));
        out.push_str("  legs of a serial connect (median of each leg):\n");
        for (name, us) in &self.legs {
            out.push_str(&format!("    {name:<70} {us:>9.2} us\n"));
        }
        out.push_str(&format!(
            "  throughput: {:.0} connections/s with {} in flight (best batch {:.0}/s; serial median alone: {:.0}/s)\n",
            self.conns_per_sec,
            c.in_flight,
            self.best_batch_conns_per_sec,
            self.serial_conns_per_sec()
        ));
        out.push_str(&format!(
            "  median connect / MAD round trip: {:.1}x; / REQ->REJ: {:.2}x; / KRCore's ~{KRCORE_CONNECT_US:.0} us: {:.2}x\n",
            self.connect.median_us / mad_rtt.median_us,
            self.connect.median_us / self.rej_rtt.median_us,
            self.connect.median_us / KRCORE_CONNECT_US,
        ));
        out.push_str(&format!(
            "  CM MADs sent: {}; datagrams dropped for want of a receive: {} ({} inside timed windows)\n",
            self.cm_mads_sent, self.dropped_no_recv, self.dropped_no_recv_timed
        ));
        out
    }

    pub(super) fn json_fields(&self, mad_rtt: &Dist) -> String {
        let p = self.name();
        let legs: Vec<String> = self
            .legs
            .iter()
            .map(|(name, us)| format!("\"{}\":{}", name_key(name), json_f64(*us, 3)))
            .collect();
        format!(
            "\"{p}_connect_median_us\":{},\"{p}_connect_p99_us\":{},\"{p}_legs_median_us\":{{{}}},\
             \"{p}_conns_per_sec\":{},\"{p}_best_batch_conns_per_sec\":{},\"{p}_serial_conns_per_sec\":{},\
             \"{p}_ratio_connect_vs_mad_rtt\":{},\"{p}_rej_rtt_median_us\":{},\"{p}_rej_rtt_p99_us\":{},\
             \"{p}_cm_mads_sent\":{},\"{p}_dropped_no_recv\":{},\"{p}_dropped_no_recv_timed\":{}",
            json_f64(self.connect.median_us, 3),
            json_f64(self.connect.p99_us, 3),
            legs.join(","),
            json_f64(self.conns_per_sec, 3),
            json_f64(self.best_batch_conns_per_sec, 3),
            json_f64(self.serial_conns_per_sec(), 3),
            json_f64(self.connect.median_us / mad_rtt.median_us, 3),
            json_f64(self.rej_rtt.median_us, 3),
            json_f64(self.rej_rtt.p99_us, 3),
            self.cm_mads_sent,
            self.dropped_no_recv,
            self.dropped_no_recv_timed
        )
    }
}

pub(super) fn row(name: &str, d: &Dist) -> String {
    format!(
        "  {:<52} {:>8} {:>11.2} {:>11.2}\n",
        name, d.n, d.median_us, d.p99_us
    )
}

/// Everything one conn-rate run measured.
#[derive(Clone, Debug)]
pub struct ConnRateReport {
    /// The settings.
    pub config: ConnRateConfig,
    /// The default CM: agent threads and an executor thread (unless
    /// `--mode polled`).
    pub threaded: Option<ModeFigures>,
    /// The busy-polling CM: one thread drives agents and callbacks (unless
    /// `--mode threaded`).
    pub polled: Option<ModeFigures>,
    /// The floor: 256-byte UD SEND round trip, same thread (both phases'
    /// samples together).
    pub mad_rtt: Dist,
    /// Context: mpsc round trip through an echo thread.
    pub thread_echo_rtt: Dist,
    /// Context: the bare exchange (REQ, REP, RTU through the codec and the
    /// floor's UD SENDs, with the QP transitions a connection needs; no CM
    /// objects, tables, timers or callbacks), same thread.
    pub bare_exchange: Dist,
}

impl ConnRateReport {
    /// Median polled connect over the MAD round trip floor: like against
    /// like, both on one thread with no hand-off. The target applies here.
    /// NaN when the polled mode was not measured.
    pub fn ratio(&self) -> f64 {
        self.polled
            .as_ref()
            .map_or(f64::NAN, |m| m.connect.median_us / self.mad_rtt.median_us)
    }
    /// Median threaded connect over the MAD round trip floor (NaN when not
    /// measured).
    pub fn ratio_threaded(&self) -> f64 {
        self.threaded
            .as_ref()
            .map_or(f64::NAN, |m| m.connect.median_us / self.mad_rtt.median_us)
    }
    /// Whether [`Self::ratio`] is below [`TARGET_RATIO`] (false when the
    /// polled mode was not measured).
    pub fn target_met(&self) -> bool {
        self.ratio() < TARGET_RATIO
    }

    /// Human-readable table.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "perf conn-rate: RC connect through the CM (REQ, REP, RTU as 256-byte MADs on QP1)\n\
             between two soft HCAs, vs one 256-byte MAD round trip through the same fabric\n\
             ({} serial connections, {} batches of {} in flight, per drive mode)\n\n",
            c.connections, c.batches, c.in_flight
        );
        out.push_str(&format!(
            "  {:<52} {:>8} {:>11} {:>11}\n",
            "measurement", "samples", "median us", "p99 us"
        ));
        out.push_str(&row(
            "floor: 256-byte UD SEND round trip (same thread)",
            &self.mad_rtt,
        ));
        out.push_str(&row(
            "context: mpsc round trip via an echo thread",
            &self.thread_echo_rtt,
        ));
        out.push_str(&row(
            "context: bare REQ/REP/RTU + QP transitions, no CM",
            &self.bare_exchange,
        ));
        out.push_str(&format!(
            "  (bare exchange / MAD round trip: {:.1}x, before any CM object, table, timer or callback)\n",
            self.bare_exchange.median_us / self.mad_rtt.median_us
        ));
        for m in [&self.polled, &self.threaded].into_iter().flatten() {
            out.push('\n');
            out.push_str(&m.to_text(c, &self.mad_rtt));
        }
        out.push('\n');
        if self.polled.is_some() {
            out.push_str(&format!(
                "median polled connect / MAD round trip: {:.1}x (target < {TARGET_RATIO:.1}x): {}\n",
                self.ratio(),
                if self.target_met() { "met" } else { "NOT met" }
            ));
        } else {
            out.push_str(
                "the polled mode, which the target is judged on, was not measured (--mode)\n",
            );
        }
        if let Some(t) = &self.threaded {
            out.push_str(&format!(
                "median threaded connect / MAD round trip: {:.1}x",
                self.ratio_threaded()
            ));
            if let Some(p) = &self.polled {
                out.push_str(&format!(
                    " (context: {:.1} thread wake-ups' worth of the echo round trip)",
                    2.0 * (t.connect.median_us - p.connect.median_us)
                        / self.thread_echo_rtt.median_us
                ));
            }
            out.push('\n');
        }
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let c = &self.config;
        // The headline keys are the polled mode's (null when not measured).
        let polled_connect = self.polled.as_ref().map_or(
            Dist {
                n: 0,
                median_us: f64::NAN,
                p99_us: f64::NAN,
            },
            |m| m.connect,
        );
        format!(
            "{{\"benchmark\":\"conn-rate\",\"connections\":{},\"in_flight\":{},\"batches\":{},\
             \"connect_median_us\":{},\"connect_p99_us\":{},\
             \"mad_rtt_median_us\":{},\"mad_rtt_p99_us\":{},\"mad_rtt_samples\":{},\
             \"ratio_connect_vs_mad_rtt\":{},\"target_ratio\":{},\"target_met\":{},\
             \"ratio_threaded_connect_vs_mad_rtt\":{},\
             \"thread_echo_rtt_median_us\":{},\"thread_echo_rtt_p99_us\":{},\
             \"bare_exchange_median_us\":{},\"bare_exchange_p99_us\":{},\
             \"ratio_bare_exchange_vs_mad_rtt\":{},\
             \"krcore_connect_us\":{}{}{}}}",
            c.connections,
            c.in_flight,
            c.batches,
            json_f64(polled_connect.median_us, 3),
            json_f64(polled_connect.p99_us, 3),
            json_f64(self.mad_rtt.median_us, 3),
            json_f64(self.mad_rtt.p99_us, 3),
            self.mad_rtt.n,
            json_f64(self.ratio(), 3),
            json_f64(TARGET_RATIO, 3),
            self.target_met(),
            json_f64(self.ratio_threaded(), 3),
            json_f64(self.thread_echo_rtt.median_us, 3),
            json_f64(self.thread_echo_rtt.p99_us, 3),
            json_f64(self.bare_exchange.median_us, 3),
            json_f64(self.bare_exchange.p99_us, 3),
            json_f64(self.bare_exchange.median_us / self.mad_rtt.median_us, 3),
            json_f64(KRCORE_CONNECT_US, 3),
            self.polled.as_ref().map_or(String::new(), |m| format!(
                ",{}",
                m.json_fields(&self.mad_rtt)
            )),
            self.threaded.as_ref().map_or(String::new(), |m| format!(
                ",{}",
                m.json_fields(&self.mad_rtt)
            )),
        )
    }
}

/// The JSON key of a leg: its name up to the first ':'.
pub(super) fn name_key(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
