//! RC error paths: what a responder error, a NAK or the retry limit owes
//! the peer and the application (answers, completions, refusals).

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::workload::{Kind, Workload, DST, RBUF, RECV, SRC};
use common::{Net, TestMem};
use provider::{Access, Mtu, QpState, RecvWr, SendOp, SendWr, Sge, WcStatus};
use roce::{Aeth, AtomicEth, Bth, Endpoints, Headers, Opcode, Packet, Reth, Syndrome};
use roce_transport::{Config, Source, Transmit, Transport};

const NOW: Duration = Duration::from_secs(1);

/// The `Source` of packets from the peer (192.0.2.2) to us (192.0.2.1).
fn peer() -> Source {
    let ep = Endpoints::new(
        "192.0.2.2:49152".parse().unwrap(),
        "192.0.2.1:4791".parse().unwrap(),
    )
    .unwrap();
    common::source(&ep)
}

fn deliver(t: &mut Transport<()>, mem: &mut TestMem, h: Headers, payload: &[u8]) {
    t.handle_packet(NOW, &peer(), &Packet::new(h, payload), mem);
}

fn drain(t: &mut Transport<()>, mem: &mut TestMem) -> Vec<Transmit<()>> {
    std::iter::from_fn(|| t.poll_transmit(NOW, mem)).collect()
}

/// A packet's opcode, PSN and NAK code (if a NAK).
type Shape = (Opcode, u32, Option<roce::NakCode>);

/// The [`Shape`] of each packet.
fn shape(out: &[Transmit<()>]) -> Vec<Shape> {
    out.iter()
        .map(|t| {
            let nak = match t.headers.aeth.map(|a| a.syndrome) {
                Some(Syndrome::Nak(code)) => Some(code),
                _ => None,
            };
            (t.headers.bth.opcode, t.headers.bth.psn, nak)
        })
        .collect()
}

/// The responder QP 0x22 (peer 0x11) of `mem`, with one receive (`wr_id`
/// 9) of 64 bytes at 0x5000 posted.
fn responder_with_a_receive(mem: &mut TestMem) -> Transport<()> {
    let (recv, _) = mem.register(0x5000, 64, Access::LOCAL_WRITE);
    let mut t: Transport<()> = Transport::new(Config::rc(0x22, 0x11)).unwrap();
    let sge = [Sge {
        addr: 0x5000,
        length: 64,
        lkey: recv,
    }];
    t.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &sge,
    })
    .unwrap();
    t
}

fn read_request(qpn: u32, psn: u32, rkey: u32, va: u64, len: u32) -> Headers {
    let mut h = Headers::new(Bth::new(Opcode::RcReadRequest, qpn, psn));
    h.reth = Some(Reth {
        va,
        rkey,
        dma_len: len,
    });
    h
}

fn fetch_add(qpn: u32, psn: u32, rkey: u32, va: u64) -> Headers {
    let mut h = Headers::new(Bth::new(Opcode::RcFetchAdd, qpn, psn));
    h.atomic_eth = Some(AtomicEth {
        va,
        rkey,
        swap_add: 1,
        compare: 0,
    });
    h.bth.ack_req = true;
    h
}

/// Records the opcode, PSN and NAK code of every packet side `from`
/// sends through the network's script (dropping none).
fn record(net: &mut Net, from: usize) -> Rc<RefCell<Vec<Shape>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = Rc::clone(&seen);
    net.script = Some(Box::new(move |side, _, p| {
        if side == from {
            let nak = match p.headers.aeth.map(|a| a.syndrome) {
                Some(Syndrome::Nak(code)) => Some(code),
                _ => None,
            };
            log.borrow_mut()
                .push((p.headers.bth.opcode, p.headers.bth.psn, nak));
        }
        true
    }));
    seen
}

