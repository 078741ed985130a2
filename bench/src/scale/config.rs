//! What `ibal perf scale` is asked to do.

use std::time::Duration;

/// Which provider carries the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleTransport {
    /// Two soft HCAs of the embedded fabric (one process only).
    Soft,
    /// RoCEv2 over UDP on loopback: 127.0.0.1 (active) and 127.0.0.2
    /// (listener).
    Udp,
}

/// The settings of one `perf scale` run.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Which provider.
    pub transport: ScaleTransport,
    /// Connections established and held (the ping-pong's one included).
    pub connections: u32,
    /// 1: both ends in this process; 2: the listener runs as a second
    /// `ibal` process (RoCEv2 only).
    pub processes: u8,
    /// Connects outstanding at once.
    pub in_flight: u32,
    /// Round trips of each 64-byte ping-pong.
    pub ping_iters: u32,
    /// How long the idle CPU is measured with every connection held.
    pub idle: Duration,
    /// Two processes: instead of disconnecting, kill -9 the listener and
    /// post one SEND on every connection; each must end with an error
    /// within the transport's retry bound.
    pub kill_listener: bool,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        ScaleConfig {
            transport: ScaleTransport::Soft,
            connections: 10_000,
            processes: 1,
            in_flight: 256,
            ping_iters: 2_000,
            idle: Duration::from_secs(2),
            kill_listener: false,
        }
    }
}

impl ScaleConfig {
    /// Refuses settings the run cannot honour.
    pub fn check(&self) -> Result<(), String> {
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if self.connections > MAX_CONNECTIONS {
            return Err(format!(
                "--connections {} is more than {MAX_CONNECTIONS} (each end needs a QP; QP numbers are 24 bits)",
                self.connections
            ));
        }
        if self.in_flight == 0 {
            return Err("--in-flight must be at least 1".into());
        }
        if !matches!(self.processes, 1 | 2) {
            return Err("--processes is 1 or 2".into());
        }
        if self.processes == 2 && self.transport == ScaleTransport::Soft {
            return Err(
                "the soft fabric lives in one process: --processes 2 needs --transport udp".into(),
            );
        }
        if self.kill_listener && self.processes != 2 {
            return Err("--kill-listener needs --processes 2".into());
        }
        if self.ping_iters == 0 {
            return Err("--ping-iters must be at least 1".into());
        }
        Ok(())
    }
}

/// Most connections one run holds: a device's QPs less its special QPs
/// and some head room for the CM's own.
pub const MAX_CONNECTIONS: u32 = (1 << 24) - 64;

/// Service id of the listen on the soft fabric.
pub(crate) const SERVICE_ID: u64 = 0x0000_5ca1_e000_0001;

/// The rdma_cm port the listener listens on over RoCEv2.
pub(crate) const LISTEN_PORT: u16 = 7480;

/// QP queue depth of every connection (the "4-deep queues").
pub(crate) const QUEUE_DEPTH: u32 = 4;

/// Bytes of one ping-pong message.
pub(crate) const MSG: usize = 64;

/// Longest any one wait of the run may take before it is an error.
pub(crate) const WAIT: Duration = Duration::from_secs(120);
