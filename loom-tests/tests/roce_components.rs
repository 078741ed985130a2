//! loom models of three of the RoCEv2 provider's protocols between threads,
//! on the production code (`roce_provider::model::components`):
//!
//! - the completion queue: a lock-free poll of an empty CQ (it reads
//!   `queued`, written under the CQ's lock) vs a completion push and a CQ
//!   arm: no completion lost, none twice, in order; no notification lost
//!   (the verbs pattern poll, arm, poll again, wait never waits for a
//!   completion that is there); overflows counted;
//! - the QP map and its memo: a change of a key vs a find through a memo
//!   (a QP removed or replaced before a find is never found; a find
//!   concurrent with it finds the old or the new QP, never another key's;
//!   the memo of a port's feeding lock keeps no QP alive once given up);
//! - held ACKs: two QPs' ACKs held on one port vs an answer (a batch) and
//!   a flush: every ACK leaves once, for its QP, the newest of a QP last;
//!   the one-load summary is never "only mine" while another QP's ACK the
//!   answering thread knows of is held, so the answer never overtakes it.
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use provider::{AsyncEvent, AsyncHook, CompletionHook, CqArm, Wc};
use roce_provider::model::components::{Cq, Memo, Port, Qps, Sent, Wire};

mod common;
use common::model;

// ---------------------------------------------------------------- CQ ----

fn wc(id: u64) -> Wc {
    Wc {
        wr_id: id,
        ..Wc::default()
    }
}

/// Polls until empty, appending to `got` (one completion per poll, so a
/// push between two polls lands between them).
fn poll_until_empty(cq: &Cq, got: &mut Vec<u64>) {
    let mut out = [Wc::default(); 1];
    while cq.poll(&mut out) == 1 {
        got.push(out[0].wr_id);
    }
}

/// A completion hook that counts its calls.
fn counting_hook(calls: &Arc<AtomicUsize>) -> CompletionHook {
    let calls = calls.clone();
    std::sync::Arc::new(move || {
        calls.fetch_add(1, Ordering::SeqCst);
    })
}

/// A QP's drive pushes two completions while the application runs the
/// verbs pattern once: poll until empty, arm for the next completion,
/// poll again, and if that finds nothing wait for the completion hook.
/// It never waits for a completion that is already there unannounced;
/// every completion is polled exactly once, in order.
#[test]
fn roce_cq_push_vs_poll_arm_poll() {
    model("roce_cq_push_vs_poll_arm_poll", || {
        let calls = Arc::new(AtomicUsize::new(0));
        let cq = Arc::new(Cq::new(4, Some(counting_hook(&calls)), None));
        let pusher = {
            let cq = cq.clone();
            thread::spawn(move || {
                cq.push(wc(1));
                cq.push(wc(2));
            })
        };
        let mut got = Vec::new();
        poll_until_empty(&cq, &mut got);
        cq.arm(CqArm::NextCompletion);
        poll_until_empty(&cq, &mut got);
        // Empty after arming: the application waits for the hook.
        let waits = got.len() < 2;
        let calls_by_now = calls.load(Ordering::SeqCst);
        pusher.join().unwrap();
        if waits {
            // The wait ends only if the hook runs (now or after this
            // point, which the join covers): a completion it would wait
            // for with no hook coming is a lost notification.
            assert!(
                calls.load(Ordering::SeqCst) >= 1,
                "lost notification: waiting with {:?} polled of 2, {} queued, no hook ran (hooks by the re-poll: {calls_by_now})",
                got,
                cq.len()
            );
        }
        // What the hook's wake-up (or the next round) polls.
        poll_until_empty(&cq, &mut got);
        assert_eq!(got, vec![1, 2], "every completion once, in order");
        assert!(cq.is_empty(), "nothing left behind a poll that said empty");
        assert!(calls.load(Ordering::SeqCst) <= 1, "one arm, one hook");
    });
}

