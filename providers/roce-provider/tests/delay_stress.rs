//! Issue 30 item 4: the provider's real threads (receive, timer, pollers,
//! the reaper) on real loopback sockets, with scheduling delays injected
//! at their protocol points (`roce_provider::delay`, feature
//! `delay-points`), asserting what the loom models assert where loom
//! cannot reach (the kernel socket, real time):
//!
//! * every posted work request completes exactly once, in order, with the
//!   right bytes (SEND ping-pongs with busy-polling and with blocking,
//!   hook-notified consumers; RDMA WRITE/READ streams);
//! * no notification is lost: a blocking consumer that armed its CQ and
//!   found it empty is woken by the hook;
//! * a retransmission that must fire fires: a peer closed mid-stream ends
//!   the sender's requests in `RetryExceeded` and flushes, each once;
//! * no completion reaches a CQ after its QP was destroyed, no hook runs
//!   after its CQ was destroyed, and every destroy returns within a bound;
//! * a device closed while traffic flows is reaped within a bound, and
//!   no QP is left;
//! * the ports' counters are exact: on loopback every datagram one device
//!   sent the other received (less what the kernel says it dropped), and
//!   every datagram received was either delivered or dropped for one
//!   counted reason;
//! * every protocol point was passed, and delayed.
//!
//! `cargo test --release -p roce-provider --features delay-points --test
//! delay_stress -- --nocapture` (`IBAL_DELAY_POINTS` overrides the delays,
//! `docs/stress.md`, "Delay points").
#![cfg(feature = "delay-points")]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use provider::{
    CompletionHook, CqArm, CqInit, Device, Provider, QpCaps, QpInit, QpType, RecvWr,
    RegisteredBuffer, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use roce_provider::delay::{self, Delays, Point};
use roce_provider::{
    DeviceConfig, PortConfig, RoceCq, RoceDevice, RoceMr, RocePd, RoceProvider, RoceQp,
};

use common::{connect_with_timeout, pattern, ALL};

/// Iterations of each worker (each also stops at [`WORK_TIME`]).
const PINGPONG_BUSY: u64 = 12_000;
const PINGPONG_BLOCKING: u64 = 5000;
const RDMA_ROUNDS: u64 = 1000;
const CHURN_ROUNDS: u64 = 1000;
const CLOSE_ROUNDS: u64 = 60;

/// Longest a worker keeps starting new iterations.
const WORK_TIME: Duration = Duration::from_secs(40);
/// Longest any single wait (a completion, a notification, a reaping).
const WAIT_LIMIT: Duration = Duration::from_secs(10);
/// Longest a destroy (QP, CQ, MR, PD, device handle) may take.
const DESTROY_LIMIT: Duration = Duration::from_secs(1);
/// The whole test, after which the watchdog fails it.
const TEST_LIMIT: Duration = Duration::from_secs(120);

