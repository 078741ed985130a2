//! `ibal perf lookup`: resolve-and-release cost of the handle table against
//! the usual alternatives, measured in one run on the same objects.
//!
//! Each contender maps handles to `Arc`-owned objects. One operation is
//! "resolve a handle, read one field of the object, release the
//! reference". Every thread creates its own objects (distinct handles per
//! thread, as an application's threads each drive their own QPs) and cycles
//! through them.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use al::{HandleTable, Kind, RawHandle};

use super::json_f64;
use parking_lot::RwLock;

/// The object every contender stores: a cache line, like a small verbs object.
pub struct BenchObject {
    value: u64,
    _rest: [u64; 7],
}

impl BenchObject {
    fn new(value: u64) -> Self {
        BenchObject {
            value,
            _rest: [0; 7],
        }
    }
}

/// One contender's interface: build with objects, then resolve by key.
pub(crate) trait Contender: Sync {
    fn name(&self) -> &'static str;
    /// Insert `n` objects from the calling thread; returns their keys.
    fn populate(&self, n: usize) -> Vec<u64>;
    /// Resolve, read, release; returns the value read.
    fn lookup(&self, key: u64) -> u64;
}

struct IbalTable(HandleTable<BenchObject>);
impl Contender for IbalTable {
    fn name(&self) -> &'static str {
        "ibal HandleTable::get"
    }
    fn populate(&self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| {
                self.0
                    .insert(Arc::new(BenchObject::new(i as u64)))
                    .expect("bench table has room")
                    .as_u64()
            })
            .collect()
    }
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        match self.0.get(RawHandle::from_u64(key)) {
            Ok(r) => r.value,
            Err(_) => u64::MAX,
        }
    }
}

struct Sharded(sharded_slab::Slab<Arc<BenchObject>>);
impl Contender for Sharded {
    fn name(&self) -> &'static str {
        "sharded-slab Slab::get"
    }
    fn populate(&self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| {
                self.0
                    .insert(Arc::new(BenchObject::new(i as u64)))
                    .expect("sharded slab has room") as u64
            })
            .collect()
    }
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        match self.0.get(key as usize) {
            Some(e) => e.value,
            None => u64::MAX,
        }
    }
}

struct LockedMap {
    map: RwLock<HashMap<u64, Arc<BenchObject>>>,
    next: std::sync::atomic::AtomicU64,
}
impl Contender for LockedMap {
    fn name(&self) -> &'static str {
        "RwLock<HashMap<u64, Arc<T>>>"
    }
    fn populate(&self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| {
                let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.map
                    .write()
                    .insert(key, Arc::new(BenchObject::new(i as u64)));
                key
            })
            .collect()
    }
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        let obj = self.map.read().get(&key).cloned();
        match obj {
            Some(o) => o.value,
            None => u64::MAX,
        }
    }
}

struct LockedSlab(RwLock<slab::Slab<Arc<BenchObject>>>);
impl Contender for LockedSlab {
    fn name(&self) -> &'static str {
        "RwLock<Slab<Arc<T>>>"
    }
    fn populate(&self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| self.0.write().insert(Arc::new(BenchObject::new(i as u64))) as u64)
            .collect()
    }
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        let obj = self.0.read().get(key as usize).cloned();
        match obj {
            Some(o) => o.value,
            None => u64::MAX,
        }
    }
}

/// Not a table: a dependent chain of integer mixing on the key, touching no
/// shared memory, about as long as one table lookup. How much two threads
/// of it gain over one is what this machine offers at that moment (a
/// shared or SMT-backed vCPU gives less than 2x); it is the ceiling the
/// tables' scaling is read against.
struct Arithmetic;
impl Contender for Arithmetic {
    fn name(&self) -> &'static str {
        MACHINE_BASELINE
    }
    fn populate(&self, n: usize) -> Vec<u64> {
        (0..n as u64).collect()
    }
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        let mut x = key ^ 0x9e37_79b9_7f4a_7c15;
        for _ in 0..12 {
            x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        }
        x
    }
}

/// The name of the machine-ceiling baseline.
pub(crate) const MACHINE_BASELINE: &str = "baseline: arithmetic, no memory";