/// Two QPs' drives push into a CQ with room for one while the application
/// polls: a completion is either polled once or counted lost, never both
/// or neither; every loss raises `CqOverflow` with the running count; no
/// poll that read the lock-free count as zero hides a queued completion
/// from the polls after it.
#[test]
fn roce_cq_two_pushers_vs_poller_overflow() {
    model("roce_cq_two_pushers_vs_poller_overflow", || {
        let overflows = Arc::new(AtomicU64::new(0));
        let highest = Arc::new(AtomicU64::new(0));
        let on_async: AsyncHook = {
            let (overflows, highest) = (overflows.clone(), highest.clone());
            std::sync::Arc::new(move |e| {
                let AsyncEvent::CqOverflow { lost } = e;
                overflows.fetch_add(1, Ordering::SeqCst);
                highest.fetch_max(lost, Ordering::SeqCst);
            })
        };
        let cq = Arc::new(Cq::new(1, None, Some(on_async)));
        let pushers: Vec<_> = [1, 2]
            .into_iter()
            .map(|id| {
                let cq = cq.clone();
                thread::spawn(move || cq.push(wc(id)))
            })
            .collect();
        let mut got = Vec::new();
        poll_until_empty(&cq, &mut got);
        for p in pushers {
            p.join().unwrap();
        }
        poll_until_empty(&cq, &mut got);
        assert!(
            cq.is_empty(),
            "a queued completion the lock-free poll missed"
        );
        let lost = cq.lost();
        assert_eq!(got.len() as u64 + lost, 2, "polled {got:?}, lost {lost}");
        let mut sorted = got.clone();
        sorted.dedup();
        assert_eq!(sorted, got, "a completion polled twice");
        assert_eq!(overflows.load(Ordering::SeqCst), lost, "one event per loss");
        assert_eq!(highest.load(Ordering::SeqCst), lost, "the running count");
    });
}

// ------------------------------------------------------- QP map, memo ----

/// A model's QP: which one it is, and a flag its drop sets.
struct TestQp {
    id: u32,
    dropped: Arc<AtomicBool>,
}

