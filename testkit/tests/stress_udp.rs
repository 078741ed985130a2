//! A short `ibal stress --transport udp` run: the stress mix over RoCEv2
//! ports (two devices of one RoCE provider on 127.0.0.1 and 127.0.0.2,
//! ephemeral UDP ports) instead of soft HCAs; nothing may leak, no
//! callback may run twice, no invariant may break, and connections must
//! really be made through the kernel's UDP.

use ibal_testkit::stress::{run_on, StressConfig, Transport};

fn check(static_listens: bool, seed: u64, max_qp: Option<u32>) {
    let cfg = StressConfig {
        seconds: 2.0,
        threads: 2,
        seed,
        hcas: 2,
        static_listens,
        max_qp,
        ..StressConfig::default()
    };
    let report = run_on(&cfg, Transport::Udp).expect("the stress run starts");
    assert!(report.ok(), "{}", report.to_text());
    let ok = |op: &str| {
        report
            .ops
            .get(op)
            .and_then(|o| o.get("ok"))
            .copied()
            .unwrap_or(0)
    };
    assert!(ok("connect") > 0, "no connect:\n{}", report.to_text());
    if max_qp.is_some() {
        // The devices' max_qp (`--max-qp`) was met, and the run still
        // ends with nothing live.
        let refused = report
            .ops
            .get("create_qp")
            .and_then(|o| o.get("InsufficientResources"));
        assert!(
            refused.is_some_and(|&n| n > 0),
            "max_qp never met:\n{}",
            report.to_text()
        );
    }
    assert!(ok("close_al") > 0, "no AL closed:\n{}", report.to_text());
    let ev = |k: &str| report.events.get(k).copied().unwrap_or(0);
    assert!(
        ev("Established") > 0 && ev("ConnectRequest") > 0,
        "no connection established over UDP:\n{}",
        report.to_text()
    );
    assert_eq!(report.objects.iter().map(|o| o.2).sum::<usize>(), 0);
    assert_eq!(report.active_ports_after, 0);
    assert_eq!(report.usage.len(), 2, "one usage line per device");
    // No soft fabric in this run.
    assert_eq!(report.fabric.delivered, 0);
    let json = report.to_json();
    assert!(json.contains("\"transport\":\"udp\"") && json.contains("\"ok\":true"));
}

/// One test, two runs one after the other: the devices bind ephemeral
/// ports, but two runs at once would double the load on a shared machine.
#[test]
fn a_short_udp_stress_run_leaks_nothing() {
    check(false, 21, Some(24));
    check(true, 22, None);
}

#[test]
fn udp_refuses_the_soft_fabric_faults_and_limits() {
    let faulty = StressConfig {
        drop: 0.1,
        ..StressConfig::default()
    };
    let e = run_on(&faulty, Transport::Udp).unwrap_err();
    assert!(e.contains("do not apply to RoCEv2"), "{e}");
    let limited = StressConfig {
        max_objects: Some(8),
        ..StressConfig::default()
    };
    let e = run_on(&limited, Transport::Udp).unwrap_err();
    assert!(e.contains("--max-objects"), "{e}");
    let soft_max_qp = StressConfig {
        max_qp: Some(8),
        ..StressConfig::default()
    };
    let e = run_on(&soft_max_qp, Transport::Soft).unwrap_err();
    assert!(e.contains("--max-qp"), "{e}");
}
