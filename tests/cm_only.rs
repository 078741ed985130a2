//! CM-only CEPs through the facade (issue 15): a consumer that owns its
//! QPs uses the CM alone (`connect_unbound`, `accept_unbound`), moves its
//! QPs by hand from the attributes the CM negotiated (`accept_attrs`,
//! `connection_attrs`), and the CEPs go exactly as bound ones do.
//!
//! * a CM-only pair: two QPs the test moves itself, SEND and RDMA WRITE
//!   with the data checked, disconnect, destroy, nothing left;
//! * mixed pairs: a CM-only active side with a bound passive side, and a
//!   bound active side with a CM-only passive side (the wire is the same);
//! * bound-only calls on CM-only CEPs fail cleanly and change nothing;
//! * destroy racing the CM-only connect and accept (and AL close racing
//!   the connect) leaks no object, route or agent connection past timewait.
//!
//! The racing tests repeat with jitter; `IBAL_GLUE_ITERATIONS` sets how
//! many times (default 40).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use ibal::cm::State;
use ibal::prelude::*;
use ibal::verbs::CidState;
use ibal::RawHandle;

const SERVICE: u64 = 0x1000_0000_0000_0c0c;
const PSN_A: u32 = 0x12_3456;
const PSN_B: u32 = 0xab_cdef;
const LEN: usize = 4096;

fn provider() -> SoftProvider {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
    fabric.add_hca(HcaConfig::new(0xb000, &[2])).unwrap();
    SoftProvider::new(fabric)
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn access() -> Access {
    Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
}

/// One side: a CA with a PD, a CQ, an RC QP and a registered buffer.
struct End {
    ca: Handle<Ca>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    qpn: u32,
    buf: RegisteredBuffer,
    lkey: u32,
    rkey: u32,
}

fn end(al: &Al, p: &SoftProvider, guid: u64) -> End {
    let ca = al.open_ca(p, guid).unwrap();
    let pd = ca.alloc_pd(al).unwrap();
    let cq = ca.create_cq(al, 64).unwrap();
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq)).unwrap();
    let qpn = qp.query(al).unwrap().qpn;
    let buf = RegisteredBuffer::new(LEN);
    let mr = pd.register(al, &buf, access()).unwrap();
    let (lkey, rkey) = mr.keys(al).unwrap();
    End {
        ca,
        cq,
        qp,
        qpn,
        buf,
        lkey,
        rkey,
    }
}

/// What the handlers saw and did, for the test thread to check.
#[derive(Default)]
struct Log {
    events: StdMutex<Vec<String>>,
    errors: StdMutex<Vec<String>>,
    attrs_a: StdMutex<Option<ConnectionAttrs>>,
    attrs_b: StdMutex<Option<ConnectionAttrs>>,
    passive: StdMutex<Option<Handle<Cep>>>,
}

impl Log {
    fn push(&self, who: &str, ev: &Event) {
        self.events
            .lock()
            .unwrap()
            .push(format!("{who}:{}", ev.name()));
    }
    fn has(&self, entry: &str) -> bool {
        self.events.lock().unwrap().iter().any(|e| e == entry)
    }
    fn check(&self, what: &str, r: Result<()>) {
        if let Err(e) = r {
            self.errors.lock().unwrap().push(format!("{what}: {e}"));
        }
    }
    fn assert_no_errors(&self) {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "handler errors: {errors:?}");
    }
}

fn ends_connection(ev: &Event) -> bool {
    matches!(
        ev,
        Event::Rejected { .. }
            | Event::Timeout { .. }
            | Event::DisconnectRequest { .. }
            | Event::Disconnected { .. }
            | Event::StaleConnection { .. }
    )
}

