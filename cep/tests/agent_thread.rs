//! CM agents in thread mode, on the real clock: connect, disconnect and
//! timewait complete within a generous deadline, the event sink can call
//! back into the agent, and shutdown joins the thread cleanly.

#[path = "agent_common.rs"]
mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::sync::Arc;
use cep::agent::{Delivery, EventSink};
use cep::proto::{DisconnectCause, Event, State};
use common::*;

const DEADLINE: Duration = Duration::from_secs(10);

fn expect(rx: &mpsc::Receiver<Event>, what: &str, f: impl Fn(&Event) -> bool) -> Event {
    let end = Instant::now() + DEADLINE;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if f(&e) => return e,
            Ok(_) => {}
            Err(_) => panic!("no {what} within {DEADLINE:?}"),
        }
    }
}

fn forward(tx: mpsc::Sender<Event>) -> EventSink {
    let tx = al::sync::Mutex::new(tx);
    Arc::new(move |e| {
        let _ = tx.lock().send(e);
        Delivery::Taken
    })
}

#[test]
fn connect_and_disconnect_in_thread_mode() {
    let started = Instant::now();
    let (_f, a, b) = pair();
    let b = Arc::new(b);
    let (tx_a, rx_a) = mpsc::channel();
    let (tx_b, rx_b) = mpsc::channel();
    a.set_event_sink(Some(forward(tx_a)));
    // B's sink answers from inside the callback (on B's agent thread).
    let weak_b = Arc::downgrade(&b);
    let tx_b = al::sync::Mutex::new(tx_b);
    b.set_event_sink(Some(Arc::new(move |e: Event| {
        if let Some(b) = weak_b.upgrade() {
            match &e {
                Event::ConnectRequest { conn, .. } => b.accept(*conn, rep_for(0x22)).unwrap(),
                Event::DisconnectRequest { conn, .. } => b.disconnect_reply(*conn, &[]).unwrap(),
                _ => {}
            }
        }
        let _ = tx_b.lock().send(e);
        Delivery::Taken
    })));
    let listener = b.listen(SVC).unwrap();
    a.spawn().unwrap();
    b.spawn().unwrap();
    assert!(a.is_threaded() && b.is_threaded());
    assert!(a.poll(a.now()).is_err(), "poll is for poll mode");

    let ca = a.connect(connect_params(&a, &b, SVC, 0x11)).unwrap();
    expect(
        &rx_a,
        "REP",
        |e| matches!(e, Event::ReplyReceived { conn, .. } if *conn == ca),
    );
    a.send_rtu(ca, &[]).unwrap();
    expect(&rx_a, "Established (A)", |e| {
        *e == Event::Established { conn: ca }
    });
    let cb = match expect(&rx_b, "Established (B)", |e| {
        matches!(e, Event::Established { .. })
    }) {
        Event::Established { conn } => conn,
        _ => unreachable!(),
    };
    assert_eq!(b.state(cb), Some(State::Established));

    a.disconnect(ca, &[]).unwrap();
    expect(
        &rx_a,
        "Disconnected",
        |e| matches!(e, Event::Disconnected { conn, cause: DisconnectCause::DrepReceived, .. } if *conn == ca),
    );
    // Timewait runs out on the agent threads' timers.
    expect(&rx_a, "Released (A)", |e| {
        *e == Event::Released { conn: ca }
    });
    expect(&rx_b, "Released (B)", |e| {
        *e == Event::Released { conn: cb }
    });
    b.cancel_listen(listener).unwrap();
    for s in [a.stats(), b.stats()] {
        assert_eq!((s.live_connections, s.allocated_ids), (0, 0), "{s:?}");
        assert_eq!(s.dropped(), 0);
    }
    // The soft fabric delivers on the sending thread, which served the
    // receiving agent there whenever that agent was free (REQ from this
    // thread to B, REP from B's sink to A, ...) instead of waking its thread.
    assert!(
        a.stats().served_inline + b.stats().served_inline > 0,
        "{:?} {:?}",
        a.stats(),
        b.stats()
    );

    // Nothing armed: the agent threads sleep until kicked, with no
    // periodic wake-up.
    let rounds = |s: cep::agent::AgentStats| s.thread_rounds;
    let before = (rounds(a.stats()), rounds(b.stats()));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        (rounds(a.stats()), rounds(b.stats())),
        before,
        "idle agents woke"
    );

    let t = Instant::now();
    a.shutdown();
    b.shutdown();
    assert!(a.is_shut_down() && b.is_shut_down());
    assert!(!a.is_threaded(), "joined");
    assert!(t.elapsed() < Duration::from_secs(2), "shutdown is prompt");
    assert!(started.elapsed() < DEADLINE);
}

#[test]
fn retries_fire_on_the_real_clock() {
    // No listener and no peer: the REQ to a port nobody serves is retried
    // by the agent thread's timer until it times out.
    let (_f, a, b) = pair();
    let peer = b.local_addr();
    drop(b); // QP1 of B is gone: every REQ is lost.
    let (tx, rx) = mpsc::channel();
    a.set_event_sink(Some(forward(tx)));
    a.spawn().unwrap();
    let mut params = connect_params(&a, &a, SVC, 0x11);
    params.peer = peer;
    let ca = a.connect(params).unwrap();
    expect(
        &rx,
        "Timeout",
        |e| matches!(e, Event::Timeout { conn, .. } if *conn == ca),
    );
    expect(&rx, "Released", |e| *e == Event::Released { conn: ca });
    assert_eq!(
        a.stats().mads_sent,
        1 + u64::from(RETRIES) + 1,
        "REQ, retries, REJ"
    );
    assert_eq!(a.stats().allocated_ids, 0);
}

#[test]
fn shutdown_from_the_sink_on_the_agent_thread_does_not_deadlock() {
    let (_f, a, b) = pair();
    let a = Arc::new(a);
    let weak = Arc::downgrade(&a);
    let (tx, rx) = mpsc::channel();
    let tx = al::sync::Mutex::new(tx);
    a.set_event_sink(Some(Arc::new(move |e: Event| {
        if matches!(e, Event::Rejected { .. }) {
            if let Some(a) = weak.upgrade() {
                a.shutdown();
            }
            let _ = tx.lock().send(());
        }
        Delivery::Taken
    })));
    a.spawn().unwrap();
    b.spawn().unwrap();
    // No listener on B: the REJ arrives on A's thread, whose sink shuts A down.
    a.connect(connect_params(&a, &b, SVC, 0x11)).unwrap();
    rx.recv_timeout(DEADLINE).expect("REJ delivered");
    let end = Instant::now() + DEADLINE;
    while !a.is_shut_down() {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(a);
    b.shutdown();
}
