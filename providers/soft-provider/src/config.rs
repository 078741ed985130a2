//! What a user configures: ports, HCAs and their limits, fault injection,
//! the capture tap.

use provider::{Gid, LinkLayer, Mtu, PortState, DEFAULT_PKEY};

/// What [`Fabric::set_capture`](crate::Fabric::set_capture) hands each datagram to.
///
/// A std `Arc` on purpose: the application builds it (loom's `Arc` cannot
/// hold an unsized closure), and the provider only calls it.
pub type CaptureTap = std::sync::Arc<dyn Fn(&crate::packet::UdPacket) + Send + Sync>;

/// Key of a GSI QP in an HCA's QP table (above every 24-bit QPN).
pub(crate) const GSI_KEY: u32 = 0xff00_0000;

/// Configuration of one port of a soft HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Base LID (unique in the fabric, non-zero).
    pub lid: u16,
    /// GID table; index 0 is the port GID (unique in the fabric).
    pub gids: Vec<Gid>,
    /// P_Key table.
    pub pkeys: Vec<u16>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Initial state.
    pub state: PortState,
    /// Link layer (informational).
    pub link_layer: LinkLayer,
}

impl PortConfig {
    /// An active InfiniBand port with LID `lid`, GID fe80::`guid`, the
    /// default P_Key and a 4096-byte MTU.
    pub fn new(lid: u16, guid: u64) -> PortConfig {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[8..].copy_from_slice(&guid.to_be_bytes());
        PortConfig {
            lid,
            gids: vec![gid],
            pkeys: vec![DEFAULT_PKEY],
            mtu: Mtu::Mtu4096,
            state: PortState::Active,
            link_layer: LinkLayer::InfiniBand,
        }
    }
}

/// Configuration of a soft HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaConfig {
    /// Device name.
    pub name: String,
    /// Node GUID (unique in the fabric).
    pub node_guid: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Ports, numbered from 1.
    pub ports: Vec<PortConfig>,
    /// The object counts and sizes the HCA advertises ([`DeviceAttr`](provider::DeviceAttr)) and
    /// enforces; small values let tests reach them.
    pub limits: HcaLimits,
}

/// What a soft HCA advertises in its [`DeviceAttr`](provider::DeviceAttr) and enforces: creating
/// one object more than a `max_*` count allows fails with
/// `InsufficientResources` naming the limit (destroying one frees its
/// place); a size above a `max_*` size is `InvalidParameter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcaLimits {
    /// QPs, GSI QPs included (at most 2^24 - 2: QP numbers are 24 bits and
    /// 0 and 1 are the special QPs').
    pub max_qp: u32,
    /// Work requests per QP queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// CQs.
    pub max_cq: u32,
    /// Entries per CQ.
    pub max_cqe: u32,
    /// MRs (at most 2^24 - 1: the MR key needs 8 bits beside the slot).
    pub max_mr: u32,
    /// PDs.
    pub max_pd: u32,
    /// SRQs.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// AVs.
    pub max_av: u32,
}

impl Default for HcaLimits {
    fn default() -> Self {
        HcaLimits {
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_srq: 1 << 16,
            max_srq_wr: 1 << 14,
            max_av: 1 << 16,
        }
    }
}

/// Largest `max_qp`: every 24-bit QP number but 0 and 1.
pub(crate) const MAX_QPS: u32 = (1 << 24) - 2;

impl HcaConfig {
    /// An HCA with one port per LID in `lids`; port GUIDs are
    /// `node_guid + port number`.
    pub fn new(node_guid: u64, lids: &[u16]) -> HcaConfig {
        HcaConfig {
            name: format!("soft{node_guid:x}"),
            node_guid,
            vendor_id: 0,
            vendor_part_id: 0x50f7,
            ports: lids
                .iter()
                .enumerate()
                .map(|(i, &lid)| PortConfig::new(lid, node_guid.wrapping_add(i as u64 + 1)))
                .collect(),
            limits: HcaLimits::default(),
        }
    }
}

/// Fault injection for datagram (UD, GSI) and UC traffic. Probabilities
/// are in `0.0..=1.0`; decisions come from a generator seeded with `seed`,
/// so a run is reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Generator seed.
    pub seed: u64,
    /// Probability a packet is lost.
    pub drop: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet overtakes the one queued before it.
    pub reorder: f64,
    /// Probability a packet is held for 1..=`max_delay` progress calls.
    pub delay: f64,
    /// Longest delay in progress calls.
    pub max_delay: u32,
}

impl FaultConfig {
    /// Queue packets (deliver on [`Fabric::progress`](crate::Fabric::progress)) with no faults.
    pub fn queued(seed: u64) -> FaultConfig {
        FaultConfig {
            seed,
            ..FaultConfig::default()
        }
    }
}
