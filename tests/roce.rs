//! The whole stack on the RoCEv2 provider, through the facade: the same
//! object layer, verbs and CM as on the soft fabric, over UDP sockets on
//! loopback (127.0.0.1 and 127.0.0.2, ephemeral UDP ports).
//!
//! * two QPs connected by exchanging their attributes by hand (QPN, PSN,
//!   GID), then RDMA WRITE, SEND and READ with every byte checked;
//! * two QPs connected through the CM on QP1 of the RoCEv2 ports
//!   (REQ/REP/RTU by GID), a SEND, a disconnect;
//! * a soft CA and a RoCE CA in one AL, and an AL close that leaves no
//!   object of either behind.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig};

const DEADLINE: Duration = Duration::from_secs(10);

/// Two RoCE devices (GUIDs 0xa1, 0xb1) of one provider on 127.0.0.1 and
/// 127.0.0.2, each with one port on an ephemeral UDP port.
fn provider() -> RoceProvider {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    RoceProvider::new(vec![
        DeviceConfig::new("roce-a", 0xa1, vec![port("127.0.0.1")]),
        DeviceConfig::new("roce-b", 0xb1, vec![port("127.0.0.2")]),
    ])
}

struct End {
    ca: Handle<Ca>,
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
    rkey: u32,
    gid: [u8; 16],
}

fn end(al: &Al, provider: &RoceProvider, guid: u64, len: usize) -> Result<End> {
    let ca = al.open_ca(provider, guid)?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, 64)?;
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq))?;
    let buf = RegisteredBuffer::new(len);
    let all = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    let (lkey, rkey) = pd.register(al, &buf, all)?.keys(al)?;
    let gid = ca.port(al, 1)?.gid_table[0];
    Ok(End {
        ca,
        cq,
        qp,
        buf,
        lkey,
        rkey,
        gid,
    })
}

fn completion(al: &Al, cq: Handle<Cq>) -> Wc {
    let mut wc = [Wc::default()];
    let end = Instant::now() + DEADLINE;
    while cq.poll(al, &mut wc).unwrap() == 0 {
        assert!(Instant::now() < end, "no completion within {DEADLINE:?}");
        std::thread::sleep(Duration::from_micros(20));
    }
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    wc[0]
}

/// Move `me` to RTS towards `peer` with the attributes an out-of-band
/// exchange gives (its QPN, its starting PSN, its GID).
fn connect_by_hand(al: &Al, me: &End, my_psn: u32, peer: (u32, u32, [u8; 16])) -> Result<()> {
    let (peer_qpn, peer_psn, peer_gid) = peer;
    let access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    me.qp.modify(
        al,
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(access),
    )?;
    let mut av = AvAttr::lid(1, 0);
    av.grh = Some(GrhAttr {
        dgid: peer_gid,
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    me.qp.modify(
        al,
        &QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(peer_qpn)
            .rq_psn(peer_psn)
            .max_dest_rd_atomic(4)
            .min_rnr_timer(12),
    )?;
    me.qp.modify(
        al,
        &QpModify::to(QpState::Rts)
            .sq_psn(my_psn)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(4),
    )
}

#[test]
fn qps_connected_by_hand_write_send_and_read() -> Result<()> {
    let al = Al::open()?;
    let provider = provider();
    const LEN: usize = 64 << 10;
    let (a, b) = (
        end(&al, &provider, 0xa1, LEN)?,
        end(&al, &provider, 0xb1, LEN)?,
    );
    assert_ne!(a.gid, b.gid, "each port's GID is its own address");
    let qpn = |e: &End| e.qp.query(&al).map(|q| q.qpn);
    let (psn_a, psn_b) = (0x12_3456, 0xab_cdef);
    connect_by_hand(&al, &a, psn_a, (qpn(&b)?, psn_b, b.gid))?;
    connect_by_hand(&al, &b, psn_b, (qpn(&a)?, psn_a, a.gid))?;

    // A 40,000-byte WRITE (40 packets at MTU 1024) into B's buffer.
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + 3) as u8).collect();
    a.buf.write(0, &data)?;
    let sge = [Sge {
        addr: 0,
        length: data.len() as u32,
        lkey: a.lkey,
    }];
    let write = SendOp::Write {
        remote_addr: 1000,
        rkey: b.rkey,
    };
    a.qp.post_send(&al, &[SendWr::new(1, write, &sge)])?;
    assert_eq!(completion(&al, a.cq).opcode, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; data.len()];
    b.buf.read(1000, &mut got)?;
    assert!(got == data, "the WRITE landed different bytes");

    // A SEND into a posted receive.
    let rsge = [Sge {
        addr: 50_000,
        length: 4096,
        lkey: b.lkey,
    }];
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 7,
            sg_list: &rsge,
        }],
    )?;
    a.buf.write(0, b"over RoCEv2")?;
    let ssge = [Sge {
        addr: 0,
        length: 11,
        lkey: a.lkey,
    }];
    a.qp.post_send(&al, &[SendWr::new(2, SendOp::Send, &ssge)])?;
    completion(&al, a.cq);
    let wc = completion(&al, b.cq);
    assert_eq!((wc.wr_id, wc.byte_len), (7, 11));
    let mut msg = [0u8; 11];
    b.buf.read(50_000, &mut msg)?;
    assert_eq!(&msg, b"over RoCEv2");

    // A READ of what the WRITE put there, back into A at 45,000.
    let read = SendOp::Read {
        remote_addr: 1000,
        rkey: b.rkey,
    };
    let dst = [Sge {
        addr: 45_000,
        length: 20_000,
        lkey: a.lkey,
    }];
    a.qp.post_send(&al, &[SendWr::new(3, read, &dst)])?;
    assert_eq!(completion(&al, a.cq).opcode, WcOpcode::RdmaRead);
    let mut back = vec![0u8; 20_000];
    a.buf.read(45_000, &mut back)?;
    assert!(back == data[..20_000], "the READ returned different bytes");

    let stats = al.close()?;
    assert_eq!(stats.live(Kind::QP), 0);
    assert_eq!(stats.live(Kind::CA), 0);
    Ok(())
}

