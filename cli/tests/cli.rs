//! The `ibal` binary end to end: exit codes, what it prints, and that every
//! `--json` output is one JSON object with the documented keys.

use std::process::{Command, Output};

fn ibal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ibal"))
        .args(args)
        .output()
        .expect("the ibal binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// Run `args`, insist on exit 0, return stdout.
fn ok(args: &[&str]) -> String {
    let out = ibal(args);
    assert!(
        out.status.success(),
        "ibal {args:?} exited with {:?}; stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

/// `ibal devinfo ARGS`: stdout. Built with the `rdma` feature on a machine
/// without RDMA devices, devinfo lists the others and exits 255 saying
/// "no RDMA devices found" (as ibv_devinfo does); that counts as success
/// here. Otherwise it must exit 0.
fn devinfo_ok(args: &[&str]) -> String {
    let mut all = vec!["devinfo"];
    all.extend_from_slice(args);
    let out = ibal(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "rdma") && out.status.code() == Some(255) {
        assert!(stderr.contains("no RDMA devices found"), "{stderr}");
        return stdout(&out);
    }
    assert!(
        out.status.success(),
        "ibal {all:?} exited with {:?}; stderr:\n{stderr}",
        out.status
    );
    stdout(&out)
}

/// Check `s` is a single JSON object: it starts with `{`, ends with `}`,
/// braces and brackets balance outside strings and the outermost object
/// closes only at the end. Returns the top-level and nested keys seen.
fn one_json_object(s: &str) -> Vec<String> {
    let s = s.trim();
    assert!(
        s.starts_with('{') && s.ends_with('}'),
        "not a JSON object: {s}"
    );
    let (mut depth, mut in_str, mut escaped) = (0i32, false, false);
    let mut keys = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
                // A string followed by ':' is a key.
                let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                if next == Some(&':') {
                    keys.push(std::mem::take(&mut cur));
                }
                cur.clear();
            } else {
                cur.push(c);
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                assert!(depth >= 0, "unbalanced JSON: {s}");
                assert!(
                    depth > 0 || i == chars.len() - 1,
                    "more than one JSON value: {s}"
                );
            }
            _ => {}
        }
    }
    assert!(!in_str && depth == 0, "unbalanced JSON: {s}");
    keys
}

fn has_keys(keys: &[String], want: &[&str]) {
    for k in want {
        assert!(keys.iter().any(|x| x == k), "missing key {k:?} in {keys:?}");
    }
}

#[test]
fn no_arguments_runs_the_pingpong_main_job() {
    let out = ok(&[]);
    for step in [
        "connect (REQ/REP/RTU)",
        "ping-pong",
        "disconnect",
        "close AL",
    ] {
        assert!(out.contains(step), "missing {step}: {out}");
    }
    assert!(out.contains("nothing leaked"), "{out}");
}

#[test]
fn pingpong_json_reports_zero_live_objects() {
    let out = ok(&[
        "pingpong",
        "--loopback",
        "--iterations",
        "10",
        "--size",
        "256",
        "--json",
    ]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &["job", "rtt_median_us", "bandwidth_mb_s", "live_after_close"],
    );
    assert!(out.contains("\"live_after_close\":0"), "{out}");
}

#[test]
fn overview_mentions_devinfo_and_the_benchmarks() {
    let out = ok(&["overview"]);
    assert!(out.contains("Self-check"), "{out}");
    assert!(out.contains("ibal devinfo"), "{out}");
    assert!(out.contains("perf write-bw") && out.contains("perf send-rate"));
}

#[test]
fn devinfo_lists_both_hcas() {
    let out = devinfo_ok(&[]);
    for guid in ["0002:c903:00a0:0001", "0002:c903:00b0:0001"] {
        assert!(out.contains(&format!("node_guid:\t\t\t{guid}")), "{out}");
    }
    for field in [
        "hca_id:",
        "transport:",
        "fw_ver:",
        "sys_image_guid:",
        "vendor_id:",
        "vendor_part_id:",
        "hw_ver:",
        "phys_port_cnt:",
        "state:",
        "PORT_ACTIVE",
        "max_mtu:",
        "active_mtu:",
        "sm_lid:",
        "port_lid:",
        "port_lmc:",
        "link_layer:",
        "GID[  0]:",
        "P_Key table:",
    ] {
        assert!(out.contains(field), "missing {field}: {out}");
    }
    // The two soft HCAs and the default RoCEv2 device on 127.0.0.1 (and,
    // with the rdma feature, the machine's RDMA devices after them).
    let hcas = out.matches("hca_id:").count();
    if cfg!(feature = "rdma") {
        assert!(hcas >= 3, "{out}");
    } else {
        assert_eq!(hcas, 3, "{out}");
    }
    assert!(out.contains("link_layer:\t\tEthernet"), "{out}");
    assert!(out.contains("::ffff:127.0.0.1, RoCE v2"), "{out}");
}

