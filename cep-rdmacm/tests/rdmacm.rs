//! The librdmacm-backed CEPs (crate `cep-rdmacm`) on a real verbs device:
//! both ends on one device (`IBAL_RDMA_DEVICE`, or the first listed),
//! connected through the kernel's rdma_cm to the device's own IPv4
//! address, as rping does on one host. Needs the `rdma` feature; with no
//! device (or no rdma_cm in the kernel) each test passes without running
//! but says so, `SKIPPED rdmacm::<test>: <why>` on stderr past the test
//! harness's capture (`.ci/run` counts them); with `IBAL_RDMA_DEVICE` set
//! and the device absent it fails. `.ci/rdma-vm.sh` runs this binary on
//! Linux rxe in the VM.
//!
//! What is checked is the object model's contract, as `cm_objects.rs`
//! checks it for the project's own CM: the events and their order, the
//! CID slot (a second connect on a bound QP fails and leaks nothing; a
//! rejected connection leaves the QP free to connect again; QP destroy
//! destroys the bound CEP), and AL close reclaiming listens and
//! connected CEPs, with nothing left live.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::{Al, Error, Handle};
use cep::cm::AcceptReply;
use cep::ip::IpConnect;
use cep::proto::Event;
use cep::wire::ip_cm::{self, PortSpace};
use cep::wire::RejectReason;
use cep_rdmacm::{self as rdmacm, RdmaCep, RdmaCmHandler, RdmaListen, RdmaListenHandler};
use hca::verbs::{self, Ca, Cq};
use provider::RegisteredBuffer;
use provider::{Access, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus};
use qp::{create_qp, post_recv, post_send, Qp, QpCreate};
use rdma_provider::RdmaProvider;

const WAIT: Duration = Duration::from_secs(20);

/// Says that `test` did not run and why, on the process's stderr
/// directly (the harness captures `eprintln!`): a run without a device is
/// never a silent pass.
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED rdmacm::{test}: {why}");
}

/// The device and its IPv4 address, or `None` after saying why `test`
/// cannot run.
fn device(test: &str) -> Option<(u64, IpAddr)> {
    let provider = RdmaProvider::new();
    let asked = std::env::var("IBAL_RDMA_DEVICE").ok();
    let listed = provider.list();
    let found = listed.as_ref().ok().and_then(|l| {
        l.iter()
            .find(|d| asked.as_deref().is_none_or(|a| a == d.name))
            .cloned()
    });
    let Some(info) = found else {
        assert!(
            asked.is_none(),
            "the device asked for ({asked:?}) is not there: {listed:?}"
        );
        match listed {
            Err(e) => skipped(test, &e.to_string()),
            Ok(_) => skipped(
                test,
                "no RDMA devices found (ibv_get_device_list listed none)",
            ),
        }
        return None;
    };
    if let Err(e) = rdma_provider::rdma_cm_available() {
        assert!(asked.is_none(), "no rdma_cm here: {e}");
        skipped(test, &e.to_string());
        return None;
    }
    let dev = provider::Provider::open(&provider, info.node_guid).expect("open the device");
    let port = provider::Device::query_port(&dev, 1).expect("query port 1");
    let gid = port
        .gid_table
        .iter()
        .find(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
        .copied();
    let Some(gid) = gid else {
        skipped(test, &format!("{} has no IPv4 address", info.name));
        return None;
    };
    Some((info.node_guid, ip_cm::ip_of_gid(gid)))
}

/// A port number per test (they run in parallel on one address).
fn addr(ip: IpAddr, n: u16) -> SocketAddr {
    SocketAddr::new(ip, 20_000 + (std::process::id() as u16 % 2000) * 8 + n)
}

type Events = mpsc::Receiver<(Handle<RdmaCep>, Event)>;

fn handler() -> (RdmaCmHandler, Events) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let h: RdmaCmHandler = std::sync::Arc::new(move |c, ev| {
        let _ = tx.lock().unwrap().send((c, ev.clone()));
    });
    (h, rx)
}

fn next(rx: &Events, what: &str) -> (Handle<RdmaCep>, Event) {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("no event within {WAIT:?} (waiting for {what})"))
}

