//! The async layer (`ibal::asynch`, feature `async`): the CQ stream yields
//! every completion in order, connect and accept establish, a REJ and a
//! timeout come out as clear errors, and every future or stream dropped
//! mid-flight leaves nothing behind (the peer sees a REJ, not a hang, and
//! `al.close()` is clean).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::future::{self, FutureExt};
use futures::stream::StreamExt;
use futures::task::{waker, ArcWake};
use ibal::cm::wire::RejectReason;
use ibal::prelude::*;
use ibal::verbs::QpCaps;

const SERVICE: u64 = 0x1000_0000_0000_00a5;

/// One end: its CA, PD, streamable CQ, RC QP and a registered buffer.
struct End {
    ca: Handle<Ca>,
    cq: AsyncCq,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

/// Two HCAs (GUIDs 0xa and 0xb, LIDs 1 and 2), an AL, and one end on each.
fn world() -> (SoftProvider, Al, End, End) {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1])).unwrap();
    fabric.add_hca(HcaConfig::new(0xb, &[2])).unwrap();
    let provider = SoftProvider::new(fabric);
    let al = Al::open().unwrap();
    let a = end(&al, &provider, 0xa);
    let b = end(&al, &provider, 0xb);
    (provider, al, a, b)
}

fn end(al: &Al, provider: &SoftProvider, guid: u64) -> End {
    let ca = al.open_ca(provider, guid).unwrap();
    // The port answers CM MADs (a REJ for a service nobody listens on).
    ca.attach_cm(al).unwrap();
    let pd = ca.alloc_pd(al).unwrap();
    let cq = ca.create_cq_async(al, 1024).unwrap();
    let caps = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    let qp = pd
        .create_qp(al, QpCreate::new(QpType::Rc, cq.handle()).caps(caps))
        .unwrap();
    let buf = RegisteredBuffer::new(4096);
    let lkey = pd
        .register(al, &buf, Access::LOCAL_WRITE)
        .unwrap()
        .keys(al)
        .unwrap()
        .0;
    End {
        ca,
        cq,
        qp,
        buf,
        lkey,
    }
}

/// Run `fut` to completion on a helper thread: fail instead of hanging.
fn within<F>(secs: u64, fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(block_on(fut));
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the future hung")
}

