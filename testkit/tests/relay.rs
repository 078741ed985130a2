//! RC traffic between two RoCEv2 ports through the fault relay
//! (`ibal_testkit::relay`): 10% of the datagrams each way dropped, duplicated,
//! reordered and delayed, and every message still completes exactly once
//! with the right bytes; then the link dies and the survivor's requests
//! end with retry exceeded, in bounded time, with nothing left behind.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig};
use ibal_testkit::relay::{self, FaultConfig, RelayConfig};

const LEN: usize = 1 << 20;

struct End {
    cq: Handle<Cq>,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
    rkey: u32,
    gid: [u8; 16],
    addr: SocketAddr,
}

fn end(al: &Al, provider: &RoceProvider, guid: u64) -> Result<End> {
    let ca = al.open_ca(provider, guid)?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, 256)?;
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq))?;
    let buf = RegisteredBuffer::new(LEN);
    let access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    let (lkey, rkey) = pd.register(al, &buf, access)?.keys(al)?;
    let gid = ca.port(al, 1)?.gid_table[0];
    Ok(End {
        cq,
        qp,
        buf,
        lkey,
        rkey,
        gid,
        addr: provider.address_of(&gid),
    })
}

fn connect(al: &Al, me: &End, peer: &End, retry: u8, timeout: u8) -> Result<()> {
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
        dgid: peer.gid,
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    let peer_qpn = peer.qp.query(al)?.qpn;
    me.qp.modify(
        al,
        &QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(peer_qpn)
            .rq_psn(0)
            .max_dest_rd_atomic(4)
            .min_rnr_timer(1),
    )?;
    me.qp.modify(
        al,
        &QpModify::to(QpState::Rts)
            .sq_psn(0)
            .timeout(timeout)
            .retry_cnt(retry)
            .rnr_retry(7)
            .max_rd_atomic(4),
    )
}

/// Two devices (one provider, so in one process) whose traffic goes
/// through a relay with `faults`.
fn setup(faults: FaultConfig, retry: u8) -> (Al, End, End, relay::RelayHandle, RoceProvider) {
    let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
    let provider = RoceProvider::new(vec![
        DeviceConfig::new("relay-a", 0xa7, vec![port("127.0.0.1")]),
        DeviceConfig::new("relay-b", 0xb7, vec![port("127.0.0.2")]),
    ]);
    let al = Al::open().unwrap();
    let a = end(&al, &provider, 0xa7).unwrap();
    let b = end(&al, &provider, 0xb7).unwrap();
    // Each side of the relay has the IP address of the end it stands for
    // (a switch, not a NAT): a connected QP takes packets only from its
    // peer's address (roce_transport::receive).
    let r = relay::spawn(RelayConfig {
        near_a: "127.0.0.2:0".parse().unwrap(),
        near_b: "127.0.0.1:0".parse().unwrap(),
        a: a.addr,
        b: b.addr,
        faults,
        max_time: Duration::from_secs(120),
        max_datagrams: 10_000_000,
    })
    .unwrap();
    provider.add_peer(b.gid, r.near_a);
    provider.add_peer(a.gid, r.near_b);
    // Timeout 12: 16.8 ms per try, well above the relay's longest delay (2 ms)
    // as a path's timeout must be; losses still recover quickly.
    connect(&al, &a, &b, retry, 12).unwrap();
    connect(&al, &b, &a, retry, 12).unwrap();
    (al, a, b, r, provider)
}

fn wait(al: &Al, cq: Handle<Cq>, n: usize, limit: Duration) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wc = [Wc::default(); 32];
    let end = Instant::now() + limit;
    while out.len() < n && Instant::now() < end {
        let k = cq.poll(al, &mut wc).unwrap();
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    out
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as u8)
        .collect()
}