fn expect(rx: &Events, name: &str) -> (Handle<RdmaCep>, Event) {
    let (c, ev) = next(rx, name);
    assert_eq!(ev.name(), name, "{ev:?}");
    (c, ev)
}

struct End {
    ca: Handle<Ca>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

fn end(al: &Al, guid: u64) -> End {
    let inst = al.instance();
    let ca = verbs::open_ca(inst, &RdmaProvider::new(), guid).unwrap();
    let pd = verbs::alloc_pd(inst, ca).unwrap();
    let cq = verbs::create_cq(inst, ca, 64, None, None).unwrap();
    let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).unwrap();
    let buf = RegisteredBuffer::new(4096);
    let access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    let mr = verbs::register_mr(inst, pd, &buf, 0, 4096, 0, access).unwrap();
    let lkey = al.resolve(mr).unwrap().lkey();
    End {
        ca,
        cq,
        qp,
        buf,
        lkey,
    }
}

fn wait_wc(al: &Al, cq: Handle<Cq>) -> Wc {
    let until = Instant::now() + WAIT;
    let mut wc = [Wc::default(); 1];
    loop {
        if verbs::poll_cq(al, cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(Instant::now() < until, "no completion within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Listening {
    listen: Handle<RdmaListen>,
    requests: Events,
    events: Events,
}

fn listen(al: &Al, ca: Handle<Ca>, at: SocketAddr) -> Listening {
    let (rtx, requests) = mpsc::channel();
    let rtx = std::sync::Mutex::new(rtx);
    let on_request: RdmaListenHandler = std::sync::Arc::new(move |_l, c, ev| {
        let _ = rtx.lock().unwrap().send((c, ev.clone()));
    });
    let (h, events) = handler();
    let listen = rdmacm::listen(al.instance(), ca, at, PortSpace::Tcp, on_request, h).unwrap();
    Listening {
        listen,
        requests,
        events,
    }
}

/// Connects `a` to `b`'s listen at `at`; returns both CEPs, the active
/// side's events, established both ways.
fn connect_pair(
    al: &Al,
    a: &End,
    b: &End,
    l: &Listening,
    at: SocketAddr,
    hello: &[u8],
) -> (Handle<RdmaCep>, Handle<RdmaCep>, Events) {
    let inst = al.instance();
    let (h, events) = handler();
    let active = rdmacm::connect(inst, a.qp, &IpConnect::new(at).private_data(hello), h).unwrap();
    let (passive, ev) = next(&l.requests, "the connect request");
    let Event::ConnectRequest { req, .. } = ev else {
        panic!("{ev:?}")
    };
    let info = cep::ip::request_info(&req).unwrap();
    assert_eq!(info.destination, at);
    assert_eq!(&info.user_data[..hello.len()], hello);
    rdmacm::accept(
        inst,
        passive,
        b.qp,
        &AcceptReply::default().private_data(b"welcome"),
    )
    .unwrap();
    let (c, ev) = expect(&events, "ReplyReceived");
    assert_eq!(c, active);
    let Event::ReplyReceived { rep, .. } = ev else {
        unreachable!()
    };
    assert_eq!(&rep.private_data.as_bytes()[..7], b"welcome");
    assert_eq!(rep.local_qpn, al.resolve(b.qp).unwrap().qpn());
    rdmacm::rtu(inst, active, &[]).unwrap();
    expect(&events, "Established");
    assert_eq!(expect(&l.events, "Established").0, passive);
    (active, passive, events)
}

fn close_clean(al: Al) {
    let stats = al.close().unwrap();
    assert_eq!(stats.total_live(), 0, "{stats}");
}

#[test]
fn a_connection_carries_data_and_ends_with_the_cms_events_in_order() {
    let Some((guid, ip)) =
        device("a_connection_carries_data_and_ends_with_the_cms_events_in_order")
    else {
        return;
    };
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, guid), end(&al, guid));
    let at = addr(ip, 0);
    let l = listen(&al, b.ca, at);
    let (active, passive, events) = connect_pair(&al, &a, &b, &l, at, b"hello");
    // A SEND each way, bytes checked.
    for (from, to, text) in [(&a, &b, b"ping"), (&b, &a, b"pong")] {
        let rs = [Sge {
            addr: 0,
            length: 64,
            lkey: to.lkey,
        }];
        post_recv(
            &al,
            to.qp,
            &[RecvWr {
                wr_id: 7,
                sg_list: &rs,
            }],
        )
        .unwrap();
        from.buf.write(128, text).unwrap();
        let ss = [Sge {
            addr: 128,
            length: 4,
            lkey: from.lkey,
        }];
        post_send(&al, from.qp, &[SendWr::new(8, SendOp::Send, &ss)]).unwrap();
        assert_eq!(wait_wc(&al, from.cq).status, WcStatus::Success);
        let r = wait_wc(&al, to.cq);
        assert_eq!((r.status, r.wr_id, r.byte_len), (WcStatus::Success, 7, 4));
        let mut got = [0u8; 4];
        to.buf.read(0, &mut got).unwrap();
        assert_eq!(&got, text);
    }
    // The active side disconnects; the passive side hears the DREQ and
    // answers; both are released, then gone.
    rdmacm::disconnect(al.instance(), active, &[]).unwrap();
    assert_eq!(
        expect(&l.events, "DisconnectRequest").0,
        passive,
        "the passive side hears the DREQ"
    );
    rdmacm::disconnect_reply(al.instance(), passive, &[]).unwrap();
    expect(&events, "Disconnected");
    expect(&events, "Released");
    expect(&l.events, "Released");
    std::thread::sleep(Duration::from_millis(50));
    assert!(al.resolve(active).is_err() && al.resolve(passive).is_err());
    // Both QPs are free again: the CID slot was released.
    assert!(matches!(
        al.resolve(a.qp).unwrap().cid().load(),
        qp::CidState::Unbound
    ));
    al.destroy_sync(l.listen).unwrap();
    close_clean(al);
}

/// A bound QP's `CommEstablished` (the device saw a packet in RTR before
/// the RTU; rxe never raises it, so the test calls the hook cep_rdmacm set
/// on the passive QP) goes to `rdma_notify`: the kernel's CM completes the
/// passive side, which hears `Established` (and its QP reaches RTS) though
/// the active side never sent its RTU. Without the hook there is nothing to
/// call, and without `rdma_notify` no `Established` comes.
#[test]
fn comm_est_completes_the_passive_side_without_the_rtu() {
    let Some((guid, ip)) = device("comm_est_completes_the_passive_side_without_the_rtu") else {
        return;
    };
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, guid), end(&al, guid));
    let at = addr(ip, 7);
    let l = listen(&al, b.ca, at);
    let (h, events) = handler();
    let inst = al.instance();
    rdmacm::connect(inst, a.qp, &IpConnect::new(at), h).unwrap();
    let (passive, _) = next(&l.requests, "the connect request");
    rdmacm::accept(inst, passive, b.qp, &AcceptReply::default()).unwrap();
    expect(&events, "ReplyReceived");
    // No rtu(): the RTU is never sent. The passive QP's hook stands in for
    // the device's COMM_EST.
    let qp = al.resolve(b.qp).unwrap();
    let (hca::any::AnyDevice::Rdma(dev), hca::any::AnyQp::Rdma(q)) = (qp.device(), qp.provider())
    else {
        panic!("an rdma CA")
    };
    let hook = dev
        .qp_event_hook(q)
        .expect("cep_rdmacm hooks a bound QP's events");
    hook(rdma_provider::QpEvent::CommEstablished);
    assert_eq!(expect(&l.events, "Established").0, passive);
    let until = Instant::now() + WAIT;
    while qp.query().unwrap().state != provider::QpState::Rts {
        assert!(Instant::now() < until, "the passive QP never reached RTS");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(qp);
    al.destroy_sync(l.listen).unwrap();
    close_clean(al);
}

