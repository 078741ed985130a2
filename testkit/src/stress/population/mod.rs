//! The held population (`--population N`): N RC connections through the
//! CM between the run's HCAs, made before the workers start in an AL of
//! their own, held while the workers churn next to them (same HCAs, CM
//! agents and ports, but no handle the workers could reach), then checked
//! and torn down before the usual end checks.
//!
//! Connection `i` goes from HCA `i % H` (active) to HCA `(i + 1) % H`
//! (passive), on the population's own listen service
//! ([`population_service`]), with at most [`IN_FLIGHT`] connects
//! outstanding. The REQ's private data carries `i`, so the passive side
//! knows which connection each request is. Every QP has
//! [`QUEUE_DEPTH`]-deep queues; each HCA has one CQ (and PD) for its
//! active QPs and one for its passive QPs.
//!
//! The connections' handlers flag any event that ends or threatens a
//! connection while it is held (DREQ, DREP, REJ, timeout, release);
//! [`Population::check_held`] reads both CEPs' CM state and both QPs'
//! state at the end. Either makes the connection "disturbed", which the
//! run reports as a failure.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use al::{Al, Error, Handle, Stats};
use cep::cm::{self, Cep, ConnectRequest};
use cep::proto::State;
use hca::any::AnyProvider;
use hca::verbs::{self, Cq, Pd};
use provider::QpState;
use qp::Qp;

mod conns;
mod report;

use conns::{
    active_handler, listen_handler, passive_handler, population_qp, tag, Shared, ACTIVE_UP,
    DISTURBED, FAILED, HOLD, KEEP_NOTES, PASSIVE_UP, TEARDOWN,
};
pub use conns::{QUEUE_DEPTH, STALL_LIMIT};
pub use report::PopulationReport;

use super::checker::Checker;
use super::hcas::{gid_of_hca, lid, node_guid, Transport};

/// Connects outstanding at once while the population is made, and DREQs
/// while it is torn down: a burst of thousands at once would overflow
/// QP1's receive queue (recovered only by retransmission).
pub const IN_FLIGHT: u32 = 256;

/// The population's listen service on HCA `hca`: a prefix of its own, so
/// no worker's connect or listen (`service_id`) can name it.
pub fn population_service(hca: usize) -> u64 {
    0x5150_0000_0000_0000 | hca as u64
}

/// The population's objects on one HCA.
struct Side {
    pd: Handle<Pd>,
    cq: Handle<Cq>,
}

/// The held population: its AL and its connections.
pub struct Population {
    al: Al,
    shared: Arc<Shared>,
    /// Per connection: the active CEP and QP (None when its connect
    /// failed before a CEP existed).
    active: Vec<Option<(Handle<Cep>, Handle<Qp>)>>,
    pub report: PopulationReport,
}

impl Population {
    /// Opens the population's AL (every HCA's CA with the CM attached, a
    /// PD and CQ per side, a listen on [`population_service`]) and makes
    /// `size` connections. Fails only when that setup fails (or the HCAs
    /// cannot hold the QPs); a connection that does not come up is a
    /// problem in the report.
    pub fn establish(
        provider: &dyn AnyProvider,
        transport: Transport,
        hcas: usize,
        size: u32,
    ) -> Result<Population, String> {
        let al = Al::open().map_err(|e| e.to_string())?;
        let inst = al.instance().clone();
        let shared = Arc::new(Shared::new(inst.clone(), hcas, size));
        let mut active_sides = Vec::new();
        for hca in 0..hcas {
            let err = |e: Error| format!("population on HCA {hca}: {e}");
            let ca = verbs::open_ca(&inst, provider, node_guid(hca)).map_err(err)?;
            let max_qp = inst.resolve(ca).map_err(err)?.attr().max_qp as u64;
            // Active QPs i % H == hca, passive (i + 1) % H == hca; the CM's
            // special QPs; with one HCA both are the same connections.
            let share = |r: usize| (size as u64 + (hcas - 1 - r) as u64) / hcas as u64;
            let needed = share(hca) + share((hca + hcas - 1) % hcas) + 2;
            if needed > max_qp {
                return Err(format!(
                    "--population {size}: HCA {hca} would hold {needed} QPs (its connections' ends and the \
                     CM's QPs), and it allows {max_qp}: lower --population or raise the device's limit"
                ));
            }
            cm::attach_ca(&inst, ca).map_err(err)?;
            let side = || -> al::Result<Side> {
                let pd = verbs::alloc_pd(&inst, ca)?;
                let cq = verbs::create_cq(&inst, ca, 256, None, None)?;
                Ok(Side { pd, cq })
            };
            active_sides.push(side().map_err(err)?);
            let passive = side().map_err(err)?;
            cm::listen(
                &inst,
                ca,
                1,
                population_service(hca),
                listen_handler(&shared, hca, passive.pd, passive.cq),
                passive_handler(&shared),
            )
            .map_err(err)?;
        }
        let mut pop = Population {
            al,
            shared,
            active: Vec::with_capacity(size as usize),
            report: PopulationReport {
                size,
                ..PopulationReport::default()
            },
        };
        let start = Instant::now();
        pop.connect_all(transport, &active_sides);
        pop.report.establish_s = start.elapsed().as_secs_f64();
        pop.report.established =
            pop.count(|f| f & (ACTIVE_UP | PASSIVE_UP) == ACTIVE_UP | PASSIVE_UP);
        pop.shared.phase.store(HOLD, Ordering::Release);
        Ok(pop)
    }

