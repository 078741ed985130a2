//! Setting the run up, ending it, and the checks at the end.

use super::*;

/// The listener AL of `--static-listens`: every HCA's CA with the CM
/// attached, a PD, a CQ and a pool of RC QPs to accept on, and a listen on
/// every service. Made before any CM traffic flows.
fn static_listener(
    checker: &Arc<Checker>,
    provider: &SoftProvider,
    hcas: usize,
) -> Result<Al, String> {
    let al = Al::open().map_err(|e| e.to_string())?;
    let ctx = Arc::new(AlCtx {
        inst: al.instance().clone(),
        checker: checker.clone(),
        objs: Mutex::new(Objs::default()),
    });
    let inst = &ctx.inst;
    for hca in 0..hcas {
        let err = |e: Error| format!("static listener on HCA {hca}: {e}");
        let ca = verbs::open_ca(inst, provider, node_guid(hca)).map_err(err)?;
        cm::attach_ca(inst, ca).map_err(err)?;
        let pd = verbs::alloc_pd(inst, ca).map_err(err)?;
        let cq = verbs::create_cq(inst, ca, 256, None, None).map_err(err)?;
        for _ in 0..MAX_QPS {
            let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).map_err(err)?;
            ctx.objs().qps.push((qp, hca));
        }
        for k in 0..SERVICES_PER_HCA {
            cm::listen(
                inst,
                ca,
                1,
                service_id(hca, k),
                ctx.listen_handler(hca),
                ctx.cep_handler(),
            )
            .map_err(err)?;
        }
    }
    Ok(al)
}