/// Wait (bounded) until `al` has no live object of `kind`.
fn wait_none(al: &Al, kind: Kind) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while al.stats().live(kind) != 0 {
        assert!(Instant::now() < deadline, "{kind} left: {}", al.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Connect A to B: B listens, takes the first request and accepts it.
fn establish(al: &Al, a: &End, b: &End) -> (Connection, Connection) {
    let mut listener = b.ca.listen_async(al, 1, SERVICE).unwrap();
    let qp_b = b.qp;
    let server = async move {
        let request = listener.next().await.expect("a request");
        assert_eq!(&request.private_data()[..5], b"hello");
        request
            .accept(qp_b, &AcceptReply::default().private_data(b"welcome"))
            .await
    };
    let client =
        a.qp.connect_async(al, &ConnectRequest::new(SERVICE, 2).private_data(b"hello"));
    let (client, server) = within(10, future::join(client, server));
    let (client, server) = (client.unwrap(), server.unwrap());
    assert_eq!(&client.private_data()[..7], b"welcome");
    assert_eq!(&server.private_data()[..5], b"hello");
    (client, server)
}

/// Disconnect `conn` and wait until its CEP is released.
fn disconnect(conn: Connection) {
    within(10, conn.disconnect(b"bye")).unwrap();
}

#[test]
fn connect_and_accept_establish_and_disconnect_releases_both_ceps() {
    let (_p, al, a, b) = world();
    let (client, server) = establish(&al, &a, &b);
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Rts);
    assert_eq!(b.qp.query(&al).unwrap().state, QpState::Rts);
    assert!(!client.is_disconnected());
    // The client disconnects and waits for its release; the server's CEP
    // answers the DREQ by itself, and its own disconnect only waits.
    disconnect(client);
    disconnect(server);
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn the_cq_stream_yields_every_completion_in_order_under_a_burst_of_sends() {
    const N: u64 = 400;
    let (_p, al, a, b) = world();
    let (client, server) = establish(&al, &a, &b);
    let recv = [Sge {
        addr: 0,
        length: 8,
        lkey: b.lkey,
    }];
    for i in 0..N {
        b.qp.post_recv(
            &al,
            &[RecvWr {
                wr_id: i,
                sg_list: &recv,
            }],
        )
        .unwrap();
    }
    let (mut recvs, mut sends) = (b.cq.stream().unwrap(), a.cq.stream().unwrap());
    // The consumer waits first (the stream arms the CQ); a thread then sends
    // in bursts of 1..=40 with pauses, so completions land both while the
    // stream is armed and while it is draining.
    let (inst, qp_a, lkey_a) = (std::sync::Arc::clone(&al), a.qp, a.lkey);
    let sender = std::thread::spawn(move || {
        let send = [Sge {
            addr: 0,
            length: 8,
            lkey: lkey_a,
        }];
        let mut i = 0;
        let mut burst = 1;
        while i < N {
            for _ in 0..burst.min(N - i) {
                qp_a.post_send(&inst, &[SendWr::new(i, SendOp::Send, &send)])
                    .unwrap();
                i += 1;
            }
            burst = burst % 40 + 7;
            std::thread::sleep(Duration::from_micros(300));
        }
    });
    let (recvs_seen, sends_seen) = within(20, async move {
        let mut got = Vec::new();
        while got.len() < N as usize {
            let wc = recvs.next().await.expect("the stream ended").unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            got.push(wc.wr_id);
        }
        let mut sent = Vec::new();
        while sent.len() < N as usize {
            let wc = sends.next().await.expect("the stream ended").unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            sent.push(wc.wr_id);
        }
        (got, sent)
    });
    sender.join().unwrap();
    let expected: Vec<u64> = (0..N).collect();
    assert_eq!(recvs_seen, expected, "receives out of order or missing");
    assert_eq!(sends_seen, expected, "sends out of order or missing");
    drop((client, server));
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn a_rejected_connect_fails_with_the_reason() {
    let (_p, al, a, b) = world();
    let mut listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    let server = async move {
        let request = listener.next().await.expect("a request");
        request
            .reject(RejectReason::ConsumerReject, b"not today")
            .unwrap();
        listener
    };
    let client = a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2));
    let (result, listener) = within(10, future::join(client, server));
    let e = result.unwrap_err();
    match &e {
        Error::RemoteError(d) => assert!(d.contains("ConsumerReject") && d.contains("28"), "{e}"),
        other => panic!("expected the REJ's reason, got {other:?}"),
    }
    // A service nobody listens on: the peer's CM rejects it.
    let e = within(
        10,
        connect_when_free(&al, a.qp, ConnectRequest::new(SERVICE + 1, 2)),
    );
    assert!(
        matches!(&e, Err(Error::RemoteError(d)) if d.contains("InvalidServiceId")),
        "{e:?}"
    );
    drop(listener);
    assert!(al.close().unwrap().is_clean());
}

/// Connect `qp`, retrying while it is still bound to a connection in
/// timewait (a failed connect's CEP is released after timewait).
fn connect_when_free(
    al: &Al,
    qp: Handle<Qp>,
    request: ConnectRequest,
) -> impl Future<Output = Result<Connection>> + Send + 'static {
    let al = std::sync::Arc::clone(al);
    async move {
        loop {
            match qp.connect_async(&al, &request).await {
                Err(Error::QpInTimewait | Error::AlreadyConnected) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => return other,
            }
        }
    }
}

#[test]
fn a_connect_nobody_answers_times_out() {
    let (_p, al, a, _b) = world();
    // LID 9 has no port: the REQ goes nowhere. Short CM timeouts, one retry.
    let request = ConnectRequest::new(SERVICE, 9)
        .cm_timeouts(8, 1)
        .local_ack_timeout(10);
    let started = Instant::now();
    let e = within(10, a.qp.connect_async(&al, &request)).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("no REP"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let (_p, al, a, b) = world();
    // A second stream on one CQ.
    let s1 = a.cq.stream().unwrap();
    assert!(matches!(a.cq.stream(), Err(Error::InvalidState(_))));
    drop(s1);
    let s2 = a.cq.stream().unwrap();
    drop(s2);
    // RTU private data too long: refused before anything is sent.
    let e = block_on(
        a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2))
            .rtu_private_data(&[0; 300]),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    // REQ private data too long, and an out-of-range retry count.
    let e =
        block_on(a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2).private_data(&[1; 93])))
            .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    let e = block_on(a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2).retries(9, 0)))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    // A listen on a port the CA does not have.
    assert!(b.ca.listen_async(&al, 7, SERVICE).is_err());
    // Connecting a QP that is already connected.
    let (client, server) = establish(&al, &a, &b);
    let e = block_on(a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2))).unwrap_err();
    assert_eq!(e, Error::AlreadyConnected);
    // A DREQ with too much private data fails, and still ends the
    // connection (nothing is left behind).
    let e = within(10, client.disconnect(&[0; 300])).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter(_)), "{e:?}");
    disconnect(server);
    wait_none(&al, Kind::CEP);
    // A destroyed CQ: no stream.
    let qp_gone = a.qp;
    qp_gone.destroy(&al).unwrap();
    a.cq.handle().destroy(&al).unwrap();
    assert!(matches!(a.cq.stream(), Err(Error::InvalidHandle { .. })));
    assert!(al.close().unwrap().is_clean());
}