#[test]
fn a_refused_connect_is_rejected_released_and_leaves_the_qp_free() {
    let Some((guid, ip)) = device("a_refused_connect_is_rejected_released_and_leaves_the_qp_free")
    else {
        return;
    };
    let al = Al::open().unwrap();
    let a = end(&al, guid);
    let nobody = addr(ip, 1);
    let (h, events) = handler();
    let c = rdmacm::connect(al.instance(), a.qp, &IpConnect::new(nobody), h.clone()).unwrap();
    // While bound, a second connect on the QP fails and leaks nothing.
    let before = al.instance().stats().total_live();
    let second = rdmacm::connect(al.instance(), a.qp, &IpConnect::new(nobody), h.clone());
    assert!(matches!(second, Err(Error::AlreadyConnected)), "{second:?}");
    let (_, ev) = expect(&events, "Rejected");
    let Event::Rejected { reason, .. } = ev else {
        unreachable!()
    };
    assert_eq!(reason, RejectReason::InvalidServiceId);
    assert_eq!(expect(&events, "Released").0, c);
    // The first CEP is released (its REJ may come back at any time, so
    // `before` cannot be waited for while it lives), and the loser's CEP
    // is destroyed (without blocking: its last reference goes on the AL
    // executor): one object fewer than before the second connect.
    let until = Instant::now() + Duration::from_secs(2);
    while al.instance().stats().total_live() != before - 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(al.instance().stats().total_live(), before - 1);
    std::thread::sleep(Duration::from_millis(50));
    // Unbound again: a new connect binds.
    let again = rdmacm::connect(al.instance(), a.qp, &IpConnect::new(nobody), h).unwrap();
    expect(&events, "Rejected");
    assert_eq!(expect(&events, "Released").0, again);
    close_clean(al);
}

