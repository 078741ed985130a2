//! The connecting end: `connections` RC QPs connected through the CM with
//! at most `in_flight` connects outstanding, each stamped when its
//! `connect` call starts and when its `Established` event runs; then the
//! ping-pong on the first, the disconnect of all, or (the listener
//! killed) one SEND on each that must fail.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use al::{AlInstance, Handle};
use cep::cm::{self, Cep, CmHandler, ConnectRequest};
use cep::ip::IpConnect;
use cep::proto::Event;
use ibal::prelude::*;

use super::config::{SERVICE_ID, WAIT};
use super::end::{End, LIDS};
use super::measure::nanos_since;
use super::passive::recv_wr;
use crate::{al_err, BenchResult};

/// Where the connects go.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    /// The soft fabric's listening HCA.
    Soft,
    /// An rdma_cm-style listen at `to`, from the local address `local`.
    Udp { local: IpAddr, to: SocketAddr },
}

/// What the connections' handler records.
struct Shared {
    inst: Arc<AlInstance>,
    epoch: Instant,
    /// Per connection: ns from `epoch` when `connect` was called and when
    /// the active `Established` ran (0: not yet).
    started: Vec<AtomicU64>,
    established_at: Vec<AtomicU64>,
    established: AtomicU32,
    disconnected: AtomicU32,
    errors: AtomicU32,
    first_error: OnceLock<String>,
    /// Wakes the main thread (after each of the counts above changes).
    lock: Mutex<()>,
    changed: Condvar,
}

impl Shared {
    fn notify(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.changed.notify_all();
    }

    fn error(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_error.set(e);
        self.notify();
    }

