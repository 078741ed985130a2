//! The worker threads and their random actions.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, Error, Handle, Stats};
use cep::cm::{self, AcceptReply, ConnectRequest};
use cep::proto::{PeerAddr, SidrParams};
use cep::wire::PrivateData;
use cep::wire::RejectReason;
use hca::verbs::{self, Cq};
use provider::RegisteredBuffer;
use provider::{Access, QpType};
use qp::{create_qp, QpCreate};

use super::checker::{Checker, SidrState};
use super::config::{StressConfig, CLOSE_LIMIT};
use super::ctx::{AlCtx, Objs, Slot, MAX_QPS};
use super::hcas::{gid_of_hca, lid, node_guid, service_id, AnyShared, Transport, SERVICES_PER_HCA};
use super::ops::{error_name, panic_text, Op};
use super::rng::{mix, XorShift};

/// What a worker does next (weights per mille).
#[derive(Clone, Copy, Debug)]
pub(super) enum Action {
    OpenAl,
    CloseAl,
    OpenCa,
    CloseCa,
    AllocPd,
    DestroyPd,
    CreateCq,
    DestroyCq,
    CreateQp,
    DestroyQp,
    RegisterMr,
    DestroyMr,
    Listen,
    DestroyListen,
    Connect,
    AcceptPending,
    RejectPending,
    Disconnect,
    DestroyCep,
    DoubleAccept,
    AcceptActive,
    SidrRequest,
    Exhaust,
    Pause,
}

pub(super) const ACTIONS: [(Action, u32); 24] = [
    (Action::OpenAl, 4),
    (Action::CloseAl, 2),
    (Action::OpenCa, 20),
    (Action::CloseCa, 4),
    (Action::AllocPd, 20),
    (Action::DestroyPd, 3),
    (Action::CreateCq, 20),
    (Action::DestroyCq, 5),
    (Action::CreateQp, 60),
    (Action::DestroyQp, 25),
    (Action::RegisterMr, 25),
    (Action::DestroyMr, 25),
    (Action::Listen, 30),
    (Action::DestroyListen, 6),
    (Action::Connect, 180),
    (Action::AcceptPending, 50),
    (Action::RejectPending, 15),
    (Action::Disconnect, 100),
    (Action::DestroyCep, 25),
    (Action::DoubleAccept, 15),
    (Action::AcceptActive, 15),
    (Action::SidrRequest, 40),
    (Action::Exhaust, 4),
    (Action::Pause, 307),
];

/// The largest `max_pd` the exhaustion action fills (`--max-objects`).
const EXHAUST_AT_MOST: u32 = 4096;
const MAX_CAS: usize = 4;
const MAX_PDS: usize = 6;
const MAX_CQS: usize = 6;
const MAX_MRS: usize = 8;
const MAX_LISTENS: usize = 6;
const MAX_CEPS: usize = 64;

const ALL_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// What a worker is doing, for the watchdog.
#[derive(Default)]
pub(super) struct WorkerStatus {
    pub(super) steps: AtomicU64,
    /// Index in [`ACTIONS`] of the action under way (`usize::MAX`: none).
    pub(super) action: std::sync::atomic::AtomicUsize,
}

/// How long after the deadline a worker may take to return before the run
/// calls it stuck (a close may take up to [`CLOSE_LIMIT`]).
pub const STUCK_LIMIT: Duration = Duration::from_secs(60);

struct Worker {
    id: usize,
    status: Arc<WorkerStatus>,
    static_listens: bool,
    checker: Arc<Checker>,
    provider: AnyShared,
    transport: Transport,
    hcas: usize,
    rng: XorShift,
    als: Vec<Slot>,
    ops: BTreeMap<(String, &'static str), u64>,
    als_opened: u64,
    als_closed: u64,
    steps: u64,
}

impl Worker {
    fn count<T>(&mut self, op: Op, r: &al::Result<T>) {
        let outcome = self.checker.outcome(op, r);
        *self
            .ops
            .entry((op.name().to_string(), outcome))
            .or_default() += 1;
    }