/// With the rdma feature and no RDMA device (no kernel RDMA support here),
/// devinfo still lists the soft and RoCEv2 devices, says plainly that there
/// is no RDMA device, with the errno when libibverbs could not list, and
/// exits 255 as ibv_devinfo does; the JSON has an empty "rdma" provider.
#[cfg(feature = "rdma")]
#[test]
fn devinfo_says_when_there_is_no_rdma_device() {
    if !ibal_rdma_devices_absent() {
        eprintln!("SKIPPED: this machine has RDMA devices");
        return;
    }
    let out = ibal(&["devinfo"]);
    assert_eq!(out.status.code(), Some(255));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("ibal: no RDMA devices found"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stdout(&out).matches("hca_id:").count(), 3);
    let json = stdout(&ibal(&["devinfo", "--json"]));
    one_json_object(&json);
    assert!(
        json.contains("{\"provider\":\"rdma\",\"devices\":[]}"),
        "{json}"
    );
}

#[cfg(feature = "rdma")]
fn ibal_rdma_devices_absent() -> bool {
    !matches!(ibal::rdma::RdmaProvider::new().list(), Ok(d) if !d.is_empty())
}

#[test]
fn devinfo_lists_the_roce_ports_asked_for() {
    let out = devinfo_ok(&["--roce", "127.0.0.3", "--roce", "127.0.0.4:0"]);
    assert!(
        out.contains("hca_id:\troce0") && out.contains("hca_id:\troce1"),
        "{out}"
    );
    assert!(out.contains("::ffff:127.0.0.3, RoCE v2"), "{out}");
    assert!(out.contains("::ffff:127.0.0.4, RoCE v2"), "{out}");
    let bad = ibal(&["devinfo", "--roce", "not-an-address"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not an IP address"));
}

/// `--max-qp` raises the RoCEv2 devices' `max_qp`, which devinfo prints
/// (text and JSON) among the device's limits; past 2^24 - 2 it is refused.
#[test]
fn devinfo_prints_the_roce_limits_and_max_qp_raises_one() {
    let out = devinfo_ok(&["--roce", "127.0.0.5", "--max-qp", "300000"]);
    let roce = &out[out.find("hca_id:\troce0").expect("the RoCE device")..];
    assert!(roce.contains("\tmax_qp:\t\t\t\t300000\n"), "{out}");
    for field in [
        "max_cq:",
        "max_mr:",
        "max_pd:",
        "max_srq:",
        "max_ah:",
        "max_qp_wr:",
    ] {
        assert!(roce.contains(field), "{field}: {out}");
    }
    let json = devinfo_ok(&["--json", "--roce", "127.0.0.5", "--max-qp", "300000"]);
    assert!(json.contains("\"max_qp\":300000,"), "{json}");
    let bad = ibal(&["devinfo", "--max-qp", "16777215"]);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains("max_qp 16777215 is above 16777214"), "{why}");
}

#[test]
fn devinfo_json_is_one_object_with_both_guids() {
    let out = devinfo_ok(&["--json"]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "providers",
            "provider",
            "devices",
            "hca_id",
            "node_guid",
            "sys_image_guid",
            "phys_port_cnt",
            "ports",
            "state",
            "port_lid",
            "sm_lid",
            "gids",
            "pkeys",
        ],
    );
    assert!(
        out.contains("\"node_guid\":\"0002:c903:00a0:0001\""),
        "{out}"
    );
    assert!(
        out.contains("\"node_guid\":\"0002:c903:00b0:0001\""),
        "{out}"
    );
}

#[test]
fn perf_lookup_json() {
    let out = ok(&["perf", "lookup", "--ops", "1000", "--rounds", "1", "--json"]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "benchmark",
            "results",
            "ns_per_op",
            "ibal_vs_sharded_slab_single_thread",
            "ibal_scaling",
        ],
    );
    assert!(out.contains("\"benchmark\":\"lookup\""));
}

#[test]
fn perf_write_bw_json() {
    let out = ok(&[
        "perf",
        "write-bw",
        "--sizes",
        "4K,64K",
        "--iters",
        "4",
        "--rounds",
        "1",
        "--signal-every",
        "2",
        "--json",
    ]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "benchmark",
            "results",
            "size",
            "iters",
            "ibal_gbps",
            "memcpy_gbps",
            "ratio",
            "min_ratio",
            "target_met",
        ],
    );
    assert!(out.contains("\"benchmark\":\"write-bw\""));
    assert!(out.contains("\"size\":4096") && out.contains("\"size\":65536"));
}