impl Drop for TestQp {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn test_qp(id: u32) -> (Arc<TestQp>, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    (
        Arc::new(TestQp {
            id,
            dropped: dropped.clone(),
        }),
        dropped,
    )
}

const KEY: u32 = 0x11;
const OTHER_KEY: u32 = 0x12;

/// The key's QP X (id 1) is replaced by Y (id 2) and then removed (as the
/// GSI key's QP1 is made again, then destroyed) while another thread finds
/// the key through its memo, which already names X. What each find
/// returns follows the changes: never X once the replacement happened
/// before it (the changer's flag says so), never Y once the removal did,
/// never back to an older QP, never the QP of another key.
#[test]
fn roce_qp_map_replace_remove_vs_find() {
    model("roce_qp_map_replace_remove_vs_find", || {
        let qps = Arc::new(Qps::default());
        let (x, _) = test_qp(1);
        let (y, _) = test_qp(2);
        let (z, _) = test_qp(9);
        qps.insert(KEY, x);
        qps.insert(OTHER_KEY, z);
        let mut memo = Memo::default();
        assert_eq!(qps.find(OTHER_KEY, &mut memo).unwrap().id, 9);
        assert_eq!(qps.find(KEY, &mut memo).unwrap().id, 1);
        // How far the changes went, published after each returned.
        let done = Arc::new(AtomicUsize::new(0));
        let changer = {
            let (qps, done) = (qps.clone(), done.clone());
            thread::spawn(move || {
                let old = qps.insert(KEY, y);
                assert_eq!(old.unwrap().id, 1);
                done.store(1, Ordering::Release);
                let old = qps.remove(KEY);
                assert_eq!(old.unwrap().id, 2);
                done.store(2, Ordering::Release);
            })
        };
        // Generation of a result: X 0, Y 1, gone 2.
        let mut last = 0;
        for _ in 0..3 {
            let before = done.load(Ordering::Acquire);
            let generation = match qps.find(KEY, &mut memo) {
                None => 2,
                Some(qp) => match qp.id {
                    1 => 0,
                    2 => 1,
                    id => panic!("found QP {id}, never under the key"),
                },
            };
            assert!(
                generation >= before,
                "found generation {generation} after change {before} had returned"
            );
            assert!(
                generation >= last,
                "found generation {generation} after {last}"
            );
            last = generation;
        }
        changer.join().unwrap();
        assert!(qps.find(KEY, &mut memo).is_none());
        assert_eq!(qps.find(OTHER_KEY, &mut memo).unwrap().id, 9);
    });
}

/// A port's feeder (the receive thread or a poller, through the real
/// feeding lock and its memo) feeds two datagrams for the key in each of
/// two turns while the QP is destroyed (removed from the map, its last
/// reference dropped, then published): a datagram fed after the destroy
/// returned never reaches it, not even from the memo within one turn, and
/// once the feeder gave up the lock the memo keeps nothing alive: the QP
/// has been dropped.
#[test]
fn roce_qp_map_destroy_vs_feed() {
    model("roce_qp_map_destroy_vs_feed", || {
        let qps = Arc::new(Qps::default());
        let port = Arc::new(Port::<TestQp>::bind(0));
        let (x, x_dropped) = test_qp(1);
        qps.insert(KEY, x);
        let destroyed = Arc::new(AtomicBool::new(false));
        let destroyer = {
            let (qps, destroyed) = (qps.clone(), destroyed.clone());
            thread::spawn(move || {
                drop(qps.remove(KEY).expect("the QP"));
                destroyed.store(true, Ordering::Release);
            })
        };
        for _turn in 0..2 {
            let mut fed = port.feeding();
            for _datagram in 0..2 {
                let after_destroy = destroyed.load(Ordering::Acquire);
                let qp = fed.find(&qps, KEY);
                assert!(
                    !(after_destroy && qp.is_some()),
                    "a destroyed QP fed one more datagram"
                );
            }
        }
        destroyer.join().unwrap();
        assert!(
            x_dropped.load(Ordering::SeqCst),
            "the feeding lock's memo keeps a destroyed QP alive"
        );
        assert!(port.feeding().find(&qps, KEY).is_none());
    });
}

// ---------------------------------------------------------- held ACKs ----

const QP_A: u32 = 0x21;
const QP_B: u32 = 0x22;

/// What the wire carried, as (QPN, ACK?, PSN).
fn sent(wire: &Wire) -> Vec<(u32, bool, u32)> {
    wire.received()
        .into_iter()
        .map(|Sent { qpn, ack, psn }| (qpn, ack, psn))
        .collect()
}

/// The ACKs of `qpn` that left: each PSN at most once, the newest
/// (`last_psn`) among them. An older one may leave too, if a flush took it
/// before the newer replaced it, and even after the newer (two flushes
/// racing to their sockets): ACKs are cumulative, the peer ignores the
/// older.
fn check_acks(wire: &[(u32, bool, u32)], qpn: u32, last_psn: u32) {
    let mut acks: Vec<u32> = wire
        .iter()
        .filter(|s| s.0 == qpn && s.1)
        .map(|s| s.2)
        .collect();
    assert!(
        acks.contains(&last_psn),
        "QP {qpn:#x}'s newest ACK: {wire:?}"
    );
    let n = acks.len();
    acks.sort_unstable();
    acks.dedup();
    assert_eq!(acks.len(), n, "QP {qpn:#x}'s ACK twice: {wire:?}");
}

/// The two sides of a ping-pong on one port: a poller's progress holds
/// QP B's ACK, its application sees B's completion, and the next ACK of B
/// replaces the first if still held; another poller holds QP A's own ACK
/// and its application answers on A. If the answering thread knew of B's
/// completion, the summary never says "only A's" and B's ACK leads the
/// answer on the wire. Every ACK leaves exactly once (the answer's own
/// QP's at the next flush), and afterwards nothing is held.
#[test]
fn roce_held_acks_two_qps_vs_answer() {
    model("roce_held_acks_two_qps_vs_answer", || {
        let wire = Wire::bind();
        let to = wire.addr();
        let port = Arc::new(Port::<()>::bind(0));
        let b_completed = Arc::new(AtomicBool::new(false));
        let poller_b = {
            let (port, b_completed) = (port.clone(), b_completed.clone());
            thread::spawn(move || {
                port.ack_while_polling(QP_B, 1, to);
                // The application polls the completion of B's request.
                b_completed.store(true, Ordering::Release);
                // The next request's ACK replaces it, if still held.
                port.ack_while_polling(QP_B, 2, to);
            })
        };
        port.ack_while_polling(QP_A, 7, to);
        let knew = b_completed.load(Ordering::Acquire);
        let sock = port.socket_of(QP_A);
        if knew {
            assert!(
                !port.only_held(sock, QP_A),
                "summary says only A's ACK while B's, known, is held"
            );
        }
        port.send(QP_A, 100, to);
        poller_b.join().unwrap();
        // The pollers' next progress.
        port.flush_held();
        let wire = sent(&wire);
        assert!(port.nothing_held() && port.only_held(sock, QP_B));
        assert!(port.held_sockets().is_empty());
        check_acks(&wire, QP_B, 2);
        check_acks(&wire, QP_A, 7);
        let answer = wire.iter().position(|s| *s == (QP_A, false, 100));
        let answer = answer.expect("the answer left");
        if knew {
            // B's ACK 1, or the ACK 2 that replaced it while held.
            let b_ack = wire.iter().position(|s| s.0 == QP_B && s.1);
            assert!(
                b_ack < Some(answer),
                "the answer overtook B's held ACK: {wire:?}"
            );
        }
        let own = wire.iter().position(|s| *s == (QP_A, true, 7)).unwrap();
        assert!(
            answer < own,
            "A's own ACK stays held behind its answer: {wire:?}"
        );
    });
}

/// QP A's and QP B's ACKs held on different send sockets of one port
/// while the receive thread's turn flushes them and A's application
/// answers: each ACK leaves once, for its QP, by its own socket, the newest
/// of each QP among them; the summary is never "only A's" while B's ACK is
/// in the list; afterwards nothing is held.
#[test]
fn roce_held_acks_two_sockets_vs_flush() {
    model("roce_held_acks_two_sockets_vs_flush", || {
        two_sockets_vs_flush(false)
    });
}

/// The same, and B's newest ACK, which the answering thread held itself,
/// reaches the wire before A's answer. This model found the race (it
/// failed on the code before this one): a flush (`send_held_on`) took the
/// ACKs out of the list under its lock and sent them after giving it up;
/// in between the summary said nothing of B was held, so the answer went
/// at once, ahead of B's ACK still on its way to the socket. Now the list
/// stays locked until the taken ACKs left (`held_acks::HeldList`); the
/// mutant `held_published_before_sent` puts the old order back.
#[test]
fn roce_held_acks_flush_vs_answer_order() {
    model("roce_held_acks_flush_vs_answer_order", || {
        two_sockets_vs_flush(true)
    });
}

fn two_sockets_vs_flush(check_order: bool) {
    let wire = Wire::bind();
    let to = wire.addr();
    let port = Arc::new(Port::<()>::bind(2));
    let (sock_a, sock_b) = (port.socket_of(QP_A), port.socket_of(QP_B));
    assert_ne!(sock_a, sock_b, "the model wants two sockets");
    port.ack_while_polling(QP_B, 1, to);
    let receive_turn = {
        let port = port.clone();
        thread::spawn(move || port.flush_held())
    };
    port.ack_while_polling(QP_B, 2, to);
    port.ack_while_polling(QP_A, 7, to);
    // B's ACKs are only ever taken out of the list after the summary
    // stopped naming them: "only A's" with B's ACK still listed is a lie.
    assert!(!port.only_held(sock_a, QP_A) || !port.held_sockets().contains(&sock_b));
    port.send(QP_A, 100, to);
    receive_turn.join().unwrap();
    port.flush_held();
    let wire = sent(&wire);
    assert!(port.nothing_held() && port.held_sockets().is_empty());
    check_acks(&wire, QP_B, 2);
    check_acks(&wire, QP_A, 7);
    assert_eq!(wire.iter().filter(|s| !s.1).count(), 1, "{wire:?}");
    if check_order {
        let answer = wire.iter().position(|s| *s == (QP_A, false, 100));
        let b_ack = wire.iter().position(|s| *s == (QP_B, true, 2));
        assert!(b_ack < answer, "the answer overtook B's ACK: {wire:?}");
    }
}
