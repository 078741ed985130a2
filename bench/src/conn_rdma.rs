//! `ibal perf conn-rate --device NAME`: connections through the
//! librdmacm-backed CEPs (`ibal::rdma::cm`) between two contexts of one RDMA
//! device, to the device's own IPv4 address: `connect` (address and route
//! resolution, REQ) to `Established` on both sides, then a disconnect and
//! the release of both CEPs, one connection after another. No baseline
//! runs in the same process: compare with rdma-core's `ucmatose` or
//! perftest's `ib_send_lat -R` (rdma_cm connection) on the same device.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::AcceptReply;
use cep::ip::IpConnect;
use cep::proto::Event;
use cep::wire::ip_cm::{self, PortSpace};
use hca::verbs;
use ibal::rdma::cm::{self as rdmacm, RdmaCep, RdmaCmHandler, RdmaListenHandler};
use ibal::rdma::RdmaProvider;
use provider::QpType;
use qp::{create_qp, QpCreate};

use super::{json_f64, BenchResult};

const WAIT: Duration = Duration::from_secs(20);

/// Serial connection latency through rdma_cm on one device.
#[derive(Debug, Clone)]
pub struct RdmaConnReport {
    /// The device.
    pub device: String,
    /// Connections made.
    pub connections: usize,
    /// `connect` to `Established` on both sides: median, us.
    pub connect_median_us: f64,
    /// ... 99th percentile, us.
    pub connect_p99_us: f64,
    /// Whole cycles (connect, established, disconnect, both released) per
    /// second.
    pub cycles_per_sec: f64,
}

impl RdmaConnReport {
    /// Lines for people.
    pub fn to_text(&self) -> String {
        format!(
            "perf conn-rate on {} through librdmacm (two contexts of the device, to its own \
             address; no baseline: compare with ucmatose or ib_send_lat -R, docs/benchmarks.md)\n  \
             {} serial connections: connect to ESTABLISHED on both sides median {:.1} us, \
             p99 {:.1} us; {:.1} whole cycles per second (connect, disconnect, both released)\n",
            self.device,
            self.connections,
            self.connect_median_us,
            self.connect_p99_us,
            self.cycles_per_sec
        )
    }
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"benchmark\":\"conn-rate\",\"device\":\"{}\",\"connections\":{},\
             \"connect_median_us\":{},\"connect_p99_us\":{},\"cycles_per_sec\":{}}}",
            self.device,
            self.connections,
            json_f64(self.connect_median_us, 2),
            json_f64(self.connect_p99_us, 2),
            json_f64(self.cycles_per_sec, 2)
        )
    }
}

type Events = mpsc::Receiver<(Handle<RdmaCep>, Event)>;

fn channel() -> (RdmaCmHandler, Events) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let h: RdmaCmHandler = std::sync::Arc::new(move |c, ev| {
        let _ = tx.lock().map(|t| t.send((c, ev.clone())));
    });
    (h, rx)
}

fn expect(rx: &Events, name: &str, i: usize) -> BenchResult<Handle<RdmaCep>> {
    loop {
        match rx.recv_timeout(WAIT) {
            Ok((c, ev)) if ev.name() == name => return Ok(c),
            Ok((_, ev @ (Event::Rejected { .. } | Event::Timeout { .. }))) => {
                return Err(format!(
                    "connection {i}: {} while waiting for {name}",
                    ev.name()
                ))
            }
            Ok(_) => {}
            Err(_) => return Err(format!("connection {i}: no {name} within {WAIT:?}")),
        }
    }
}

