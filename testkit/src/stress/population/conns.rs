//! A population connection's state and the CM handlers that write it:
//! the active CEP's, the passive CEPs', and the listen's request handler
//! (which makes the passive QP and accepts). The REQ's private data names
//! the connection, so the passive side knows which one a request is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use al::{AlInstance, Handle};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ListenHandler};
use cep::proto::{DisconnectCause, Event};
use cep::wire::RejectReason;
use hca::verbs::{Cq, Pd};
use provider::{QpCaps, QpType};
use qp::{create_qp, Qp, QpCreate};

/// Send and receive queue depth of every population QP.
pub const QUEUE_DEPTH: u32 = 4;

/// How long making (or disconnecting) the population may go without one
/// more connection finishing before the run gives up on the rest. A bound
/// on a stall, not a timing claim: the CM retries a lost REQ, REP or DREQ
/// within a second or so.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// The REQ private data of connection `i`: a tag and `i`.
const TAG: &[u8; 8] = b"ibal-pop";

pub(super) fn tag(i: u32) -> [u8; 12] {
    let mut b = [0; 12];
    b[..8].copy_from_slice(TAG);
    b[8..].copy_from_slice(&i.to_be_bytes());
    b
}

/// A population QP: RC, [`QUEUE_DEPTH`]-deep queues, one SGE, on `cq`.
pub(super) fn population_qp(
    inst: &Arc<AlInstance>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
) -> al::Result<Handle<Qp>> {
    let caps = QpCaps {
        max_send_wr: QUEUE_DEPTH,
        max_recv_wr: QUEUE_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    create_qp(inst, pd, QpCreate::new(QpType::Rc, cq).caps(caps))
}

/// The connection a REQ's private data names, if it is a population REQ.
pub(super) fn untag(data: &[u8]) -> Option<u32> {
    let idx = data.get(8..12)?;
    (data.get(..8)? == TAG).then(|| u32::from_be_bytes([idx[0], idx[1], idx[2], idx[3]]))
}

/// Per-connection flags.
pub(super) const ACTIVE_UP: u8 = 1;
pub(super) const PASSIVE_UP: u8 = 2;
/// Establishing it failed (REJ, timeout, a refused call).
pub(super) const FAILED: u8 = 4;
/// Counted in `done` (both up, or failed).
pub(super) const DONE: u8 = 8;
/// An event while held ended or threatened it.
pub(super) const DISTURBED: u8 = 16;
/// Its DREQ ended (DREP, or the DREQ's retries ran out).
pub(super) const DOWN: u8 = 32;

/// Where the population is in its life: what an event means depends on it.
pub(super) const ESTABLISH: u8 = 0;
pub(super) const HOLD: u8 = 1;
pub(super) const TEARDOWN: u8 = 2;

/// At most this many problems are kept in words (all are counted).
pub(super) const KEEP_NOTES: usize = 32;

/// One connection's state, written by its handlers.
#[derive(Default)]
pub(super) struct Conn {
    pub(super) flags: AtomicU8,
    /// The passive CEP and QP, set by the listen's request handler.
    pub(super) passive: OnceLock<(Handle<Cep>, Handle<Qp>)>,
}

/// What the handlers share with the population.
pub(super) struct Shared {
    pub(super) inst: Arc<AlInstance>,
    pub(super) hcas: usize,
    pub(super) phase: AtomicU8,
    pub(super) conns: Vec<Conn>,
    /// Passive CEP (raw handle) -> connection.
    pub(super) passive_of: Mutex<HashMap<u64, u32>>,
    /// Connections done establishing (both sides up, or failed).
    pub(super) done: AtomicU32,
    /// Connections whose DREQ ended.
    pub(super) down: AtomicU32,
    /// DREQs that ended by running out of retries.
    pub(super) dreq_timeouts: AtomicU32,
    /// Problems in words: (connection, what), the first [`KEEP_NOTES`].
    pub(super) notes: Mutex<Vec<(u32, String)>>,
    /// Wakes the population's thread when a count changes.
    pub(super) lock: Mutex<()>,
    pub(super) changed: Condvar,
}

impl Shared {
    /// The state of `size` connections spread over `hcas` HCAs, in `inst`.
    pub(super) fn new(inst: Arc<AlInstance>, hcas: usize, size: u32) -> Shared {
        Shared {
            inst,
            hcas,
            phase: AtomicU8::new(ESTABLISH),
            conns: (0..size).map(|_| Conn::default()).collect(),
            passive_of: Mutex::new(HashMap::new()),
            done: AtomicU32::new(0),
            down: AtomicU32::new(0),
            dreq_timeouts: AtomicU32::new(0),
            notes: Mutex::new(Vec::new()),
            lock: Mutex::new(()),
            changed: Condvar::new(),
        }
    }

    pub(super) fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    pub(super) fn notify(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.changed.notify_all();
    }

    pub(super) fn note(&self, i: u32, what: String) {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        if n.len() < KEEP_NOTES {
            n.push((i, what));
        }
    }

    /// Sets `flag` on connection `i`; counts it done when it just became
    /// so (both sides up, or failed).
    pub(super) fn set(&self, i: u32, flag: u8) {
        let Some(c) = self.conns.get(i as usize) else {
            return;
        };
        let now = c.flags.fetch_or(flag, Ordering::AcqRel) | flag;
        let finished =
            now & (ACTIVE_UP | PASSIVE_UP) == ACTIVE_UP | PASSIVE_UP || now & FAILED != 0;
        if finished && c.flags.fetch_or(DONE, Ordering::AcqRel) & DONE == 0 {
            self.done.fetch_add(1, Ordering::AcqRel);
            self.notify();
        }
    }

    /// An event that ends or threatens connection `i`: a failure to
    /// establish it, or a disturbance while it is held.
    pub(super) fn trouble(&self, i: u32, side: &str, ev: &Event) {
        let what = format!("{side} side: {}", describe(ev));
        match self.phase() {
            ESTABLISH => {
                self.note(i, format!("establishing: {what}"));
                self.set(i, FAILED);
            }
            HOLD => {
                let c = &self.conns[i as usize];
                if c.flags.fetch_or(DISTURBED, Ordering::AcqRel) & DISTURBED == 0 {
                    self.note(i, format!("while held: {what}"));
                }
            }
            _ => {}
        }
    }

    /// Waits until `done` holds, or no count moved for [`STALL_LIMIT`]:
    /// false then.
    pub(super) fn wait(
        &self,
        progress: impl Fn(&Shared) -> u32,
        done: impl Fn(&Shared) -> bool,
    ) -> bool {
        let mut last = progress(self);
        let mut since = Instant::now();
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if done(self) {
                return true;
            }
            let now = progress(self);
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= STALL_LIMIT {
                return false;
            }
            g = self
                .changed
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// An event's name and the detail that says why it matters.
pub(super) fn describe(ev: &Event) -> String {
    match ev {
        Event::Rejected { reason, .. } => format!("Rejected ({reason:?})"),
        Event::Timeout { message, .. } => format!("Timeout ({message:?})"),
        Event::Disconnected { cause, .. } => format!("Disconnected ({cause:?})"),
        other => other.name().to_string(),
    }
}

/// The handler of connection `i`'s active CEP.
pub(super) fn active_handler(s: &Arc<Shared>, i: u32) -> CmHandler {
    let s = s.clone();
    Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => {
            if let Err(e) = cm::rtu(&s.inst, cep, &[]) {
                s.note(i, format!("rtu: {e}"));
                s.set(i, FAILED);
            }
        }
        Event::Established { .. } => s.set(i, ACTIVE_UP),
        Event::Disconnected { cause, .. } if s.phase() == TEARDOWN => {
            if *cause == DisconnectCause::DreqTimeout {
                s.dreq_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            if s.conns[i as usize].flags.fetch_or(DOWN, Ordering::AcqRel) & DOWN == 0 {
                s.down.fetch_add(1, Ordering::AcqRel);
                s.notify();
            }
        }
        Event::DisconnectRequest { .. } => {
            s.trouble(i, "active", ev);
            let _ = cm::disconnect_reply(&s.inst, cep, &[]);
        }
        Event::Rejected { .. }
        | Event::Timeout { .. }
        | Event::Disconnected { .. }
        | Event::Released { .. } => s.trouble(i, "active", ev),
        _ => {}
    })
}

/// The handler of every passive CEP (the connection is looked up).
pub(super) fn passive_handler(s: &Arc<Shared>) -> CmHandler {
    let s = s.clone();
    Arc::new(move |cep, ev| {
        let found = s
            .passive_of
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cep.raw().as_u64())
            .copied();
        let Some(i) = found else {
            return;
        };
        match ev {
            Event::Established { .. } => s.set(i, PASSIVE_UP),
            Event::DisconnectRequest { .. } => {
                s.trouble(i, "passive", ev);
                let _ = cm::disconnect_reply(&s.inst, cep, &[]);
            }
            Event::Rejected { .. }
            | Event::Timeout { .. }
            | Event::Disconnected { .. }
            | Event::Released { .. } => s.trouble(i, "passive", ev),
            _ => {}
        }
    })
}

/// The request handler of the population's listen on `hca`: a QP for the
/// connection the REQ names, accepted at once.
pub(super) fn listen_handler(
    s: &Arc<Shared>,
    hca: usize,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
) -> ListenHandler {
    let s = s.clone();
    Arc::new(move |_listen, cep, ev| {
        let Event::ConnectRequest { req, .. } = ev else {
            return;
        };
        let inst = &s.inst;
        let refuse = |why: String| {
            s.note(u32::MAX, format!("HCA {hca}'s population listen: {why}"));
            let _ = cm::reject(inst, cep, RejectReason::ConsumerReject, &[]);
        };
        let i = match untag(req.private_data.as_bytes()) {
            Some(i) if (i as usize) < s.conns.len() && (i as usize + 1) % s.hcas == hca => i,
            _ => return refuse("a REQ that names no connection of the population".into()),
        };
        let qp = match population_qp(inst, pd, cq) {
            Ok(qp) => qp,
            Err(e) => {
                s.note(i, format!("passive create_qp: {e}"));
                s.set(i, FAILED);
                let _ = cm::reject(inst, cep, RejectReason::NoResources, &[]);
                return;
            }
        };
        if s.conns[i as usize].passive.set((cep, qp)).is_err() {
            let _ = inst.destroy(qp, None);
            return refuse(format!("a second REQ for connection {i}"));
        }
        s.passive_of
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cep.raw().as_u64(), i);
        if let Err(e) = cm::accept(inst, cep, qp, &AcceptReply::default()) {
            s.note(i, format!("accept: {e}"));
            s.set(i, FAILED);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{tag, untag};

    #[test]
    fn a_tag_names_its_connection_and_nothing_else_does() {
        for i in [0, 1, 199, 9_999, u32::MAX] {
            assert_eq!(untag(&tag(i)), Some(i));
            // Padded to the REQ's 92 bytes, as the wire delivers it.
            let mut area = [0u8; 92];
            area[..12].copy_from_slice(&tag(i));
            assert_eq!(untag(&area), Some(i));
        }
        assert_eq!(untag(&[0u8; 92]), None, "a worker's REQ (no private data)");
        assert_eq!(untag(b"ibal-po"), None, "too short");
        assert_eq!(untag(b"ibal-pox\0\0\0\x01"), None, "another tag");
    }
}
