//! `ibal stress`: many threads doing random connect, accept, reject,
//! disconnect, QP destroy, CA close and AL close on the soft fabric, with
//! fault injection on the CM traffic; then a leak and invariant check.
//!
//! The fabric has [`StressConfig::hcas`] soft HCAs (one port each). Each
//! worker thread owns one or two AL instances at a time and, driven by its
//! own seeded xorshift generator, picks among: open/close an AL, open a CA
//! (and attach the CM to it), close a CA (cascade), allocate/destroy PDs,
//! CQs, QPs and MRs, listen on a service / cancel it, connect a QP to a
//! service of any HCA, accept or reject a pending request, disconnect, and
//! destroy a CEP. The CM callbacks answer at random too: a listen accepts
//! (on a QP of its AL on its HCA), rejects, sends an MRA or leaves the
//! request for the worker; the active side mostly sends the RTU; DREQs are
//! mostly answered. A ticker thread calls [`Fabric::progress`], which is the
//! only way faulted (queued) MADs are delivered.
//!
//! Every destroy the run issues carries a destroy callback that counts its
//! calls. At the end every AL is closed and the run fails when:
//! * an AL still has live objects after close (`Stats::is_clean`), or close
//!   did not finish within [`CLOSE_LIMIT`];
//! * a destroy callback ran twice, or not at all;
//! * a CEP got an event after its `Released`, or two `Released`;
//! * a callback panicked (executor counts, or the run's own handlers), or a
//!   library call panicked on a worker thread;
//! * a call failed with an error that is not one of those it documents for
//!   that operation ([`Op::allows`]);
//! * the CM agents did not all shut down (`cep::cm::active_ports`).
//!
//! `docs/stress.md` has the details and a recorded run.

use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, AlInstance, DestroyCallback, Error, Handle, Kind, Object, Stats};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ConnectRequest, Listen, ListenHandler};
use cep::proto::Event;
use cep::wire::RejectReason;
use hca::provider::{Access, QpType};
use hca::verbs::{self, Ca, Cq, Mr, Pd};
use hca::{Fabric, FaultConfig, HcaConfig, RegisteredBuffer, SoftProvider};
use qp::{create_qp, Qp, QpCreate};

/// How long closing one AL may take before the run calls it hung.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(30);

/// Services per HCA that listens and connects choose from.
pub const SERVICES_PER_HCA: u64 = 4;

/// The service id `k` of HCA `hca`.
pub fn service_id(hca: usize, k: u64) -> u64 {
    0x5157_0000_0000_0000 | ((hca as u64) << 8) | k
}

/// Node GUID of HCA `i` of a stress fabric.
pub fn node_guid(i: usize) -> u64 {
    0x0002_c903_00e0_0001 + ((i as u64) << 20)
}

/// LID of the (single) port of HCA `i` of a stress fabric.
pub fn lid(i: usize) -> u16 {
    0x20 + i as u16
}

/// A fabric of `n` soft HCAs with one port each ([`node_guid`], [`lid`]).
pub fn fabric(n: usize) -> Fabric {
    let fabric = Fabric::new();
    for i in 0..n {
        let mut cfg = HcaConfig::new(node_guid(i), &[lid(i)]);
        cfg.name = format!("stress{i}");
        fabric
            .add_hca(cfg)
            .expect("invariant: distinct GUIDs and LIDs");
    }
    fabric
}

// ------------------------------------------------------------- randomness --

/// splitmix64 of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A xorshift64 generator (one per worker thread).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// Seeded; any seed works.
    pub fn new(seed: u64) -> XorShift {
        XorShift(mix(seed) | 1)
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

// ------------------------------------------------------------- operations --

/// The API calls the stress run (and the `al_api` fuzz check) make, each
/// with the errors it is documented to return under concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    OpenAl,
    CloseAl,
    OpenCa,
    AttachCm,
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
    Accept,
    Reject,
    Mra,
    Rtu,
    Disconnect,
    DisconnectReply,
    DestroyCep,
}

