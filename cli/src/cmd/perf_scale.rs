//! `ibal perf scale` and its hidden listener process.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ibal_bench::scale::{ScaleConfig, ScaleTransport};

use super::print_report;

/// Which provider carries the connections.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Two soft HCAs on the in-process fabric.
    Soft,
    /// RoCEv2 over loopback UDP.
    Udp,
}

/// `ibal perf scale`'s flags.
#[derive(clap::Args)]
pub struct ScaleArgs {
    /// `soft`: two soft HCAs in this process. `udp`: RoCEv2 on 127.0.0.1
    /// (active) and 127.0.0.2 (listener) over loopback UDP.
    #[arg(long, value_enum, default_value_t = Transport::Soft)]
    transport: Transport,
    /// Connections established and held.
    #[arg(long, default_value_t = 10_000)]
    connections: u32,
    /// 1: both ends here; 2: the listener as a second ibal process (udp).
    #[arg(long, default_value_t = 1)]
    processes: u8,
    /// Connects outstanding at once.
    #[arg(long, default_value_t = 256)]
    in_flight: u32,
    /// Round trips of each 64-byte ping-pong.
    #[arg(long, default_value_t = 2_000)]
    ping_iters: u32,
    /// Seconds the idle CPU is measured over, everything held.
    #[arg(long, default_value_t = 2.0)]
    idle_secs: f64,
    /// With --processes 2: kill -9 the listener with everything held, then
    /// post a SEND on every connection; each must end with an error.
    #[arg(long)]
    kill_listener: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// `ibal perf scale-listener`'s flags (set by `perf scale`).
#[derive(clap::Args)]
pub struct ListenerArgs {
    /// The local address of the listener's RoCEv2 port.
    #[arg(long)]
    bind: IpAddr,
    /// Where the active end's RoCEv2 port is.
    #[arg(long)]
    peer: SocketAddr,
    /// Connections the run holds (sizes the device's limits).
    #[arg(long)]
    connections: u32,
}

pub fn run(a: ScaleArgs) -> Result<(), String> {
    if !(a.idle_secs.is_finite() && (0.1..=600.0).contains(&a.idle_secs)) {
        return Err("--idle-secs is between 0.1 and 600".into());
    }
    let cfg = ScaleConfig {
        transport: match a.transport {
            Transport::Soft => ScaleTransport::Soft,
            Transport::Udp => ScaleTransport::Udp,
        },
        connections: a.connections,
        processes: a.processes,
        in_flight: a.in_flight,
        ping_iters: a.ping_iters,
        idle: Duration::from_secs_f64(a.idle_secs),
        kill_listener: a.kill_listener,
    };
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let report = ibal_bench::scale::run_scale(&cfg, Some(&exe))?;
    print_report(a.json, report.to_json(), report.to_text() + "\n");
    if report.clean() {
        Ok(())
    } else {
        Err("the run ended with errors or live objects (see above)".into())
    }
}

pub fn listener(a: ListenerArgs) -> Result<(), String> {
    let stdin = std::io::stdin().lock();
    ibal_bench::scale::run_listener(a.bind, a.peer, a.connections, stdin, std::io::stdout())
}
