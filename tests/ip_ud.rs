//! UD by IP address through the facade (issue 29): a service resolved by
//! SIDR with rdma_cm's header in the UDP port space and answered with the
//! QP's number and `RDMA_UDP_QKEY`, and datagrams answered on an address
//! vector built from the completion (`pd.create_av_from_wc`), on the soft
//! fabric and on RoCEv2 loopback (both IPv4 receive-buffer layouts).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::cm::ip::sidr_request_info;
use ibal::prelude::*;

const DEADLINE: Duration = Duration::from_secs(10);
const MSG: usize = 32;
/// A receive area: the GRH area, then the message.
const AREA: usize = GRH_SIZE + MSG;

/// One UD end on an open CA: a QP in RTS with `RDMA_UDP_QKEY`, its CQ,
/// and a buffer of a send area (`MSG` bytes) then a receive area.
struct Ud {
    ca: Handle<Ca>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

fn ud(al: &Al, ca: Handle<Ca>) -> Result<Ud> {
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, 16)?;
    let qp = pd.create_qp(al, QpCreate::new(QpType::Ud, cq))?;
    qp.ready_ud(al, 1)?;
    let buf = RegisteredBuffer::new(MSG + AREA);
    let (lkey, _) = pd.register(al, &buf, Access::LOCAL_WRITE)?.keys(al)?;
    Ok(Ud {
        ca,
        pd,
        cq,
        qp,
        buf,
        lkey,
    })
}

impl Ud {
    fn post_recv(&self, al: &Al) -> Result<()> {
        let sge = [Sge {
            addr: MSG as u64,
            length: AREA as u32,
            lkey: self.lkey,
        }];
        self.qp.post_recv(
            al,
            &[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }],
        )
    }

    fn send(&self, al: &Al, data: &[u8], av: Handle<Av>, qpn: u32, qkey: u32) -> Result<()> {
        self.buf.write(0, data)?;
        let sge = [Sge {
            addr: 0,
            length: data.len() as u32,
            lkey: self.lkey,
        }];
        let dest = UdDest {
            av: &av,
            remote_qpn: qpn,
            remote_qkey: qkey,
            pkey_index: 0,
        };
        self.qp
            .post_send(al, &[SendWr::new(2, SendOp::Send, &sge).to(dest)])
    }

    /// The next completion (of a send or a receive), within the deadline.
    fn completion(&self, al: &Al) -> Wc {
        let mut wc = [Wc::default()];
        let end = Instant::now() + DEADLINE;
        while self.cq.poll(al, &mut wc).unwrap() == 0 {
            assert!(Instant::now() < end, "no completion within {DEADLINE:?}");
            std::thread::sleep(Duration::from_micros(50));
        }
        assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
        wc[0]
    }

    /// The next receive completion (send completions skipped), its GRH
    /// area and its message.
    fn received(&self, al: &Al) -> (Wc, [u8; GRH_SIZE], Vec<u8>) {
        loop {
            let wc = self.completion(al);
            if wc.opcode == WcOpcode::Recv {
                let mut grh = [0u8; GRH_SIZE];
                self.buf.read(MSG, &mut grh).unwrap();
                let mut msg = vec![0u8; wc.byte_len as usize - GRH_SIZE];
                self.buf.read(MSG + GRH_SIZE, &mut msg).unwrap();
                return (wc, grh, msg);
            }
        }
    }
}

/// B answers what A sent on the AV it builds from the completion; A
/// receives the answer. Returns the AV attributes B built.
fn answer_on_the_av_from_the_completion(
    al: &Al,
    a: &Ud,
    b: &Ud,
    to_b: Handle<Av>,
    (qpn_b, qkey_b): (u32, u32),
) -> Result<AvAttr> {
    a.post_recv(al)?;
    b.post_recv(al)?;
    a.send(al, b"ping from A, answer me", to_b, qpn_b, qkey_b)?;
    let (wc, grh, msg) = b.received(al);
    assert_eq!(&msg[..], b"ping from A, answer me");
    assert_eq!(wc.src_qp, a.qp.query(al)?.qpn);
    let back = b.pd.create_av_from_wc(al, &wc, &grh, 1)?;
    b.send(al, b"pong from B", back, wc.src_qp, RDMA_UDP_QKEY)?;
    let (wc_a, _, msg) = a.received(al);
    assert_eq!(&msg[..], b"pong from B");
    assert_eq!(wc_a.src_qp, b.qp.query(al)?.qpn);
    AvAttr::from_wc(&wc, &grh, 1)
}