#[test]
fn cm_connects_by_gid_over_roce_ports() -> Result<()> {
    let al = Al::open()?;
    let provider = provider();
    let (a, b) = (
        end(&al, &provider, 0xa1, 4096)?,
        end(&al, &provider, 0xb1, 4096)?,
    );
    const SERVICE: u64 = 0x0106_0000_0000_4791;

    let (tx, established) = mpsc::channel();
    let (inst, qp_b, tx_b) = (Arc::clone(&al), b.qp, tx.clone());
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        cep.accept(&inst, qp_b, &AcceptReply::default())
            .expect("accept");
    });
    let passive: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::Established { .. } = ev {
            let _ = tx_b.send("passive");
        }
    });
    b.ca.listen(&al, 1, SERVICE, on_request, passive)?;
    let inst = Arc::clone(&al);
    let (dtx, disconnected) = mpsc::channel();
    let active: CmHandler = Arc::new(move |cep, ev| match ev {
        Event::ReplyReceived { .. } => cep.rtu(&inst, &[]).expect("rtu"),
        Event::Established { .. } => {
            let _ = tx.send("active");
        }
        Event::Disconnected { .. } => {
            let _ = dtx.send(());
        }
        _ => {}
    });
    let request = ConnectRequest::new(SERVICE, 0)
        .remote_gid(b.gid)
        .path_mtu(Mtu::Mtu1024);
    let cep = a.qp.connect(&al, &request, active)?;
    for _ in 0..2 {
        established
            .recv_timeout(DEADLINE)
            .map_err(|_| Error::Timeout("no ESTABLISHED over RoCEv2".into()))?;
    }

    let rsge = [Sge {
        addr: 0,
        length: 4096,
        lkey: b.lkey,
    }];
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        }],
    )?;
    a.buf.write(0, b"hello through the CM")?;
    let sge = [Sge {
        addr: 0,
        length: 20,
        lkey: a.lkey,
    }];
    a.qp.post_send(&al, &[SendWr::new(1, SendOp::Send, &sge)])?;
    completion(&al, a.cq);
    assert_eq!(completion(&al, b.cq).byte_len, 20);
    let mut got = [0u8; 20];
    b.buf.read(0, &mut got)?;
    assert_eq!(&got, b"hello through the CM");

    cep.disconnect(&al, &[])?;
    disconnected
        .recv_timeout(DEADLINE)
        .map_err(|_| Error::Timeout("no DREP over RoCEv2".into()))?;
    let stats = al.close()?;
    assert_eq!(stats.live(Kind::CEP), 0, "{stats:?}");
    assert_eq!(stats.live(Kind::QP), 0, "{stats:?}");
    Ok(())
}

