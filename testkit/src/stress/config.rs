//! What a stress run is told, and its one time limit every part shares.

use std::time::Duration;

/// How long closing one AL may take before the run calls it hung.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(30);

/// Settings of one stress run.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// How long the workers run.
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
    /// Fault probabilities for UD/GSI/UC packets (the CM MADs).
    pub drop: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Probability a packet is held for 1..=3 progress ticks.
    pub delay: f64,
    /// Seed of the worker generators, the callbacks and the fabric faults.
    pub seed: u64,
    /// Soft HCAs on the fabric.
    pub hcas: usize,
    /// Create every listen once, before the workers start, in a listener
    /// AL of its own (with a pool of QPs per HCA to accept on), instead of
    /// letting the workers listen and cancel at random. Avoids calling
    /// `cm::listen` while CM traffic flows (see `docs/stress.md`, known
    /// bugs).
    pub static_listens: bool,
    /// Limit every HCA to this many PDs, CQs, QPs (its GSI QP included),
    /// SRQs, AVs and MRs: creations keep meeting `InsufficientResources`
    /// and the workers exhaust the PDs on purpose.
    pub max_objects: Option<u32>,
    /// `Transport::Udp`: every RoCEv2 device's `max_qp` (its GSI QP
    /// included; default: `RoceLimits`'). Soft HCAs: `max_objects`.
    pub max_qp: Option<u32>,
    /// RC connections a population AL of its own makes before the workers
    /// start and holds while they churn (`population`); each must still
    /// be established at the end. 0: none.
    pub population: u32,
    /// A self-test of the population check: halfway through the run, the
    /// run itself disconnects this many held connections (alternately
    /// from the active and the passive side), and the end check must
    /// report each as disturbed. 0 in every real run.
    pub disturb_population: u32,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            seconds: 10.0,
            threads: 4,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            seed: 1,
            hcas: 4,
            static_listens: false,
            max_objects: None,
            max_qp: None,
            population: 0,
            disturb_population: 0,
        }
    }
}