#[test]
fn a_reply_on_the_av_from_the_completion_reaches_the_sender_on_the_soft_fabric() -> Result<()> {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
    fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
    let provider = SoftProvider::new(fabric);
    let al = Al::open()?;
    let a = ud(&al, al.open_ca(&provider, 0xa)?)?;
    let b = ud(&al, al.open_ca(&provider, 0xb)?)?;
    let gid = |u: &Ud| u.ca.port(&al, 1);
    let (gid_a, gid_b) = (gid(&a)?.gid_table[0], gid(&b)?.gid_table[0]);
    let qpn_b = b.qp.query(&al)?.qpn;

    // LID-routed: no GRH, the AV goes back to the completion's source LID.
    let by_lid = a.pd.create_av(&al, AvAttr::lid(1, 2))?;
    let back = answer_on_the_av_from_the_completion(&al, &a, &b, by_lid, (qpn_b, RDMA_UDP_QKEY))?;
    assert_eq!(back, AvAttr::lid(1, 1));

    // By GID: a GRH, and the AV goes back to the sender's GID.
    let mut attr = AvAttr::lid(1, 0);
    attr.grh = Some(GrhAttr {
        dgid: gid_b,
        sgid_index: 0,
        flow_label: 0x1234,
        hop_limit: 64,
        traffic_class: 0x20,
    });
    let by_gid = a.pd.create_av(&al, attr)?;
    let back = answer_on_the_av_from_the_completion(&al, &a, &b, by_gid, (qpn_b, RDMA_UDP_QKEY))?;
    let g = back.grh.expect("a GRH was received");
    assert_eq!(g.dgid, gid_a);
    assert_eq!((g.flow_label, g.traffic_class), (0x1234, 0x20));
    let stats = al.close()?;
    assert!(stats.is_clean(), "{stats:?}");
    Ok(())
}

/// Two RoCE devices on 127.0.0.1 and 127.0.0.2 (ephemeral UDP ports), with
/// the IPv4 receive layout rxe's (`false`) or IPv6-style (`true`).
fn roce(ipv4_grh_as_ipv6: bool) -> RoceProvider {
    let port = |ip: &str| {
        PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0)).ipv4_grh_as_ipv6(ipv4_grh_as_ipv6)
    };
    RoceProvider::new(vec![
        DeviceConfig::new("ud-a", 0xa1, vec![port("127.0.0.1")]),
        DeviceConfig::new("ud-b", 0xb1, vec![port("127.0.0.2")]),
    ])
}

#[test]
fn a_service_resolved_by_ip_answers_on_the_av_from_the_completion_over_roce() -> Result<()> {
    for ipv4_grh_as_ipv6 in [false, true] {
        let provider = roce(ipv4_grh_as_ipv6);
        let al = Al::open()?;
        let a = ud(&al, al.open_ca(&provider, 0xa1)?)?;
        let b = ud(&al, al.open_ca(&provider, 0xb1)?)?;
        let service: SocketAddr = "127.0.0.2:5001".parse().unwrap();
        let (seen_tx, seen) = mpsc::channel();
        let (inst, qp_b) = (Arc::clone(&al), b.qp);
        let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
            if let Event::SidrRequest { req, .. } = ev {
                let _ = seen_tx.send(sidr_request_info(req));
                cep.sidr_accept(&inst, qp_b, b"served")
                    .expect("sidr_accept");
            }
        });
        b.ca.listen_ip_ud(&al, service, on_request, Arc::new(|_, _| {}))?;

        let (tx, answer) = mpsc::channel();
        let request = IpResolve::new(service).private_data(b"who serves 5001?");
        a.ca.resolve_ip(
            &al,
            1,
            &request,
            Arc::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        let found = answer.recv_timeout(DEADLINE).expect("an answer")?;
        assert!(
            answer.recv_timeout(Duration::from_millis(200)).is_err(),
            "one answer only"
        );
        assert_eq!(found.qpn, b.qp.query(&al)?.qpn);
        assert_eq!(found.qkey, RDMA_UDP_QKEY);
        assert_eq!(&found.private_data[..6], b"served");
        let info = seen.recv_timeout(DEADLINE).expect("the request")?;
        assert_eq!(info.source.ip().to_string(), "127.0.0.1");
        assert!(info.source.port() >= 0xC000, "an ephemeral port");
        assert_eq!(info.destination, service);
        assert_eq!(info.space, PortSpace::Udp);
        assert_eq!(&info.user_data[..16], b"who serves 5001?");

        let to_b = a.pd.create_av(&al, found.av)?;
        let back =
            answer_on_the_av_from_the_completion(&al, &a, &b, to_b, (found.qpn, found.qkey))?;
        let gid_a = a.ca.port(&al, 1)?.gid_table[0];
        assert_eq!(back.grh.map(|g| g.dgid), Some(gid_a), "{ipv4_grh_as_ipv6}");
        let stats = al.close()?;
        assert!(stats.is_clean(), "{stats:?}");
    }
    Ok(())
}

