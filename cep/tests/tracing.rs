//! The CM's `tracing` events (docs/tracing.md), seen by a subscriber as a
//! person with `ibal -vv` would see them: a REQ to a service nobody
//! listens on shows the REQ going out and coming in, the passive side's
//! REJ with its reason, the active side's REJ received, the active CEP's
//! state changes (IDLE -> REQ_SENT -> TIMEWAIT) and its QP pushed to ERR.
//!
//! And the sans-IO core alone, under a fake clock, traces a REQ nobody
//! answers: each resend, the final timeout (warn) and the REJ "timeout"
//! it sends.
//!
//! The end-to-end test's subscriber is the process's global one (the CM
//! agents' threads emit too), installed once; the core's test runs on
//! one thread under a scoped one.

use std::collections::BTreeMap;
use std::sync::{Arc as StdArc, Mutex as StdMutex};

use al::Al;
use cep::cm::{self, CmHandler, ConnectRequest};
use cep::proto::Event;
use cep::wire::RejectReason;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Metadata, Subscriber};

mod cm_world;
use cm_world::{provider, side, wait};

/// One event as the subscriber saw it.
#[derive(Clone, Debug)]
struct Seen {
    target: String,
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

static SEEN: StdMutex<Vec<Seen>> = StdMutex::new(Vec::new());
static SEEN_BY_CORE: StdMutex<Vec<Seen>> = StdMutex::new(Vec::new());

/// A subscriber that keeps every event, with its fields as text.
struct Capture(&'static StdMutex<Vec<Seen>>);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let message = f.0.remove("message").unwrap_or_default();
        self.0.lock().unwrap().push(Seen {
            target: event.metadata().target().to_string(),
            level: *event.metadata().level(),
            message,
            fields: f.0,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn seen(target: &str, message: &str) -> Vec<Seen> {
    seen_in(&SEEN, target, message)
}

fn seen_in(log: &StdMutex<Vec<Seen>>, target: &str, message: &str) -> Vec<Seen> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|s| s.target == target && s.message == message)
        .cloned()
        .collect()
}

#[test]
fn a_req_nobody_listens_for_is_traced_with_its_rej_reason_and_states() {
    tracing::subscriber::set_global_default(Capture(&SEEN)).unwrap();
    let p = provider();
    let al = Al::open().unwrap();
    let (a, b) = (side(&al, &p, 0xa000), side(&al, &p, 0xb000));
    cm::attach_ca(al.instance(), b.ca).unwrap();
    let got = StdArc::new(StdMutex::new(None));
    let g = got.clone();
    let handler: CmHandler = StdArc::new(move |_cep, ev| {
        if let Event::Rejected { reason, .. } = ev {
            *g.lock().unwrap() = Some(*reason);
        }
    });
    cm::connect(
        al.instance(),
        a.qp,
        &ConnectRequest::new(0xdead, 2),
        handler,
    )
    .unwrap();
    wait("the reject", || got.lock().unwrap().is_some());
    assert_eq!(got.lock().unwrap().unwrap(), RejectReason::InvalidServiceId);
    let qpn = al.resolve(a.qp).unwrap().qpn();
    wait("the QP pushed to ERR", || {
        !seen("ibal::qp", "QP moved to ERR").is_empty()
    });

    // The REQ, as A sent it and B received it (debug, ibal::cm::mad).
    let reqs_sent: Vec<Seen> = seen("ibal::cm::mad", "CM MAD sent")
        .into_iter()
        .filter(|s| s.field("attr") == "REQ")
        .collect();
    assert_eq!(reqs_sent.len(), 1, "{reqs_sent:#?}");
    let req = &reqs_sent[0];
    assert_eq!(req.level, Level::DEBUG);
    let a_comm_id = req.field("local_comm_id").to_string();
    assert!(a_comm_id.starts_with("0x"), "{req:?}");
    assert!(req.field("cep").starts_with("cep#"), "{req:?}");
    assert_eq!(req.field("service_id"), "0xdead");
    assert!(
        seen("ibal::cm::mad", "CM MAD received")
            .iter()
            .any(|s| s.field("attr") == "REQ" && s.field("local_comm_id") == a_comm_id),
        "B's receipt of the REQ"
    );

    // B's REJ: the reason by name and code, naming A's comm id (info).
    let rej_sent = seen("ibal::cm", "REJ sent");
    assert_eq!(rej_sent.len(), 1, "{rej_sent:#?}");
    let r = &rej_sent[0];
    assert_eq!(r.level, Level::INFO);
    assert_eq!(r.field("reason"), "InvalidServiceId");
    assert_eq!(r.field("reason_code"), "8");
    assert_eq!(r.field("message_rejected"), "Req");
    assert_eq!(r.field("remote_comm_id"), a_comm_id);
    assert_eq!(r.field("cep"), "", "a stateless REJ: no CEP on B");

    // A's receipt of it, for A's CEP.
    let rej_received = seen("ibal::cm", "REJ received");
    assert_eq!(rej_received.len(), 1, "{rej_received:#?}");
    let r = &rej_received[0];
    assert_eq!(r.level, Level::INFO);
    assert_eq!(r.field("reason"), "InvalidServiceId");
    assert_eq!(r.field("cep"), req.field("cep"));

    // A's CEP: IDLE -> REQ_SENT -> TIMEWAIT (then IDLE when timewait
    // ends, which may or may not have happened yet).
    let cep = req.field("cep");
    let states: Vec<(String, String)> = seen("ibal::cm", "CEP state change")
        .into_iter()
        .filter(|s| s.field("cep") == cep)
        .map(|s| (s.field("from").to_string(), s.field("to").to_string()))
        .collect();
    let want = [("IDLE", "REQ_SENT"), ("REQ_SENT", "TIMEWAIT")];
    assert!(states.len() >= 2, "{states:?}");
    for (got, want) in states.iter().zip(want) {
        assert_eq!((got.0.as_str(), got.1.as_str()), want, "{states:?}");
    }

    // A's QP went to ERR because of the REJ.
    let err = seen("ibal::qp", "QP moved to ERR");
    assert_eq!(err[0].field("reason"), "Rejected");
    assert_eq!(err[0].field("qpn"), format!("{qpn:#x}"));
    assert_eq!(err[0].level, Level::INFO);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn a_req_nobody_answers_is_traced_with_its_resends_and_timeout() {
    use cep::proto::{ConnectParams, Endpoint, EndpointConfig, PeerAddr};
    use cep::wire::Req;

    let mut a = Endpoint::new(EndpointConfig::new(0xA));
    let nobody = PeerAddr {
        lid: 2,
        gid: [0; 16],
    };
    tracing::subscriber::with_default(Capture(&SEEN_BY_CORE), || {
        let req = Req {
            service_id: 0x1000,
            local_qpn: 0x11,
            max_cm_retries: 3,
            path_mtu: 5,
            ..Req::default()
        };
        a.connect(cep::proto::Nanos(0), ConnectParams::new(nobody, req))
            .unwrap();
        // Every deadline in turn: three resends, the timeout, TIMEWAIT's end.
        for _ in 0..20 {
            while a.poll_transmit().is_some() {}
            let Some(t) = a.next_timeout() else { break };
            a.handle_timeout(t);
        }
    });
    assert_eq!(a.live_connections(), 0);
    let log = &SEEN_BY_CORE;
    let resent: Vec<String> = seen_in(log, "ibal::cm", "CM request resent")
        .iter()
        .map(|s| {
            format!(
                "{} {}/{}",
                s.field("attr"),
                s.field("retry"),
                s.field("max_retries")
            )
        })
        .collect();
    assert_eq!(resent, ["REQ 1/3", "REQ 2/3", "REQ 3/3"]);
    let timed_out = seen_in(log, "ibal::cm", "CM request timed out");
    assert_eq!(timed_out.len(), 1, "{timed_out:#?}");
    assert_eq!(timed_out[0].level, Level::WARN);
    assert_eq!(timed_out[0].field("request"), "Req");
    let rej = seen_in(log, "ibal::cm", "REJ sent");
    assert_eq!(rej.len(), 1, "{rej:#?}");
    assert_eq!(rej[0].field("reason"), "Timeout");
    assert_eq!(rej[0].field("cep"), timed_out[0].field("cep"));
    let states: Vec<String> = seen_in(log, "ibal::cm", "CEP state change")
        .iter()
        .map(|s| format!("{}->{}", s.field("from"), s.field("to")))
        .collect();
    assert_eq!(
        states,
        ["IDLE->REQ_SENT", "REQ_SENT->TIMEWAIT", "TIMEWAIT->IDLE"]
    );
}
