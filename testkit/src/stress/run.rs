//! Setting the run up, ending it, and the checks at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, Error, Kind};
use cep::cm::{self};
use hca::any::AnyProvider;
use hca::verbs::{self};
use ibal::verbs::{Fabric, FaultConfig, SoftProvider};
use provider::QpType;
use qp::{create_qp, QpCreate};

use super::checker::Checker;
use super::config::{StressConfig, CLOSE_LIMIT};
use super::ctx::{AlCtx, Objs, Slot, MAX_QPS};
use super::hcas::{
    fabric, node_guid, service_id, udp_addr, AnyShared, SharedRoce, Transport, SERVICES_PER_HCA,
};
use super::ops::{panic_text, Op};
use super::population::Population;
use super::report::StressReport;
use super::workers::{worker, WorkerStatus, ACTIONS, STUCK_LIMIT};

/// The run's keeper AL, open from before the workers start until after
/// the end checks: it holds CM ports (so the agents and their route tables
/// outlive the workers' ALs, and leaked routes and ids show at the end).
/// With `--static-listens` it is the listener AL: every HCA's CA with the
/// CM attached, a PD, a CQ and a pool of RC QPs to accept on, and a listen
/// on every service, made before any CM traffic flows. Otherwise it holds
/// the ports of every HCA but the last (whose agent still starts and stops
/// with the workers' use; the end check attaches it).
fn keeper(
    checker: &Arc<Checker>,
    provider: &dyn AnyProvider,
    hcas: usize,
    static_listens: bool,
) -> Result<Slot, String> {
    let al = Al::open().map_err(|e| e.to_string())?;
    let ctx = Arc::new(AlCtx {
        inst: al.instance().clone(),
        checker: checker.clone(),
        objs: Mutex::new(Objs::default()),
    });
    let inst = &ctx.inst;
    let held = if static_listens { hcas } else { hcas - 1 };
    for hca in 0..held {
        attach(&ctx, provider, hca)?;
        if !static_listens {
            continue;
        }
        let err = |e: Error| format!("static listener on HCA {hca}: {e}");
        let ca = ctx.objs().cas.last().map(|x| x.0).ok_or("no CA")?;
        let pd = verbs::alloc_pd(inst, ca).map_err(err)?;
        let cq = verbs::create_cq(inst, ca, 256, None, None).map_err(err)?;
        ctx.objs().pds.push((pd, ca));
        ctx.objs().cqs.push((cq, ca));
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
    Ok(Slot { al, ctx })
}

/// Open HCA `hca` in the keeper AL and attach the CM to it.
fn attach(ctx: &Arc<AlCtx>, provider: &dyn AnyProvider, hca: usize) -> Result<(), String> {
    let err = |e: Error| format!("keeper AL on HCA {hca}: {e}");
    let ca = verbs::open_ca(&ctx.inst, provider, node_guid(hca)).map_err(err)?;
    let ports = cm::attach_ca(&ctx.inst, ca).map_err(err)?;
    let mut o = ctx.objs();
    o.cas.push((ca, hca));
    o.ports.extend(ports.into_iter().map(|p| (p, hca)));
    Ok(())
}

/// One CM port at the end: (routes, live connections, allocated comm ids).
type PortFigures = (usize, usize, usize);

/// How long the end check waits for the CM ports to drop to the static
/// listens (timewait of the last connections, a few ms each; slack for a
/// loaded machine).
const PORT_SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// The end check of the CM ports, with every worker AL closed: the keeper
/// destroys the CEPs it still has (connections whose peers vanished,
/// requests nobody answered), then every port must come back, within
/// [`PORT_SETTLE_LIMIT`], to routing only the static listens
/// (`CmPort::routes`), holding no connection (`live_connections`) and no
/// comm id but the listens' (`allocated_ids`), with no CEP left in the
/// keeper AL. Returns one summary line per port.
fn check_ports(
    checker: &Arc<Checker>,
    keeper: &Slot,
    provider: &dyn AnyProvider,
    cfg: &StressConfig,
) -> Vec<String> {
    let ctx = &keeper.ctx;
    for hca in 0..cfg.hcas {
        let held = ctx.objs().ports.iter().any(|p| p.1 == hca);
        if !held {
            if let Err(e) = attach(ctx, provider, hca) {
                checker.fail(e);
            }
        }
    }
    let (ceps, pending, unanswered) = {
        let o = ctx.objs();
        (o.ceps.clone(), o.pending.clone(), o.sidr_unanswered.clone())
    };
    let ends = ceps
        .into_iter()
        .chain(pending.into_iter().map(|x| x.0))
        .chain(unanswered);
    for cep in ends {
        let r = checker.destroy(&ctx.inst, cep);
        checker.record_as("end:destroy_cep".to_string(), Op::DestroyCep, &r);
        checker.untrack_sidr(cep);
    }
    let expected = if cfg.static_listens {
        SERVICES_PER_HCA as usize
    } else {
        0
    };
    let ports = ctx.objs().ports.clone();
    let figures = || {
        ports
            .iter()
            .map(|(h, hca)| match ctx.inst.resolve(*h) {
                Ok(p) => {
                    let s = p.stats();
                    (
                        *hca,
                        Some((p.routes(), s.live_connections, s.allocated_ids)),
                    )
                }
                Err(_) => (*hca, None),
            })
            .collect::<Vec<_>>()
    };
    let settled = |f: &[(usize, Option<PortFigures>)]| {
        f.iter().all(|(_, x)| *x == Some((expected, 0, expected)))
            && ctx.inst.stats().live(Kind::CEP) == 0
    };
    let deadline = Instant::now() + PORT_SETTLE_LIMIT;
    let mut now = figures();
    while !settled(&now) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        now = figures();
    }
    let mut lines = Vec::new();
    for (hca, f) in now {
        let line = match f {
            Some((routes, live, ids)) => format!(
                "HCA {hca}: routes {routes}, live connections {live}, comm ids {ids} (expected {expected}, 0, {expected})"
            ),
            None => format!("HCA {hca}: the keeper's CM port is gone"),
        };
        if f != Some((expected, 0, expected)) {
            checker.fail(format!(
                "CM port leak after every worker AL closed and {PORT_SETTLE_LIMIT:?}: {line}"
            ));
        }
        lines.push(line);
    }
    let live_ceps = ctx.inst.stats().live(Kind::CEP);
    if live_ceps != 0 {
        checker.fail(format!(
            "{live_ceps} CEPs still live in the keeper AL after its known CEPs were destroyed"
        ));
    }
    lines
}