#[test]
fn a_resolve_reports_no_listener_a_foreign_q_key_and_silence() -> Result<()> {
    let provider = roce(false);
    let al = Al::open()?;
    let a = ud(&al, al.open_ca(&provider, 0xa1)?)?;
    let b = ud(&al, al.open_ca(&provider, 0xb1)?)?;
    let resolve = |request: IpResolve| -> Result<IpResolved> {
        let (tx, answer) = mpsc::channel();
        a.ca.resolve_ip(
            &al,
            1,
            &request,
            Arc::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        answer.recv_timeout(DEADLINE).expect("an outcome")
    };
    // A service answering with another Q_Key is refused, as rdma_cm does.
    let qpn_b = b.qp.query(&al)?.qpn;
    let inst = Arc::clone(&al);
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        let reply = SidrReplyParams {
            qpn: qpn_b,
            qkey: 0x1111_2222,
            ..SidrReplyParams::default()
        };
        let _ = cep.sidr_reply(&inst, reply);
    });
    let odd: SocketAddr = "127.0.0.2:5003".parse().unwrap();
    b.ca.listen_ip_ud(&al, odd, on_request, Arc::new(|_, _| {}))?;
    let foreign = resolve(IpResolve::new(odd));
    assert!(matches!(foreign, Err(Error::RemoteError(_))), "{foreign:?}");
    // ... unless the requester expects any Q_Key.
    let any = resolve(IpResolve::new(odd).qkey(None))?;
    assert_eq!((any.qpn, any.qkey), (qpn_b, 0x1111_2222));

    // Nobody listens on 5002 (B's CM runs, for 5003): B's CM answers
    // "service id not supported".
    let nobody = resolve(IpResolve::new("127.0.0.2:5002".parse().unwrap()));
    assert!(matches!(nobody, Err(Error::NotFound(_))), "{nobody:?}");

    // An address nobody has: SIDR_REQ retries, then a timeout.
    let started = Instant::now();
    let silent = resolve(IpResolve::new("127.0.0.9:5004".parse().unwrap()).timeouts(12, 2));
    assert!(matches!(silent, Err(Error::Timeout(_))), "{silent:?}");
    assert!(started.elapsed() < DEADLINE);
    // A mixed IP version is refused before anything is sent.
    assert!(a
        .ca
        .resolve_ip(
            &al,
            1,
            &IpResolve::new("[::1]:5005".parse().unwrap()),
            Arc::new(|_| {})
        )
        .is_err());
    let stats = al.close()?;
    assert!(stats.is_clean(), "{stats:?}");
    Ok(())
}

#[test]
fn ready_ud_takes_a_ud_qp_to_rts_with_rdma_cms_q_key_and_refuses_others() -> Result<()> {
    let provider = roce(false);
    let al = Al::open()?;
    let ca = al.open_ca(&provider, 0xa1)?;
    let pd = ca.alloc_pd(&al)?;
    let cq = ca.create_cq(&al, 4)?;
    let rc = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
    assert!(matches!(
        rc.ready_ud(&al, 1),
        Err(Error::InvalidParameter(_))
    ));
    let ud = pd.create_qp(&al, QpCreate::new(QpType::Ud, cq))?;
    ud.ready_ud(&al, 1)?;
    ud.ready_ud(&al, 1)?; // already there: nothing to do
    let attr = ud.query(&al)?;
    assert_eq!((attr.state, attr.qkey), (QpState::Rts, RDMA_UDP_QKEY));
    let stats = al.close()?;
    assert!(stats.is_clean(), "{stats:?}");
    Ok(())
}

/// Every type a builder reachable from the prelude takes is in the
/// prelude too (issue 29: `QpCaps` was not): this compiles with no other
/// import, or the test fails to build.
#[test]
fn the_prelude_holds_the_types_its_builders_take() {
    let peer: SocketAddr = "127.0.0.2:7471".parse().unwrap();
    let caps = QpCaps::default();
    let timers = Timers {
        max_cm_retries: 3,
        ..LAN_TIMERS
    };
    let connect = IpConnect::new(peer)
        .space(PortSpace::Tcp)
        .timers(timers)
        .path_mtu(Mtu::Mtu1024);
    assert_eq!(connect.timers.max_cm_retries, 3);
    let resolve = IpResolve::new(peer).space(PortSpace::Udp);
    assert_eq!(resolve.qkey, Some(RDMA_UDP_QKEY));
    let reply = SidrReplyParams {
        status: SidrStatus::NoQp,
        ..SidrReplyParams::default()
    };
    assert_eq!(reply.status, SidrStatus::NoQp);
    let device =
        DeviceConfig::new("d", 1, vec![PortConfig::new(peer)]).limits(RoceLimits::default());
    let _ = (
        caps,
        device,
        ConnectRequest::new(1, 2).access(Access::LOCAL_WRITE),
    );
    let _ = |cq: Handle<Cq>| QpCreate::new(QpType::Ud, cq).caps(caps);
}