/// Run the stress test.
pub fn run(cfg: &StressConfig) -> Result<StressReport, String> {
    if cfg.threads == 0 || cfg.hcas == 0 || cfg.hcas > 64 || cfg.seconds.is_nan() {
        return Err("--threads must be >= 1 and the HCAs 1..=64".into());
    }
    for (name, p) in [
        ("--drop", cfg.drop),
        ("--dup", cfg.duplicate),
        ("--reorder", cfg.reorder),
        ("--delay", cfg.delay),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{name} must be a probability in 0..=1, got {p}"));
        }
    }
    let t0 = Instant::now();
    let ports_before = cm::active_ports();
    let fabric = fabric(cfg.hcas);
    fabric.set_faults(Some(FaultConfig {
        seed: cfg.seed,
        drop: cfg.drop,
        duplicate: cfg.duplicate,
        reorder: cfg.reorder,
        delay: cfg.delay,
        max_delay: 3,
    }));
    let provider = SoftProvider::new(fabric.clone());
    let checker = Checker::new(cfg.seed);

    // While faults are on, every CM MAD waits in the fabric's queue until
    // someone calls progress(): that is this thread.
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (fabric, stop, ticks) = (fabric.clone(), stop.clone(), ticks.clone());
        std::thread::Builder::new()
            .name("ibal-stress-ticker".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    fabric.progress();
                    ticks.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
            .map_err(|e| e.to_string())?
    };

    let mut remaining = Vec::new();
    let mut opened = 0;
    if cfg.static_listens {
        remaining.push(static_listener(&checker, &provider, cfg.hcas)?);
        opened += 1;
    }

    let deadline = Instant::now() + Duration::from_secs_f64(cfg.seconds.max(0.0));
    let statuses: Vec<Arc<WorkerStatus>> = (0..cfg.threads).map(|_| Arc::default()).collect();
    let handles: Vec<_> = (0..cfg.threads)
        .map(|id| {
            let (checker, provider, cfg) = (checker.clone(), provider.clone(), cfg.clone());
            let status = statuses[id].clone();
            std::thread::Builder::new()
                .name(format!("ibal-stress-{id}"))
                .spawn(move || worker(id, status, checker, provider, cfg, deadline))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;

    let mut ops: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut closed = Vec::new();
    let mut closed_count = 0;
    let mut stuck_workers = Vec::new();
    for (id, h) in handles.into_iter().enumerate() {
        while !h.is_finished() && Instant::now() < deadline + STUCK_LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !h.is_finished() {
            let a = statuses[id].action.load(Ordering::Acquire);
            let action = ACTIONS
                .get(a)
                .map_or("(between actions)".to_string(), |x| format!("{:?}", x.0));
            checker.fail(format!(
                "worker {id} stuck in {action} at step {} for over {STUCK_LIMIT:?} (deadlock?)",
                statuses[id].steps.load(Ordering::Acquire)
            ));
            stuck_workers.push((id, action));
            continue;
        }
        match h.join() {
            Ok(out) => {
                for ((op, outcome), n) in out.ops {
                    *ops.entry(op).or_default().entry(outcome).or_default() += n;
                }
                closed.extend(out.closed);
                remaining.extend(out.als);
                opened += out.opened;
                closed_count += out.closed_count;
            }
            Err(p) => checker.fail(format!("a worker thread died: {}", panic_text(&*p))),
        }
    }
    if !stuck_workers.is_empty() {
        // Closing would block on whatever the stuck workers hold.
        stop.store(true, Ordering::Release);
        std::mem::forget(remaining);
        return Ok(StressReport {
            config: cfg.clone(),
            elapsed_s: t0.elapsed().as_secs_f64(),
            ops,
            events: checker
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            objects: Vec::new(),
            als_opened: opened,
            als_closed: closed_count,
            destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
            destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
            destroy_callbacks_never: 0,
            callback_panics: checker.callback_panics.load(Ordering::Relaxed),
            fabric: fabric.stats(),
            ticks: ticks.load(Ordering::Relaxed),
            active_ports_after: cm::active_ports().saturating_sub(ports_before),
            stuck_workers,
            failure_count: checker.failure_count(),
            failures: checker.failures(),
        });
    }
    // Close every AL that is still open, alternating the two ways.
    for (i, al) in remaining.into_iter().enumerate() {
        let stats = checker.close_al(al, i % 2 == 0, CLOSE_LIMIT);
        *ops.entry(Op::CloseAl.name().to_string())
            .or_default()
            .entry(if stats.is_some() { "ok" } else { "hung" })
            .or_default() += 1;
        closed_count += 1;
        closed.extend(stats);
    }
    let never = checker.settle_destroy_callbacks(Duration::from_secs(10));
    // Agents shut down when their last user (CM port, listen, CEP) goes.
    let wait_ports = Instant::now() + Duration::from_secs(10);
    while cm::active_ports() > ports_before && Instant::now() < wait_ports {
        std::thread::sleep(Duration::from_millis(2));
    }
    let active_ports_after = cm::active_ports().saturating_sub(ports_before);
    if active_ports_after != 0 {
        checker.fail(format!(
            "{active_ports_after} CM agents still running after every AL closed"
        ));
    }
    stop.store(true, Ordering::Release);
    let _ = ticker.join();
    fabric.set_faults(None);

    for ((op, outcome), n) in checker
        .callback_ops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        *ops.entry(op.clone())
            .or_default()
            .entry(outcome)
            .or_default() += n;
    }
    let objects = Kind::NAMED
        .iter()
        .filter(|k| **k != Kind::AL)
        .map(|k| {
            let created = closed.iter().map(|s| s.created(*k)).sum();
            let live = closed.iter().map(|s| s.live(*k)).sum();
            (k.name(), created, live)
        })
        .collect();
    let events = checker
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(StressReport {
        config: cfg.clone(),
        elapsed_s: t0.elapsed().as_secs_f64(),
        ops,
        events,
        objects,
        als_opened: opened,
        als_closed: closed_count,
        destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
        destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
        destroy_callbacks_never: never,
        callback_panics: checker.callback_panics.load(Ordering::Relaxed),
        fabric: fabric.stats(),
        ticks: ticks.load(Ordering::Relaxed),
        active_ports_after,
        stuck_workers,
        failure_count: checker.failure_count(),
        failures: checker.failures(),
    })
}

/// The `ibal stress` command: run, print the summary (or JSON), and fail
/// when the run found anything wrong.
pub fn main(cfg: &StressConfig, json: bool) -> Result<(), String> {
    let report = run(cfg)?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.ok() {
        Ok(())
    } else {
        Err(format!(
            "stress: {} failures (seed {})",
            report.failure_count, cfg.seed
        ))
    }
}