/// The CM-only active side: on the REP, move the QP to INIT, RTR and RTS
/// from the negotiated attributes, then send the RTU. With `to_err`, the
/// QP goes to ERR when the connection ends (the consumer's duty); without
/// it, the test checks that the CEP left the QP alone.
fn unbound_active(al: &Al, qp: Handle<Qp>, log: &Arc<Log>, to_err: bool) -> CmHandler {
    let (inst, log) = (al.instance().clone(), log.clone());
    Arc::new(move |cep, ev| {
        log.push("A", ev);
        if let Event::ReplyReceived { rep, .. } = ev {
            log.check(
                "A: move the QP and answer the REP",
                (|| {
                    let attrs = cep.connection_attrs(&inst)?;
                    assert_eq!(attrs.peer_qpn, rep.local_qpn);
                    assert_eq!(attrs.peer_starting_psn, rep.starting_psn);
                    qp.modify(&inst, &attrs.init(access()))?;
                    qp.modify(&inst, &attrs.rtr())?;
                    qp.modify(&inst, &attrs.rts())?;
                    *log.attrs_a.lock().unwrap() = Some(attrs);
                    cep.rtu(&inst, b"rtu")
                })(),
            );
        }
        if to_err && ends_connection(ev) {
            log.check(
                "A: QP to ERR",
                qp.modify(&inst, &QpModify::to(QpState::Err)),
            );
        }
        if let Event::DisconnectRequest { .. } = ev {
            log.check("A: DREP", cep.disconnect_reply(&inst, &[]));
        }
    })
}

/// A bound active side: the CM moves the QP; the handler sends the RTU.
fn bound_active(al: &Al, log: &Arc<Log>) -> CmHandler {
    let (inst, log) = (al.instance().clone(), log.clone());
    Arc::new(move |cep, ev| {
        log.push("A", ev);
        if let Event::ReplyReceived { .. } = ev {
            log.check("A: rtu", cep.rtu(&inst, &[]));
        }
    })
}

/// The CM-only passive side on `b.ca`: INIT and RTR before the REP
/// (`accept_attrs`), RTS on `Established`, ERR and DREP on the DREQ.
fn unbound_listen(al: &Al, b: &End, log: &Arc<Log>) -> Handle<Listen> {
    let (inst, qp, qpn, l) = (al.instance().clone(), b.qp, b.qpn, log.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
        l.push("B", ev);
        *l.passive.lock().unwrap() = Some(cep);
        let Event::ConnectRequest { req, .. } = ev else {
            return;
        };
        let local = LocalQpAttrs::new(QpType::Rc, qpn, PSN_B);
        let reply = AcceptReply::default().rdma_depth(2, 3);
        l.check(
            "B: move the QP and accept",
            (|| {
                let attrs = cep.accept_attrs(&inst, &local, &reply)?;
                assert_eq!(attrs.peer_qpn, req.local_qpn);
                assert_eq!(attrs.peer_starting_psn, req.starting_psn);
                qp.modify(&inst, &attrs.init(access()))?;
                qp.modify(&inst, &attrs.rtr())?;
                cep.accept_unbound(&inst, &local, &reply)?;
                // What the REP said is what the QP was given.
                assert_eq!(cep.connection_attrs(&inst)?, attrs);
                *l.attrs_b.lock().unwrap() = Some(attrs);
                Ok(())
            })(),
        );
    });
    let (inst, l) = (al.instance().clone(), log.clone());
    let handler: CmHandler = Arc::new(move |cep, ev| {
        l.push("B", ev);
        if let Event::Established { .. } = ev {
            let rts = cep.connection_attrs(&inst).map(|a| a.rts());
            l.check("B: QP to RTS", rts.and_then(|m| qp.modify(&inst, &m)));
        }
        if ends_connection(ev) {
            l.check(
                "B: QP to ERR",
                qp.modify(&inst, &QpModify::to(QpState::Err)),
            );
        }
        if let Event::DisconnectRequest { .. } = ev {
            l.check("B: DREP", cep.disconnect_reply(&inst, b"bye"));
        }
    });
    b.ca.listen(al, 1, SERVICE, on_request, handler).unwrap()
}