#[test]
fn a_rejected_request_reaches_the_active_side_with_its_private_data() {
    let Some((guid, ip)) =
        device("a_rejected_request_reaches_the_active_side_with_its_private_data")
    else {
        return;
    };
    let al = Al::open().unwrap();
    let a = end(&al, guid);
    let b = end(&al, guid);
    let at = addr(ip, 2);
    let l = listen(&al, b.ca, at);
    let (h, events) = handler();
    rdmacm::connect(al.instance(), a.qp, &IpConnect::new(at), h).unwrap();
    let (passive, _) = next(&l.requests, "the connect request");
    rdmacm::reject(
        al.instance(),
        passive,
        RejectReason::ConsumerReject,
        b"go away",
    )
    .unwrap();
    assert_eq!(expect(&l.events, "Released").0, passive);
    let (_, ev) = expect(&events, "Rejected");
    let Event::Rejected { reason, rej, .. } = ev else {
        unreachable!()
    };
    assert_eq!(reason, RejectReason::ConsumerReject);
    assert_eq!(&rej.private_data.as_bytes()[..7], b"go away");
    expect(&events, "Released");
    al.destroy_sync(l.listen).unwrap();
    close_clean(al);
}

#[test]
fn destroying_a_connected_qp_destroys_its_cep_and_the_peer_hears_of_it() {
    let Some((guid, ip)) =
        device("destroying_a_connected_qp_destroys_its_cep_and_the_peer_hears_of_it")
    else {
        return;
    };
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, guid), end(&al, guid));
    let at = addr(ip, 3);
    let l = listen(&al, b.ca, at);
    let (active, passive, _events) = connect_pair(&al, &a, &b, &l, at, b"x");
    al.destroy_sync(a.qp).unwrap();
    assert!(
        al.resolve(active).is_err(),
        "the bound CEP went with its QP"
    );
    // rdma_destroy_id of a connected id sends the DREQ.
    assert_eq!(expect(&l.events, "DisconnectRequest").0, passive);
    rdmacm::disconnect_reply(al.instance(), passive, &[]).unwrap();
    expect(&l.events, "Released");
    al.destroy_sync(l.listen).unwrap();
    close_clean(al);
}

