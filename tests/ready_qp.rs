//! Receives before the connection (issue 29, `docs/cm.md`, "Receives
//! before the connection"): a QP readied with `ready_for_connection` is in
//! INIT, takes receives, and `connect`/`accept` (bound, by LID or by IP)
//! take it INIT -> RTR -> RTS with the receives still posted.
//!
//! * both sides post receives, connect, and each sends the moment its
//!   `Established` arrives: every receive completes with the peer's data,
//!   on the soft fabric and over RoCEv2 on loopback;
//! * a rejected and a timed-out connect leave the readied QP in ERR with
//!   every receive flushed (`WrFlushError`), and the QP can be readied again;
//! * a connect or accept on another port than the QP's INIT port is
//!   refused before anything happens; the receives stay and later complete;
//! * a UD QP, a connected QP and an INIT QP of another port are refused.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::verbs::CidState;

const DEADLINE: Duration = Duration::from_secs(10);
const SERVICE: u64 = 0x1000_0000_0000_29aa;
/// Receives each side posts before it connects, and SENDs each side sends.
const RECVS: u64 = 4;
const MSG: usize = 2048;
/// Each buffer: RECVS receive areas, then RECVS send areas.
const SEND_AT: usize = RECVS as usize * MSG;

/// One side: a CA, a PD, a CQ, an RC QP and a registered buffer.
#[derive(Clone, Copy)]
struct End {
    ca: Handle<Ca>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    lkey: u32,
}

fn end(al: &Al, ca: Handle<Ca>, buf: &RegisteredBuffer) -> Result<End> {
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, 64)?;
    let caps = QpCaps {
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq).caps(caps))?;
    let (lkey, _) = pd.register(al, buf, Access::LOCAL_WRITE)?.keys(al)?;
    Ok(End { ca, cq, qp, lkey })
}

/// Message `i` of the side tagged `tag`, byte by byte.
fn message(tag: u8, i: u64) -> Vec<u8> {
    (0..MSG)
        .map(|k| (k as u8).wrapping_mul(29) ^ tag ^ (i as u8).wrapping_mul(67))
        .collect()
}

/// Fill the send areas with this side's messages and post its receives.
fn prepare(al: &Al, e: End, buf: &RegisteredBuffer, tag: u8) -> Result<()> {
    for i in 0..RECVS {
        buf.write(SEND_AT + i as usize * MSG, &message(tag, i))?;
        let sge = [Sge {
            addr: i * MSG as u64,
            length: MSG as u32,
            lkey: e.lkey,
        }];
        e.qp.post_recv(
            al,
            &[RecvWr {
                wr_id: i,
                sg_list: &sge,
            }],
        )?;
    }
    Ok(())
}

/// Send every message at once (from a CM callback: the moment the
/// connection is established).
fn send_all(inst: &Arc<AlInstance>, e: End) -> Result<()> {
    for i in 0..RECVS {
        let sge = [Sge {
            addr: (SEND_AT + i as usize * MSG) as u64,
            length: MSG as u32,
            lkey: e.lkey,
        }];
        e.qp.post_send(inst, &[SendWr::new(100 + i, SendOp::Send, &sge)])?;
    }
    Ok(())
}

/// Poll `n` completions from `cq` within the deadline (any status).
fn completions(al: &Al, cq: Handle<Cq>, n: usize) -> Vec<Wc> {
    let mut got = Vec::new();
    let end = Instant::now() + DEADLINE;
    let mut wc = [Wc::default(); 8];
    while got.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions", got.len());
        let k = cq.poll(al, &mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    got
}

/// Every receive of `e` completed in order with the peer's (`peer_tag`)
/// messages, and every send of `e` succeeded.
fn check_exchange(al: &Al, e: End, buf: &RegisteredBuffer, peer_tag: u8) {
    let wcs = completions(al, e.cq, 2 * RECVS as usize);
    let recvs: Vec<&Wc> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
    let sends = wcs.iter().filter(|w| w.opcode == WcOpcode::Send).count();
    assert_eq!((recvs.len(), sends), (RECVS as usize, RECVS as usize));
    for (i, wc) in recvs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        assert_eq!(wc.byte_len as usize, MSG);
        let mut got = vec![0; MSG];
        buf.read(i * MSG, &mut got).unwrap();
        assert!(got == message(peer_tag, i as u64), "receive {i}: data");
    }
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
}

