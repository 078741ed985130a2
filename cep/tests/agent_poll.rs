//! CM agents in poll mode on the soft fabric, with a fake clock: connect,
//! disconnect, timewait, REJ for an unknown service, the bytes on the wire,
//! and the P_Key / Q_Key checks on QP1.

#[path = "agent_common.rs"]
mod common;

use cep::agent::{AgentConfig, CmAgent};
use cep::proto::{DisconnectCause, Event, Nanos, PeerAddr, RejectOrigin, State};
use cep::wire::{attr, CmMad, CmMessage, PathInfo, RejectReason, Req, MAD_LEN};
use common::*;
use provider::{
    Access, AvAttr, CqInit, GrhAttr, QpCaps, QpInit, QpModify, QpState, QpType, RecvWr,
    RegisteredBuffer, SendOp, SendWr, UdDest, WcStatus, GRH_SIZE, GSI_QKEY, MAD_SIZE,
};
use soft_provider::{Fabric, HcaConfig, SoftAv, SoftCq, SoftHca, SoftMr, SoftPd, SoftQp};

fn one(events: &[Event]) -> &Event {
    assert_eq!(events.len(), 1, "expected one event, got {events:?}");
    &events[0]
}

#[test]
fn connect_disconnect_and_timewait_over_qp1() {
    let (_f, a, b) = pair();
    let mut now = Nanos(0);
    let listener = b.listen(SVC).unwrap();
    assert_eq!(b.stats().allocated_ids, 1);

    // REQ: the soft fabric delivers synchronously, B sees it on its poll.
    let ca = a.connect(connect_params(&a, &b, SVC, 0x11)).unwrap();
    assert_eq!(a.state(ca), Some(State::ReqSent));
    let ev = poll_all(now, &[&a, &b]);
    assert!(ev[0].is_empty());
    let cb = match one(&ev[1]) {
        Event::ConnectRequest {
            conn,
            listener: l,
            peer,
            req,
        } => {
            assert_eq!(*l, listener);
            assert_eq!(*peer, a.local_addr(), "source LID and GID from the GRH");
            assert_eq!(req.service_id, SVC);
            assert_eq!(req.local_comm_id, ca.comm_id());
            assert_eq!(req.local_ca_guid, GUID_A);
            *conn
        }
        e => panic!("unexpected {e:?}"),
    };

    // REP.
    now = Nanos(MS);
    b.accept(cb, rep_for(0x22)).unwrap();
    assert_eq!(b.state(cb), Some(State::RepSent));
    let ev = poll_all(now, &[&a, &b]);
    match one(&ev[0]) {
        Event::ReplyReceived { conn, rep } => {
            assert_eq!(*conn, ca);
            assert_eq!(rep.local_comm_id, cb.comm_id());
            assert_eq!(rep.local_qpn, 0x22);
        }
        e => panic!("unexpected {e:?}"),
    }

    // RTU: the active side's Established comes from the call itself.
    a.send_rtu(ca, b"hello").unwrap();
    assert_eq!(
        a.drain_events(),
        vec![Event::Established { conn: ca }],
        "delivered to the queue by the call"
    );
    let ev = poll_all(now, &[&a, &b]);
    assert_eq!(ev[1], vec![Event::Established { conn: cb }]);
    assert_eq!(a.state(ca), Some(State::Established));
    assert_eq!(b.state(cb), Some(State::Established));
    assert_eq!(
        (a.stats().live_connections, b.stats().live_connections),
        (1, 1)
    );

    // DREQ / DREP.
    now = Nanos(2 * MS);
    a.disconnect(ca, &[]).unwrap();
    let ev = poll_all(now, &[&a, &b]);
    assert!(matches!(one(&ev[1]), Event::DisconnectRequest { conn, .. } if *conn == cb));
    b.disconnect_reply(cb, &[]).unwrap();
    let ev = poll_all(now, &[&a, &b]);
    assert!(matches!(
        one(&ev[0]),
        Event::Disconnected { conn, cause: DisconnectCause::DrepReceived, .. } if *conn == ca
    ));
    assert_eq!(a.state(ca), Some(State::Timewait));
    assert_eq!(b.state(cb), Some(State::Timewait));

    // Timewait expiry (the agent fires the timers on poll).
    let mut a_events = Vec::new();
    let mut b_events = Vec::new();
    for _ in 0..100 {
        now = now.saturating_add(MS);
        let mut ev = poll_all(now, &[&a, &b]);
        a_events.append(&mut ev[0]);
        b_events.append(&mut ev[1]);
        if a.stats().allocated_ids == 0 && b.stats().allocated_ids == 1 {
            break;
        }
    }
    assert_eq!(
        a_events,
        vec![
            Event::TimewaitExited { conn: ca },
            Event::Released { conn: ca }
        ]
    );
    assert_eq!(
        b_events,
        vec![
            Event::TimewaitExited { conn: cb },
            Event::Released { conn: cb }
        ]
    );
    b.cancel_listen(listener).unwrap();
    for s in [a.stats(), b.stats()] {
        assert_eq!((s.live_connections, s.allocated_ids), (0, 0), "{s:?}");
        assert_eq!(
            (s.dropped(), s.send_errors, s.recv_errors),
            (0, 0, 0),
            "{s:?}"
        );
        assert_eq!(s.sends_outstanding, 0);
    }
    // REQ, RTU, DREQ one way; REP, DREP the other.
    assert_eq!((a.stats().mads_sent, a.stats().mads_received), (3, 2));
    assert_eq!((b.stats().mads_sent, b.stats().mads_received), (2, 3));
    assert_eq!(a.next_timeout(), None);
    assert_eq!(b.next_timeout(), None);
}

