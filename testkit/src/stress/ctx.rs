//! One AL instance, the objects the run knows of it, and the CM handlers
//! of its listens and CEPs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, AlInstance, Error, Handle, Kind, Stats};
use cep::cm::{self, AcceptReply, Cep, CmHandler, CmPort, Listen, ListenHandler};
use cep::proto::Event;
use cep::proto::{SidrReplyParams, TimedOut};
use cep::wire::RejectReason;
use cep::wire::SidrStatus;
use hca::verbs::{Ca, Cq, Mr, Pd};
use provider::QpState;
use provider::QpType;
use qp::CidState;
use qp::{create_qp, Qp, QpCreate};

use super::checker::{Checker, SidrState};
use super::ops::{panic_text, says_cep_gone, Op};

/// The objects of one AL the run knows about (by handle; destroyed ones
/// drop out when a call finds them gone).
#[derive(Default)]
pub(super) struct Objs {
    pub(super) cas: Vec<(Handle<Ca>, usize)>,
    pub(super) pds: Vec<(Handle<Pd>, Handle<Ca>)>,
    pub(super) cqs: Vec<(Handle<Cq>, Handle<Ca>)>,
    pub(super) qps: Vec<(Handle<Qp>, usize)>,
    pub(super) mrs: Vec<Handle<Mr>>,
    pub(super) listens: Vec<Handle<Listen>>,
    pub(super) ceps: Vec<Handle<Cep>>,
    /// Passive CEPs waiting for the worker's accept or reject, with their HCA.
    pub(super) pending: Vec<(Handle<Cep>, usize)>,
    /// Active CEPs (from `connect`) with their QP and its HCA.
    pub(super) active: Vec<(Handle<Cep>, Handle<Qp>, usize)>,
    /// Received SIDR requests left unanswered (the CM's deadline ends them).
    pub(super) sidr_unanswered: Vec<Handle<Cep>>,
    /// CM ports attached by the run's listener or observer AL, with their HCA.
    pub(super) ports: Vec<(Handle<CmPort>, usize)>,
    /// QPs whose CID slot was seen bound to a CEP that is gone or going:
    /// QP -> (that CEP, first seen). One still so after [`CID_STALE_LIMIT`]
    /// is a failure.
    pub(super) cid_suspects: HashMap<u64, (u64, Instant)>,
}

impl Objs {
    pub(super) fn prune(&mut self, al: &AlInstance) {
        self.cas.retain(|(h, _)| al.resolve(*h).is_ok());
        self.pds.retain(|(h, _)| al.resolve(*h).is_ok());
        self.cqs.retain(|(h, _)| al.resolve(*h).is_ok());
        self.qps.retain(|(h, _)| al.resolve(*h).is_ok());
        self.mrs.retain(|h| al.resolve(*h).is_ok());
        self.listens.retain(|h| al.resolve(*h).is_ok());
        self.ceps.retain(|h| al.resolve(*h).is_ok());
        self.pending.retain(|(h, _)| al.resolve(*h).is_ok());
        self.active.retain(|(h, _, _)| al.resolve(*h).is_ok());
        self.sidr_unanswered.retain(|h| al.resolve(*h).is_ok());
    }
}

/// How long a QP's CID slot may stay bound to a CEP that is gone or being
/// destroyed (the CEP's teardown releases the binding right after its
/// destroy starts; this is slack for a loaded machine).
pub(super) const CID_STALE_LIMIT: Duration = Duration::from_secs(2);

/// What a probe saw of a QP: its state and its CID slot.
type QpSnapshot = (QpState, CidState);

/// One AL instance and what the run knows of its objects; the CM handlers
/// of its listens and CEPs share it.
pub(super) struct AlCtx {
    pub(super) inst: Arc<AlInstance>,
    pub(super) checker: Arc<Checker>,
    pub(super) objs: Mutex<Objs>,
}