impl Op {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::OpenAl => "open_al",
            Op::CloseAl => "close_al",
            Op::OpenCa => "open_ca",
            Op::AttachCm => "attach_cm",
            Op::CloseCa => "close_ca",
            Op::AllocPd => "alloc_pd",
            Op::DestroyPd => "destroy_pd",
            Op::CreateCq => "create_cq",
            Op::DestroyCq => "destroy_cq",
            Op::CreateQp => "create_qp",
            Op::DestroyQp => "destroy_qp",
            Op::RegisterMr => "register_mr",
            Op::DestroyMr => "destroy_mr",
            Op::Listen => "listen",
            Op::DestroyListen => "destroy_listen",
            Op::Connect => "connect",
            Op::Accept => "accept",
            Op::Reject => "reject",
            Op::Mra => "mra",
            Op::Rtu => "rtu",
            Op::Disconnect => "disconnect",
            Op::DisconnectReply => "disconnect_reply",
            Op::DestroyCep => "destroy_cep",
        }
    }

    /// Whether `e` is an answer this call documents (for a caller racing
    /// other threads, the CM and the network). Anything else is a failure.
    pub fn allows(self, e: &Error) -> bool {
        use Error as E;
        // Any call naming an object may find it destroyed or being destroyed.
        let gone = matches!(e, E::InvalidHandle { .. } | E::Destroying { .. });
        gone || match self {
            Op::OpenAl | Op::CloseAl => false,
            Op::OpenCa | Op::AllocPd | Op::CreateCq | Op::RegisterMr | Op::AttachCm => {
                matches!(e, E::InsufficientResources(_))
            }
            Op::CreateQp => matches!(
                e,
                E::InsufficientResources(_) | E::ResourceBusy(_) | E::InvalidState(_)
            ),
            Op::CloseCa | Op::DestroyPd | Op::DestroyQp | Op::DestroyMr => false,
            Op::DestroyListen | Op::DestroyCep => false,
            Op::DestroyCq => matches!(e, E::ResourceBusy(_)),
            Op::Listen => matches!(e, E::InvalidSetting(_) | E::InsufficientResources(_)),
            Op::Connect => matches!(
                e,
                E::AlreadyConnected
                    | E::QpInTimewait
                    | E::InvalidParameter(_)
                    | E::InvalidState(_)
                    | E::InsufficientResources(_)
            ),
            Op::Accept => matches!(
                e,
                E::AlreadyConnected
                    | E::QpInTimewait
                    | E::InvalidParameter(_)
                    | E::InvalidState(_)
                    | E::InvalidQpState(_)
                    | E::NotFound(_)
            ),
            Op::Rtu => matches!(
                e,
                E::InvalidState(_) | E::InvalidQpState(_) | E::NotFound(_)
            ),
            Op::Reject | Op::Mra | Op::Disconnect | Op::DisconnectReply => {
                matches!(e, E::InvalidState(_) | E::NotFound(_))
            }
        }
    }
}

