//! The conformance suite against a real RDMA device through libibverbs
//! (`rdma-provider`, feature `rdma`): both sides are the same device,
//! opened twice (two contexts, as two processes would), looping back on
//! one port, as `ibv_rc_pingpong` does with both ends on one host.
//!
//! The device is `IBAL_RDMA_DEVICE` (a name such as `rxe0`) or the first
//! one listed; the GID is `IBAL_RDMA_GID_INDEX` or, on an Ethernet port,
//! the first IPv4-mapped GID (RoCEv2 over IPv4), else index 0. With no
//! device every check prints why and passes without running: the suite
//! runs for real in the rxe VM (`.ci/rdma-vm.sh`).
#![cfg(feature = "rdma")]

use std::time::Duration;

use hca::{Device, LinkLayer, Provider};
use ibal_conformance::{Endpoint, Fixture, Side};
use rdma_provider::{RdmaDevice, RdmaProvider};

struct RdmaFixture {
    a: RdmaDevice,
    b: RdmaDevice,
    port: u8,
    gid_index: u8,
    lid_routed: bool,
}

/// Why there is no fixture here, or the device to use.
fn pick_device(provider: &RdmaProvider) -> Result<hca::DeviceInfo, String> {
    let listed = provider.list().map_err(|e| e.to_string())?;
    let wanted = std::env::var("IBAL_RDMA_DEVICE").ok();
    match &wanted {
        Some(name) => listed
            .iter()
            .find(|d| &d.name == name)
            .cloned()
            .ok_or_else(|| format!("IBAL_RDMA_DEVICE={name} is not among {listed:?}")),
        None => listed
            .first()
            .cloned()
            .ok_or_else(|| "no RDMA devices found (ibv_get_device_list listed none)".to_string()),
    }
}

impl RdmaFixture {
    fn new() -> Option<RdmaFixture> {
        let provider = RdmaProvider::new();
        let info = match pick_device(&provider) {
            Ok(d) => d,
            Err(why) => {
                // A missing device is a skip only when none was asked for.
                assert!(
                    std::env::var("IBAL_RDMA_DEVICE").is_err(),
                    "the device asked for is not there: {why}"
                );
                eprintln!("rdma conformance skipped: {why}");
                return None;
            }
        };
        let a = provider.open(info.node_guid).expect("open side A");
        let b = provider.open(info.node_guid).expect("open side B");
        let port = 1;
        let attr = a.query_port(port).expect("query port 1");
        let gid_index = match std::env::var("IBAL_RDMA_GID_INDEX") {
            Ok(v) => v.parse().expect("IBAL_RDMA_GID_INDEX is a number"),
            Err(_) if attr.link_layer == LinkLayer::Ethernet => attr
                .gid_table
                .iter()
                .position(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
                .unwrap_or(0) as u8,
            Err(_) => 0,
        };
        Some(RdmaFixture {
            a,
            b,
            port,
            gid_index,
            lid_routed: attr.link_layer == LinkLayer::InfiniBand,
        })
    }
}

impl Fixture for RdmaFixture {
    type Device = RdmaDevice;

    fn device(&self, side: Side) -> &RdmaDevice {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    fn endpoint(&self, side: Side) -> Endpoint {
        let port = self.device(side).query_port(self.port).unwrap();
        Endpoint {
            port: self.port,
            lid: self.lid_routed.then_some(port.lid),
            gid: port.gid_table[usize::from(self.gid_index)],
            gid_index: self.gid_index,
        }
    }

    /// The device makes progress on its own; waiting only yields.
    fn progress(&self) {
        std::thread::sleep(Duration::from_micros(50));
    }

    fn supports_lid_routing(&self) -> bool {
        self.lid_routed
    }

    /// `ibv_wc` has no solicited flag.
    fn reports_solicited(&self) -> bool {
        false
    }

    /// libibverbs posts a READ or atomic whatever `max_rd_atomic` is;
    /// Linux rxe then never sends it.
    fn refuses_rd_atomic_without_max_rd_atomic(&self) -> bool {
        false
    }

    /// Linux rxe under an emulated CPU (the CI's VM) is slow, and its
    /// retry timers are in the hundreds of milliseconds.
    fn deadline(&self) -> Duration {
        Duration::from_secs(15)
    }
}

ibal_conformance::suite!(rdma, RdmaFixture::new, skip_when_absent);

/// The in-flight rule of `docs/memory.md` on a device: a posted
/// receive's bytes refuse application writes until its completion has
/// been polled, and a send's until its (or a later send's) completion.
#[test]
fn posted_bytes_are_leased_until_polled() {
    use hca::{QpType, SendOp, SendWr, WcOpcode};
    use ibal_conformance::harness::{ok, pair, two, ALL};

    let Some(f) = RdmaFixture::new() else {
        return;
    };
    let (a, b) = two(&f);
    let (qa, qb) = pair(&a, &b, QpType::Rc, ALL);
    let am = a.mem(64, 1, ALL);
    let bm = b.mem(64, 0, ALL);
    b.recv(&qb, 7, &[bm.sge(0, 16)]);
    b.recv(&qb, 8, &[]);
    assert!(
        matches!(bm.buf.write(0, &[9]), Err(al::Error::ResourceBusy(_))),
        "a posted receive's bytes are leased"
    );
    bm.buf
        .write(32, &[9])
        .expect("bytes no request names are free");
    a.send(
        &qa,
        SendWr::new(1, SendOp::Send, &[am.sge(0, 16)]).unsignaled(),
    );
    a.send(&qa, SendWr::new(2, SendOp::Send, &[am.sge(16, 0)]));
    ok(&b.wait_recv(), 7, WcOpcode::Recv, 16);
    bm.buf
        .write(0, &[9])
        .expect("released once its completion is polled");
    ok(&a.wait_send(), 2, WcOpcode::Send, 0);
    ok(&b.wait_recv(), 8, WcOpcode::Recv, 0);
    am.buf
        .write(0, &[9])
        .expect("an unsignaled send is released by the later completion");
    assert_eq!((am.buf.in_flight(), bm.buf.in_flight()), (0, 0));
}