/// Settings of one `perf lookup` run.
#[derive(Clone, Debug)]
pub struct LookupConfig {
    /// The multi-thread point (the single-thread point is always measured).
    pub threads: usize,
    /// Objects per thread.
    pub objects_per_thread: usize,
    /// Lookups per thread per timed round.
    pub ops_per_thread: u64,
    /// Timed rounds per point; the fastest is kept (noise only adds time).
    pub rounds: usize,
}

impl Default for LookupConfig {
    fn default() -> Self {
        LookupConfig {
            threads: 2,
            objects_per_thread: 1024,
            ops_per_thread: 4_000_000,
            rounds: 5,
        }
    }
}

/// One contender at one thread count.
#[derive(Clone, Debug)]
pub struct Point {
    pub contender: &'static str,
    pub threads: usize,
    /// Wall time per lookup as seen by one thread.
    pub ns_per_op: f64,
    /// All threads together.
    pub mops_per_sec: f64,
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct LookupReport {
    pub config: LookupConfig,
    pub points: Vec<Point>,
}

impl LookupReport {
    fn point(&self, contender: &str, threads: usize) -> Option<&Point> {
        self.points
            .iter()
            .find(|p| p.contender == contender && p.threads == threads)
    }

    /// ibal single-thread ns/op divided by sharded-slab's (target: <= 1.0).
    pub fn single_thread_ratio_vs_sharded_slab(&self) -> Option<f64> {
        let ours = self.point("ibal HandleTable::get", 1)?;
        let theirs = self.point("sharded-slab Slab::get", 1)?;
        Some(ours.ns_per_op / theirs.ns_per_op)
    }

    /// ibal N-thread throughput divided by its 1-thread throughput (target: >= 1.6 at 2).
    pub fn ibal_scaling(&self) -> Option<f64> {
        let one = self.point("ibal HandleTable::get", 1)?;
        let many = self.point("ibal HandleTable::get", self.config.threads)?;
        Some(many.mops_per_sec / one.mops_per_sec)
    }

    /// The arithmetic baseline's N-thread over 1-thread throughput: the
    /// most any contender could scale on this machine in this run.
    pub fn machine_scaling(&self) -> Option<f64> {
        let one = self.point(MACHINE_BASELINE, 1)?;
        let many = self.point(MACHINE_BASELINE, self.config.threads)?;
        Some(many.mops_per_sec / one.mops_per_sec)
    }

    /// Human-readable table.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "perf lookup: resolve + read + release, {} objects per thread, {} lookups per thread per round, best of {} rounds\n\n",
            self.config.objects_per_thread, self.config.ops_per_thread, self.config.rounds
        );
        out.push_str(&format!(
            "{:<32} {:>7} {:>10} {:>12}\n",
            "contender", "threads", "ns/op", "Mops/s total"
        ));
        for p in &self.points {
            out.push_str(&format!(
                "{:<32} {:>7} {:>10.2} {:>12.1}\n",
                p.contender, p.threads, p.ns_per_op, p.mops_per_sec
            ));
        }
        if let Some(r) = self.single_thread_ratio_vs_sharded_slab() {
            out.push_str(&format!(
                "\nibal / sharded-slab, 1 thread: {r:.2}x the time per lookup (target <= 1.00)\n"
            ));
        }
        if let Some(s) = self.ibal_scaling() {
            out.push_str(&format!(
                "ibal {}-thread / 1-thread throughput: {s:.2}x (target >= 1.60 at 2 threads)\n",
                self.config.threads
            ));
        }
        if let (Some(m), Some(s)) = (self.machine_scaling(), self.ibal_scaling()) {
            out.push_str(&format!(
                "machine ceiling (arithmetic, no memory) {}-thread / 1-thread: {m:.2}x; ibal reaches {:.0}% of it\n",
                self.config.threads,
                100.0 * s / m
            ));
        }
        out
    }

    /// One JSON object: ns/op of each contender at each thread count, plus the ratios.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\"benchmark\":\"lookup\",");
        s.push_str(&format!(
            "\"threads\":{},\"objects_per_thread\":{},\"ops_per_thread\":{},\"rounds\":{},\"results\":[",
            self.config.threads,
            self.config.objects_per_thread,
            self.config.ops_per_thread,
            self.config.rounds
        ));
        for (i, p) in self.points.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                "{{\"contender\":\"{}\",\"threads\":{},\"ns_per_op\":{:.3},\"mops_per_sec\":{:.3}}}",
                p.contender, p.threads, p.ns_per_op, p.mops_per_sec
            ));
        }
        s.push_str("],");
        s.push_str(&format!(
            "\"ibal_vs_sharded_slab_single_thread\":{},\"ibal_scaling\":{},\"machine_scaling\":{}}}",
            self.single_thread_ratio_vs_sharded_slab()
                .map_or("null".into(), |r| json_f64(r, 4)),
            self.ibal_scaling()
                .map_or("null".into(), |r| json_f64(r, 4)),
            self.machine_scaling()
                .map_or("null".into(), |r| json_f64(r, 4))
        ));
        s
    }
}

