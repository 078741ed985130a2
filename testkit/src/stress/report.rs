//! What a run did and found: the summary table and the JSON object.

use std::collections::BTreeMap;

use super::config::StressConfig;
use super::hcas::Transport;
use super::population::PopulationReport;

/// What a run did and found.
#[derive(Clone, Debug)]
pub struct StressReport {
    pub config: StressConfig,
    /// Soft HCAs or RoCEv2 ports.
    pub transport: Transport,
    pub elapsed_s: f64,
    /// Operation -> outcome ("ok" or the error variant) -> count. Calls
    /// made from CM callbacks are prefixed `cb:`.
    pub ops: BTreeMap<String, BTreeMap<&'static str, u64>>,
    /// CM events delivered, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Per object kind: (created, live after close), summed over every AL.
    pub objects: Vec<(&'static str, usize, usize)>,
    /// The held population (`StressConfig::population` > 0).
    pub population: Option<PopulationReport>,
    pub als_opened: u64,
    pub als_closed: u64,
    pub destroy_callbacks: u64,
    pub destroy_callbacks_twice: u64,
    pub destroy_callbacks_never: u64,
    pub callback_panics: u64,
    pub fabric: ibal::verbs::FabricStats,
    pub ticks: u64,
    pub active_ports_after: usize,
    /// Probe outcomes: double accepts, accepts on active CEPs, SIDR ends,
    /// CID slots checked.
    pub probes: BTreeMap<&'static str, u64>,
    /// The end check of each CM port (routes, live connections, comm ids).
    pub ports: Vec<String>,
    /// The end check of each HCA's object counts (all 0 when nothing leaked).
    pub usage: Vec<String>,
    /// Workers that did not finish within [`STUCK_LIMIT`](super::STUCK_LIMIT) of the end, and
    /// the action each was in (a deadlock): nothing is closed then.
    pub stuck_workers: Vec<(usize, String)>,
    pub failure_count: u64,
    pub failures: Vec<String>,
}

impl StressReport {
    /// Whether the run found nothing wrong.
    pub fn ok(&self) -> bool {
        self.failure_count == 0 && self.stuck_workers.is_empty()
    }

    fn live_total(&self) -> usize {
        self.objects.iter().map(|o| o.2).sum()
    }