    /// Device-limit exhaustion: allocate PDs on one CA until the HCA
    /// refuses. With `--max-objects N` the refusal must come within N + 1
    /// tries and be `InsufficientResources` (other workers hold some of
    /// the N); then every PD goes again, and the end-of-run usage check
    /// sees whether their places came back. Without a small limit it does
    /// nothing (65,536 PDs are not worth allocating).
    fn exhaust(&mut self, ctx: &Arc<AlCtx>) {
        let cas = ctx.objs().cas.clone();
        let Some((ca, _)) = self.pick(&cas) else {
            return;
        };
        let Ok(max) = ctx.inst.resolve(ca).map(|c| c.attr().max_pd) else {
            return;
        };
        if max > EXHAUST_AT_MOST {
            return;
        }
        let mut pds = Vec::new();
        let mut refusal = None;
        for _ in 0..=max {
            match verbs::alloc_pd(&ctx.inst, ca) {
                Ok(pd) => pds.push(pd),
                Err(e) => {
                    refusal = Some(e);
                    break;
                }
            }
        }
        let outcome = match &refusal {
            Some(Error::InsufficientResources(_)) => "limit",
            Some(e @ (Error::InvalidHandle { .. } | Error::Destroying { .. })) => error_name(e),
            Some(e) => {
                self.checker
                    .fail(format!("exhaust_pd: unexpected error {e:?}"));
                error_name(e)
            }
            None => {
                self.checker.fail(format!(
                    "exhaust_pd: {} PDs allocated on an HCA whose max_pd is {max}",
                    pds.len()
                ));
                "over the limit"
            }
        };
        *self
            .ops
            .entry(("exhaust_pd".to_string(), outcome))
            .or_default() += 1;
        for pd in pds {
            let r = self.checker.destroy(&ctx.inst, pd);
            self.count(Op::DestroyPd, &r);
        }
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.rng.below(v.len())])
    }

    fn open_al(&mut self) {
        let r = Al::open();
        self.count(Op::OpenAl, &r);
        if let Ok(al) = r {
            self.als_opened += 1;
            let ctx = Arc::new(AlCtx {
                inst: al.instance().clone(),
                checker: self.checker.clone(),
                objs: Mutex::new(Objs::default()),
            });
            self.als.push(Slot { al, ctx });
        }
    }

    fn close_al(&mut self, i: usize) {
        let slot = self.als.swap_remove(i);
        let sync = self.rng.below(2) == 0;
        let stats = slot.close(&self.checker, sync, CLOSE_LIMIT);
        *self
            .ops
            .entry((
                Op::CloseAl.name().to_string(),
                if stats.is_some() { "ok" } else { "hung" },
            ))
            .or_default() += 1;
        self.als_closed += 1;
        if let Some(s) = stats {
            ADD_STATS.with(|a| a.borrow_mut().push(s));
        }
    }

    fn step(&mut self) {
        self.steps += 1;
        if self.als.is_empty() {
            self.open_al();
            return;
        }
        let i = self.rng.below(self.als.len());
        let ctx = self.als[i].ctx.clone();
        if self.steps % 128 == 0 {
            ctx.objs().prune(&ctx.inst);
            self.checker.sweep_sidr(&ctx.inst, false);
            let n = ctx.check_cid_slots(false);
            self.checker.count_probes("cid slots checked", n as u64);
        }
        let total: u32 = ACTIONS.iter().map(|a| a.1).sum();
        let mut roll = self.rng.below(total as usize) as u32;
        let (mut action, mut index) = (Action::Pause, ACTIONS.len() - 1);
        for (n, (a, w)) in ACTIONS.into_iter().enumerate() {
            if roll < w {
                (action, index) = (a, n);
                break;
            }
            roll -= w;
        }
        if self.static_listens && matches!(action, Action::Listen | Action::DestroyListen) {
            return;
        }
        self.status.action.store(index, Ordering::Release);
        self.status.steps.store(self.steps, Ordering::Release);
        self.act(action, i, &ctx);
        self.status.action.store(usize::MAX, Ordering::Release);
    }

    fn act(&mut self, action: Action, i: usize, ctx: &Arc<AlCtx>) {
        let inst = ctx.inst.clone();
        let c = self.checker.clone();
        match action {
            Action::OpenAl => {
                if self.als.len() < 2 {
                    self.open_al();
                }
            }
            Action::CloseAl => self.close_al(i),
            Action::OpenCa => {
                if ctx.objs().cas.len() >= MAX_CAS {
                    return;
                }
                let hca = self.rng.below(self.hcas);
                let r = verbs::open_ca(&inst, &*self.provider, node_guid(hca));
                self.count(Op::OpenCa, &r);
                if let Ok(ca) = r {
                    ctx.objs().cas.push((ca, hca));
                    let r = cm::attach_ca(&inst, ca);
                    self.count(Op::AttachCm, &r);
                }
            }
            Action::CloseCa => {
                let cas = ctx.objs().cas.clone();
                if let Some((ca, _)) = self.pick(&cas) {
                    let r = c.destroy(&inst, ca);
                    self.count(Op::CloseCa, &r);
                    ctx.objs().cas.retain(|x| x.0 != ca);
                }
            }
            Action::AllocPd => {
                let cas = ctx.objs().cas.clone();
                if ctx.objs().pds.len() >= MAX_PDS {
                    return;
                }
                if let Some((ca, _)) = self.pick(&cas) {
                    let r = verbs::alloc_pd(&inst, ca);
                    self.count(Op::AllocPd, &r);
                    if let Ok(pd) = r {
                        ctx.objs().pds.push((pd, ca));
                    }
                }
            }
            Action::DestroyPd => {
                let pds = ctx.objs().pds.clone();
                if let Some((pd, _)) = self.pick(&pds) {
                    let r = c.destroy(&inst, pd);
                    self.count(Op::DestroyPd, &r);
                    ctx.objs().pds.retain(|x| x.0 != pd);
                }
            }
            Action::CreateCq => {
                let cas = ctx.objs().cas.clone();
                if ctx.objs().cqs.len() >= MAX_CQS {
                    return;
                }
                if let Some((ca, _)) = self.pick(&cas) {
                    let r = verbs::create_cq(&inst, ca, 64, None, None);
                    self.count(Op::CreateCq, &r);
                    if let Ok(cq) = r {
                        ctx.objs().cqs.push((cq, ca));
                    }
                }
            }
            Action::DestroyCq => {
                let cqs = ctx.objs().cqs.clone();
                if let Some((cq, _)) = self.pick(&cqs) {
                    let r = c.destroy(&inst, cq);
                    self.count(Op::DestroyCq, &r);
                    if !matches!(r, Err(Error::ResourceBusy(_))) {
                        ctx.objs().cqs.retain(|x| x.0 != cq);
                    }
                }
            }
            Action::CreateQp => self.create_qp(ctx),
            Action::DestroyQp => {
                let qps = ctx.objs().qps.clone();
                if let Some((qp, _)) = self.pick(&qps) {
                    let r = c.destroy(&inst, qp);
                    self.count(Op::DestroyQp, &r);
                    ctx.objs().qps.retain(|x| x.0 != qp);
                }
            }
            Action::RegisterMr => {
                let pds = ctx.objs().pds.clone();
                if ctx.objs().mrs.len() >= MAX_MRS {
                    return;
                }
                if let Some((pd, _)) = self.pick(&pds) {
                    let len = 64 << self.rng.below(8);
                    let buf = RegisteredBuffer::new(len);
                    let r = verbs::register_mr(&inst, pd, &buf, 0, len, 0, ALL_ACCESS);
                    self.count(Op::RegisterMr, &r);
                    if let Ok(mr) = r {
                        ctx.objs().mrs.push(mr);
                    }
                }
            }
            Action::DestroyMr => {
                let mrs = ctx.objs().mrs.clone();
                if let Some(mr) = self.pick(&mrs) {
                    let r = c.destroy(&inst, mr);
                    self.count(Op::DestroyMr, &r);
                    ctx.objs().mrs.retain(|x| *x != mr);
                }
            }
            Action::Listen => {
                let cas = ctx.objs().cas.clone();
                if ctx.objs().listens.len() >= MAX_LISTENS {
                    return;
                }
                if let Some((ca, hca)) = self.pick(&cas) {
                    let k = self.rng.below(SERVICES_PER_HCA as usize) as u64;
                    let r = cm::listen(
                        &inst,
                        ca,
                        1,
                        service_id(hca, k),
                        ctx.listen_handler(hca),
                        ctx.cep_handler(),
                    );
                    self.count(Op::Listen, &r);
                    if let Ok(l) = r {
                        ctx.objs().listens.push(l);
                    }
                }
            }
            Action::DestroyListen => {
                let ls = ctx.objs().listens.clone();
                if let Some(l) = self.pick(&ls) {
                    let r = c.destroy(&inst, l);
                    self.count(Op::DestroyListen, &r);
                    ctx.objs().listens.retain(|x| *x != l);
                }
            }
            Action::Connect => self.connect(ctx),
            Action::AcceptPending => {
                let pending = ctx.objs().pending.clone();
                if let Some((cep, hca)) = self.pick(&pending) {
                    ctx.objs().pending.retain(|x| x.0 != cep);
                    let Some(qp) = ctx.qp_on(hca, self.rng.next_u64()) else {
                        return;
                    };
                    let r = cm::accept(&inst, cep, qp, &AcceptReply::default());
                    self.count(Op::Accept, &r);
                    if r.is_ok() {
                        ctx.objs().ceps.push(cep);
                    }
                }
            }
            Action::RejectPending => {
                let pending = ctx.objs().pending.clone();
                if let Some((cep, _)) = self.pick(&pending) {
                    ctx.objs().pending.retain(|x| x.0 != cep);
                    let r = cm::reject(&inst, cep, RejectReason::ConsumerReject, b"stress");
                    self.count(Op::Reject, &r);
                }
            }
            Action::Disconnect => {
                let ceps = ctx.objs().ceps.clone();
                if let Some(cep) = self.pick(&ceps) {
                    let r = cm::disconnect(&inst, cep, &[]);
                    self.count(Op::Disconnect, &r);
                    if matches!(r, Err(Error::InvalidHandle { .. })) {
                        ctx.objs().ceps.retain(|x| *x != cep);
                    }
                }
            }
            Action::DestroyCep => {
                let ceps = ctx.objs().ceps.clone();
                if let Some(cep) = self.pick(&ceps) {
                    let r = c.destroy(&inst, cep);
                    self.count(Op::DestroyCep, &r);
                    ctx.objs().ceps.retain(|x| *x != cep);
                }
            }
            Action::DoubleAccept => {
                let pending = ctx.objs().pending.clone();
                if let Some((cep, hca)) = self.pick(&pending) {
                    ctx.objs().pending.retain(|x| x.0 != cep);
                    let concurrent = self.rng.below(2) == 0;
                    if !ctx.double_accept(cep, hca, concurrent, "probe:double_accept") {
                        ctx.objs().pending.push((cep, hca));
                    }
                }
            }
            Action::AcceptActive => {
                let active = ctx.objs().active.clone();
                if let Some((cep, own_qp, hca)) = self.pick(&active) {
                    // Its own QP, or another on the same HCA.
                    let qp = match self.rng.below(2) {
                        0 => own_qp,
                        _ => ctx.qp_on(hca, self.rng.next_u64()).unwrap_or(own_qp),
                    };
                    ctx.accept_active(cep, own_qp, qp);
                }
            }
            Action::SidrRequest => self.sidr_request(ctx),
            Action::Exhaust => self.exhaust(ctx),
            Action::Pause => {
                std::thread::sleep(Duration::from_micros(50 + self.rng.below(400) as u64));
            }
        }
    }

    fn create_qp(&mut self, ctx: &Arc<AlCtx>) {
        let (pds, cqs, n) = {
            let o = ctx.objs();
            (o.pds.clone(), o.cqs.clone(), o.qps.len())
        };
        if n >= MAX_QPS {
            return;
        }
        let Some((pd, ca)) = self.pick(&pds) else {
            return;
        };
        let on_ca: Vec<Handle<Cq>> = cqs.iter().filter(|x| x.1 == ca).map(|x| x.0).collect();
        let Some(cq) = self.pick(&on_ca) else {
            return;
        };
        let hca = ctx
            .objs()
            .cas
            .iter()
            .find(|x| x.0 == ca)
            .map(|x| x.1)
            .unwrap_or(usize::MAX);
        let qp_type = if self.rng.below(20) == 0 {
            QpType::Ud
        } else {
            QpType::Rc
        };
        let r = create_qp(&ctx.inst, pd, QpCreate::new(qp_type, cq));
        self.count(Op::CreateQp, &r);
        if let Ok(qp) = r {
            if hca != usize::MAX {
                ctx.objs().qps.push((qp, hca));
            }
        }
    }

    fn connect(&mut self, ctx: &Arc<AlCtx>) {
        let (qps, n) = {
            let o = ctx.objs();
            (o.qps.clone(), o.ceps.len())
        };
        if n >= MAX_CEPS {
            ctx.objs().prune(&ctx.inst);
            return;
        }
        let Some((qp, _)) = self.pick(&qps) else {
            return;
        };
        let target = self.rng.below(self.hcas);
        let k = self.rng.below(SERVICES_PER_HCA as usize) as u64;
        let mut req = match gid_of_hca(self.transport, target) {
            // RoCE routes by GID, LIDs mean nothing there; the port's MTU
            // is Ethernet's 1024 (the request's default, 4096, is refused).
            Some(gid) => ConnectRequest::new(service_id(target, k), 0)
                .remote_gid(gid)
                .path_mtu(provider::Mtu::Mtu1024),
            None => ConnectRequest::new(service_id(target, k), lid(target)),
        };
        // Response waits of a few ms, so retries and timeouts happen often.
        req.cm_response_timeout = 8 + self.rng.below(4) as u8;
        req.local_ack_timeout = 8 + self.rng.below(4) as u8;
        req.max_cm_retries = self.rng.below(4) as u8;
        let r = cm::connect(&ctx.inst, qp, &req, ctx.cep_handler());
        self.count(Op::Connect, &r);
        match r {
            Ok(cep) => {
                let mut o = ctx.objs();
                o.ceps.push(cep);
                let hca = o.qps.iter().find(|x| x.0 == qp).map_or(usize::MAX, |x| x.1);
                o.active.push((cep, qp, hca));
            }
            Err(Error::InvalidHandle { .. }) => ctx.objs().qps.retain(|x| x.0 != qp),
            Err(_) => {}
        }
    }
}

