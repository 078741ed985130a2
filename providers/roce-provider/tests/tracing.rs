//! The port's `tracing` events (docs/tracing.md), seen by a subscriber:
//! a RoCEv2 datagram from a stranger (127.0.0.77, neither peer's address)
//! at a connected QP is dropped with an event that names the reason, the
//! source and the destination QPN (`ibal::roce::drop`, debug). Positive
//! control: the same packet from the peer's address is delivered and
//! traces no drop. Then a SEND_MIDDLE outside any message from the peer
//! (an invalid request) traces the NAK sent with its syndrome and the QP
//! entering ERR.
//!
//! One test in this file: the subscriber is the process's global one (the
//! port's receive thread emits), installed once.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use common::{connect_with_timeout, cq, qp, ALL};
use provider::{Device, QpState, RecvWr, RegisteredBuffer, Sge, Wc, WcStatus};
use roce::{Bth, Endpoints, Headers, Opcode, Packet};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Metadata, Subscriber};

const STRANGER: &str = "127.0.0.77";

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

/// A subscriber that keeps every event, with its fields as text.
struct Capture;

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
        SEEN.lock().unwrap().push(Seen {
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
    SEEN.lock()
        .unwrap()
        .iter()
        .filter(|s| s.target == target && s.message == message)
        .cloned()
        .collect()
}

/// Waits until an event of `target` with `message` satisfies `f`.
fn until_seen(target: &str, message: &str, f: impl Fn(&Seen) -> bool) -> Seen {
    let stop = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = seen(target, message).into_iter().find(|s| f(s)) {
            return s;
        }
        assert!(
            Instant::now() < stop,
            "no {message:?}: {:#?}",
            SEEN.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `h` + `payload` to `to` from a socket bound to `ip` (port 0),
/// its ICRC computed for that flow.
fn send_from(ip: &str, to: SocketAddr, h: Headers, payload: &[u8]) {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    let ep = Endpoints::new(s.local_addr().unwrap(), to).unwrap();
    let bytes = Packet::new(h, payload).encode(&ep).unwrap();
    s.send_to(&bytes, to).unwrap();
}

#[test]
fn a_strangers_datagram_is_traced_as_dropped_with_its_reason() {
    tracing::subscriber::set_global_default(Capture).unwrap();
    let (da, db) = common::devices();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (cq(&da), cq(&db));
    let (qa, qb) = (qp(&da, &pa, &ca, None), qp(&db, &pb, &cb, None));
    let (na, nb) = (da.qp_num(&qa), db.qp_num(&qb));
    // ACK timeout ~1 s: no retry during the test.
    connect_with_timeout(&da, &qa, &db, nb, 18);
    connect_with_timeout(&db, &qb, &da, na, 18);
    let buf = RegisteredBuffer::new(256);
    let mr = db.register_mr(&pb, &buf, 0, 256, 0, ALL).unwrap();
    let sg = [Sge {
        addr: 0,
        length: 64,
        lkey: db.mr_keys(&mr).0,
    }];
    db.post_recv(
        &qb,
        &[RecvWr {
            wr_id: 1,
            sg_list: &sg,
        }],
    )
    .unwrap();
    let to = db.local_addr(1).unwrap();
    let send = Headers::new(Bth::new(Opcode::RcSendOnly, nb, 7));

    send_from(STRANGER, to, send, b"from a stranger");
    let dropped = until_seen("ibal::roce::drop", "datagram dropped", |s| {
        s.field("src").starts_with(STRANGER)
    });
    assert_eq!(dropped.level, Level::DEBUG);
    assert_eq!(dropped.field("reason"), "WrongSource");
    assert_eq!(dropped.field("why"), "not from the connection's peer");
    assert_eq!(dropped.field("dest_qpn"), format!("{nb:#x}"));
    assert_eq!(dropped.field("port"), "1");

    // Positive control: the same packet from a's address is delivered,
    // and no drop is traced for it.
    send_from("127.0.0.1", to, send, b"from a stranger");
    let stop = Instant::now() + Duration::from_secs(10);
    let mut wc = [Wc::default()];
    while db.poll_cq(&cb, &mut wc).unwrap() == 0 {
        assert!(Instant::now() < stop, "the peer's SEND did not arrive");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    let from_peer = seen("ibal::roce::drop", "datagram dropped")
        .into_iter()
        .filter(|s| s.field("src").starts_with("127.0.0.1:"))
        .count();
    assert_eq!(from_peer, 0, "{:#?}", SEEN.lock().unwrap());

    // An invalid request from the peer: NAK sent with its syndrome, and
    // the QP enters ERR.
    let middle = Headers::new(Bth::new(Opcode::RcSendMiddle, nb, 8));
    send_from("127.0.0.1", to, middle, &[0x55; 1024]);
    let nak = until_seen("ibal::roce", "NAK sent", |s| {
        s.field("qpn") == format!("{nb:#x}")
    });
    assert_eq!(nak.level, Level::INFO);
    assert_eq!(nak.field("syndrome"), "Nak(InvalidRequest)");
    assert_eq!(nak.field("psn"), "0x8");
    let err = until_seen("ibal::roce", "QP entered ERR", |s| {
        s.field("qpn") == format!("{nb:#x}")
    });
    assert_eq!(err.level, Level::WARN);
    assert_eq!(err.field("reason"), "NAK sent for a request in error");
    let stop = Instant::now() + Duration::from_secs(10);
    while db.query_qp(&qb).unwrap().state != QpState::Err {
        assert!(
            Instant::now() < stop,
            "{:?}",
            db.query_qp(&qb).unwrap().state
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(mr);
}
