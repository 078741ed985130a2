//! The devices the tools run on: the embedded default fabric (two soft
//! HCAs: `ibal pingpong --loopback`, `ibal devinfo`, the verbs and CM
//! benchmarks) and, with the feature `rdma`, a machine's RDMA device by
//! name (the `--device` commands).

use ibal::verbs::{Fabric, HcaConfig, PortConfig, SoftProvider};

/// Node GUIDs of the two HCAs of the default fabric.
pub const DEFAULT_NODE_GUIDS: [u64; 2] = [0x0002_c903_00a0_0001, 0x0002_c903_00b0_0001];
/// LIDs of their (single) ports, in the same order.
pub const DEFAULT_LIDS: [u16; 2] = [1, 2];
/// Device names of the two HCAs, in the same order.
pub const DEFAULT_NAMES: [&str; 2] = ["soft0", "soft1"];

/// The embedded default fabric: two soft HCAs (`soft0`, `soft1`, node GUIDs
/// [`DEFAULT_NODE_GUIDS`]) with one active InfiniBand port each (LIDs
/// [`DEFAULT_LIDS`], port GUID = node GUID + 1, GID fe80::port GUID,
/// P_Key 0xffff, MTU 4096). Commands that need a fabric (devinfo, the
/// verbs benchmarks) build it here.
pub fn default_fabric() -> Fabric {
    let fabric = Fabric::new();
    for ((guid, lid), name) in DEFAULT_NODE_GUIDS
        .into_iter()
        .zip(DEFAULT_LIDS)
        .zip(DEFAULT_NAMES)
    {
        // HcaConfig::new gives port 1 the GUID node_guid + 1; PortConfig::new
        // makes it an active IB port with GID fe80::<port GUID>, P_Key
        // 0xffff and a 4096-byte MTU.
        let mut cfg = HcaConfig::new(guid, &[lid]);
        cfg.name = name.to_string();
        debug_assert_eq!(cfg.ports, vec![PortConfig::new(lid, guid + 1)]);
        fabric
            .add_hca(cfg)
            .expect("invariant: the default fabric's GUIDs and LIDs are distinct");
    }
    fabric
}

/// The soft provider over a fresh [`default_fabric`].
pub fn default_provider() -> SoftProvider {
    SoftProvider::new(default_fabric())
}

/// The node GUID of the RDMA device named `device` (`mlx5_0`, `rxe0`), for
/// the `--device` commands.
#[cfg(feature = "rdma")]
pub fn rdma_device_guid(provider: &ibal::rdma::RdmaProvider, device: &str) -> Result<u64, String> {
    provider
        .list()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|d| d.name == device)
        .map(|d| d.node_guid)
        .ok_or_else(|| format!("no RDMA device named {device} (ibal devinfo lists them)"))
}
