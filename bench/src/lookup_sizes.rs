//! `ibal perf lookup --sizes`: how the cost of one resolve + read + release
//! grows with the number of live handles, on one thread, every contender
//! of [`crate::lookup`] measured at every size in the same run (fresh
//! structures per size; the rounds interleave the contenders).
//!
//! The thread cycles through all its keys, in insertion order or (with
//! `random_order`) in one fixed shuffled order: in insertion order the
//! objects stream through the caches as a server walking its connections
//! would; shuffled, every lookup at a million handles misses the caches,
//! which no table can avoid (the object itself is read), so the growth of
//! the baselines beside ours says what the memory costs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::json_f64;
use crate::lookup::{contenders, Contender, MACHINE_BASELINE};

/// Settings of a `--sizes` run.
#[derive(Clone, Debug)]
pub struct SizesConfig {
    /// Live handles at each point.
    pub sizes: Vec<usize>,
    /// Lookups per timed round.
    pub ops: u64,
    /// Rounds; the fastest is kept.
    pub rounds: usize,
    /// Cycle through the keys in a shuffled order.
    pub random_order: bool,
}

/// ns per lookup of each contender at each size.
#[derive(Clone, Debug)]
pub struct SizesReport {
    pub config: SizesConfig,
    /// (contender, size, ns per op).
    pub points: Vec<(&'static str, usize, f64)>,
}

impl SizesReport {
    fn ns(&self, contender: &str, size: usize) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.0 == contender && p.1 == size)
            .map(|p| p.2)
    }

    /// A contender's ns at the largest size over its ns at the smallest.
    pub fn growth(&self, contender: &str) -> Option<f64> {
        let min = *self.config.sizes.iter().min()?;
        let max = *self.config.sizes.iter().max()?;
        Some(self.ns(contender, max)? / self.ns(contender, min)?)
    }

    fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for p in &self.points {
            if !names.contains(&p.0) {
                names.push(p.0);
            }
        }
        names
    }

    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "perf lookup --sizes: resolve + read + release on one thread, keys cycled {}, {} lookups per round, best of {} rounds\n\n{:<32}",
            if c.random_order { "in a shuffled order" } else { "in insertion order" },
            c.ops,
            c.rounds,
            "contender \\ live handles"
        );
        for size in &c.sizes {
            s.push_str(&format!(" {size:>10}"));
        }
        s.push_str("     growth\n");
        for name in self.names() {
            s.push_str(&format!("{name:<32}"));
            for &size in &c.sizes {
                s.push_str(&format!(
                    " {:>10.2}",
                    self.ns(name, size).unwrap_or(f64::NAN)
                ));
            }
            s.push_str(&format!(
                " {:>9.2}x\n",
                self.growth(name).unwrap_or(f64::NAN)
            ));
        }
        s.push_str(&format!(
            "\nibal HandleTable::get at the largest size / the smallest: {:.2}x (target <= 1.30 from 1,000 to 1,000,000)\n",
            self.growth("ibal HandleTable::get").unwrap_or(f64::NAN)
        ));
        s
    }

    pub fn to_json(&self) -> String {
        let pts: Vec<String> = self
            .points
            .iter()
            .map(|(c, size, ns)| {
                format!(
                    "{{\"contender\":\"{c}\",\"live_handles\":{size},\"ns_per_op\":{}}}",
                    json_f64(*ns, 3)
                )
            })
            .collect();
        let growth: Vec<String> = self
            .names()
            .iter()
            .map(|n| {
                format!(
                    "\"{n}\":{}",
                    json_f64(self.growth(n).unwrap_or(f64::NAN), 4)
                )
            })
            .collect();
        format!(
            "{{\"benchmark\":\"lookup-sizes\",\"random_order\":{},\"ops\":{},\"rounds\":{},\"results\":[{}],\"growth\":{{{}}}}}",
            self.config.random_order,
            self.config.ops,
            self.config.rounds,
            pts.join(","),
            growth.join(",")
        )
    }
}

/// A fixed shuffle (xorshift-driven Fisher-Yates): the same order every
/// run, so rounds and contenders see the same pattern.
fn shuffle(keys: &mut [u64]) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..keys.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

fn time_lookups(c: &dyn Contender, keys: &[u64], ops: u64) -> Duration {
    let t0 = Instant::now();
    let (mut sum, mut j) = (0u64, 0usize);
    for _ in 0..ops {
        sum = sum.wrapping_add(c.lookup(keys[j]));
        j += 1;
        if j == keys.len() {
            j = 0;
        }
    }
    black_box(sum);
    t0.elapsed()
}

/// Runs the sizes comparison.
pub fn run_sizes(cfg: &SizesConfig) -> Result<SizesReport, String> {
    if cfg.sizes.is_empty() || cfg.sizes.contains(&0) || cfg.rounds == 0 || cfg.ops == 0 {
        return Err("--sizes needs sizes >= 1, --rounds and --ops >= 1".into());
    }
    if let Some(&big) = cfg.sizes.iter().find(|&&s| s > 1 << 24) {
        return Err(format!("--sizes {big}: at most 16777216 live handles"));
    }
    let mut points = Vec::new();
    for &size in &cfg.sizes {
        let cs = contenders();
        let keys: Vec<Vec<u64>> = cs
            .iter()
            .map(|c| {
                let mut k = c.populate(size);
                if cfg.random_order {
                    shuffle(&mut k);
                }
                k
            })
            .collect();
        let mut best = vec![Duration::MAX; cs.len()];
        for _ in 0..cfg.rounds {
            for (i, c) in cs.iter().enumerate() {
                best[i] = best[i].min(time_lookups(c.as_ref(), &keys[i], cfg.ops));
            }
        }
        for (c, t) in cs.iter().zip(best) {
            if c.name() == MACHINE_BASELINE {
                continue;
            }
            points.push((c.name(), size, t.as_nanos() as f64 / cfg.ops as f64));
        }
    }
    Ok(SizesReport {
        config: cfg.clone(),
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_sizes_run_covers_every_contender_at_every_size() {
        let r = run_sizes(&SizesConfig {
            sizes: vec![10, 300],
            ops: 1000,
            rounds: 1,
            random_order: true,
        })
        .unwrap();
        assert_eq!(r.points.len(), 2 * (contenders().len() - 1));
        assert!(r.growth("ibal HandleTable::get").is_some_and(|g| g > 0.0));
        assert!(r.to_json().contains("\"live_handles\":300"));
        assert!(r.to_text().contains("growth"));
        assert!(run_sizes(&SizesConfig {
            sizes: vec![],
            ..r.config.clone()
        })
        .is_err());
    }

    #[test]
    fn the_shuffle_is_a_fixed_permutation() {
        let mut a: Vec<u64> = (0..1000).collect();
        let mut b = a.clone();
        shuffle(&mut a);
        shuffle(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..1000).collect::<Vec<_>>());
    }
}
