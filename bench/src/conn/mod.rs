//! `ibal perf conn-rate`: how fast the connection manager connects two RC
//! QPs on the embedded in-process fabric, against the round trip of one
//! 256-byte MAD through the same fabric, measured in the same run.
//!
//! One AL instance on [`ibal_testkit::devices::default_provider`] (two soft HCAs,
//! LIDs 1 and 2); both CAs opened with the CM attached to their port
//! ([`cm::attach_ca`]: one CM agent thread per port, on QP1); a listen on
//! HCA 1 whose request callback accepts ([`cm::accept`]) on the passive QP
//! reserved for the requesting active QP; the active handler answers the
//! REP with [`cm::rtu`]. Every CM message is a real 256-byte MAD on QP1.
//!
//! # Serial connect latency
//!
//! `connections` connections, one at a time, each on a fresh RC QP pair
//! (created before the timed window). The time runs from just before
//! [`cm::connect`] to the later of the two `Established` events, each
//! stamped with `Instant::now()` inside its callback (so the main thread's
//! own wake-up is not counted). The connection stays up until the end of
//! its round; then the QPs are destroyed (which disconnects, DREQ/DREP) and
//! the run waits until both agents hold no connection (timewait over), so
//! no teardown traffic or timewait timer lands inside a timed window.
//! Reported: median and p99, and the median of each leg: `connect` (REQ)
//! to the listener's callback; the listener's callback (accept, REP) to the
//! active side's `ReplyReceived` callback; from that (rtu, RTU) to the
//! passive `Established`, and to the active `Established` (a local event of
//! the `rtu` call, delivered through the executor).
//!
//! # Throughput
//!
//! `batches` batches of `in_flight` connections: the QP pairs are created,
//! then `in_flight` `connect` calls are issued back to back and the batch
//! ends when every connection is `Established` on both sides. Connections
//! per second = connections / (sum of batch times); the best batch is
//! reported too.
//!
//! # The floor: one 256-byte MAD round trip
//!
//! The CM agents own QP1 of both ports, so the floor uses a pair of UD QPs
//! on the same two soft HCAs (Q_Key checked by the fabric, an AV per side
//! from [`verbs::create_av`]). One round trip, all on the calling thread:
//! post a receive (40-byte GRH area + 256 bytes) on each side, SEND 256
//! bytes A -> B, poll A's send and B's receive completion (byte count
//! checked), SEND 256 bytes B -> A, poll B's send and A's receive
//! completion. This is what the fabric and the verbs layer cost for a MAD
//! each way; it has no thread switch and no CM encode/decode.
//!
//! # The bare exchange
//!
//! What the wire and the verbs alone make a connection cost, measured on
//! the floor's UD pair in the same rounds (one per serial connection): the
//! real codec encodes a REQ, a REP and an RTU and decodes each on the other
//! side, each MAD travels as one floor-style UD SEND, and a fresh RC QP pair
//! is queried and moved RESET -> INIT -> RTR -> RTS with the attributes the
//! messages negotiate, in the order `cm::connect`, `cm::accept`, `cm::rtu`
//! and the passive RTU handling do it. No CEP, comm id, table, timer, CID
//! binding, event or callback: everything the CM itself adds is left out,
//! so the bare exchange over the floor is how close to the floor any CM on
//! these verbs and this codec could come.
//!
//! Also measured in the same rounds, for context:
//! * **REQ -> REJ**: a `connect` to a service nobody listens on; the peer's
//!   agent answers with a REJ. Time from before `connect` to the active
//!   handler's `Rejected` callback: two real MADs through both agent
//!   threads and one executor hop, i.e. the MAD round trip *with* the CM's
//!   thread wake-ups.
//! * **thread echo**: a `std::sync::mpsc` round trip through an echo thread
//!   (two thread wake-ups, nothing else), the unit the CM path is made of.
//!
//! Target (from the issue): median connect < 3x the MAD round trip floor.
//! The KRCore figure (USENIX ATC 2022: about 10 us per RDMA connection) is
//! printed as context. At the end the AL is closed and must report no live
//! object.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc as StdArc, Condvar, Mutex};
use std::time::{Duration, Instant};

use al::{Al, AlConfig, AlInstance, ExecutorMode, Handle};
use cep::cm::{self, AcceptReply, Cep, CmDrive, CmHandler, CmPort, ConnectRequest, ListenHandler};
use cep::ip::IpConnect;
use cep::proto::Event;
use cep::wire::ip_cm::PortSpace;
use hca::provider::{QpCaps, QpType, Wc};
use hca::verbs::{self, Ca, Cq, Pd};
use ibal::roce::RoceProvider;
use ibal::verbs::SoftProvider;
use qp::{create_qp, Qp, QpCreate};

