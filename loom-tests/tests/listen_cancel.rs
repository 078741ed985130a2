//! loom model of a listen cancelled while a REQ for it arrives, on the real
//! connection manager (`cep::cm`) over the soft provider.
//!
//! Both CM ports run in poll mode (no agent thread) and the AL's executor is
//! manual, so every step of the protocol runs on a model thread: the REQ
//! sits in B's QP1 receive queue until one thread polls port B (agent,
//! event routing, passive CEP creation, the posted request job) and runs
//! the callbacks, while another thread destroys the listen (the agent
//! cancels it, the route goes). Under loom the polled agents' clocks stand
//! still, so timewait never ends: the model checks the objects and what the
//! agents decide, not timewait expiry.
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::sync::Mutex;
use al::{Al, AlConfig, ExecutorMode, Handle, Kind};
use cep::cm::{self, CmHandler, CmPort, ConnectRequest, ListenHandler};
use cep::proto::Event;
use cep::wire::RejectReason;
use hca::verbs::{self, Ca};
use provider::QpType;
use qp::{create_qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

mod common;
use common::model;

const SERVICE: u64 = 0x1000_0000_0000_00aa;
/// Private data of the REJ the request callback sends: tells its REJ from
/// the ones the CM sends on its own.
const FROM_CALLBACK: &[u8] = b"cb";

fn open_ca(al: &Al, p: &SoftProvider, guid: u64) -> (Handle<Ca>, Handle<CmPort>) {
    let inst = al.instance();
    let ca = verbs::open_ca(inst, p, guid).unwrap();
    let ports = cm::attach_ca_with(inst, ca, cm::CmDrive::Poll).unwrap();
    assert_eq!(ports.len(), 1);
    (ca, ports[0])
}

/// What the model saw, in order: `"req"` when a request callback starts,
/// `"req done"` when it returns, `"listen gone"` for the listen's destroy
/// callback.
#[derive(Default)]
struct Log(Mutex<Vec<&'static str>>);

impl Log {
    fn push(&self, what: &'static str) {
        self.0.lock().push(what);
    }
    fn count(&self, what: &str) -> usize {
        self.0.lock().iter().filter(|w| **w == what).count()
    }
}

/// A REQ racing the cancel of its listen: it is delivered to the request
/// callback (which rejects it) or refused / ended with a REJ by the CM. In
/// every interleaving the active side gets exactly one end (`Rejected`),
/// every passive CEP is destroyed, the listen's destroy callback runs once
/// and after any request callback returned, and the live CEP and listen
/// counters reach zero before AL close.
#[test]
fn listen_cancel_vs_incoming_req() {
    model("listen_cancel_vs_incoming_req", || {
        // ---- setup, single-threaded: two HCAs, polled CM ports, a listen
        // on B, a connect from A whose REQ now waits in B's QP1.
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
        let (ca_a, port_a) = open_ca(&al, &provider, 0xa000);
        let (ca_b, port_b) = open_ca(&al, &provider, 0xb000);
        let inst = al.instance().clone();
        let pd = verbs::alloc_pd(&inst, ca_a).unwrap();
        let cq = verbs::create_cq(&inst, ca_a, 4, None, None).unwrap();
        let qp = create_qp(&inst, pd, QpCreate::new(QpType::Rc, cq)).unwrap();

        let log = std::sync::Arc::new(Log::default());
        let on_request: ListenHandler = {
            let (inst, log) = (inst.clone(), log.clone());
            std::sync::Arc::new(move |_listen, cep, ev| {
                assert!(matches!(ev, Event::ConnectRequest { .. }), "{ev:?}");
                log.push("req");
                cm::reject(&inst, cep, RejectReason::ConsumerReject, FROM_CALLBACK).unwrap();
                // Done with it: the connection waits out timewait in the
                // agent; the CEP object goes now.
                inst.destroy(cep, None).unwrap();
                log.push("req done");
            })
        };
        let passive_events: CmHandler = std::sync::Arc::new(|_cep, ev| {
            panic!("a passive CEP got {ev:?}; only its request callback may see it")
        });
        let listen = cm::listen(&inst, ca_b, 1, SERVICE, on_request, passive_events).unwrap();

        let active_events = std::sync::Arc::new(Mutex::new(Vec::<Event>::new()));
        let active_handler: CmHandler = {
            let events = active_events.clone();
            std::sync::Arc::new(move |_cep, ev| events.lock().push(ev.clone()))
        };
        let active =
            cm::connect(&inst, qp, &ConnectRequest::new(SERVICE, 2), active_handler).unwrap();
        assert_eq!(al.stats().created(Kind::CEP), 1);

        // ---- the race: poll B (and run what it posted) vs cancel the listen.
        let listen_gone = Arc::new(AtomicUsize::new(0));
        let canceller = {
            let (al, log, gone) = (al.clone(), log.clone(), listen_gone.clone());
            thread::spawn(move || {
                al.destroy(
                    listen,
                    Some(Box::new(move |_| {
                        log.push("listen gone");
                        gone.fetch_add(1, Ordering::SeqCst);
                    })),
                )
                .unwrap();
            })
        };
        cm::poll(&al, port_b).unwrap();
        al.run_callbacks();
        canceller.join().unwrap();

        // ---- quiescence on one thread: B's answer reaches A.
        for _ in 0..3 {
            cm::poll(&al, port_b).unwrap();
            cm::poll(&al, port_a).unwrap();
            al.run_callbacks();
        }

        // The listen: destroyed once, its callback once, after every
        // request callback returned.
        assert_eq!(listen_gone.load(Ordering::SeqCst), 1);
        let order = log.0.lock().clone();
        assert_eq!(order.last(), Some(&"listen gone"), "{order:?}");
        let callbacks = log.count("req");
        assert!(callbacks <= 1, "{order:?}");
        assert_eq!(log.count("req done"), callbacks, "{order:?}");
        assert!(al.resolve(listen).is_err());

        // The active side: exactly one end, a REJ.
        let events = active_events.lock().clone();
        assert_eq!(
            events.len(),
            1,
            "the active side must see exactly one end: {events:?}"
        );
        let Event::Rejected { reason, rej, .. } = &events[0] else {
            panic!("the active side must be rejected: {events:?}");
        };
        let by_callback = rej.private_data.starts_with(FROM_CALLBACK);
        assert_eq!(by_callback, callbacks == 1, "{reason:?} {order:?}");
        // Passive CEPs created: one if the REQ reached routing while the
        // listen was live (ended by the callback's REJ or, once the listen
        // was cancelled, by destroying the CEP: REJ(ConsumerReject)); none
        // if B's agent no longer knew the service (a stateless REJ) or the
        // listen was already destroying when the REQ was routed (refused).
        let passive = al.stats().created(Kind::CEP) - 1;
        match reason {
            RejectReason::ConsumerReject => assert_eq!(passive, 1, "{order:?}"),
            RejectReason::InvalidServiceId | RejectReason::NoResources => {
                assert_eq!(passive, 0, "{reason:?} {order:?}")
            }
            other => panic!("unexpected REJ reason {other:?}"),
        }
        // The agents: B keeps the rejected connection (in timewait, which
        // never ends under loom) iff its agent matched the REQ to the
        // listen; A's connection waits out its timewait too.
        let stats_b = al.resolve(port_b).unwrap().stats();
        assert_eq!(stats_b.mads_sent, 1, "B answers the REQ with one REJ");
        let expected_b = usize::from(*reason != RejectReason::InvalidServiceId);
        assert_eq!(stats_b.live_connections, expected_b, "{reason:?} {order:?}");
        assert_eq!(al.resolve(port_a).unwrap().stats().live_connections, 1);

        // The user is done with the rejected active CEP; then nothing is
        // live, without AL close to sweep it up.
        al.destroy(active, None).unwrap();
        al.run_callbacks();
        let stats = al.stats();
        assert_eq!(
            stats.live(Kind::CEP),
            0,
            "passive CEP leaked: {order:?} {reason:?}"
        );
        assert_eq!(stats.live(Kind::LISTEN), 0);

        let al = Arc::try_unwrap(al).unwrap_or_else(|_| panic!("AL still shared"));
        let stats = al.close().unwrap();
        assert!(stats.is_clean(), "{stats}");
    });
}
