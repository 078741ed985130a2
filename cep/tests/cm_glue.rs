//! Black-box tests of the CM glue's rules through the public API, each for
//! a defect class of issue 12: accept that fails changes nothing (double
//! accept, accept on an active CEP, accept racing QP destroy), one rule for
//! what a failed accept leaves, a request nobody answers is reclaimed, a
//! SIDR reply is never lost, and a port can be attached again at once
//! after its last user went.
//!
//! The racing tests repeat with random jitter; `IBAL_GLUE_ITERATIONS`
//! sets how many times (default 40; `docs/cm.md` records a 1,000-run).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc as StdArc, Mutex as StdMutex};
use std::time::Duration;

use al::{Al, Error, Handle, Kind};
use cep::cm::{self, AcceptReply, Cep, CmHandler, ConnectRequest, ListenHandler};
use cep::proto::{Event, SidrParams, SidrReplyParams, TimedOut};
use provider::QpState;
use qp::{query_qp, CidState, Qp};
use soft_provider::FaultConfig;

mod cm_world;
use cm_world::{new_qp, provider, side, wait, Side, SERVICE};

fn iterations() -> usize {
    std::env::var("IBAL_GLUE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

/// A small xorshift for jitter: no dependency, reproducible per seed.
struct Jitter(u64);

impl Jitter {
    fn spin(&mut self) {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        for _ in 0..(self.0 % 2_000) {
            std::hint::spin_loop();
        }
        if self.0 % 7 == 0 {
            std::thread::yield_now();
        }
    }
}

/// Events by CEP, and the CEPs the listen handed over.
#[derive(Default)]
struct Seen {
    events: StdMutex<Vec<(Handle<Cep>, String)>>,
    requests: StdMutex<Vec<Handle<Cep>>>,
}

impl Seen {
    fn has(&self, cep: Handle<Cep>, what: &str) -> bool {
        self.count(cep, what) > 0
    }
    fn count(&self, cep: Handle<Cep>, what: &str) -> usize {
        let events = self.events.lock().unwrap();
        // "Rejected" also counts "Rejected(reason,origin)".
        let detailed = format!("{what}(");
        events
            .iter()
            .filter(|(c, e)| *c == cep && (e == what || e.starts_with(&detailed)))
            .count()
    }
    fn handler(self: &StdArc<Self>) -> CmHandler {
        let seen = self.clone();
        StdArc::new(move |cep, ev| {
            let name = match ev {
                Event::Timeout {
                    message: TimedOut::Answer,
                    ..
                } => "Timeout(Answer)".to_string(),
                Event::Rejected { reason, origin, .. } => {
                    format!("Rejected({reason:?},{origin:?})")
                }
                other => other.name().to_string(),
            };
            seen.events.lock().unwrap().push((cep, name));
        })
    }
    fn next_request(&self, before: usize) -> Handle<Cep> {
        let t0 = std::time::Instant::now();
        while self.requests.lock().unwrap().len() <= before {
            if t0.elapsed() > Duration::from_secs(20) {
                let events = self.events.lock().unwrap();
                let last: Vec<_> = events.iter().rev().take(6).collect();
                panic!("no request within 20 s; last events {last:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.requests.lock().unwrap()[before]
    }
}

struct Pair {
    al: Al,
    _provider: soft_provider::SoftProvider,
    a: Side,
    b: Side,
    seen: StdArc<Seen>,
}

/// Two sides, a listen on B that keeps each request for the test to answer.
fn pair() -> Pair {
    let al = Al::open().unwrap();
    let p = provider();
    let a = side(&al, &p, 0xa000);
    let b = side(&al, &p, 0xb000);
    let seen = StdArc::new(Seen::default());
    let s = seen.clone();
    let on_request: ListenHandler = StdArc::new(move |_l, cep, _ev| {
        s.requests.lock().unwrap().push(cep);
    });
    cm::listen(al.instance(), b.ca, 1, SERVICE, on_request, seen.handler()).unwrap();
    Pair {
        al,
        _provider: p,
        a,
        b,
        seen,
    }
}

impl Pair {
    /// A connect from A whose request B's listen handed over.
    fn request(&self, qp: Handle<Qp>) -> (Handle<Cep>, Handle<Cep>) {
        let before = self.seen.requests.lock().unwrap().len();
        let active = cm::connect(
            self.al.instance(),
            qp,
            &ConnectRequest::new(SERVICE, 2),
            self.seen.handler(),
        )
        .unwrap();
        (active, self.seen.next_request(before))
    }

    fn cid(&self, qp: Handle<Qp>) -> CidState {
        self.al.resolve(qp).unwrap().cid().load()
    }

    fn state(&self, qp: Handle<Qp>) -> QpState {
        query_qp(self.al.instance(), qp).unwrap().state
    }

    fn accept(&self, cep: Handle<Cep>, qp: Handle<Qp>) -> al::Result<()> {
        cm::accept(self.al.instance(), cep, qp, &AcceptReply::default())
    }

    /// The active side sends the RTU once the REP is in; both QPs reach RTS.
    fn complete(&self, active: Handle<Cep>, passive: Handle<Cep>) {
        wait("the REP", || self.seen.has(active, "ReplyReceived"));
        cm::rtu(self.al.instance(), active, &[]).unwrap();
        wait("establishment", || self.seen.has(passive, "Established"));
    }

    fn close(self) {
        let stats = self.al.close().unwrap();
        assert!(stats.is_clean(), "{stats}");
    }
}

/// Defect 1: a second accept of the same request, on another QP, fails and
/// changes nothing; the first QP reaches RTS, goes to ERR on disconnect,
/// and is free again once the CEP is gone.
#[test]
fn a_second_accept_leaves_the_first_binding_alone() {
    let w = pair();
    let (active, passive) = w.request(w.a.qp);
    w.accept(passive, w.b.qp).unwrap();
    let qp2 = new_qp(&w.al, w.b.pd, w.b.cq);
    let e = w.accept(passive, qp2).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    assert_eq!(w.cid(qp2), CidState::Unbound);
    assert_eq!(w.state(qp2), QpState::Reset);
    assert_eq!(w.cid(w.b.qp), CidState::Bound(passive.raw()));
    w.complete(active, passive);
    assert_eq!(w.state(w.b.qp), QpState::Rts, "the first QP is connected");
    cm::disconnect(w.al.instance(), active, &[]).unwrap();
    wait("the DREQ", || w.seen.has(passive, "DisconnectRequest"));
    assert_eq!(
        w.state(w.b.qp),
        QpState::Err,
        "disconnect reaches the bound QP"
    );
    w.al.destroy(passive, None).unwrap();
    w.al.destroy(active, None).unwrap();
    wait("the passive binding to go", || {
        w.cid(w.b.qp) == CidState::Unbound
    });
    // The QP can connect again: its slot names no dead CEP. (A fresh
    // active QP: B keeps the old one's QPN as stale until timewait ends.)
    let (active2, passive2) = w.request(new_qp(&w.al, w.a.pd, w.a.cq));
    w.accept(passive2, w.b.qp).unwrap();
    w.complete(active2, passive2);
    w.close();
}

/// Defect 1: accept on an active-side CEP is refused and changes nothing.
#[test]
fn accept_on_an_active_cep_changes_nothing() {
    let w = pair();
    let (active, passive) = w.request(w.a.qp);
    let other = new_qp(&w.al, w.a.pd, w.a.cq);
    let e = w.accept(active, other).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    assert_eq!(w.cid(other), CidState::Unbound);
    assert_eq!(w.state(other), QpState::Reset);
    assert_eq!(w.cid(w.a.qp), CidState::Bound(active.raw()));
    // The connection goes on as if nothing happened.
    w.accept(passive, w.b.qp).unwrap();
    w.complete(active, passive);
    assert_eq!(w.state(w.a.qp), QpState::Rts);
    w.close();
}

/// Defect 1, raced: two threads accept one request on two QPs; exactly one
/// wins, the loser's QP is untouched, the winner's connects.
#[test]
fn racing_accepts_have_one_winner_and_no_side_effects() {
    let w = pair();
    let mut jitter = Jitter(0x9e37_79b9_7f4a_7c15);
    for i in 0..iterations() {
        let (qp_a, qp1, qp2) = (
            new_qp(&w.al, w.a.pd, w.a.cq),
            new_qp(&w.al, w.b.pd, w.b.cq),
            new_qp(&w.al, w.b.pd, w.b.cq),
        );
        let (active, passive) = w.request(qp_a);
        let seed = jitter.0.wrapping_add(i as u64);
        let (r1, r2) = std::thread::scope(|s| {
            let t = s.spawn(|| {
                Jitter(seed).spin();
                w.accept(passive, qp2)
            });
            jitter.spin();
            (w.accept(passive, qp1), t.join().unwrap())
        });
        assert!(r1.is_ok() != r2.is_ok(), "{i}: {r1:?} {r2:?}");
        let (winner, loser, err) = match (r1, r2) {
            (Ok(()), Err(e)) => (qp1, qp2, e),
            (Err(e), Ok(())) => (qp2, qp1, e),
            other => unreachable!("{other:?}"),
        };
        assert!(!err.is_gone(Kind::CEP), "{i}: {err:?}");
        assert_eq!(w.cid(loser), CidState::Unbound, "{i}");
        assert_eq!(w.state(loser), QpState::Reset, "{i}");
        w.complete(active, passive);
        assert_eq!(w.state(winner), QpState::Rts, "{i}");
        // End the connection by its CEPs; the QPs stay, so no QPN is
        // reused while the peer still holds it in timewait.
        w.al.destroy(active, None).unwrap();
        w.al.destroy(passive, None).unwrap();
        wait("the bindings to go", || {
            w.cid(qp_a) == CidState::Unbound && w.cid(winner) == CidState::Unbound
        });
        wait("the CEPs to go", || {
            w.al.resolve(active).is_err() && w.al.resolve(passive).is_err()
        });
    }
    w.close();
}

/// Defect 2: accept racing QP destroy follows the one rule. `Destroying
/// {CEP}` means the CEP is gone; any other error means the request is
/// still answerable (and a second accept connects it); success with the QP
/// destroyed ends the CEP. No CEP is left behind either way.
#[test]
fn accept_racing_qp_destroy_follows_the_accept_rule() {
    let w = pair();
    let mut jitter = Jitter(0x2545_f491_4f6c_dd1d);
    let mut outcomes = [0usize; 3];
    for i in 0..iterations() {
        let (qp_a, qp_b) = (new_qp(&w.al, w.a.pd, w.a.cq), new_qp(&w.al, w.b.pd, w.b.cq));
        let (active, passive) = w.request(qp_a);
        let seed = jitter.0.wrapping_add(i as u64);
        let r = std::thread::scope(|s| {
            let t = s.spawn(|| {
                Jitter(seed).spin();
                w.al.destroy(qp_b, None).unwrap();
            });
            jitter.spin();
            let r = w.accept(passive, qp_b);
            t.join().unwrap();
            r
        });
        match r {
            Err(e) if e.is_gone(Kind::CEP) => {
                outcomes[0] += 1;
                assert!(w.al.resolve(passive).is_err(), "{i}");
            }
            Err(e) => {
                outcomes[1] += 1;
                assert!(
                    w.al.resolve(passive).is_ok(),
                    "{i}: {e:?} but the CEP is gone"
                );
                let qp2 = new_qp(&w.al, w.b.pd, w.b.cq);
                w.accept(passive, qp2).unwrap();
                w.complete(active, passive);
                w.al.destroy(passive, None).unwrap();
            }
            Ok(()) => {
                outcomes[2] += 1;
                wait("QP destroy to end the CEP", || {
                    w.al.resolve(passive).is_err()
                });
            }
        }
        // The active CEP may already be gone (the passive side's REJ).
        let _ = w.al.destroy(active, None);
        wait("the CEPs to go", || {
            w.al.resolve(active).is_err() && w.al.resolve(passive).is_err()
        });
        wait("the active binding to go", || {
            w.cid(qp_a) == CidState::Unbound
        });
    }
    eprintln!("accept vs QP destroy: CEP gone / unchanged / accepted = {outcomes:?}");
    w.close();
}

/// Defect 2: a request nobody answers is reclaimed once the active side
/// has given up: the passive handler hears `Timeout(Answer)` and the CEP
/// goes, with no accept, reject or destroy from the user.
#[test]
fn a_request_nobody_answers_is_reclaimed() {
    let w = pair();
    let mut request = ConnectRequest::new(SERVICE, 2);
    // About 17 ms per wait, one retry: the active side gives up after
    // about 34 ms, B's deadline is about 50 ms. The 17 ms are the margin
    // for this thread to cut the fabric (below) before A's REJ leaves.
    request.cm_response_timeout = 12;
    request.max_cm_retries = 1;
    request.local_ack_timeout = 1;
    let active = cm::connect(w.al.instance(), w.a.qp, &request, w.seen.handler()).unwrap();
    let passive = w.seen.next_request(0);
    // From now on every MAD is lost, so the active side's REJ(Timeout)
    // cannot end the request first: only B's own deadline can.
    w._provider.fabric().set_faults(Some(FaultConfig {
        drop: 1.0,
        ..FaultConfig::default()
    }));
    wait("the answer deadline", || {
        w.seen.has(passive, "Timeout(Answer)")
    });
    wait("the passive CEP to go", || w.al.resolve(passive).is_err());
    wait("the active side to give up", || {
        w.seen.has(active, "Timeout") || w.seen.has(active, "Rejected")
    });
    // Its own timeout ended the active CEP.
    wait("the active CEP to go", || w.al.resolve(active).is_err());
    w._provider.fabric().set_faults(None);
    w.close();
}

/// Defect 3: a burst of SIDR requests answered at once: every one gets its
/// reply exactly once and its CEP goes by itself; no route is left.
#[test]
fn sidr_replies_are_never_lost() {
    let al = Al::open().unwrap();
    let p = provider();
    let a = side(&al, &p, 0xa000);
    let b = side(&al, &p, 0xb000);
    let inst = al.instance().clone();
    let on_request: ListenHandler = StdArc::new(move |_l, cep, _ev| {
        let reply = SidrReplyParams {
            qpn: 0x42,
            ..SidrReplyParams::default()
        };
        cm::sidr_reply(&inst, cep, reply).unwrap();
    });
    let ignore: CmHandler = StdArc::new(|_, _| {});
    let listen = cm::listen(al.instance(), b.ca, 1, SERVICE, on_request, ignore).unwrap();
    // Bursts of 25: every request ends exactly once (its reply, or a
    // Timeout if a burst overran QP1's receive queue and the retries too),
    // and its CEP goes by itself.
    let (replies, timeouts) = (
        StdArc::new(AtomicUsize::new(0)),
        StdArc::new(AtomicUsize::new(0)),
    );
    for burst in 0..iterations() {
        let mut ceps = Vec::new();
        let ends_before = replies.load(Ordering::SeqCst) + timeouts.load(Ordering::SeqCst);
        for _ in 0..25 {
            let (r, t) = (replies.clone(), timeouts.clone());
            let handler: CmHandler = StdArc::new(move |_, ev| match ev {
                Event::SidrReply { .. } => {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                Event::Timeout { .. } => {
                    t.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            });
            let params = SidrParams::new(
                SERVICE,
                cep::proto::PeerAddr {
                    lid: 2,
                    gid: [0; 16],
                },
            );
            ceps.push(cm::sidr_request(al.instance(), a.ca, params, 1, handler).unwrap());
        }
        wait("every SIDR CEP to go", || {
            ceps.iter().all(|&c| al.resolve(c).is_err())
        });
        let ends = replies.load(Ordering::SeqCst) + timeouts.load(Ordering::SeqCst);
        assert_eq!(
            ends - ends_before,
            25,
            "burst {burst}: a request ended {} times",
            ends - ends_before
        );
    }
    assert!(replies.load(Ordering::SeqCst) > 0);
    eprintln!(
        "SIDR: {} replies, {} timeouts",
        replies.load(Ordering::SeqCst),
        timeouts.load(Ordering::SeqCst)
    );
    al.destroy(listen, None).unwrap();
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// Defect 6: a port whose last user just went can be attached again at
/// once (the new agent finishes the old one's shutdown instead of the old
/// one blocking wherever its last user dropped).
#[test]
fn a_port_can_be_attached_again_right_after_its_last_user() {
    let p = provider();
    for _ in 0..iterations() {
        let al = Al::open().unwrap();
        let a = side(&al, &p, 0xa000);
        let ports = cm::attach_ca(al.instance(), a.ca).unwrap();
        assert_eq!(ports.len(), 1);
        al.destroy(ports[0], None).unwrap();
        let again = cm::attach_ca(al.instance(), a.ca).unwrap();
        assert_eq!(again.len(), 1);
        let stats = al.close().unwrap();
        assert!(stats.is_clean(), "{stats}");
    }
}

/// Accepting a second request on a QP that is already connected (bound,
/// RTS) is refused as `AlreadyConnected`, as connect on it is and as
/// `cep::cm` and docs/cm.md say (issue 29: it was `InvalidState`, from the
/// QP's state being checked before its binding), and changes nothing: the
/// first connection stays, the second request is still waiting and can be
/// accepted on a free QP.
#[test]
fn accept_on_a_connected_qp_is_already_connected() {
    let w = pair();
    let (active, passive) = w.request(w.a.qp);
    w.accept(passive, w.b.qp).unwrap();
    w.complete(active, passive);
    assert_eq!(w.state(w.b.qp), QpState::Rts);

    let (active2, passive2) = w.request(new_qp(&w.al, w.a.pd, w.a.cq));
    let e = w.accept(passive2, w.b.qp).unwrap_err();
    assert!(matches!(e, Error::AlreadyConnected), "{e:?}");
    assert_eq!(w.cid(w.b.qp), CidState::Bound(passive.raw()));
    assert_eq!(w.state(w.b.qp), QpState::Rts, "the first connection stays");
    // Connect on the same connected QP says the same.
    let ignore: CmHandler = StdArc::new(|_, _| {});
    let e = cm::connect(
        w.al.instance(),
        w.b.qp,
        &ConnectRequest::new(0x77, 1),
        ignore,
    )
    .unwrap_err();
    assert!(matches!(e, Error::AlreadyConnected), "{e:?}");

    let free = new_qp(&w.al, w.b.pd, w.b.cq);
    w.accept(passive2, free).unwrap();
    w.complete(active2, passive2);
    assert_eq!(w.state(free), QpState::Rts);
    w.close();
}
