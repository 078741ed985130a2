//! loom models of the connection manager's glue, on the production code:
//! `cep::cm` (CEP and listen objects, routes, the accept claim, the CID
//! binding) over polled CM agents and the soft provider, with no stand-in.
//!
//! Every model builds the same small world single-threaded (two HCAs, a
//! CM port on each in poll mode, an AL with a manual executor), then races
//! two user calls, then drives the protocol to quiescence on one thread
//! (poll both ports, run the callbacks) and checks what is left: no CEP or
//! listen object leaked, no route leaked, no CID slot bound to a CEP that
//! is gone, each destroy callback run once. Under loom the polled agents'
//! clocks stand still, so retries and timewait never fire: the models check
//! the objects and the first exchange, not expiry.
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::sync::Mutex;
use al::{Al, AlConfig, ExecutorMode, Handle, Kind};
use cep::cm::{self, AcceptReply, Cep, CmHandler, CmPort, ConnectRequest, ListenHandler};
use cep::proto::{Event, SidrParams, SidrReplyParams};
use hca::verbs::{self, Ca, Cq, Pd};
use provider::{QpState, QpType};
use qp::{create_qp, query_qp, CidState, Qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

mod common;
use common::model;

const SERVICE: u64 = 0x1000_0000_0000_00bb;

/// Every event each CEP's handler saw, by name, and the passive CEPs the
/// listen handed over.
#[derive(Default)]
struct Seen {
    events: Mutex<Vec<(Handle<Cep>, &'static str)>>,
    requests: Mutex<Vec<Handle<Cep>>>,
}

impl Seen {
    fn count(&self, cep: Handle<Cep>, name: &str) -> usize {
        let events = self.events.lock();
        events
            .iter()
            .filter(|(c, n)| *c == cep && *n == name)
            .count()
    }
    fn request(&self) -> Handle<Cep> {
        *self
            .requests
            .lock()
            .first()
            .expect("the listen got no request")
    }
}

/// What the listen's request handler does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnRequest {
    /// Keep the CEP for the model to answer.
    Keep,
    /// Answer a SIDR request with a reply.
    SidrReply,
}

struct World {
    al: Arc<Al>,
    _provider: SoftProvider,
    ca_a: Handle<Ca>,
    port_a: Handle<CmPort>,
    port_b: Handle<CmPort>,
    pd_b: Handle<Pd>,
    cq_b: Handle<Cq>,
    qp_a: Handle<Qp>,
    qp_b: Handle<Qp>,
    seen: std::sync::Arc<Seen>,
    listen: Handle<cm::Listen>,
}

impl World {
    fn new(on_request: OnRequest) -> World {
        let fabric = Fabric::new();
        fabric.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
        fabric.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
        let provider = SoftProvider::new(fabric);
        let al = Arc::new(
            Al::open_with(AlConfig {
                executor: ExecutorMode::Manual,
                ..AlConfig::default()
            })
            .unwrap(),
        );
        let inst = al.instance().clone();
        let ca_a = verbs::open_ca(&inst, &provider, 0xa000).unwrap();
        let ca_b = verbs::open_ca(&inst, &provider, 0xb000).unwrap();
        let port_a = cm::attach_ca_with(&inst, ca_a, cm::CmDrive::Poll).unwrap()[0];
        let port_b = cm::attach_ca_with(&inst, ca_b, cm::CmDrive::Poll).unwrap()[0];
        let pd_a = verbs::alloc_pd(&inst, ca_a).unwrap();
        let cq_a = verbs::create_cq(&inst, ca_a, 4, None, None).unwrap();
        let pd_b = verbs::alloc_pd(&inst, ca_b).unwrap();
        let cq_b = verbs::create_cq(&inst, ca_b, 4, None, None).unwrap();
        let qp_a = create_qp(&inst, pd_a, QpCreate::new(QpType::Rc, cq_a)).unwrap();
        let qp_b = create_qp(&inst, pd_b, QpCreate::new(QpType::Rc, cq_b)).unwrap();
        let seen = std::sync::Arc::new(Seen::default());
        let on_req: ListenHandler = {
            let (inst, seen) = (inst.clone(), seen.clone());
            std::sync::Arc::new(move |_l, cep, ev| {
                seen.requests.lock().push(cep);
                if on_request == OnRequest::SidrReply {
                    assert!(matches!(ev, Event::SidrRequest { .. }), "{ev:?}");
                    cm::sidr_reply(&inst, cep, SidrReplyParams::default()).unwrap();
                }
            })
        };
        let listen = cm::listen(&inst, ca_b, 1, SERVICE, on_req, world_handler(&seen)).unwrap();
        World {
            al,
            _provider: provider,
            ca_a,
            port_a,
            port_b,
            pd_b,
            cq_b,
            qp_a,
            qp_b,
            seen,
            listen,
        }
    }

    fn handler(&self) -> CmHandler {
        world_handler(&self.seen)
    }

    fn connect(&self) -> al::Result<Handle<Cep>> {
        cm::connect(
            self.al.instance(),
            self.qp_a,
            &ConnectRequest::new(SERVICE, 2),
            self.handler(),
        )
    }

    /// Poll both ports and run the callbacks until nothing moves.
    fn quiesce(&self) {
        for _ in 0..4 {
            cm::poll(&self.al, self.port_b).unwrap();
            cm::poll(&self.al, self.port_a).unwrap();
            self.al.run_callbacks();
        }
    }

    /// Setup: a connect from A whose REQ reached B's listen: the passive
    /// CEP waits in REQ_RCVD.
    fn requested(&self) -> (Handle<Cep>, Handle<Cep>) {
        let active = self.connect().unwrap();
        cm::poll(&self.al, self.port_b).unwrap();
        self.al.run_callbacks();
        (active, self.seen.request())
    }

    fn new_qp_b(&self) -> Handle<Qp> {
        create_qp(
            self.al.instance(),
            self.pd_b,
            QpCreate::new(QpType::Rc, self.cq_b),
        )
        .unwrap()
    }

    fn cid(&self, qp: Handle<Qp>) -> CidState {
        self.al.resolve(qp).unwrap().cid().load()
    }

    fn qp_state(&self, qp: Handle<Qp>) -> QpState {
        query_qp(self.al.instance(), qp).unwrap().state
    }

    fn routes(&self, port: Handle<CmPort>) -> usize {
        self.al.resolve(port).unwrap().routes()
    }

    /// The QP is free or bound to a CEP that is still live: never bound to
    /// a CEP that is gone (every later connect would fail on it).
    fn assert_binding_sound(&self, qp: Handle<Qp>) {
        if let CidState::Bound(cep) = self.cid(qp) {
            let live = self.al.resolve(Handle::<Cep>::from_raw(cep)).is_ok();
            assert!(live, "{qp:?} is bound to {cep:?}, which is gone");
        }
    }

    /// The end of every model: destroy what the user still holds, then no
    /// CEP, listen or route may be left, and the AL closes clean.
    fn finish(self, user_ceps: &[Handle<Cep>]) {
        for &cep in user_ceps {
            let _ = self.al.destroy(cep, None);
        }
        let _ = self.al.destroy(self.listen, None);
        self.quiesce();
        let stats = self.al.stats();
        assert_eq!(stats.live(Kind::CEP), 0, "a CEP leaked: {stats}");
        assert_eq!(stats.live(Kind::LISTEN), 0, "{stats}");
        assert_eq!(self.routes(self.port_a), 0, "a route leaked on A");
        assert_eq!(self.routes(self.port_b), 0, "a route leaked on B");
        let al = Arc::try_unwrap(self.al).unwrap_or_else(|_| panic!("AL still shared"));
        let stats = al.close().unwrap();
        assert!(stats.is_clean(), "{stats}");
        assert_eq!(cm::active_ports(), 0, "a port user outlived the AL");
    }
}

fn world_handler(seen: &std::sync::Arc<Seen>) -> CmHandler {
    let seen = seen.clone();
    std::sync::Arc::new(move |cep, ev| seen.events.lock().push((cep, ev.name())))
}

/// connect races QP destroy: one wins the CID slot. Whatever the order,
/// the connect's CEP is destroyed exactly once (by the loser's cleanup or
/// by the QP destroy that took the binding) and its route goes with it.
#[test]
fn cm_connect_vs_qp_destroy() {
    model("cm_connect_vs_qp_destroy", || {
        let w = World::new(OnRequest::Keep);
        let connector = {
            let (al, qp, handler) = (w.al.clone(), w.qp_a, w.handler());
            thread::spawn(move || {
                cm::connect(al.instance(), qp, &ConnectRequest::new(SERVICE, 2), handler)
            })
        };
        let gone = Arc::new(AtomicUsize::new(0));
        let g = gone.clone();
        w.al.destroy(
            w.qp_a,
            Some(Box::new(move |_| {
                g.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .unwrap();
        let r = connector.join().unwrap();
        w.quiesce();
        assert_eq!(gone.load(Ordering::SeqCst), 1);
        if let Ok(cep) = r {
            assert!(w.al.resolve(cep).is_err(), "QP destroy must end the CEP");
        }
        let passive: Vec<_> = w.seen.requests.lock().clone();
        w.finish(&passive);
    });
}

/// accept races QP destroy: the one accept rule holds. `Destroying{CEP}`
/// means the CEP is gone; any other error leaves it answerable (a second
/// accept on another QP then connects); success with the QP destroyed
/// means the QP destroy took the binding and ended the CEP.
#[test]
fn cm_accept_vs_qp_destroy() {
    model("cm_accept_vs_qp_destroy", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested();
        let acceptor = {
            let (al, qp) = (w.al.clone(), w.qp_b);
            thread::spawn(move || cm::accept(al.instance(), passive, qp, &AcceptReply::default()))
        };
        w.al.destroy(w.qp_b, None).unwrap();
        let r = acceptor.join().unwrap();
        match &r {
            Err(e) if e.is_gone(Kind::CEP) => assert!(w.al.resolve(passive).is_err()),
            Err(_) => {
                // Nothing changed: the request is still answerable.
                let qp2 = w.new_qp_b();
                cm::accept(w.al.instance(), passive, qp2, &AcceptReply::default()).unwrap();
                assert_eq!(w.cid(qp2), CidState::Bound(passive.raw()));
            }
            Ok(()) => {
                w.quiesce();
                assert!(
                    w.al.resolve(passive).is_err(),
                    "QP destroy must end the CEP"
                );
            }
        }
        w.finish(&[active, passive]);
    });
}

/// Two accepts of one request on two QPs: exactly one wins; the loser's
/// error is not "CEP gone", its QP is untouched (RESET, unbound), and the
/// winner's QP is the one the connection brings to RTS.
#[test]
fn cm_double_accept() {
    model("cm_double_accept", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested();
        let qp2 = w.new_qp_b();
        let second = {
            let al = w.al.clone();
            thread::spawn(move || cm::accept(al.instance(), passive, qp2, &AcceptReply::default()))
        };
        let first = cm::accept(w.al.instance(), passive, w.qp_b, &AcceptReply::default());
        let second = second.join().unwrap();
        assert!(
            first.is_ok() != second.is_ok(),
            "exactly one accept wins: {first:?} {second:?}"
        );
        let (winner, loser, err) = match (&first, &second) {
            (Ok(()), Err(e)) => (w.qp_b, qp2, e),
            (Err(e), Ok(())) => (qp2, w.qp_b, e),
            _ => unreachable!(),
        };
        assert!(
            !err.is_gone(Kind::CEP),
            "the loser must not end the CEP: {err:?}"
        );
        assert_eq!(w.cid(loser), CidState::Unbound);
        assert_eq!(w.qp_state(loser), QpState::Reset);
        assert_eq!(w.cid(winner), CidState::Bound(passive.raw()));
        // The active side answers the REP with an RTU: the winner's QP, and
        // only it, reaches RTS.
        cm::poll(&w.al, w.port_a).unwrap();
        w.al.run_callbacks();
        cm::rtu(w.al.instance(), active, &[]).unwrap();
        w.quiesce();
        assert_eq!(w.seen.count(passive, "Established"), 1);
        assert_eq!(w.qp_state(winner), QpState::Rts);
        assert_eq!(w.qp_state(loser), QpState::Reset);
        w.finish(&[active, passive]);
        // (finish destroyed the CEPs: the winner's binding went with them.)
    });
}

/// accept races the user destroying the same CEP: afterwards the QP is
/// never left bound to the dead CEP (so it can connect again), whoever won.
#[test]
fn cm_accept_vs_cep_destroy() {
    model("cm_accept_vs_cep_destroy", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested();
        let acceptor = {
            let (al, qp) = (w.al.clone(), w.qp_b);
            thread::spawn(move || cm::accept(al.instance(), passive, qp, &AcceptReply::default()))
        };
        let _ = w.al.destroy(passive, None);
        let r = acceptor.join().unwrap();
        if let Err(e) = &r {
            assert!(
                e.is_gone(Kind::CEP),
                "only the CEP's end can fail this accept: {e:?}"
            );
        }
        w.quiesce();
        assert!(w.al.resolve(passive).is_err());
        assert_eq!(w.cid(w.qp_b), CidState::Unbound, "{r:?}");
        w.finish(&[active]);
    });
}

/// disconnect races QP destroy on an established connection: the CEP is
/// destroyed once, and nothing is left bound or routed.
#[test]
fn cm_disconnect_vs_qp_destroy() {
    model("cm_disconnect_vs_qp_destroy", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested();
        cm::accept(w.al.instance(), passive, w.qp_b, &AcceptReply::default()).unwrap();
        cm::poll(&w.al, w.port_a).unwrap();
        w.al.run_callbacks();
        cm::rtu(w.al.instance(), active, &[]).unwrap();
        w.quiesce();
        assert_eq!(w.qp_state(w.qp_a), QpState::Rts);
        let disconnector = {
            let al = w.al.clone();
            thread::spawn(move || cm::disconnect(al.instance(), active, &[]))
        };
        w.al.destroy(w.qp_a, None).unwrap();
        let _ = disconnector.join().unwrap();
        w.quiesce();
        assert!(w.al.resolve(active).is_err(), "QP destroy ends the CEP");
        w.assert_binding_sound(w.qp_b);
        w.finish(&[passive]);
    });
}

/// A SIDR request whose reply (and the `Released` after it) is handled on
/// another thread as soon as the SIDR_REQ is out: the reply always reaches
/// the requester's handler once and the SIDR CEP always goes, because its
/// route is published before the SIDR_REQ can leave.
#[test]
fn cm_sidr_reply_vs_released() {
    model("cm_sidr_reply_vs_released", || {
        let w = World::new(OnRequest::SidrReply);
        let requester = {
            let (al, ca, handler) = (w.al.clone(), w.ca_a, w.handler());
            thread::spawn(move || {
                let params = SidrParams::new(
                    SERVICE,
                    cep::proto::PeerAddr {
                        lid: 2,
                        gid: [0; 16],
                    },
                );
                cm::sidr_request(al.instance(), ca, params, 1, handler)
            })
        };
        // The other side, and the reply's delivery, race the request call.
        cm::poll(&w.al, w.port_b).unwrap();
        w.al.run_callbacks();
        cm::poll(&w.al, w.port_a).unwrap();
        w.al.run_callbacks();
        let cep = requester.join().unwrap().unwrap();
        w.quiesce();
        assert_eq!(w.seen.count(cep, "SidrReply"), 1, "the reply was lost");
        assert!(
            w.al.resolve(cep).is_err(),
            "the SIDR CEP must go after its reply"
        );
        let passive: Vec<_> = w.seen.requests.lock().clone();
        w.finish(&passive);
    });
}

/// AL close races a connect on the real CM: the close reclaims the CEP
/// whatever the order, and no route or binding outlives it.
#[test]
fn cm_al_close_vs_connect() {
    model("cm_al_close_vs_connect", || {
        let w = World::new(OnRequest::Keep);
        let connector = {
            let (al, qp, handler) = (w.al.clone(), w.qp_a, w.handler());
            thread::spawn(move || {
                let _ = cm::connect(al.instance(), qp, &ConnectRequest::new(SERVICE, 2), handler);
            })
        };
        w.al.instance().close_async(None).unwrap();
        connector.join().unwrap();
        w.al.run_callbacks();
        let stats = w.al.stats();
        assert!(stats.is_clean(), "AL close left {stats}");
        // Every CEP, listen and CM port let go of its port: both agents
        // are shut down (their routes with them).
        assert_eq!(cm::active_ports(), 0, "a port user outlived the AL");
    });
}

// ----------------------------------------------------------- CM-only CEPs --

/// The QP attributes a CM-only consumer gives: numbers of QPs the CM never
/// sees (none exists here: a CM-only CEP never touches one).
fn cm_only_local(qpn: u32) -> cm::LocalQpAttrs {
    cm::LocalQpAttrs::new(QpType::Rc, qpn, 0x100)
}

impl World {
    /// A CM-only connect from A whose REQ reached B's listen.
    fn requested_cm_only(&self) -> (Handle<Cep>, Handle<Cep>) {
        let active = cm::connect_unbound(
            self.al.instance(),
            self.ca_a,
            &ConnectRequest::new(SERVICE, 2),
            &cm_only_local(0x4242),
            self.handler(),
        )
        .unwrap();
        cm::poll(&self.al, self.port_b).unwrap();
        self.al.run_callbacks();
        (active, self.seen.request())
    }

    /// Every connection either agent still holds has ended: TIMEWAIT
    /// (which never expires under loom) or a listener. A CEP whose
    /// teardown did not end its connection leaves it in an earlier state.
    fn assert_connections_ended(&self) {
        for port in [self.port_a, self.port_b] {
            let conns = self.al.resolve(port).unwrap().connections();
            assert!(
                conns.iter().all(|(_, s)| matches!(
                    s,
                    cep::proto::State::Timewait | cep::proto::State::Listen
                )),
                "a connection outlived its CEP: {conns:?}"
            );
        }
    }
}

/// A CM-only accept racing the user destroying the same passive CEP: the
/// accept succeeds or says the CEP is gone; either way the CEP goes once,
/// no QP is touched (there is none: no CID slot to race), and every
/// connection of both agents ends (REJ, or DREQ after the RTU), so no id
/// is held past timewait. The active CM-only CEP goes the same way.
#[test]
fn cm_only_accept_vs_cep_destroy() {
    model("cm_only_accept_vs_cep_destroy", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested_cm_only();
        let acceptor = {
            let al = w.al.clone();
            thread::spawn(move || {
                cm::accept_unbound(
                    al.instance(),
                    passive,
                    &cm_only_local(0x4343),
                    &AcceptReply::default(),
                )
            })
        };
        let _ = w.al.destroy(passive, None);
        let r = acceptor.join().unwrap();
        if let Err(e) = &r {
            assert!(
                e.is_gone(Kind::CEP),
                "only the CEP's end can fail this accept: {e:?}"
            );
        }
        w.quiesce();
        assert!(w.al.resolve(passive).is_err());
        // The active side heard the REJ, or got the REP (and answers it).
        if w.seen.count(active, "ReplyReceived") == 1 {
            let _ = cm::rtu(w.al.instance(), active, &[]);
        }
        let _ = w.al.destroy(active, None);
        w.quiesce();
        assert_eq!(w.cid(w.qp_a), CidState::Unbound, "no QP is ever bound");
        assert_eq!(w.cid(w.qp_b), CidState::Unbound, "no QP is ever bound");
        w.assert_connections_ended();
        w.finish(&[]);
    });
}

