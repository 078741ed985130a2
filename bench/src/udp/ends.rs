//! The two ends every RoCEv2 benchmark runs between (two ports of our
//! provider on loopback, or two contexts of an RDMA device), an RC QP
//! each, connected by hand; polling their CQs; the raw UDP socket pair of
//! the baselines.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig, UdpOffload};
use ibal::verbs::QpCaps;

use crate::BenchResult;

/// Payload of the latency and rate messages.
pub const MSG: usize = 64;
/// UDP payload of one 64-byte RoCEv2 SEND-only packet (BTH + data + ICRC).
pub const SEND_DATAGRAM: usize = 12 + MSG + 4;
/// UDP payload of one full WRITE-middle packet at MTU 4096.
pub const WRITE_DATAGRAM: usize = write_datagram(4096);
/// A WRITE-middle packet's bytes besides its payload: BTH 12 + ICRC 4.
pub const WRITE_HEADERS: usize = 12 + 4;

/// UDP payload of one full WRITE-middle packet at MTU `mtu` bytes (4112
/// at 4096, 1040 at 1024): the datagram the baselines stream.
pub const fn write_datagram(mtu: usize) -> usize {
    mtu + WRITE_HEADERS
}
/// How the streaming benchmarks' threads wait for completions.
pub(super) const STREAM_WAIT: Wait = Wait::Sleep(Duration::from_micros(50));
/// Longest any wait of a benchmark may take.
pub(super) const STALL: Duration = Duration::from_secs(10);

pub(super) fn err(what: &'static str) -> impl FnOnce(Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Two RoCE ports on loopback with an RC QP each, connected by hand.
pub(crate) struct Pair {
    pub(crate) al: Al,
    pub(crate) ends: [End; 2],
}

pub(crate) struct End {
    pub(crate) ca: Handle<Ca>,
    pub(crate) cq: Handle<Cq>,
    pub(crate) qp: Handle<Qp>,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    /// The UDP address of its RoCEv2 port (our provider only).
    pub(crate) addr: Option<SocketAddr>,
}

/// Where a benchmark's two ends run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Two RoCEv2 ports of our provider on loopback (127.0.0.1, 127.0.0.2).
    Loopback,
    /// Two contexts of one RDMA device (feature `rdma`), looping back
    /// through its port 1 as perftest's tools do on one host.
    Device(String),
}

/// How one end is reached: by LID (InfiniBand) or by GID at an index;
/// and, on our RoCEv2 provider, the UDP address of its port.
#[derive(Clone, Copy)]
pub(super) struct Route {
    pub(super) lid: u16,
    pub(super) gid: Option<([u8; 16], u8)>,
    pub(super) addr: Option<SocketAddr>,
}

impl Pair {
    pub(super) fn on(target: &Target, mtu: Mtu, buf_len: usize, depth: u32) -> BenchResult<Pair> {
        Pair::on_with(target, mtu, None, buf_len, depth)
    }

    /// As [`Pair::on`], our ports (on loopback) using the UDP offloads
    /// `offload` names (`None`: `PortConfig`'s default, from
    /// `IBAL_ROCE_UDP_OFFLOAD`).
    pub(super) fn on_with(
        target: &Target,
        mtu: Mtu,
        offload: Option<UdpOffload>,
        buf_len: usize,
        depth: u32,
    ) -> BenchResult<Pair> {
        let al = Al::open().map_err(err("open AL"))?;
        let (cas, mtu) = open_cas(&al, target, mtu, offload)?;
        let mut ends = Vec::new();
        let mut routes = Vec::new();
        for (ca, route) in cas {
            let pd = ca.alloc_pd(&al).map_err(err("alloc PD"))?;
            let cq = ca
                .create_cq(&al, 4 * depth + 64)
                .map_err(err("create CQ"))?;
            let caps = QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
            };
            let create = QpCreate::new(QpType::Rc, cq).caps(caps);
            let qp = pd.create_qp(&al, create).map_err(err("create QP"))?;
            let buf = RegisteredBuffer::new(buf_len);
            let access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
            let (lkey, rkey) = pd
                .register(&al, &buf, access)
                .and_then(|mr| mr.keys(&al))
                .map_err(err("register"))?;
            routes.push(route);
            // The MR keeps the buffer's memory alive.
            ends.push(End {
                ca,
                cq,
                qp,
                lkey,
                rkey,
                addr: route.addr,
            });
        }
        let qpns: Vec<u32> = ends
            .iter()
            .map(|e| e.qp.query(&al).map(|a| a.qpn))
            .collect::<Result<_>>()
            .map_err(err("query QP"))?;
        for i in 0..2 {
            connect(&al, ends[i].qp, mtu, qpns[1 - i], routes[1 - i]).map_err(err("connect"))?;
        }
        let ends: [End; 2] = ends.try_into().map_err(|_| "two ends".to_string())?;
        Ok(Pair { al, ends })
    }
}