impl AlCtx {
    pub(super) fn objs(&self) -> std::sync::MutexGuard<'_, Objs> {
        self.objs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn qp_on(&self, hca: usize, r: u64) -> Option<Handle<Qp>> {
        let o = self.objs();
        let on: Vec<Handle<Qp>> = o
            .qps
            .iter()
            .filter(|(_, h)| *h == hca)
            .map(|(q, _)| *q)
            .collect();
        (!on.is_empty()).then(|| on[(r % on.len() as u64) as usize])
    }

    /// The handler of every CEP of this AL (active and passive).
    pub(super) fn cep_handler(self: &Arc<Self>) -> CmHandler {
        let ctx = self.clone();
        Arc::new(move |cep, ev| {
            let c = &ctx.checker;
            c.guarded("CEP", || {
                c.note_event(cep, ev);
                if let Some(st) = c.sidr_state(cep) {
                    // A received SIDR request: its end is the answer
                    // deadline (or our reply, counted where it was made).
                    match ev {
                        Event::Timeout { .. } => st.end(c, cep, "sidr: passive answer timeout"),
                        Event::Released { .. } => st.released(),
                        _ => {}
                    }
                    return;
                }
                let r = c.rand() % 100;
                match ev {
                    Event::ReplyReceived { .. } => {
                        if r < 85 {
                            c.record_callback(Op::Rtu, &cm::rtu(&ctx.inst, cep, &[]));
                        } else if r < 93 {
                            let res = cm::reject(&ctx.inst, cep, RejectReason::ConsumerReject, &[]);
                            c.record_callback(Op::Reject, &res);
                        } else if r < 97 {
                            c.record_callback(Op::Mra, &cm::mra(&ctx.inst, cep, 10, &[]));
                        }
                    }
                    Event::DisconnectRequest { .. } if r < 90 => {
                        let res = cm::disconnect_reply(&ctx.inst, cep, &[]);
                        c.record_callback(Op::DisconnectReply, &res);
                    }
                    Event::Established { .. } if r < 5 => {
                        c.record_callback(Op::Disconnect, &cm::disconnect(&ctx.inst, cep, &[]));
                    }
                    _ => {}
                }
            });
        })
    }

    /// The request handler of a listen on `hca`.
    pub(super) fn listen_handler(self: &Arc<Self>, hca: usize) -> ListenHandler {
        let ctx = self.clone();
        Arc::new(move |_listen, cep, ev| {
            let c = &ctx.checker;
            c.guarded("listen", || {
                c.note_event(cep, ev);
                if matches!(ev, Event::SidrRequest { .. }) {
                    ctx.answer_sidr(cep);
                    return;
                }
                let r = c.rand() % 100;
                if (50..55).contains(&r) && ctx.double_accept(cep, hca, false, "cb:double_accept") {
                    // Done: one request, two accepts on two fresh QPs.
                } else if r < 55 {
                    match ctx.qp_on(hca, c.rand()) {
                        Some(qp) => {
                            let res = cm::accept(&ctx.inst, cep, qp, &AcceptReply::default());
                            c.record_callback(Op::Accept, &res);
                            if res.is_ok() {
                                ctx.objs().ceps.push(cep);
                            } else {
                                ctx.objs().pending.push((cep, hca));
                            }
                        }
                        None => ctx.objs().pending.push((cep, hca)),
                    }
                } else if r < 70 {
                    let res = cm::reject(&ctx.inst, cep, RejectReason::ConsumerReject, &[]);
                    c.record_callback(Op::Reject, &res);
                } else if r < 85 {
                    c.record_callback(Op::Mra, &cm::mra(&ctx.inst, cep, 12, &[]));
                    ctx.objs().pending.push((cep, hca));
                } else if r < 95 {
                    ctx.objs().pending.push((cep, hca));
                } else {
                    let res = c.destroy(&ctx.inst, cep);
                    c.record_callback(Op::DestroyCep, &res);
                }
            });
        })
    }