/// The passive side: accept every request on `b` and send at once on
/// `Established`; answer DREQs. Errors go to `errors`.
fn passive_handlers(al: &Al, b: End, errors: mpsc::Sender<String>) -> (ListenHandler, CmHandler) {
    let (inst, err) = (Arc::clone(al), errors.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        if let Err(e) = cep.accept(&inst, b.qp, &AcceptReply::default()) {
            let _ = err.send(format!("accept: {e}"));
        }
    });
    let inst = Arc::clone(al);
    let handler: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::Established { .. } => {
            if let Err(e) = send_all(&inst, b) {
                let _ = errors.send(format!("B's sends: {e}"));
            }
        }
        Event::DisconnectRequest { .. } => {
            let _ = cep.disconnect_reply(&inst, &[]);
        }
        _ => {}
    });
    (on_request, handler)
}

/// The active side: RTU on the reply, send at once on `Established`;
/// every event's name goes to `events`.
fn active_handler(al: &Al, a: End, events: mpsc::Sender<String>) -> CmHandler {
    let inst = Arc::clone(al);
    Arc::new(move |cep, ev| {
        let what = match ev {
            Event::ReplyReceived { .. } => cep.rtu(&inst, &[]).err(),
            Event::Established { .. } => send_all(&inst, a).err(),
            _ => None,
        };
        let _ = events.send(match what {
            Some(e) => format!("error in {}: {e}", ev.name()),
            None => ev.name().to_string(),
        });
    })
}

fn wait_for(events: &mpsc::Receiver<String>, name: &str) {
    let end = Instant::now() + DEADLINE;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ev = events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no {name} within {DEADLINE:?}"));
        assert!(!ev.starts_with("error"), "{ev}");
        if ev == name {
            return;
        }
    }
}

/// Ready both QPs, post the receives, connect with `connect`, and check
/// that both sides' first SENDs land in the receives posted in INIT.
fn exchange_on_readied_qps(
    al: &Al,
    (a, buf_a): (End, &RegisteredBuffer),
    (b, buf_b): (End, &RegisteredBuffer),
    listen: impl FnOnce(ListenHandler, CmHandler) -> Result<Handle<Listen>>,
    connect: impl FnOnce(CmHandler) -> Result<Handle<Cep>>,
) -> Result<()> {
    let sge = [Sge {
        addr: 0,
        length: 8,
        lkey: a.lkey,
    }];
    let early = a.qp.post_recv(
        al,
        &[RecvWr {
            wr_id: 9,
            sg_list: &sge,
        }],
    );
    assert!(early.is_err(), "a QP in RESET takes no receive");
    for (e, buf, tag) in [(a, buf_a, 0xa0), (b, buf_b, 0xb0)] {
        e.qp.ready_for_connection(al, 1)?;
        assert_eq!(e.qp.query(al)?.state, QpState::Init);
        assert_eq!(e.qp.query(al)?.port, 1);
        prepare(al, e, buf, tag)?;
    }
    let (err_tx, errors) = mpsc::channel();
    let (on_request, passive) = passive_handlers(al, b, err_tx);
    listen(on_request, passive)?;
    let (tx, events) = mpsc::channel();
    let cep = connect(active_handler(al, a, tx))?;
    wait_for(&events, "Established");
    check_exchange(al, a, buf_a, 0xb0);
    check_exchange(al, b, buf_b, 0xa0);
    assert!(errors.try_recv().is_err(), "passive side failed");
    assert_eq!(a.qp.query(al)?.state, QpState::Rts);
    assert_eq!(b.qp.query(al)?.state, QpState::Rts);
    // Connected: readying it again is refused, and changes nothing.
    let again = a.qp.ready_for_connection(al, 1);
    assert!(matches!(again, Err(Error::AlreadyConnected)), "{again:?}");
    cep.disconnect(al, &[])?;
    wait_for(&events, "Disconnected");
    Ok(())
}

fn soft_provider(ports_a: &[u16], ports_b: &[u16]) -> SoftProvider {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa0, ports_a)).unwrap();
    fabric.add_hca(HcaConfig::new(0xb0, ports_b)).unwrap();
    SoftProvider::new(fabric)
}

fn buffer() -> RegisteredBuffer {
    RegisteredBuffer::new(2 * SEND_AT)
}

