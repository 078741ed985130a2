//! A short `ibal stress` run: 2 worker threads for ~3 s on the soft fabric
//! with 10% drop, 10% duplicate and 10% reorder of the CM traffic; nothing
//! may leak, no callback may run twice, no invariant may break. One run
//! also limits every HCA to 16 objects of each kind, so creations meet the
//! device limits and the workers exhaust them on purpose.

use ibal_testkit::stress::{run, StressConfig};

fn config(static_listens: bool, max_objects: Option<u32>) -> StressConfig {
    StressConfig {
        seconds: 3.0,
        threads: 2,
        drop: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        delay: 0.0,
        seed: 7,
        hcas: 4,
        static_listens,
        max_objects,
        max_qp: None,
        ..StressConfig::default()
    }
}

fn check(cfg: &StressConfig) {
    let report = run(cfg).expect("the stress run starts");
    assert!(report.ok(), "{}", report.to_text());
    let ok = |op: &str| {
        report
            .ops
            .get(op)
            .and_then(|o| o.get("ok"))
            .copied()
            .unwrap_or(0)
    };
    assert!(
        ok("connect") > 0,
        "no connect succeeded:\n{}",
        report.to_text()
    );
    assert!(
        ok("close_al") > 0,
        "no AL was closed:\n{}",
        report.to_text()
    );
    assert!(report.fabric.dropped_fault > 0 && report.fabric.duplicated > 0);
    assert_eq!(report.objects.iter().map(|o| o.2).sum::<usize>(), 0);
    assert_eq!(report.active_ports_after, 0);
    assert_eq!(report.usage.len(), cfg.hcas, "one usage line per HCA");
    if cfg.max_objects.is_some() {
        assert!(
            report
                .ops
                .get("exhaust_pd")
                .and_then(|o| o.get("limit"))
                .copied()
                .unwrap_or(0)
                > 0,
            "no PD exhaustion met the limit:\n{}",
            report.to_text()
        );
    }
    let json = report.to_json();
    assert!(json.starts_with('{') && json.ends_with('}') && json.contains("\"ok\":true"));
}

/// Listens made once, before the workers start.
#[test]
fn a_short_stress_run_with_faults_leaks_nothing() {
    check(&config(true, None));
}

/// Workers also listen and cancel listens at random while CM traffic flows
/// (this found the routes-lock deadlock recorded in `docs/stress.md`).
#[test]
fn a_short_stress_run_with_random_listens_leaks_nothing() {
    check(&config(false, None));
}

/// Every HCA limited to 16 PDs, CQs, QPs, SRQs, AVs and MRs: creations keep
/// meeting `InsufficientResources`, PD exhaustion meets the limit, and
/// every place comes back (the end-of-run usage check).
#[test]
fn a_short_stress_run_at_the_device_limits_leaks_nothing() {
    check(&config(false, Some(16)));
}
