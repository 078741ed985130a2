//! `ibal relay`: the fault relay between two RoCEv2 ports
//! (`ibal_testkit::relay`), bounded in time, optionally until idle.

// `ibal relay`'s flags.
#[derive(clap::Args)]
pub struct RelayArgs {
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
}

impl RelayArgs {
    /// Checks the probabilities, runs the relay and prints its counts.
    pub fn run(self) -> Result<(), String> {
        let RelayArgs {
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
        } = self;
        relay(
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
        )
    }
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