#[test]
fn al_close_reclaims_listens_and_connected_ceps() {
    let Some((guid, ip)) = device("al_close_reclaims_listens_and_connected_ceps") else {
        return;
    };
    let server = Al::open().unwrap();
    let client = Al::open().unwrap();
    let b = end(&server, guid);
    let a = end(&client, guid);
    let at = addr(ip, 4);
    let l = listen(&server, b.ca, at);
    let (h, events) = handler();
    let inst = client.instance();
    let active = rdmacm::connect(inst, a.qp, &IpConnect::new(at), h).unwrap();
    let (passive, _) = next(&l.requests, "the connect request");
    rdmacm::accept(server.instance(), passive, b.qp, &AcceptReply::default()).unwrap();
    expect(&events, "ReplyReceived");
    rdmacm::rtu(inst, active, &[]).unwrap();
    expect(&events, "Established");
    expect(&l.events, "Established");
    // The server goes with its listen and connected CEP: nothing left.
    close_clean(server);
    // The client hears the DREQ its teardown sent.
    expect(&events, "DisconnectRequest");
    close_clean(client);
}

#[test]
fn the_projects_cm_refuses_an_rdma_ca_and_points_to_librdmacm() {
    let Some((guid, ip)) = device("the_projects_cm_refuses_an_rdma_ca_and_points_to_librdmacm")
    else {
        return;
    };
    let al = Al::open().unwrap();
    let a = end(&al, guid);
    let h: cep::cm::CmHandler = std::sync::Arc::new(|_, _| {});
    let e = cep::ip::connect(al.instance(), a.qp, 1, &IpConnect::new(addr(ip, 5)), h)
        .expect_err("QP1 is the kernel's");
    assert!(e.to_string().contains("librdmacm"), "{e}");
    close_clean(al);
}

/// Destroys racing the exchange, each way round, `IBAL_RDMACM_ITERATIONS`
/// times (default 24): the client destroys its CEP, or its QP, or closes
/// its AL right after `connect` (while rdma_cm resolves or the REQ is out),
/// or the server destroys the request's CEP; the server accepts what
/// reaches it on a fresh QP and destroys that QP afterwards. Every client
/// AL closes with nothing live, then the server's.
#[test]
fn destroys_racing_the_exchange_leak_nothing() {
    let Some((guid, ip)) = device("destroys_racing_the_exchange_leak_nothing") else {
        return;
    };
    let iterations: u32 = std::env::var("IBAL_RDMACM_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let server = Al::open().unwrap();
    let b = end(&server, guid);
    let at = addr(ip, 6);
    let l = listen(&server, b.ca, at);
    let pd = verbs::alloc_pd(server.instance(), b.ca).unwrap();
    for i in 0..iterations {
        let client = Al::open().unwrap();
        let a = end(&client, guid);
        let (h, _events) = handler();
        let inst = client.instance();
        let c = rdmacm::connect(inst, a.qp, &IpConnect::new(at), h).unwrap();
        // Vary where in the exchange the destroy lands.
        std::thread::sleep(Duration::from_micros(u64::from(i % 6) * 400));
        match i % 4 {
            0 => {
                let _ = client.destroy_sync(c);
            }
            1 => client.destroy_sync(a.qp).unwrap(),
            2 => {}
            _ => {
                close_clean(client);
                serve(&server, pd, b.cq, &l, i);
                continue;
            }
        }
        serve(&server, pd, b.cq, &l, i);
        close_clean(client);
    }
    al_drain(&l);
    close_clean(server);
}

/// What the server does with what reached it in one iteration: every
/// request is accepted on a fresh QP, except in iteration kind 2, where
/// the request's CEP is destroyed at once (REJ); the QPs are destroyed
/// afterwards (and with them their CEPs).
fn serve(server: &Al, pd: Handle<hca::verbs::Pd>, cq: Handle<Cq>, l: &Listening, i: u32) {
    let inst = server.instance();
    let mut qps = Vec::new();
    while let Ok((c, ev)) = l.requests.recv_timeout(Duration::from_millis(300)) {
        assert_eq!(ev.name(), "ConnectRequest");
        if i % 4 == 2 {
            let _ = server.destroy_sync(c);
            continue;
        }
        let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).unwrap();
        // The client may be gone already: then the accept fails or the
        // connection ends at once; either way nothing may stay behind.
        let _ = rdmacm::accept(inst, c, qp, &AcceptReply::default());
        qps.push(qp);
    }
    std::thread::sleep(Duration::from_millis(50));
    for qp in qps {
        server.destroy_sync(qp).unwrap();
    }
}

fn al_drain(l: &Listening) {
    while l.events.try_recv().is_ok() {}
}