/// The user destroying a CM-only active CEP while the exchange runs on
/// another thread (B polled: the REQ accepted CM-only, the REP sent; A
/// polled: the REP delivered): the CEP goes once and its connection ends
/// whatever the order (REJ before or after the REP).
#[test]
fn cm_only_destroy_vs_exchange() {
    model("cm_only_destroy_vs_exchange", || {
        let w = World::new(OnRequest::Keep);
        let (active, passive) = w.requested_cm_only();
        cm::accept_unbound(
            w.al.instance(),
            passive,
            &cm_only_local(0x4343),
            &AcceptReply::default(),
        )
        .unwrap();
        let exchange = {
            let (al, port_a) = (w.al.clone(), w.port_a);
            thread::spawn(move || {
                cm::poll(&al, port_a).unwrap();
                al.run_callbacks();
            })
        };
        w.al.destroy(active, None).unwrap();
        exchange.join().unwrap();
        w.quiesce();
        assert!(w.al.resolve(active).is_err());
        // B's CEP heard the end (REJ or DREQ); the user lets it go.
        let _ = w.al.destroy(passive, None);
        w.quiesce();
        w.assert_connections_ended();
        w.finish(&[]);
    });
}

/// AL close racing a CM-only connect: the close reclaims the CEP whatever
/// the order, and every port user is gone.
#[test]
fn cm_only_al_close_vs_connect() {
    model("cm_only_al_close_vs_connect", || {
        let w = World::new(OnRequest::Keep);
        let connector = {
            let (al, ca, handler) = (w.al.clone(), w.ca_a, w.handler());
            thread::spawn(move || {
                let _ = cm::connect_unbound(
                    al.instance(),
                    ca,
                    &ConnectRequest::new(SERVICE, 2),
                    &cm_only_local(0x4242),
                    handler,
                );
            })
        };
        w.al.instance().close_async(None).unwrap();
        connector.join().unwrap();
        w.al.run_callbacks();
        let stats = w.al.stats();
        assert!(stats.is_clean(), "AL close left {stats}");
        assert_eq!(cm::active_ports(), 0, "a port user outlived the AL");
    });
}