use ibal_testkit::devices;

pub use super::BenchResult;
use super::{al_err, json_f64, poll_one};

/// `perf conn-rate --transport udp`: the same measurement between two
/// RoCEv2 ports on real UDP sockets.
pub mod udp;

mod bare;
use bare::{Route, UdPair};

/// The service the passive side listens on.
pub const SERVICE_ID: u64 = 0x0000_0000_1ba1_0c01;
/// A service nobody listens on (the REQ -> REJ probe).
pub const UNLISTENED_SERVICE_ID: u64 = 0x0000_0000_1ba1_0c02;
/// Target: median connect / MAD round trip below this.
pub const TARGET_RATIO: f64 = 3.0;
/// KRCore (USENIX ATC 2022): about 10 us to establish an RDMA connection.
pub const KRCORE_CONNECT_US: f64 = 10.0;
/// Bytes of a MAD.
pub const MAD_SIZE: usize = 256;
/// GRH area in front of every UD receive.
const GRH_SIZE: usize = 40;
/// Serial connections (and REJ probes) per round; between rounds the run
/// waits for the agents to go quiet.
const ROUND: usize = 100;
/// UD round trips per serial connection (all timed individually).
const MAD_RTTS_PER_CONNECTION: usize = 20;
/// How long any wait may take before the run fails.
const WAIT: Duration = Duration::from_secs(30);

// --------------------------------------------------------------- settings --

/// Which CM drive modes a `perf conn-rate` run measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnModes {
    /// Polled, then threaded (the report's full comparison).
    #[default]
    Both,
    /// Only the polled CM (the mode the target is judged on; also what to
    /// profile, since one thread does all the work).
    Polled,
    /// Only the threaded CM.
    Threaded,
}

impl ConnModes {
    fn polled(self) -> bool {
        self != ConnModes::Threaded
    }
    fn threaded(self) -> bool {
        self != ConnModes::Polled
    }
}

/// Settings of one `perf conn-rate` run.
#[derive(Clone, Debug)]
pub struct ConnRateConfig {
    /// Serial connections (also the number of REQ -> REJ probes).
    pub connections: usize,
    /// Connections in flight at once in the throughput phase.
    pub in_flight: usize,
    /// Batches of `in_flight` connections.
    pub batches: usize,
    /// The drive modes to measure.
    pub modes: ConnModes,
}

impl Default for ConnRateConfig {
    fn default() -> Self {
        ConnRateConfig {
            connections: 500,
            in_flight: 64,
            batches: 8,
            modes: ConnModes::Both,
        }
    }
}

