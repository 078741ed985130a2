//! `ibal stress`: the stress run of `ibal_testkit::stress` with the
//! command line's settings.

// `ibal stress`'s flags.
#[derive(clap::Args)]
pub struct StressArgs {
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
    /// `--transport udp`: every RoCEv2 device's `max_qp` [default:
    /// 1048576].
    #[arg(long, value_name = "N")]
    max_qp: Option<u32>,
    /// Before the workers start, make this many RC connections through the
    /// CM between the HCAs (an AL and listens of their own, at most 256
    /// connects in flight) and hold them while the workers churn; each
    /// must still be established at the end (docs/stress.md, "Population").
    #[arg(long, default_value_t = 0)]
    population: u32,
    /// Print one JSON object instead of the summary table.
    #[arg(long)]
    json: bool,
    /// Print a snapshot of every AL instance's objects (the workers' and
    /// the population's) on stderr every SECS seconds, like `rdma res
    /// show`; with --json as JSON lines. With or without it, SIGUSR1
    /// prints one at once.
    #[arg(long, value_name = "SECS")]
    status: Option<f64>,
}

impl StressArgs {
    /// Runs the workers and prints the summary (or JSON).
    pub fn run(self) -> Result<(), String> {
        let StressArgs {
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
            max_qp,
            population,
            json,
            status,
        } = self;
        let _status = ibal_cli::status::StatusPrinter::for_process(Some(
            ibal_cli::status::StatusConfig::from_flags(status, json)?,
        ));
        let result = ibal_testkit::stress::main_on(
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
                max_qp,
                population,
                disturb_population: 0,
            },
            if transport == "udp" {
                ibal_testkit::stress::Transport::Udp
            } else {
                ibal_testkit::stress::Transport::Soft
            },
            json,
        );
        #[cfg(feature = "delay-points")]
        report_delays();
        result
    }
}

/// With the `delay-points` feature: what the RoCEv2 provider's protocol
/// points injected (on stderr, so `--json` stays one object).
#[cfg(feature = "delay-points")]
fn report_delays() {
    let counts = ibal::roce::delay::counts();
    let passes: u64 = counts.iter().map(|(_, c)| c.calls).sum();
    let delays: u64 = counts
        .iter()
        .map(|(_, c)| c.yields + c.spins + c.sleeps)
        .sum();
    eprintln!("delay points: {delays} delays injected in {passes} passes (IBAL_DELAY_POINTS)");
    for (p, c) in counts.iter().filter(|(_, c)| c.calls > 0) {
        eprintln!(
            "  {:<16} {:>10} passes {:>8} yields {:>8} spins {:>8} sleeps",
            format!("{p:?}"),
            c.calls,
            c.yields,
            c.spins,
            c.sleeps
        );
    }
}