#[test]
fn perf_send_rate_json() {
    let out = ok(&[
        "perf",
        "send-rate",
        "--msgs",
        "200",
        "--rounds",
        "1",
        "--json",
    ]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "benchmark",
            "msg_size",
            "ibal_msgs_per_sec",
            "ibal_ns_per_msg",
            "mpsc_msgs_per_sec",
            "mpsc_ns_per_msg",
            "mpsc_one_at_a_time_ns_per_msg",
            "mpsc_batched_ns_per_msg",
            "ibal_one_at_a_time_ns_per_msg",
            "ratio",
            "target_met",
        ],
    );
    assert!(out.contains("\"benchmark\":\"send-rate\""));
}

#[test]
fn perf_over_udp_json() {
    let cases: [(&[&str], &[&str]); 8] = [
        (
            &["perf", "send-lat", "--flood", "--iters", "200", "--json"],
            &[
                "quiet_median_us",
                "floods",
                "rx_wrong_source",
                "rx_icrc_unsolved",
                "udp_flood_median_us",
                "target_met",
            ],
        ),
        (
            &["perf", "send-lat", "--iters", "200", "--json"],
            &[
                "roce_median_us",
                "udp_median_us",
                "ratio",
                "target_met",
                "pinned_cpus",
            ],
        ),
        (
            &["perf", "send-lat", "--iters", "100", "--no-pin", "--json"],
            &["roce_median_us", "pinned_cpus"],
        ),
        (
            &[
                "perf",
                "send-lat",
                "--iters",
                "100",
                "--one-thread",
                "--json",
            ],
            &["mean_us", "empty_polls_per_round_trip"],
        ),
        (
            &[
                "perf",
                "send-rate",
                "--transport",
                "udp",
                "--msgs",
                "2000",
                "--rounds",
                "1",
                "--json",
            ],
            &[
                "roce_msgs_per_sec",
                "udp_msgs_per_sec",
                "ratio",
                "target_met",
                "udp_batched_msgs_per_sec",
                "ratio_batched",
                "roce_cpu_s_per_gib",
                "udp_cpu_ns_per_msg",
                "udp_offload",
            ],
        ),
        (
            &[
                "perf",
                "send-rate",
                "--transport",
                "udp",
                "--msgs",
                "2000",
                "--rounds",
                "1",
                "--mtu",
                "4096",
                "--udp-offload",
                "off",
                "--json",
            ],
            &["mtu", "udp_offload", "udp_batched_lost", "ratio"],
        ),
        (
            &[
                "perf",
                "write-bw",
                "--transport",
                "udp",
                "--sizes",
                "64K",
                "--iters",
                "8",
                "--rounds",
                "1",
                "--json",
            ],
            &[
                "roce_gbps",
                "udp_gbps",
                "min_ratio",
                "target_met",
                "mtu",
                "udp_gso_gbps",
                "ratio_gso",
                "roce_pps",
                "udp_gso_pps",
                "roce_cpu_s_per_gib",
                "udp_gso_cpu_s_per_gib",
                "min_ratio_gso",
                "target_met_gso",
            ],
        ),
        (
            &[
                "perf",
                "write-bw",
                "--transport",
                "udp",
                "--sizes",
                "64K",
                "--iters",
                "4",
                "--rounds",
                "1",
                "--mtu",
                "4096",
                "--udp-offload",
                "gso",
                "--json",
            ],
            &["udp_gso_gbps", "udp_offload", "target_met_gso"],
        ),
    ];
    for (args, keys) in cases {
        let out = ok(args);
        has_keys(&one_json_object(&out), keys);
        assert!(out.contains("\"transport\":\"udp\""), "{out}");
        // The flags reach the report (issue 31).
        if args.contains(&"--udp-offload") {
            assert!(
                out.contains("\"udp_offload\":\"off\"") || out.contains("\"udp_offload\":\"gso\""),
                "{out}"
            );
        }
        if args.contains(&"--mtu") {
            assert!(
                out.contains("\"mtu\":4096") && !out.contains("\"mtu\":1024"),
                "{out}"
            );
        } else if args[1] == "write-bw" {
            // Both MTUs by default, one result each.
            assert!(
                out.contains("\"mtu\":4096") && out.contains("\"mtu\":1024"),
                "{out}"
            );
        }
    }
}

