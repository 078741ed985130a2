//! The benchmarks behind `ibal perf` (the command parses the flags and
//! prints the reports; everything measured is here). Each one measures a
//! baseline in the same run and reports ratios against it, because the
//! machines are shared (`docs/benchmarks.md`).
//!
//! * [`lookup`]: handle resolve+release against sharded-slab and locked maps;
//! * [`verbs`]: RC WRITE bandwidth and SEND rate on two soft HCAs;
//! * [`udp`]: the same and the SEND ping-pong on two RoCEv2 ports on
//!   loopback, against raw UDP (or on an RDMA device: `--device`);
//! * [`flood`]: that ping-pong while a stranger floods the receiving port;
//! * [`conn`]: CM connect latency and rate (soft fabric, or RoCEv2 over
//!   UDP in [`conn::udp`]); `conn_rdma` (feature `rdma`) the same through librdmacm;
//! * [`placement`]: pinning the polling threads to CPUs;
//! * [`scale`]: N connections held: memory, idle cost, teardown.

pub mod conn;
#[cfg(feature = "rdma")]
pub mod conn_rdma;
pub mod flood;
pub mod lookup;
pub mod lookup_sizes;
pub mod placement;
pub mod scale;
pub mod udp;
pub mod verbs;

use al::{Al, Handle};
use hca::verbs::Cq;
use provider::{Wc, WcStatus};

/// Errors are reported as text (they end up on the command line).
pub type BenchResult<T> = Result<T, String>;

/// Polls per expected completion before giving up (the soft provider
/// completes synchronously, so one poll suffices unless something is wrong).
const POLL_LIMIT: u32 = 1_000_000;

/// Turn an access-layer error into the benchmark's error text.
fn al_err(what: &'static str) -> impl FnOnce(al::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Poll `cq` until one completion arrives; an error status is an error.
fn poll_one(al: &Al, cq: Handle<Cq>, wc: &mut [Wc; 1]) -> BenchResult<Wc> {
    for _ in 0..POLL_LIMIT {
        if hca::verbs::poll_cq(al, cq, wc).map_err(al_err("poll_cq"))? == 1 {
            if wc[0].status != WcStatus::Success {
                return Err(format!(
                    "work request {} completed with {:?}",
                    wc[0].wr_id, wc[0].status
                ));
            }
            return Ok(wc[0]);
        }
    }
    Err(format!("no completion after {POLL_LIMIT} polls"))
}

/// A JSON number with `decimals` digits, or `null` when not finite.
fn json_f64(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "null".into()
    }
}

/// Whether braces and brackets balance (the tests' check that `--json`
/// printed one well-formed object).
#[cfg(test)]
fn balanced(json: &str) -> bool {
    let mut depth = 0i32;
    for c in json.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}