#[test]
fn receives_posted_in_init_take_the_first_sends_on_the_soft_fabric() -> Result<()> {
    let provider = soft_provider(&[1], &[2]);
    let al = Al::open()?;
    let (buf_a, buf_b) = (buffer(), buffer());
    let a = end(&al, al.open_ca(&provider, 0xa0)?, &buf_a)?;
    let b = end(&al, al.open_ca(&provider, 0xb0)?, &buf_b)?;
    exchange_on_readied_qps(
        &al,
        (a, &buf_a),
        (b, &buf_b),
        |on_request, passive| b.ca.listen(&al, 1, SERVICE, on_request, passive),
        |active| a.qp.connect(&al, &ConnectRequest::new(SERVICE, 2), active),
    )?;
    assert!(al.close()?.is_clean());
    Ok(())
}

#[test]
fn receives_posted_in_init_take_the_first_sends_over_rocev2() -> Result<()> {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    let provider = RoceProvider::new(vec![
        DeviceConfig::new("roce-a", 0xa1, vec![port("127.0.0.1")]),
        DeviceConfig::new("roce-b", 0xb1, vec![port("127.0.0.2")]),
    ]);
    let al = Al::open()?;
    let (buf_a, buf_b) = (buffer(), buffer());
    let a = end(&al, al.open_ca(&provider, 0xa1)?, &buf_a)?;
    let b = end(&al, al.open_ca(&provider, 0xb1)?, &buf_b)?;
    let at: SocketAddr = "127.0.0.2:7481".parse().unwrap();
    exchange_on_readied_qps(
        &al,
        (a, &buf_a),
        (b, &buf_b),
        |on_request, passive| b.ca.listen_ip(&al, at, on_request, passive),
        |active| a.qp.connect_ip(&al, 1, &IpConnect::new(at), active),
    )?;
    assert!(al.close()?.is_clean());
    Ok(())
}

/// Connect the readied `a` with `request`; the connection fails with the
/// event `failure`; the QP is then in ERR with every receive flushed, and
/// once the CEP is gone it can be readied again.
fn failed_connect_flushes_the_receives(
    al: &Al,
    a: End,
    buf: &RegisteredBuffer,
    request: ConnectRequest,
    failure: &str,
) -> Result<()> {
    a.qp.ready_for_connection(al, 1)?;
    prepare(al, a, buf, 0xa0)?;
    let (tx, events) = mpsc::channel();
    a.qp.connect(al, &request, active_handler(al, a, tx))?;
    wait_for(&events, failure);
    assert_eq!(a.qp.query(al)?.state, QpState::Err);
    let wcs = completions(al, a.cq, RECVS as usize);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::WrFlushError));
        assert_eq!(wc.opcode, WcOpcode::Recv);
    }
    wait_for(&events, "Released");
    let end = Instant::now() + DEADLINE;
    while al.resolve(a.qp)?.cid().load() != CidState::Unbound {
        assert!(Instant::now() < end, "the QP stays bound");
        std::thread::sleep(Duration::from_millis(1));
    }
    a.qp.ready_for_connection(al, 1)?;
    assert_eq!(a.qp.query(al)?.state, QpState::Init);
    prepare(al, a, buf, 0xa0)?;
    Ok(())
}

#[test]
fn a_rejected_connect_leaves_a_readied_qp_in_err_with_its_receives_flushed() -> Result<()> {
    let provider = soft_provider(&[1], &[2]);
    let al = Al::open()?;
    let buf = buffer();
    let a = end(&al, al.open_ca(&provider, 0xa0)?, &buf)?;
    // B's CM runs and nobody listens: the REQ is answered with a REJ.
    al.open_ca(&provider, 0xb0)?.attach_cm(&al)?;
    let nobody = ConnectRequest::new(SERVICE + 1, 2);
    failed_connect_flushes_the_receives(&al, a, &buf, nobody, "Rejected")?;
    assert!(al.close()?.is_clean());
    Ok(())
}

#[test]
fn a_timed_out_connect_leaves_a_readied_qp_in_err_with_its_receives_flushed() -> Result<()> {
    let provider = soft_provider(&[1], &[2]);
    let al = Al::open()?;
    let buf = buffer();
    let a = end(&al, al.open_ca(&provider, 0xa0)?, &buf)?;
    // No port has LID 9: the REQ goes unanswered through its retries.
    let lost = ConnectRequest::new(SERVICE, 9).cm_timeouts(12, 1);
    failed_connect_flushes_the_receives(&al, a, &buf, lost, "Timeout")?;
    assert!(al.close()?.is_clean());
    Ok(())
}

