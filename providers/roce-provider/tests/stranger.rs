//! Attacks from a stranger: a socket on 127.0.0.77, an address that is
//! neither peer's (all of 127.0.0.0/8 is loopback), sends well-formed
//! RoCEv2 packets with a valid ICRC for its own flow at live connected
//! QPs. Each attack must change nothing: the QP stays in RTS, no
//! completion appears, the memory is untouched, and the port counts the
//! datagram as `rx_wrong_source`. Each has a positive control: the same
//! packet (the same headers and payload, its ICRC computed for the
//! sender's flow) from the peer's IP address, on another UDP port (the
//! source port is entropy, not checked), is acted on, so a drop for any
//! other reason cannot pass.
//!
//! Before the receive stage checked addresses (issue 26), every one of
//! these attacks worked from 127.0.0.77.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{connect_with_timeout, cq, qp, ALL};
use provider::{
    Device, Provider, QpState, RecvWr, RegisteredBuffer, SendOp, SendWr, Sge, Wc, WcStatus,
};
use roce::{Aeth, Bth, Endpoints, Headers, Opcode, Packet, Syndrome};
use roce_provider::{PortCounters, RoceDevice, RoceQp};

/// The stranger's address.
const STRANGER: &str = "127.0.0.77";

/// One end of a connection: its device, CQ, QP and a registered buffer.
struct End {
    dev: RoceDevice,
    cq: roce_provider::RoceCq,
    qp: RoceQp,
    buf: RegisteredBuffer,
    lkey: u32,
    _mr: roce_provider::RoceMr,
}