#[test]
fn cm_connects_by_ip_address_rdma_cm_style() -> Result<()> {
    use ibal::cm::ip::{request_info, IpRequestInfo};
    let al = Al::open()?;
    let provider = provider();
    let (a, b) = (
        end(&al, &provider, 0xa1, 64)?,
        end(&al, &provider, 0xb1, 64)?,
    );
    let (seen_tx, seen) = mpsc::channel::<(IpRequestInfo, PathInfo)>();
    let (inst, qp_b) = (Arc::clone(&al), b.qp);
    let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
        if let Event::ConnectRequest { req, .. } = ev {
            let info = request_info(req).expect("rdma_cm addressing");
            let _ = seen_tx.send((info, req.primary_path));
            cep.accept(&inst, qp_b, &AcceptReply::default())
                .expect("accept");
        }
    });
    let passive: CmHandler = Arc::new(|_, _| {});
    let listen_at: SocketAddr = "127.0.0.2:7471".parse().unwrap();
    b.ca.listen_ip(&al, listen_at, on_request, passive)?;

    let (tx, events) = mpsc::channel();
    let inst = Arc::clone(&al);
    let active: CmHandler = Arc::new(move |cep, ev| {
        if let Event::ReplyReceived { .. } = ev {
            cep.rtu(&inst, &[]).expect("rtu");
        }
        let _ = tx.send(ev.name());
    });
    let request = IpConnect::new(listen_at).private_data(b"hello by address");
    let cep = a.qp.connect_ip(&al, 1, &request, active.clone())?;
    let (info, path) = seen
        .recv_timeout(DEADLINE)
        .expect("the listener saw the REQ");
    // The primary path as Linux's CM writes it on RoCE: permissive LIDs,
    // both GIDs, hop limit 64, routed (not subnet-local).
    assert_eq!((path.local_lid, path.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!(path.local_gid, a.gid);
    assert_eq!(path.remote_gid, b.gid);
    assert_eq!((path.hop_limit, path.subnet_local), (64, false));
    assert_eq!(
        info.source.ip(),
        "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(info.destination, listen_at);
    assert_eq!(&info.user_data[..16], b"hello by address");
    let established = Instant::now() + DEADLINE;
    while events.recv_timeout(DEADLINE).expect("events") != "Established" {
        assert!(Instant::now() < established);
    }
    cep.disconnect(&al, &[])?;

    // Nobody listens on 7472: Linux's answer, REJ with invalid service ID.
    let other = pd_qp(&al, a.ca)?;
    let (tx, refused) = mpsc::channel();
    let handler: CmHandler = Arc::new(move |_, ev| {
        if let Event::Rejected { reason, .. } = ev {
            let _ = tx.send(*reason);
        }
    });
    let nobody = IpConnect::new("127.0.0.2:7472".parse().unwrap());
    other.connect_ip(&al, 1, &nobody, handler)?;
    assert_eq!(
        refused.recv_timeout(DEADLINE).expect("a REJ"),
        RejectReason::InvalidServiceId
    );
    let stats = al.close()?;
    assert!(stats.is_clean(), "{stats:?}");
    Ok(())
}

#[test]
fn sidr_over_roce_finds_a_ud_service_by_address_and_a_datagram_reaches_it() -> Result<()> {
    use ibal::cm::ip::{gid_of, service_id, PortSpace};
    use ibal::cm::wire::ip_cm::IpCmHeader;
    use ibal::cm::wire::SidrStatus;
    const QKEY: u32 = 0x0011_2233;
    let al = Al::open()?;
    let provider = provider();
    let (a, b) = (
        end(&al, &provider, 0xa1, 64)?,
        end(&al, &provider, 0xb1, 64)?,
    );
    // B's UD service: a UD QP in RTS with its Q_Key.
    let ud = |ca: Handle<Ca>| -> Result<(Handle<Pd>, Handle<Cq>, Handle<Qp>)> {
        let pd = ca.alloc_pd(&al)?;
        let cq = ca.create_cq(&al, 8)?;
        let qp = pd.create_qp(&al, QpCreate::new(QpType::Ud, cq))?;
        qp.modify(
            &al,
            &QpModify::to(QpState::Init).pkey_index(0).port(1).qkey(QKEY),
        )?;
        qp.modify(&al, &QpModify::to(QpState::Rtr))?;
        qp.modify(&al, &QpModify::to(QpState::Rts).sq_psn(0))?;
        Ok((pd, cq, qp))
    };
    let (pd_a, cq_a, qp_a) = ud(a.ca)?;
    let (pd_b, cq_b, qp_b) = ud(b.ca)?;
    let qpn_b = qp_b.query(&al)?.qpn;
    // The SIDR_REQ names rdma_cm's UDP port space and carries its header.
    let sid = service_id(PortSpace::Udp, 7000);
    let (seen_tx, seen) = mpsc::channel();
    let inst = Arc::clone(&al);
    let on_request: ListenHandler = Arc::new(move |_l, cep, ev| {
        if let Event::SidrRequest { req, .. } = ev {
            let hdr = IpCmHeader::decode(req.private_data.as_bytes()).map(|h| h.0);
            let _ = seen_tx.send(hdr);
            let reply = SidrReplyParams {
                status: SidrStatus::Success,
                qpn: qpn_b,
                qkey: QKEY,
                ..SidrReplyParams::default()
            };
            cep.sidr_reply(&inst, reply).expect("SIDR reply");
        }
    });
    b.ca.listen(&al, 1, sid, on_request, Arc::new(|_, _| {}))?;
    let header = IpCmHeader {
        src: "127.0.0.1".parse().unwrap(),
        src_port: 50_000,
        dst: "127.0.0.2".parse().unwrap(),
    };
    let (tx, replies) = mpsc::channel();
    let handler: CmHandler = Arc::new(move |_, ev| {
        if let Event::SidrReply { rep, .. } = ev {
            let _ = tx.send((rep.status, rep.qpn, rep.qkey));
        }
    });
    let params = SidrParams {
        private_data: header.private_data::<216>(b"which qp?").expect("fits"),
        ..SidrParams::new(sid, PeerAddr { lid: 0, gid: b.gid })
    };
    a.ca.sidr_request(&al, params, 1, handler)?;
    let got = seen.recv_timeout(DEADLINE).expect("the SIDR_REQ arrived");
    assert_eq!(got.expect("rdma_cm header"), header);
    let (status, qpn, qkey) = replies.recv_timeout(DEADLINE).expect("a SIDR_REP");
    assert_eq!((status, qpn, qkey), (SidrStatus::Success, qpn_b, QKEY));

    // A datagram to the QPN and Q_Key the SIDR_REP named, by GID.
    let buf_a = RegisteredBuffer::new(64);
    let buf_b = RegisteredBuffer::new(64 + GRH_SIZE);
    let access = Access::LOCAL_WRITE;
    let (la, _) = pd_a.register(&al, &buf_a, access)?.keys(&al)?;
    let (lb, _) = pd_b.register(&al, &buf_b, access)?.keys(&al)?;
    let rsge = [Sge {
        addr: 0,
        length: (64 + GRH_SIZE) as u32,
        lkey: lb,
    }];
    qp_b.post_recv(
        &al,
        &[RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        }],
    )?;
    let mut av = AvAttr::lid(1, 0);
    av.grh = Some(GrhAttr {
        dgid: gid_of("127.0.0.2".parse().unwrap()),
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    let av = pd_a.create_av(&al, av)?;
    buf_a.write(0, b"found you by SIDR")?;
    let ssge = [Sge {
        addr: 0,
        length: 17,
        lkey: la,
    }];
    let dest = UdDest {
        av: &av,
        remote_qpn: qpn,
        remote_qkey: qkey,
        pkey_index: 0,
    };
    qp_a.post_send(&al, &[SendWr::new(2, SendOp::Send, &ssge).to(dest)])?;
    completion(&al, cq_a);
    let wc = completion(&al, cq_b);
    assert_eq!(wc.byte_len as usize, GRH_SIZE + 17);
    let mut got = [0u8; 17];
    buf_b.read(GRH_SIZE, &mut got)?;
    assert_eq!(&got, b"found you by SIDR");
    let _ = (a.qp, b.qp);
    let stats = al.close()?;
    assert!(stats.is_clean(), "{stats:?}");
    Ok(())
}

fn pd_qp(al: &Al, ca: Handle<Ca>) -> Result<Handle<Qp>> {
    let cq = ca.create_cq(al, 8)?;
    ca.alloc_pd(al)?
        .create_qp(al, QpCreate::new(QpType::Rc, cq))
}

#[test]
fn soft_and_roce_cas_live_in_one_al() -> Result<()> {
    let al = Al::open()?;
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0x5, &[1]))?;
    let soft = al.open_ca(&SoftProvider::new(fabric), 0x5)?;
    let roce = al.open_ca(&provider(), 0xa1)?;
    assert_ne!(soft.attr(&al)?.node_guid, roce.attr(&al)?.node_guid);
    for ca in [soft, roce] {
        let pd = ca.alloc_pd(&al)?;
        let cq = ca.create_cq(&al, 8)?;
        pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
    }
    // A PD of one provider cannot take a CQ of the other: the QP's parts
    // must share a device.
    let pd_soft = soft.alloc_pd(&al)?;
    let cq_roce = roce.create_cq(&al, 8)?;
    assert!(pd_soft
        .create_qp(&al, QpCreate::new(QpType::Rc, cq_roce))
        .is_err());
    let stats = al.close()?;
    assert_eq!(stats.live(Kind::CA), 0);
    assert_eq!(stats.live(Kind::QP), 0);
    Ok(())
}

/// A RoCE CA destroyed inside a completion callback (served inline on the
/// device's receive thread, or on the executor): the device's threads are
/// joined by its reaper, never by the callback's thread, and the same
/// device opens again at once on the same fixed UDP port.
#[test]
fn a_ca_destroyed_in_a_callback_is_reaped_off_that_thread_and_reopens() -> Result<()> {
    use std::sync::Arc;
    let al = Al::open()?;
    let fixed: SocketAddr = {
        let probe = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        probe.local_addr().unwrap()
    };
    let provider = RoceProvider::new(vec![
        DeviceConfig::new(
            "ra",
            0xa1,
            vec![PortConfig::new("127.0.0.1:0".parse().unwrap())],
        ),
        DeviceConfig::new("rb", 0xb1, vec![PortConfig::new(fixed)]),
    ]);
    let a = end(&al, &provider, 0xa1, 64)?;
    let b_ca = al.open_ca(&provider, 0xb1)?;
    let watch = match al.resolve(b_ca)?.device() {
        hca::any::AnyDevice::Roce(d) => d.close_watch(),
        #[allow(unreachable_patterns)]
        _ => panic!("a RoCE device"),
    };
    let (ran, ran_rx) = mpsc::channel();
    let (gone, gone_rx) = mpsc::channel();
    let on_completion: ibal::verbs::CompletionCallback = {
        let inst = Arc::clone(al.instance());
        Arc::new(move |_cq| {
            let thread = std::thread::current().name().map(str::to_string);
            // The CA's destroy callback runs once its last reference is
            // gone, and so its device handle (after this callback returns).
            let gone = gone.clone();
            let done: ibal::DestroyCallback = Box::new(move |_| {
                let _ = gone.send(());
            });
            let _ = ran.send((thread, inst.destroy(b_ca, Some(done))));
        })
    };
    let b_pd = b_ca.alloc_pd(&al)?;
    let b_cq = b_ca.create_cq_with(&al, 16, Some(on_completion), None)?;
    let b_qp = b_pd.create_qp(&al, QpCreate::new(QpType::Rc, b_cq))?;
    let b_buf = RegisteredBuffer::new(64);
    let (b_lkey, _) = b_pd.register(&al, &b_buf, Access::LOCAL_WRITE)?.keys(&al)?;
    let b = End {
        ca: b_ca,
        cq: b_cq,
        qp: b_qp,
        buf: b_buf,
        lkey: b_lkey,
        rkey: 0,
        gid: b_ca.port(&al, 1)?.gid_table[0],
    };
    let qpn = |e: &End| e.qp.query(&al).map(|q| q.qpn);
    connect_by_hand(&al, &a, 7, (qpn(&b)?, 9, b.gid))?;
    connect_by_hand(&al, &b, 9, (qpn(&a)?, 7, a.gid))?;
    let rsge = [Sge {
        addr: 0,
        length: 64,
        lkey: b.lkey,
    }];
    b.qp.post_recv(
        &al,
        &[RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        }],
    )?;
    b.cq.arm(&al, CqArm::NextCompletion)?;
    let ssge = [Sge {
        addr: 0,
        length: 8,
        lkey: a.lkey,
    }];
    a.qp.post_send(&al, &[SendWr::new(1, SendOp::Send, &ssge)])?;
    let (thread, destroyed) = ran_rx.recv_timeout(DEADLINE).expect("the callback ran");
    destroyed?;
    gone_rx
        .recv_timeout(DEADLINE)
        .expect("the CA was destroyed");
    // Right away (its reaper may still be at work): the same device, on
    // the same fixed port.
    let again = al.open_ca(&provider, 0xb1)?;
    assert_eq!(again.port(&al, 1)?.gid_table[0], b.gid);
    let joiner = watch.wait(DEADLINE).expect("the old device was reaped");
    assert_eq!(joiner, "roce-rb-reaper", "the callback ran on {thread:?}");
    assert_ne!(Some(joiner), thread);
    let stats = al.close()?;
    assert_eq!(stats.live(Kind::CA), 0);
    Ok(())
}