/// The two ends' CAs and routes.
pub(super) type Ends = Vec<(Handle<Ca>, Route)>;

/// The two CAs of `target`, how each is reached, and the path MTU (at
/// most `mtu`, at most the device port's active MTU). Our ports on
/// loopback have MTU `mtu` and use the UDP offloads `offload` names
/// (`None`: the default); an RDMA device ignores `offload`.
pub(super) fn open_cas(
    al: &Al,
    target: &Target,
    mtu: Mtu,
    offload: Option<UdpOffload>,
) -> BenchResult<(Ends, Mtu)> {
    match target {
        Target::Loopback => {
            let port = |ip: &str| {
                let p = PortConfig::new(SocketAddr::new(ip.parse().expect("literal"), 0)).mtu(mtu);
                match offload {
                    Some(o) => p.udp_offload(o),
                    None => p,
                }
            };
            let provider = RoceProvider::new(vec![
                DeviceConfig::new("bench-a", 0xbe0a, vec![port("127.0.0.1")]),
                DeviceConfig::new("bench-b", 0xbe0b, vec![port("127.0.0.2")]),
            ]);
            let mut cas = Vec::new();
            for guid in [0xbe0a, 0xbe0b] {
                let ca = al.open_ca(&provider, guid).map_err(err("open CA"))?;
                let gid = ca.port(al, 1).map_err(err("query port"))?.gid_table[0];
                cas.push((
                    ca,
                    Route {
                        lid: 0,
                        gid: Some((gid, 0)),
                        addr: Some(provider.address_of(&gid)),
                    },
                ));
            }
            Ok((cas, mtu))
        }
        #[cfg(feature = "rdma")]
        Target::Device(name) => {
            use provider::LinkLayer;
            let provider = ibal::rdma::RdmaProvider::new();
            let guid = ibal_testkit::devices::rdma_device_guid(&provider, name)?;
            let mut cas = Vec::new();
            let mut path_mtu = mtu;
            for _ in 0..2 {
                let ca = al
                    .open_ca(&provider, guid)
                    .map_err(err("open the device"))?;
                let port = ca.port(al, 1).map_err(err("query port 1"))?;
                path_mtu = path_mtu.min(port.active_mtu);
                let route = if port.link_layer == LinkLayer::InfiniBand {
                    Route {
                        lid: port.lid,
                        gid: None,
                        addr: None,
                    }
                } else {
                    // RoCE: the first IPv4-mapped GID (RoCEv2 over IPv4),
                    // as the conformance fixture and perftest's -x pick.
                    let idx = port
                        .gid_table
                        .iter()
                        .position(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
                        .unwrap_or(0);
                    Route {
                        lid: 0,
                        gid: Some((port.gid_table[idx], idx as u8)),
                        addr: None,
                    }
                };
                cas.push((ca, route));
            }
            Ok((cas, path_mtu))
        }
        #[cfg(not(feature = "rdma"))]
        Target::Device(name) => Err(format!(
            "--device {name}: this ibal was built without the rdma feature \
             (cargo build --features rdma -p ibal-cli; docs/rdma-provider.md)"
        )),
    }
}

/// RESET -> RTS towards `peer_qpn` by `peer`'s route, both PSNs 0.
pub(super) fn connect(al: &Al, qp: Handle<Qp>, mtu: Mtu, peer_qpn: u32, peer: Route) -> Result<()> {
    let access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    qp.modify(
        al,
        &QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(access),
    )?;
    let mut av = AvAttr::lid(1, peer.lid);
    av.grh = peer.gid.map(|(dgid, sgid_index)| GrhAttr {
        dgid,
        sgid_index,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    qp.modify(
        al,
        &QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(mtu)
            .dest_qpn(peer_qpn)
            .rq_psn(0)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(1),
    )?;
    qp.modify(
        al,
        &QpModify::to(QpState::Rts)
            .sq_psn(0)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    )
}

/// How a benchmark thread waits between empty polls of its CQ.
#[derive(Clone, Copy)]
pub(super) enum Wait {
    /// Yield the core and poll again (latency: a ping-pong).
    Yield,
    /// Sleep this long (streams with a deep window: leave the cores to the
    /// provider's receive threads, as the raw UDP baseline's blocking
    /// receiver does).
    Sleep(Duration),
}

/// Busy-polls `cq` for up to `out.len()` completions (at least one);
/// fails on an error completion or after [`STALL`].
pub(super) fn poll_some(
    al: &Arc<AlInstance>,
    cq: Handle<Cq>,
    out: &mut [Wc],
    wait: Wait,
) -> BenchResult<usize> {
    let end = Instant::now() + STALL;
    loop {
        let n = cq.poll(al, out).map_err(err("poll"))?;
        if n > 0 {
            if let Some(bad) = out[..n].iter().find(|w| w.status != WcStatus::Success) {
                return Err(format!(
                    "work request {} completed with {:?}",
                    bad.wr_id, bad.status
                ));
            }
            return Ok(n);
        }
        if Instant::now() > end {
            return Err(format!("no completion within {STALL:?}"));
        }
        // The provider's receive threads need a core: on a machine with
        // fewer cores than busy-polling threads a spinning poller would
        // hold them off until the scheduler's next tick (~4 ms here).
        match wait {
            Wait::Yield => std::thread::yield_now(),
            Wait::Sleep(d) => std::thread::sleep(d),
        }
    }
}

pub(super) fn recv_wr(sge: &[Sge; 1], wr_id: u64) -> RecvWr<'_> {
    RecvWr {
        wr_id,
        sg_list: sge,
    }
}

/// A UDP socket pair on 127.0.0.1 / 127.0.0.2, each with a read timeout.
pub(crate) fn udp_pair() -> BenchResult<(UdpSocket, UdpSocket)> {
    let bind = |ip: &str| -> BenchResult<UdpSocket> {
        let s = UdpSocket::bind((ip, 0)).map_err(|e| format!("bind {ip}: {e}"))?;
        // The buffers the provider asks for on its sockets, so both sides
        // of the comparison queue the same.
        let sock = socket2::SockRef::from(&s);
        let _ = sock.set_recv_buffer_size(4 << 20);
        let _ = sock.set_send_buffer_size(4 << 20);
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(|e| e.to_string())?;
        Ok(s)
    };
    Ok((bind("127.0.0.1")?, bind("127.0.0.2")?))
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// How `--udp-offload` and the JSON name `o`: `on`, `off`, `gso` or `gro`.
pub fn offload_name(o: UdpOffload) -> &'static str {
    match (o.gso, o.gro) {
        (true, true) => "on",
        (false, false) => "off",
        (true, false) => "gso",
        (false, true) => "gro",
    }
}

/// The MTU of `bytes` if the RoCEv2 benchmarks take it (1024 or 4096).
pub fn bench_mtu(bytes: usize) -> Option<Mtu> {
    match bytes {
        1024 => Some(Mtu::Mtu1024),
        4096 => Some(Mtu::Mtu4096),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roce_ports_and_qps_run_at_the_mtu_asked() {
        for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
            let pair = Pair::on_with(&Target::Loopback, mtu, Some(UdpOffload::OFF), 4096, 16)
                .expect("pair");
            for e in &pair.ends {
                let port = e.ca.port(&pair.al, 1).expect("port");
                assert_eq!(port.active_mtu, mtu);
                assert_eq!(e.qp.query(&pair.al).expect("query").path_mtu, mtu);
            }
        }
        assert_eq!(bench_mtu(1024), Some(Mtu::Mtu1024));
        assert_eq!(bench_mtu(4096), Some(Mtu::Mtu4096));
        assert_eq!(bench_mtu(2048), None);
        assert_eq!(write_datagram(1024), 1040);
        assert_eq!(write_datagram(4096), WRITE_DATAGRAM);
    }

    #[test]
    fn offload_names_are_what_parse_takes() {
        for name in ["on", "off", "gso", "gro"] {
            let o = UdpOffload::parse(name).expect("parses");
            assert_eq!(offload_name(o), name);
        }
    }
}