    /// Connections whose flags satisfy `pred`.
    fn count(&self, pred: impl Fn(u8) -> bool) -> u32 {
        let c = self.shared.conns.iter();
        c.filter(|c| pred(c.flags.load(Ordering::Acquire))).count() as u32
    }

    /// Connects every connection, at most [`IN_FLIGHT`] outstanding, and
    /// waits for all to finish (or a stall).
    fn connect_all(&mut self, transport: Transport, sides: &[Side]) {
        let s = self.shared.clone();
        let (hcas, size) = (s.hcas, s.conns.len() as u32);
        for i in 0..size {
            let started = i;
            let room = |s: &Shared| started - s.done.load(Ordering::Acquire) < IN_FLIGHT;
            if !s.wait(|s| s.done.load(Ordering::Acquire), room) {
                s.note(
                    i,
                    format!("establishing stalled for {STALL_LIMIT:?}: gave up on the rest"),
                );
                break;
            }
            let (from, to) = (i as usize % hcas, (i as usize + 1) % hcas);
            let side = &sides[from];
            let inst = &s.inst;
            let qp = match population_qp(inst, side.pd, side.cq) {
                Ok(qp) => qp,
                Err(e) => {
                    s.note(i, format!("active create_qp on HCA {from}: {e}"));
                    s.set(i, FAILED);
                    self.active.push(None);
                    continue;
                }
            };
            let mut req = match gid_of_hca(transport, to) {
                // RoCE routes by GID; its ports' MTU is 1024.
                Some(gid) => ConnectRequest::new(population_service(to), 0)
                    .remote_gid(gid)
                    .path_mtu(provider::Mtu::Mtu1024),
                None => ConnectRequest::new(population_service(to), lid(to)),
            };
            req = req.private_data(&tag(i));
            // The most retries the REQ's 4-bit field allows: the population
            // must come up through lost MADs.
            req.max_cm_retries = 15;
            match cm::connect(inst, qp, &req, active_handler(&s, i)) {
                Ok(cep) => self.active.push(Some((cep, qp))),
                Err(e) => {
                    s.note(i, format!("connect from HCA {from} to HCA {to}: {e}"));
                    s.set(i, FAILED);
                    self.active.push(None);
                }
            }
        }
        let all = self.active.len() as u32;
        if !s.wait(
            |s| s.done.load(Ordering::Acquire),
            |s| s.done.load(Ordering::Acquire) >= all,
        ) {
            let done = s.done.load(Ordering::Acquire);
            s.note(
                u32::MAX,
                format!(
                    "{} connections never finished establishing ({STALL_LIMIT:?} without progress)",
                    all - done
                ),
            );
        }
    }
}

