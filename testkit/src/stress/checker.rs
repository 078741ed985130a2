//! What the checks of one run share: counters, failures, the CEP event
//! tracker and the destroy-callback counters.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{Al, AlInstance, DestroyCallback, Handle, Object, Stats};
use cep::cm::Cep;
use cep::proto::Event;

use super::ops::{error_name, panic_text, Op};
use super::rng::mix;

/// What the checks of one run share: counters, the failure list, the CEP
/// event tracker and the destroy-callback counters. Used by the stress run
/// and by the `al_api` fuzz check.
pub struct Checker {
    seed: u64,
    seq: AtomicU64,
    /// (op name, outcome) -> count, for calls made from callbacks.
    pub(super) callback_ops: Mutex<BTreeMap<(String, &'static str), u64>>,
    pub(super) events: Mutex<BTreeMap<&'static str, u64>>,
    failures: Mutex<Vec<String>>,
    failure_count: AtomicU64,
    /// CEP handles that got `Released`.
    released: Mutex<HashSet<u64>>,
    /// Probe outcomes (double accepts, accepts on active CEPs, SIDR ends,
    /// leak checks), by name.
    pub(super) probes: Mutex<BTreeMap<&'static str, u64>>,
    /// SIDR CEPs whose end is still to be seen: CEP handle -> (AL id, state).
    sidr: Mutex<HashMap<u64, (u64, Arc<SidrState>)>>,
    /// Destroy callbacks registered and not yet seen to run.
    destroy_waiting: Mutex<Vec<(String, Arc<AtomicU32>)>>,
    pub(super) destroy_registered: AtomicU64,
    pub(super) destroy_twice: AtomicU64,
    pub(super) callback_panics: AtomicU64,
}

/// How long an active SIDR request may go without its reply or timeout
/// (its own retries end within ~50 ms: 4 waits of at most 8.4 ms + 2 x
/// PacketLifeTime; the rest is slack for a loaded machine).
pub(super) const SIDR_ACTIVE_END_LIMIT: Duration = Duration::from_secs(10);
/// How long a received SIDR request may go without an end: the CM's answer
/// deadline (`cep::proto::SIDR_ANSWER_DEADLINE_NANOS`, about 21 s) plus slack.
pub(super) const SIDR_PASSIVE_END_LIMIT: Duration = Duration::from_secs(30);
/// How long after a passive SIDR CEP's `Released` the end our own
/// `sidr_reply` counts may still be on its way (the reply frees the id, so
/// the `Released` may overtake the call's return).
pub(super) const SIDR_END_GRACE: Duration = Duration::from_secs(1);
/// How long a SIDR CEP may still exist after its `Released`.
pub(super) const SIDR_GONE_LIMIT: Duration = Duration::from_secs(2);

/// What is known of one SIDR CEP's life: its ends (reply, timeout, or for
/// the passive side our `sidr_reply`) and its `Released`.
pub(super) struct SidrState {
    pub(super) passive: bool,
    pub(super) started: Instant,
    pub(super) ends: AtomicU32,
    pub(super) released_at: Mutex<Option<Instant>>,
}

impl SidrState {
    pub(super) fn new(passive: bool) -> Arc<SidrState> {
        Arc::new(SidrState {
            passive,
            started: Instant::now(),
            ends: AtomicU32::new(0),
            released_at: Mutex::new(None),
        })
    }

    /// Note one end; a second is a failure.
    pub(super) fn end(&self, checker: &Checker, cep: Handle<Cep>, what: &'static str) {
        if self.ends.fetch_add(1, Ordering::AcqRel) != 0 {
            checker.fail(format!("SIDR CEP {cep}: a second end ({what})"));
        }
        checker.count_probe(what);
    }

    pub(super) fn released(&self) {
        *self.released_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
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
            probes: Mutex::new(BTreeMap::new()),
            sidr: Mutex::new(HashMap::new()),
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
        self.record_as(format!("cb:{}", op.name()), op, r);
    }

    /// Count a call under the row `label` of the table (judged as `op`).
    pub fn record_as<T>(&self, label: String, op: Op, r: &al::Result<T>) {
        let outcome = self.outcome(op, r);
        *self
            .callback_ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((label, outcome))
            .or_default() += 1;
    }

