//! Buffers in flight on the `rdma` provider: the bytes posted work
//! requests name are leased in their memory's [`InFlight`] record from the
//! post until the request's completion (or its QP's reset or destruction),
//! so a `RegisteredBuffer`'s mutating accessors refuse them, as on the
//! other providers (`docs/memory.md`).
//!
//! The device moves the data by itself, so unlike the soft and RoCEv2
//! providers (which see each request leave its queue) this one learns that
//! a request finished only from its completion: every posted request is
//! recorded in its queue (send, receive, SRQ) with the leases it took, and
//! `poll_cq` releases them. A send completion releases every earlier send
//! of its QP too (unsignaled sends complete silently, in order); a
//! receive completion releases its QP's receives up to it (in order), or
//! its own entry on an SRQ (any order). A QP reset or destroyed releases
//! its queues; an MR deregistered ends its leases
//! ([`InFlight::remove_span`]).
//!
//! [`InFlight`]: provider::buffer::for_providers::InFlight
//! [`InFlight::remove_span`]: provider::buffer::for_providers::InFlight::remove_span

use al::sync::{Arc, Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};

use al::sync::atomic::{AtomicBool, Ordering};
use provider::buffer::for_providers::{Lease, Memory, Span};
use provider::{Sge, Wc, WcOpcode, WcStatus};

/// The leases one request holds.
type Held = Vec<(Arc<Memory>, Lease)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

fn release(held: Held) {
    for (mem, lease) in held {
        mem.in_flight.unhold(&lease);
    }
}

struct MrEntry {
    mem: Arc<Memory>,
    span: Span,
    gone: Arc<AtomicBool>,
}

/// A device's MRs by lkey and its QPs' queues by QP number.
#[derive(Default)]
pub(crate) struct Leases {
    mrs: Mutex<HashMap<u32, MrEntry>>,
    qps: Mutex<HashMap<u32, Arc<QpTrack>>>,
}

/// The requests of one queue, in posting order, with their leases.
#[derive(Default)]
pub(crate) struct Track {
    entries: Mutex<VecDeque<(u64, Held)>>,
    /// Held across record-then-post, so that the requests a failed post
    /// did not take are the last entries.
    posting: Mutex<()>,
}

impl Track {
    /// Record `reqs` (wr_id, scatter/gather list) with their leases, then
    /// `post` them; `post` says how many the device took. The rest are
    /// dropped again. Recording first means a completion polled on
    /// another thread right after the post finds its entry.
    pub(crate) fn post<R>(
        &self,
        leases: &Leases,
        reqs: &[(u64, &[Sge])],
        post: impl FnOnce() -> (usize, R),
    ) -> R {
        let _posting = lock(&self.posting);
        for (wr_id, sges) in reqs {
            self.push(*wr_id, leases.take(sges));
        }
        let (taken, r) = post();
        let not_taken = reqs.len().saturating_sub(taken);
        if not_taken > 0 {
            let dropped: Vec<(u64, Held)> = {
                let mut e = lock(&self.entries);
                let keep = e.len().saturating_sub(not_taken);
                e.drain(keep..).collect()
            };
            dropped.into_iter().for_each(|(_, h)| release(h));
        }
        r
    }

    fn push(&self, wr_id: u64, held: Held) {
        lock(&self.entries).push_back((wr_id, held));
    }

    /// Release the first request `wr_id` and every request before it.
    fn release_through(&self, wr_id: u64) -> bool {
        let done: Vec<(u64, Held)> = {
            let mut e = lock(&self.entries);
            let Some(i) = e.iter().position(|(id, _)| *id == wr_id) else {
                return false;
            };
            e.drain(..=i).collect()
        };
        done.into_iter().for_each(|(_, h)| release(h));
        true
    }

    /// Release the first request `wr_id` only.
    fn release_one(&self, wr_id: u64) -> bool {
        let done = {
            let mut e = lock(&self.entries);
            let Some(i) = e.iter().position(|(id, _)| *id == wr_id) else {
                return false;
            };
            e.remove(i)
        };
        done.into_iter().for_each(|(_, h)| release(h));
        true
    }

