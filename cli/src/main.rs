//! The `ibal` command-line tool: the command line's grammar (one module of
//! [`cmd`] per subcommand holds its flags and what runs them) and the exit
//! status.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "ibal",
    version,
    about = "InfiniBand Access Layer in Rust: tools, demos and benchmarks"
)]
struct Cli {
    /// Print the library's tracing events on stderr (before the
    /// subcommand: `ibal -vv pingpong`): -v info (REJs, timeouts, QPs
    /// pushed to ERR), -vv debug (also CM state changes and MADs,
    /// retransmissions, RNR waits, dropped datagrams), -vvv trace.
    /// RUST_LOG (EnvFilter syntax, e.g. RUST_LOG=ibal::cm=debug) adds to
    /// it or, alone, selects what is printed (docs/tracing.md).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The main job (the default): two soft HCAs, a connection through the
    /// CM, an RDMA WRITE + SEND ping-pong, disconnect, destroy, leak check.
    Pingpong(cmd::pingpong::PingpongArgs),
    /// Print what this build contains and run a quick self-check.
    Overview,
    /// librdmacm's rping over RoCEv2 (same flags as rping): as client it
    /// pings `rping -s` (Linux or ibal), as server it answers `rping -c`.
    #[command(disable_version_flag = true)]
    Rping(cmd::rping::RpingArgs),
    /// A UDP relay between two RoCEv2 ports that drops, duplicates,
    /// reorders and delays datagrams (the fault tests' network). A sends to
    /// NEAR_A, B to NEAR_B; each datagram is re-signed for its new flow.
    Relay(cmd::relay::RelayArgs),
    /// List the devices and ports of the embedded soft fabric and a RoCEv2
    /// device, like ibv_devinfo -v; built with the `rdma` feature, also the
    /// machine's RDMA devices (with none it says so and exits 255, as
    /// ibv_devinfo does).
    Devinfo(cmd::devinfo::DevinfoArgs),
    /// Benchmarks; each reports ratios against a baseline measured in the same run.
    Perf {
        #[command(subcommand)]
        bench: cmd::perf::PerfCommand,
    },
    /// Many threads doing random connect/accept/reject/disconnect/destroy/close
    /// on a soft fabric with CM fault injection; fails on any leak or broken invariant.
    Stress(cmd::stress::StressArgs),
    /// A ping-pong with another process or host over the RoCEv2 provider; QP
    /// addresses go over TCP in ibv_rc_pingpong/ibv_ud_pingpong's format, so
    /// the peer may be one of those tools (docs/two-process.md).
    QpExchange(cmd::qp_exchange::QpExchangeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cmd::verbosity::install(cli.verbose);
    // No subcommand: the main job, with pingpong's defaults.
    let command = match cli.command {
        Some(command) => command,
        None => Cli::parse_from(["ibal", "pingpong"])
            .command
            .expect("invariant: `ibal pingpong` parses to a command"),
    };
    let result = match command {
        Command::Pingpong(args) => args.run(),
        Command::Overview => cmd::overview::run(),
        Command::Rping(args) => args.run(),
        Command::Relay(args) => args.run(),
        Command::Devinfo(args) => match args.run() {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Perf { bench } => cmd::perf::run(bench),
        Command::Stress(args) => args.run(),
        Command::QpExchange(args) => args.run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibal: {e}");
            ExitCode::FAILURE
        }
    }
}
