//! Progress of the fabric: delivering queued packets (fault injection) and
//! retrying senders an RNR NAK holds, on a tick or when a receive is posted.

use crate::engine::retry_pending;
use crate::node::FabricInner;
use crate::qp::{Deferred, QpInner, SendQueue};
use crate::respond::deliver;
use al::sync::atomic::Ordering;

impl FabricInner {
    pub(crate) fn progress(&self) -> usize {
        let mut ready = Vec::new();
        if let Some(fs) = self.faults.lock().as_mut() {
            let n = fs.queue.len();
            for _ in 0..n {
                let mut p = fs.queue.pop_front().expect("counted");
                if p.hold > 0 {
                    p.hold -= 1;
                    fs.queue.push_back(p);
                } else {
                    ready.push(p);
                }
            }
        }
        let work = ready.len();
        for p in &ready {
            let mut d = Deferred::new();
            deliver(self, p, &mut d);
            d.run();
        }
        work + self.retry_rnr_waiters(|_| true, true)
    }

    /// A receive was posted to a queue a sender had found empty: let the
    /// senders waiting for an RNR retry whose destination QP `takes_it`
    /// says draws from that queue look again now (without spending a
    /// retry).
    pub(crate) fn wake_rnr_waiters(&self, takes_it: impl Fn(&QpInner) -> bool) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.retry_rnr_waiters(
            |sq| {
                let dest = sq.attr.av.and_then(|av| self.route(&av));
                dest.and_then(|(node, dport)| node.lookup(sq.attr.dest_qpn, dport))
                    .is_some_and(|d| takes_it(&d))
            },
            false,
        );
    }

    /// Retry the RNR waiters `wanted` picks (one retry each, counted
    /// against `rnr_retry` if `charge`); returns the work done. A wake that
    /// comes while this runs may have found the list without the senders
    /// taken out here: if one came, everyone left looks once more (bounded
    /// rounds; what is left waits for the next wake or tick).
    fn retry_rnr_waiters(&self, wanted: impl Fn(&SendQueue) -> bool, charge: bool) -> usize {
        let mut work = 0;
        let mut filtered = true;
        let mut charge = charge;
        for _round in 0..8 {
            let seen = self.wakes.load(Ordering::SeqCst);
            let waiters = std::mem::take(&mut *self.waiters.lock());
            let mut keep = Vec::new();
            for qp in waiters {
                if qp.destroyed.load(Ordering::Acquire) {
                    continue;
                }
                let mut d = Deferred::new();
                {
                    let mut sq = qp.sq.lock();
                    if filtered && !wanted(&sq) {
                        drop(sq);
                        keep.push(qp);
                        continue;
                    }
                    let before = sq.pending.len();
                    let still = retry_pending(self, &qp, &mut sq, &mut d, charge);
                    work += before - sq.pending.len();
                    if still {
                        // Still waiting counts as work, so `settle` goes on.
                        work += 1;
                        keep.push(qp.clone());
                    } else {
                        sq.in_retry = false;
                    }
                }
                d.run();
            }
            self.waiters.lock().extend(keep);
            if self.wakes.load(Ordering::SeqCst) == seen {
                break;
            }
            (filtered, charge) = (false, false);
        }
        work
    }
}