/// A READ, an atomic and a SEND executed in the same receive batch as a
/// WRITE with a bad R_Key: their answers leave before the WRITE's NAK, in
/// PSN order, so the READ and the atomic succeed (their data and original
/// value land), the SEND succeeds, the WRITE completes REM_ACCESS_ERR and
/// the SEND behind it is flushed. No retry is needed. (The responder used
/// to drop its queued answers when it went to ERR: the READ was retried
/// into a QP in ERR and ended RETRY_EXC_ERR after 8 timeouts.)
#[test]
fn answers_executed_before_a_responder_error_leave_before_its_nak() {
    use roce::NakCode::RemoteAccessError as Access;
    let mut net = Net::rc_pair(Mtu::Mtu1024, 31);
    let w = Workload::new(
        &mut net,
        &[
            (Kind::Read, 3000),
            (Kind::Fadd, 8),
            (Kind::Send, 10),
            (Kind::Write, 100),
            (Kind::Send, 10),
        ],
    );
    let sent = record(&mut net, 1);
    for i in [2, 4] {
        let m = &w.msgs[i];
        let sge = [Sge {
            addr: RECV + m.dst_off,
            length: m.len,
            lkey: w.keys.recv,
        }];
        let wr = RecvWr {
            wr_id: 1000 + i as u64,
            sg_list: &sge,
        };
        net.sides[1].t.post_recv(&wr).unwrap();
    }
    for i in [0, 1, 2] {
        w.post_one(&mut net, i, &w.msgs[i]);
    }
    let sg = [Sge {
        addr: SRC + w.msgs[3].src_off,
        length: 100,
        lkey: w.keys.src,
    }];
    let bad = SendOp::Write {
        remote_addr: DST + w.msgs[3].dst_off,
        rkey: 0xdead,
    };
    let s = &mut net.sides[0];
    s.t.post_send(&SendWr::new(3, bad, &sg), &mut s.mem)
        .unwrap();
    w.post_one(&mut net, 4, &w.msgs[4]);

    assert!(w.run(&mut net, Duration::from_secs(10)));
    let statuses: Vec<_> = net.sides[0].wcs.iter().map(|w| w.status).collect();
    use WcStatus::*;
    assert_eq!(
        statuses,
        [Success, Success, Success, RemoteAccessError, WrFlushError]
    );
    // The READ's bytes and the atomic's original value arrived.
    let m = w.msgs[0];
    let want = common::pattern(2, 3000);
    assert!(net.sides[0].mem.read(w.keys.rbuf, RBUF + m.src_off, 3000) == want);
    let m = w.msgs[1];
    assert_eq!(
        net.sides[0].mem.read(w.keys.rbuf, RBUF + m.src_off, 8),
        1000u64.to_ne_bytes()
    );
    assert_eq!(net.sides[0].t.counters().retries, 0, "nothing was retried");
    // The responder answered in PSN order, the NAK last, and went to ERR.
    assert_eq!(
        *sent.borrow(),
        [
            (Opcode::RcReadResponseFirst, 0, None),
            (Opcode::RcReadResponseMiddle, 1, None),
            (Opcode::RcReadResponseLast, 2, None),
            (Opcode::RcAtomicAck, 3, None),
            (Opcode::RcAck, 4, None),
            (Opcode::RcAck, 5, Some(Access)),
        ]
    );
    assert_eq!(net.sides[1].t.state(), QpState::Err);
    let recvs: Vec<_> = net.sides[1]
        .wcs
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(recvs, [(1002, Success), (1004, WrFlushError)]);
}

/// A QP's own requester error (here a NAK for its SEND) and a move to ERR
/// by the application leave the answers its responder owes for requests
/// it already executed: a READ served before the error still gets its
/// response.
#[test]
fn answers_owed_survive_a_requester_error_and_set_error() {
    for how in ["nak", "set_error"] {
        let mut mem = TestMem::default();
        let (src, _) = mem.register(0x1000, 64, Access::NONE);
        let (_, rkey) = mem.register(0x9000, 64, Access::REMOTE_READ);
        mem.write(rkey, 0x9000, &[7; 64]);
        let mut t: Transport<()> = Transport::new(Config::rc(0x11, 0x22)).unwrap();
        let sge = [Sge {
            addr: 0x1000,
            length: 16,
            lkey: src,
        }];
        t.post_send(&SendWr::new(1, SendOp::Send, &sge), &mut mem)
            .unwrap();
        let send = drain(&mut t, &mut mem);
        assert_eq!(shape(&send), [(Opcode::RcSendOnly, 0, None)]);
        // The peer's READ is executed: its response is queued.
        deliver(
            &mut t,
            &mut mem,
            read_request(0x11, 0, rkey, 0x9000, 64),
            &[],
        );
        match how {
            "nak" => {
                let mut nak = Headers::new(Bth::new(Opcode::RcAck, 0x11, 0));
                nak.aeth = Some(Aeth {
                    syndrome: Syndrome::Nak(roce::NakCode::RemoteOperationalError),
                    msn: 0,
                });
                deliver(&mut t, &mut mem, nak, &[]);
                let wc = t.poll_completion().unwrap();
                assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemoteOpError));
            }
            _ => t.set_error(),
        }
        assert_eq!(t.state(), QpState::Err, "{how}");
        let out = drain(&mut t, &mut mem);
        assert_eq!(
            shape(&out),
            [(Opcode::RcReadResponseOnly, 0, None)],
            "{how}: the READ still gets its response"
        );
        assert_eq!(&out[0].payload[..], &[7; 64]);
        // Nothing new is served in ERR.
        deliver(
            &mut t,
            &mut mem,
            read_request(0x11, 1, rkey, 0x9000, 8),
            &[],
        );
        assert!(drain(&mut t, &mut mem).is_empty(), "{how}");
    }
}

