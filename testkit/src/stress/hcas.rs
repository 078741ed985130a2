//! The HCAs a stress run uses: soft HCAs on one fabric, or RoCEv2 ports
//! of one shared provider on loopback; their GUIDs, LIDs, addresses and
//! services.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hca::any::{AnyDevice, AnyProvider};
use ibal::roce::{DeviceConfig, PortConfig, RoceDevice, RoceProvider};
use ibal::verbs::{Fabric, HcaConfig};

/// Services per HCA that listens and connects choose from.
pub const SERVICES_PER_HCA: u64 = 4;

/// The service id `k` of HCA `hca`.
pub fn service_id(hca: usize, k: u64) -> u64 {
    0x5157_0000_0000_0000 | ((hca as u64) << 8) | k
}

/// Node GUID of HCA `i` of a stress fabric.
pub fn node_guid(i: usize) -> u64 {
    0x0002_c903_00e0_0001 + ((i as u64) << 20)
}

/// LID of the (single) port of HCA `i` of a stress fabric.
pub fn lid(i: usize) -> u16 {
    0x20 + i as u16
}

/// A fabric of `n` soft HCAs with one port each ([`node_guid`], [`lid`]),
/// each limited to `max_objects` of every counted kind when given.
pub fn fabric(n: usize, max_objects: Option<u32>) -> Fabric {
    let fabric = Fabric::new();
    for i in 0..n {
        let mut cfg = HcaConfig::new(node_guid(i), &[lid(i)]);
        cfg.name = format!("stress{i}");
        if let Some(m) = max_objects {
            let l = &mut cfg.limits;
            (l.max_pd, l.max_cq, l.max_qp) = (m, m, m);
            (l.max_srq, l.max_av, l.max_mr) = (m, m, m);
        }
        fabric
            .add_hca(cfg)
            .expect("invariant: distinct GUIDs and LIDs");
    }
    fabric
}

/// What the HCAs of a run are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Soft HCAs on one [`Fabric`], with its CM fault injection.
    #[default]
    Soft,
    /// RoCEv2 ports of one [`RoceProvider`] on loopback: HCA `i` is a
    /// device with one port on 127.0.0.(i + 1), ephemeral UDP port; every
    /// CM MAD and packet goes through the kernel's UDP. No fault injection
    /// (the fabric's faults are soft-only), no device limits but `max_qp`.
    Udp,
}

impl Transport {
    /// `soft` or `udp`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Soft => "soft",
            Transport::Udp => "udp",
        }
    }
}

/// The address of HCA `i`'s RoCEv2 port ([`Transport::Udp`]).
pub fn udp_addr(i: usize) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1 + i as u8))
}

/// The GID a connect or SIDR request of the run names HCA `i` by (soft:
/// none, the LID does; udp: its port's address).
pub fn gid_of_hca(transport: Transport, i: usize) -> Option<[u8; 16]> {
    (transport == Transport::Udp).then(|| ibal::roce::gid_of(udp_addr(i)))
}

/// A [`RoceProvider`] whose devices are opened once and shared: a RoCE
/// device refuses a second open (it owns its UDP socket), while the stress
/// opens every HCA in many ALs at once, as the soft provider allows. Each
/// `open_ca` gets a handle to the one open device (the CM keys its agents
/// by device instance, so the CAs of one HCA share one agent, as with soft
/// HCAs). The devices stay open until the provider is dropped.
pub struct SharedRoce {
    inner: RoceProvider,
    open: Mutex<HashMap<u64, RoceDevice>>,
}

impl SharedRoce {
    /// `n` devices ([`node_guid`]) with one port each on [`udp_addr`],
    /// each allowing `max_qp` QPs when given.
    pub fn new(n: usize, max_qp: Option<u32>) -> SharedRoce {
        let devices = (0..n)
            .map(|i| {
                let port = PortConfig::new(std::net::SocketAddr::new(udp_addr(i), 0));
                let mut d = DeviceConfig::new(format!("stress-roce{i}"), node_guid(i), vec![port]);
                if let Some(m) = max_qp {
                    d.limits.max_qp = m;
                }
                d
            })
            .collect();
        SharedRoce {
            inner: RoceProvider::new(devices),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The open device of HCA `i`, if any CA opened it.
    pub fn device(&self, i: usize) -> Option<RoceDevice> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&node_guid(i)).cloned()
    }
}

impl AnyProvider for SharedRoce {
    fn open_any(&self, guid: u64) -> al::Result<AnyDevice> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = open.get(&guid) {
            return Ok(d.clone().into());
        }
        let d = provider::Provider::open(&self.inner, guid)?;
        open.insert(guid, d.clone());
        Ok(d.into())
    }
}

/// The provider the workers open CAs from.
pub type AnyShared = Arc<dyn AnyProvider + Send + Sync>;