pub(crate) fn contenders() -> Vec<Box<dyn Contender>> {
    vec![
        Box::new(IbalTable(HandleTable::new(Kind::custom(19)))),
        Box::new(Sharded(sharded_slab::Slab::new())),
        Box::new(LockedMap {
            map: RwLock::new(HashMap::new()),
            next: std::sync::atomic::AtomicU64::new(1),
        }),
        Box::new(LockedSlab(RwLock::new(slab::Slab::new()))),
        Box::new(Arithmetic),
    ]
}

/// Time one round: every thread populates its own objects, waits at the
/// barrier, then runs its lookups. Returns the slowest thread's time.
fn round(c: &dyn Contender, threads: usize, cfg: &LookupConfig) -> Duration {
    let start = Barrier::new(threads);
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let keys = c.populate(cfg.objects_per_thread);
                    let mask = keys.len() - 1;
                    start.wait();
                    let t0 = Instant::now();
                    let mut sum = 0u64;
                    for i in 0..cfg.ops_per_thread {
                        sum = sum.wrapping_add(c.lookup(keys[i as usize & mask]));
                    }
                    black_box(sum);
                    t0.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    times.into_iter().max().unwrap_or_default()
}

/// Run the benchmark.
pub fn run(cfg: &LookupConfig) -> LookupReport {
    assert!(cfg.objects_per_thread.is_power_of_two());
    let mut thread_counts = vec![1];
    if cfg.threads > 1 {
        thread_counts.push(cfg.threads);
    }
    let mut points = Vec::new();
    for &threads in &thread_counts {
        // Fresh structures per thread count; rounds interleave contenders so
        // a burst of machine noise hits them alike.
        let cs = contenders();
        let mut best = vec![Duration::MAX; cs.len()];
        for _ in 0..cfg.rounds {
            for (i, c) in cs.iter().enumerate() {
                best[i] = best[i].min(round(c.as_ref(), threads, cfg));
            }
        }
        for (c, t) in cs.iter().zip(best) {
            let ns_per_op = t.as_nanos() as f64 / cfg.ops_per_thread as f64;
            points.push(Point {
                contender: c.name(),
                threads,
                ns_per_op,
                mops_per_sec: threads as f64 * 1e3 / ns_per_op,
            });
        }
    }
    LookupReport {
        config: cfg.clone(),
        points,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_resolves_what_it_stored() {
        for c in contenders()
            .into_iter()
            .filter(|c| c.name() != MACHINE_BASELINE)
        {
            let keys = c.populate(64);
            for (i, k) in keys.iter().enumerate() {
                assert_eq!(c.lookup(*k), i as u64, "{}", c.name());
            }
        }
    }

    #[test]
    fn a_tiny_run_reports_every_contender_and_valid_json() {
        let report = run(&LookupConfig {
            threads: 2,
            objects_per_thread: 16,
            ops_per_thread: 1000,
            rounds: 1,
        });
        assert_eq!(report.points.len(), 10);
        assert!(report.machine_scaling().is_some());
        assert!(report.points.iter().all(|p| p.ns_per_op > 0.0));
        let json = report.to_json();
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(json.contains("\"sharded-slab Slab::get\""));
        assert!(report.to_text().contains("ibal HandleTable::get"));
    }
}