/// A bound passive side: the CM moves `b.qp`.
fn bound_listen(al: &Al, b: &End, log: &Arc<Log>) -> Handle<Listen> {
    let (inst, qp, l) = (al.instance().clone(), b.qp, log.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
        l.push("B", ev);
        *l.passive.lock().unwrap() = Some(cep);
        l.check("B: accept", cep.accept(&inst, qp, &AcceptReply::default()));
    });
    let (inst, l) = (al.instance().clone(), log.clone());
    let handler: CmHandler = Arc::new(move |cep, ev| {
        l.push("B", ev);
        if let Event::DisconnectRequest { .. } = ev {
            l.check("B: DREP", cep.disconnect_reply(&inst, &[]));
        }
    });
    b.ca.listen(al, 1, SERVICE, on_request, handler).unwrap()
}

fn completion(al: &Al, cq: Handle<Cq>) -> Wc {
    let mut wc = [Wc::default()];
    wait("a completion", || cq.poll(al, &mut wc).unwrap() == 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    wc[0]
}

/// A SEND from `from` into a receive on `to`, data checked.
fn send(al: &Al, from: &End, to: &End, msg: &[u8]) {
    let rsge = [Sge {
        addr: 2048,
        length: 1024,
        lkey: to.lkey,
    }];
    to.qp
        .post_recv(
            al,
            &[RecvWr {
                wr_id: 7,
                sg_list: &rsge,
            }],
        )
        .unwrap();
    from.buf.write(0, msg).unwrap();
    let ssge = [Sge {
        addr: 0,
        length: msg.len() as u32,
        lkey: from.lkey,
    }];
    from.qp
        .post_send(al, &[SendWr::new(1, SendOp::Send, &ssge)])
        .unwrap();
    assert_eq!(completion(al, from.cq).opcode, WcOpcode::Send);
    let wc = completion(al, to.cq);
    assert_eq!((wc.wr_id, wc.byte_len as usize), (7, msg.len()));
    let mut got = vec![0u8; msg.len()];
    to.buf.read(2048, &mut got).unwrap();
    assert_eq!(got, msg);
}

/// An RDMA WRITE from `from` into `to`'s buffer at 1024, data checked.
fn write(al: &Al, from: &End, to: &End) {
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 5) as u8).collect();
    from.buf.write(0, &data).unwrap();
    let sge = [Sge {
        addr: 0,
        length: data.len() as u32,
        lkey: from.lkey,
    }];
    let op = SendOp::Write {
        remote_addr: 1024,
        rkey: to.rkey,
    };
    from.qp.post_send(al, &[SendWr::new(2, op, &sge)]).unwrap();
    assert_eq!(completion(al, from.cq).opcode, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; data.len()];
    to.buf.read(1024, &mut got).unwrap();
    assert!(got == data, "the WRITE landed different bytes");
}

fn cid(al: &Al, qp: Handle<Qp>) -> CidState {
    al.resolve(qp).unwrap().cid().load()
}