/// How long the end check waits for the HCAs to hold nothing: lingering
/// CM agents keep QP1 (and its PD, CQs, MRs) through their last timewait.
/// A bound, not a timing claim: 10 s was exceeded twice on a machine whose
/// two cores were both busy with other test binaries and loom (an agent's
/// QP1 set, "1 PDs, 2 CQs, 1 QPs, 4 AVs, 2 MRs", still held at 10 s),
/// while the same tests alone passed every time; a real leak never
/// settles, so the longer bound hides none.
const USAGE_SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// The end check of the devices, with every AL closed and every agent's
/// last user gone: within [`USAGE_SETTLE_LIMIT`] each HCA's counts of PDs,
/// CQs, QPs, SRQs, AVs and MRs (`SoftHca::usage`, what the limits are
/// checked against) must be back to 0, or a place was never given back.
fn check_usage(checker: &Arc<Checker>, fabric: &Fabric, hcas: usize) -> Vec<String> {
    let usage = || {
        (0..hcas)
            .map(|i| fabric.hca(node_guid(i)).map(|h| h.usage()))
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + USAGE_SETTLE_LIMIT;
    let mut now = usage();
    while !now.iter().all(|u| u.is_some_and(|u| u.is_empty())) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        now = usage();
    }
    let mut lines = Vec::new();
    for (i, u) in now.into_iter().enumerate() {
        let line = match u {
            Some(u) => format!(
                "HCA {i}: {} PDs, {} CQs, {} QPs, {} SRQs, {} AVs, {} MRs",
                u.pds, u.cqs, u.qps, u.srqs, u.avs, u.mrs
            ),
            None => format!("HCA {i}: gone from the fabric"),
        };
        if !u.is_some_and(|u| u.is_empty()) {
            checker.fail(format!(
                "device resources leaked after every AL closed and {USAGE_SETTLE_LIMIT:?}: {line}"
            ));
        }
        lines.push(line);
    }
    lines
}