    /// The handler of an active SIDR CEP: one end (reply or timeout), then
    /// `Released`, and nothing else.
    pub(super) fn sidr_handler(&self, state: Arc<SidrState>) -> CmHandler {
        let c = self.checker.clone();
        Arc::new(move |cep, ev| {
            c.guarded("SIDR", || {
                c.note_event(cep, ev);
                match ev {
                    Event::SidrReply { .. } => state.end(&c, cep, "sidr: reply"),
                    Event::Timeout {
                        message: TimedOut::SidrReq,
                        ..
                    } => state.end(&c, cep, "sidr: timeout"),
                    Event::Released { .. } => state.released(),
                    other => c.fail(format!("SIDR CEP {cep}: unexpected {}", other.name())),
                }
            });
        })
    }

    /// Answer a received SIDR request: mostly a reply, sometimes a destroy
    /// (which sends a rejecting reply), sometimes nothing (the CM's answer
    /// deadline ends it). Its end is watched ([`Checker::sweep_sidr`]).
    fn answer_sidr(&self, cep: Handle<Cep>) {
        let c = &self.checker;
        let st = SidrState::new(true);
        c.track_sidr(self.inst.id(), cep, st.clone());
        let r = c.rand() % 100;
        if r < 85 {
            let reply = SidrReplyParams {
                status: SidrStatus::Success,
                qpn: 0x4242,
                qkey: 0x1111_2222,
                ..SidrReplyParams::default()
            };
            let res = cm::sidr_reply(&self.inst, cep, reply);
            c.record_callback(Op::SidrReply, &res);
            if res.is_ok() {
                st.end(c, cep, "sidr: passive replied");
            }
        } else if r < 97 {
            let res = c.destroy(&self.inst, cep);
            c.record_callback(Op::DestroyCep, &res);
            if res.is_ok() {
                c.untrack_sidr(cep);
                c.count_probe("sidr: passive destroyed");
            }
        } else {
            c.count_probe("sidr: passive left unanswered");
            self.objs().sidr_unanswered.push(cep);
        }
    }

    /// Two fresh RC QPs on a CA of this AL on `hca`: no one else knows
    /// them, so whatever happens to them is the probe's doing.
    fn fresh_qps(&self, hca: usize) -> Option<(Handle<Qp>, Handle<Qp>)> {
        let (pd, cq) = {
            let o = self.objs();
            o.pds.iter().find_map(|(pd, ca)| {
                o.cas.iter().find(|(c, h)| c == ca && *h == hca)?;
                let cq = o.cqs.iter().find(|(_, c)| c == ca)?.0;
                Some((*pd, cq))
            })?
        };
        let a = create_qp(&self.inst, pd, QpCreate::new(QpType::Rc, cq)).ok()?;
        match create_qp(&self.inst, pd, QpCreate::new(QpType::Rc, cq)) {
            Ok(b) => Some((a, b)),
            Err(_) => {
                let _ = self.checker.destroy(&self.inst, a);
                None
            }
        }
    }

    /// The state and CID slot of `qp`, if it is still alive.
    fn qp_snapshot(&self, qp: Handle<Qp>) -> Option<QpSnapshot> {
        let q = self.inst.resolve_live(qp).ok()?;
        let state = q.query().ok()?.state;
        Some((state, q.cid().load()))
    }