/// The responder answers directly (no network): READ, atomic, SEND and a
/// malformed request in one batch leave as READ response, atomic ACK,
/// ACK, NAK invalid request, and the atomic ran once.
#[test]
fn a_batch_ending_in_an_invalid_request_is_answered_in_psn_order() {
    let mut mem = TestMem::default();
    let (_, rkey) = mem.register(
        0x9000,
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    );
    let mut t = responder_with_a_receive(&mut mem);
    deliver(
        &mut t,
        &mut mem,
        read_request(0x22, 0, rkey, 0x9000, 100),
        &[],
    );
    deliver(&mut t, &mut mem, fetch_add(0x22, 1, rkey, 0x9100), &[]);
    let mut send = Headers::new(Bth::new(Opcode::RcSendOnly, 0x22, 2));
    send.bth.ack_req = true;
    deliver(&mut t, &mut mem, send, b"hello");
    // An atomic at an unaligned address: invalid request (class C).
    deliver(&mut t, &mut mem, fetch_add(0x22, 3, rkey, 0x9204), &[]);
    let out = drain(&mut t, &mut mem);
    assert_eq!(
        shape(&out),
        [
            (Opcode::RcReadResponseOnly, 0, None),
            (Opcode::RcAtomicAck, 1, None),
            (Opcode::RcAck, 2, None),
            (Opcode::RcAck, 3, Some(roce::NakCode::InvalidRequest)),
        ]
    );
    assert_eq!(t.state(), QpState::Err);
    assert_eq!(mem.read(rkey, 0x9100, 8), 1u64.to_ne_bytes());
    let wc = t.poll_completion().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 5)
    );
}

/// Memory whose `invalidate` refuses every key (as a provider does for a
/// key that is not a memory window or MR this QP may invalidate).
struct NoInvalidate(TestMem);

impl roce_transport::Memory for NoInvalidate {
    fn check_local(&mut self, s: &[Sge], need: Access) -> Result<u64, roce_transport::MemError> {
        self.0.check_local(s, need)
    }
    fn gather(
        &mut self,
        s: &[Sge],
        off: u64,
        out: &mut [u8],
    ) -> Result<(), roce_transport::MemError> {
        self.0.gather(s, off, out)
    }
    fn scatter(
        &mut self,
        s: &[Sge],
        off: u64,
        data: &[u8],
    ) -> Result<(), roce_transport::MemError> {
        self.0.scatter(s, off, data)
    }
    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(), roce_transport::MemError> {
        self.0.check_remote(rkey, va, len, need)
    }
    fn write_remote(
        &mut self,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), roce_transport::MemError> {
        self.0.write_remote(rkey, va, data)
    }
    fn read_remote(
        &mut self,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), roce_transport::MemError> {
        self.0.read_remote(rkey, va, out)
    }
    fn atomic(
        &mut self,
        rkey: u32,
        va: u64,
        op: roce_transport::AtomicOp,
    ) -> Result<u64, roce_transport::MemError> {
        self.0.atomic(rkey, va, op)
    }
    fn invalidate(&mut self, _rkey: u32) -> Result<(), roce_transport::MemError> {
        Err(roce_transport::MemError::BadKey)
    }
}