impl End {
    fn new(dev: RoceDevice, qp_type: provider::QpType) -> End {
        let pd = dev.alloc_pd().unwrap();
        let cq = cq(&dev);
        let q = if qp_type == provider::QpType::Rc {
            qp(&dev, &pd, &cq, None)
        } else {
            dev.create_qp(
                &pd,
                &provider::QpInit {
                    qp_type,
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: provider::QpCaps::default(),
                    sq_sig_all: false,
                },
            )
            .unwrap()
        };
        let buf = RegisteredBuffer::new(256);
        let mr = dev.register_mr(&pd, &buf, 0, 256, 0, ALL).unwrap();
        let lkey = dev.mr_keys(&mr).0;
        End {
            dev,
            cq,
            qp: q,
            buf,
            lkey,
            _mr: mr,
        }
    }
    fn qpn(&self) -> u32 {
        self.dev.qp_num(&self.qp)
    }
    fn addr(&self) -> SocketAddr {
        self.dev.local_addr(1).unwrap()
    }
    fn state(&self) -> QpState {
        self.dev.query_qp(&self.qp).unwrap().state
    }
    fn counters(&self) -> PortCounters {
        self.dev.port_counters(1).unwrap()
    }
    /// A receive of 64 bytes at offset 0.
    fn post_recv(&self, id: u64) {
        let sg = [Sge {
            addr: 0,
            length: 64,
            lkey: self.lkey,
        }];
        self.dev
            .post_recv(
                &self.qp,
                &[RecvWr {
                    wr_id: id,
                    sg_list: &sg,
                }],
            )
            .unwrap();
    }
    /// Completions that arrive within `wait`.
    fn completions(&self, wait: Duration) -> Vec<Wc> {
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [Wc::default(); 8];
        while Instant::now() < end {
            let n = self.dev.poll_cq(&self.cq, &mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            std::thread::sleep(Duration::from_micros(200));
        }
        got
    }
    fn bytes(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.buf.read(0, &mut v).unwrap();
        v
    }
}

/// Two devices on 127.0.0.1 (a) and 127.0.0.2 (b).
fn devices() -> (RoceDevice, RoceDevice) {
    common::devices()
}

/// `a` and `b` connected (RC or UC), PSNs 7 both ways, RC's ACK timeout
/// 2^18 * 4 us (~1 s: no retry during a test).
fn pair(qp_type: provider::QpType) -> (End, End) {
    let (da, db) = devices();
    let (a, b) = (End::new(da, qp_type), End::new(db, qp_type));
    if qp_type == provider::QpType::Rc {
        connect_with_timeout(&a.dev, &a.qp, &b.dev, b.qpn(), 18);
        connect_with_timeout(&b.dev, &b.qp, &a.dev, a.qpn(), 18);
    } else {
        connect_uc(&a, &b);
        connect_uc(&b, &a);
    }
    (a, b)
}

/// `end`'s UC QP to RTS towards `to`'s (PSNs 7).
fn connect_uc(end: &End, to: &End) {
    use provider::{AvAttr, GrhAttr, Mtu, QpModify};
    let av = AvAttr {
        grh: Some(GrhAttr {
            dgid: common::gid(&to.dev),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }),
        ..AvAttr::lid(1, 0)
    };
    let d = &end.dev;
    let m = QpModify::to;
    d.modify_qp(&end.qp, &m(QpState::Init).pkey_index(0).port(1).access(ALL))
        .unwrap();
    d.modify_qp(
        &end.qp,
        &m(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(to.qpn())
            .rq_psn(7),
    )
    .unwrap();
    d.modify_qp(&end.qp, &m(QpState::Rts).sq_psn(7)).unwrap();
}

/// Sends `h` + `payload` to `to` from a socket bound to `ip` (port 0),
/// its ICRC computed for that flow.
fn send_from(ip: &str, to: SocketAddr, h: Headers, payload: &[u8]) {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    let ep = Endpoints::new(s.local_addr().unwrap(), to).unwrap();
    let bytes = Packet::new(h, payload).encode(&ep).unwrap();
    s.send_to(&bytes, to).unwrap();
}

/// Waits until `f` holds for `end`'s counters.
fn until(end: &End, what: &str, f: impl Fn(&PortCounters) -> bool) {
    let stop = Instant::now() + Duration::from_secs(10);
    while !f(&end.counters()) {
        assert!(Instant::now() < stop, "{what}: {:#?}", end.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A short wait for what a dropped packet might still cause.
const SETTLE: Duration = Duration::from_millis(100);

#[test]
fn a_strangers_send_at_the_expected_psn_is_not_delivered() {
    let (a, b) = pair(provider::QpType::Rc);
    b.post_recv(1);
    let send = Headers::new(Bth::new(Opcode::RcSendOnly, b.qpn(), 7));
    let before = b.counters();
    send_from(STRANGER, b.addr(), send, b"injected by a stranger");
    until(&b, "wrong source", |c| {
        c.rx_wrong_source > before.rx_wrong_source
    });
    assert_eq!(b.completions(SETTLE), vec![], "nothing delivered");
    assert_eq!(b.bytes(22), vec![0; 22], "the receive buffer is untouched");
    assert_eq!(b.state(), QpState::Rts);
    assert_eq!(b.counters().rx_packets, before.rx_packets);
    // Positive control: the same packet from a's address lands.
    send_from("127.0.0.1", b.addr(), send, b"injected by a stranger");
    let wc = b.completions(SETTLE);
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (1, WcStatus::Success, 22)
    );
    assert_eq!(b.bytes(22), b"injected by a stranger");
    drop(a);
}

#[test]
fn one_strangers_packet_out_of_sequence_does_not_kill_a_connection() {
    let (a, b) = pair(provider::QpType::Rc);
    // A SEND_MIDDLE outside any message: an invalid request (NAK, ERR).
    let middle = Headers::new(Bth::new(Opcode::RcSendMiddle, b.qpn(), 7));
    let payload = [0x55u8; 1024];
    let before = b.counters();
    send_from(STRANGER, b.addr(), middle, &payload);
    until(&b, "wrong source", |c| {
        c.rx_wrong_source > before.rx_wrong_source
    });
    std::thread::sleep(SETTLE);
    assert_eq!(b.state(), QpState::Rts, "the connection lives");
    let after = b.counters();
    assert_eq!(after.naks_sent, before.naks_sent, "no NAK for a stranger");
    assert_eq!(after.tx_packets, before.tx_packets, "nothing sent back");
    // Positive control: from a's address the same packet is NAKed and
    // the QP goes to ERR (IBTA: invalid request).
    send_from("127.0.0.1", b.addr(), middle, &payload);
    until(&b, "NAK", |c| c.naks_sent > before.naks_sent);
    let stop = Instant::now() + Duration::from_secs(5);
    while b.state() != QpState::Err {
        assert!(Instant::now() < stop, "{:?}", b.state());
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(a);
}

#[test]
fn a_strangers_uc_send_at_any_psn_is_not_delivered() {
    let (a, b) = pair(provider::QpType::Uc);
    b.post_recv(1);
    // UC takes a new message at any PSN: only the addresses keep it out.
    let send = Headers::new(Bth::new(Opcode::UcSendOnly, b.qpn(), 0x12_3456));
    let before = b.counters();
    send_from(STRANGER, b.addr(), send, b"uc injection");
    until(&b, "wrong source", |c| {
        c.rx_wrong_source > before.rx_wrong_source
    });
    assert_eq!(b.completions(SETTLE), vec![]);
    assert_eq!(b.bytes(12), vec![0; 12]);
    assert_eq!(b.state(), QpState::Rts);
    send_from("127.0.0.1", b.addr(), send, b"uc injection");
    let wc = b.completions(SETTLE);
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 12));
    assert_eq!(b.bytes(12), b"uc injection");
    drop(a);
}

#[test]
fn a_strangers_ack_does_not_complete_a_send_that_reached_nobody() {
    let (da, db) = devices();
    let a = End::new(da, provider::QpType::Rc);
    // a's QP is connected to a QPN nobody has on b: its SEND reaches
    // nobody (b counts an unknown QPN) and waits for an ACK (timeout ~1 s).
    let nobody = 0x00ab_cdef;
    connect_with_timeout(&a.dev, &a.qp, &db, nobody, 18);
    a.buf.write(0, b"lost").unwrap();
    let sg = [Sge {
        addr: 0,
        length: 4,
        lkey: a.lkey,
    }];
    a.dev
        .post_send::<()>(&a.qp, &[SendWr::new(9, SendOp::Send, &sg)], &|_| None)
        .unwrap();
    // The ACK of that SEND (PSN 7, MSN 1), as the responder would send it.
    let mut ack = Headers::new(Bth::new(Opcode::RcAck, a.qpn(), 7));
    ack.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 1,
    });
    let before = a.counters();
    send_from(STRANGER, a.addr(), ack, b"");
    until(&a, "wrong source", |c| {
        c.rx_wrong_source > before.rx_wrong_source
    });
    assert_eq!(
        a.completions(SETTLE),
        vec![],
        "no completion from a forged ACK"
    );
    assert_eq!(a.state(), QpState::Rts);
    // Positive control: the same ACK from b's address completes it.
    send_from("127.0.0.2", a.addr(), ack, b"");
    let wc = a.completions(SETTLE);
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::Success));
    drop(db);
}