#[test]
fn another_port_than_the_init_port_is_refused_and_the_receives_stay() -> Result<()> {
    // A: ports 1 (LID 1) and 2 (LID 3); B: ports 1 (LID 2) and 2 (LID 4).
    let provider = soft_provider(&[1, 3], &[2, 4]);
    let al = Al::open()?;
    let (buf_a, buf_b) = (buffer(), buffer());
    let a = end(&al, al.open_ca(&provider, 0xa0)?, &buf_a)?;
    let b = end(&al, al.open_ca(&provider, 0xb0)?, &buf_b)?;
    a.qp.ready_for_connection(&al, 2)?;
    prepare(&al, a, &buf_a, 0xa0)?;
    let wrong = a.qp.ready_for_connection(&al, 1);
    assert!(
        matches!(wrong, Err(Error::InvalidParameter(_))),
        "{wrong:?}"
    );

    // connect from port 1: refused before a CEP exists or a REQ leaves.
    let (tx, events) = mpsc::channel();
    let r = a.qp.connect(
        &al,
        &ConnectRequest::new(SERVICE, 2),
        active_handler(&al, a, tx.clone()),
    );
    assert!(matches!(r, Err(Error::InvalidParameter(_))), "{r:?}");
    assert_eq!(al.stats().live(Kind::CEP), 0);
    assert_eq!(a.qp.query(&al)?.state, QpState::Init);

    // B listens on port 1; its readied QP `wrong_b` is on port 2, so the
    // accept on it is refused and the request stays answerable: B then
    // accepts on its QP readied on port 1.
    let wrong_b = end(&al, b.ca, &buf_b)?;
    wrong_b.qp.ready_for_connection(&al, 2)?;
    b.qp.ready_for_connection(&al, 1)?;
    prepare(&al, b, &buf_b, 0xb0)?;
    let (refused_tx, refused) = mpsc::channel();
    let (err_tx, errors) = mpsc::channel();
    let (accept_on_b, passive) = passive_handlers(&al, b, err_tx);
    let inst = Arc::clone(&al);
    let on_request: ListenHandler = Arc::new(move |l, cep, ev| {
        let r = cep.accept(&inst, wrong_b.qp, &AcceptReply::default());
        let _ = refused_tx.send(format!("{r:?}"));
        accept_on_b(l, cep, ev)
    });
    b.ca.listen(&al, 1, SERVICE, on_request, passive)?;
    let from_port_2 = ConnectRequest::new(SERVICE, 2).port(2);
    let cep =
        a.qp.connect(&al, &from_port_2, active_handler(&al, a, tx))?;
    wait_for(&events, "Established");
    let r = refused.recv_timeout(DEADLINE).expect("the first accept");
    assert!(r.starts_with("Err(InvalidParameter"), "{r}");
    assert_eq!(wrong_b.qp.query(&al)?.state, QpState::Init);
    assert_eq!(al.resolve(wrong_b.qp)?.cid().load(), CidState::Unbound);
    // The receives A posted before its refused connect take B's SENDs.
    check_exchange(&al, a, &buf_a, 0xb0);
    check_exchange(&al, b, &buf_b, 0xa0);
    assert!(errors.try_recv().is_err(), "passive side failed");
    cep.disconnect(&al, &[])?;
    wait_for(&events, "Disconnected");
    assert!(al.close()?.is_clean());
    Ok(())
}

#[test]
fn a_ud_qp_is_not_readied_for_a_connection() -> Result<()> {
    let provider = soft_provider(&[1], &[2]);
    let al = Al::open()?;
    let ca = al.open_ca(&provider, 0xa0)?;
    let cq = ca.create_cq(&al, 4)?;
    let ud = ca
        .alloc_pd(&al)?
        .create_qp(&al, QpCreate::new(QpType::Ud, cq))?;
    let r = ud.ready_for_connection(&al, 1);
    assert!(matches!(r, Err(Error::InvalidParameter(_))), "{r:?}");
    assert_eq!(ud.query(&al)?.state, QpState::Reset);
    assert!(al.close()?.is_clean());
    Ok(())
}
