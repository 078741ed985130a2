//! `ibal qp-exchange`: a ping-pong with another process (or an ibv tool)
//! over our RoCEv2 port, QP addresses over the tools' TCP side channel.

use super::parse::{mtu_of, parse_size};
use super::print_report;

// `ibal qp-exchange`'s flags.
#[derive(clap::Args)]
pub struct QpExchangeArgs {
    /// Wait for the peer on this TCP address ([IP:]PORT; IP defaults to
    /// 0.0.0.0; a bare --listen means port 18515).
    #[arg(
            long,
            value_name = "[IP:]PORT",
            num_args = 0..=1,
            default_missing_value = "18515",
            conflicts_with = "connect",
            required_unless_present = "connect"
        )]
    listen: Option<String>,
    /// Connect to the peer's TCP side channel (HOST[:PORT], port 18515 by default).
    #[arg(long, value_name = "HOST[:PORT]")]
    connect: Option<String>,
    /// IP address of our RoCEv2 port (our GID); must be an address of this host.
    #[arg(long, value_name = "IP")]
    local: std::net::IpAddr,
    /// UDP port our RoCEv2 port binds.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// UDP port the peer's RoCEv2 port listens on.
    #[arg(long, default_value_t = 4791)]
    peer_udp_port: u16,
    /// Transport: rc or ud.
    #[arg(long, value_enum, default_value_t = QpxMode::Rc)]
    mode: QpxMode,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    iters: u32,
    /// Message size [default: 4096 for rc, 1024 for ud].
    #[arg(long)]
    size: Option<usize>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Receives kept posted.
    #[arg(long, default_value_t = 500)]
    rx_depth: u32,
    /// The GID index we report as ours (informational; our only GID is index 0).
    #[arg(long, default_value_t = 0)]
    gid_index: i32,
    /// An RDMA WRITE before each SEND, checked by the peer (both sides ibal, both with --write).
    #[arg(long)]
    write: bool,
    /// Behave like ibv_rc_pingpong/ibv_ud_pingpong (no extension, echo what
    /// arrives, no checks): lets tests play a plain tool's part.
    #[arg(long, hide = true)]
    plain: bool,
    /// Bound in seconds on every wait (connect, accept, reads, completions).
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// RC local ACK timeout attribute: 4.096 us * 2^N (14, the tools'
    /// value, is about 67 ms); must exceed the path's longest delay.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    ack_timeout: u8,
    /// RC transport retries before a SEND fails with RETRY_EXC.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    retry_cnt: u8,
    /// Instead of the ping-pong: the client RDMA WRITEs SIZE bytes into the
    /// server's buffer and RDMA READs SIZE bytes back, both checked (RC; the
    /// peer is another ibal with the same flag or .ci/rxe-peer/rdma_peer).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    rdma_bulk: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `qp-exchange --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QpxMode {
    Rc,
    Ud,
}

impl QpExchangeArgs {
    /// Runs one exchange and prints its report (or, with `--json`, the
    /// failure as JSON too).
    pub fn run(self) -> Result<(), String> {
        let QpExchangeArgs {
            listen,
            connect,
            local,
            udp_port,
            peer_udp_port,
            mode,
            iters,
            size,
            mtu,
            rx_depth,
            gid_index,
            write,
            plain,
            timeout,
            ack_timeout,
            retry_cnt,
            rdma_bulk,
            json,
        } = self;
        qp_exchange(
            listen,
            connect,
            ibal_cli::qp_exchange::QpxConfig {
                role: ibal_cli::qp_exchange::Role::Listen(
                    "0.0.0.0:18515".parse().expect("literal"),
                ),
                local,
                udp_port,
                peer_udp_port,
                ud: mode == QpxMode::Ud,
                iters,
                size: size.unwrap_or(if mode == QpxMode::Ud { 1024 } else { 4096 }),
                mtu: mtu_of(mtu)?,
                rx_depth,
                gid_index,
                write,
                plain,
                timeout: std::time::Duration::from_secs_f64(timeout.clamp(0.1, 3600.0)),
                ack_timeout,
                retry_cnt,
                bulk: rdma_bulk,
            },
            json,
        )
    }
}

/// The default TCP port of the ibv ping-pong tools' side channel.
const OOB_PORT: u16 = 18515;

fn qp_exchange(
    listen: Option<String>,
    connect: Option<String>,
    mut cfg: ibal_cli::qp_exchange::QpxConfig,
    json: bool,
) -> Result<(), String> {
    use ibal_cli::qp_exchange::Role;
    cfg.role = match (listen, connect) {
        (Some(l), None) => {
            let addr = if let Ok(port) = l.parse::<u16>() {
                std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port)
            } else {
                l.parse()
                    .map_err(|_| format!("--listen {l:?}: expected PORT or IP:PORT"))?
            };
            Role::Listen(addr)
        }
        (None, Some(c)) => {
            if let Ok(a) = c.parse::<std::net::SocketAddr>() {
                Role::Connect(a.ip().to_string(), a.port())
            } else if let Ok(ip) = c.parse::<std::net::IpAddr>() {
                Role::Connect(ip.to_string(), OOB_PORT)
            } else {
                match c.rsplit_once(':') {
                    Some((h, p)) => Role::Connect(
                        h.to_string(),
                        p.parse()
                            .map_err(|_| format!("--connect {c:?}: bad port {p:?}"))?,
                    ),
                    None => Role::Connect(c, OOB_PORT),
                }
            }
        }
        _ => return Err("give exactly one of --listen and --connect".into()),
    };
    match ibal_cli::qp_exchange::run(&cfg) {
        Ok(report) => {
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        Err(failure) => {
            if json {
                out!("{}", failure.to_json());
            }
            Err(failure.to_string())
        }
    }
}