/// The end check of the RoCE devices ([`Transport::Udp`]), with every AL
/// closed: within [`USAGE_SETTLE_LIMIT`] no device may hold a QP (the CM
/// agents' QP1 goes with their last user). The RoCE provider counts QPs
/// only; the AL's own counts cover the rest.
fn check_roce_usage(checker: &Arc<Checker>, roce: &SharedRoce, hcas: usize) -> Vec<String> {
    let usage = || {
        (0..hcas)
            .map(|i| roce.device(i).map_or(0, |d| d.qp_count()))
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + USAGE_SETTLE_LIMIT;
    let mut now = usage();
    while now.iter().any(|&n| n != 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        now = usage();
    }
    let mut lines = Vec::new();
    for (i, n) in now.into_iter().enumerate() {
        let line = format!("HCA {i} ({}): {n} QPs", udp_addr(i));
        if n != 0 {
            checker.fail(format!(
                "RoCE device resources leaked after every AL closed and {USAGE_SETTLE_LIMIT:?}: {line}"
            ));
        }
        lines.push(line);
    }
    lines
}

/// Run the stress test on soft HCAs.
pub fn run(cfg: &StressConfig) -> Result<StressReport, String> {
    run_on(cfg, Transport::Soft)
}

/// Run the stress test on `transport`'s HCAs.
pub fn run_on(cfg: &StressConfig, transport: Transport) -> Result<StressReport, String> {
    if cfg.threads == 0 || cfg.hcas == 0 || cfg.hcas > 64 || cfg.seconds.is_nan() {
        return Err("--threads must be >= 1 and the HCAs 1..=64".into());
    }
    if transport == Transport::Udp {
        if cfg.hcas > 16 {
            return Err("--transport udp: at most 16 HCAs (127.0.0.1 to 127.0.0.16)".into());
        }
        if cfg.drop + cfg.duplicate + cfg.reorder + cfg.delay > 0.0 {
            return Err(
                "--transport udp: --drop, --dup, --reorder and --delay are the soft \
                        fabric's fault injection and do not apply to RoCEv2 over UDP \
                        (faults across processes: `ibal relay`, docs/two-process.md)"
                    .into(),
            );
        }
        if cfg.max_objects.is_some() {
            return Err(
                "--transport udp: --max-objects limits soft HCAs only (RoCE devices: --max-qp)"
                    .into(),
            );
        }
    } else if cfg.max_qp.is_some() {
        return Err(
            "--max-qp sets the RoCEv2 devices' limit (--transport udp); soft HCAs: --max-objects"
                .into(),
        );
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
    // RoCE: an empty fabric (its stats stay 0), no ticker.
    let soft_hcas = if transport == Transport::Soft {
        cfg.hcas
    } else {
        0
    };
    let fabric = fabric(soft_hcas, cfg.max_objects);
    fabric.set_faults(Some(FaultConfig {
        seed: cfg.seed,
        drop: cfg.drop,
        duplicate: cfg.duplicate,
        reorder: cfg.reorder,
        delay: cfg.delay,
        max_delay: 3,
    }));
    let roce =
        (transport == Transport::Udp).then(|| Arc::new(SharedRoce::new(cfg.hcas, cfg.max_qp)));
    let provider: AnyShared = match &roce {
        Some(r) => r.clone(),
        None => Arc::new(SoftProvider::new(fabric.clone())),
    };
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
                while soft_hcas > 0 && !stop.load(Ordering::Acquire) {
                    fabric.progress();
                    ticks.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
            .map_err(|e| e.to_string())?
    };

    let mut remaining: Vec<Slot> = Vec::new();
    let stop_ticker = || {
        stop.store(true, Ordering::Release);
    };
    let keeper = keeper(&checker, &*provider, cfg.hcas, cfg.static_listens)
        .inspect_err(|_| stop_ticker())?;
    let mut opened = 1;
    // The population is made before the workers start, so its connects
    // meet no churn, and held while they run.
    let mut population = match cfg.population {
        0 => None,
        n => {
            let p = Population::establish(&*provider, transport, cfg.hcas, n)
                .inspect_err(|_| stop_ticker())?;
            opened += 1;
            Some(p)
        }
    };
    let mut disturbed_on_purpose = Vec::new();
    let halfway = Instant::now() + Duration::from_secs_f64(cfg.seconds.max(0.0) / 2.0);

    let deadline = Instant::now() + Duration::from_secs_f64(cfg.seconds.max(0.0));
    let statuses: Vec<Arc<WorkerStatus>> = (0..cfg.threads).map(|_| Arc::default()).collect();
    let handles: Vec<_> = (0..cfg.threads)
        .map(|id| {
            let (checker, provider, cfg) = (checker.clone(), provider.clone(), cfg.clone());
            let status = statuses[id].clone();
            std::thread::Builder::new()
                .name(format!("ibal-stress-{id}"))
                .spawn(move || worker(id, status, checker, (provider, transport), cfg, deadline))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;

    let mut ops: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut closed = Vec::new();
    let mut closed_count = 0;
    let mut stuck_workers = Vec::new();
    for (id, h) in handles.into_iter().enumerate() {
        let mut next_sweep = Instant::now();
        while !h.is_finished() && Instant::now() < deadline + STUCK_LIMIT {
            // The keeper has no worker: its SIDR CEPs and CID slots are
            // judged from here.
            if let Some(p) = &population {
                let due = cfg.disturb_population > 0 && disturbed_on_purpose.is_empty();
                if due && Instant::now() >= halfway {
                    disturbed_on_purpose = p.disturb(cfg.disturb_population);
                }
            }
            if Instant::now() >= next_sweep {
                checker.sweep_sidr(&keeper.ctx.inst, false);
                let n = keeper.ctx.check_cid_slots(false);
                checker.count_probes("cid slots checked", n as u64);
                next_sweep = Instant::now() + Duration::from_secs(1);
            }
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
        std::mem::forget(keeper);
        let population = population.map(|mut p| {
            p.report.disturbed_on_purpose = disturbed_on_purpose;
            let r = p.report.clone();
            std::mem::forget(p);
            r
        });
        return Ok(StressReport {
            config: cfg.clone(),
            transport,
            elapsed_s: t0.elapsed().as_secs_f64(),
            ops,
            events: checker
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            objects: Vec::new(),
            population,
            als_opened: opened,
            als_closed: closed_count,
            destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
            destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
            destroy_callbacks_never: 0,
            callback_panics: checker.callback_panics.load(Ordering::Relaxed),
            fabric: fabric.stats(),
            ticks: ticks.load(Ordering::Relaxed),
            active_ports_after: cm::active_ports().saturating_sub(ports_before),
            probes: checker.probes(),
            ports: Vec::new(),
            usage: Vec::new(),
            stuck_workers,
            failure_count: checker.failure_count(),
            failures: checker.failures(),
        });
    }
    // The population first: held through the churn, then disconnected
    // and closed, so the end checks below cover what it leaves.
    let population = population.take().map(|mut p| {
        p.report.disturbed_on_purpose = std::mem::take(&mut disturbed_on_purpose);
        p.check_held(&checker);
        let (report, stats) = p.end(&checker, CLOSE_LIMIT);
        *ops.entry(Op::CloseAl.name().to_string())
            .or_default()
            .entry(if stats.is_some() { "ok" } else { "hung" })
            .or_default() += 1;
        closed_count += 1;
        closed.extend(stats);
        report
    });
    // Close every AL that is still open, alternating the two ways.
    let keeper_id = keeper.ctx.inst.id();
    remaining.push(keeper);
    let mut port_lines = Vec::new();
    for (i, slot) in remaining.into_iter().enumerate() {
        if slot.ctx.inst.id() == keeper_id {
            // Last, after every worker AL: the port leak check first.
            port_lines = check_ports(&checker, &slot, &*provider, cfg);
        }
        let stats = slot.close(&checker, i % 2 == 0, CLOSE_LIMIT);
        *ops.entry(Op::CloseAl.name().to_string())
            .or_default()
            .entry(if stats.is_some() { "ok" } else { "hung" })
            .or_default() += 1;
        closed_count += 1;
        closed.extend(stats);
    }
    let watched = checker.sidr_watched();
    if watched != 0 {
        checker.fail(format!(
            "{watched} SIDR CEPs never judged after every AL closed"
        ));
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
    let usage_lines = match &roce {
        Some(r) => check_roce_usage(&checker, r, cfg.hcas),
        None => check_usage(&checker, &fabric, cfg.hcas),
    };
    // The RoCE devices close (their sockets and threads) with the provider.
    drop(provider);
    drop(roce);
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
        transport,
        elapsed_s: t0.elapsed().as_secs_f64(),
        ops,
        events,
        objects,
        population,
        als_opened: opened,
        als_closed: closed_count,
        destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
        destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
        destroy_callbacks_never: never,
        callback_panics: checker.callback_panics.load(Ordering::Relaxed),
        fabric: fabric.stats(),
        ticks: ticks.load(Ordering::Relaxed),
        active_ports_after,
        probes: checker.probes(),
        ports: port_lines,
        usage: usage_lines,
        stuck_workers,
        failure_count: checker.failure_count(),
        failures: checker.failures(),
    })
}

/// The `ibal stress` command: run, print the summary (or JSON), and fail
/// when the run found anything wrong.
pub fn main(cfg: &StressConfig, json: bool) -> Result<(), String> {
    main_on(cfg, Transport::Soft, json)
}

/// `ibal stress --transport T`.
pub fn main_on(cfg: &StressConfig, transport: Transport, json: bool) -> Result<(), String> {
    let report = run_on(cfg, transport)?;
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