/// Test 1: both sides CM-only, the QPs moved by hand from the attributes
/// of the events; SEND and RDMA WRITE across them; disconnect; the CEPs
/// never touch the QPs; destroy; nothing left.
#[test]
fn a_cm_only_pair_connects_qps_the_consumer_moves_itself() {
    let p = provider();
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, &p, 0xa000), end(&al, &p, 0xb000));
    let log = Arc::new(Log::default());
    let listen = unbound_listen(&al, &b, &log);

    let request = ConnectRequest::new(SERVICE, 2).rdma_depth(3, 2);
    let local_a = LocalQpAttrs::new(QpType::Rc, a.qpn, PSN_A);
    let handler = unbound_active(&al, a.qp, &log, false);
    let cep =
        a.ca.connect_unbound(&al, &request, &local_a, handler)
            .unwrap();
    assert!(al.resolve(cep).unwrap().is_cm_only());
    wait("established on both sides", || {
        log.has("A:Established") && log.has("B:Established")
    });
    wait("B's QP in RTS", || {
        b.qp.query(&al).unwrap().state == QpState::Rts
    });
    log.assert_no_errors();

    // The attributes each side was given match the other's QP.
    let (qa, qb) = (a.qp.query(&al).unwrap(), b.qp.query(&al).unwrap());
    assert_eq!((qa.state, qb.state), (QpState::Rts, QpState::Rts));
    assert_eq!((qa.dest_qpn, qb.dest_qpn), (b.qpn, a.qpn));
    // Each side's StartingPSN is the PSN it receives from (IBTA, and what
    // Linux's CM does): A receives from PSN_A and sends from B's PSN_B.
    assert_eq!((qa.sq_psn, qa.rq_psn), (PSN_B, PSN_A));
    assert_eq!((qb.sq_psn, qb.rq_psn), (PSN_A, PSN_B));
    // REQ 3/2, reply 2/3: B accepts min(2, 2) reads from A and may have
    // min(3, 3) outstanding at A.
    assert_eq!((qb.max_dest_rd_atomic, qb.max_rd_atomic), (2, 3));
    assert_eq!((qa.max_dest_rd_atomic, qa.max_rd_atomic), (3, 2));
    let attrs_a = log.attrs_a.lock().unwrap().unwrap();
    let attrs_b = log.attrs_b.lock().unwrap().unwrap();
    assert_eq!(
        (attrs_a.peer_qpn, attrs_a.peer_starting_psn),
        (b.qpn, PSN_B)
    );
    assert_eq!(
        (attrs_b.peer_qpn, attrs_b.peer_starting_psn),
        (a.qpn, PSN_A)
    );
    assert_eq!(attrs_a.path, attrs_b.path, "one REQ path for both ends");
    assert_eq!(attrs_a.path.remote_lid, 2);
    // No CID slot was touched: the CEPs are bound to nothing.
    assert_eq!(cid(&al, a.qp), CidState::Unbound);
    assert_eq!(cid(&al, b.qp), CidState::Unbound);

    send(&al, &a, &b, b"CM-only SEND");
    write(&al, &b, &a);
    write(&al, &a, &b);

    cep.disconnect(&al, b"bye").unwrap();
    wait("both CEPs released", || {
        log.has("A:Released") && log.has("B:Released")
    });
    wait("the CEPs to go", || al.stats().live(Kind::CEP) == 0);
    log.assert_no_errors();
    assert!(log.has("A:Disconnected") && log.has("B:DisconnectRequest"));
    // B's consumer moved its QP to ERR on the DREQ; A's handler did not,
    // and the CEP never touches a caller's QP: it is still in RTS.
    assert_eq!(b.qp.query(&al).unwrap().state, QpState::Err);
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Rts);
    a.qp.modify(&al, &QpModify::to(QpState::Err)).unwrap();

    listen.destroy(&al).unwrap();
    a.qp.destroy(&al).unwrap();
    b.qp.destroy(&al).unwrap();
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// Calls that need a bound QP, or a state the CM-only CEP is not in, fail
/// with a clear error and change nothing; bad local attributes are refused
/// before anything is created.
#[test]
fn bound_only_calls_on_cm_only_ceps_fail_cleanly() {
    let p = provider();
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, &p, 0xa000), end(&al, &p, 0xb000));
    let log = Arc::new(Log::default());
    unbound_listen(&al, &b, &log);
    let request = ConnectRequest::new(SERVICE, 2);

    // Local attributes the wire cannot carry.
    for bad in [
        LocalQpAttrs::new(QpType::Ud, a.qpn, 1),
        LocalQpAttrs::new(QpType::Rc, 0, 1),
        LocalQpAttrs::new(QpType::Rc, 1 << 24, 1),
        LocalQpAttrs::new(QpType::Rc, a.qpn, 1 << 24),
    ] {
        let h = unbound_active(&al, a.qp, &log, true);
        let e = a.ca.connect_unbound(&al, &request, &bad, h).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter(_)), "{bad:?}: {e:?}");
    }
    assert_eq!(al.stats().created(Kind::CEP), 0, "nothing was created");

    let local_a = LocalQpAttrs::new(QpType::Rc, a.qpn, PSN_A);
    let handler = unbound_active(&al, a.qp, &log, true);
    let cep =
        a.ca.connect_unbound(&al, &request, &local_a, handler)
            .unwrap();
    // The active side has nothing to accept, and no REP yet.
    let other = a.ca.alloc_pd(&al).unwrap();
    let other = other
        .create_qp(&al, QpCreate::new(QpType::Rc, a.cq))
        .unwrap();
    let e = cep.accept(&al, other, &AcceptReply::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    let e = cep
        .accept_unbound(&al, &local_a, &AcceptReply::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    assert_eq!(cid(&al, other), CidState::Unbound);
    assert_eq!(other.query(&al).unwrap().state, QpState::Reset);

    wait("established", || {
        log.has("A:Established") && log.has("B:Established")
    });
    log.assert_no_errors();
    let passive = log.passive.lock().unwrap().unwrap();
    // A request accepted CM-only cannot be accepted again, bound or not,
    // and the QP offered is untouched.
    let qp2 =
        b.ca.alloc_pd(&al)
            .unwrap()
            .create_qp(&al, QpCreate::new(QpType::Rc, b.cq))
            .unwrap();
    let e = passive
        .accept(&al, qp2, &AcceptReply::default())
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidState(_)) && e.to_string().contains("CM-only"),
        "{e:?}"
    );
    assert_eq!(cid(&al, qp2), CidState::Unbound);
    assert_eq!(qp2.query(&al).unwrap().state, QpState::Reset);
    let local_b = LocalQpAttrs::new(QpType::Rc, b.qpn, PSN_B);
    let e = passive
        .accept_unbound(&al, &local_b, &AcceptReply::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    // The RTU is the active side's; the passive CEP refuses it.
    let e = passive.rtu(&al, &[]).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");
    // A second RTU on the established active CEP: wrong state, no panic.
    let e = cep.rtu(&al, &[]).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e:?}");

    // Destroying the CM-only CEP ends the connection (DREQ): the peer's
    // consumer hears it; the local QP is the consumer's to move.
    let gone = Arc::new(AtomicU32::new(0));
    let g = gone.clone();
    let callback = Box::new(move |_: RawHandle| {
        g.fetch_add(1, Ordering::SeqCst);
    });
    al.destroy(cep, Some(callback)).unwrap();
    // A second destroy is an error, and its callback is not taken.
    assert!(al.destroy(cep, None).is_err());
    wait("B to hear the DREQ", || log.has("B:DisconnectRequest"));
    wait("every CEP to go", || al.stats().live(Kind::CEP) == 0);
    wait("the destroy callback", || gone.load(Ordering::SeqCst) == 1);
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Rts);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// Test 2a: a CM-only active side and a bound passive side.
#[test]
fn a_cm_only_active_side_connects_to_a_bound_passive_side() {
    let p = provider();
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, &p, 0xa000), end(&al, &p, 0xb000));
    let log = Arc::new(Log::default());
    bound_listen(&al, &b, &log);
    let local_a = LocalQpAttrs::new(QpType::Rc, a.qpn, PSN_A);
    let handler = unbound_active(&al, a.qp, &log, true);
    let request = ConnectRequest::new(SERVICE, 2);
    let cep =
        a.ca.connect_unbound(&al, &request, &local_a, handler)
            .unwrap();
    wait("established", || {
        log.has("A:Established") && log.has("B:Established")
    });
    log.assert_no_errors();
    let passive = log.passive.lock().unwrap().unwrap();
    assert_eq!(cid(&al, a.qp), CidState::Unbound);
    assert_eq!(cid(&al, b.qp), CidState::Bound(passive.raw()));
    assert_eq!(b.qp.query(&al).unwrap().sq_psn, PSN_A);
    send(&al, &a, &b, b"unbound to bound");
    write(&al, &b, &a);
    cep.disconnect(&al, &[]).unwrap();
    wait("both released", || {
        log.has("A:Released") && log.has("B:Released")
    });
    log.assert_no_errors();
    // The bound side's CM moved its QP; the CM-only side's consumer did.
    assert_eq!(b.qp.query(&al).unwrap().state, QpState::Err);
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Err);
    wait("B's binding to go", || cid(&al, b.qp) == CidState::Unbound);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// Test 2b: a bound active side and a CM-only passive side.