/// The variant name of an error (what the report counts).
pub fn error_name(e: &Error) -> &'static str {
    match e {
        Error::InvalidHandle { .. } => "InvalidHandle",
        Error::Destroying { .. } => "Destroying",
        Error::InvalidState(_) => "InvalidState",
        Error::InvalidQpState(_) => "InvalidQpState",
        Error::ResourceBusy(_) => "ResourceBusy",
        Error::InvalidParameter(_) => "InvalidParameter",
        Error::InvalidSetting(_) => "InvalidSetting",
        Error::InsufficientResources(_) => "InsufficientResources",
        Error::InsufficientMemory => "InsufficientMemory",
        Error::NotFound(_) => "NotFound",
        Error::Timeout(_) => "Timeout",
        Error::Canceled(_) => "Canceled",
        Error::Unsupported(_) => "Unsupported",
        Error::InvalidPermission(_) => "InvalidPermission",
        Error::Overflow(_) => "Overflow",
        Error::AlreadyConnected => "AlreadyConnected",
        Error::QpInTimewait => "QpInTimewait",
        Error::WouldDeadlock(_) => "WouldDeadlock",
        Error::RemoteError(_) => "RemoteError",
        Error::Leaked(_) => "Leaked",
        _ => "Other",
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

// ------------------------------------------------------- shared run state --

/// What the checks of one run share: counters, the failure list, the CEP
/// event tracker and the destroy-callback counters. Used by the stress run
/// and by the `al_api` fuzz check.
pub struct Checker {
    seed: u64,
    seq: AtomicU64,
    /// (op name, outcome) -> count, for calls made from callbacks.
    callback_ops: Mutex<BTreeMap<(String, &'static str), u64>>,
    events: Mutex<BTreeMap<&'static str, u64>>,
    failures: Mutex<Vec<String>>,
    failure_count: AtomicU64,
    /// CEP handles that got `Released`.
    released: Mutex<HashSet<u64>>,
    /// Destroy callbacks registered and not yet seen to run.
    destroy_waiting: Mutex<Vec<(String, Arc<AtomicU32>)>>,
    destroy_registered: AtomicU64,
    destroy_twice: AtomicU64,
    callback_panics: AtomicU64,
}

/// The most failure messages a run keeps (all are counted).
const KEEP_FAILURES: usize = 50;

impl Checker {
    /// A checker whose callback decisions derive from `seed`.
    pub fn new(seed: u64) -> Arc<Checker> {
        Arc::new(Checker {
            seed,
            seq: AtomicU64::new(0),
            callback_ops: Mutex::new(BTreeMap::new()),
            events: Mutex::new(BTreeMap::new()),
            failures: Mutex::new(Vec::new()),
            failure_count: AtomicU64::new(0),
            released: Mutex::new(HashSet::new()),
            destroy_waiting: Mutex::new(Vec::new()),
            destroy_registered: AtomicU64::new(0),
            destroy_twice: AtomicU64::new(0),
            callback_panics: AtomicU64::new(0),
        })
    }

    /// Record a failure.
    pub fn fail(&self, msg: String) {
        self.failure_count.fetch_add(1, Ordering::Relaxed);
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < KEEP_FAILURES {
            f.push(msg);
        }
    }

    /// Failures so far.
    pub fn failure_count(&self) -> u64 {
        self.failure_count.load(Ordering::Relaxed)
    }

    /// The kept failure messages.
    pub fn failures(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A pseudo-random number for a callback's decision.
    pub fn rand(&self) -> u64 {
        mix(self.seed ^ mix(self.seq.fetch_add(1, Ordering::Relaxed)))
    }

    /// The outcome name of `r`; an error `op` does not document is a
    /// failure.
    pub fn outcome<T>(&self, op: Op, r: &al::Result<T>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => {
                if !op.allows(e) {
                    self.fail(format!("{}: unexpected error {e:?}", op.name()));
                }
                error_name(e)
            }
        }
    }

    /// Count a call made from a callback.
    pub fn record_callback<T>(&self, op: Op, r: &al::Result<T>) {
        let outcome = self.outcome(op, r);
        *self
            .callback_ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((format!("cb:{}", op.name()), outcome))
            .or_default() += 1;
    }

    /// Note one CM event of `cep`: an event after `Released` (including a
    /// second `Released`) is a failure.
    pub fn note_event(&self, cep: Handle<Cep>, ev: &Event) {
        let name = ev.name();
        *self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name)
            .or_default() += 1;
        let key = cep.as_u64();
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if released.contains(&key) {
            drop(released);
            self.fail(format!("CEP {cep}: {name} after Released"));
            return;
        }
        if matches!(ev, Event::Released { .. }) {
            released.insert(key);
        }
    }

    /// A destroy callback for `what` that counts its calls; a second call
    /// is a failure. Keep the counter with [`track_destroy`](Self::track_destroy)
    /// if the destroy call took the callback.
    pub fn destroy_callback(self: &Arc<Self>, what: String) -> (DestroyCallback, Arc<AtomicU32>) {
        let counter = Arc::new(AtomicU32::new(0));
        let (c, me) = (counter.clone(), self.clone());
        let cb: DestroyCallback = Box::new(move |h| {
            if c.fetch_add(1, Ordering::AcqRel) != 0 {
                me.destroy_twice.fetch_add(1, Ordering::Relaxed);
                me.fail(format!("destroy callback of {what} ({h}) ran twice"));
            }
        });
        (cb, counter)
    }

    /// The destroy call that got `counter`'s callback returned `r`: on
    /// success the callback must run exactly once; on failure never.
    pub fn track_destroy(&self, what: String, counter: Arc<AtomicU32>, r: &al::Result<()>) {
        if r.is_ok() {
            self.destroy_registered.fetch_add(1, Ordering::Relaxed);
            let mut w = self
                .destroy_waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            w.push((what, counter));
            if w.len() > 4096 {
                w.retain(|(_, c)| c.load(Ordering::Acquire) == 0);
            }
        } else {
            // Give a wrongly taken callback a moment to show itself.
            if counter.load(Ordering::Acquire) != 0 {
                self.fail(format!("destroy of {what} failed but its callback ran"));
            }
        }
    }

    /// Destroy `h` in `al` with a counting callback.
    pub fn destroy<T: Object>(self: &Arc<Self>, al: &AlInstance, h: Handle<T>) -> al::Result<()> {
        let what = format!("{} {h}", T::KIND);
        let (cb, counter) = self.destroy_callback(what.clone());
        let r = al.destroy(h, Some(cb));
        self.track_destroy(what, counter, &r);
        r
    }

    /// Wait (at most `limit`) until every tracked destroy callback ran;
    /// those that did not are failures. Returns how many never ran.
    pub fn settle_destroy_callbacks(&self, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let mut w = self
                .destroy_waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            w.retain(|(_, c)| c.load(Ordering::Acquire) == 0);
            if w.is_empty() {
                return 0;
            }
            if Instant::now() >= deadline {
                let never = w.len() as u64;
                let names: Vec<String> = w.iter().take(5).map(|(n, _)| n.clone()).collect();
                drop(w);
                self.fail(format!(
                    "{never} destroy callbacks never ran (first: {})",
                    names.join(", ")
                ));
                return never;
            }
            drop(w);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Run `f` (a callback body), counting a panic as a failure.
    pub fn guarded(&self, what: &str, f: impl FnOnce()) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
            self.callback_panics.fetch_add(1, Ordering::Relaxed);
            self.fail(format!("{what} callback panicked: {}", panic_text(&*p)));
        }
    }

    /// Close `al` (the blocking `Al::close` on a helper thread when `sync`,
    /// else `close_async` with a counting destroy callback and a bounded
    /// wait), check it is clean and that no callback of it panicked, and
    /// return its final stats (`None` if it did not finish in `limit`).
    pub fn close_al(self: &Arc<Self>, al: Al, sync: bool, limit: Duration) -> Option<Stats> {
        let inst = al.instance().clone();
        let name = format!("AL {}", al.handle());
        let finished = if sync {
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("ibal-stress-close".into())
                .spawn(move || {
                    let _ = tx.send(al.close());
                });
            match spawned {
                Err(e) => {
                    self.fail(format!("cannot start a close thread: {e}"));
                    false
                }
                Ok(_) => match rx.recv_timeout(limit) {
                    Ok(r) => {
                        self.outcome(Op::CloseAl, &r);
                        true
                    }
                    Err(_) => false,
                },
            }
        } else {
            let (cb, counter) = self.destroy_callback(name.clone());
            let r = inst.close_async(Some(cb));
            self.outcome(Op::CloseAl, &r);
            self.track_destroy(name.clone(), counter, &r);
            let deadline = Instant::now() + limit;
            let done = loop {
                if inst.stats().is_clean() && inst.executor().pending() == 0 {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_micros(500));
            };
            drop(al);
            done
        };
        let (_, panicked) = inst.executor().counts();
        if panicked != 0 {
            self.fail(format!("{name}: {panicked} callbacks panicked"));
        }
        let stats = inst.stats();
        if !finished {
            self.fail(format!(
                "{name}: close did not finish in {limit:?}: {stats}"
            ));
            return None;
        }
        if !stats.is_clean() {
            self.fail(format!("{name}: live objects after close: {stats}"));
        }
        Some(stats)
    }
}

