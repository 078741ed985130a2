//! The `ibal` command-line tool.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` for the command's output, except that a closed stdout (the
/// reader went away: `ibal perf lookup --json | head -c 100`) ends the
/// command quietly instead of panicking, as command-line tools do.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("ibal: cannot write the output: {e}");
            std::process::exit(1);
        }
    }};
}

#[derive(Parser)]
#[command(
    name = "ibal",
    version,
    about = "InfiniBand Access Layer in Rust: tools, demos and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The main job (the default): two soft HCAs, a connection through the
    /// CM, an RDMA WRITE + SEND ping-pong, disconnect, destroy, leak check.
    Pingpong {
        /// Run on the embedded in-process fabric (the only mode today).
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
        /// With --listen/--connect: run on this RDMA device (`rxe0`,
        /// `mlx5_0`), connected through librdmacm, instead of our RoCEv2
        /// port (needs a build with the rdma feature).
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
    },
    /// Print what this build contains and run a quick self-check.
    Overview,
    /// A UDP relay between two RoCEv2 ports that drops, duplicates,
    /// reorders and delays datagrams (the fault tests' network). A sends to
    /// NEAR_A, B to NEAR_B; each datagram is re-signed for its new flow.
    /// librdmacm's rping over RoCEv2 (same flags as rping): as client it
    /// pings `rping -s` (Linux or ibal), as server it answers `rping -c`.
    #[command(disable_version_flag = true)]
    Rping {
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
    },
    Relay {
        /// Where A sends (tell A that B's GID is here): B's IP address with
        /// another UDP port, since a connected QP takes packets only from
        /// its peer's address.
        #[arg(long, value_name = "IP:PORT")]
        near_a: std::net::SocketAddr,
        /// Where B sends: A's IP address with another UDP port.
        #[arg(long, value_name = "IP:PORT")]
        near_b: std::net::SocketAddr,
        /// A's RoCEv2 port.
        #[arg(long, value_name = "IP:PORT")]
        a: std::net::SocketAddr,
        /// B's RoCEv2 port.
        #[arg(long, value_name = "IP:PORT")]
        b: std::net::SocketAddr,
        /// Probability of each fault (drop, duplicate, reorder, delay).
        #[arg(long, default_value_t = 0.0)]
        faults: f64,
        /// Probability of a drop [default: --faults].
        #[arg(long)]
        drop: Option<f64>,
        /// Probability of a duplicate [default: --faults].
        #[arg(long)]
        dup: Option<f64>,
        /// Probability of holding a datagram behind the next one [default: --faults].
        #[arg(long)]
        reorder: Option<f64>,
        /// Probability of a delay (up to --max-delay-us) [default: --faults].
        #[arg(long)]
        delay: Option<f64>,
        /// Also stop once no datagram has arrived for this many seconds
        /// after the first one (0: only --seconds).
        #[arg(long, default_value_t = 0.0)]
        idle_exit: f64,
        /// Longest delay, microseconds.
        #[arg(long, default_value_t = 2000)]
        max_delay_us: u64,
        /// Stop after this many seconds.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// List the devices and ports of the embedded soft fabric and a RoCEv2
    /// device, like ibv_devinfo -v; built with the `rdma` feature, also the
    /// machine's RDMA devices (with none it says so and exits 255, as
    /// ibv_devinfo does).
    Devinfo {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also list a RoCEv2 device with one port bound to this IP
        /// address (and UDP port; 0 or none: any free one). Repeatable;
        /// default: one on 127.0.0.1.
        #[arg(long, value_name = "IP[:UDP_PORT]")]
        roce: Vec<String>,
    },
    /// Benchmarks; each reports ratios against a baseline measured in the same run.
    Perf {
        #[command(subcommand)]
        bench: PerfCommand,
    },
    /// Many threads doing random connect/accept/reject/disconnect/destroy/close
    /// on a soft fabric with CM fault injection; fails on any leak or broken invariant.
    Stress {
        /// How long the workers run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Worker threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Probability a CM MAD (any UD/GSI/UC packet) is dropped.
        #[arg(long, default_value_t = 0.0)]
        drop: f64,
        /// Probability a CM MAD is delivered twice.
        #[arg(long, default_value_t = 0.0)]
        dup: f64,
        /// Probability a CM MAD overtakes the one queued before it.
        #[arg(long, default_value_t = 0.0)]
        reorder: f64,
        /// Probability a CM MAD is held for 1..=3 fabric ticks.
        #[arg(long, default_value_t = 0.0)]
        delay: f64,
        /// Seed of the workers, the callbacks and the faults.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// HCAs (one port each): soft HCAs on the fabric (default 4), or
        /// RoCEv2 devices on 127.0.0.1, 127.0.0.2, ... (default 2).
        #[arg(long)]
        hcas: Option<usize>,
        /// `soft`: soft HCAs on one fabric with CM fault injection. `udp`:
        /// RoCEv2 ports of one RoCE provider on loopback (ephemeral UDP
        /// ports), every MAD through the kernel; no fault injection.
        #[arg(long, default_value = "soft", value_parser = ["soft", "udp"])]
        transport: String,
        /// Listen on every service once, before the workers start, instead of at random.
        #[arg(long)]
        static_listens: bool,
        /// Limit every HCA to this many PDs, CQs, QPs, SRQs, AVs and MRs, so
        /// the run keeps hitting the device limits (and exhausts them on purpose).
        #[arg(long)]
        max_objects: Option<u32>,
        /// Print one JSON object instead of the summary table.
        #[arg(long)]
        json: bool,
    },
    /// A ping-pong with another process or host over the RoCEv2 provider; QP
    /// addresses go over TCP in ibv_rc_pingpong/ibv_ud_pingpong's format, so
    /// the peer may be one of those tools (docs/two-process.md).
    QpExchange {
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
    },
}