    /// Waits until `done` holds; a connection's error ends the wait.
    fn wait(&self, what: &str, done: impl Fn(&Shared) -> bool) -> BenchResult<()> {
        let deadline = Instant::now() + WAIT;
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = self.first_error.get() {
                return Err(e.clone());
            }
            if done(self) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            let left = (deadline - now).min(Duration::from_millis(100));
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The connecting end and its connections.
pub(crate) struct Active {
    pub(crate) end: End,
    shared: Arc<Shared>,
    target: Target,
    /// The connections' QPs and CEPs, in connect order (the slot of a
    /// connection's time stamps).
    pub(crate) qps: Vec<Handle<Qp>>,
    pub(crate) ceps: Vec<Handle<Cep>>,
}

impl Active {
    /// An end ready to connect `connections` times to `target`.
    pub(crate) fn new(end: End, target: Target, connections: u32) -> Active {
        let n = connections as usize;
        // Every per-connection array is written once here, so its pages
        // are resident before the memory baseline is taken.
        let zeroed = |n: usize| {
            let mut v = Vec::with_capacity(n);
            v.resize_with(n, || AtomicU64::new(0));
            v
        };
        let shared = Arc::new(Shared {
            inst: end.al.instance().clone(),
            epoch: Instant::now(),
            started: zeroed(n),
            established_at: zeroed(n),
            established: AtomicU32::new(0),
            disconnected: AtomicU32::new(0),
            errors: AtomicU32::new(0),
            first_error: OnceLock::new(),
            lock: Mutex::new(()),
            changed: Condvar::new(),
        });
        Active {
            end,
            shared,
            target,
            qps: Vec::with_capacity(n),
            ceps: Vec::with_capacity(n),
        }
    }

    /// Connections established so far.
    pub(crate) fn established(&self) -> u32 {
        self.shared.established.load(Ordering::Acquire)
    }

    /// Connects until `upto` connections exist, with at most `in_flight`
    /// outstanding, and waits for all of them.
    pub(crate) fn connect_upto(&mut self, upto: u32, in_flight: u32) -> BenchResult<()> {
        while (self.qps.len() as u32) < upto {
            let started = self.qps.len() as u32;
            let s = self.shared.clone();
            s.wait("a connect slot", |s| {
                started - s.established.load(Ordering::Acquire) < in_flight
            })?;
            self.connect_one()?;
        }
        self.shared.wait("every connection", |s| {
            s.established.load(Ordering::Acquire) >= upto
        })
    }

    fn connect_one(&mut self) -> BenchResult<()> {
        let slot = self.qps.len();
        let qp = self.end.rc_qp()?;
        self.qps.push(qp);
        let req = match self.target {
            Target::Soft => ConnectRequest::new(SERVICE_ID, LIDS[1]),
            Target::Udp { local, to } => {
                let qpn = self
                    .end
                    .al
                    .resolve(qp)
                    .map_err(al_err("resolving a QP"))?
                    .qpn();
                IpConnect::new(to)
                    .to_request(local, 1, qpn)
                    .map_err(al_err("building the REQ"))?
            }
        };
        let s = &self.shared;
        s.started[slot].store(nanos_since(s.epoch).max(1), Ordering::Relaxed);
        let cep = cm::connect(self.end.al.instance(), qp, &req, handler(s, slot as u32))
            .map_err(al_err("connect"))?;
        self.ceps.push(cep);
        Ok(())
    }

    /// Per connection (in `connect` order): its connect latency, ns, and
    /// when it was established, ns from the run's epoch.
    pub(crate) fn times(&self) -> Vec<(u64, u64)> {
        let s = &self.shared;
        (0..self.qps.len())
            .map(|i| {
                let start = s.started[i].load(Ordering::Relaxed);
                let done = s.established_at[i].load(Ordering::Relaxed);
                (done.saturating_sub(start), done)
            })
            .collect()
    }

    /// ns from the epoch now.
    pub(crate) fn now_ns(&self) -> u64 {
        nanos_since(self.shared.epoch)
    }

    /// `iters` round trips of a 64-byte SEND ping-pong on the first
    /// connection (the peer's [`Echo`](super::passive::Echo) answering):
    /// the median round trip, us.
    pub(crate) fn ping(&self, iters: u32) -> BenchResult<f64> {
        let (al, end) = (self.end.al.instance(), &self.end);
        let qp = *self.qps.first().ok_or("no connection to ping on")?;
        qp.post_recv(al, &[recv_wr(&end.recv_sge, 0)])
            .map_err(al_err("post_recv"))?;
        let mut wc = [Wc::default(); 4];
        let mut rtts = Vec::with_capacity(iters as usize);
        // SEND completions seen: the echo's answer can come before the
        // ACK of the SEND it answers (the peer may hold that ACK), so the
        // last SENDs may complete after their round trip ended.
        let mut sends_done = 0u32;
        for _ in 0..iters {
            let start = Instant::now();
            qp.post_send(al, &[SendWr::new(1, SendOp::Send, &end.send_sge)])
                .map_err(al_err("post_send"))?;
            // An echo that failed says why when it is joined; do not wait
            // long for it.
            let deadline = start + Duration::from_secs(10);
            let mut answered = false;
            while !answered {
                let n = end.cq.poll(al, &mut wc).map_err(al_err("poll_cq"))?;
                for w in &wc[..n] {
                    if w.status != WcStatus::Success {
                        return Err(format!("ping: a completion with {:?}", w.status));
                    }
                    if w.opcode == WcOpcode::Recv {
                        answered = true;
                        qp.post_recv(al, &[recv_wr(&end.recv_sge, 0)])
                            .map_err(al_err("post_recv"))?;
                    } else {
                        sends_done += 1;
                    }
                }
                if n == 0 {
                    if Instant::now() > deadline {
                        return Err("ping: no answer".into());
                    }
                    std::thread::yield_now();
                }
            }
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
        // The receive left posted is flushed when the QP goes. Every SEND
        // completes before the ping returns, so that none completes later
        // in what follows (`send_to_the_dead` takes a success there for a
        // SEND the dead listener acknowledged: seen once in CI, the ping's
        // last SEND acknowledged after its echo had come).
        let deadline = Instant::now() + Duration::from_secs(10);
        while sends_done < iters {
            let n = end.cq.poll(al, &mut wc).map_err(al_err("poll_cq"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    return Err(format!("ping: a completion with {:?}", w.status));
                }
                if w.opcode != WcOpcode::Recv {
                    sends_done += 1;
                }
            }
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!("ping: {sends_done} of {iters} SENDs completed"));
                }
                std::thread::yield_now();
            }
        }
        rtts.sort_by(f64::total_cmp);
        Ok(rtts[rtts.len() / 2])
    }

    /// Sends a DREQ on every connection and waits until each is over
    /// (DREP received): the time that took.
    pub(crate) fn disconnect_all(&self) -> BenchResult<Duration> {
        let start = Instant::now();
        let al = self.end.al.instance();
        for &cep in &self.ceps {
            cm::disconnect(al, cep, &[]).map_err(al_err("disconnect"))?;
        }
        let n = self.ceps.len() as u32;
        self.shared.wait("every DREP", |s| {
            s.disconnected.load(Ordering::Acquire) >= n
        })?;
        Ok(start.elapsed())
    }