// ----------------------------------------------------------- AL contexts --

/// The objects of one AL the run knows about (by handle; destroyed ones
/// drop out when a call finds them gone).
#[derive(Default)]
struct Objs {
    cas: Vec<(Handle<Ca>, usize)>,
    pds: Vec<(Handle<Pd>, Handle<Ca>)>,
    cqs: Vec<(Handle<Cq>, Handle<Ca>)>,
    qps: Vec<(Handle<Qp>, usize)>,
    mrs: Vec<Handle<Mr>>,
    listens: Vec<Handle<Listen>>,
    ceps: Vec<Handle<Cep>>,
    /// Passive CEPs waiting for the worker's accept or reject, with their HCA.
    pending: Vec<(Handle<Cep>, usize)>,
}

impl Objs {
    fn prune(&mut self, al: &AlInstance) {
        self.cas.retain(|(h, _)| al.resolve(*h).is_ok());
        self.pds.retain(|(h, _)| al.resolve(*h).is_ok());
        self.cqs.retain(|(h, _)| al.resolve(*h).is_ok());
        self.qps.retain(|(h, _)| al.resolve(*h).is_ok());
        self.mrs.retain(|h| al.resolve(*h).is_ok());
        self.listens.retain(|h| al.resolve(*h).is_ok());
        self.ceps.retain(|h| al.resolve(*h).is_ok());
        self.pending.retain(|(h, _)| al.resolve(*h).is_ok());
    }
}

/// One AL instance and what the run knows of its objects; the CM handlers
/// of its listens and CEPs share it.
struct AlCtx {
    inst: Arc<AlInstance>,
    checker: Arc<Checker>,
    objs: Mutex<Objs>,
}

