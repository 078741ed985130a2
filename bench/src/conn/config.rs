//! What a `perf conn-rate` run is told, and the constants of the
//! measurement.

use std::time::Duration;

use crate::BenchResult;

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
pub(super) const GRH_SIZE: usize = 40;
/// Serial connections (and REJ probes) per round; between rounds the run
/// waits for the agents to go quiet.
pub(super) const ROUND: usize = 100;
/// UD round trips per serial connection (all timed individually).
pub(super) const MAD_RTTS_PER_CONNECTION: usize = 20;
/// How long any wait may take before the run fails.
pub(super) const WAIT: Duration = Duration::from_secs(30);

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
    pub(super) fn polled(self) -> bool {
        self != ConnModes::Threaded
    }
    pub(super) fn threaded(self) -> bool {
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
    pub(super) fn validate(&self) -> BenchResult<()> {
        if self.connections == 0 || self.in_flight == 0 || self.batches == 0 {
            return Err("--connections, --in-flight and --batches must be at least 1".into());
        }
        if self.connections > 100_000 || self.in_flight > 4096 {
            return Err("--connections is at most 100000 and --in-flight at most 4096".into());
        }
        Ok(())
    }
}
