//! `ibal stress --population N`: N RC connections made before the workers
//! start, held while they churn on the same HCAs and CM agents, and each
//! still established on both sides at the end; then disconnected and
//! closed with the usual end checks. The self-test disconnects a few
//! mid-run and the run must name exactly those (the check is not vacuous).

use ibal_testkit::stress::{run_on, StressConfig, StressReport, Transport};

fn config(population: u32, seed: u64) -> StressConfig {
    StressConfig {
        seconds: 2.0,
        threads: 2,
        seed,
        population,
        ..StressConfig::default()
    }
}

/// The population came up whole, was held whole, and went down whole;
/// nothing leaked.
fn check_all_held(report: &StressReport, size: u32) {
    assert!(report.ok(), "{}", report.to_text());
    let p = report.population.as_ref().expect("a population report");
    assert_eq!(p.size, size);
    assert_eq!(p.established, size, "{}", report.to_text());
    assert_eq!(p.held, size, "{}", report.to_text());
    assert_eq!(p.disturbed_count, 0);
    assert_eq!(p.disconnected, size, "{}", report.to_text());
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    assert_eq!(report.objects.iter().map(|o| o.2).sum::<usize>(), 0);
    assert_eq!(report.active_ports_after, 0);
    // The workers did churn next to it.
    let ok = |op: &str| report.ops.get(op).and_then(|o| o.get("ok")).copied();
    assert!(ok("connect").unwrap_or(0) > 0, "{}", report.to_text());
    let json = report.to_json();
    assert!(
        json.contains(&format!(
            "\"population\":{{\"size\":{size},\"established\":{size},"
        )),
        "{json}"
    );
    assert!(json.contains(&format!("\"held\":{size},\"disturbed_count\":0,")));
}

/// Soft fabric with 5 % of the CM MADs dropped, duplicated and reordered:
/// the CM's retries still bring every population connection up and down.
#[test]
fn a_population_is_held_through_churn_on_a_faulty_soft_fabric() {
    let cfg = StressConfig {
        drop: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        ..config(200, 31)
    };
    let report = run_on(&cfg, Transport::Soft).expect("the run starts");
    check_all_held(&report, 200);
    assert!(report.fabric.dropped_fault > 0);
}

#[test]
fn a_population_is_held_through_churn_over_udp() {
    let cfg = StressConfig {
        hcas: 2,
        ..config(200, 32)
    };
    let report = run_on(&cfg, Transport::Udp).expect("the run starts");
    check_all_held(&report, 200);
}

/// The run disconnects 3 held connections halfway (active, passive,
/// active side): the report must name exactly those as disturbed, the run
/// must fail for them and for nothing else, and the rest must still be
/// held, disconnected and closed with nothing left.
#[test]
fn a_connection_disturbed_mid_run_is_reported() {
    for (transport, hcas) in [(Transport::Soft, 4), (Transport::Udp, 2)] {
        let cfg = StressConfig {
            hcas,
            disturb_population: 3,
            ..config(200, 33)
        };
        let report = run_on(&cfg, transport).expect("the run starts");
        let text = report.to_text();
        let p = report.population.as_ref().expect("a population report");
        assert_eq!(p.disturbed_on_purpose.len(), 3, "{text}");
        let mut named: Vec<u32> = p.disturbed.iter().map(|d| d.0).collect();
        named.sort_unstable();
        let mut hit = p.disturbed_on_purpose.clone();
        hit.sort_unstable();
        assert_eq!(named, hit, "{text}");
        assert_eq!(p.disturbed_count, 3, "{text}");
        assert_eq!(p.held, 197, "{text}");
        assert_eq!(p.disconnected, 197, "{text}");
        assert!(!report.ok());
        assert_eq!(report.failure_count, 3, "only the disturbed fail:\n{text}");
        for i in &hit {
            let needle = format!("population connection {i} disturbed by the churn");
            assert!(
                report.failures.iter().any(|f| f.contains(&needle)),
                "{text}"
            );
        }
        assert_eq!(report.objects.iter().map(|o| o.2).sum::<usize>(), 0);
        assert_eq!(report.active_ports_after, 0);
    }
}

/// A population the HCAs cannot hold is refused before the run starts,
/// with the numbers.
#[test]
fn a_population_above_the_device_limit_is_refused() {
    let cfg = StressConfig {
        max_objects: Some(64),
        ..config(200, 34)
    };
    let e = run_on(&cfg, Transport::Soft).unwrap_err();
    assert!(
        e.contains("--population 200") && e.contains("allows 64"),
        "{e}"
    );
}