    /// Accept the request `cep` (on `hca`) on two fresh QPs, one after the
    /// other or from two threads at once. At most one may win; a loser's
    /// error either says the CEP is gone (and it must be) or the loser's QP
    /// must be exactly as it was (state and CID slot). Returns false when
    /// there were no QPs to try (nothing was called).
    pub(super) fn double_accept(
        &self,
        cep: Handle<Cep>,
        hca: usize,
        concurrent: bool,
        label: &'static str,
    ) -> bool {
        let Some((qa, qb)) = self.fresh_qps(hca) else {
            return false;
        };
        let c = &self.checker;
        let before = [self.qp_snapshot(qa), self.qp_snapshot(qb)];
        let reply = AcceptReply::default();
        let accept = |qp| cm::accept(&self.inst, cep, qp, &reply);
        let (ra, rb) = if concurrent {
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let second = std::thread::Builder::new()
                    .name("ibal-stress-accept".into())
                    .spawn_scoped(s, || {
                        barrier.wait();
                        accept(qb)
                    });
                match second {
                    Ok(h) => {
                        barrier.wait();
                        let ra = accept(qa);
                        let rb = h.join().unwrap_or_else(|p| {
                            c.fail(format!("{label}: accept panicked: {}", panic_text(&*p)));
                            Err(Error::invalid_state("the accept panicked"))
                        });
                        (ra, rb)
                    }
                    // No thread: the two accepts one after the other.
                    Err(_) => (accept(qa), accept(qb)),
                }
            })
        } else {
            (accept(qa), accept(qb))
        };
        c.record_as(label.to_string(), Op::Accept, &ra);
        c.record_as(label.to_string(), Op::Accept, &rb);
        let won = usize::from(ra.is_ok()) + usize::from(rb.is_ok());
        if won == 2 {
            c.fail(format!(
                "{label}: CEP {cep} accepted on two QPs ({qa} and {qb})"
            ));
        }
        let mut gone = false;
        for (qp, r, before) in [(qa, &ra, before[0]), (qb, &rb, before[1])] {
            let Err(e) = r else { continue };
            if says_cep_gone(e, cep) {
                gone = true;
                if self.inst.resolve_live(cep).is_ok() {
                    c.fail(format!(
                        "{label}: accept on {qp} said {e:?} but CEP {cep} is live"
                    ));
                }
                continue;
            }
            // The rule: any other error changed nothing.
            if let (Some(was), Some(now)) = (before, self.qp_snapshot(qp)) {
                if was != now {
                    c.fail(format!(
                        "{label}: the losing accept ({e:?}) changed QP {qp}: {was:?} -> {now:?}"
                    ));
                }
            }
        }
        c.count_probe(match (won, concurrent) {
            (1, false) => "double accept: one won",
            (1, true) => "double accept (concurrent): one won",
            (0, false) => "double accept: none won",
            (0, true) => "double accept (concurrent): none won",
            _ => "double accept: both won",
        });
        {
            let mut o = self.objs();
            if won > 0 {
                o.ceps.push(cep);
            } else if !gone {
                o.pending.push((cep, hca));
            }
        }
        // The winner's QP joins the pool if it has room; the rest go (a
        // bound QP's destroy also ends its connection).
        for (qp, r) in [(qa, &ra), (qb, &rb)] {
            let keep = r.is_ok() && {
                let o = self.objs();
                o.qps.iter().filter(|x| x.1 == hca).count() < MAX_QPS
            };
            if keep {
                self.objs().qps.push((qp, hca));
            } else {
                let res = c.destroy(&self.inst, qp);
                c.record_as(format!("{label}:destroy_qp"), Op::DestroyQp, &res);
            }
        }
        true
    }

    /// Accept the active CEP `cep` (bound to `own_qp`) on `qp` (its own QP
    /// or another on the same HCA): it must fail with `InvalidState` (or
    /// name a CEP or QP that is gone) and leave `own_qp` bound to `cep`
    /// unless the connection ended meanwhile.
    pub(super) fn accept_active(&self, cep: Handle<Cep>, own_qp: Handle<Qp>, qp: Handle<Qp>) {
        let c = &self.checker;
        let slot = |q: Handle<Qp>| self.inst.resolve_live(q).ok().map(|q| q.cid().load());
        let before = slot(own_qp);
        let r = cm::accept(&self.inst, cep, qp, &AcceptReply::default());
        c.record_as("probe:accept_active".to_string(), Op::Accept, &r);
        match &r {
            Ok(()) => c.fail(format!("accept of the active CEP {cep} on {qp} succeeded")),
            Err(e) if says_cep_gone(e, cep) => {
                if self.inst.resolve_live(cep).is_ok() {
                    c.fail(format!(
                        "accept of the active CEP {cep} said {e:?} but it is live"
                    ));
                }
            }
            Err(Error::InvalidHandle { expected, .. }) if *expected == Kind::QP => {}
            Err(Error::Destroying { kind, .. }) if *kind == Kind::QP => {}
            Err(Error::InvalidState(_)) => c.count_probe("accept on an active CEP: refused"),
            Err(e) => c.fail(format!(
                "accept of the active CEP {cep} on {qp}: {e:?} (expected InvalidState)"
            )),
        }
        let bound = CidState::Bound(cep.raw());
        if before == Some(bound) {
            let after = slot(own_qp);
            let ended = c.was_released(cep) || self.inst.resolve_live(cep).is_err();
            if after.is_some() && after != Some(bound) && !ended {
                c.fail(format!(
                    "accept of the active CEP {cep} changed the CID slot of its QP {own_qp}: {after:?}"
                ));
            }
        }
    }

    /// Every QP of this AL the run knows that is alive: its CID slot must
    /// be `Unbound`, `Tombstone`, or bound to a live CEP. A binding to a
    /// CEP that is gone (or going) for longer than [`CID_STALE_LIMIT`] is a
    /// failure: the QP could never connect again. With `wait`, waits that
    /// long for suspects to clear; otherwise judges suspects seen at an
    /// earlier call. Returns the number of QPs checked.
    pub(super) fn check_cid_slots(&self, wait: bool) -> usize {
        let qps: Vec<Handle<Qp>> = self.objs().qps.iter().map(|x| x.0).collect();
        let stale_now = || {
            let mut stale = Vec::new();
            for qp in &qps {
                let Ok(q) = self.inst.resolve_live(*qp) else {
                    continue;
                };
                if let CidState::Bound(raw) = q.cid().load() {
                    let cep = Handle::<Cep>::from_raw(raw);
                    if self.inst.resolve_live(cep).is_err() {
                        stale.push((*qp, raw));
                    }
                }
            }
            stale
        };
        let c = &self.checker;
        if wait {
            let deadline = Instant::now() + CID_STALE_LIMIT;
            loop {
                let stale = stale_now();
                if stale.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    for (qp, raw) in stale {
                        c.fail(format!(
                            "QP {qp}: CID slot still bound to {raw}, which is gone or being destroyed, after {CID_STALE_LIMIT:?}"
                        ));
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            let stale = stale_now();
            let now = Instant::now();
            let mut o = self.objs();
            let mut still = HashMap::new();
            for (qp, raw) in stale {
                let since = match o.cid_suspects.get(&qp.as_u64()) {
                    Some((cep, since)) if *cep == raw.as_u64() => *since,
                    _ => now,
                };
                if now.duration_since(since) > CID_STALE_LIMIT {
                    c.fail(format!(
                        "QP {qp}: CID slot bound to {raw}, which is gone or being destroyed, for over {CID_STALE_LIMIT:?}"
                    ));
                } else {
                    still.insert(qp.as_u64(), (raw.as_u64(), since));
                }
            }
            o.cid_suspects = still;
        }
        qps.len()
    }
}

/// The most QPs a worker's AL keeps on one HCA.
pub(super) const MAX_QPS: usize = 16;

/// One AL a worker (or the run's keeper) holds, with its context.
pub(super) struct Slot {
    pub(super) al: Al,
    pub(super) ctx: Arc<AlCtx>,
}

impl Slot {
    /// Closes this AL ([`Checker::close_al`]) with the checks around it:
    /// the CID slots of its QPs before ([`AlCtx::check_cid_slots`]), its
    /// SIDR CEPs after ([`Checker::sweep_sidr`]).
    pub(super) fn close(
        self,
        checker: &Arc<Checker>,
        sync: bool,
        limit: Duration,
    ) -> Option<Stats> {
        let slot = self;
        let n = slot.ctx.check_cid_slots(true);
        checker.count_probes("cid slots checked", n as u64);
        let inst = slot.ctx.inst.clone();
        let stats = checker.close_al(slot.al, sync, limit);
        // After the close: every callback of the AL has run, so each SIDR
        // CEP of it either ended or was cut by the close.
        checker.sweep_sidr(&inst, true);
        stats
    }
}