#[test]
fn bad_arguments_fail_with_a_message_on_stderr() {
    for args in [
        &["--no-such-flag"][..],
        &["perf", "write-bw", "--sizes", "12Q"][..],
        &["perf", "write-bw", "--signal-every", "0", "--iters", "1"][..],
        &["perf", "send-rate", "--msgs", "0"][..],
        &["perf", "send-rate", "--transport", "udp", "--msgs", "0"][..],
        &["perf", "send-lat", "--iters", "0"][..],
        &["perf", "send-lat", "--transport", "soft"][..],
        &["perf", "write-bw", "--transport", "udp", "--mtu", "2048"][..],
        &["perf", "write-bw", "--mtu", "1024", "--iters", "1"][..],
        &[
            "perf",
            "send-rate",
            "--transport",
            "udp",
            "--udp-offload",
            "maybe",
        ][..],
        &["perf", "send-rate", "--udp-offload", "off", "--msgs", "1"][..],
    ] {
        let out = ibal(args);
        assert!(!out.status.success(), "ibal {args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "ibal {args:?}: empty stderr");
    }
}

#[test]
fn perf_conn_rate_json() {
    let out = ok(&[
        "perf",
        "conn-rate",
        "--connections",
        "20",
        "--in-flight",
        "4",
        "--json",
    ]);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "benchmark",
            "connect_median_us",
            "connect_p99_us",
            "polled_connect_median_us",
            "threaded_connect_median_us",
            "polled_conns_per_sec",
            "threaded_conns_per_sec",
            "mad_rtt_median_us",
            "ratio_connect_vs_mad_rtt",
            "ratio_threaded_connect_vs_mad_rtt",
            "target_met",
            "polled_rej_rtt_median_us",
            "threaded_rej_rtt_median_us",
        ],
    );
    assert!(out.contains("\"benchmark\":\"conn-rate\""));
    assert!(out.contains("\"connections\":20") && out.contains("\"in_flight\":4"));
}

/// `--device` names an RDMA device: without the rdma feature the command
/// says how to build it; with it and no such device, it says so; never a
/// panic, and nothing is sent anywhere.
#[test]
fn device_runs_say_plainly_when_they_cannot_run() {
    for args in [
        &[
            "pingpong",
            "--device",
            "nosuchdev0",
            "--connect",
            "127.0.0.1",
        ][..],
        &["pingpong", "--device", "nosuchdev0"][..],
        &["perf", "send-lat", "--device", "nosuchdev0"][..],
        &["perf", "write-bw", "--device", "nosuchdev0"][..],
        &["perf", "conn-rate", "--device", "nosuchdev0"][..],
    ] {
        let out = ibal(args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if args.len() == 3 {
            assert!(stderr.contains("give --listen or --connect"), "{stderr}");
            continue;
        }
        #[cfg(not(feature = "rdma"))]
        assert!(
            stderr.contains("without the rdma feature"),
            "{args:?}: {stderr}"
        );
        #[cfg(feature = "rdma")]
        assert!(
            stderr.contains("no RDMA device") || stderr.contains("nosuchdev0"),
            "{args:?}: {stderr}"
        );
    }
}

/// `ibal stress --population N`: the population's figures are in the
/// summary and the JSON (size, establish and disconnect time, held).
#[test]
fn stress_population_is_reported() {
    let args = [
        "stress",
        "--seconds",
        "0.5",
        "--threads",
        "1",
        "--population",
        "40",
    ];
    let text = ok(&args);
    assert!(
        text.contains("population: 40 of 40 RC connections established in")
            && text.contains("population: 40 held through the churn")
            && text.contains("population: 40 disconnected in"),
        "{text}"
    );
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = ok(&json_args);
    let keys = one_json_object(&out);
    has_keys(
        &keys,
        &[
            "population",
            "size",
            "established",
            "establish_s",
            "held",
            "disturbed",
            "disconnect_s",
            "close_s",
        ],
    );
    assert!(
        out.contains("\"population\":{\"size\":40,\"established\":40,"),
        "{out}"
    );
    // Without the flag the key is there, null.
    let none = ok(&["stress", "--seconds", "0.2", "--threads", "1", "--json"]);
    assert!(none.contains("\"population\":null"), "{none}");
}

/// Each mode of `ibal pingpong` is described as what it is: the embedded
/// fabric is the default, not "the only mode" (issue 29: the help said so
/// after `--listen`, `--connect` and `--device` had landed).
#[test]
fn pingpong_help_describes_every_mode() {
    let help = ok(&["pingpong", "--help"]);
    assert!(!help.contains("only mode"), "{help}");
    for flag in ["--loopback", "--listen", "--connect"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let loopback = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--loopback"))
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(loopback.contains("default"), "{loopback}");
}