// ------------------------------------------------------ drop cancels cleanly --

#[test]
fn dropping_a_pending_connect_destroys_its_cep_and_the_server_sees_a_rej() {
    let (_p, al, a, b) = world();
    let mut listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    let mut connect = a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2));
    // The first poll sends the REQ; nobody has accepted it yet.
    assert!((&mut connect).now_or_never().is_none());
    let request = within(10, async move { listener.next().await.expect("a request") });
    drop(connect);
    // The server's accept fails (REJ received, or the request already
    // ended by it), it does not hang.
    let e = within(10, request.accept(b.qp, &AcceptReply::default())).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RemoteError(_) | Error::InvalidState(_) | Error::Canceled(_)
        ),
        "{e:?}"
    );
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn dropping_a_pending_accept_destroys_its_cep_and_the_client_does_not_hang() {
    let (_p, al, a, b) = world();
    let mut listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    // The client waits on a helper thread; the server takes the request,
    // sends its REP (first poll of accept) and drops the accept at once.
    let client = connect_when_free(&al, a.qp, ConnectRequest::new(SERVICE, 2));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(block_on(client));
    });
    let request = within(10, async move {
        let r = listener.next().await.expect("a request");
        (r, listener)
    });
    let (request, listener) = request;
    let mut accept = request.accept(b.qp, &AcceptReply::default());
    let _ = (&mut accept).now_or_never();
    drop(accept);
    // The REJ (or, if the client's RTU won the race, the DREQ) reaches the
    // client: it fails, or connects and then sees the disconnect.
    match rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the client hung")
    {
        Err(e) => assert!(matches!(e, Error::RemoteError(_)), "{e:?}"),
        Ok(conn) => disconnect(conn),
    }
    assert!(
        format!("{listener:?}").contains("tracked: 0"),
        "{listener:?}"
    );
    drop(listener);
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn dropping_an_unanswered_request_rejects_it() {
    let (_p, al, a, b) = world();
    let mut listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    let server = async move {
        drop(listener.next().await.expect("a request"));
        listener
    };
    let client = a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2));
    let (result, listener) = within(10, future::join(client, server));
    assert!(matches!(result, Err(Error::RemoteError(_))), "{result:?}");
    // The listener no longer tracks the CEP it destroyed (no `Released`
    // comes for it).
    assert!(
        format!("{listener:?}").contains("tracked: 0"),
        "{listener:?}"
    );
    drop(listener);
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn dropping_the_listener_stops_listening_and_rejects_what_it_queued() {
    let (_p, al, a, b) = world();
    let listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    // A request waits in the listener's queue, never taken.
    let mut connect = a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2));
    assert!((&mut connect).now_or_never().is_none());
    let deadline = Instant::now() + Duration::from_secs(5);
    while al.stats().live(Kind::CEP) < 2 {
        assert!(Instant::now() < deadline, "the request never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(listener);
    wait_none(&al, Kind::LISTEN);
    let e = within(10, connect).unwrap_err();
    assert!(matches!(e, Error::RemoteError(_)), "{e:?}");
    // Nobody listens any more: a new connect is rejected by the CM.
    let e = within(
        10,
        connect_when_free(&al, a.qp, ConnectRequest::new(SERVICE, 2)),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::RemoteError(d) if d.contains("InvalidServiceId")),
        "{e:?}"
    );
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl ArcWake for Count {
    fn wake_by_ref(arc_self: &std::sync::Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn dropping_a_cq_stream_unregisters_it() {
    let (_p, al, a, b) = world();
    let (client, server) = establish(&al, &a, &b);
    // A stream parked on B's CQ (armed), then dropped.
    let count = std::sync::Arc::new(Count::default());
    let w = waker(count.clone());
    let mut stream = b.cq.stream().unwrap();
    let mut cx = std::task::Context::from_waker(&w);
    assert!(stream.poll_next_unpin(&mut cx).is_pending());
    drop(stream);
    // A completion now fires the armed callback into nothing: the dropped
    // stream's waker is not called, and a new stream gets the completion.
    let sge = [Sge {
        addr: 0,
        length: 8,
        lkey: b.lkey,
    }];
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 7,
            sg_list: &sge,
        }],
    )
    .unwrap();
    let send = [Sge {
        addr: 0,
        length: 8,
        lkey: a.lkey,
    }];
    a.buf.fill(0x42).unwrap();
    a.qp.post_send(&al, &[SendWr::new(1, SendOp::Send, &send)])
        .unwrap();
    let mut stream = b.cq.stream().unwrap();
    let wc = within(10, async move { stream.next().await })
        .unwrap()
        .unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    assert_eq!(b.buf.to_vec()[..8], [0x42; 8]);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "a dropped stream was woken"
    );
    drop((client, server));
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn a_destroyed_cq_ends_its_pending_stream() {
    let (_p, al, a, _b) = world();
    let ca = a.ca;
    let cq = ca.create_cq_async(&al, 16).unwrap();
    let stream = cq.stream().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let items: Vec<_> = block_on(stream.collect());
        let _ = tx.send(items);
    });
    std::thread::sleep(Duration::from_millis(20));
    cq.handle().destroy(&al).unwrap();
    let items = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the stream was not woken by the destroy");
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(
        items[0].as_ref().is_err_and(|e| e.is_gone(Kind::CQ)),
        "{items:?}"
    );
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn al_close_under_pending_futures_wakes_them_and_is_clean() {
    let (_p, al, a, b) = world();
    let mut listener = b.ca.listen_async(&al, 1, SERVICE).unwrap();
    let mut connect = a.qp.connect_async(&al, &ConnectRequest::new(SERVICE, 2));
    assert!((&mut connect).now_or_never().is_none());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = block_on(connect);
        // The listener ends once its listen is gone, whatever it queued.
        let rest: Vec<_> = block_on((&mut listener).collect());
        let _ = tx.send((r.map(drop), rest.len()));
    });
    std::thread::sleep(Duration::from_millis(20));
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
    let (r, _) = rx.recv_timeout(Duration::from_secs(5)).expect("hung");
    assert!(r.is_err());
}