impl Population {
    /// Connections up on both sides when the hold began.
    fn held_ones(
        &self,
    ) -> impl Iterator<Item = (u32, Handle<Cep>, Handle<Qp>, Handle<Cep>, Handle<Qp>)> + '_ {
        self.active.iter().enumerate().filter_map(|(i, a)| {
            let c = &self.shared.conns[i];
            let f = c.flags.load(Ordering::Acquire);
            let up = f & (ACTIVE_UP | PASSIVE_UP | FAILED) == ACTIVE_UP | PASSIVE_UP;
            let (acep, aqp) = (*a)?;
            let (pcep, pqp) = *c.passive.get()?;
            up.then_some((i as u32, acep, aqp, pcep, pqp))
        })
    }

    /// A self-test of [`check_held`](Self::check_held): disconnects
    /// `count` held connections spread over the population, alternately
    /// from the active and the passive side, as a churn that reached them
    /// would. Returns the connections it disconnected.
    pub fn disturb(&self, count: u32) -> Vec<u32> {
        let held: Vec<_> = self.held_ones().collect();
        let n = held.len();
        let count = (count as usize).min(n);
        let mut hit = Vec::with_capacity(count);
        for k in 0..count {
            let (i, acep, _, pcep, _) = held[k * n / count];
            let cep = if k % 2 == 0 { acep } else { pcep };
            if cm::disconnect(&self.shared.inst, cep, &[]).is_ok() {
                hit.push(i);
            }
        }
        hit
    }

    /// With the workers stopped: every connection established before them
    /// must still be so on both sides (both CEPs ESTABLISHED, both QPs
    /// RTS) and no event may have disturbed it. Fills `held` and
    /// `disturbed` in the report, and says each disturbed connection to
    /// `checker` as a failure.
    pub fn check_held(&mut self, checker: &Checker) {
        let inst = &self.shared.inst;
        let cep_state = |cep: Handle<Cep>| match inst.resolve(cep) {
            Ok(c) => c.protocol_state(),
            Err(_) => None,
        };
        let qp_state = |qp: Handle<Qp>| {
            inst.resolve(qp)
                .ok()
                .and_then(|q| q.query().ok())
                .map(|a| a.state)
        };
        let (mut held, mut disturbed, mut count) = (0, Vec::new(), 0);
        let hcas = self.shared.hcas;
        for (i, acep, aqp, pcep, pqp) in self.held_ones() {
            let states = (
                cep_state(acep),
                qp_state(aqp),
                cep_state(pcep),
                qp_state(pqp),
            );
            let intact = states
                == (
                    Some(State::Established),
                    Some(QpState::Rts),
                    Some(State::Established),
                    Some(QpState::Rts),
                );
            let flagged =
                self.shared.conns[i as usize].flags.load(Ordering::Acquire) & DISTURBED != 0;
            if intact && !flagged {
                held += 1;
                continue;
            }
            count += 1;
            let events = {
                let notes = self.shared.notes.lock().unwrap_or_else(|p| p.into_inner());
                let mine: Vec<&str> = notes
                    .iter()
                    .filter(|n| n.0 == i)
                    .map(|n| n.1.as_str())
                    .collect();
                if mine.is_empty() {
                    String::new()
                } else {
                    format!("; {}", mine.join("; "))
                }
            };
            let what = format!(
                "HCA {} -> HCA {}: active CEP {:?}, QP {:?}; passive CEP {:?}, QP {:?}{events}",
                i as usize % hcas,
                (i as usize + 1) % hcas,
                states.0,
                states.1,
                states.2,
                states.3,
            );
            checker.fail(format!(
                "population connection {i} disturbed by the churn: {what}"
            ));
            if disturbed.len() < KEEP_NOTES {
                disturbed.push((i, what));
            }
        }
        let r = &mut self.report;
        (r.held, r.disturbed, r.disturbed_count) = (held, disturbed, count);
    }

    /// Disconnects every connection still intact (a DREQ from the active
    /// side, at most [`IN_FLIGHT`] outstanding) and waits until each
    /// ended; then closes the population's AL. Fills the disconnect and
    /// close figures and the problems in the report, says each problem to
    /// `checker`, and returns the AL's stats after close (None: it hung).
    pub fn end(
        mut self,
        checker: &Arc<Checker>,
        close_limit: Duration,
    ) -> (PopulationReport, Option<Stats>) {
        let s = self.shared.clone();
        s.phase.store(TEARDOWN, Ordering::Release);
        let intact: Vec<(u32, Handle<Cep>)> = self
            .held_ones()
            .filter(|c| s.conns[c.0 as usize].flags.load(Ordering::Acquire) & DISTURBED == 0)
            .map(|c| (c.0, c.1))
            .collect();
        let start = Instant::now();
        let mut sent = 0u32;
        for (i, cep) in intact {
            let room = |s: &Shared| sent - s.down.load(Ordering::Acquire) < IN_FLIGHT;
            if !s.wait(|s| s.down.load(Ordering::Acquire), room) {
                s.note(
                    i,
                    format!("disconnecting stalled for {STALL_LIMIT:?}: gave up on the rest"),
                );
                break;
            }
            match cm::disconnect(&s.inst, cep, &[]) {
                Ok(()) => sent += 1,
                Err(e) => s.note(i, format!("disconnect: {e}")),
            }
        }
        if !s.wait(
            |s| s.down.load(Ordering::Acquire),
            |s| s.down.load(Ordering::Acquire) >= sent,
        ) {
            let down = s.down.load(Ordering::Acquire);
            s.note(
                u32::MAX,
                format!(
                    "{} DREQs never ended ({STALL_LIMIT:?} without progress)",
                    sent - down
                ),
            );
        }
        self.report.disconnect_s = start.elapsed().as_secs_f64();
        self.report.disconnected = s.down.load(Ordering::Acquire);
        self.report.dreq_timeouts = s.dreq_timeouts.load(Ordering::Acquire);
        let start = Instant::now();
        let stats = checker.close_al(self.al, true, close_limit);
        self.report.close_s = start.elapsed().as_secs_f64();
        if stats.is_none() {
            checker.fail(format!(
                "closing the population's AL took over {close_limit:?}"
            ));
        }
        // Problems other than the disturbances (which check_held said).
        let notes = s.notes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (i, what) in notes {
            if what.starts_with("while held") {
                continue;
            }
            let text = if i == u32::MAX {
                format!("population: {what}")
            } else {
                format!("population connection {i}: {what}")
            };
            checker.fail(text.clone());
            self.report.problems.push(text);
        }
        let r = &self.report;
        if r.established < r.size {
            checker.fail(format!(
                "population: {} of {} connections established (the CM retries lost MADs: none may stay down)",
                r.established, r.size
            ));
        }
        (self.report, stats)
    }
}
