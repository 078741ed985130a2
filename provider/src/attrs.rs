//! Device, port and address attributes: what a device and its ports are
//! (limits, MTU, link layer, state), the access flags of memory, and the
//! address vector of a path.

/// A 128-bit global identifier (GID), in network byte order.
pub type Gid = [u8; 16];

/// The well-known Q_Key of the GSI QP (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default (full-member) P_Key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Size of a management datagram.
pub const MAD_SIZE: usize = 256;
/// Bytes at the start of every UD receive buffer reserved for the GRH.
pub const GRH_SIZE: usize = 40;

/// Memory and QP access rights.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No right beyond local read.
    pub const NONE: Access = Access(0);
    /// The HCA may write the memory locally (receive buffers, READ targets).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(4);
    /// Remote peers may perform atomics.
    pub const REMOTE_ATOMIC: Access = Access(8);

    /// Every right IBTA defines; any other bit is undefined.
    pub const DEFINED: Access = Access(0xf);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Build from raw bits; `None` if a bit names no right.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !Access::DEFINED.0 == 0 {
            Some(Access(bits))
        } else {
            None
        }
    }
    /// Build from raw bits, keeping undefined ones (as a decoder of
    /// foreign data must). Providers refuse such a value wherever it is
    /// given (MR registration, QP modify) with `InvalidParameter`.
    pub const fn from_bits_retain(bits: u32) -> Access {
        Access(bits)
    }
    /// The bits that name no right (0 for a valid value).
    pub const fn undefined_bits(self) -> u32 {
        self.0 & !Access::DEFINED.0
    }
    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Union.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_set();
        for (bit, name) in [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ] {
            if self.contains(bit) {
                s.entry(&name);
            }
        }
        s.finish()
    }
}

/// Path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The MTU in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The 4-bit code IBTA uses for it (1 = 256 ... 5 = 4096: PortInfo,
    /// the CM's path MTU fields; `ibv_mtu` has the same values).
    pub const fn ibta_code(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// The MTU an IBTA code names; `None` for the reserved codes.
    pub const fn from_ibta_code(code: u8) -> Option<Mtu> {
        match code {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// Logical port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up, not configured by the subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Active: packets flow.
    Active,
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
}

/// Atomic operation support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic with respect to this HCA's operations.
    Hca,
    /// Atomic with respect to the CPU too.
    Global,
}

/// Device attributes (`ib_ca_attr_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Device name.
    pub name: String,
    /// Node GUID.
    pub node_guid: u64,
    /// Vendor id (IEEE OUI).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Number of ports.
    pub num_ports: u8,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum number of SRQs.
    pub max_srq: u32,
    /// Maximum work requests per SRQ.
    pub max_srq_wr: u32,
    /// Maximum number of AVs.
    pub max_av: u32,
    /// Maximum outstanding RDMA reads/atomics per QP as responder.
    pub max_qp_rd_atomic: u8,
    /// Maximum outstanding RDMA reads/atomics per QP as initiator.
    pub max_qp_init_rd_atomic: u8,
    /// Atomic support.
    pub atomic_cap: AtomicCap,
    /// Largest message in bytes.
    pub max_msg_size: u32,
}

/// Port attributes (`ib_port_attr_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number (1-based).
    pub port_num: u8,
    /// Logical state.
    pub state: PortState,
    /// Base LID.
    pub lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// LID of the subnet manager.
    pub sm_lid: u16,
    /// GID table (index 0 is the port GID).
    pub gid_table: Vec<Gid>,
    /// P_Key table.
    pub pkey_table: Vec<u16>,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// Maximum MTU.
    pub max_mtu: Mtu,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// Global routing header fields of an address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// An address vector: where a packet goes (`ib_av_attr_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AvAttr {
    /// Local port to send from.
    pub port: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Global route; when present the destination is found by GID.
    pub grh: Option<GrhAttr>,
}

impl AvAttr {
    /// A LID-routed address vector.
    pub fn lid(port: u8, dlid: u16) -> AvAttr {
        AvAttr {
            port,
            dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            grh: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Mtu;

    #[test]
    fn mtu_codes_are_ibtas_and_round_trip() {
        let all = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ];
        for (i, m) in all.into_iter().enumerate() {
            assert_eq!(m.ibta_code(), i as u8 + 1);
            assert_eq!(m.bytes(), 256 << i);
            assert_eq!(Mtu::from_ibta_code(m.ibta_code()), Some(m));
        }
        for reserved in [0, 6, 15, 255] {
            assert_eq!(Mtu::from_ibta_code(reserved), None);
        }
    }
}
