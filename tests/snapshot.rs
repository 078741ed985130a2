//! `al.snapshot()` against the objects a scenario created and destroyed
//! (issue 29, item 4): two soft HCAs, the CM attached to both, a PD, a CQ,
//! an MR and an RC QP on each, a listen, and a connection between the two
//! QPs. The snapshot must list exactly those objects with their parents,
//! the QPs in RTS bound to their CEPs, the CEPs ESTABLISHED with each
//! other's LID and comm ids; after some are destroyed, exactly the rest;
//! and another AL's objects never.

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::snapshot::{ObjectState, Snapshot};
use ibal::RawHandle;

const SERVICE: u64 = 0x1000_0000_0000_5a17;

/// One side: what it created, by handle.
struct End {
    ca: Handle<Ca>,
    cm_port: Handle<CmPort>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    mr: Handle<Mr>,
    qp: Handle<Qp>,
    qpn: u32,
    buf: RegisteredBuffer,
}

fn end(al: &Al, p: &SoftProvider, guid: u64) -> End {
    let ca = al.open_ca(p, guid).unwrap();
    let ports = ca.attach_cm(al).unwrap();
    assert_eq!(ports.len(), 1);
    let pd = ca.alloc_pd(al).unwrap();
    let cq = ca.create_cq(al, 32).unwrap();
    let buf = RegisteredBuffer::new(256);
    let mr = pd.register(al, &buf, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq)).unwrap();
    let qpn = qp.query(al).unwrap().qpn;
    End {
        ca,
        cm_port: ports[0],
        pd,
        cq,
        mr,
        qp,
        qpn,
        buf,
    }
}

/// (kind, handle, parent, state) of every object of a snapshot.
type Shape = BTreeSet<(Kind, RawHandle, Option<RawHandle>, ObjectState)>;

fn shape(s: &Snapshot) -> Shape {
    s.objects
        .iter()
        .map(|o| (o.kind, o.handle, o.parent, o.state))
        .collect()
}

fn live(
    kind: Kind,
    h: RawHandle,
    parent: Option<RawHandle>,
) -> (Kind, RawHandle, Option<RawHandle>, ObjectState) {
    (kind, h, parent, ObjectState::Live)
}

/// The objects of one side (less what the caller leaves out).
fn side_shape(e: &End, with_mr: bool) -> Shape {
    let mut s: Shape = [
        live(Kind::CA, e.ca.raw(), None),
        live(Kind::CM_PORT, e.cm_port.raw(), Some(e.ca.raw())),
        live(Kind::PD, e.pd.raw(), Some(e.ca.raw())),
        live(Kind::CQ, e.cq.raw(), Some(e.ca.raw())),
        live(Kind::QP, e.qp.raw(), Some(e.pd.raw())),
    ]
    .into_iter()
    .collect();
    if with_mr {
        s.insert(live(Kind::MR, e.mr.raw(), Some(e.pd.raw())));
    }
    s
}

/// Snapshots until `want` holds (destroys finish on the executor and the
/// CM's events arrive there), then returns the one that matched.
fn settled(al: &Al, what: &str, want: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = al.snapshot();
        if want(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: last snapshot:\n{s}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn text<'a>(s: &'a Snapshot, h: RawHandle, key: &str) -> &'a str {
    s.get(h)
        .and_then(|o| o.attrs.get(key))
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{h}: no text {key}:\n{s}"))
}

fn num(s: &Snapshot, h: RawHandle, key: &str) -> u64 {
    s.get(h)
        .and_then(|o| o.attrs.get(key))
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("{h}: no number {key}:\n{s}"))
}

fn handle(s: &Snapshot, h: RawHandle, key: &str) -> Option<RawHandle> {
    s.get(h)
        .and_then(|o| o.attrs.get(key))
        .and_then(|v| v.as_handle())
}