#[test]
fn a_bound_active_side_connects_to_a_cm_only_passive_side() {
    let p = provider();
    let al = Al::open().unwrap();
    let (a, b) = (end(&al, &p, 0xa000), end(&al, &p, 0xb000));
    let log = Arc::new(Log::default());
    unbound_listen(&al, &b, &log);
    let request = ConnectRequest::new(SERVICE, 2);
    let cep =
        a.qp.connect(&al, &request, bound_active(&al, &log))
            .unwrap();
    wait("established", || {
        log.has("A:Established") && log.has("B:Established")
    });
    wait("B's QP in RTS", || {
        b.qp.query(&al).unwrap().state == QpState::Rts
    });
    log.assert_no_errors();
    assert_eq!(cid(&al, a.qp), CidState::Bound(cep.raw()));
    assert_eq!(cid(&al, b.qp), CidState::Unbound);
    assert_eq!(a.qp.query(&al).unwrap().sq_psn, PSN_B);
    // The bound side's attributes read back the same way.
    let attrs = cep.connection_attrs(&al).unwrap();
    assert_eq!((attrs.peer_qpn, attrs.peer_starting_psn), (b.qpn, PSN_B));
    send(&al, &a, &b, b"bound to unbound");
    write(&al, &b, &a);
    cep.disconnect(&al, &[]).unwrap();
    wait("both released", || {
        log.has("A:Released") && log.has("B:Released")
    });
    log.assert_no_errors();
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Err);
    assert_eq!(b.qp.query(&al).unwrap().state, QpState::Err);
    wait("A's binding to go", || cid(&al, a.qp) == CidState::Unbound);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

