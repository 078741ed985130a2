//! What the population did: its summary lines and its JSON object.

use super::{IN_FLIGHT, QUEUE_DEPTH};

/// How making the population went.
#[derive(Clone, Debug, Default)]
pub struct PopulationReport {
    /// Connections asked for.
    pub size: u32,
    /// Connections up on both sides before the workers started.
    pub established: u32,
    /// Time to make them, s.
    pub establish_s: f64,
    /// Connections still established on both sides (CM state and QP
    /// state) once the workers stopped.
    pub held: u32,
    /// Established connections the churn disturbed: (connection, what).
    /// The first 32 (`KEEP_NOTES`) in words; `disturbed_count` counts all.
    pub disturbed: Vec<(u32, String)>,
    pub disturbed_count: u32,
    /// Held connections whose DREQ ended, and how many of those by
    /// running out of retries instead of a DREP.
    pub disconnected: u32,
    pub dreq_timeouts: u32,
    /// Time to disconnect the held ones, s.
    pub disconnect_s: f64,
    /// Time to close the population's AL, s.
    pub close_s: f64,
    /// Problems making or ending it, in words (the first 32 (`KEEP_NOTES`)).
    pub problems: Vec<String>,
    /// The connections the run disconnected itself
    /// (`StressConfig::disturb_population`, a self-test of the check).
    pub disturbed_on_purpose: Vec<u32>,
}

impl PopulationReport {
    /// The summary lines.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "  population: {} of {} RC connections established in {:.2} s ({IN_FLIGHT} connects in flight, {QUEUE_DEPTH}-deep queues)\n",
            self.established, self.size, self.establish_s
        );
        out.push_str(&format!(
            "  population: {} held through the churn (both CEPs ESTABLISHED, both QPs RTS), {} disturbed\n",
            self.held, self.disturbed_count
        ));
        if !self.disturbed_on_purpose.is_empty() {
            out.push_str(&format!(
                "  population: self-test disconnected {:?} mid-run\n",
                self.disturbed_on_purpose
            ));
        }
        for (i, what) in &self.disturbed {
            out.push_str(&format!("    disturbed {i}: {what}\n"));
        }
        out.push_str(&format!(
            "  population: {} disconnected in {:.2} s ({} DREQs ran out of retries), AL closed in {:.2} s\n",
            self.disconnected, self.disconnect_s, self.dreq_timeouts, self.close_s
        ));
        for p in &self.problems {
            out.push_str(&format!("    problem: {p}\n"));
        }
        out
    }

    /// One JSON object; `esc` escapes a string.
    pub fn to_json(&self, esc: impl Fn(&str) -> String) -> String {
        let disturbed: Vec<String> = self
            .disturbed
            .iter()
            .map(|(i, w)| format!("{{\"connection\":{i},\"what\":\"{}\"}}", esc(w)))
            .collect();
        let problems: Vec<String> = self
            .problems
            .iter()
            .map(|p| format!("\"{}\"", esc(p)))
            .collect();
        let on_purpose: Vec<String> = self
            .disturbed_on_purpose
            .iter()
            .map(|i| i.to_string())
            .collect();
        format!(
            "{{\"size\":{},\"established\":{},\"establish_s\":{:.3},\"in_flight\":{IN_FLIGHT},\"queue_depth\":{QUEUE_DEPTH},\"held\":{},\"disturbed_count\":{},\"disturbed\":[{}],\"disturbed_on_purpose\":[{}],\"disconnected\":{},\"dreq_timeouts\":{},\"disconnect_s\":{:.3},\"close_s\":{:.3},\"problems\":[{}]}}",
            self.size,
            self.established,
            self.establish_s,
            self.held,
            self.disturbed_count,
            disturbed.join(","),
            on_purpose.join(","),
            self.disconnected,
            self.dreq_timeouts,
            self.disconnect_s,
            self.close_s,
            problems.join(",")
        )
    }
}
