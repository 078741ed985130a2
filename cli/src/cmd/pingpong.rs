//! `ibal pingpong`: the main job on the embedded fabric (`--loopback`, the
//! default), or between two processes over RoCEv2 (`--listen` /
//! `--connect`, or on an RDMA device with `--device`).

use super::parse::{mtu_of, parse_hex_u64, parse_ip_port};

// `ibal pingpong`'s flags (the doc comment on `Command::Pingpong` is its help).
#[derive(clap::Args)]
pub struct PingpongArgs {
    /// Run on the embedded in-process fabric: the default, when neither
    /// `--listen`, `--connect` nor `--device` is given.
    #[arg(long, default_value_t = true)]
    loopback: bool,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    iterations: u32,
    /// Bytes written each way per round trip.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Print one JSON object instead of the step list.
    #[arg(long)]
    json: bool,
    /// Write every datagram the fabric carries (the CM's MADs) to this
    /// file as InfiniBand packets (ERF records; `tshark -r FILE` decodes them).
    #[arg(long, value_name = "FILE")]
    capture: Option<std::path::PathBuf>,
    /// Over RoCEv2 between processes: wait for `--connect` peers on this
    /// address (IP[:PORT], rdma_cm port 7471 by default); our RoCEv2
    /// port binds IP.
    #[arg(long, value_name = "IP[:PORT]", conflicts_with_all = ["connect", "capture"])]
    listen: Option<String>,
    /// Over RoCEv2: connect to a `--listen` peer (IP[:PORT]).
    #[arg(long, value_name = "IP[:PORT]", conflicts_with = "capture")]
    connect: Option<String>,
    /// Our RoCEv2 port's address when connecting [default: the kernel's
    /// route source; on loopback the next 127.x address].
    #[arg(long, value_name = "IP")]
    local: Option<std::net::IpAddr>,
    /// UDP port our RoCEv2 port binds.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    #[arg(long, default_value_t = 4791)]
    peer_udp_port: u16,
    /// Path MTU over RoCEv2 (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Connections a listener serves before it exits.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Seconds to wait for the peer at any step.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Keep each connection up this many seconds after the ping-pong:
    /// the connecting side before it sends its DREQ, the listener
    /// before it answers the peer's DREQ (tests kill a peer there).
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    hold: f64,
    /// Node GUID of our RoCEv2 device, hex [default: derived from the
    /// process id]. With --first-qpn, a process started again with the
    /// same values looks like a restarted NIC (stale-connection tests).
    #[arg(long, value_name = "HEX", value_parser = parse_hex_u64)]
    guid: Option<u64>,
    /// QP number of our device's first QP [default: random].
    #[arg(long, value_name = "QPN")]
    first_qpn: Option<u32>,
    /// Our RoCEv2 device's `max_qp` [default: 1048576; at most 16777214].
    #[arg(long, value_name = "N")]
    max_qp: Option<u32>,
    /// With --listen/--connect: run on this RDMA device (`rxe0`,
    /// `mlx5_0`), connected through librdmacm, instead of our RoCEv2
    /// port (needs a build with the rdma feature).
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// With --listen/--connect over RoCEv2: print a snapshot of our
    /// objects (kind, handle, parent, references, QP and CM state) on
    /// stderr every SECS seconds, like `rdma res show`; with --json as
    /// JSON lines. With or without it, SIGUSR1 prints one at once.
    #[arg(long, value_name = "SECS")]
    status: Option<f64>,
}

impl PingpongArgs {
    /// Runs the loopback job, or the IP job when `--listen`, `--connect` or
    /// `--device` is given.
    pub fn run(self) -> Result<(), String> {
        let PingpongArgs {
            loopback,
            iterations,
            size,
            json,
            capture,
            listen,
            connect,
            local,
            udp_port,
            peer_udp_port,
            mtu,
            count,
            timeout,
            hold,
            guid,
            first_qpn,
            max_qp,
            device,
            status,
        } = self;
        let status_cfg = ibal_cli::status::StatusConfig::from_flags(status, json)?;
        if status.is_some() && (device.is_some() || (listen.is_none() && connect.is_none())) {
            return Err("--status runs with --listen/--connect over our RoCEv2 port".to_string());
        }
        if max_qp.is_some() && (device.is_some() || (listen.is_none() && connect.is_none())) {
            return Err(
                "--max-qp sets our RoCEv2 device's limit (--listen/--connect); an RDMA \
                 device's limits are its own, and --loopback runs on the soft fabric"
                    .to_string(),
            );
        }
        if listen.is_none() && connect.is_none() && device.is_none() {
            return pingpong(loopback, iterations, size, json, capture);
        }
        use ibal_cli::pingpong_ip::{IpPingPongConfig, Role, DEFAULT_PORT};
        let role = match (listen, connect) {
            (Some(l), _) => Role::Listen(parse_ip_port(&l, DEFAULT_PORT)?),
            (None, Some(c)) => Role::Connect(parse_ip_port(&c, DEFAULT_PORT)?),
            (None, None) => {
                return Err(
                    "--device runs between two processes: give --listen or --connect".to_string(),
                )
            }
        };
        let mut cfg = IpPingPongConfig::new(role);
        cfg.local = local;
        cfg.udp_port = udp_port;
        cfg.peer_udp_port = peer_udp_port;
        cfg.mtu = mtu_of(mtu)?;
        cfg.count = count;
        cfg.timeout = std::time::Duration::from_secs(timeout.max(1));
        if !(0.0..=3600.0).contains(&hold) {
            return Err("--hold must be between 0 and 3600 seconds".to_string());
        }
        cfg.hold = std::time::Duration::from_secs_f64(hold);
        cfg.guid = guid;
        cfg.first_qpn = first_qpn;
        cfg.max_qp = max_qp;
        cfg.device = device;
        cfg.status = Some(status_cfg);
        cfg.iterations = iterations;
        cfg.size = size;
        let report = ibal_cli::pingpong_ip::run(&cfg)?;
        if json {
            out!("{}", report.to_json());
        } else {
            print!("{}", report.to_text());
        }
        Ok(())
    }
}

fn pingpong(
    loopback: bool,
    iterations: u32,
    size: usize,
    json: bool,
    capture: Option<std::path::PathBuf>,
) -> Result<(), String> {
    if !loopback {
        return Err("only --loopback (the embedded in-process fabric) is available".into());
    }
    let report = ibal_cli::pingpong::run(&ibal_cli::pingpong::PingPongConfig {
        iterations,
        size,
        capture,
    })?;
    if json {
        out!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
        out!("\n`ibal overview` describes this build; `ibal --help` lists every command.");
    }
    Ok(())
}