/// What each worker is doing now, for the watchdog's report.
#[derive(Default)]
struct Status(Mutex<BTreeMap<&'static str, String>>);

impl Status {
    fn set(&self, who: &'static str, what: impl Into<String>) {
        self.0.lock().unwrap().insert(who, what.into());
    }
}

/// Fails the test (the process: a hung thread cannot be unwound) with
/// what every worker was waiting for, if it runs past [`TEST_LIMIT`].
fn watchdog(status: Arc<Status>, done: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let end = Instant::now() + TEST_LIMIT;
        while !done.load(Ordering::Acquire) {
            if Instant::now() > end {
                eprintln!("delay_stress: no end after {TEST_LIMIT:?}; the workers were at:");
                for (who, what) in status.0.lock().unwrap().iter() {
                    eprintln!("  {who}: {what}");
                }
                std::process::exit(101);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

/// Times `f` (a destroy) and fails if it took longer than [`DESTROY_LIMIT`].
fn timed<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    assert!(took < DESTROY_LIMIT, "{what} took {took:?}");
    r
}

/// A CQ's completions, taken one at a time by busy polling (which makes
/// progress on the device's ports) until `WAIT_LIMIT`.
fn next_busy(d: &RoceDevice, cq: &RoceCq, what: &str) -> Wc {
    let end = Instant::now() + WAIT_LIMIT;
    let mut wc = [Wc::default(); 1];
    loop {
        if d.poll_cq(cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(
            Instant::now() < end,
            "no completion for {what} in {WAIT_LIMIT:?}"
        );
        std::thread::yield_now();
    }
}

/// A CQ whose hook counts its calls, for a consumer that blocks.
#[derive(Default)]
struct Notified {
    calls: Mutex<u64>,
    cv: Condvar,
}

impl Notified {
    fn hook(self: &Arc<Self>) -> CompletionHook {
        let n = self.clone();
        Arc::new(move || {
            *n.calls.lock().unwrap() += 1;
            n.cv.notify_all();
        })
    }
}

/// The next completion of `cq`, the way a blocking consumer takes it:
/// poll; arm; poll again; wait for the hook. A hook that never comes while
/// a completion is there is a lost notification.
fn next_blocking(d: &RoceDevice, cq: &RoceCq, n: &Notified, what: &str) -> Wc {
    let mut wc = [Wc::default(); 1];
    loop {
        if d.poll_cq(cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        let seen = *n.calls.lock().unwrap();
        d.arm_cq(cq, CqArm::NextCompletion).unwrap();
        if d.poll_cq(cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        let calls = n.calls.lock().unwrap();
        let (calls, timeout) =
            n.cv.wait_timeout_while(calls, WAIT_LIMIT, |c| *c == seen)
                .unwrap();
        if timeout.timed_out() {
            drop(calls);
            let found = d.poll_cq(cq, &mut wc).unwrap();
            panic!(
                "{what}: no notification in {WAIT_LIMIT:?} after arming an empty CQ \
                 ({found} completion(s) there now: {})",
                if found > 0 {
                    "a lost wake-up"
                } else {
                    "nothing came"
                }
            );
        }
    }
}

/// One end of an RC connection: its own send and receive CQs (so each
/// queue's completion order is seen alone) and a registered buffer.
struct End {
    scq: RoceCq,
    rcq: RoceCq,
    qp: RoceQp,
    buf: RegisteredBuffer,
    mr: RoceMr,
    lkey: u32,
    rkey: u32,
    _pd: RocePd,
}

fn cq_on(d: &RoceDevice, hook: Option<CompletionHook>) -> RoceCq {
    d.create_cq(CqInit {
        capacity: 256,
        on_completion: hook,
        ..CqInit::default()
    })
    .unwrap()
}

fn end_on(d: &RoceDevice, len: usize, hooks: [Option<CompletionHook>; 2]) -> End {
    let [hs, hr] = hooks;
    let pd = d.alloc_pd().unwrap();
    let (scq, rcq) = (cq_on(d, hs), cq_on(d, hr));
    let qp = d
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &scq,
                recv_cq: &rcq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap();
    let buf = RegisteredBuffer::new(len);
    let mr = d.register_mr(&pd, &buf, 0, len, 0, ALL).unwrap();
    let (lkey, rkey) = d.mr_keys(&mr);
    End {
        scq,
        rcq,
        qp,
        buf,
        mr,
        lkey,
        rkey,
        _pd: pd,
    }
}

/// Two ends on `a` and `b`, connected with local ACK timeout `timeout`.
fn pair(
    a: &RoceDevice,
    b: &RoceDevice,
    len: usize,
    timeout: u8,
    hooks: [Option<CompletionHook>; 4],
) -> (End, End) {
    let [h0, h1, h2, h3] = hooks;
    let (x, y) = (end_on(a, len, [h0, h1]), end_on(b, len, [h2, h3]));
    connect_with_timeout(a, &x.qp, b, b.qp_num(&y.qp), timeout);
    connect_with_timeout(b, &y.qp, a, a.qp_num(&x.qp), timeout);
    (x, y)
}

fn sge(lkey: u32, addr: u64, length: u32) -> [Sge; 1] {
    [Sge { addr, length, lkey }]
}

fn post_recv(d: &RoceDevice, e: &End, id: u64, addr: u64, len: u32) {
    let s = sge(e.lkey, addr, len);
    d.post_recv(
        &e.qp,
        &[RecvWr {
            wr_id: id,
            sg_list: &s,
        }],
    )
    .unwrap();
}

fn post_send(d: &RoceDevice, e: &End, id: u64, op: SendOp, addr: u64, len: u32) {
    let s = sge(e.lkey, addr, len);
    d.post_send::<()>(&e.qp, &[SendWr::new(id, op, &s)], &|_| None)
        .unwrap();
}

/// Checks that `wc` is the completion of `id`, `opcode`, a success.
fn expect(wc: Wc, id: u64, opcode: WcOpcode, what: &str) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (id, WcStatus::Success, opcode),
        "{what}: completions must come once each, in order"
    );
}

/// How a ping-pong's consumers take completions.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    Busy,
    Blocking,
}

/// A SEND ping-pong on its own pair: `a`'s thread sends message `i`
/// (1-3000 bytes, so up to three packets), `b`'s thread checks it byte
/// for byte and answers with its own; both sides check every completion
/// of both queues, in order. Returns the round trips done.
fn pingpong(
    a: &RoceDevice,
    b: &RoceDevice,
    how: Consumer,
    n: u64,
    status: &Status,
    who: &'static str,
) -> u64 {
    const LEN: usize = 4096;
    // Longer than any message: the end.
    const END_LEN: u32 = 3500;
    let notes: Vec<Arc<Notified>> = (0..4).map(|_| Arc::default()).collect();
    let hooks = match how {
        Consumer::Busy => [None, None, None, None],
        Consumer::Blocking => [0, 1, 2, 3].map(|i| Some(notes[i].hook())),
    };
    let (x, y) = pair(a, b, LEN, 14, hooks);
    let take = |d: &RoceDevice, cq: &RoceCq, k: usize, what: &str| match how {
        Consumer::Busy => next_busy(d, cq, what),
        Consumer::Blocking => next_blocking(d, cq, &notes[k], what),
    };
    let end = Instant::now() + WORK_TIME;
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        // B: receive i, check it, answer.
        let answerer = s.spawn(|| {
            post_recv(b, &y, 0, 0, LEN as u32);
            let mut i = 0;
            loop {
                let wc = take(b, &y.rcq, 3, &format!("{who}: B's receive {i}"));
                if wc.byte_len == END_LEN {
                    break; // A's last SEND: the end.
                }
                expect(wc, i, WcOpcode::Recv, who);
                let len = (i % 3000 + 1) as usize;
                assert_eq!(wc.byte_len as usize, len, "{who}: message {i}");
                let mut got = vec![0; len];
                y.buf.read(0, &mut got).unwrap();
                assert_eq!(got, pattern(len, i), "{who}: message {i}'s bytes");
                // The answer goes from the second half of B's buffer.
                y.buf.write(LEN / 2, &pattern(64, !i)).unwrap();
                post_recv(b, &y, i + 1, 0, LEN as u32);
                post_send(b, &y, i, SendOp::Send, LEN as u64 / 2, 64);
                expect(
                    take(b, &y.scq, 2, &format!("{who}: B's send {i}")),
                    i,
                    WcOpcode::Send,
                    who,
                );
                i += 1;
            }
        });
        // A: send i, take its answer.
        let mut i = 0;
        while i < n && Instant::now() < end {
            status.set(who, format!("round trip {i}"));
            let len = (i % 3000 + 1) as usize;
            x.buf.write(0, &pattern(len, i)).unwrap();
            post_recv(a, &x, i, LEN as u64 / 2, 64);
            post_send(a, &x, i, SendOp::Send, 0, len as u32);
            expect(
                take(a, &x.scq, 0, &format!("{who}: A's send {i}")),
                i,
                WcOpcode::Send,
                who,
            );
            let wc = take(a, &x.rcq, 1, &format!("{who}: A's receive {i}"));
            expect(wc, i, WcOpcode::Recv, who);
            let mut got = vec![0; 64];
            x.buf.read(LEN / 2, &mut got).unwrap();
            assert_eq!(got, pattern(64, !i), "{who}: answer {i}'s bytes");
            i += 1;
        }
        done.store(i, Ordering::Relaxed);
        // The end: a SEND with id MAX, which B takes as such.
        post_send(a, &x, u64::MAX, SendOp::Send, 0, END_LEN);
        expect(take(a, &x.scq, 0, "the end"), u64::MAX, WcOpcode::Send, who);
        answerer.join().unwrap();
    });
    status.set(who, "done");
    done.load(Ordering::Relaxed)
}

/// RDMA WRITEs of eight slots of B's buffer, then READs of them back,
/// sixteen WRs in flight at once, every completion in order and every
/// byte checked. Returns the WRs done.
fn rdma_stream(a: &RoceDevice, b: &RoceDevice, n: u64, status: &Status) -> u64 {
    const SLOT: usize = 4096;
    const SLOTS: u64 = 8;
    let len = 2 * SLOT * SLOTS as usize;
    let (x, y) = pair(a, b, len, 14, [None, None, None, None]);
    let end = Instant::now() + WORK_TIME;
    let mut wrs = 0;
    let mut round = 0;
    while round < n && Instant::now() < end {
        status.set("rdma", format!("round {round}"));
        // Local layout: slots 0..8 the data written, 8..16 where it is read back.
        for k in 0..SLOTS {
            let size = 1 + ((round * 977 + k * 131) % SLOT as u64) as usize;
            let off = (k as usize) * SLOT;
            x.buf.write(off, &pattern(size, round * 16 + k)).unwrap();
            x.buf.write(len / 2 + off, &[0; SLOT]).unwrap();
            let s = sge(x.lkey, off as u64, size as u32);
            let op = SendOp::Write {
                remote_addr: off as u64,
                rkey: y.rkey,
            };
            a.post_send::<()>(&x.qp, &[SendWr::new(k, op, &s)], &|_| None)
                .unwrap();
        }
        for k in 0..SLOTS {
            let size = 1 + ((round * 977 + k * 131) % SLOT as u64) as u32;
            let off = k * SLOT as u64;
            let s = sge(x.lkey, len as u64 / 2 + off, size);
            let op = SendOp::Read {
                remote_addr: off,
                rkey: y.rkey,
            };
            a.post_send::<()>(&x.qp, &[SendWr::new(SLOTS + k, op, &s)], &|_| None)
                .unwrap();
        }
        for id in 0..2 * SLOTS {
            let op = if id < SLOTS {
                WcOpcode::RdmaWrite
            } else {
                WcOpcode::RdmaRead
            };
            expect(
                next_busy(a, &x.scq, &format!("rdma round {round} WR {id}")),
                id,
                op,
                "rdma",
            );
        }
        for k in 0..SLOTS {
            let size = 1 + ((round * 977 + k * 131) % SLOT as u64) as usize;
            let off = (k as usize) * SLOT;
            let mut got = vec![0; size];
            x.buf.read(len / 2 + off, &mut got).unwrap();
            assert_eq!(
                got,
                pattern(size, round * 16 + k),
                "rdma round {round} slot {k}"
            );
        }
        wrs += 2 * SLOTS;
        round += 1;
    }
    drop(y.mr);
    status.set("rdma", "done");
    wrs
}

/// QPs and CQs made and destroyed while their traffic flows: a pair
/// exchanges a few SENDs, and one side (by turns the sender or the
/// receiver) is destroyed with requests in flight. After a QP's destroy
/// returns its CQs take no completion; after a CQ's destroy returns its
/// hook never runs. Returns the rounds done.
fn churn(a: &RoceDevice, b: &RoceDevice, n: u64, status: &Status) -> u64 {
    let end = Instant::now() + WORK_TIME;
    let mut round = 0;
    while round < n && Instant::now() < end {
        status.set("churn", format!("round {round}"));
        let gone = Arc::new(AtomicBool::new(false));
        let late = Arc::new(AtomicU64::new(0));
        let hook: CompletionHook = {
            let (gone, late) = (gone.clone(), late.clone());
            Arc::new(move || {
                if gone.load(Ordering::Acquire) {
                    late.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // A long ACK timeout (18: ~1 s): the survivor of the pair does not
        // retransmit in the moment between the two destroys.
        let (x, y) = pair(a, b, 4096, 18, [Some(hook.clone()), Some(hook), None, None]);
        let sends = round % 8;
        for i in 0..sends {
            post_recv(b, &y, i, 0, 4096);
        }
        for i in 0..sends {
            post_send(a, &x, i, SendOp::Send, 0, 1 + (i as u32 * 500));
        }
        // Take some of the completions, by turns none, some, or all.
        let wait_for = match round % 3 {
            0 => 0,
            1 => sends / 2,
            _ => sends,
        };
        for i in 0..wait_for {
            expect(
                next_busy(a, &x.scq, &format!("churn round {round} send {i}")),
                i,
                WcOpcode::Send,
                "churn",
            );
        }
        a.arm_cq(&x.scq, CqArm::NextCompletion).unwrap();
        a.arm_cq(&x.rcq, CqArm::NextCompletion).unwrap();
        let End {
            scq, rcq, qp, mr, ..
        } = x;
        let (y_first, qb) = (round % 2 == 0, y.qp);
        let qb = if y_first {
            timed("destroy of the receiving QP", || drop(qb));
            None
        } else {
            Some(qb)
        };
        timed("destroy of a sending QP", || drop(qp));
        // What the QP completed before its destroy returned may be there;
        // nothing more may come.
        let mut wc = [Wc::default(); 16];
        let mut ids = Vec::new();
        for cq in [&scq, &rcq] {
            let k = a.poll_cq(cq, &mut wc).unwrap();
            ids.extend(wc[..k].iter().map(|w| w.wr_id));
        }
        let expected: Vec<u64> = (wait_for..wait_for + ids.len() as u64).collect();
        assert_eq!(ids, expected, "churn round {round}: in order, each once");
        std::thread::sleep(Duration::from_micros(200));
        for cq in [&scq, &rcq] {
            assert_eq!(
                a.poll_cq(cq, &mut wc).unwrap(),
                0,
                "churn round {round}: a completion after the QP's destroy"
            );
        }
        drop(qb);
        timed("destroy of a CQ", || {
            drop(scq);
            drop(rcq);
        });
        gone.store(true, Ordering::Release);
        drop((mr, y.scq, y.rcq, y.mr));
        assert_eq!(
            late.load(Ordering::Relaxed),
            0,
            "a hook ran after its CQ's destroy"
        );
        round += 1;
    }
    status.set("churn", "done");
    round
}

/// Two devices of their own, SENDs streaming from `c` to `d`, and `d`
/// closed (its objects and its last handle dropped, in an order that
/// changes by round) while they flow: `d` is reaped within the bound;
/// `c`'s requests each end once, in order: successes, then (its
/// retransmissions having fired) `RetryExceeded`, then flushes.
fn close_while_flowing(rounds: u64, status: &Status) -> u64 {
    let end = Instant::now() + WORK_TIME;
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    let p = RoceProvider::new(vec![
        DeviceConfig::new("c", 3, vec![port("127.0.0.3")]),
        DeviceConfig::new("d", 4, vec![port("127.0.0.4")]),
    ]);
    let mut round = 0;
    while round < rounds && Instant::now() < end {
        status.set("close", format!("round {round}: open"));
        let (c, d) = (p.open(3).unwrap(), p.open(4).unwrap());
        let watch = d.close_watch();
        // Timeout 8 (~1 ms) with 7 retries: the sender gives up fast.
        let (x, y) = pair(&c, &d, 4096, 8, [None, None, None, None]);
        for i in 0..64 {
            post_recv(&d, &y, i, 0, 4096);
        }
        let stop = AtomicBool::new(false);
        let posted = std::thread::scope(|s| {
            // D's consumer takes what arrives until it is told to close.
            s.spawn(|| {
                let mut wc = [Wc::default(); 16];
                while !stop.load(Ordering::Acquire) {
                    let _ = d.poll_cq(&y.rcq, &mut wc).unwrap();
                    std::thread::yield_now();
                }
            });
            let mut posted = 0u64;
            let flowing = Instant::now() + Duration::from_micros(500 + 700 * (round % 8));
            while Instant::now() < flowing && posted < 64 {
                post_send(
                    &c,
                    &x,
                    posted,
                    SendOp::Send,
                    0,
                    1 + (posted as u32 * 97) % 2048,
                );
                posted += 1;
            }
            stop.store(true, Ordering::Release);
            posted
        });
        status.set(
            "close",
            format!("round {round}: closing d with {posted} SENDs posted"),
        );
        let End {
            scq,
            rcq,
            qp,
            mr,
            _pd: pd,
            ..
        } = y;
        match round % 3 {
            0 => timed("d's close", || drop((d, qp, mr, pd, scq, rcq))),
            1 => {
                timed("d's handle", || drop(d));
                timed("d's QP after its device", || drop(qp));
                drop((mr, pd, scq, rcq));
            }
            _ => {
                timed("d's QP", || drop(qp));
                timed("d's handle", || drop(d));
                drop((mr, pd, scq, rcq));
            }
        }
        assert!(
            watch.wait(WAIT_LIMIT).is_some(),
            "round {round}: d not reaped in {WAIT_LIMIT:?}"
        );
        // C: every SEND once, in order: successes, then at most one
        // RetryExceeded, then flushes.
        status.set("close", format!("round {round}: c's {posted} completions"));
        let mut failed = false;
        for i in 0..posted {
            let wc = next_busy(&c, &x.scq, &format!("close round {round}: c's SEND {i}"));
            assert_eq!(wc.wr_id, i, "close round {round}: in order, each once");
            match (failed, wc.status) {
                (false, WcStatus::Success) => {}
                (false, WcStatus::RetryExceeded) => failed = true,
                (true, WcStatus::WrFlushError) => {}
                (f, st) => panic!("close round {round}: SEND {i}: {st:?} (after a failure: {f})"),
            }
        }
        let mut wc = [Wc::default(); 4];
        assert_eq!(
            c.poll_cq(&x.scq, &mut wc).unwrap(),
            0,
            "close round {round}: a completion too many"
        );
        let cwatch = c.close_watch();
        drop(x);
        assert_eq!(c.qp_count(), 0, "close round {round}: a QP left on c");
        timed("c's close", || drop(c));
        assert!(
            cwatch.wait(WAIT_LIMIT).is_some(),
            "round {round}: c not reaped"
        );
        round += 1;
    }
    status.set("close", "done");
    round
}

/// The kernel's count of UDP datagrams it dropped for a full receive
/// buffer (`/proc/net/snmp`; 0 where it cannot be read).
fn kernel_udp_drops() -> u64 {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Datagrams port 1 of `d` dropped in its receive stage, by any reason.
fn stage_drops(c: &roce_provider::PortCounters) -> u64 {
    c.rx_oversized
        + c.rx_truncated
        + c.rx_decode_error
        + c.rx_unknown_qpn
        + c.rx_wrong_port
        + c.rx_bad_opcode
        + c.rx_bad_state
        + c.rx_bad_pkey
        + c.rx_bad_qkey
        + c.rx_wrong_source
        + c.rx_wrong_destination
        + c.rx_bad_icrc
        + c.rx_icrc_unsolved
}

#[test]
fn provider_threads_under_injected_delays() {
    let seed = std::env::var("IBAL_DELAY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let delays = match std::env::var("IBAL_DELAY_POINTS") {
        Ok(_) => delay::from_env(),
        Err(_) => Delays {
            yield_now: 0.2,
            spin: 0.1,
            sleep: 0.03,
            seed,
        },
    };
    delay::set(delays);
    println!("delay_stress: {delays:?}");
    let started = Instant::now();
    let kernel_drops = kernel_udp_drops();
    let status = Arc::new(Status::default());
    let done = Arc::new(AtomicBool::new(false));
    watchdog(status.clone(), done.clone());

    let (a, b) = common::devices();
    let (busy, blocking, wrs, churned, closed) = std::thread::scope(|s| {
        let st = &*status;
        let (a, b) = (&a, &b);
        let busy = s.spawn(move || pingpong(a, b, Consumer::Busy, PINGPONG_BUSY, st, "busy"));
        let blocking =
            s.spawn(move || pingpong(b, a, Consumer::Blocking, PINGPONG_BLOCKING, st, "blocking"));
        let wrs = s.spawn(move || rdma_stream(a, b, RDMA_ROUNDS, st));
        let churned = s.spawn(move || churn(a, b, CHURN_ROUNDS, st));
        let closed = s.spawn(move || close_while_flowing(CLOSE_ROUNDS, st));
        (
            busy.join().unwrap(),
            blocking.join().unwrap(),
            wrs.join().unwrap(),
            churned.join().unwrap(),
            closed.join().unwrap(),
        )
    });
    let worked = started.elapsed();

    // Quiet: every held ACK sent (within a nap), nothing in flight.
    status.set("main", "waiting for the counters to settle");
    let counters = |d: &RoceDevice| d.port_counters(1).unwrap();
    let mut last = (counters(&a), counters(&b));
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = (counters(&a), counters(&b));
        if now == last {
            break;
        }
        last = now;
    }
    let (ca, cb) = last;
    let dropped = kernel_udp_drops().saturating_sub(kernel_drops);
    for (from, to, name) in [(&ca, &cb, "a to b"), (&cb, &ca, "b to a")] {
        assert_eq!(from.tx_errors, 0, "{name}: send errors");
        assert!(
            to.rx_datagrams <= from.tx_packets && to.rx_datagrams + dropped >= from.tx_packets,
            "{name}: {} sent, {} received, {dropped} dropped by the kernel",
            from.tx_packets,
            to.rx_datagrams
        );
        // Exact but for `rx_bad_state`, which also counts packets the
        // stage passed (`rx_packets`) and whose QP then left its state
        // before the packet reached it (a destroy or a modify in between:
        // `QpInner::take_packet`).
        let (delivered, dropped) = (to.rx_packets, stage_drops(to));
        assert!(
            to.rx_datagrams <= delivered + dropped
                && to.rx_datagrams + to.rx_bad_state >= delivered + dropped,
            "{name}: every datagram delivered or dropped for a counted reason, once: {to:?}"
        );
    }
    assert_eq!((a.qp_count(), b.qp_count()), (0, 0), "QPs left");
    let (wa, wb) = (a.close_watch(), b.close_watch());
    timed("a's close", || drop(a));
    timed("b's close", || drop(b));
    assert!(
        wa.wait(WAIT_LIMIT).is_some() && wb.wait(WAIT_LIMIT).is_some(),
        "a or b not reaped"
    );
    done.store(true, Ordering::Release);

    let counts = delay::counts();
    let delayed: u64 = counts
        .iter()
        .map(|(_, c)| c.yields + c.spins + c.sleeps)
        .sum();
    println!(
        "delay_stress: {busy} busy and {blocking} blocking round trips, {wrs} RDMA WRs, \
         {churned} churn rounds, {closed} device closes in {worked:.1?} \
         ({:.1?} in all); {} datagrams a->b, {} b->a ({dropped} dropped by the kernel); \
         retries a {} b {}; {delayed} delays injected",
        started.elapsed(),
        ca.tx_packets,
        cb.tx_packets,
        ca.retries,
        cb.retries,
    );
    println!(
        "{:<16} {:>10} {:>9} {:>9} {:>9}",
        "point", "calls", "yields", "spins", "sleeps"
    );
    for (p, c) in &counts {
        println!(
            "{:<16} {:>10} {:>9} {:>9} {:>9}",
            format!("{p:?}"),
            c.calls,
            c.yields,
            c.spins,
            c.sleeps
        );
    }
    let missed: Vec<Point> = counts
        .iter()
        .filter(|(_, c)| c.calls == 0)
        .map(|(p, _)| *p)
        .collect();
    assert!(
        missed.is_empty(),
        "protocol points never passed: {missed:?}"
    );
    assert!(delayed > 0, "no delay injected");
    assert!(busy > 0 && blocking > 0 && wrs > 0 && churned > 0 && closed > 0);
}
