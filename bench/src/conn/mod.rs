//! `ibal perf conn-rate`: how fast the connection manager connects two RC
//! QPs on the embedded in-process fabric, against the round trip of one
//! 256-byte MAD through the same fabric, measured in the same run.
//!
//! One AL instance on [`ibal_testkit::devices::default_provider`] (two soft HCAs,
//! LIDs 1 and 2); both CAs opened with the CM attached to their port
//! ([`cm::attach_ca`](cep::cm::attach_ca): one CM agent thread per port, on QP1); a listen on
//! HCA 1 whose request callback accepts ([`cm::accept`](cep::cm::accept)) on the passive QP
//! reserved for the requesting active QP; the active handler answers the
//! REP with [`cm::rtu`](cep::cm::rtu). Every CM message is a real 256-byte MAD on QP1.
//!
//! # Serial connect latency
//!
//! `connections` connections, one at a time, each on a fresh RC QP pair
//! (created before the timed window). The time runs from just before
//! [`cm::connect`](cep::cm::connect) to the later of the two `Established` events, each
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
//! from [`verbs::create_av`](hca::verbs::create_av)). One round trip, all on the calling thread:
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
//!
//! By job: `config` the settings and constants, `tracker` the callbacks'
//! time stamps, `bench` one AL with the two CAs and their QPs, `rounds`
//! the timed rounds and the floor sampled inside them, `bare` the bare
//! exchange, `report` the figures as a table or JSON; [`udp`] the same
//! between two RoCEv2 ports (`roce_ports`). This file runs the soft
//! fabric's measurement.

use cep::cm::CmDrive;

mod bare;
mod bench;
mod config;
mod report;
mod roce_ports;
mod rounds;
mod tracker;
/// `perf conn-rate --transport udp`: the same measurement between two
/// RoCEv2 ports on real UDP sockets.
pub mod udp;

pub use super::BenchResult;
pub use config::{
    ConnModes, ConnRateConfig, KRCORE_CONNECT_US, MAD_SIZE, SERVICE_ID, TARGET_RATIO,
    UNLISTENED_SERVICE_ID,
};
pub use report::{ConnRateReport, Dist, ModeFigures};

use rounds::{measure, Floor};

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
    use super::config::MAD_RTTS_PER_CONNECTION;
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
