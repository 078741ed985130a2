//! Buffers in flight: which bytes of registered memory posted work
//! requests still name, so that the application's mutating accessors can
//! refuse them (safe code cannot reuse a buffer the HCA may still write or
//! read) while the data path pays next to nothing.
//!
//! Two sources, both seen through the memory:
//!
//! * **Queued receives.** A receive queue (a QP's or an SRQ's) that posts
//!   into a memory registers itself with it once, as a [`PostedQueue`];
//!   the check scans the registered queues' entries and maps each SGE to
//!   bytes through the [`Span`]s of the MRs over the memory. A request
//!   stops counting the moment it leaves its queue, so nothing on the data
//!   path records or releases anything (a per-request record cost a third
//!   of the 64-byte SEND rate). The queue's own lock is held from taking a
//!   receive until its data has landed, so the check cannot slip between.
//! * **Held sends** (behind an RNR NAK): rare, so they take explicit
//!   [`Lease`] records when they are held and release them when they
//!   leave the send queue (a send queue caches MRs, and a registration
//!   that pointed back at it would make a reference cycle).
//!
//! No registration holds anything that holds the memory (spans are plain
//! data; a registered queue holds only its entries), so there is no
//! reference cycle. Deregistering an MR removes its span: its queued
//! requests can no longer reach the bytes, and its held-send leases go.

use std::collections::VecDeque;

use al::sync::atomic::{AtomicBool, Ordering};
use al::sync::Mutex;
use al::{Error, Result};

use crate::Sge;

/// An MR over a memory, as the in-flight check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The MR's key (its lkey).
    pub key: u32,
    /// The address of the MR's first byte as SGEs name it.
    pub iova: u64,
    /// Offset of the MR's first byte in the memory.
    pub off: usize,
    /// Length of the MR.
    pub len: usize,
}

impl Span {
    /// The bytes (`start..end` in the memory) an SGE naming this MR
    /// covers, if it names it and lies inside.
    #[inline]
    pub fn bytes(&self, sge: &Sge) -> Option<(usize, usize)> {
        if sge.lkey != self.key || sge.length == 0 {
            return None;
        }
        let rel = sge.addr.checked_sub(self.iova)?;
        let end = rel.checked_add(u64::from(sge.length))?;
        if end > self.len as u64 {
            return None;
        }
        Some((self.off + rel as usize, self.off + end as usize))
    }
}

/// A queue of posted receives the check can scan.
pub trait PostedQueue: Send + Sync {
    /// Call `f` on every SGE of every request queued now.
    fn each_sge(&self, f: &mut dyn FnMut(&Sge));
    /// Whether the queue has ended (its QP or SRQ is gone): dropped from
    /// the registrations at the next one.
    fn is_closed(&self) -> bool;
    /// The same queue, shared (so the check can scan without holding the
    /// registration list's lock).
    fn share(&self) -> Box<dyn PostedQueue>;
    /// The queue's identity (registration is once per queue).
    fn id(&self) -> usize;
}

/// A held send's claim on bytes, taken through MR `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The MR key the request names.
    pub key: u32,
    /// First byte (offset in the memory).
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

/// The in-flight state of one memory.
#[derive(Default)]
pub struct InFlight {
    spans: Mutex<Vec<Span>>,
    queues: Mutex<Vec<Box<dyn PostedQueue>>>,
    held: Mutex<VecDeque<Lease>>,
}

impl InFlight {
    /// An MR over the memory was registered.
    pub fn add_span(&self, span: Span) {
        self.spans.lock().push(span);
    }

    /// MR `key` is being deregistered: its requests can no longer reach
    /// the bytes.
    pub fn remove_span(&self, key: u32) {
        self.spans.lock().retain(|s| s.key != key);
        self.held.lock().retain(|l| l.key != key);
    }

    /// Register a receive queue that posts into this memory (once; ended
    /// queues are dropped here).
    pub fn add_queue(&self, queue: &dyn PostedQueue) {
        let mut queues = self.queues.lock();
        queues.retain(|q| !q.is_closed());
        if !queues.iter().any(|q| q.id() == queue.id()) {
            queues.push(queue.share());
        }
    }

    /// Record a held send's lease unless `gone` (its MR was deregistered).
    /// The flag is read under the lease lock, which [`InFlight::remove_span`]
    /// takes after the flag is set: a lease is refused here or purged there.
    pub fn hold(&self, lease: Lease, gone: &AtomicBool) -> bool {
        let mut held = self.held.lock();
        if gone.load(Ordering::Acquire) {
            return false;
        }
        held.push_back(lease);
        true
    }

    /// Drop a held send's lease (one record equal to it).
    pub fn unhold(&self, lease: &Lease) {
        let mut held = self.held.lock();
        if let Some(i) = held.iter().position(|h| h == lease) {
            held.remove(i);
        }
    }

    /// Call `f` with the bytes of every request in flight over the memory
    /// until it returns true; whether it did.
    fn any(&self, mut f: impl FnMut(usize, usize) -> bool) -> bool {
        if self.held.lock().iter().any(|l| f(l.start, l.end)) {
            return true;
        }
        let spans = self.spans.lock().clone();
        // Mutant: the old way, where posting a receive claimed nothing and
        // the application could overwrite a buffer the HCA was to fill.
        if spans.is_empty() || cfg!(ibal_mutant = "in_flight_ignores_receives") {
            return false;
        }
        let queues: Vec<Box<dyn PostedQueue>> =
            self.queues.lock().iter().map(|q| q.share()).collect();
        let mut found = false;
        for q in queues {
            q.each_sge(&mut |sge| {
                if !found {
                    if let Some((s, e)) = spans.iter().find_map(|sp| sp.bytes(sge)) {
                        found = f(s, e);
                    }
                }
            });
            if found {
                return true;
            }
        }
        false
    }

    /// The first range in flight that overlaps `start..end`, if any.
    pub fn overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let mut hit = None;
        self.any(|s, e| {
            let overlaps = s < end && start < e;
            if overlaps {
                hit = Some((s, e));
            }
            overlaps
        });
        hit
    }

    /// How many SGEs of posted requests name bytes of the memory.
    pub fn count(&self) -> usize {
        let mut n = 0;
        self.any(|_, _| {
            n += 1;
            false
        });
        n
    }

    /// Refuse an application write to `start..end` while a work request
    /// names any of it.
    pub fn check_writable(&self, start: usize, end: usize) -> Result<()> {
        match self.overlapping(start, end) {
            None => Ok(()),
            Some((s, e)) => Err(Error::ResourceBusy(
                format!(
                    "bytes {start}..{end} overlap bytes {s}..{e}, which a posted work \
                     request still names (a receive not yet completed, or a send held \
                     for retry); write them after its completion"
                )
                .into(),
            )),
        }
    }
}