impl AlCtx {
    fn objs(&self) -> std::sync::MutexGuard<'_, Objs> {
        self.objs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn qp_on(&self, hca: usize, r: u64) -> Option<Handle<Qp>> {
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
    fn cep_handler(self: &Arc<Self>) -> CmHandler {
        let ctx = self.clone();
        Arc::new(move |cep, ev| {
            let c = &ctx.checker;
            c.guarded("CEP", || {
                c.note_event(cep, ev);
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
    fn listen_handler(self: &Arc<Self>, hca: usize) -> ListenHandler {
        let ctx = self.clone();
        Arc::new(move |_listen, cep, ev| {
            let c = &ctx.checker;
            c.guarded("listen", || {
                c.note_event(cep, ev);
                let r = c.rand() % 100;
                if r < 55 {
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
}

// ---------------------------------------------------------------- config --

/// Settings of one stress run.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// How long the workers run.
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
    /// Fault probabilities for UD/GSI/UC packets (the CM MADs).
    pub drop: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Probability a packet is held for 1..=3 progress ticks.
    pub delay: f64,
    /// Seed of the worker generators, the callbacks and the fabric faults.
    pub seed: u64,
    /// Soft HCAs on the fabric.
    pub hcas: usize,
    /// Create every listen once, before the workers start, in a listener
    /// AL of its own (with a pool of QPs per HCA to accept on), instead of
    /// letting the workers listen and cancel at random. Avoids calling
    /// `cm::listen` while CM traffic flows (see `docs/stress.md`, known
    /// bugs).
    pub static_listens: bool,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            seconds: 10.0,
            threads: 4,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            seed: 1,
            hcas: 4,
            static_listens: false,
        }
    }
}

// ---------------------------------------------------------------- report --

/// What a run did and found.
#[derive(Clone, Debug)]
pub struct StressReport {
    pub config: StressConfig,
    pub elapsed_s: f64,
    /// Operation -> outcome ("ok" or the error variant) -> count. Calls
    /// made from CM callbacks are prefixed `cb:`.
    pub ops: BTreeMap<String, BTreeMap<&'static str, u64>>,
    /// CM events delivered, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Per object kind: (created, live after close), summed over every AL.
    pub objects: Vec<(&'static str, usize, usize)>,
    pub als_opened: u64,
    pub als_closed: u64,
    pub destroy_callbacks: u64,
    pub destroy_callbacks_twice: u64,
    pub destroy_callbacks_never: u64,
    pub callback_panics: u64,
    pub fabric: hca::FabricStats,
    pub ticks: u64,
    pub active_ports_after: usize,
    /// Workers that did not finish within [`STUCK_LIMIT`] of the end, and
    /// the action each was in (a deadlock): nothing is closed then.
    pub stuck_workers: Vec<(usize, String)>,
    pub failure_count: u64,
    pub failures: Vec<String>,
}

impl StressReport {
    /// Whether the run found nothing wrong.
    pub fn ok(&self) -> bool {
        self.failure_count == 0 && self.stuck_workers.is_empty()
    }

    fn live_total(&self) -> usize {
        self.objects.iter().map(|o| o.2).sum()
    }

    /// A human-readable summary.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "ibal stress: {} threads for {:.1} s on {} soft HCAs, seed {}, faults drop {} dup {} reorder {} delay {}{}\n\n",
            c.threads,
            self.elapsed_s,
            c.hcas,
            c.seed,
            c.drop,
            c.duplicate,
            c.reorder,
            c.delay,
            if c.static_listens { ", static listens" } else { "" }
        );
        out.push_str("  operation              total  outcomes\n");
        for (op, outcomes) in &self.ops {
            let total: u64 = outcomes.values().sum();
            let detail: Vec<String> = outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out.push_str(&format!("  {op:<20} {total:>8}  {}\n", detail.join(", ")));
        }
        out.push_str("\n  CM events:");
        for (k, v) in &self.events {
            out.push_str(&format!(" {k} {v},"));
        }
        out.pop();
        out.push_str(&format!(
            "\n  fabric: {} delivered, {} dropped, {} duplicated, {} reordered, {} delayed ({} progress ticks)\n",
            self.fabric.delivered,
            self.fabric.dropped_fault,
            self.fabric.duplicated,
            self.fabric.reordered,
            self.fabric.delayed,
            self.ticks
        ));
        out.push_str("\n  object kind       created  live after close\n");
        for (k, created, live) in &self.objects {
            out.push_str(&format!("  {k:<14} {created:>10}  {live:>8}\n"));
        }
        out.push_str(&format!(
            "\n  ALs opened {} / closed {}; destroy callbacks {} (twice {}, never {}); callback panics {}; CM agents left {}\n",
            self.als_opened,
            self.als_closed,
            self.destroy_callbacks,
            self.destroy_callbacks_twice,
            self.destroy_callbacks_never,
            self.callback_panics,
            self.active_ports_after
        ));
        for (id, action) in &self.stuck_workers {
            out.push_str(&format!(
                "  STUCK: worker {id} never returned from {action} (deadlock?); ALs were not closed\n"
            ));
        }
        if self.ok() {
            out.push_str(&format!(
                "  result: PASS ({} live objects after close, no failures)\n",
                self.live_total()
            ));
        } else {
            out.push_str(&format!(
                "  result: FAIL ({} failures)\n",
                self.failure_count
            ));
            for f in &self.failures {
                out.push_str(&format!("    - {f}\n"));
            }
        }
        out
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        fn esc(s: &str) -> String {
            s.chars()
                .flat_map(|c| match c {
                    '"' => "\\\"".chars().collect::<Vec<_>>(),
                    '\\' => "\\\\".chars().collect(),
                    c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
                    c => vec![c],
                })
                .collect()
        }
        let c = &self.config;
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|(op, outcomes)| {
                let o: Vec<String> = outcomes
                    .iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("\"{}\":{{{}}}", esc(op), o.join(","))
            })
            .collect();
        let events: Vec<String> = self
            .events
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        let objects: Vec<String> = self
            .objects
            .iter()
            .map(|(k, created, live)| format!("\"{k}\":{{\"created\":{created},\"live\":{live}}}"))
            .collect();
        let failures: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("\"{}\"", esc(f)))
            .collect();
        let f = &self.fabric;
        format!(
            "{{\"job\":\"stress\",\"ok\":{},\"seconds\":{:.3},\"threads\":{},\"hcas\":{},\"seed\":{},\"drop\":{},\"dup\":{},\"reorder\":{},\"delay\":{},\"ops\":{{{}}},\"events\":{{{}}},\"objects\":{{{}}},\"live_after_close\":{},\"als_opened\":{},\"als_closed\":{},\"destroy_callbacks\":{},\"destroy_callbacks_twice\":{},\"destroy_callbacks_never\":{},\"callback_panics\":{},\"fabric\":{{\"delivered\":{},\"dropped\":{},\"duplicated\":{},\"reordered\":{},\"delayed\":{},\"ticks\":{}}},\"active_ports_after\":{},\"stuck_workers\":[{}],\"failure_count\":{},\"failures\":[{}]}}",
            self.ok(),
            self.elapsed_s,
            c.threads,
            c.hcas,
            c.seed,
            c.drop,
            c.duplicate,
            c.reorder,
            c.delay,
            ops.join(","),
            events.join(","),
            objects.join(","),
            self.live_total(),
            self.als_opened,
            self.als_closed,
            self.destroy_callbacks,
            self.destroy_callbacks_twice,
            self.destroy_callbacks_never,
            self.callback_panics,
            f.delivered,
            f.dropped_fault,
            f.duplicated,
            f.reordered,
            f.delayed,
            self.ticks,
            self.active_ports_after,
            self.stuck_workers
                .iter()
                .map(|(id, a)| format!("{{\"worker\":{id},\"action\":\"{}\"}}", esc(a)))
                .collect::<Vec<_>>()
                .join(","),
            self.failure_count,
            failures.join(",")
        )
    }
}

// ---------------------------------------------------------------- workers --

/// What a worker does next (weights per mille).
#[derive(Clone, Copy, Debug)]
enum Action {
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
    Pause,
}

const ACTIONS: [(Action, u32); 20] = [
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
    (Action::Pause, 381),
];

const MAX_CAS: usize = 4;
const MAX_PDS: usize = 6;
const MAX_CQS: usize = 6;
const MAX_QPS: usize = 16;
const MAX_MRS: usize = 8;
const MAX_LISTENS: usize = 6;
const MAX_CEPS: usize = 64;

const ALL_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

struct Slot {
    al: Al,
    ctx: Arc<AlCtx>,
}

/// What a worker is doing, for the watchdog.
#[derive(Default)]
struct WorkerStatus {
    steps: AtomicU64,
    /// Index in [`ACTIONS`] of the action under way (`usize::MAX`: none).
    action: std::sync::atomic::AtomicUsize,
}

/// How long after the deadline a worker may take to return before the run
/// calls it stuck (a close may take up to [`CLOSE_LIMIT`]).
pub const STUCK_LIMIT: Duration = Duration::from_secs(60);

struct Worker {
    id: usize,
    status: Arc<WorkerStatus>,
    static_listens: bool,
    checker: Arc<Checker>,
    provider: SoftProvider,
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
        let stats = self.checker.close_al(slot.al, sync, CLOSE_LIMIT);
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
                let r = verbs::open_ca(&inst, &self.provider, node_guid(hca));
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
        let mut req = ConnectRequest::new(service_id(target, k), lid(target));
        // Response waits of a few ms, so retries and timeouts happen often.
        req.cm_response_timeout = 8 + self.rng.below(4) as u8;
        req.local_ack_timeout = 8 + self.rng.below(4) as u8;
        req.max_cm_retries = self.rng.below(4) as u8;
        let r = cm::connect(&ctx.inst, qp, &req, ctx.cep_handler());
        self.count(Op::Connect, &r);
        match r {
            Ok(cep) => ctx.objs().ceps.push(cep),
            Err(Error::InvalidHandle { .. }) => ctx.objs().qps.retain(|x| x.0 != qp),
            Err(_) => {}
        }
    }
}

thread_local! {
    /// Stats of the ALs a worker closed (collected when it ends).
    static ADD_STATS: std::cell::RefCell<Vec<Stats>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct WorkerOut {
    ops: BTreeMap<(String, &'static str), u64>,
    als: Vec<Al>,
    closed: Vec<Stats>,
    opened: u64,
    closed_count: u64,
}

fn worker(
    id: usize,
    status: Arc<WorkerStatus>,
    checker: Arc<Checker>,
    provider: SoftProvider,
    cfg: StressConfig,
    deadline: Instant,
) -> WorkerOut {
    let mut w = Worker {
        id,
        status,
        static_listens: cfg.static_listens,
        checker,
        provider,
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
        als: w.als.into_iter().map(|s| s.al).collect(),
        closed: ADD_STATS.with(|a| std::mem::take(&mut *a.borrow_mut())),
        opened: w.als_opened,
        closed_count: w.als_closed,
    }
}

// -------------------------------------------------------------------- run --

/// The listener AL of `--static-listens`: every HCA's CA with the CM
/// attached, a PD, a CQ and a pool of RC QPs to accept on, and a listen on
/// every service. Made before any CM traffic flows.
fn static_listener(
    checker: &Arc<Checker>,
    provider: &SoftProvider,
    hcas: usize,
) -> Result<Al, String> {
    let al = Al::open().map_err(|e| e.to_string())?;
    let ctx = Arc::new(AlCtx {
        inst: al.instance().clone(),
        checker: checker.clone(),
        objs: Mutex::new(Objs::default()),
    });
    let inst = &ctx.inst;
    for hca in 0..hcas {
        let err = |e: Error| format!("static listener on HCA {hca}: {e}");
        let ca = verbs::open_ca(inst, provider, node_guid(hca)).map_err(err)?;
        cm::attach_ca(inst, ca).map_err(err)?;
        let pd = verbs::alloc_pd(inst, ca).map_err(err)?;
        let cq = verbs::create_cq(inst, ca, 256, None, None).map_err(err)?;
        for _ in 0..MAX_QPS {
            let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).map_err(err)?;
            ctx.objs().qps.push((qp, hca));
        }
        for k in 0..SERVICES_PER_HCA {
            cm::listen(
                inst,
                ca,
                1,
                service_id(hca, k),
                ctx.listen_handler(hca),
                ctx.cep_handler(),
            )
            .map_err(err)?;
        }
    }
    Ok(al)
}

/// Run the stress test.
pub fn run(cfg: &StressConfig) -> Result<StressReport, String> {
    if cfg.threads == 0 || cfg.hcas == 0 || cfg.hcas > 64 || cfg.seconds.is_nan() {
        return Err("--threads must be >= 1 and the HCAs 1..=64".into());
    }
    for (name, p) in [
        ("--drop", cfg.drop),
        ("--dup", cfg.duplicate),
        ("--reorder", cfg.reorder),
        ("--delay", cfg.delay),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{name} must be a probability in 0..=1, got {p}"));
        }
    }
    let t0 = Instant::now();
    let ports_before = cm::active_ports();
    let fabric = fabric(cfg.hcas);
    fabric.set_faults(Some(FaultConfig {
        seed: cfg.seed,
        drop: cfg.drop,
        duplicate: cfg.duplicate,
        reorder: cfg.reorder,
        delay: cfg.delay,
        max_delay: 3,
    }));
    let provider = SoftProvider::new(fabric.clone());
    let checker = Checker::new(cfg.seed);

    // While faults are on, every CM MAD waits in the fabric's queue until
    // someone calls progress(): that is this thread.
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (fabric, stop, ticks) = (fabric.clone(), stop.clone(), ticks.clone());
        std::thread::Builder::new()
            .name("ibal-stress-ticker".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    fabric.progress();
                    ticks.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
            .map_err(|e| e.to_string())?
    };

    let mut remaining = Vec::new();
    let mut opened = 0;
    if cfg.static_listens {
        remaining.push(static_listener(&checker, &provider, cfg.hcas)?);
        opened += 1;
    }

    let deadline = Instant::now() + Duration::from_secs_f64(cfg.seconds.max(0.0));
    let statuses: Vec<Arc<WorkerStatus>> = (0..cfg.threads).map(|_| Arc::default()).collect();
    let handles: Vec<_> = (0..cfg.threads)
        .map(|id| {
            let (checker, provider, cfg) = (checker.clone(), provider.clone(), cfg.clone());
            let status = statuses[id].clone();
            std::thread::Builder::new()
                .name(format!("ibal-stress-{id}"))
                .spawn(move || worker(id, status, checker, provider, cfg, deadline))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;

    let mut ops: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut closed = Vec::new();
    let mut closed_count = 0;
    let mut stuck_workers = Vec::new();
    for (id, h) in handles.into_iter().enumerate() {
        while !h.is_finished() && Instant::now() < deadline + STUCK_LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !h.is_finished() {
            let a = statuses[id].action.load(Ordering::Acquire);
            let action = ACTIONS
                .get(a)
                .map_or("(between actions)".to_string(), |x| format!("{:?}", x.0));
            checker.fail(format!(
                "worker {id} stuck in {action} at step {} for over {STUCK_LIMIT:?} (deadlock?)",
                statuses[id].steps.load(Ordering::Acquire)
            ));
            stuck_workers.push((id, action));
            continue;
        }
        match h.join() {
            Ok(out) => {
                for ((op, outcome), n) in out.ops {
                    *ops.entry(op).or_default().entry(outcome).or_default() += n;
                }
                closed.extend(out.closed);
                remaining.extend(out.als);
                opened += out.opened;
                closed_count += out.closed_count;
            }
            Err(p) => checker.fail(format!("a worker thread died: {}", panic_text(&*p))),
        }
    }
    if !stuck_workers.is_empty() {
        // Closing would block on whatever the stuck workers hold.
        stop.store(true, Ordering::Release);
        std::mem::forget(remaining);
        return Ok(StressReport {
            config: cfg.clone(),
            elapsed_s: t0.elapsed().as_secs_f64(),
            ops,
            events: checker
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            objects: Vec::new(),
            als_opened: opened,
            als_closed: closed_count,
            destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
            destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
            destroy_callbacks_never: 0,
            callback_panics: checker.callback_panics.load(Ordering::Relaxed),
            fabric: fabric.stats(),
            ticks: ticks.load(Ordering::Relaxed),
            active_ports_after: cm::active_ports().saturating_sub(ports_before),
            stuck_workers,
            failure_count: checker.failure_count(),
            failures: checker.failures(),
        });
    }
    // Close every AL that is still open, alternating the two ways.
    for (i, al) in remaining.into_iter().enumerate() {
        let stats = checker.close_al(al, i % 2 == 0, CLOSE_LIMIT);
        *ops.entry(Op::CloseAl.name().to_string())
            .or_default()
            .entry(if stats.is_some() { "ok" } else { "hung" })
            .or_default() += 1;
        closed_count += 1;
        closed.extend(stats);
    }
    let never = checker.settle_destroy_callbacks(Duration::from_secs(10));
    // Agents shut down when their last user (CM port, listen, CEP) goes.
    let wait_ports = Instant::now() + Duration::from_secs(10);
    while cm::active_ports() > ports_before && Instant::now() < wait_ports {
        std::thread::sleep(Duration::from_millis(2));
    }
    let active_ports_after = cm::active_ports().saturating_sub(ports_before);
    if active_ports_after != 0 {
        checker.fail(format!(
            "{active_ports_after} CM agents still running after every AL closed"
        ));
    }
    stop.store(true, Ordering::Release);
    let _ = ticker.join();
    fabric.set_faults(None);

    for ((op, outcome), n) in checker
        .callback_ops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        *ops.entry(op.clone())
            .or_default()
            .entry(outcome)
            .or_default() += n;
    }
    let objects = Kind::NAMED
        .iter()
        .filter(|k| **k != Kind::AL)
        .map(|k| {
            let created = closed.iter().map(|s| s.created(*k)).sum();
            let live = closed.iter().map(|s| s.live(*k)).sum();
            (k.name(), created, live)
        })
        .collect();
    let events = checker
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(StressReport {
        config: cfg.clone(),
        elapsed_s: t0.elapsed().as_secs_f64(),
        ops,
        events,
        objects,
        als_opened: opened,
        als_closed: closed_count,
        destroy_callbacks: checker.destroy_registered.load(Ordering::Relaxed),
        destroy_callbacks_twice: checker.destroy_twice.load(Ordering::Relaxed),
        destroy_callbacks_never: never,
        callback_panics: checker.callback_panics.load(Ordering::Relaxed),
        fabric: fabric.stats(),
        ticks: ticks.load(Ordering::Relaxed),
        active_ports_after,
        stuck_workers,
        failure_count: checker.failure_count(),
        failures: checker.failures(),
    })
}

/// The `ibal stress` command: run, print the summary (or JSON), and fail
/// when the run found anything wrong.
pub fn main(cfg: &StressConfig, json: bool) -> Result<(), String> {
    let report = run(cfg)?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.ok() {
        Ok(())
    } else {
        Err(format!(
            "stress: {} failures (seed {})",
            report.failure_count, cfg.seed
        ))
    }
}