/// A REQ whose primary path names another port than the one it reached is
/// refused with the reason for that field and this port's address as the
/// ARI, and the passive side keeps no state for it.
#[test]
fn req_naming_another_port_gets_rej_with_the_right_address() {
    let (_f, a, b) = pair();
    b.listen(SVC).unwrap();
    let b_addr = b.local_addr();
    let wrong_gid = {
        let mut g = b_addr.gid;
        g[15] ^= 0x5a;
        g
    };
    type Spoil = Box<dyn Fn(&mut PathInfo)>;
    let cases: [(Spoil, RejectReason, Vec<u8>); 2] = [
        (
            Box::new(|p: &mut PathInfo| p.remote_lid = 0x77),
            RejectReason::InvalidPrimaryLid,
            b_addr.lid.to_be_bytes().to_vec(),
        ),
        (
            Box::new(move |p: &mut PathInfo| {
                p.subnet_local = false;
                p.remote_gid = wrong_gid;
            }),
            RejectReason::InvalidPrimaryGid,
            b_addr.gid.to_vec(),
        ),
    ];
    for (i, (spoil, want, ari)) in cases.iter().enumerate() {
        let mut params = connect_params(&a, &b, SVC, 0x30 + i as u32);
        spoil(&mut params.req.primary_path);
        let ca = a.connect(params).unwrap();
        let ev = poll_all(Nanos(0), &[&b, &a]);
        assert!(ev[0].is_empty(), "B answers without an event: {:?}", ev[0]);
        match one(&ev[1]) {
            Event::Rejected {
                conn, reason, rej, ..
            } => {
                assert_eq!(*conn, ca);
                assert_eq!(reason, want);
                assert_eq!(usize::from(rej.rejected_info_length), ari.len());
                assert_eq!(&rej.ari[..ari.len()], &ari[..]);
            }
            e => panic!("unexpected {e:?}"),
        }
        assert_eq!(b.stats().allocated_ids, 1, "only the listener");
    }
    // The same REQ addressed to B's LID, with B's GID, connects.
    let mut params = connect_params(&a, &b, SVC, 0x40);
    params.req.primary_path.subnet_local = false;
    params.req.primary_path.remote_gid = b_addr.gid;
    a.connect(params).unwrap();
    let ev = poll_all(Nanos(0), &[&b]);
    assert!(
        matches!(one(&ev[0]), Event::ConnectRequest { .. }),
        "{:?}",
        ev[0]
    );
}