#[test]
fn every_message_arrives_once_through_ten_percent_faults() {
    let (al, a, b, r, _provider) = setup(FaultConfig::uniform(0.10, 0x5eed), 7);
    // 60 messages: SENDs, WRITEs and READs of 100..8,738 bytes, in order.
    const MSGS: usize = 60;
    // B: receives in the first half, WRITE targets and READ sources in
    // the second (a posted receive's bytes may not be written meanwhile).
    let slot = LEN / 2 / MSGS;
    let remote = |i: usize| (LEN / 2 + i * slot) as u64;
    let rsge: Vec<[Sge; 1]> = (0..MSGS)
        .map(|i| {
            [Sge {
                addr: (i * slot) as u64,
                length: slot as u32,
                lkey: b.lkey,
            }]
        })
        .collect();
    let recvs: Vec<RecvWr> = rsge
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr {
            wr_id: i as u64,
            sg_list: s,
        })
        .collect();
    b.qp.post_recv(&al, &recvs).unwrap();
    let mut sends = 0;
    let mut expect = Vec::new();
    for i in 0..MSGS {
        let len = 100 + (i * 7919) % (slot - 100);
        let data = pattern(i as u32, len);
        let at = i * slot;
        a.buf.write(at, &data).unwrap();
        let sge = [Sge {
            addr: at as u64,
            length: len as u32,
            lkey: a.lkey,
        }];
        let op = match i % 3 {
            0 => {
                sends += 1;
                SendOp::Send
            }
            1 => SendOp::Write {
                remote_addr: remote(i),
                rkey: b.rkey,
            },
            _ => {
                // READ back what B holds there (its own pattern).
                b.buf
                    .write(remote(i) as usize, &pattern(1000 + i as u32, len))
                    .unwrap();
                SendOp::Read {
                    remote_addr: remote(i),
                    rkey: b.rkey,
                }
            }
        };
        a.qp.post_send(&al, &[SendWr::new(i as u64, op, &sge)])
            .unwrap();
        expect.push((i, len, at));
        // Keep the send queue within its depth.
        if i % 32 == 31 {
            let got = wait(&al, a.cq, 32, Duration::from_secs(60));
            assert_eq!(got.len(), 32, "completions of the first {} messages", i + 1);
            for w in &got {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
            }
        }
    }
    let rest = wait(&al, a.cq, MSGS % 32, Duration::from_secs(60));
    assert_eq!(rest.len(), MSGS % 32);
    assert!(
        rest.iter().all(|w| w.status == WcStatus::Success),
        "{rest:?}"
    );
    let recvd = wait(&al, b.cq, sends, Duration::from_secs(10));
    assert_eq!(recvd.len(), sends, "every SEND received once");
    assert!(
        wait(&al, b.cq, 1, Duration::from_millis(200)).is_empty(),
        "and no more"
    );
    for (i, len, at) in expect {
        let mut got = vec![0u8; len];
        match i % 3 {
            0 => {
                // The k-th SEND took the k-th receive.
                let k = i / 3;
                assert_eq!((recvd[k].wr_id, recvd[k].byte_len), (k as u64, len as u32));
                b.buf.read(k * slot, &mut got).unwrap();
                assert!(got == pattern(i as u32, len), "SEND {i} bytes");
            }
            1 => {
                b.buf.read(remote(i) as usize, &mut got).unwrap();
                assert!(got == pattern(i as u32, len), "WRITE {i} bytes");
            }
            _ => {
                a.buf.read(at, &mut got).unwrap();
                assert!(got == pattern(1000 + i as u32, len), "READ {i} bytes");
            }
        }
    }
    let stats = r.stop().unwrap();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.reordered > 0 && stats.delayed > 0,
        "the relay did inject every fault: {stats:?}"
    );
    let s = al.close().unwrap();
    assert_eq!(s.live(Kind::QP), 0);
}

#[test]
fn a_dead_peer_ends_the_survivors_requests_with_retry_exceeded() {
    let (al, a, _b, r, _provider) = setup(FaultConfig::uniform(0.0, 1), 3);
    r.cut(true);
    let sge = [Sge {
        addr: 0,
        length: 4096,
        lkey: a.lkey,
    }];
    let t0 = Instant::now();
    for i in 0..4 {
        a.qp.post_send(&al, &[SendWr::new(i, SendOp::Send, &sge)])
            .unwrap();
    }
    let got = wait(&al, a.cq, 4, Duration::from_secs(10));
    assert_eq!(got.len(), 4, "every request ends: {got:?}");
    assert_eq!(got[0].status, WcStatus::RetryExceeded, "{got:?}");
    assert!(
        got[1..].iter().all(|w| w.status == WcStatus::WrFlushError),
        "{got:?}"
    );
    // 4 tries (retry 3) of ~4 ms each, plus scheduling.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(a.qp.query(&al).unwrap().state, QpState::Err);
    let s = al.close().unwrap();
    assert_eq!(s.live(Kind::QP), 0);
    assert_eq!(s.live(Kind::CA), 0);
}
