//! The provider ([`RoceProvider`]): a configured list of devices, the
//! directory their ports share, and opening one.

use al::sync::Arc;
use std::collections::HashSet;
use std::net::SocketAddr;

use al::sync::Mutex;
use al::{Error, Result};
use provider::{DeviceInfo, Gid, Provider};

use crate::config::{DeviceConfig, Directory, ROCE_PORT};
use crate::device::RoceDevice;
use crate::shutdown;

/// and real peers are reached on 4791. [`RoceProvider::add_peer`] adds
/// entries by hand.
pub struct RoceProvider {
    devices: Vec<DeviceConfig>,
    directory: Arc<Directory>,
    open: Arc<Mutex<HashSet<u64>>>,
}

impl std::fmt::Debug for RoceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceProvider")
            .field("devices", &self.devices)
            .finish()
    }
}

impl RoceProvider {
    /// A provider offering these devices.
    pub fn new(devices: Vec<DeviceConfig>) -> RoceProvider {
        RoceProvider {
            devices,
            directory: Arc::new(Directory::default()),
            open: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Send datagrams for `gid` to `addr` (instead of the GID's IP at the
    /// port's `peer_udp_port`).
    pub fn add_peer(&self, gid: Gid, addr: SocketAddr) {
        self.directory.set(gid, addr);
    }

    /// Where datagrams for `gid` go now: the bound address of an open
    /// device's port with that GID, a peer added by hand, or the GID's IP
    /// at UDP 4791. (A device opened with UDP port 0 is found here.)
    pub fn address_of(&self, gid: &Gid) -> SocketAddr {
        self.directory.resolve(gid, ROCE_PORT)
    }
}

impl Provider for RoceProvider {
    type Device = RoceDevice;

    fn name(&self) -> &str {
        "roce"
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        self.devices
            .iter()
            .map(|d| DeviceInfo {
                name: d.name.clone(),
                node_guid: d.node_guid,
            })
            .collect()
    }

    fn open(&self, node_guid: u64) -> Result<RoceDevice> {
        let cfg = self
            .devices
            .iter()
            .find(|d| d.node_guid == node_guid)
            .ok_or_else(|| Error::NotFound(format!("RoCE device {node_guid:#x}").into()))?;
        // A device (this one, or another on the same fixed UDP port) whose
        // last handle just dropped may still be being reaped.
        let addrs: Vec<SocketAddr> = cfg.ports.iter().map(|p| p.addr).collect();
        shutdown::wait_closed(&addrs, shutdown::owner_of(&self.open), node_guid);
        if !self.open.lock().insert(node_guid) {
            return Err(Error::busy(format!(
                "RoCE device {node_guid:#x} is already open"
            )));
        }
        RoceDevice::open(cfg, self.directory.clone(), self.open.clone()).inspect_err(|_| {
            self.open.lock().remove(&node_guid);
        })
    }
}