    fn release_all(&self) {
        let done: Vec<(u64, Held)> = lock(&self.entries).drain(..).collect();
        done.into_iter().for_each(|(_, h)| release(h));
    }

    /// How many requests are recorded (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.entries).len()
    }
}

impl Drop for Track {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// A QP's queues.
pub(crate) struct QpTrack {
    pub(crate) sq: Track,
    pub(crate) rq: Track,
    pub(crate) srq: Option<Arc<Track>>,
}

impl QpTrack {
    /// A QP's queues; its receives go to `srq` when it has one.
    pub(crate) fn new(srq: Option<Arc<Track>>) -> QpTrack {
        QpTrack {
            sq: Track::default(),
            rq: Track::default(),
            srq,
        }
    }

    /// The QP went to RESET: its queues are emptied without completions.
    pub(crate) fn reset(&self) {
        self.sq.release_all();
        self.rq.release_all();
    }
}

impl Leases {
    /// MR `lkey` now maps `span` of `mem`.
    pub(crate) fn add_mr(&self, mem: &Arc<Memory>, span: Span) {
        lock(&self.mrs).insert(
            span.key,
            MrEntry {
                mem: mem.clone(),
                span,
                gone: Arc::new(AtomicBool::new(false)),
            },
        );
    }

    /// MR `lkey` was deregistered: its leases end.
    pub(crate) fn remove_mr(&self, lkey: u32) {
        if let Some(e) = lock(&self.mrs).remove(&lkey) {
            e.gone.store(true, Ordering::Release);
            e.mem.in_flight.remove_span(lkey);
        }
    }

    /// Lease the bytes `sges` name in registered memory (an SGE naming no
    /// MR, or outside it, names no bytes: the device will fail it).
    pub(crate) fn take(&self, sges: &[Sge]) -> Held {
        let mrs = lock(&self.mrs);
        let mut held = Vec::new();
        for sge in sges {
            let Some(e) = mrs.get(&sge.lkey) else {
                continue;
            };
            let Some((start, end)) = e.span.bytes(sge) else {
                continue;
            };
            let lease = Lease {
                key: sge.lkey,
                start,
                end,
            };
            if e.mem.in_flight.hold(lease, &e.gone) {
                held.push((e.mem.clone(), lease));
            }
        }
        held
    }

    /// Record a posted request in `track` (tests).
    #[cfg(test)]
    fn posted(&self, track: &Track, wr_id: u64, sges: &[Sge]) {
        track.post(self, &[(wr_id, sges)], || (1, ()));
    }

    /// QP `qpn`'s queues, for `poll_cq`.
    pub(crate) fn add_qp(&self, qpn: u32, track: Arc<QpTrack>) {
        lock(&self.qps).insert(qpn, track);
    }

    /// QP `qpn` was destroyed: its queues' leases end.
    pub(crate) fn remove_qp(&self, qpn: u32) {
        let t = lock(&self.qps).remove(&qpn);
        if let Some(t) = t {
            t.reset();
        }
    }