/// A SEND with invalidate whose R_Key cannot be invalidated: the receive
/// it landed in completes REM_INV_REQ_ERR (it used to vanish: no
/// completion at all), the requester gets a NAK invalid request, the QP
/// goes to ERR and the next receive is flushed.
#[test]
fn a_send_with_a_bad_invalidate_key_completes_its_receive_in_error() {
    use roce::Ieth;
    let mut mem = NoInvalidate(TestMem::default());
    let (recv, _) = mem.0.register(0x5000, 64, Access::LOCAL_WRITE);
    let mut t: Transport<()> = Transport::new(Config::rc(0x22, 0x11)).unwrap();
    for (wr_id, at) in [(9, 0x5000), (10, 0x5020)] {
        let sge = [Sge {
            addr: at,
            length: 32,
            lkey: recv,
        }];
        t.post_recv(&RecvWr {
            wr_id,
            sg_list: &sge,
        })
        .unwrap();
    }
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnlyInvalidate, 0x22, 0));
    h.ieth = Some(Ieth { rkey: 0x4242 });
    t.handle_packet(NOW, &peer(), &Packet::new(h, b"hi"), &mut mem);
    let out: Vec<_> = std::iter::from_fn(|| t.poll_transmit(NOW, &mut mem)).collect();
    assert_eq!(
        shape(&out),
        [(Opcode::RcAck, 0, Some(roce::NakCode::InvalidRequest))]
    );
    assert_eq!(t.state(), QpState::Err);
    let wcs: Vec<_> = std::iter::from_fn(|| t.poll_completion())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        wcs,
        [
            (9, WcStatus::RemoteInvalidRequest),
            (10, WcStatus::WrFlushError)
        ]
    );
}

/// The region under a READ goes away between its check and its
/// response: the responder NAKs remote access at the response's PSN and,
/// as after any class C NAK, goes to ERR (it used to stay in RTS serving
/// a peer the NAK had put in ERR). The answer owed to the SEND executed
/// after the READ still leaves.
#[test]
fn a_read_whose_region_goes_before_its_response_naks_and_ends_in_err() {
    let mut mem = TestMem::default();
    let (_, rkey) = mem.register(0x9000, 4096, Access::REMOTE_READ);
    let mut t = responder_with_a_receive(&mut mem);
    deliver(
        &mut t,
        &mut mem,
        read_request(0x22, 0, rkey, 0x9000, 2000),
        &[],
    );
    let mut send = Headers::new(Bth::new(Opcode::RcSendOnly, 0x22, 2));
    send.bth.ack_req = true;
    deliver(&mut t, &mut mem, send, b"hello");
    mem.regions.retain(|r| r.rkey != rkey);
    let out = drain(&mut t, &mut mem);
    assert_eq!(
        shape(&out),
        [
            (Opcode::RcAck, 0, Some(roce::NakCode::RemoteAccessError)),
            (Opcode::RcAck, 2, None),
        ]
    );
    assert_eq!(t.state(), QpState::Err);
    assert_eq!(t.counters().naks_sent, 1);
    deliver(
        &mut t,
        &mut mem,
        read_request(0x22, 3, rkey, 0x9000, 8),
        &[],
    );
    assert!(drain(&mut t, &mut mem).is_empty(), "nothing served in ERR");
}

/// The status a SEND completes with when the responder NAKs it with
/// `code`.
fn status_after_nak(code: roce::NakCode) -> WcStatus {
    let mut mem = TestMem::default();
    let (src, _) = mem.register(0x1000, 64, Access::NONE);
    let mut t: Transport<()> = Transport::new(Config::rc(0x11, 0x22)).unwrap();
    let sge = [Sge {
        addr: 0x1000,
        length: 16,
        lkey: src,
    }];
    for wr_id in [1, 2] {
        t.post_send(&SendWr::new(wr_id, SendOp::Send, &sge), &mut mem)
            .unwrap();
    }
    assert_eq!(drain(&mut t, &mut mem).len(), 2);
    let mut nak = Headers::new(Bth::new(Opcode::RcAck, 0x11, 0));
    nak.aeth = Some(Aeth {
        syndrome: Syndrome::Nak(code),
        msn: 0,
    });
    deliver(&mut t, &mut mem, nak, &[]);
    assert_eq!(t.state(), QpState::Err, "{code:?}");
    let wcs: Vec<_> = std::iter::from_fn(|| t.poll_completion())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(wcs[1], (2, WcStatus::WrFlushError), "{code:?}");
    wcs[0].1
}

/// NAK codes map to completion statuses as rxe maps them: invalid
/// request, remote access error and remote operational error to their
/// own statuses, and a code an RC requester has no meaning for (invalid
/// RD request) to REM_OP_ERR (it used to be REM_INV_REQ_ERR).
#[test]
fn nak_codes_complete_with_their_status_and_unknown_ones_rem_op_err() {
    use roce::NakCode::*;
    assert_eq!(
        status_after_nak(InvalidRequest),
        WcStatus::RemoteInvalidRequest
    );
    assert_eq!(
        status_after_nak(RemoteAccessError),
        WcStatus::RemoteAccessError
    );
    assert_eq!(
        status_after_nak(RemoteOperationalError),
        WcStatus::RemoteOpError
    );
    assert_eq!(status_after_nak(InvalidRdRequest), WcStatus::RemoteOpError);
}