// ------------------------------------------------------------------ races --

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

const AUTO: u64 = SERVICE + 1;
const KEEP: u64 = SERVICE + 2;

/// Handlers of the racing tests: no QP anywhere (a CM-only CEP never
/// touches one), the RTU on the REP and the DREP on a DREQ.
fn racing_handler(al: &Al) -> CmHandler {
    let inst = al.instance().clone();
    Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => {
            let _ = cep.rtu(&inst, &[]);
        }
        Event::DisconnectRequest { .. } => {
            let _ = cep.disconnect_reply(&inst, &[]);
        }
        _ => {}
    })
}

/// Every connection the agents of `ports` hold has ended and waited out
/// its timewait: only the listeners are left.
fn agents_drained(al: &Al, ports: &[Handle<CmPort>]) -> bool {
    ports.iter().all(|&p| {
        al.resolve(p)
            .unwrap()
            .connections()
            .iter()
            .all(|(_, s)| *s == State::Listen)
    })
}

/// Test 3: destroy racing the CM-only connect's exchange (REQ, the peer's
/// CM-only accept, REP, RTU) and the CM-only accept, then AL close racing
/// the CM-only connect: afterwards no object is left, and neither agent
/// holds a connection id past timewait.
#[test]
fn destroy_racing_cm_only_connect_and_accept_leaks_nothing() {
    let p = provider();
    // A monitor AL keeps the ports' agents and shows their connections.
    let monitor = Al::open().unwrap();
    let mon_a = monitor.open_ca(&p, 0xa000).unwrap();
    let mon_b = monitor.open_ca(&p, 0xb000).unwrap();
    let ports = [
        mon_a.attach_cm(&monitor).unwrap()[0],
        mon_b.attach_cm(&monitor).unwrap()[0],
    ];

    let al = Al::open().unwrap();
    let ca_a = al.open_ca(&p, 0xa000).unwrap();
    let ca_b = al.open_ca(&p, 0xb000).unwrap();
    let kept = Arc::new(StdMutex::new(Vec::<Handle<Cep>>::new()));
    let inst = al.instance().clone();
    let passive_qpn = AtomicU32::new(0x10_0000);
    let auto: ListenHandler = Arc::new(move |_l, cep, _ev| {
        let qpn = passive_qpn.fetch_add(1, Ordering::Relaxed);
        let local = LocalQpAttrs::new(QpType::Rc, qpn, 7);
        let _ = cep.accept_unbound(&inst, &local, &AcceptReply::default());
    });
    ca_b.listen(&al, 1, AUTO, auto, racing_handler(&al))
        .unwrap();
    let k = kept.clone();
    let keep: ListenHandler = Arc::new(move |_l, cep, _ev| k.lock().unwrap().push(cep));
    ca_b.listen(&al, 1, KEEP, keep, racing_handler(&al))
        .unwrap();

    let mut jitter = Jitter(0x5851_f42d_4c95_7f2d);
    // Distinct QPNs, so B never sees a QPN it holds in timewait (stale).
    let mut qpn = 0x1000u32;
    let mut next_local = || {
        qpn += 1;
        LocalQpAttrs::new(QpType::Rc, qpn, qpn)
    };
    let (mut connect_ok, mut accept) = (0usize, [0usize; 3]);
    for i in 0..iterations() {
        let seed = jitter.0.wrapping_add(i as u64);
        // (a) The active CEP destroyed while its exchange runs.
        let local = next_local();
        let (tx, rx) = std::sync::mpsc::channel();
        let cep = std::thread::scope(|s| {
            s.spawn(|| {
                let h = ca_a
                    .connect_unbound(
                        &al,
                        &ConnectRequest::new(AUTO, 2),
                        &local,
                        racing_handler(&al),
                    )
                    .unwrap();
                tx.send(h).unwrap();
                h
            });
            let h = rx.recv().unwrap();
            Jitter(seed).spin();
            h.destroy(&al).unwrap();
            h
        });
        connect_ok += 1;
        assert!(al.resolve(cep).is_err());

        // (b) The passive CEP's CM-only accept racing its destroy.
        let before = kept.lock().unwrap().len();
        let active = ca_a
            .connect_unbound(
                &al,
                &ConnectRequest::new(KEEP, 2),
                &next_local(),
                racing_handler(&al),
            )
            .unwrap();
        wait("the request", || kept.lock().unwrap().len() > before);
        let passive = kept.lock().unwrap()[before];
        let local_b = next_local();
        let r = std::thread::scope(|s| {
            let t = s.spawn(|| {
                Jitter(seed ^ 0xff).spin();
                passive.destroy(&al)
            });
            jitter.spin();
            let r = passive.accept_unbound(&al, &local_b, &AcceptReply::default());
            let _ = t.join().unwrap();
            r
        });
        match &r {
            Err(e) if e.is_gone(Kind::CEP) => accept[0] += 1,
            Err(e) => panic!("{i}: only the CEP's end can fail this accept: {e:?}"),
            Ok(()) => accept[1] += 1,
        }
        assert!(al.resolve(passive).is_err());
        // The active side: rejected, or connected and then disconnected by
        // the passive CEP's destroy; the user is done with it either way.
        let _ = active.destroy(&al);
        accept[2] += 1;
    }
    eprintln!("CM-only races: {connect_ok} destroys during connect; accept gone/ok = {accept:?}");

    // (c) AL close racing a CM-only connect, on an AL of its own.
    for i in 0..iterations() / 4 {
        let al2 = Al::open().unwrap();
        let ca = al2.open_ca(&p, 0xa000).unwrap();
        let local = next_local();
        let seed = jitter.0.wrapping_add(i as u64);
        let inst2 = al2.instance().clone();
        std::thread::scope(|s| {
            s.spawn(|| {
                let h: CmHandler = Arc::new(|_, _| {});
                let _ = ca.connect_unbound(&inst2, &ConnectRequest::new(AUTO, 2), &local, h);
            });
            Jitter(seed).spin();
            inst2.close_async(None).unwrap();
        });
        al2.wait_closed().unwrap();
        let stats = al2.stats();
        assert!(stats.is_clean(), "AL close left {stats}");
    }

    wait("every CEP to go", || al.stats().live(Kind::CEP) == 0);
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
    // Nothing outlives timewait in either agent: every connection ended
    // (REJ, DREQ/DREP) and its id came back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agents_drained(&monitor, &ports) {
        let left: Vec<_> = ports
            .iter()
            .map(|&p| monitor.resolve(p).unwrap().connections())
            .collect();
        assert!(Instant::now() < deadline, "the agents still hold {left:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = monitor.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}
