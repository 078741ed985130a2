//! Device and port attributes: the `ibv_device_attr` and
//! `ibv_port_attr` fields libibverbs reports ([`RawDeviceAttr`],
//! [`RawPortAttr`]) and the codes they carry (MTU, port state, link layer,
//! atomic capability), as the provider interface's `DeviceAttr` and
//! `PortAttr`.

use al::Error;
use provider::{AtomicCap, DeviceAttr, LinkLayer, Mtu, PortAttr, PortState};

/// `enum ibv_mtu` codes (`IBV_MTU_256` .. `IBV_MTU_4096`).
pub mod mtu {
    /// `IBV_MTU_256`.
    pub const MTU_256: u32 = 1;
    /// `IBV_MTU_512`.
    pub const MTU_512: u32 = 2;
    /// `IBV_MTU_1024`.
    pub const MTU_1024: u32 = 3;
    /// `IBV_MTU_2048`.
    pub const MTU_2048: u32 = 4;
    /// `IBV_MTU_4096`.
    pub const MTU_4096: u32 = 5;
}

/// `enum ibv_port_state` codes.
pub mod port_state {
    /// `IBV_PORT_NOP`: no state change (a reserved value).
    pub const NOP: u32 = 0;
    /// `IBV_PORT_DOWN`.
    pub const DOWN: u32 = 1;
    /// `IBV_PORT_INIT`.
    pub const INIT: u32 = 2;
    /// `IBV_PORT_ARMED`.
    pub const ARMED: u32 = 3;
    /// `IBV_PORT_ACTIVE`.
    pub const ACTIVE: u32 = 4;
    /// `IBV_PORT_ACTIVE_DEFER`: active, with deferred link-down events.
    pub const ACTIVE_DEFER: u32 = 5;
}

/// The anonymous `IBV_LINK_LAYER_*` enum of `verbs.h` (`ibv_port_attr::link_layer`).
pub mod link_layer {
    /// `IBV_LINK_LAYER_UNSPECIFIED`: an old kernel that does not say; it
    /// means InfiniBand (as `ibv_devinfo` reads it).
    pub const UNSPECIFIED: u8 = 0;
    /// `IBV_LINK_LAYER_INFINIBAND`.
    pub const INFINIBAND: u8 = 1;
    /// `IBV_LINK_LAYER_ETHERNET` (RoCE).
    pub const ETHERNET: u8 = 2;
}

/// `enum ibv_atomic_cap` codes.
pub mod atomic_cap {
    /// `IBV_ATOMIC_NONE`.
    pub const NONE: u32 = 0;
    /// `IBV_ATOMIC_HCA`.
    pub const HCA: u32 = 1;
    /// `IBV_ATOMIC_GLOB`.
    pub const GLOB: u32 = 2;
}

/// The fields of `struct ibv_device_attr` the provider interface uses, in
/// host byte order (the GUIDs are big-endian in the C struct; the FFI
/// layer swaps them) and as the C types' values (`int` limits may be
/// negative in a broken report; they convert to 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawDeviceAttr {
    /// `fw_ver`, up to its NUL.
    pub fw_ver: String,
    /// `node_guid`, host order.
    pub node_guid: u64,
    /// `sys_image_guid`, host order.
    pub sys_image_guid: u64,
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// `vendor_id`.
    pub vendor_id: u32,
    /// `vendor_part_id`.
    pub vendor_part_id: u32,
    /// `hw_ver`.
    pub hw_ver: u32,
    /// `max_qp`.
    pub max_qp: i32,
    /// `max_qp_wr`.
    pub max_qp_wr: i32,
    /// `max_sge`.
    pub max_sge: i32,
    /// `max_cq`.
    pub max_cq: i32,
    /// `max_cqe`.
    pub max_cqe: i32,
    /// `max_mr`.
    pub max_mr: i32,
    /// `max_pd`.
    pub max_pd: i32,
    /// `max_qp_rd_atom`.
    pub max_qp_rd_atom: i32,
    /// `max_qp_init_rd_atom`.
    pub max_qp_init_rd_atom: i32,
    /// `atomic_cap` (an [`atomic_cap`] code).
    pub atomic_cap: u32,
    /// `max_ah`.
    pub max_ah: i32,
    /// `max_srq`.
    pub max_srq: i32,
    /// `max_srq_wr`.
    pub max_srq_wr: i32,
    /// `phys_port_cnt`.
    pub phys_port_cnt: u8,
}