/// `qp-exchange --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum QpxMode {
    Rc,
    Ud,
}

/// Which provider a verbs benchmark runs on.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Transport {
    /// Two soft HCAs on the in-process fabric.
    Soft,
    /// Two RoCEv2 ports on loopback UDP sockets.
    Udp,
}

#[derive(Subcommand)]
enum PerfCommand {
    /// Handle resolve+release against sharded-slab, RwLock<HashMap> and RwLock<Slab>.
    Lookup {
        /// The multi-thread point (1 thread is always measured too).
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Lookups per thread per round.
        #[arg(long, default_value_t = 4_000_000)]
        ops: u64,
        /// Objects per thread (a power of two).
        #[arg(long, default_value_t = 1024)]
        objects: usize,
        /// Rounds per point; the fastest is reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// RC RDMA WRITE bandwidth through the object layer against copy_from_slice.
    WriteBw {
        /// Message sizes, comma-separated; a K or M suffix means KiB or MiB.
        #[arg(long, value_delimiter = ',', value_parser = parse_size, default_values = ["64K", "1M"])]
        sizes: Vec<usize>,
        /// WRITEs (and copies) per round per size [default: 256 MiB / size, at least 16].
        #[arg(long)]
        iters: Option<u64>,
        /// Rounds; the fastest round of each contender is reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Signal and poll every k-th WRITE (and the last); 1 = every WRITE.
        #[arg(long, default_value_t = ibal_bench::verbs::WRITE_SIGNAL_EVERY)]
        signal_every: u32,
        /// `soft` (two soft HCAs, vs memcpy) or `udp` (two RoCEv2 ports on
        /// loopback at MTU 4096, vs raw UDP one-way throughput).
        #[arg(long, value_enum, default_value_t = Transport::Soft)]
        transport: Transport,
        /// Run on this RDMA device instead (two contexts of it, looping
        /// back through port 1; no baseline: compare with perftest,
        /// docs/benchmarks.md). Needs a build with the rdma feature.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// 64-byte RC SEND message rate (16 per post/poll call) through the object layer against std::sync::mpsc.
    SendRate {
        /// Messages per round [default: 200000 soft, 100000 udp].
        #[arg(long)]
        msgs: Option<u64>,
        /// `soft` (vs mpsc) or `udp` (two RoCEv2 ports on loopback, vs raw
        /// UDP datagrams streamed between two sockets).
        #[arg(long, value_enum, default_value_t = Transport::Soft)]
        transport: Transport,
        /// Rounds; the fastest round of each contender is reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Run on this RDMA device instead (two contexts of it, looping
        /// back through port 1; no baseline: compare with perftest,
        /// docs/benchmarks.md). Needs a build with the rdma feature.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// 64-byte RC SEND ping-pong round trip between two RoCEv2 ports on
    /// loopback, against a raw UDP ping-pong of the same datagrams.
    SendLat {
        /// Round trips per contender.
        #[arg(long, default_value_t = 20_000)]
        iters: u32,
        /// Only `udp` (the soft provider completes within the post call).
        #[arg(long, value_enum, default_value_t = Transport::Udp)]
        transport: Transport,
        /// Run on this RDMA device instead (two contexts of it, looping
        /// back through port 1; no baseline: compare with perftest,
        /// docs/benchmarks.md). Needs a build with the rdma feature.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Profiling aid, no baseline: one thread drives both ends in turn,
        /// each poll finding the datagram the other end's post just sent
        /// (at full speed; under valgrind the receive threads take some:
        /// read per-call costs there). Its times are not a latency.
        #[arg(long, conflicts_with = "device")]
        one_thread: bool,
        /// Leave the polling threads where the scheduler puts them (by
        /// default each contender's two threads are pinned to the same two
        /// CPUs: docs/benchmarks.md, "the bimodal ping-pong").
        #[arg(long)]
        no_pin: bool,
        /// The ping-pong quiet and while a stranger (127.0.0.77) floods the
        /// receiving port with 1000-byte bad-ICRC datagrams at full speed,
        /// aimed at the connection's QP and at QP1, and the raw UDP
        /// ping-pong quiet and flooded (target: median under flood <= 2x
        /// quiet; docs/security.md).
        #[arg(long, conflicts_with_all = ["device", "one_thread"])]
        flood: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// CM connect latency (to ESTABLISHED on both sides) and rate against a 256-byte MAD round trip.
    ConnRate {
        /// Serial connections (median and p99; also the REQ->REJ probes).
        #[arg(long, default_value_t = 500)]
        connections: usize,
        /// Connections in flight at once in the throughput phase.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
        /// Batches of --in-flight connections in the throughput phase.
        #[arg(long, default_value_t = 8)]
        batches: usize,
        /// CM drive modes to measure: both, polled (one thread does all the
        /// work, so this is the one to profile; the soft transport's target
        /// is judged on it) or threaded (the default CM; the udp transport's
        /// aim is judged on it).
        #[arg(long, value_enum, default_value_t = ConnModeArg::Both)]
        mode: ConnModeArg,
        /// `soft`: two soft HCAs, against a MAD round trip through the fabric.
        /// `udp`: two RoCEv2 ports on 127.0.0.1 and 127.0.0.2 over real UDP
        /// sockets, against a UDP round trip between the same addresses.
        #[arg(long, value_enum, default_value_t = Transport::Soft)]
        transport: Transport,
        /// Instead: serial connections through librdmacm on this RDMA
        /// device (two contexts of it, to its own address; --connections
        /// only). Needs a build with the rdma feature.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `perf conn-rate --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConnModeArg {
    Both,
    Polled,
    Threaded,
}

/// A byte count: digits with an optional K/KiB or M/MiB suffix.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let mult: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        _ => return Err(format!("unknown size unit in {s:?} (use K or M)")),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Pingpong {
        loopback: true,
        iterations: 1000,
        size: 4096,
        json: false,
        capture: None,
        listen: None,
        connect: None,
        local: None,
        udp_port: 4791,
        peer_udp_port: 4791,
        mtu: 1024,
        count: 1,
        timeout: 30,
        hold: 0.0,
        guid: None,
        first_qpn: None,
        device: None,
    }) {
        Command::Pingpong {
            listen: None,
            connect: None,
            device: None,
            loopback,
            iterations,
            size,
            json,
            capture,
            ..
        } => pingpong(loopback, iterations, size, json, capture),
        Command::Pingpong {
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
            device,
            iterations,
            size,
            json,
            ..
        } => (|| {
            use ibal_cli::pingpong_ip::{IpPingPongConfig, Role, DEFAULT_PORT};
            let role = match (listen, connect) {
                (Some(l), _) => Role::Listen(parse_ip_port(&l, DEFAULT_PORT)?),
                (None, Some(c)) => Role::Connect(parse_ip_port(&c, DEFAULT_PORT)?),
                (None, None) => {
                    return Err(
                        "--device runs between two processes: give --listen or --connect"
                            .to_string(),
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
            cfg.device = device;
            cfg.iterations = iterations;
            cfg.size = size;
            let report = ibal_cli::pingpong_ip::run(&cfg)?;
            if json {
                out!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        })(),
        Command::Overview => overview(),
        Command::Rping {
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
        } => {
            let mut cfg = ibal_cli::rping::RpingConfig::new(server, addr);
            cfg.port = port;
            cfg.local = source;
            cfg.count = count;
            cfg.size = size;
            cfg.verbose = verbose;
            cfg.validate = validate;
            cfg.udp_port = udp_port;
            cfg.peer_udp_port = peer_udp_port;
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
        Command::Relay {
            near_a,
            near_b,
            a,
            b,
            faults,
            drop,
            dup,
            reorder,
            delay,
            idle_exit,
            max_delay_us,
            seconds,
            seed,
        } => relay(
            ibal_testkit::relay::RelayConfig {
                near_a,
                near_b,
                a,
                b,
                faults: ibal_testkit::relay::FaultConfig {
                    drop: drop.unwrap_or(faults),
                    duplicate: dup.unwrap_or(faults),
                    reorder: reorder.unwrap_or(faults),
                    delay: delay.unwrap_or(faults),
                    max_delay: std::time::Duration::from_micros(max_delay_us),
                    seed,
                },
                max_time: std::time::Duration::from_secs(seconds),
                max_datagrams: u64::MAX,
            },
            idle_exit,
        ),
        Command::Devinfo { json, roce } => match devinfo(json, &roce) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Perf { bench } => perf(bench),
        Command::Stress {
            seconds,
            threads,
            drop,
            dup,
            reorder,
            delay,
            seed,
            hcas,
            transport,
            static_listens,
            max_objects,
            json,
        } => ibal_testkit::stress::main_on(
            &ibal_testkit::stress::StressConfig {
                seconds,
                threads,
                drop,
                duplicate: dup,
                reorder,
                delay,
                seed,
                hcas: hcas.unwrap_or(if transport == "udp" { 2 } else { 4 }),
                static_listens,
                max_objects,
            },
            if transport == "udp" {
                ibal_testkit::stress::Transport::Udp
            } else {
                ibal_testkit::stress::Transport::Soft
            },
            json,
        ),
        Command::QpExchange {
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
        } => qp_exchange(
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
                mtu: match mtu {
                    256 => ibal::prelude::Mtu::Mtu256,
                    512 => ibal::prelude::Mtu::Mtu512,
                    1024 => ibal::prelude::Mtu::Mtu1024,
                    2048 => ibal::prelude::Mtu::Mtu2048,
                    4096 => ibal::prelude::Mtu::Mtu4096,
                    other => {
                        eprintln!("ibal: --mtu {other}: use 256, 512, 1024, 2048 or 4096");
                        return ExitCode::FAILURE;
                    }
                },
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
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibal: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mtu_of(bytes: u32) -> Result<ibal::prelude::Mtu, String> {
    use ibal::prelude::Mtu;
    Ok(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        other => return Err(format!("--mtu {other}: use 256, 512, 1024, 2048 or 4096")),
    })
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

fn perf(bench: PerfCommand) -> Result<(), String> {
    use ibal_bench::udp as pu;
    match bench {
        PerfCommand::WriteBw {
            sizes,
            iters,
            rounds,
            device: Some(device),
            json,
            ..
        } => {
            let bytes = iters.map_or(256 << 20, |i| {
                i * sizes.iter().max().copied().unwrap_or(1) as u64
            });
            let report = pu::run_device_write_bw(&device, &sizes, bytes, rounds)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::SendRate {
            msgs,
            rounds,
            device: Some(device),
            json,
            ..
        } => {
            let report = pu::run_device_send_rate(&device, msgs.unwrap_or(100_000), rounds)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::SendLat {
            iters,
            device: Some(device),
            json,
            ..
        } => {
            let report = pu::run_device_send_lat(&device, iters)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::Lookup {
            threads,
            ops,
            objects,
            rounds,
            json,
        } => {
            if threads == 0 || rounds == 0 || ops == 0 {
                return Err("--threads, --ops and --rounds must be at least 1".into());
            }
            if !objects.is_power_of_two() {
                return Err(format!("--objects must be a power of two, got {objects}"));
            }
            let report = ibal_bench::lookup::run(&ibal_bench::lookup::LookupConfig {
                threads,
                objects_per_thread: objects,
                ops_per_thread: ops,
                rounds,
            });
            if json {
                out!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        }
        PerfCommand::WriteBw {
            sizes,
            iters,
            rounds,
            signal_every,
            transport: Transport::Udp,
            json,
            ..
        } => {
            let bytes = iters.map_or(256 << 20, |i| {
                i * sizes.iter().max().copied().unwrap_or(1) as u64
            });
            let report = ibal_bench::udp::run_write_bw(&sizes, bytes, rounds)?;
            let _ = signal_every;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::WriteBw {
            sizes,
            iters,
            rounds,
            signal_every,
            transport: Transport::Soft,
            json,
            ..
        } => {
            let report = ibal_bench::verbs::run_write_bw(&ibal_bench::verbs::WriteBwConfig {
                sizes,
                iters,
                rounds,
                signal_every,
            })?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::SendRate {
            msgs,
            rounds,
            transport: Transport::Udp,
            json,
            ..
        } => {
            let report = ibal_bench::udp::run_send_rate(msgs.unwrap_or(100_000), rounds)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::SendRate {
            msgs,
            rounds,
            transport: Transport::Soft,
            json,
            ..
        } => {
            let report = ibal_bench::verbs::run_send_rate(&ibal_bench::verbs::SendRateConfig {
                msgs: msgs.unwrap_or(200_000),
                rounds,
            })?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::SendLat {
            iters,
            transport,
            one_thread,
            no_pin,
            flood,
            json,
            ..
        } => {
            if transport != Transport::Udp {
                return Err(
                    "send-lat runs on --transport udp only (a soft SEND completes within its post)"
                        .into(),
                );
            }
            if flood {
                let report = ibal_bench::flood::run_send_lat_flood(iters, !no_pin)?;
                print_report(json, report.to_json(), report.to_text());
                return Ok(());
            }
            if one_thread {
                let report = ibal_bench::udp::run_send_lat_one_thread(iters)?;
                print_report(json, report.to_json(), report.to_text());
                return Ok(());
            }
            let report = ibal_bench::udp::run_send_lat(iters, !no_pin)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        #[cfg(feature = "rdma")]
        PerfCommand::ConnRate {
            connections,
            device: Some(device),
            json,
            ..
        } => {
            let report = ibal_bench::conn_rdma::run(&device, connections)?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        #[cfg(not(feature = "rdma"))]
        PerfCommand::ConnRate {
            device: Some(device),
            ..
        } => Err(format!(
            "--device {device}: this ibal was built without the rdma feature \
             (cargo build --features rdma -p ibal-cli; docs/rdma-provider.md)"
        )),
        PerfCommand::ConnRate {
            connections,
            in_flight,
            batches,
            mode,
            transport,
            json,
            ..
        } => {
            use ibal_bench::conn::ConnModes;
            let cfg = ibal_bench::conn::ConnRateConfig {
                connections,
                in_flight,
                batches,
                modes: match mode {
                    ConnModeArg::Both => ConnModes::Both,
                    ConnModeArg::Polled => ConnModes::Polled,
                    ConnModeArg::Threaded => ConnModes::Threaded,
                },
            };
            match transport {
                Transport::Soft => {
                    let report = ibal_bench::conn::run(&cfg)?;
                    print_report(json, report.to_json(), report.to_text());
                }
                Transport::Udp => {
                    let report = ibal_bench::conn::udp::run(&cfg)?;
                    print_report(json, report.to_json(), report.to_text());
                }
            }
            Ok(())
        }
    }
}

fn print_report(json: bool, as_json: String, as_text: String) {
    if json {
        out!("{as_json}");
    } else {
        print!("{as_text}");
    }
}

/// Exit status 255: what `ibv_devinfo` returns (`-1`) when there is no
/// device or libibverbs cannot list any.
#[cfg(feature = "rdma")]
const NO_RDMA_DEVICES_EXIT: u8 = 255;

fn devinfo(json: bool, roce: &[String]) -> Result<ExitCode, String> {
    use ibal_cli::devinfo::{query_all, query_roce, reports_to_json, roce_provider};
    use ibal_testkit::devices::default_provider;
    let addrs = if roce.is_empty() {
        vec!["127.0.0.1:0".parse().expect("a literal address")]
    } else {
        roce.iter()
            .map(|a| parse_ip_port(a, 0))
            .collect::<Result<Vec<_>, _>>()?
    };
    let soft = query_all(&default_provider()).map_err(|e| e.to_string())?;
    let roce = query_roce(&roce_provider(&addrs))
        .map_err(|e| format!("cannot open a RoCEv2 port on {addrs:?}: {e}"))?;
    #[allow(unused_mut)]
    let mut text = format!("{}{}", soft.to_text(), roce.to_text());
    #[allow(unused_mut)]
    let mut reports = vec![soft, roce];
    #[allow(unused_mut)]
    let mut code = ExitCode::SUCCESS;
    #[cfg(feature = "rdma")]
    {
        let none = |why: String| {
            eprintln!("ibal: {why}");
            ibal_cli::devinfo::DevinfoReport {
                provider: "rdma".into(),
                devices: Vec::new(),
            }
        };
        let rdma = match ibal_cli::devinfo::rdma_report() {
            Ok(r) if r.devices.is_empty() => none(format!(
                "{} (ibv_get_device_list listed none)",
                ibal::rdma::NO_DEVICES
            )),
            Ok(r) => r,
            Err(e @ al::Error::NotFound(_)) => {
                none(e.to_string().trim_start_matches("not found: ").into())
            }
            Err(e) => return Err(format!("cannot query the RDMA devices: {e}")),
        };
        if rdma.devices.is_empty() {
            code = ExitCode::from(NO_RDMA_DEVICES_EXIT);
        } else {
            text.push_str(&rdma.to_text());
        }
        reports.push(rdma);
    }
    print_report(json, reports_to_json(&reports), text);
    Ok(code)
}

/// `IP`, `IP:PORT`, `[IPv6]:PORT` or a bare IPv6 address; `default_port`
/// when none is given.
fn parse_ip_port(s: &str, default_port: u16) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse::<std::net::SocketAddr>() {
        return Ok(addr);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, default_port))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT"))
}

fn relay(cfg: ibal_testkit::relay::RelayConfig, idle_exit: f64) -> Result<(), String> {
    let f = cfg.faults;
    for (name, p) in [
        ("--drop", f.drop),
        ("--dup", f.duplicate),
        ("--reorder", f.reorder),
        ("--delay", f.delay),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!(
                "{name} (or --faults) is a probability between 0 and 1"
            ));
        }
    }
    if !(0.0..=86400.0).contains(&idle_exit) {
        return Err("--idle-exit is a number of seconds (0: off)".into());
    }
    let max = cfg.max_time;
    let r = ibal_testkit::relay::spawn(cfg).map_err(|e| format!("relay: {e}"))?;
    eprintln!("relay: {} -> B, {} -> A, for {max:?}", r.near_a, r.near_b);
    let start = std::time::Instant::now();
    let idle = std::time::Duration::from_secs_f64(idle_exit);
    let (mut seen, mut last_change) = (0u64, std::time::Instant::now());
    while start.elapsed() < max {
        std::thread::sleep(std::time::Duration::from_millis(50).min(max));
        let now = r.received();
        if now != seen {
            (seen, last_change) = (now, std::time::Instant::now());
        } else if idle_exit > 0.0 && seen > 0 && last_change.elapsed() >= idle {
            eprintln!("relay: idle for {idle:?} after {seen} datagrams, stopping");
            break;
        }
    }
    let stats = r.stop().map_err(|e| format!("relay: {e}"))?;
    out!("{stats:?}");
    Ok(())
}

fn overview() -> Result<(), String> {
    out!(
        "ibal {} — the InfiniBand Access Layer object model in Rust\n",
        env!("CARGO_PKG_VERSION")
    );
    out!("Layers (each depends only on those above it):");
    out!("  al   handle tables, object lifecycle, AL instances, callback executor");
    out!("  hca  verbs objects and providers (embedded soft HCA; rdma-core behind `rdma`)");
    out!("  qp   queue pairs, IBTA QP state machine, connection-id slot");
    out!("  cep  IBTA connection manager: MAD codec, protocol core, CEPs");
    out!();
    out!("Self-check on this machine:");
    let t0 = std::time::Instant::now();
    let al = ibal::Al::open().map_err(|e| e.to_string())?;
    out!("  opened AL instance {} (handle {})", al.id(), al.handle());
    let stats = al.close().map_err(|e| e.to_string())?;
    out!("  closed it in {:?}: {stats}", t0.elapsed());
    let mad = cep::wire::CmMad::new(0x1234, cep::wire::Rtu::default());
    let bytes = mad.encode().map_err(|e| e.to_string())?;
    let back = cep::wire::decode(&bytes).map_err(|e| e.to_string())?;
    out!(
        "  CM codec: encoded and decoded a {} MAD of {} bytes",
        back.message_kind(),
        bytes.len()
    );
    out!();
    out!("Commands:");
    out!("  ibal [pingpong --loopback] [--iterations N] [--size S] [--json] [--capture FILE]");
    out!("                                                the main job: connect through the CM, WRITE+SEND ping-pong, disconnect, leak check");
    out!("  ibal rping -s|-c -a ADDR [-p PORT] [-C N] [-S SIZE] [-v] [-V]");
    out!("                                                librdmacm's rping exchange over RoCEv2, against Linux's rping or another ibal");
    out!("  ibal pingpong --listen IP[:PORT] | --connect IP[:PORT] [--local IP]");
    out!("                                                the same job between two processes or hosts over RoCEv2 (rdma_cm addressing)");
    out!("  ibal pingpong --device NAME --listen IP[:PORT] | --connect IP[:PORT]");
    out!("                                                the same job on an RDMA device through librdmacm (build with --features rdma)");
    out!("  ibal devinfo [--json]                         devices and ports of the embedded soft fabric (like ibv_devinfo)");
    out!("  ibal perf lookup [--threads N] [--json]       handle resolve cost vs sharded-slab and locked maps");
    out!("  ibal perf write-bw [--sizes 64K,1M] [--json]  RC RDMA WRITE bandwidth vs copy_from_slice");
    out!("  ibal perf send-rate [--msgs N] [--json]       64-byte RC SEND message rate vs std::sync::mpsc");
    out!("  ibal perf send-lat|send-rate|write-bw|conn-rate --device NAME");
    out!("                                                the RoCEv2 benchmarks on an RDMA device, to compare with perftest (--features rdma)");
    out!("  ibal perf conn-rate [--mode M] [--transport soft|udp] [--json]");
    out!("                                                CM connect latency and rate vs a 256-byte MAD round trip (udp: RoCEv2 on lo vs a UDP round trip)");
    out!("  ibal stress --seconds S --threads T [--drop P] [--dup P] [--reorder P] [--transport soft|udp]");
    out!("                                                random API races with CM fault injection (udp: RoCEv2 on lo, no faults); fails on any leak");
    out!("  ibal qp-exchange --listen PORT|--connect HOST --local IP [--mode rc|ud] [--write]");
    out!("                                                two-process ping-pong over RoCEv2; peers may be ibv_rc/ud_pingpong");
    out!("  ibal --help                                   everything else");
    out!();
    out!("Tests: `cargo test`; loom models: `bash loom-tests/run.sh`. See README.md and docs/.");
    Ok(())
}

/// A u64 in hex, with or without `0x` (`--guid`).
fn parse_hex_u64(s: &str) -> Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|e| format!("{s:?} is not a hex number: {e}"))
}