#[test]
fn the_snapshot_is_exactly_what_the_scenario_created_and_destroyed() {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1])).unwrap();
    fabric.add_hca(HcaConfig::new(0xb, &[2])).unwrap();
    let provider = SoftProvider::new(fabric);
    let al = Al::open().unwrap();
    // Another AL on the same CA: its objects must never show in ours.
    let other = Al::open().unwrap();
    let other_ca = other.open_ca(&provider, 0xa).unwrap();
    let other_pd = other_ca.alloc_pd(&other).unwrap();

    let a = end(&al, &provider, 0xa);
    let b = end(&al, &provider, 0xb);

    // B listens and accepts on its QP; A connects and answers with the RTU.
    let (tx, rx) = mpsc::channel::<(&'static str, Handle<Cep>)>();
    let (inst, tx_b, qp_b) = (Arc::clone(&al), tx.clone(), b.qp);
    let on_request: ListenHandler = Arc::new(move |_listen, cep, _request| {
        cep.accept(&inst, qp_b, &AcceptReply::default())
            .expect("accept");
    });
    let passive: CmHandler = Arc::new(move |cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send(("B", cep));
        }
    });
    let listen = b.ca.listen(&al, 1, SERVICE, on_request, passive).unwrap();
    let inst = Arc::clone(&al);
    let active: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => cep.rtu(&inst, &[]).expect("rtu"),
        Event::Established { .. } => {
            let _ = tx.send(("A", cep));
        }
        _ => {}
    });
    let cep_a =
        a.qp.connect(&al, &ConnectRequest::new(SERVICE, 2), active)
            .unwrap();
    let mut cep_b = None;
    for _ in 0..2 {
        let (who, cep) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("established");
        if who == "B" {
            cep_b = Some(cep);
        } else {
            assert_eq!(cep, cep_a);
        }
    }
    let cep_b = cep_b.expect("B established").raw();
    let cep_a = cep_a.raw();

    // Every object, exactly, with its parent.
    let mut want = side_shape(&a, true);
    want.extend(side_shape(&b, true));
    want.insert(live(Kind::LISTEN, listen.raw(), None));
    want.insert(live(Kind::CEP, cep_a, None));
    want.insert(live(Kind::CEP, cep_b, None));
    let s = settled(&al, "the connected scenario", |s| {
        shape(s) == want
            && s.get(b.qp.raw())
                .map(|o| o.attrs.get("state").and_then(|v| v.as_str()))
                == Some(Some("RTS"))
    });
    println!("{s}");
    println!("{}", s.to_json());
    assert_eq!(s.al, al.handle());

    // The QPs: RTS, RC, their QPNs, each bound to its CEP, the peer's QPN.
    for (me, peer, cep) in [(&a, &b, cep_a), (&b, &a, cep_b)] {
        let qp = me.qp.raw();
        assert_eq!(text(&s, qp, "state"), "RTS");
        assert_eq!(text(&s, qp, "type"), "RC");
        assert_eq!(num(&s, qp, "lqpn"), u64::from(me.qpn));
        assert_eq!(num(&s, qp, "rqpn"), u64::from(peer.qpn));
        assert_eq!(handle(&s, qp, "cep"), Some(cep));
        assert_eq!(handle(&s, qp, "send-cq"), Some(me.cq.raw()));
        assert_eq!(handle(&s, cep, "qp"), Some(qp));
        assert_eq!(num(&s, cep, "rqpn"), u64::from(peer.qpn));
        assert_eq!(text(&s, cep, "state"), "ESTABLISHED");
        assert_eq!(num(&s, cep, "service-id"), SERVICE);
        // The CQ holds the QP's two bindings (sends, receives); the MR its
        // length.
        assert_eq!(num(&s, me.cq.raw(), "cqe"), 32);
        assert_eq!(num(&s, me.cq.raw(), "bindings"), 2);
        assert_eq!(num(&s, me.mr.raw(), "mrlen"), 256);
        let pd = s.get(me.pd.raw()).unwrap();
        // The MR and the QP: children, bodies holding the PD, parent links.
        assert_eq!(
            (pd.children, pd.object_refs, pd.core_refs),
            (2, 2, 2),
            "{pd}"
        );
        // The CEP holds its QP.
        assert_eq!(s.get(qp).unwrap().object_refs, 1, "{s}");
    }
    assert_eq!(text(&s, cep_a, "side"), "active");
    assert_eq!(text(&s, cep_b, "side"), "passive");
    // Each CEP names the other's port and comm id.
    assert_eq!(num(&s, cep_a, "peer-lid"), 2);
    assert_eq!(num(&s, cep_b, "peer-lid"), 1);
    assert_eq!(num(&s, cep_a, "rcomm-id"), num(&s, cep_b, "lcomm-id"));
    assert_eq!(num(&s, cep_b, "rcomm-id"), num(&s, cep_a, "lcomm-id"));
    assert_ne!(num(&s, cep_a, "lcomm-id"), num(&s, cep_b, "lcomm-id"));
    assert_eq!(num(&s, listen.raw(), "service-id"), SERVICE);
    // The lines, as `rdma res show` would print them.
    let line = s.get(a.qp.raw()).unwrap().to_string();
    assert!(
        line.starts_with(&format!("qp {} parent {} ", a.qp.raw(), a.pd.raw())),
        "{line}"
    );
    assert!(
        line.contains(&format!("lqpn {} type RC state RTS", a.qpn)),
        "{line}"
    );
    let json = s.to_json();
    assert!(json.contains("\"state\":\"ESTABLISHED\""), "{json}");
    assert!(json.contains(&format!(
        "\"handle\":\"{}\",\"parent\":\"{}\"",
        a.qp.raw(),
        a.pd.raw()
    )));

    // The other AL sees its own two objects, and only those.
    let o = other.snapshot();
    assert_eq!(
        shape(&o),
        [
            live(Kind::CA, other_ca.raw(), None),
            live(Kind::PD, other_pd.raw(), Some(other_ca.raw()))
        ]
        .into_iter()
        .collect::<Shape>()
    );

    // Destroy: A's CEP (a DREQ; A's QP goes to ERR), B's QP (its CEP with
    // it), A's MR and the listen. An MR kept referenced past its destroy
    // shows as destroyed until let go.
    al.destroy_sync(Handle::<Cep>::from_raw(cep_a)).unwrap();
    al.destroy_sync(b.qp).unwrap();
    al.destroy_sync(listen).unwrap();
    let kept = al.resolve(a.mr).unwrap().to_arc();
    al.destroy(a.mr, None).unwrap();
    let mut want = side_shape(&a, false);
    want.extend(side_shape(&b, true));
    want.remove(&live(Kind::QP, b.qp.raw(), Some(b.pd.raw())));
    want.insert((
        Kind::MR,
        a.mr.raw(),
        Some(a.pd.raw()),
        ObjectState::Destroyed,
    ));
    let s = settled(&al, "after the destroys", |s| shape(s) == want);
    println!("{s}");
    assert_eq!(text(&s, a.qp.raw(), "state"), "ERR");
    assert_eq!(handle(&s, a.qp.raw(), "cep"), None);
    assert_eq!(s.get(a.mr.raw()).unwrap().object_refs, 1);
    assert_eq!(num(&s, b.cq.raw(), "bindings"), 0);
    drop(kept);
    want.remove(&(
        Kind::MR,
        a.mr.raw(),
        Some(a.pd.raw()),
        ObjectState::Destroyed,
    ));
    settled(&al, "after the MR was let go", |s| shape(s) == want);
    assert_eq!(other.snapshot().objects.len(), 2);

    drop(a.buf);
    drop(b.buf);
    assert!(al.close().unwrap().is_clean());
    assert!(other.close().unwrap().is_clean());
}