/// retry_cnt 7 means seven retries (IBTA vol. 1 §9.7.6.1.3: the count
/// of retries after the first try), not "retry forever" as Linux rxe
/// reads it: a SEND that nobody answers goes out 8 times, one timeout
/// apart, and then completes RETRY_EXC_ERR.
#[test]
fn retry_cnt_7_is_seven_retries_then_retry_exceeded() {
    let mut net = Net::rc_pair(Mtu::Mtu1024, 32);
    for s in &mut net.sides {
        let mut cfg = *s.t.config();
        assert_eq!(cfg.retry_cnt, 7);
        cfg.timeout = 10; // 4.2 ms
        s.t = Transport::new(cfg).unwrap();
    }
    net.cut = [true, false];
    let w = Workload::new(&mut net, &[(Kind::Send, 10)]);
    w.post_one(&mut net, 0, &w.msgs[0]);
    let t0 = net.now;
    assert!(w.run(&mut net, Duration::from_secs(60)));
    let wc = net.sides[0].wcs[0];
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::RetryExceeded));
    assert_eq!(net.sides[0].t.counters().retries, 7);
    assert_eq!(net.sent, 8, "the first try and seven retries");
    let to = roce_transport::timers::ack_timeout(10).unwrap();
    let took = net.now - t0;
    assert!(took >= to * 8 && took < to * 9, "{took:?}");
    assert_eq!(net.sides[0].t.state(), QpState::Err);
    assert_eq!(net.sides[0].t.poll_timeout(), None, "no retry after that");
}

/// An RC pair whose A has `max_rd_atomic` `ra` and B `max_dest_rd_atomic`
/// `rb`, with the usual workload memory for `kinds`.
fn depth_pair(ra: u8, rb: u8, kinds: &[(Kind, u32)]) -> (Net, Workload) {
    let mut a = Config::rc(0x11, 0x22);
    let mut b = Config::rc(0x22, 0x11);
    a.max_rd_atomic = ra;
    b.max_dest_rd_atomic = rb;
    let mut net = Net::new(a, b, 33);
    let w = Workload::new(&mut net, kinds);
    (net, w)
}

/// `max_rd_atomic` 0 means no READ or atomic may be outstanding (IBTA),
/// not one: post_send refuses them with an error and the QP is
/// unchanged (no PSN taken, no completion, still RTS: a SEND after them
/// goes through). With 1 the same READ succeeds.
#[test]
fn max_rd_atomic_0_refuses_read_and_atomics_at_post() {
    let kinds = [
        (Kind::Read, 64),
        (Kind::Cas, 8),
        (Kind::Fadd, 8),
        (Kind::Send, 10),
    ];
    let (mut net, w) = depth_pair(0, 16, &kinds);
    let psn = net.sides[0].t.next_send_psn();
    for op in [
        SendOp::Read {
            remote_addr: DST,
            rkey: w.keys.dst_r,
        },
        SendOp::CompareSwap {
            remote_addr: DST,
            rkey: w.keys.dst_r,
            compare: 0,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: DST,
            rkey: w.keys.dst_r,
            add: 1,
        },
    ] {
        let sge = [Sge {
            addr: RBUF,
            length: 8,
            lkey: w.keys.rbuf,
        }];
        let s = &mut net.sides[0];
        let r = s.t.post_send(&SendWr::new(7, op, &sge), &mut s.mem);
        assert!(
            matches!(r, Err(roce_transport::Error::InvalidWr(_))),
            "{op:?}: {r:?}"
        );
    }
    assert_eq!(net.sides[0].t.next_send_psn(), psn, "no PSN taken");
    assert_eq!(net.sides[0].t.state(), QpState::Rts);
    assert!(net.sides[0].t.poll_completion().is_none());
    // The QP goes on: a SEND is delivered.
    let m = w.msgs[3];
    let sge = [Sge {
        addr: RECV + m.dst_off,
        length: m.len,
        lkey: w.keys.recv,
    }];
    net.sides[1]
        .t
        .post_recv(&RecvWr {
            wr_id: 1003,
            sg_list: &sge,
        })
        .unwrap();
    w.post_one(&mut net, 3, &m);
    assert!(net.run_until(Duration::from_secs(1), |n| !n.sides[0].wcs.is_empty()));
    assert_eq!(net.sides[0].wcs[0].status, WcStatus::Success);
    assert_eq!(net.sides[1].wcs[0].status, WcStatus::Success);
    // Positive control: max_rd_atomic 1 takes the same READ.
    let (mut net, w) = depth_pair(1, 16, &kinds[..1]);
    w.post(&mut net);
    assert!(w.run(&mut net, Duration::from_secs(1)));
    w.check(&mut net);
}