    /// A human-readable summary.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "ibal stress: {} threads for {:.1} s on {} {}, seed {}, faults drop {} dup {} reorder {} delay {}{}\n\n",
            c.threads,
            self.elapsed_s,
            c.hcas,
            match self.transport {
                Transport::Soft => "soft HCAs",
                Transport::Udp => "RoCEv2 ports (UDP on loopback)",
            },
            c.seed,
            c.drop,
            c.duplicate,
            c.reorder,
            c.delay,
            if c.static_listens { ", static listens" } else { "" }
        );
        out.push_str("  operation              total  outcomes\n");
        for (op, outcomes) in &self.ops {
            let total: u64 = outcomes.values().sum();
            let detail: Vec<String> = outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out.push_str(&format!("  {op:<20} {total:>8}  {}\n", detail.join(", ")));
        }
        out.push_str("\n  CM events:");
        for (k, v) in &self.events {
            out.push_str(&format!(" {k} {v},"));
        }
        out.pop();
        out.push_str(&format!(
            "\n  fabric: {} delivered, {} dropped, {} duplicated, {} reordered, {} delayed ({} progress ticks)\n",
            self.fabric.delivered,
            self.fabric.dropped_fault,
            self.fabric.duplicated,
            self.fabric.reordered,
            self.fabric.delayed,
            self.ticks
        ));
        out.push_str("\n  probes:");
        for (k, v) in &self.probes {
            out.push_str(&format!(" {k} {v},"));
        }
        out.pop();
        out.push('\n');
        for line in &self.ports {
            out.push_str(&format!("  CM port at the end: {line}\n"));
        }
        for line in &self.usage {
            out.push_str(&format!("  HCA at the end: {line}\n"));
        }
        if let Some(p) = &self.population {
            out.push('\n');
            out.push_str(&p.to_text());
        }
        out.push_str("\n  object kind       created  live after close\n");
        for (k, created, live) in &self.objects {
            out.push_str(&format!("  {k:<14} {created:>10}  {live:>8}\n"));
        }
        out.push_str(&format!(
            "\n  ALs opened {} / closed {}; destroy callbacks {} (twice {}, never {}); callback panics {}; CM agents left {}\n",
            self.als_opened,
            self.als_closed,
            self.destroy_callbacks,
            self.destroy_callbacks_twice,
            self.destroy_callbacks_never,
            self.callback_panics,
            self.active_ports_after
        ));
        for (id, action) in &self.stuck_workers {
            out.push_str(&format!(
                "  STUCK: worker {id} never returned from {action} (deadlock?); ALs were not closed\n"
            ));
        }
        if self.ok() {
            out.push_str(&format!(
                "  result: PASS ({} live objects after close, no failures)\n",
                self.live_total()
            ));
        } else {
            out.push_str(&format!(
                "  result: FAIL ({} failures)\n",
                self.failure_count
            ));
            for f in &self.failures {
                out.push_str(&format!("    - {f}\n"));
            }
        }
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        fn esc(s: &str) -> String {
            s.chars()
                .flat_map(|c| match c {
                    '"' => "\\\"".chars().collect::<Vec<_>>(),
                    '\\' => "\\\\".chars().collect(),
                    c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
                    c => vec![c],
                })
                .collect()
        }
        let c = &self.config;
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|(op, outcomes)| {
                let o: Vec<String> = outcomes
                    .iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("\"{}\":{{{}}}", esc(op), o.join(","))
            })
            .collect();
        let events: Vec<String> = self
            .events
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        let objects: Vec<String> = self
            .objects
            .iter()
            .map(|(k, created, live)| format!("\"{k}\":{{\"created\":{created},\"live\":{live}}}"))
            .collect();
        let failures: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("\"{}\"", esc(f)))
            .collect();
        let f = &self.fabric;
        format!(
            "{{\"job\":\"stress\",\"transport\":\"{}\",\"ok\":{},\"seconds\":{:.3},\"threads\":{},\"hcas\":{},\"seed\":{},\"drop\":{},\"dup\":{},\"reorder\":{},\"delay\":{},\"ops\":{{{}}},\"events\":{{{}}},\"objects\":{{{}}},\"population\":{},\"live_after_close\":{},\"als_opened\":{},\"als_closed\":{},\"destroy_callbacks\":{},\"destroy_callbacks_twice\":{},\"destroy_callbacks_never\":{},\"callback_panics\":{},\"fabric\":{{\"delivered\":{},\"dropped\":{},\"duplicated\":{},\"reordered\":{},\"delayed\":{},\"ticks\":{}}},\"active_ports_after\":{},\"probes\":{{{}}},\"ports\":[{}],\"usage\":[{}],\"stuck_workers\":[{}],\"failure_count\":{},\"failures\":[{}]}}",
            self.transport.name(),
            self.ok(),
            self.elapsed_s,
            c.threads,
            c.hcas,
            c.seed,
            c.drop,
            c.duplicate,
            c.reorder,
            c.delay,
            ops.join(","),
            events.join(","),
            objects.join(","),
            self.population
                .as_ref()
                .map_or("null".to_string(), |p| p.to_json(esc)),
            self.live_total(),
            self.als_opened,
            self.als_closed,
            self.destroy_callbacks,
            self.destroy_callbacks_twice,
            self.destroy_callbacks_never,
            self.callback_panics,
            f.delivered,
            f.dropped_fault,
            f.duplicated,
            f.reordered,
            f.delayed,
            self.ticks,
            self.active_ports_after,
            self.probes
                .iter()
                .map(|(k, v)| format!("\"{}\":{v}", esc(k)))
                .collect::<Vec<_>>()
                .join(","),
            self.ports
                .iter()
                .map(|l| format!("\"{}\"", esc(l)))
                .collect::<Vec<_>>()
                .join(","),
            self.usage
                .iter()
                .map(|l| format!("\"{}\"", esc(l)))
                .collect::<Vec<_>>()
                .join(","),
            self.stuck_workers
                .iter()
                .map(|(id, a)| format!("{{\"worker\":{id},\"action\":\"{}\"}}", esc(a)))
                .collect::<Vec<_>>()
                .join(","),
            self.failure_count,
            failures.join(",")
        )
    }
}
