//! The `ibal` command-line tool.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Print what this build contains and run a quick self-check (the default).
    Overview,
    /// Benchmarks; each reports ratios against a baseline measured in the same run.
    Perf {
        #[command(subcommand)]
        bench: PerfCommand,
    },
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Overview) {
        Command::Overview => overview(),
        Command::Perf { bench } => perf(bench),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibal: {e}");
            ExitCode::FAILURE
        }
    }
}

fn perf(bench: PerfCommand) -> Result<(), String> {
    match bench {
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
            let report = ibal::perf::lookup::run(&ibal::perf::lookup::LookupConfig {
                threads,
                objects_per_thread: objects,
                ops_per_thread: ops,
                rounds,
            });
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        }
    }
}

fn overview() -> Result<(), String> {
    println!(
        "ibal {} — the InfiniBand Access Layer object model in Rust\n",
        env!("CARGO_PKG_VERSION")
    );
    println!("Layers (each depends only on those above it):");
    println!("  al   handle tables, object lifecycle, AL instances, callback executor");
    println!("  hca  verbs objects and providers (embedded soft HCA; rdma-core behind `rdma`)");
    println!("  qp   queue pairs, IBTA QP state machine, connection-id slot");
    println!("  cep  IBTA connection manager: MAD codec, protocol core, CEPs");
    println!();
    println!("Self-check on this machine:");
    let t0 = std::time::Instant::now();
    let al = ibal::Al::open().map_err(|e| e.to_string())?;
    println!("  opened AL instance {} (handle {})", al.id(), al.handle());
    let stats = al.close().map_err(|e| e.to_string())?;
    println!("  closed it in {:?}: {stats}", t0.elapsed());
    let mad = ibal::cep::wire::CmMad::new(0x1234, ibal::cep::wire::Rtu::default());
    let bytes = mad.encode().map_err(|e| e.to_string())?;
    let back = ibal::cep::wire::decode(&bytes).map_err(|e| e.to_string())?;
    println!(
        "  CM codec: encoded and decoded a {} MAD of {} bytes",
        back.message_kind(),
        bytes.len()
    );
    println!();
    println!("Commands:");
    println!("  ibal perf lookup [--threads N] [--json]   handle resolve cost vs sharded-slab and locked maps");
    println!("  ibal --help                               everything else");
    println!();
    println!(
        "Tests: `cargo test`; loom models: `bash loom-tests/run.sh`. See README.md and docs/."
    );
    Ok(())
}