/// `max_dest_rd_atomic` 0 means the responder offers no READ/atomic
/// resources (IBTA): a READ or an atomic is NAKed invalid request (the
/// requester broke the limit it was given), the requester completes
/// REM_INV_REQ_ERR, the responder goes to ERR and no byte moves. With 1
/// the same requests succeed.
#[test]
fn max_dest_rd_atomic_0_naks_read_and_atomics() {
    for kind in [Kind::Read, Kind::Cas, Kind::Fadd] {
        let (mut net, w) = depth_pair(16, 0, &[(kind, 64)]);
        let before = net.sides[1].mem.read(w.keys.dst_l, DST, 64);
        w.post(&mut net);
        assert!(w.run(&mut net, Duration::from_secs(1)), "{kind:?}");
        let wc = net.sides[0].wcs[0];
        assert_eq!(wc.status, WcStatus::RemoteInvalidRequest, "{kind:?}");
        assert_eq!(net.sides[0].t.state(), QpState::Err);
        assert_eq!(net.sides[1].t.state(), QpState::Err);
        assert_eq!(net.sides[1].t.counters().naks_sent, 1);
        assert_eq!(net.sides[1].mem.read(w.keys.dst_l, DST, 64), before);
        assert_eq!(net.sides[0].mem.read(w.keys.rbuf, RBUF, 8), [0; 8]);

        let (mut net, w) = depth_pair(16, 1, &[(kind, 64)]);
        w.post(&mut net);
        assert!(w.run(&mut net, Duration::from_secs(1)), "{kind:?}");
        w.check(&mut net);
    }
}

/// `update_config` (a modify SQD -> SQD, RTR -> RTS) takes `max_rd_atomic`
/// 0 only when no READ or atomic is queued (one queued could then never
/// be sent or retransmitted): refused with the transport unchanged, and
/// accepted once the READ completed; READs are then refused at post.
/// `max_dest_rd_atomic` 0 applied the same way makes the responder NAK.
#[test]
fn update_config_to_zero_depths() {
    let (mut net, w) = depth_pair(16, 16, &[(Kind::Read, 64), (Kind::Read, 64)]);
    w.post_one(&mut net, 0, &w.msgs[0]);
    let mut cfg = *net.sides[0].t.config();
    cfg.max_rd_atomic = 0;
    let r = net.sides[0].t.update_config(cfg);
    assert!(
        matches!(r, Err(roce_transport::Error::InvalidConfig(_))),
        "{r:?}"
    );
    assert_eq!(net.sides[0].t.config().max_rd_atomic, 16, "unchanged");
    assert!(net.run_until(Duration::from_secs(1), |n| !n.sides[0].wcs.is_empty()));
    assert_eq!(net.sides[0].wcs[0].status, WcStatus::Success);
    net.sides[0].t.update_config(cfg).unwrap();
    let sge = [Sge {
        addr: RBUF,
        length: 64,
        lkey: w.keys.rbuf,
    }];
    let read = SendOp::Read {
        remote_addr: DST,
        rkey: w.keys.dst_r,
    };
    let s = &mut net.sides[0];
    assert!(s
        .t
        .post_send(&SendWr::new(1, read, &sge), &mut s.mem)
        .is_err());
    // Back to 1 on A, B's responder down to 0: the READ is NAKed.
    cfg.max_rd_atomic = 1;
    net.sides[0].t.update_config(cfg).unwrap();
    let mut b = *net.sides[1].t.config();
    b.max_dest_rd_atomic = 0;
    net.sides[1].t.update_config(b).unwrap();
    w.post_one(&mut net, 1, &w.msgs[1]);
    assert!(w.run(&mut net, Duration::from_secs(1)));
    assert_eq!(net.sides[0].wcs[1].status, WcStatus::RemoteInvalidRequest);
}