impl Worker {
    /// A SIDR request from a CA of this AL to a random service of a random
    /// HCA (which may have no listen: a reply saying so), watched until
    /// its one end (reply or timeout) and its CEP's `Released`.
    fn sidr_request(&mut self, ctx: &Arc<AlCtx>) {
        let cas = ctx.objs().cas.clone();
        let Some((ca, _)) = self.pick(&cas) else {
            return;
        };
        let target = self.rng.below(self.hcas);
        let k = self.rng.below(SERVICES_PER_HCA as usize) as u64;
        let params = SidrParams {
            peer: match gid_of_hca(self.transport, target) {
                Some(gid) => PeerAddr { lid: 0, gid },
                None => PeerAddr {
                    lid: lid(target),
                    gid: [0; 16],
                },
            },
            service_id: service_id(target, k),
            pkey: 0xffff,
            // Waits of a few ms, so retries and timeouts happen often.
            timeout: 8 + self.rng.below(4) as u8,
            packet_life_time: self.rng.below(8) as u8,
            max_retries: self.rng.below(4) as u8,
            private_data: PrivateData::zeroed(),
        };
        let state = SidrState::new(false);
        let r = cm::sidr_request(&ctx.inst, ca, params, 1, ctx.sidr_handler(state.clone()));
        self.count(Op::SidrRequest, &r);
        if let Ok(cep) = r {
            self.checker.track_sidr(ctx.inst.id(), cep, state);
        }
    }
}