/// Answer B's listener with `accept` while A's raw CM handler does `on_rep`
/// with the REP; returns how B's accept ended.
fn accept_against(
    al: &Al,
    a: &End,
    b: &End,
    request: ConnectRequest,
    on_rep: impl Fn(&std::sync::Arc<AlInstance>, Handle<Cep>) + Send + Sync + 'static,
) -> Result<Connection> {
    let mut listener = b.ca.listen_async(al, 1, SERVICE).unwrap();
    let inst = std::sync::Arc::clone(al);
    let handler: CmHandler = std::sync::Arc::new(move |cep, ev| {
        if let Event::ReplyReceived { .. } = ev {
            on_rep(&inst, cep);
        }
    });
    a.qp.connect(al, &request, handler).unwrap();
    let qp_b = b.qp;
    within(20, async move {
        let request = listener.next().await.expect("a request");
        request.accept(qp_b, &AcceptReply::default()).await
    })
}

#[test]
fn an_accept_whose_rep_is_rejected_fails_with_the_reason() {
    let (_p, al, a, b) = world();
    let r = accept_against(&al, &a, &b, ConnectRequest::new(SERVICE, 2), |al, cep| {
        cep.reject(al, RejectReason::ConsumerReject, b"no thanks")
            .unwrap()
    });
    let e = r.unwrap_err();
    assert!(
        matches!(&e, Error::RemoteError(d) if d.contains("ConsumerReject") && d.contains("Rep")),
        "{e:?}"
    );
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn an_accept_whose_rtu_never_comes_times_out() {
    let (_p, al, a, b) = world();
    // A never answers the REP; B's REP retries (from the REQ's short CM
    // timeouts) run out.
    let request = ConnectRequest::new(SERVICE, 2)
        .cm_timeouts(8, 1)
        .local_ack_timeout(10);
    let started = Instant::now();
    let e = accept_against(&al, &a, &b, request, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("no RTU"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(al.close().unwrap().is_clean());
}

/// Receives posted before the connection (`ready_for_connection`,
/// `docs/cm.md`): `connect_async` and `accept` take the readied QPs from
/// INIT, and the client's first SEND, posted as soon as both are
/// established, lands in the receive B posted before it accepted.
#[test]
fn readied_qps_keep_the_receives_posted_in_init_through_the_async_connect() {
    let (_p, al, a, b) = world();
    a.qp.ready_for_connection(&al, 1).unwrap();
    b.qp.ready_for_connection(&al, 1).unwrap();
    let recv = [Sge {
        addr: 0,
        length: 8,
        lkey: b.lkey,
    }];
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 7,
            sg_list: &recv,
        }],
    )
    .unwrap();
    let mut recvs = b.cq.stream().unwrap();
    let (client, server) = establish(&al, &a, &b);
    a.buf.write(0, b"in INIT!").unwrap();
    let send = [Sge {
        addr: 0,
        length: 8,
        lkey: a.lkey,
    }];
    a.qp.post_send(&al, &[SendWr::new(1, SendOp::Send, &send)])
        .unwrap();
    let wc = within(10, async move {
        recvs.next().await.expect("the stream ended").unwrap()
    });
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 8)
    );
    let mut got = [0u8; 8];
    b.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"in INIT!");
    disconnect(client);
    disconnect(server);
    wait_none(&al, Kind::CEP);
    assert!(al.close().unwrap().is_clean());
}