#[test]
fn req_to_a_service_without_listener_gets_rej() {
    let (_f, a, b) = pair();
    let mut now = Nanos(0);
    b.listen(SVC).unwrap();
    let ca = a.connect(connect_params(&a, &b, SVC + 1, 0x11)).unwrap();
    let ev = poll_all(now, &[&b, &a]);
    assert!(ev[0].is_empty(), "no listener: B answers without an event");
    match one(&ev[1]) {
        Event::Rejected {
            conn,
            reason,
            origin,
            ..
        } => {
            assert_eq!(*conn, ca);
            assert_eq!(*reason, RejectReason::InvalidServiceId);
            assert_eq!(*origin, RejectOrigin::Remote);
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(a.state(ca), Some(State::Timewait));
    assert_eq!(b.stats().allocated_ids, 1, "only the listener");
    let mut released = false;
    for _ in 0..100 {
        now = now.saturating_add(MS);
        let ev = poll_all(now, &[&a, &b]);
        if ev[0].contains(&Event::Released { conn: ca }) {
            released = true;
            break;
        }
    }
    assert!(released);
    assert_eq!(a.stats().allocated_ids, 0);
    assert_eq!(a.stats().live_connections, 0);
    // The released id is not handed out again at once: a new REQ gets a
    // new comm id (same slot index, new modifier, or another slot).
    let again = a.connect(connect_params(&a, &b, SVC, 0x12)).unwrap();
    assert_ne!(again.comm_id(), ca.comm_id());
}

// ---------------------------------------------------------------------------
// A raw QP1 on a third HCA: sees the agent's bytes, sends handmade MADs.
// ---------------------------------------------------------------------------

struct RawGsi {
    hca: SoftHca,
    pd: SoftPd,
    rcq: SoftCq,
    qp: SoftQp,
    inbox: RegisteredBuffer,
    inbox_mr: SoftMr,
    outbox: RegisteredBuffer,
    outbox_mr: SoftMr,
    _scq: SoftCq,
}

const RAW_SLOTS: u64 = 8;
const STRIDE: u64 = (GRH_SIZE + MAD_SIZE) as u64;

impl RawGsi {
    fn new(f: &Fabric, guid: u64, lid: u16, pkeys: Vec<u16>) -> Self {
        let mut cfg = HcaConfig::new(guid, &[lid]);
        cfg.ports[0].pkeys = pkeys;
        let hca = f.add_hca(cfg).unwrap();
        let pd = hca.alloc_pd().unwrap();
        let cq = || {
            hca.create_cq(CqInit {
                capacity: 64,
                ..CqInit::default()
            })
            .unwrap()
        };
        let (scq, rcq) = (cq(), cq());
        let qp = hca
            .create_gsi_qp(
                &pd,
                1,
                &QpInit {
                    qp_type: QpType::Gsi,
                    send_cq: &scq,
                    recv_cq: &rcq,
                    srq: None,
                    caps: QpCaps::default(),
                    sq_sig_all: false,
                },
            )
            .unwrap();
        qp.modify(&QpModify::to(QpState::Init).pkey_index(0).qkey(GSI_QKEY))
            .unwrap();
        qp.modify(&QpModify::to(QpState::Rtr)).unwrap();
        qp.modify(&QpModify::to(QpState::Rts).sq_psn(0)).unwrap();
        let inbox = RegisteredBuffer::new((RAW_SLOTS * STRIDE) as usize);
        let inbox_mr = pd.register(&inbox, Access::LOCAL_WRITE).unwrap();
        for i in 0..RAW_SLOTS {
            qp.post_recv(&[RecvWr {
                wr_id: i,
                sg_list: &[inbox_mr.sge(i * STRIDE, STRIDE as u32)],
            }])
            .unwrap();
        }
        let outbox = RegisteredBuffer::new(MAD_SIZE);
        let outbox_mr = pd.register(&outbox, Access::NONE).unwrap();
        RawGsi {
            hca,
            pd,
            rcq,
            qp,
            inbox,
            inbox_mr,
            outbox,
            outbox_mr,
            _scq: scq,
        }
    }

    fn addr(&self) -> PeerAddr {
        let p = self.hca.query_port(1).unwrap();
        PeerAddr {
            lid: p.lid,
            gid: p.gid_table[0],
        }
    }

    /// The next received MAD: (bytes, source GID from the GRH, completion).
    fn recv(&self) -> Option<(Vec<u8>, [u8; 16], provider::Wc)> {
        let wc = self.rcq.poll_one()?;
        assert_eq!(wc.status, WcStatus::Success);
        let base = (wc.wr_id * STRIDE) as usize;
        let mut mad = vec![0; wc.byte_len as usize - GRH_SIZE];
        self.inbox.read(base + GRH_SIZE, &mut mad).unwrap();
        let mut gid = [0; 16];
        self.inbox.read(base + 8, &mut gid).unwrap();
        self.qp
            .post_recv(&[RecvWr {
                wr_id: wc.wr_id,
                sg_list: &[self.inbox_mr.sge(wc.wr_id * STRIDE, STRIDE as u32)],
            }])
            .unwrap();
        Some((mad, gid, wc))
    }

    fn av_to(&self, to: PeerAddr) -> SoftAv {
        let mut attr = AvAttr::lid(1, to.lid);
        attr.grh = Some(GrhAttr {
            dgid: to.gid,
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 255,
            traffic_class: 0,
        });
        self.hca.create_av(&self.pd, &attr).unwrap()
    }

    fn send(&self, to: PeerAddr, bytes: &[u8], qkey: u32, pkey_index: u16) {
        self.outbox.write(0, bytes).unwrap();
        let av = self.av_to(to);
        self.qp
            .post_send(&[SendWr::new(
                1,
                SendOp::Send,
                &[self.outbox_mr.sge(0, bytes.len() as u32)],
            )
            .to(UdDest {
                av: &av,
                remote_qpn: 1,
                remote_qkey: qkey,
                pkey_index,
            })])
            .unwrap();
    }
}

#[test]
fn bytes_on_the_wire_are_a_valid_256_byte_cm_mad() {
    let f = Fabric::new();
    let ha = f.add_hca(HcaConfig::new(GUID_A, &[1])).unwrap();
    let a = CmAgent::new(ha, 1, AgentConfig::default()).unwrap();
    let raw = RawGsi::new(&f, 0xC0, 3, vec![0xffff]);
    let to = raw.addr();
    let mut req = Req {
        service_id: SVC,
        local_qpn: 0x33,
        max_cm_retries: RETRIES,
        remote_cm_response_timeout: RESP,
        local_cm_response_timeout: RESP,
        // A REQ a peer can accept (connect refuses MTU code 0).
        path_mtu: 5,
        ..Req::default()
    };
    req.primary_path.local_ack_timeout = PLT + 1;
    let conn = a.connect(cep::proto::ConnectParams::new(to, req)).unwrap();
    let (bytes, src_gid, wc) = raw.recv().expect("the REQ reached QP1 of the peer");
    assert_eq!(bytes.len(), MAD_LEN);
    assert_eq!(wc.byte_len as usize, GRH_SIZE + MAD_SIZE);
    assert_eq!((wc.src_qp, wc.slid, wc.pkey_index), (1, 1, 0));
    assert!(wc.grh, "the peer address has a GID: routed with a GRH");
    assert_eq!(src_gid, a.local_addr().gid);
    // MAD header: base version 1, class CM (0x07) version 2, method Send.
    assert_eq!(&bytes[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(u16::from_be_bytes([bytes[16], bytes[17]]), attr::REQ);
    let mad = CmMad::decode(&bytes).expect("decodes");
    match mad.message {
        CmMessage::Req(r) => {
            assert_eq!(r.local_comm_id, conn.comm_id());
            assert_eq!(r.service_id, SVC);
            assert_eq!(r.local_qpn, 0x33);
            assert_eq!(r.local_ca_guid, GUID_A);
        }
        m => panic!("not a REQ: {m:?}"),
    }
    assert_eq!(mad.encode().unwrap().to_vec(), bytes, "round trip");

    // The retry after the response wait is the same REQ (same TID).
    let wait = cep::proto::response_wait_nanos(PLT, RESP);
    a.poll(Nanos(wait)).unwrap();
    let (again, _, _) = raw.recv().expect("retried");
    assert_eq!(again, bytes);
    assert_eq!(a.stats().mads_sent, 2);
}

#[test]
fn mads_failing_pkey_or_qkey_checks_never_reach_the_endpoint() {
    let f = Fabric::new();
    let ha = f.add_hca(HcaConfig::new(GUID_A, &[1])).unwrap();
    let a = CmAgent::new(ha, 1, AgentConfig::default()).unwrap();
    let listener = a.listen(SVC).unwrap();
    // The raw port also has P_Key 0x8005, which A's port does not.
    let raw = RawGsi::new(&f, 0xC0, 3, vec![0xffff, 0x8005]);
    let req = Req {
        service_id: SVC,
        local_comm_id: 0x1234,
        local_ca_guid: 0xC0,
        local_qpn: 0x44,
        max_cm_retries: RETRIES,
        remote_cm_response_timeout: RESP,
        local_cm_response_timeout: RESP,
        // A valid path MTU code (4096): code 0 names no MTU and is rejected.
        path_mtu: 5,
        // Addressed to A's port (another LID is refused).
        primary_path: PathInfo {
            remote_lid: a.local_addr().lid,
            ..PathInfo::default()
        },
        ..Req::default()
    };
    let bytes = CmMad::new(7, req).encode().unwrap();
    let now = Nanos(0);

    // Wrong Q_Key.
    raw.send(a.local_addr(), &bytes, 0x1234_5678, 0);
    a.poll(now).unwrap();
    assert!(a.drain_events().is_empty());
    assert_eq!(a.stats().mads_received, 0);
    assert_eq!(f.stats().dropped_qkey, 1);

    // P_Key 0x8005 is not in A's table.
    raw.send(a.local_addr(), &bytes, GSI_QKEY, 1);
    a.poll(now).unwrap();
    assert!(a.drain_events().is_empty());
    assert_eq!(a.stats().mads_received, 0);
    assert_eq!(f.stats().dropped_pkey, 1);

    // Right keys but not a CM MAD: reaches QP1, dropped by the endpoint.
    let mut junk = bytes;
    junk[1] = 0x03; // management class SA
    raw.send(a.local_addr(), &junk, GSI_QKEY, 0);
    // A short MAD.
    raw.send(a.local_addr(), &bytes[..100], GSI_QKEY, 0);
    a.poll(now).unwrap();
    assert!(a.drain_events().is_empty());
    let s = a.stats();
    assert_eq!(
        (s.mads_received, s.dropped_malformed, s.dropped()),
        (2, 2, 2)
    );
    assert_eq!(s.allocated_ids, 1);

    // The same REQ with the right keys gets through.
    raw.send(a.local_addr(), &bytes, GSI_QKEY, 0);
    a.poll(now).unwrap();
    let ev = a.drain_events();
    let conn = match one(&ev) {
        Event::ConnectRequest {
            conn,
            listener: l,
            peer,
            req,
        } => {
            assert_eq!(*l, listener);
            assert_eq!(*peer, raw.addr());
            assert_eq!(req.local_comm_id, 0x1234);
            *conn
        }
        e => panic!("unexpected {e:?}"),
    };
    assert_eq!(a.stats().mads_received, 3);
    // The REP goes back to the raw QP1 and decodes.
    a.accept(conn, rep_for(0x55)).unwrap();
    let (rep, _, _) = raw.recv().expect("REP");
    match CmMad::decode(&rep).unwrap() {
        CmMad {
            transaction_id: 7,
            message: CmMessage::Rep(r),
            ..
        } => {
            assert_eq!(r.remote_comm_id, 0x1234);
            assert_eq!(r.local_comm_id, conn.comm_id());
        }
        m => panic!("unexpected {m:?}"),
    }
}

#[test]
fn shutdown_is_idempotent_and_calls_then_fail() {
    let (_f, a, b) = pair();
    b.listen(SVC).unwrap();
    a.shutdown();
    a.shutdown();
    assert!(a.is_shut_down());
    assert!(a.connect(connect_params(&a, &b, SVC, 1)).is_err());
    assert!(a.poll(Nanos(0)).is_err());
    assert!(a.spawn().is_err());
    // QP1 of the port is free again: a new agent can take it.
    let again = CmAgent::new(a.device().clone(), 1, AgentConfig::default()).unwrap();
    assert_eq!(again.local_addr(), a.local_addr());
    // A bad P_Key index is refused.
    drop(again);
    let cfg = AgentConfig {
        pkey_index: 5,
        ..AgentConfig::default()
    };
    assert!(CmAgent::new(a.device().clone(), 1, cfg).is_err());
}