    /// Count one probe outcome.
    pub fn count_probe(&self, what: &'static str) {
        self.count_probes(what, 1);
    }

    /// The probe counters so far.
    pub fn probes(&self) -> BTreeMap<&'static str, u64> {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Count `n` of one probe outcome.
    pub fn count_probes(&self, what: &'static str, n: u64) {
        *self
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what)
            .or_default() += n;
    }

    /// Whether `cep` got its `Released` event.
    pub fn was_released(&self, cep: Handle<Cep>) -> bool {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&cep.as_u64())
    }

    /// Track the SIDR CEP `cep` of the AL `al_id` until its end is seen.
    pub(super) fn track_sidr(&self, al_id: u64, cep: Handle<Cep>, state: Arc<SidrState>) {
        self.sidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cep.as_u64(), (al_id, state));
    }

    /// The tracked SIDR state of `cep`, if it is a SIDR CEP being watched.
    pub(super) fn sidr_state(&self, cep: Handle<Cep>) -> Option<Arc<SidrState>> {
        self.sidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cep.as_u64())
            .map(|(_, s)| s.clone())
    }

    /// Stop watching `cep` (destroyed by the run: its end is the destroy).
    pub(super) fn untrack_sidr(&self, cep: Handle<Cep>) {
        self.sidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cep.as_u64());
    }

    /// Judge the SIDR CEPs of `inst` that can be judged now: each must have
    /// had exactly one end (a reply or a timeout; the second is caught
    /// when it happens) before its `Released`, and be gone within
    /// [`SIDR_GONE_LIMIT`] of it; one with no end after its limit is a
    /// failure. With `closing` (the AL is about to be closed) the young
    /// ones are cut by the close and dropped from the watch.
    pub(super) fn sweep_sidr(&self, inst: &AlInstance, closing: bool) {
        let now = Instant::now();
        let al_id = inst.id();
        let mut verdicts: Vec<Result<&'static str, String>> = Vec::new();
        self.sidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|raw, (al, st)| {
                if *al != al_id {
                    return true;
                }
                let cep = Handle::<Cep>::from_raw(al::RawHandle::from_u64(*raw));
                let side = if st.passive { "passive" } else { "active" };
                let ends = st.ends.load(Ordering::Acquire);
                let released = *st.released_at.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(at) = released {
                    if ends == 0 && now.duration_since(at) < SIDR_END_GRACE && !closing {
                        // Our sidr_reply may be about to count its end.
                        return true;
                    }
                    if ends == 0 {
                        verdicts.push(Err(format!(
                            "SIDR {side} CEP {cep}: Released with no reply or timeout before it"
                        )));
                        return false;
                    }
                    if inst.resolve(cep).is_err() || closing {
                        verdicts.push(Ok("sidr: ended and CEP gone"));
                        return false;
                    }
                    if now.duration_since(at) > SIDR_GONE_LIMIT {
                        verdicts.push(Err(format!(
                            "SIDR {side} CEP {cep}: still exists {SIDR_GONE_LIMIT:?} after Released"
                        )));
                        return false;
                    }
                    return true;
                }
                let limit = if st.passive {
                    SIDR_PASSIVE_END_LIMIT
                } else {
                    SIDR_ACTIVE_END_LIMIT
                };
                let age = now.duration_since(st.started);
                if age > limit {
                    verdicts.push(Err(format!(
                        "SIDR {side} CEP {cep}: no end {age:?} after the request ({ends} ends, not released)"
                    )));
                    return false;
                }
                if closing {
                    verdicts.push(Ok("sidr: cut by AL close"));
                    return false;
                }
                true
            });
        for v in verdicts {
            match v {
                Ok(what) => self.count_probe(what),
                Err(msg) => self.fail(msg),
            }
        }
    }

    /// SIDR CEPs still watched (the end of the run wants none).
    pub(super) fn sidr_watched(&self) -> usize {
        self.sidr.lock().unwrap_or_else(|p| p.into_inner()).len()
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