#[test]
fn a_packet_on_another_port_of_the_device_is_dropped() {
    use roce_provider::{DeviceConfig, PortConfig, RoceProvider};
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    let p = RoceProvider::new(vec![
        DeviceConfig::new("two", 1, vec![port("127.0.0.1"), port("127.0.0.3")]),
        DeviceConfig::new("peer", 2, vec![port("127.0.0.2")]),
    ]);
    let (two, peer) = (p.open(1).unwrap(), p.open(2).unwrap());
    let b = End::new(two, provider::QpType::Rc);
    let a = End::new(peer, provider::QpType::Rc);
    connect_with_timeout(&b.dev, &b.qp, &a.dev, a.qpn(), 18);
    b.post_recv(1);
    let port2 = b.dev.local_addr(2).unwrap();
    let send = Headers::new(Bth::new(Opcode::RcSendOnly, b.qpn(), 7));
    // From the peer's own address, to the QP's device but its other port.
    send_from("127.0.0.2", port2, send, b"wrong port");
    let stop = Instant::now() + Duration::from_secs(10);
    while b.dev.port_counters(2).unwrap().rx_wrong_port == 0 {
        assert!(Instant::now() < stop, "{:#?}", b.dev.port_counters(2));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.completions(SETTLE), vec![]);
    // Positive control: on the QP's port it lands.
    send_from("127.0.0.2", b.addr(), send, b"wrong port");
    let wc = b.completions(SETTLE);
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success), "{wc:?}");
}