impl ConnRateConfig {
    fn validate(&self) -> BenchResult<()> {
        if self.connections == 0 || self.in_flight == 0 || self.batches == 0 {
            return Err("--connections, --in-flight and --batches must be at least 1".into());
        }
        if self.connections > 100_000 || self.in_flight > 4096 {
            return Err("--connections is at most 100000 and --in-flight at most 4096".into());
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- report --

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
    fn of(mut v: Vec<f64>) -> Dist {
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

    fn name(&self) -> &'static str {
        match self.drive {
            CmDrive::Thread => "threaded",
            CmDrive::Poll => "polled",
        }
    }

    fn to_text(&self, c: &ConnRateConfig, mad_rtt: &Dist) -> String {
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

    fn json_fields(&self, mad_rtt: &Dist) -> String {
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

fn row(name: &str, d: &Dist) -> String {
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
fn name_key(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// ---------------------------------------------------------------- tracker --

/// Instants of one connection (or probe), stamped in the callbacks.
#[derive(Clone, Copy, Debug, Default)]
struct Times {
    start: Option<Instant>,
    /// The listener's request callback ran.
    request: Option<Instant>,
    /// The active side's `ReplyReceived` callback ran.
    reply: Option<Instant>,
    active_established: Option<Instant>,
    passive_established: Option<Instant>,
    rejected: Option<Instant>,
}

impl Times {
    fn established(&self) -> Option<Instant> {
        Some(self.active_established?.max(self.passive_established?))
    }
}

#[derive(Default)]
struct TrackState {
    slots: Vec<Times>,
    /// Active QPN -> (slot, the passive QP reserved for it).
    reserved: HashMap<u32, (usize, Handle<Qp>)>,
    /// Passive CEP -> slot.
    passive: HashMap<Handle<Cep>, usize>,
    /// Connections established on both sides.
    completed: usize,
    /// Probes rejected.
    rejected: usize,
    errors: Vec<String>,
}

/// What the callbacks record and the main thread waits on. Only a finished
/// connection, a rejection or an error wakes the main thread.
#[derive(Default)]
struct Tracker {
    state: Mutex<TrackState>,
    changed: Condvar,
}

impl Tracker {
    fn with<R>(&self, f: impl FnOnce(&mut TrackState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    fn error(&self, e: String) {
        self.with(|s| s.errors.push(e));
        self.changed.notify_all();
    }

    fn established(&self, slot: usize, active: bool, at: Instant) {
        let done = self.with(|s| {
            let t = &mut s.slots[slot];
            if active {
                t.active_established = Some(at);
            } else {
                t.passive_established = Some(at);
            }
            let done = t.established().is_some();
            if done {
                s.completed += 1;
            }
            done
        });
        if done {
            self.changed.notify_all();
        }
    }

    fn rejected(&self, slot: usize, at: Instant) {
        self.with(|s| {
            s.slots[slot].rejected = Some(at);
            s.rejected += 1;
        });
        self.changed.notify_all();
    }

    /// Whether `done` holds; an error a callback reported is an error.
    fn check(&self, done: impl Fn(&TrackState) -> bool) -> BenchResult<bool> {
        self.with(|s| match s.errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(done(s)),
        })
    }

    /// Wait until `done` holds (or a callback reported an error).
    fn wait(&self, what: &str, done: impl Fn(&TrackState) -> bool) -> BenchResult<()> {
        let deadline = Instant::now() + WAIT;
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(e) = st.errors.first() {
                return Err(e.clone());
            }
            if done(&st) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            st = self.changed.wait_timeout(st, deadline - now).unwrap().0;
        }
    }
}

fn active_handler(inst: StdArc<AlInstance>, track: StdArc<Tracker>, slot: usize) -> CmHandler {
    StdArc::new(move |cep, ev| {
        let now = Instant::now();
        match ev {
            Event::ReplyReceived { .. } => {
                track.with(|s| s.slots[slot].reply = Some(now));
                if let Err(e) = cm::rtu(&inst, cep, &[]) {
                    track.error(format!("connection {slot}: rtu failed: {e}"));
                }
            }
            Event::Established { .. } => track.established(slot, true, now),
            Event::Rejected { reason, .. } => {
                let probe = track.with(|s| s.slots[slot].request.is_none());
                if probe {
                    track.rejected(slot, now);
                } else {
                    track.error(format!("connection {slot} was rejected: {reason:?}"));
                }
            }
            Event::Timeout { .. } => track.error(format!("connection {slot} timed out")),
            _ => {}
        }
    })
}

// ------------------------------------------------------------------ bench --

/// The listen's handlers: the request callback accepts on the passive QP
/// reserved for the requesting active QP; the passive handler stamps
/// `Established` and answers a DREQ.
fn listen_handlers(
    inst: &StdArc<AlInstance>,
    track: &StdArc<Tracker>,
) -> (ListenHandler, CmHandler) {
    let (i, t) = (inst.clone(), track.clone());
    let on_request: ListenHandler = StdArc::new(move |_l, cep, ev| {
        let now = Instant::now();
        let Event::ConnectRequest { req, .. } = ev else {
            return;
        };
        let found = t.with(|s| {
            let found = s.reserved.get(&req.local_qpn).copied();
            if let Some((slot, _)) = found {
                s.slots[slot].request = Some(now);
                s.passive.insert(cep, slot);
            }
            found
        });
        match found {
            Some((slot, qp)) => {
                if let Err(e) = cm::accept(&i, cep, qp, &AcceptReply::default()) {
                    t.error(format!("connection {slot}: accept failed: {e}"));
                }
            }
            None => t.error(format!("a REQ from unknown QPN {:#x}", req.local_qpn)),
        }
    });
    let (i, t) = (inst.clone(), track.clone());
    let passive: CmHandler = StdArc::new(move |cep, ev| {
        let now = Instant::now();
        match ev {
            Event::Established { .. } => {
                if let Some(slot) = t.with(|s| s.passive.get(&cep).copied()) {
                    t.established(slot, false, now);
                }
            }
            Event::DisconnectRequest { .. } => {
                let _ = cm::disconnect_reply(&i, cep, &[]);
            }
            _ => {}
        }
    });
    (on_request, passive)
}

/// Which network a [`Bench`] runs on.
enum Net {
    /// Two soft HCAs of the embedded fabric (LIDs 1 and 2).
    Soft(SoftProvider),
    /// Two RoCEv2 devices of one provider on real UDP sockets
    /// (`udp::ADDRS`); the CAs, for their port counters.
    Udp {
        /// Kept until the AL has closed (its directory names the ports).
        _provider: RoceProvider,
        cas: [Handle<Ca>; 2],
    },
}

/// The AL, both CAs with the CM attached, the listen, and per-HCA PD + CQ.
struct Bench {
    drive: CmDrive,
    al: Al,
    net: Net,
    pds: [Handle<Pd>; 2],
    cqs: [Handle<Cq>; 2],
    ports: Vec<Handle<CmPort>>,
    track: StdArc<Tracker>,
    /// `live_connections` of the agents with nothing but the listen.
    idle_connections: usize,
}

impl Bench {
    /// A fresh fabric (so the ports are new and take `drive`), an AL whose
    /// executor is a thread (threaded CM) or manual (polled CM).
    fn open(drive: CmDrive) -> BenchResult<Bench> {
        Bench::open_on(drive, false)
    }

    /// [`Bench::open`] on the soft fabric, or (`udp`) on two RoCEv2
    /// devices of one provider bound to `udp::ADDRS` (ephemeral UDP ports,
    /// found through the provider's directory), with an rdma_cm-style
    /// listen (`cep::ip`) on the second.
    fn open_on(drive: CmDrive, udp: bool) -> BenchResult<Bench> {
        let executor = match drive {
            CmDrive::Thread => ExecutorMode::Thread,
            CmDrive::Poll => ExecutorMode::Manual,
        };
        let al = Al::open_with(AlConfig {
            executor,
            ..AlConfig::default()
        })
        .map_err(al_err("opening the AL"))?;
        let mut cas: Vec<Handle<Ca>> = Vec::new();
        let mut pds = Vec::new();
        let mut cqs = Vec::new();
        let mut ports = Vec::new();
        let (soft, roce) = if udp {
            (None, Some(udp::provider()))
        } else {
            (Some(devices::default_provider()), None)
        };
        let guids = if udp {
            udp::GUIDS
        } else {
            devices::DEFAULT_NODE_GUIDS
        };
        for guid in guids {
            let ca = match (&soft, &roce) {
                (Some(p), _) => verbs::open_ca(al.instance(), p, guid),
                (_, Some(p)) => verbs::open_ca(al.instance(), p, guid),
                _ => unreachable!("one provider"),
            }
            .map_err(al_err("open_ca"))?;
            ports.extend(
                cm::attach_ca_with(al.instance(), ca, drive).map_err(al_err("attach the CM"))?,
            );
            pds.push(verbs::alloc_pd(al.instance(), ca).map_err(al_err("alloc_pd"))?);
            cqs.push(
                verbs::create_cq(al.instance(), ca, 1024, None, None)
                    .map_err(al_err("create_cq"))?,
            );
            cas.push(ca);
        }
        let track = StdArc::new(Tracker::default());
        let (on_request, passive) = listen_handlers(al.instance(), &track);
        if udp {
            cep::ip::listen(
                al.instance(),
                cas[1],
                udp::listen_addr(),
                PortSpace::Tcp,
                on_request,
                passive,
            )
        } else {
            cm::listen(al.instance(), cas[1], 1, SERVICE_ID, on_request, passive)
        }
        .map_err(al_err("listen"))?;
        let net = match (soft, roce) {
            (Some(p), _) => Net::Soft(p),
            (_, Some(p)) => Net::Udp {
                _provider: p,
                cas: [cas[0], cas[1]],
            },
            _ => unreachable!("one provider"),
        };
        let mut bench = Bench {
            drive,
            al,
            net,
            pds: [pds[0], pds[1]],
            cqs: [cqs[0], cqs[1]],
            ports,
            track,
            idle_connections: 0,
        };
        bench.idle_connections = bench.live_connections();
        Ok(bench)
    }

    /// Datagrams dropped for want of a receive buffer: the soft fabric's
    /// count, or the RoCEv2 ports' `rx_no_receive` (QP1 included).
    fn dropped_no_recv(&self) -> u64 {
        match &self.net {
            Net::Soft(p) => p.fabric().stats().dropped_no_recv,
            Net::Udp { .. } => self.roce_ports_sum(|c| c.rx_no_receive),
        }
    }

    /// One counter of the RoCEv2 ports, summed over both (0 on the soft
    /// fabric).
    fn roce_ports_sum(&self, counter: fn(&ibal::roce::PortCounters) -> u64) -> u64 {
        let Net::Udp { cas, .. } = &self.net else {
            return 0;
        };
        cas.iter()
            .filter_map(|ca| {
                let ca = self.al.resolve(*ca).ok()?;
                match ca.device() {
                    hca::any::AnyDevice::Roce(d) => d.port_counters(1).map(|c| counter(&c)),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            })
            .sum()
    }

    /// Polled CM: serve both ports, then run the callbacks that produced.
    /// Threaded CM: nothing (the agent and executor threads do it).
    fn pump(&self) -> BenchResult<()> {
        if self.drive == CmDrive::Poll {
            for &port in &self.ports {
                cm::poll(&self.al, port).map_err(al_err("polling a CM port"))?;
            }
            self.al.run_callbacks();
        }
        Ok(())
    }

    /// Wait until `done` holds: on the condition variable (threaded), or
    /// pumping the CM on this thread (polled). Out of line so a profiler
    /// can collect exactly the timed windows (`connect` plus `wait`; see
    /// docs/benchmarks.md).
    #[inline(never)]
    fn wait(&self, what: &str, done: impl Fn(&TrackState) -> bool) -> BenchResult<()> {
        if self.drive == CmDrive::Thread {
            return self.track.wait(what, done);
        }
        let deadline = Instant::now() + WAIT;
        while !self.track.check(&done)? {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            self.pump()?;
        }
        Ok(())
    }

    fn live_connections(&self) -> usize {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok().map(|p| p.stats().live_connections))
            .sum()
    }

    fn mads_sent(&self) -> u64 {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok().map(|p| p.stats().mads_sent))
            .sum()
    }

    fn rc_qp(&self, side: usize) -> BenchResult<Handle<Qp>> {
        create_qp(
            self.al.instance(),
            self.pds[side],
            QpCreate {
                caps: QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                },
                ..QpCreate::new(QpType::Rc, self.cqs[side])
            },
        )
        .map_err(al_err("create_qp"))
    }

    /// A new slot; with `pair`, an active QP whose REQ the listener accepts
    /// on a passive QP reserved for it. Returns (slot, active QP).
    fn prepare(&self, qps: &mut Vec<Handle<Qp>>, pair: bool) -> BenchResult<(usize, Handle<Qp>)> {
        let active = self.rc_qp(0)?;
        qps.push(active);
        let slot = self.track.with(|s| {
            s.slots.push(Times::default());
            s.slots.len() - 1
        });
        if pair {
            let passive = self.rc_qp(1)?;
            qps.push(passive);
            let qpn = self
                .al
                .resolve(active)
                .map_err(al_err("resolving a QP"))?
                .qpn();
            self.track.with(|s| s.reserved.insert(qpn, (slot, passive)));
        }
        Ok((slot, active))
    }

    /// Stamp the start and send the REQ: for the listened service, or
    /// (`listened` false) for one nobody listens on (answered by a REJ).
    /// Over UDP an rdma_cm-style connect to the listen's address (the REQ
    /// is built before the start is stamped, as on the soft fabric).
    #[inline(never)]
    fn connect(&self, slot: usize, qp: Handle<Qp>, listened: bool) -> BenchResult<()> {
        let handler = active_handler(self.al.instance().clone(), self.track.clone(), slot);
        let req = match &self.net {
            Net::Soft(_) => ConnectRequest::new(
                if listened {
                    SERVICE_ID
                } else {
                    UNLISTENED_SERVICE_ID
                },
                devices::DEFAULT_LIDS[1],
            ),
            Net::Udp { .. } => {
                let qpn = self.al.resolve(qp).map_err(al_err("resolving a QP"))?.qpn();
                let to = if listened {
                    udp::listen_addr()
                } else {
                    udp::unlistened_addr()
                };
                IpConnect::new(to)
                    .to_request(udp::ADDRS[0], 1, qpn)
                    .map_err(al_err("building the REQ"))?
            }
        };
        self.track
            .with(|s| s.slots[slot].start = Some(Instant::now()));
        cm::connect(self.al.instance(), qp, &req, handler).map_err(al_err("connect"))?;
        Ok(())
    }

    fn times(&self, slot: usize) -> Times {
        self.track.with(|s| s.slots[slot])
    }

    /// Destroy `qps` (which tears their connections down) and wait until
    /// the agents hold nothing but the listen: no timewait timer or
    /// teardown MAD may land in the next timed window.
    fn teardown(&self, qps: &mut Vec<Handle<Qp>>) -> BenchResult<()> {
        for qp in qps.drain(..) {
            self.al
                .destroy_sync(qp)
                .map_err(al_err("destroying a QP"))?;
        }
        self.track.with(|s| {
            s.reserved.clear();
            s.passive.clear();
        });
        let deadline = Instant::now() + WAIT;
        while self.live_connections() > self.idle_connections {
            if Instant::now() > deadline {
                return Err("the CM agents did not release the connections".into());
            }
            self.pump()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn close(self) -> BenchResult<()> {
        let Bench { al, net, .. } = self;
        let stats = al.close().map_err(al_err("closing the AL"))?;
        drop(net);
        if stats.is_clean() {
            Ok(())
        } else {
            Err(format!("the AL closed with live objects: {stats}"))
        }
    }
}

// -------------------------------------------------------------------- run --

/// The floor and the thread echo, sampled in both phases.
struct Floor {
    mad: Vec<f64>,
    echo: Vec<f64>,
    /// The bare exchange ([`UdPair::bare_connect`]).
    bare: Vec<f64>,
    ping: mpsc::Sender<[u8; MAD_SIZE]>,
    pong: mpsc::Receiver<[u8; MAD_SIZE]>,
}

impl Floor {
    /// Empty samples and the echo thread (it ends when `ping` is dropped).
    fn start() -> BenchResult<(Floor, std::thread::JoinHandle<()>)> {
        let (ping_tx, ping_rx) = mpsc::channel::<[u8; MAD_SIZE]>();
        let (pong_tx, pong_rx) = mpsc::channel::<[u8; MAD_SIZE]>();
        let echo = std::thread::Builder::new()
            .name("ibal-perf-echo".into())
            .spawn(move || {
                while let Ok(m) = ping_rx.recv() {
                    if pong_tx.send(m).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| format!("spawning the echo thread: {e}"))?;
        let floor = Floor {
            mad: Vec::new(),
            echo: Vec::new(),
            bare: Vec::new(),
            ping: ping_tx,
            pong: pong_rx,
        };
        Ok((floor, echo))
    }

    fn echo_rtt(&self) -> BenchResult<Duration> {
        let t0 = Instant::now();
        self.ping
            .send([0x5a; MAD_SIZE])
            .map_err(|_| "echo thread gone".to_string())?;
        self.pong
            .recv()
            .map_err(|_| "echo thread gone".to_string())?;
        Ok(t0.elapsed())
    }
}

/// One drive mode: serial connects (with REJ probes, MAD floor and echo
/// samples interleaved), then the throughput batches, then close.
fn measure(cfg: &ConnRateConfig, drive: CmDrive, floor: &mut Floor) -> BenchResult<ModeFigures> {
    let bench = Bench::open(drive)?;
    let route = Route {
        lids: devices::DEFAULT_LIDS,
        gids: None,
        path_mtu: hca::provider::Mtu::Mtu4096,
    };
    let ud = UdPair::open(&bench, route)?;
    let mut wc = [Wc::default()];
    // Warm up the UD pair and check that the payload arrived whole.
    ud.round_trip(&bench.al, &mut wc)?;
    let got = ud.bufs[1].to_vec();
    if got[MAD_SIZE + GRH_SIZE..] != ud.bufs[0].to_vec()[..MAD_SIZE] {
        return Err("the UD SEND did not deliver its 256 bytes".into());
    }
    let figures = run_rounds(cfg, &bench, |bench, qps, n| {
        for _ in 0..n * MAD_RTTS_PER_CONNECTION {
            floor.mad.push(us(ud.round_trip(&bench.al, &mut wc)?));
        }
        for _ in 0..n {
            floor.echo.push(us(floor.echo_rtt()?));
        }
        ud.sample_bare(bench, qps, n, &mut floor.bare)?;
        Ok(())
    })?;
    drop(ud);
    bench.close()?;
    Ok(figures)
}

/// The rounds of one drive mode on an open bench: serial connects, each
/// round followed by as many REQ -> REJ probes and then `per_round(bench,
/// qps, n)` (the run's floor samples for `n` connections; QPs it creates go
/// into `qps`, destroyed at the round's teardown), then the throughput
/// batches. The bench stays open.
fn run_rounds(
    cfg: &ConnRateConfig,
    bench: &Bench,
    mut per_round: impl FnMut(&Bench, &mut Vec<Handle<Qp>>, usize) -> BenchResult<()>,
) -> BenchResult<ModeFigures> {
    let drive = bench.drive;
    let mads_before = bench.mads_sent();
    let drops = || bench.dropped_no_recv();
    let drops_before = drops();
    let mut drops_timed = 0;

    // Serial rounds, interleaving the contenders.
    let (mut connect, mut rej) = (vec![], vec![]);
    let mut legs: [Vec<f64>; 4] = Default::default();
    let mut qps = Vec::new();
    let mut done = 0;
    while done < cfg.connections {
        let n = ROUND.min(cfg.connections - done);
        let mut pairs = Vec::with_capacity(n);
        let mut probes = Vec::with_capacity(n);
        for _ in 0..n {
            pairs.push(bench.prepare(&mut qps, true)?);
            probes.push(bench.prepare(&mut qps, false)?);
        }
        for &(slot, qp) in &pairs {
            let d0 = drops();
            bench.connect(slot, qp, true)?;
            bench.wait("both sides ESTABLISHED", |s| {
                s.slots[slot].established().is_some()
            })?;
            drops_timed += drops() - d0;
            let t = bench.times(slot);
            let (Some(start), Some(req), Some(rep), Some(a), Some(b)) = (
                t.start,
                t.request,
                t.reply,
                t.active_established,
                t.passive_established,
            ) else {
                return Err(format!("connection {slot}: a callback left no time"));
            };
            connect.push(us(a.max(b) - start));
            legs[0].push(us(req.saturating_duration_since(start)));
            legs[1].push(us(rep.saturating_duration_since(req)));
            legs[2].push(us(b.saturating_duration_since(rep)));
            legs[3].push(us(a.saturating_duration_since(rep)));
        }
        for &(slot, qp) in &probes {
            bench.connect(slot, qp, false)?;
            bench.wait("the REJ", |s| s.slots[slot].rejected.is_some())?;
            let t = bench.times(slot);
            match (t.start, t.rejected) {
                (Some(s), Some(r)) => rej.push(us(r - s)),
                _ => return Err(format!("probe {slot}: a callback left no time")),
            }
        }
        per_round(bench, &mut qps, n)?;
        bench.teardown(&mut qps)?;
        done += n;
    }

    // Throughput.
    let mut total = Duration::ZERO;
    let mut best = Duration::MAX;
    for _ in 0..cfg.batches {
        let mut batch = Vec::with_capacity(cfg.in_flight);
        for _ in 0..cfg.in_flight {
            batch.push(bench.prepare(&mut qps, true)?);
        }
        let target = bench.track.with(|s| s.completed) + cfg.in_flight;
        let d0 = drops();
        let t0 = Instant::now();
        for &(slot, qp) in &batch {
            bench.connect(slot, qp, true)?;
        }
        bench.wait("a batch ESTABLISHED", |s| s.completed >= target)?;
        drops_timed += drops() - d0;
        let last = batch
            .iter()
            .filter_map(|&(slot, _)| bench.times(slot).established())
            .max()
            .ok_or("a batch with no connection")?;
        let t = last - t0;
        total += t;
        best = best.min(t);
        bench.teardown(&mut qps)?;
    }

    let cm_mads_sent = bench.mads_sent() - mads_before;
    let dropped_no_recv = drops() - drops_before;
    let k = (cfg.batches * cfg.in_flight) as f64;
    let [l0, l1, l2, l3] = legs;
    Ok(ModeFigures {
        drive,
        connect: Dist::of(connect),
        legs: [
            (
                "req_to_listener: connect (REQ) -> listener callback",
                Dist::of(l0).median_us,
            ),
            (
                "listener_to_reply: accept (REP) -> active ReplyReceived callback",
                Dist::of(l1).median_us,
            ),
            (
                "reply_to_passive_established: rtu (RTU) -> passive Established",
                Dist::of(l2).median_us,
            ),
            (
                "reply_to_active_established: rtu -> active Established (local event)",
                Dist::of(l3).median_us,
            ),
        ],
        conns_per_sec: k / total.as_secs_f64().max(1e-12),
        best_batch_conns_per_sec: cfg.in_flight as f64 / best.as_secs_f64().max(1e-12),
        rej_rtt: Dist::of(rej),
        cm_mads_sent,
        dropped_no_recv,
        dropped_no_recv_timed: drops_timed,
    })
}

/// Run conn-rate: the polled CM, then the threaded CM, each on its own
/// fresh fabric, with the floor sampled in both.
pub fn run(cfg: &ConnRateConfig) -> BenchResult<ConnRateReport> {
    cfg.validate()?;
    let (mut floor, echo) = Floor::start()?;
    let polled = if cfg.modes.polled() {
        Some(measure(cfg, CmDrive::Poll, &mut floor)?)
    } else {
        None
    };
    let threaded = if cfg.modes.threaded() {
        Some(measure(cfg, CmDrive::Thread, &mut floor)?)
    } else {
        None
    };
    let Floor {
        mad,
        echo: echo_v,
        bare,
        ping,
        ..
    } = floor;
    drop(ping);
    echo.join()
        .map_err(|_| "the echo thread panicked".to_string())?;
    Ok(ConnRateReport {
        config: cfg.clone(),
        threaded,
        polled,
        mad_rtt: Dist::of(mad),
        thread_echo_rtt: Dist::of(echo_v),
        bare_exchange: Dist::of(bare),
    })
}

#[cfg(test)]
mod tests {
    use super::super::balanced;
    use super::*;

    #[test]
    fn a_tiny_run_connects_everything_and_reports_the_floor() {
        let cfg = ConnRateConfig {
            connections: 6,
            in_flight: 3,
            batches: 2,
            modes: ConnModes::Both,
        };
        let r = run(&cfg).unwrap();
        assert_eq!(r.mad_rtt.n, 2 * 6 * MAD_RTTS_PER_CONNECTION);
        assert!(r.mad_rtt.median_us > 0.0);
        // One bare exchange per serial connection, in both modes; it sends
        // three MADs, so it cannot beat one round trip.
        assert_eq!(r.bare_exchange.n, 2 * 6);
        assert!(r.bare_exchange.median_us > r.mad_rtt.median_us);
        let (polled, threaded) = (r.polled.as_ref().unwrap(), r.threaded.as_ref().unwrap());
        for m in [polled, threaded] {
            assert_eq!(m.connect.n, 6);
            assert_eq!(m.rej_rtt.n, 6);
            assert!(m.connect.median_us > 0.0 && m.connect.p99_us >= m.connect.median_us);
            assert!(m.conns_per_sec > 0.0);
            // REQ, REP, RTU per connection at least, a REQ per probe.
            assert!(m.cm_mads_sent >= 3 * (6 + 6) + 6, "{}", m.cm_mads_sent);
        }
        assert_eq!(polled.drive, CmDrive::Poll);
        assert_eq!(threaded.drive, CmDrive::Thread);
        let json = r.to_json();
        assert!(json.starts_with('{') && json.ends_with('}') && balanced(&json));
        for key in [
            "\"connect_median_us\":",
            "\"connect_p99_us\":",
            "\"mad_rtt_median_us\":",
            "\"ratio_connect_vs_mad_rtt\":",
            "\"ratio_threaded_connect_vs_mad_rtt\":",
            "\"polled_conns_per_sec\":",
            "\"threaded_conns_per_sec\":",
            "\"threaded_connect_median_us\":",
            "\"polled_legs_median_us\":{\"req_to_listener\":",
            "\"bare_exchange_median_us\":",
            "\"ratio_bare_exchange_vs_mad_rtt\":",
        ] {
            assert!(json.contains(key), "{key} missing from {json}");
        }
        assert!(r
            .to_text()
            .contains("median polled connect / MAD round trip"));
    }

    #[test]
    fn one_mode_alone_is_measured_and_reported() {
        let cfg = ConnRateConfig {
            connections: 3,
            in_flight: 2,
            batches: 1,
            modes: ConnModes::Polled,
        };
        let r = run(&cfg).unwrap();
        assert!(r.threaded.is_none());
        assert_eq!(r.polled.as_ref().unwrap().connect.n, 3);
        assert_eq!(r.mad_rtt.n, 3 * MAD_RTTS_PER_CONNECTION);
        assert!(r.ratio() > 0.0 && r.ratio_threaded().is_nan());
        let json = r.to_json();
        assert!(json.starts_with('{') && json.ends_with('}') && balanced(&json));
        assert!(json.contains("\"polled_conns_per_sec\":"));
        assert!(json.contains("\"ratio_threaded_connect_vs_mad_rtt\":null"));
        assert!(!json.contains("\"threaded_conns_per_sec\""));
        assert!(!r.to_text().contains("threaded CM"));

        let r = run(&ConnRateConfig {
            modes: ConnModes::Threaded,
            ..cfg
        })
        .unwrap();
        assert!(r.polled.is_none() && !r.target_met());
        let json = r.to_json();
        assert!(json.contains("\"connect_median_us\":null") && balanced(&json));
        assert!(json.contains("\"threaded_conns_per_sec\":"));
        assert!(r.to_text().contains("was not measured"));
    }

    #[test]
    fn bad_settings_are_refused() {
        for cfg in [
            ConnRateConfig {
                connections: 0,
                ..ConnRateConfig::default()
            },
            ConnRateConfig {
                in_flight: 0,
                ..ConnRateConfig::default()
            },
            ConnRateConfig {
                batches: 0,
                ..ConnRateConfig::default()
            },
        ] {
            assert!(run(&cfg).is_err());
        }
    }
}
