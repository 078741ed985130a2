//! `ibal perf`: the benchmarks' flags; each subcommand runs its benchmark
//! in `ibal_bench` and prints the report.

use ibal::roce::UdpOffload;

use super::parse::parse_size;
use super::print_report;

/// Which provider a verbs benchmark runs on.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Two soft HCAs on the in-process fabric.
    Soft,
    /// Two RoCEv2 ports on loopback UDP sockets.
    Udp,
}

/// `ibal perf`'s subcommands.
#[derive(clap::Subcommand)]
pub enum PerfCommand {
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
        /// Instead: one thread at each of these numbers of live handles
        /// (comma-separated, e.g. 1000,1000000), and each contender's growth
        /// from the smallest to the largest.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// With --sizes: cycle through the keys in a fixed shuffled order
        /// instead of insertion order.
        #[arg(long)]
        random_order: bool,
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
        /// loopback, vs raw UDP one-way throughput, plain and GSO+GRO).
        #[arg(long, value_enum, default_value_t = Transport::Soft)]
        transport: Transport,
        /// With --transport udp: the path MTUs, comma-separated (1024,
        /// 4096), one table each [default: both].
        #[arg(long, value_delimiter = ',', value_parser = parse_mtu)]
        mtu: Vec<usize>,
        /// With --transport udp: the kernel UDP offloads the RoCEv2 ports
        /// use: on, off, gso or gro [default: IBAL_ROCE_UDP_OFFLOAD, else on].
        #[arg(long, value_name = "on|off|gso|gro", value_parser = parse_udp_offload)]
        udp_offload: Option<UdpOffload>,
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
        /// UDP datagrams streamed between two sockets, one per system call
        /// and 32 per sendmmsg/recvmmsg).
        #[arg(long, value_enum, default_value_t = Transport::Soft)]
        transport: Transport,
        /// With --transport udp: the RoCEv2 ports' MTU, 1024 or 4096 (a
        /// 64-byte SEND is one packet at either) [default: 1024].
        #[arg(long, value_parser = parse_mtu)]
        mtu: Option<usize>,
        /// With --transport udp: the kernel UDP offloads the RoCEv2 ports
        /// use: on, off, gso or gro [default: IBAL_ROCE_UDP_OFFLOAD, else on].
        #[arg(long, value_name = "on|off|gso|gro", value_parser = parse_udp_offload)]
        udp_offload: Option<UdpOffload>,
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
    /// N RC connections through the CM, held: connect rate by decile, memory per connection end, idle CPU, a ping-pong among N, teardown.
    Scale(super::perf_scale::ScaleArgs),
    /// The listening end of `perf scale --processes 2` (started by it; commands on stdin).
    #[command(hide = true)]
    ScaleListener(super::perf_scale::ListenerArgs),
}

/// `--mtu`: 1024 or 4096 (what the RoCEv2 benchmarks over UDP take).
fn parse_mtu(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|&b| ibal_bench::udp::bench_mtu(b).is_some())
        .ok_or_else(|| format!("{s}: 1024 or 4096"))
}

/// `--udp-offload`: on, off, gso or gro.
fn parse_udp_offload(s: &str) -> Result<UdpOffload, String> {
    UdpOffload::parse(s).ok_or_else(|| format!("{s}: on, off, gso or gro"))
}

/// The error for `--mtu` or `--udp-offload` outside `--transport udp`
/// (the soft fabric has no packets; a device's MTU is its port's).
fn udp_only_flags(bench: &PerfCommand) -> Result<(), String> {
    let misused = match bench {
        PerfCommand::WriteBw {
            transport,
            device,
            mtu,
            udp_offload,
            ..
        } => {
            (*transport != Transport::Udp || device.is_some())
                && (!mtu.is_empty() || udp_offload.is_some())
        }
        PerfCommand::SendRate {
            transport,
            device,
            mtu,
            udp_offload,
            ..
        } => {
            (*transport != Transport::Udp || device.is_some())
                && (mtu.is_some() || udp_offload.is_some())
        }
        _ => false,
    };
    if misused {
        Err("--mtu and --udp-offload apply to --transport udp only (not the soft fabric or --device)".into())
    } else {
        Ok(())
    }
}

/// The MTU of `bytes` (already checked by [`parse_mtu`]).
fn mtu_of(bytes: usize) -> Result<ibal::prelude::Mtu, String> {
    ibal_bench::udp::bench_mtu(bytes).ok_or_else(|| format!("--mtu {bytes}: 1024 or 4096"))
}

/// `perf conn-rate --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConnModeArg {
    Both,
    Polled,
    Threaded,
}

/// Runs the benchmark `bench` names and prints its report.
pub fn run(bench: PerfCommand) -> Result<(), String> {
    use ibal_bench::udp as pu;
    udp_only_flags(&bench)?;
    match bench {
        PerfCommand::Scale(args) => super::perf_scale::run(args),
        PerfCommand::ScaleListener(args) => super::perf_scale::listener(args),
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
            ops,
            rounds,
            sizes,
            random_order,
            json,
            ..
        } if !sizes.is_empty() => {
            let report =
                ibal_bench::lookup_sizes::run_sizes(&ibal_bench::lookup_sizes::SizesConfig {
                    sizes,
                    ops,
                    rounds,
                    random_order,
                })?;
            print_report(json, report.to_json(), report.to_text());
            Ok(())
        }
        PerfCommand::Lookup {
            threads,
            ops,
            objects,
            rounds,
            json,
            ..
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
            mtu,
            udp_offload,
            json,
            ..
        } => {
            let bytes = iters.map_or(256 << 20, |i| {
                i * sizes.iter().max().copied().unwrap_or(1) as u64
            });
            let mtus = if mtu.is_empty() {
                vec![1024, 4096]
            } else {
                mtu
            };
            let report = ibal_bench::udp::run_write_bw(&ibal_bench::udp::UdpBwConfig {
                sizes,
                bytes_per_round: bytes,
                rounds,
                mtus: mtus.into_iter().map(mtu_of).collect::<Result<_, _>>()?,
                offload: udp_offload,
            })?;
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
            mtu,
            udp_offload,
            json,
            ..
        } => {
            let report = ibal_bench::udp::run_send_rate(
                msgs.unwrap_or(100_000),
                rounds,
                mtu_of(mtu.unwrap_or(1024))?,
                udp_offload,
            )?;
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