/// The fields of `struct ibv_port_attr` the provider interface uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawPortAttr {
    /// `state` (a [`port_state`] code).
    pub state: u32,
    /// `max_mtu` (an [`mtu`] code).
    pub max_mtu: u32,
    /// `active_mtu` (an [`mtu`] code).
    pub active_mtu: u32,
    /// `gid_tbl_len`.
    pub gid_tbl_len: i32,
    /// `max_msg_sz`.
    pub max_msg_sz: u32,
    /// `pkey_tbl_len`.
    pub pkey_tbl_len: u16,
    /// `lid` (host order, as libibverbs reports it).
    pub lid: u16,
    /// `sm_lid`.
    pub sm_lid: u16,
    /// `lmc`.
    pub lmc: u8,
    /// `link_layer` (a [`link_layer`] code).
    pub link_layer: u8,
}

/// An `ibv_mtu` code as an [`Mtu`]; `None` for a code IBTA does not define.
pub fn mtu_from_code(code: u32) -> Option<Mtu> {
    Some(match code {
        mtu::MTU_256 => Mtu::Mtu256,
        mtu::MTU_512 => Mtu::Mtu512,
        mtu::MTU_1024 => Mtu::Mtu1024,
        mtu::MTU_2048 => Mtu::Mtu2048,
        mtu::MTU_4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// The `ibv_mtu` code of an [`Mtu`] (for modify-QP, later).
pub fn mtu_code(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => mtu::MTU_256,
        Mtu::Mtu512 => mtu::MTU_512,
        Mtu::Mtu1024 => mtu::MTU_1024,
        Mtu::Mtu2048 => mtu::MTU_2048,
        Mtu::Mtu4096 => mtu::MTU_4096,
    }
}

/// An `ibv_port_state` code as a [`PortState`]. `ACTIVE_DEFER` is active
/// (packets flow; only link-down events are deferred); `NOP` and unknown
/// codes read as down, the state in which nothing is promised.
pub fn port_state_from_code(code: u32) -> PortState {
    match code {
        port_state::INIT => PortState::Init,
        port_state::ARMED => PortState::Armed,
        port_state::ACTIVE | port_state::ACTIVE_DEFER => PortState::Active,
        _ => PortState::Down,
    }
}

/// An `IBV_LINK_LAYER_*` code as a [`LinkLayer`] (unspecified is
/// InfiniBand); `None` for a code `verbs.h` does not define.
pub fn link_layer_from_code(code: u8) -> Option<LinkLayer> {
    match code {
        link_layer::UNSPECIFIED | link_layer::INFINIBAND => Some(LinkLayer::InfiniBand),
        link_layer::ETHERNET => Some(LinkLayer::Ethernet),
        _ => None,
    }
}

/// An `ibv_atomic_cap` code as an [`AtomicCap`] (an unknown code promises
/// no atomics).
pub fn atomic_cap_from_code(code: u32) -> AtomicCap {
    match code {
        atomic_cap::HCA => AtomicCap::Hca,
        atomic_cap::GLOB => AtomicCap::Global,
        _ => AtomicCap::None,
    }
}

fn count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn small(v: i32) -> u8 {
    u8::try_from(v.max(0)).unwrap_or(u8::MAX)
}

/// Device attributes from `ibv_query_device`'s report. `name` is the
/// device's name (`ibv_get_device_name`); `max_msg_size` the smallest
/// `max_msg_sz` of its ports (the C device attributes have none).
pub fn device_attr(name: &str, raw: &RawDeviceAttr, max_msg_size: u32) -> DeviceAttr {
    DeviceAttr {
        name: name.to_string(),
        node_guid: raw.node_guid,
        vendor_id: raw.vendor_id,
        vendor_part_id: raw.vendor_part_id,
        hw_ver: raw.hw_ver,
        num_ports: raw.phys_port_cnt,
        max_qp: count(raw.max_qp),
        max_qp_wr: count(raw.max_qp_wr),
        max_sge: count(raw.max_sge),
        max_cq: count(raw.max_cq),
        max_cqe: count(raw.max_cqe),
        max_mr: count(raw.max_mr),
        max_mr_size: raw.max_mr_size,
        max_pd: count(raw.max_pd),
        max_srq: count(raw.max_srq),
        max_srq_wr: count(raw.max_srq_wr),
        max_av: count(raw.max_ah),
        max_qp_rd_atomic: small(raw.max_qp_rd_atom),
        max_qp_init_rd_atomic: small(raw.max_qp_init_rd_atom),
        atomic_cap: atomic_cap_from_code(raw.atomic_cap),
        max_msg_size,
    }
}

/// Port attributes from `ibv_query_port`'s report and the port's GID and
/// P_Key tables (`ibv_query_gid` / `ibv_query_pkey` for every index; the
/// P_Keys in host order). A GID entry that is all zeroes is an unused
/// slot; it stays, so that indices keep naming the same entries.
///
/// Fails with `Unsupported` when the report has an MTU or link layer code
/// `verbs.h` does not define (a driver newer than this code).
pub fn port_attr(
    port_num: u8,
    raw: &RawPortAttr,
    gid_table: Vec<provider::Gid>,
    pkey_table: Vec<u16>,
) -> al::Result<PortAttr> {
    let mtu = |what: &str, code: u32| {
        mtu_from_code(code).ok_or_else(|| {
            Error::Unsupported(
                format!("port {port_num}: {what} code {code} is not an IBTA MTU").into(),
            )
        })
    };
    Ok(PortAttr {
        port_num,
        state: port_state_from_code(raw.state),
        lid: raw.lid,
        lmc: raw.lmc,
        sm_lid: raw.sm_lid,
        gid_table,
        pkey_table,
        active_mtu: mtu("active MTU", raw.active_mtu)?,
        max_mtu: mtu("max MTU", raw.max_mtu)?,
        link_layer: link_layer_from_code(raw.link_layer).ok_or_else(|| {
            Error::Unsupported(
                format!(
                    "port {port_num}: link layer code {} is not one verbs.h defines",
                    raw.link_layer
                )
                .into(),
            )
        })?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_round_trip_and_unknown_codes_are_refused() {
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(mtu_from_code(mtu_code(m)), Some(m));
        }
        assert_eq!(mtu_from_code(mtu::MTU_1024).map(Mtu::bytes), Some(1024));
        assert_eq!(mtu_from_code(0), None);
        assert_eq!(mtu_from_code(6), None);
    }

    #[test]
    fn port_states_link_layers_and_atomics() {
        assert_eq!(port_state_from_code(port_state::DOWN), PortState::Down);
        assert_eq!(port_state_from_code(port_state::INIT), PortState::Init);
        assert_eq!(port_state_from_code(port_state::ARMED), PortState::Armed);
        assert_eq!(port_state_from_code(port_state::ACTIVE), PortState::Active);
        assert_eq!(
            port_state_from_code(port_state::ACTIVE_DEFER),
            PortState::Active
        );
        assert_eq!(port_state_from_code(port_state::NOP), PortState::Down);
        assert_eq!(port_state_from_code(99), PortState::Down);

        assert_eq!(
            link_layer_from_code(link_layer::UNSPECIFIED),
            Some(LinkLayer::InfiniBand)
        );
        assert_eq!(
            link_layer_from_code(link_layer::INFINIBAND),
            Some(LinkLayer::InfiniBand)
        );
        assert_eq!(
            link_layer_from_code(link_layer::ETHERNET),
            Some(LinkLayer::Ethernet)
        );
        assert_eq!(link_layer_from_code(3), None);

        assert_eq!(atomic_cap_from_code(atomic_cap::NONE), AtomicCap::None);
        assert_eq!(atomic_cap_from_code(atomic_cap::HCA), AtomicCap::Hca);
        assert_eq!(atomic_cap_from_code(atomic_cap::GLOB), AtomicCap::Global);
        assert_eq!(atomic_cap_from_code(7), AtomicCap::None);
    }

    fn raw_port() -> RawPortAttr {
        RawPortAttr {
            state: port_state::ACTIVE,
            max_mtu: mtu::MTU_4096,
            active_mtu: mtu::MTU_1024,
            gid_tbl_len: 2,
            max_msg_sz: 1 << 30,
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            link_layer: link_layer::ETHERNET,
        }
    }

    #[test]
    fn a_roce_port_converts_with_its_tables_in_index_order() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 0, 2, 1]);
        let p = port_attr(1, &raw_port(), vec![gid, [0; 16]], vec![0xffff]).unwrap();
        assert_eq!(p.port_num, 1);
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        assert_eq!(p.active_mtu, Mtu::Mtu1024);
        assert_eq!(p.max_mtu, Mtu::Mtu4096);
        assert_eq!(p.lid, 0);
        // The unused slot stays, so index 1 still names entry 1.
        assert_eq!(p.gid_table, vec![gid, [0; 16]]);
        assert_eq!(p.pkey_table, vec![0xffff]);
    }

    #[test]
    fn an_ib_port_keeps_its_lids() {
        let raw = RawPortAttr {
            lid: 0x12,
            sm_lid: 1,
            lmc: 2,
            link_layer: link_layer::INFINIBAND,
            state: port_state::ARMED,
            ..raw_port()
        };
        let p = port_attr(2, &raw, vec![], vec![]).unwrap();
        assert_eq!((p.port_num, p.lid, p.sm_lid, p.lmc), (2, 0x12, 1, 2));
        assert_eq!(p.link_layer, LinkLayer::InfiniBand);
        assert_eq!(p.state, PortState::Armed);
    }

    #[test]
    fn a_port_with_an_unknown_mtu_or_link_layer_is_refused_with_the_code() {
        let raw = RawPortAttr {
            active_mtu: 9,
            ..raw_port()
        };
        let e = port_attr(1, &raw, vec![], vec![]).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("active MTU code 9"), "{e}");
        let raw = RawPortAttr {
            link_layer: 7,
            ..raw_port()
        };
        let e = port_attr(1, &raw, vec![], vec![]).unwrap_err();
        assert!(e.to_string().contains("link layer code 7"), "{e}");
    }

    #[test]
    fn device_attributes_convert_and_negative_limits_read_as_zero() {
        let raw = RawDeviceAttr {
            fw_ver: "20.31.1014".into(),
            node_guid: 0x0c42_a103_0012_3456,
            sys_image_guid: 0x0c42_a103_0012_3456,
            max_mr_size: u64::MAX,
            vendor_id: 0x02c9,
            vendor_part_id: 4123,
            hw_ver: 0,
            max_qp: 131_072,
            max_qp_wr: 32_768,
            max_sge: 30,
            max_cq: 16_777_216,
            max_cqe: 4_194_303,
            max_mr: -1,
            max_pd: 8_388_608,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 1000,
            atomic_cap: atomic_cap::HCA,
            max_ah: i32::MAX,
            max_srq: 8_388_608,
            max_srq_wr: 32_767,
            phys_port_cnt: 1,
        };
        let a = device_attr("mlx5_0", &raw, 1 << 30);
        assert_eq!(a.name, "mlx5_0");
        assert_eq!(a.node_guid, 0x0c42_a103_0012_3456);
        assert_eq!(a.num_ports, 1);
        assert_eq!(a.max_qp, 131_072);
        assert_eq!(a.max_mr, 0);
        assert_eq!(a.max_av, i32::MAX as u32);
        assert_eq!(a.max_qp_rd_atomic, 16);
        assert_eq!(a.max_qp_init_rd_atomic, u8::MAX);
        assert_eq!(a.atomic_cap, AtomicCap::Hca);
        assert_eq!(a.max_msg_size, 1 << 30);
    }
}
