//! `ibal rping`: librdmacm's rping exchange over our RoCEv2 port.

// `ibal rping`'s flags (rping's own letters).
#[derive(clap::Args)]
pub struct RpingArgs {
    /// Server side.
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Client side.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's (our RoCEv2 port's, as server).
    #[arg(short = 'a', value_name = "ADDR")]
    addr: std::net::IpAddr,
    /// rdma_cm port.
    #[arg(short = 'p', default_value_t = ibal_cli::rping::DEFAULT_PORT)]
    port: u16,
    /// Client: our RoCEv2 port's address [default: the route's source;
    /// on loopback the next 127.x address].
    #[arg(short = 'I', value_name = "ADDR")]
    source: Option<std::net::IpAddr>,
    /// Pings (client).
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Ping data size (client).
    #[arg(short = 'S', default_value_t = 64)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Check the data that came back (client).
    #[arg(short = 'V')]
    validate: bool,
    /// UDP port our RoCEv2 port binds.
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// UDP port of the peer's RoCEv2 port.
    #[arg(long, default_value_t = 4791)]
    peer_udp_port: u16,
    /// Seconds to wait for the peer at any step.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Our RoCEv2 device's `max_qp` [default: 1048576; at most 16777214].
    #[arg(long, value_name = "N")]
    max_qp: Option<u32>,
    /// Print a snapshot of our objects (kind, handle, parent, references,
    /// QP and CM state) on stderr every SECS seconds, like `rdma res show`.
    /// With or without it, SIGUSR1 prints one at once.
    #[arg(long, value_name = "SECS")]
    status: Option<f64>,
    /// --status and SIGUSR1 print JSON lines.
    #[arg(long)]
    json: bool,
}

impl RpingArgs {
    /// Runs the server or the client and prints rping's lines.
    pub fn run(self) -> Result<(), String> {
        let RpingArgs {
            server,
            client: _,
            addr,
            port,
            source,
            count,
            size,
            verbose,
            validate,
            udp_port,
            peer_udp_port,
            timeout,
            max_qp,
            status,
            json,
        } = self;
        let mut cfg = ibal_cli::rping::RpingConfig::new(server, addr);
        cfg.port = port;
        cfg.local = source;
        cfg.count = count;
        cfg.size = size;
        cfg.verbose = verbose;
        cfg.validate = validate;
        cfg.udp_port = udp_port;
        cfg.peer_udp_port = peer_udp_port;
        cfg.max_qp = max_qp;
        cfg.status = Some(ibal_cli::status::StatusConfig::from_flags(status, json)?);
        cfg.timeout = std::time::Duration::from_secs(timeout.max(1));
        ibal_cli::rping::run(&cfg, &mut |line| out!("{line}")).map(|r| {
            if !verbose {
                out!(
                    "{} pings {} {}",
                    r.pings,
                    if server { "served for" } else { "to" },
                    r.peer
                );
            }
        })
    }
}