thread_local! {
    /// Stats of the ALs a worker closed (collected when it ends).
    static ADD_STATS: std::cell::RefCell<Vec<Stats>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) struct WorkerOut {
    pub(super) ops: BTreeMap<(String, &'static str), u64>,
    pub(super) als: Vec<Slot>,
    pub(super) closed: Vec<Stats>,
    pub(super) opened: u64,
    pub(super) closed_count: u64,
}

pub(super) fn worker(
    id: usize,
    status: Arc<WorkerStatus>,
    checker: Arc<Checker>,
    (provider, transport): (AnyShared, Transport),
    cfg: StressConfig,
    deadline: Instant,
) -> WorkerOut {
    let mut w = Worker {
        id,
        status,
        static_listens: cfg.static_listens,
        checker,
        provider,
        transport,
        hcas: cfg.hcas,
        rng: XorShift::new(cfg.seed ^ mix(id as u64 + 1)),
        als: Vec::new(),
        ops: BTreeMap::new(),
        als_opened: 0,
        als_closed: 0,
        steps: 0,
    };
    while Instant::now() < deadline {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| w.step())) {
            w.checker.fail(format!(
                "worker {} panicked at step {}: {}",
                w.id,
                w.steps,
                panic_text(&*p)
            ));
        }
    }
    WorkerOut {
        ops: w.ops,
        als: w.als,
        closed: ADD_STATS.with(|a| std::mem::take(&mut *a.borrow_mut())),
        opened: w.als_opened,
        closed_count: w.als_closed,
    }
}