/// Runs `connections` serial connections on `device`.
pub fn run(device: &str, connections: usize) -> BenchResult<RdmaConnReport> {
    if connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    let provider = RdmaProvider::new();
    let guid = ibal_testkit::devices::rdma_device_guid(&provider, device)?;
    ibal::rdma::rdma_cm_available().map_err(|e| format!("librdmacm: {e}"))?;
    let al = Al::open().map_err(|e| e.to_string())?;
    let result = (|| -> BenchResult<RdmaConnReport> {
        let inst = al.instance();
        let err = |what: &'static str| move |e: al::Error| format!("{what}: {e}");
        let (ca_a, ca_b) = (
            verbs::open_ca(inst, &provider, guid).map_err(err("open"))?,
            verbs::open_ca(inst, &provider, guid).map_err(err("open"))?,
        );
        let port = al
            .resolve(ca_b)
            .map_err(err("CA"))?
            .port(1)
            .map_err(err("port"))?;
        let ip: IpAddr = port
            .gid_table
            .iter()
            .find(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
            .map(|g| ip_cm::ip_of_gid(*g))
            .ok_or_else(|| format!("{device} has no IPv4 address (RoCEv2 GID)"))?;
        let at = SocketAddr::new(ip, 18_000 + (std::process::id() % 1000) as u16);
        let (pd_a, pd_b) = (
            verbs::alloc_pd(inst, ca_a).map_err(err("PD"))?,
            verbs::alloc_pd(inst, ca_b).map_err(err("PD"))?,
        );
        let cq_a = verbs::create_cq(inst, ca_a, 16, None, None).map_err(err("CQ"))?;
        let cq_b = verbs::create_cq(inst, ca_b, 16, None, None).map_err(err("CQ"))?;
        let (rtx, requests) = mpsc::channel();
        let rtx = std::sync::Mutex::new(rtx);
        let on_request: RdmaListenHandler = std::sync::Arc::new(move |_l, c, _ev| {
            let _ = rtx.lock().map(|t| t.send(c));
        });
        let (server_h, server) = channel();
        let listen = rdmacm::listen(inst, ca_b, at, PortSpace::Tcp, on_request, server_h)
            .map_err(err("listen"))?;
        let mut lat = Vec::with_capacity(connections);
        let t0 = Instant::now();
        for i in 0..connections {
            let qa = create_qp(inst, pd_a, QpCreate::new(QpType::Rc, cq_a)).map_err(err("QP"))?;
            let qb = create_qp(inst, pd_b, QpCreate::new(QpType::Rc, cq_b)).map_err(err("QP"))?;
            let (client_h, client) = channel();
            let start = Instant::now();
            let a =
                rdmacm::connect(inst, qa, &IpConnect::new(at), client_h).map_err(err("connect"))?;
            let b = requests
                .recv_timeout(WAIT)
                .map_err(|_| format!("connection {i}: no request within {WAIT:?}"))?;
            rdmacm::accept(inst, b, qb, &AcceptReply::default()).map_err(err("accept"))?;
            expect(&client, "ReplyReceived", i)?;
            rdmacm::rtu(inst, a, &[]).map_err(err("rtu"))?;
            expect(&client, "Established", i)?;
            expect(&server, "Established", i)?;
            lat.push(start.elapsed().as_secs_f64() * 1e6);
            rdmacm::disconnect(inst, a, &[]).map_err(err("disconnect"))?;
            expect(&server, "DisconnectRequest", i)?;
            rdmacm::disconnect_reply(inst, b, &[]).map_err(err("disconnect_reply"))?;
            expect(&client, "Released", i)?;
            expect(&server, "Released", i)?;
            al.destroy_sync(qa).map_err(err("destroy QP"))?;
            al.destroy_sync(qb).map_err(err("destroy QP"))?;
        }
        let secs = t0.elapsed().as_secs_f64();
        al.destroy_sync(listen).map_err(err("destroy listen"))?;
        lat.sort_by(f64::total_cmp);
        Ok(RdmaConnReport {
            device: device.to_string(),
            connections,
            connect_median_us: lat[lat.len() / 2],
            connect_p99_us: lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
            cycles_per_sec: connections as f64 / secs,
        })
    })();
    let closed = al.close().map_err(|e| format!("closing the AL: {e}"))?;
    let report = result?;
    if closed.total_live() != 0 {
        return Err(format!("objects leaked: {closed}"));
    }
    Ok(report)
}