    /// With the peer gone: one SEND on every connection, and the time until
    /// each has completed with an error (none may succeed). Returns that
    /// time, the statuses seen, and each SEND's time from its post to its
    /// error completion, sorted.
    pub(crate) fn send_to_the_dead(&self) -> BenchResult<DeadSends> {
        let (al, end) = (self.end.al.instance(), &self.end);
        let start = Instant::now();
        let n = self.qps.len();
        let mut posted: Vec<Option<Instant>> = vec![None; n];
        let mut ended: Vec<Duration> = Vec::with_capacity(n);
        let mut statuses: Vec<(WcStatus, u64)> = Vec::new();
        let mut wc = [Wc::default(); 64];
        let mut drain = |posted: &[Option<Instant>],
                         ended: &mut Vec<Duration>,
                         statuses: &mut Vec<(WcStatus, u64)>|
         -> BenchResult<usize> {
            let got = end.cq.poll(al, &mut wc).map_err(al_err("poll_cq"))?;
            let now = Instant::now();
            let mut sends = 0;
            for w in &wc[..got] {
                if w.opcode == WcOpcode::Recv {
                    continue; // the ping QP's posted receive, flushed
                }
                if w.status == WcStatus::Success {
                    return Err(format!(
                        "a SEND to the killed listener succeeded (wr {})",
                        w.wr_id
                    ));
                }
                sends += 1;
                if let Some(Some(at)) = posted.get(w.wr_id as usize) {
                    ended.push(now - *at);
                }
                match statuses.iter_mut().find(|(s, _)| *s == w.status) {
                    Some((_, c)) => *c += 1,
                    None => statuses.push((w.status, 1)),
                }
            }
            Ok(sends)
        };
        let mut done = 0;
        for (i, &qp) in self.qps.iter().enumerate() {
            posted[i] = Some(Instant::now());
            qp.post_send(al, &[SendWr::new(i as u64, SendOp::Send, &end.send_sge)])
                .map_err(al_err("post_send"))?;
            done += drain(&posted, &mut ended, &mut statuses)?;
        }
        let deadline = Instant::now() + WAIT;
        while done < n {
            let got = drain(&posted, &mut ended, &mut statuses)?;
            done += got;
            if got == 0 {
                if Instant::now() > deadline {
                    return Err(format!("{done} of {n} SENDs to the killed listener ended"));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        ended.sort_unstable();
        Ok(DeadSends {
            took: start.elapsed(),
            statuses,
            each: ended,
        })
    }

    /// The transport's retry bound of the first connection's QP: (retry
    /// count + 1) local ACK timeouts (4.096 us x 2^timeout; IBTA 9.7.6.1.1).
    pub(crate) fn retry_bound(&self) -> BenchResult<Duration> {
        let qp = *self.qps.first().ok_or("no connection")?;
        let a = qp
            .query(self.end.al.instance())
            .map_err(al_err("query_qp"))?;
        let ack = Duration::from_nanos(4096u64 << a.timeout.min(31));
        Ok(ack * (u32::from(a.retry_cnt) + 1))
    }

    /// Errors the connections' handler saw.
    pub(crate) fn errors(&self) -> u32 {
        self.shared.errors.load(Ordering::Relaxed)
    }
}

/// What [`Active::send_to_the_dead`] saw.
pub(crate) struct DeadSends {
    pub(crate) took: Duration,
    pub(crate) statuses: Vec<(WcStatus, u64)>,
    /// Per SEND, from its post to its error completion, sorted.
    pub(crate) each: Vec<Duration>,
}

/// The handler of connection `slot`: answers the REP with an RTU and
/// stamps `Established`. One small closure per connection (its slot and
/// the shared state), as a consumer's per-connection context would be.
fn handler(s: &Arc<Shared>, slot: u32) -> CmHandler {
    let s = s.clone();
    Arc::new(move |cep, ev| {
        let i = slot as usize;
        match ev {
            Event::ReplyReceived { .. } => {
                if let Err(e) = cm::rtu(&s.inst, cep, &[]) {
                    s.error(format!("connection {slot}: rtu: {e}"));
                }
            }
            Event::Established { .. } => {
                s.established_at[i].store(nanos_since(s.epoch).max(1), Ordering::Relaxed);
                s.established.fetch_add(1, Ordering::AcqRel);
                s.notify();
            }
            Event::Disconnected { .. } => {
                s.disconnected.fetch_add(1, Ordering::AcqRel);
                s.notify();
            }
            Event::DisconnectRequest { .. } => {
                let _ = cm::disconnect_reply(&s.inst, cep, &[]);
            }
            Event::Rejected { reason, .. } => {
                s.error(format!("connection {slot} was rejected: {reason:?}"))
            }
            Event::Timeout { .. } => s.error(format!("connection {slot} timed out")),
            _ => {}
        }
    })
}