    /// A completion was polled: release what its request (and, in order,
    /// the requests before it) leased.
    pub(crate) fn completed(&self, wc: &Wc) {
        let Some(t) = lock(&self.qps).get(&wc.qp_num).cloned() else {
            return;
        };
        let recv = |t: &QpTrack| match &t.srq {
            Some(s) => s.release_one(wc.wr_id),
            None => t.rq.release_through(wc.wr_id),
        };
        let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if wc.status == WcStatus::Success {
            if is_recv {
                recv(&t);
            } else {
                t.sq.release_through(wc.wr_id);
            }
        } else if !t.sq.release_through(wc.wr_id) {
            // An error completion's opcode is undefined in the verbs API:
            // a request found on neither send queue is a receive.
            recv(&t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider::buffer::for_providers::memory_of;
    use provider::RegisteredBuffer;

    fn wc(qp_num: u32, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Wc {
        Wc {
            qp_num,
            wr_id,
            opcode,
            status,
            ..Wc::default()
        }
    }

    #[test]
    fn posts_lease_and_completions_release_in_order() {
        let buf = RegisteredBuffer::new(256);
        let mem = memory_of(&buf).clone();
        let leases = Leases::default();
        leases.add_mr(
            &mem,
            Span {
                key: 7,
                iova: 0x1000,
                off: 0,
                len: 256,
            },
        );
        let qp = Arc::new(QpTrack::new(None));
        leases.add_qp(3, qp.clone());
        let sge = |off: u64| Sge {
            addr: 0x1000 + off,
            length: 16,
            lkey: 7,
        };
        leases.posted(&qp.sq, 1, &[sge(0)]);
        leases.posted(&qp.sq, 2, &[sge(16)]);
        leases.posted(&qp.rq, 9, &[sge(64)]);
        // An SGE of an unknown key or outside the MR names no bytes.
        leases.posted(&qp.sq, 3, &[Sge { lkey: 8, ..sge(0) }, sge(250)]);
        assert!(buf.write(0, &[1]).is_err(), "leased");
        assert!(buf.write(64, &[1]).is_err(), "leased");
        assert!(buf.write(128, &[1]).is_ok(), "not leased");
        assert_eq!(buf.in_flight(), 3);
        // The send completion of 2 releases 1 (unsignaled) too.
        leases.completed(&wc(3, 2, WcOpcode::Send, WcStatus::Success));
        assert!(buf.write(0, &[1]).is_ok());
        assert!(buf.write(16, &[1]).is_ok());
        assert_eq!(qp.sq.len(), 1);
        // A flushed receive (opcode undefined) is found on the receive queue.
        leases.completed(&wc(3, 9, WcOpcode::Send, WcStatus::WrFlushError));
        assert!(buf.write(64, &[1]).is_ok());
        assert_eq!(buf.in_flight(), 0);
        // Another QP's completion releases nothing of this one.
        leases.posted(&qp.rq, 10, &[sge(32)]);
        leases.completed(&wc(4, 10, WcOpcode::Recv, WcStatus::Success));
        assert!(buf.write(32, &[1]).is_err());
        leases.remove_qp(3);
        assert!(buf.write(32, &[1]).is_ok(), "a destroyed QP releases");
    }

    #[test]
    fn deregistering_ends_leases_and_srq_receives_release_alone() {
        let buf = RegisteredBuffer::new(64);
        let mem = memory_of(&buf).clone();
        let leases = Leases::default();
        let span = Span {
            key: 5,
            iova: 0,
            off: 0,
            len: 64,
        };
        leases.add_mr(&mem, span);
        let srq = Arc::new(Track::default());
        let qp = Arc::new(QpTrack::new(Some(srq.clone())));
        leases.add_qp(1, qp);
        let sge = |addr| Sge {
            addr,
            length: 8,
            lkey: 5,
        };
        leases.posted(&srq, 1, &[sge(0)]);
        leases.posted(&srq, 2, &[sge(8)]);
        leases.completed(&wc(1, 2, WcOpcode::Recv, WcStatus::Success));
        assert!(buf.write(0, &[1]).is_err(), "1 is still posted");
        assert!(buf.write(8, &[1]).is_ok());
        leases.remove_mr(5);
        assert!(buf.write(0, &[1]).is_ok(), "deregistration ends the lease");
        // A post through a deregistered key leases nothing.
        leases.posted(&srq, 3, &[sge(16)]);
        assert!(buf.write(16, &[1]).is_ok());
    }

    #[test]
    fn requests_a_post_did_not_take_lease_nothing() {
        let buf = RegisteredBuffer::new(64);
        let leases = Leases::default();
        leases.add_mr(
            memory_of(&buf),
            Span {
                key: 1,
                iova: 0,
                off: 0,
                len: 64,
            },
        );
        let t = Track::default();
        let a = [Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        }];
        let b = [Sge {
            addr: 8,
            length: 8,
            lkey: 1,
        }];
        let r = t.post(&leases, &[(1, &a[..]), (2, &b[..])], || {
            (1, "second refused")
        });
        assert_eq!(r, "second refused");
        assert_eq!(t.len(), 1);
        assert!(buf.write(0, &[1]).is_err());
        assert!(buf.write(8, &[1]).is_ok());
    }
}
