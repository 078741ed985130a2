//! Conversions from what libibverbs reports to the provider interface's
//! types, and from errno values to [`al::Error`].
//!
//! Nothing here calls libibverbs: the inputs are plain numbers as
//! `<infiniband/verbs.h>` defines them ([`RawDeviceAttr`], [`RawPortAttr`],
//! the `IBV_*` codes below), filled in by the FFI layer when the `rdma`
//! feature is on. So this module builds and is tested on every machine,
//! with or without rdma-core; with the feature on, a test checks each code
//! against the value rdma-sys generated from the installed headers.

use al::Error;
use provider::{AtomicCap, DeviceAttr, LinkLayer, Mtu, PortAttr, PortState, WcStatus};

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

/// `enum ibv_wc_status` codes.
pub mod wc_status {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `IBV_WC_LOC_LEN_ERR`.
    pub const LOC_LEN_ERR: u32 = 1;
    /// `IBV_WC_LOC_QP_OP_ERR`.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// `IBV_WC_LOC_EEC_OP_ERR`.
    pub const LOC_EEC_OP_ERR: u32 = 3;
    /// `IBV_WC_LOC_PROT_ERR`.
    pub const LOC_PROT_ERR: u32 = 4;
    /// `IBV_WC_WR_FLUSH_ERR`.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// `IBV_WC_MW_BIND_ERR`.
    pub const MW_BIND_ERR: u32 = 6;
    /// `IBV_WC_BAD_RESP_ERR`.
    pub const BAD_RESP_ERR: u32 = 7;
    /// `IBV_WC_LOC_ACCESS_ERR`.
    pub const LOC_ACCESS_ERR: u32 = 8;
    /// `IBV_WC_REM_INV_REQ_ERR`.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// `IBV_WC_REM_ACCESS_ERR`.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// `IBV_WC_REM_OP_ERR`.
    pub const REM_OP_ERR: u32 = 11;
    /// `IBV_WC_RETRY_EXC_ERR`.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// `IBV_WC_LOC_RDD_VIOL_ERR`.
    pub const LOC_RDD_VIOL_ERR: u32 = 14;
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    pub const REM_INV_RD_REQ_ERR: u32 = 15;
    /// `IBV_WC_REM_ABORT_ERR`.
    pub const REM_ABORT_ERR: u32 = 16;
    /// `IBV_WC_INV_EECN_ERR`.
    pub const INV_EECN_ERR: u32 = 17;
    /// `IBV_WC_INV_EEC_STATE_ERR`.
    pub const INV_EEC_STATE_ERR: u32 = 18;
    /// `IBV_WC_FATAL_ERR`.
    pub const FATAL_ERR: u32 = 19;
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    pub const RESP_TIMEOUT_ERR: u32 = 20;
    /// `IBV_WC_GENERAL_ERR`.
    pub const GENERAL_ERR: u32 = 21;
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

/// An `ibv_wc_status` code as a [`WcStatus`].
///
/// The provider interface has IBAL's ten statuses; libibverbs has more.
/// The others map to the nearest meaning: a memory-window bind, local
/// access or RDD violation is a local protection error; a bad response,
/// remote abort, fatal or general error is a remote operation error; an
/// EE-context error is a local QP operation error; a response timeout is
/// a transport retry exhaustion; an invalid RDMA READ request is a remote
/// invalid request. Unknown codes (newer rdma-core: tag matching) are
/// remote operation errors, never success.
pub fn wc_status_from_code(code: u32) -> WcStatus {
    use wc_status::*;
    match code {
        SUCCESS => WcStatus::Success,
        LOC_LEN_ERR => WcStatus::LocalLengthError,
        LOC_QP_OP_ERR | LOC_EEC_OP_ERR | INV_EECN_ERR | INV_EEC_STATE_ERR => {
            WcStatus::LocalQpOpError
        }
        LOC_PROT_ERR | MW_BIND_ERR | LOC_ACCESS_ERR | LOC_RDD_VIOL_ERR => {
            WcStatus::LocalProtectionError
        }
        WR_FLUSH_ERR => WcStatus::WrFlushError,
        REM_INV_REQ_ERR | REM_INV_RD_REQ_ERR => WcStatus::RemoteInvalidRequest,
        REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        RETRY_EXC_ERR | RESP_TIMEOUT_ERR => WcStatus::RetryExceeded,
        RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        _ => WcStatus::RemoteOpError,
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

/// The symbolic name of an errno value (`ENOSYS`), for the common ones.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::ENODATA => "ENODATA",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECANCELED => "ECANCELED",
        _ => return None,
    })
}

/// `call: <strerror> (errno N, NAME)`, the text every mapped error carries.
pub fn errno_text(call: &str, errno: i32) -> String {
    let desc = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; the errno is said once, below.
    let desc = desc
        .strip_suffix(&format!(" (os error {errno})"))
        .unwrap_or(&desc)
        .to_string();
    match errno_name(errno) {
        Some(name) => format!("{call}: {desc} (errno {errno}, {name})"),
        None => format!("{call}: {desc} (errno {errno})"),
    }
}

/// The [`al::Error`] for an rdma-core call `call` that failed with `errno`;
/// its message names the call and the errno ([`errno_text`]).
///
/// | errno | error |
/// |---|---|
/// | `EINVAL`, `EFAULT`, `ERANGE` | `InvalidParameter` |
/// | `ENOENT`, `ENODEV`, `ENXIO`, `ENODATA` | `NotFound` |
/// | `ENOMEM`, `EAGAIN`, `ENOSPC`, `EMFILE`, `ENFILE` | `InsufficientResources` |
/// | `EPERM`, `EACCES` | `InvalidPermission` |
/// | `EBUSY` | `ResourceBusy` |
/// | `ENOSYS`, `EOPNOTSUPP`, `EPROTONOSUPPORT` | `Unsupported` |
/// | `ETIMEDOUT` | `Timeout` |
/// | `ECANCELED` | `Canceled` |
/// | any other | `Other` |
///
/// `ENOMEM` is `InsufficientResources`, not `InsufficientMemory`: from a
/// verb it usually means a device table is full (QPs, MRs, pinned pages),
/// and `InsufficientMemory` carries no message to hold the errno.
pub fn errno_error(call: &str, errno: i32) -> Error {
    let text = errno_text(call, errno);
    match errno {
        libc::EINVAL | libc::EFAULT | libc::ERANGE => Error::InvalidParameter(text.into()),
        libc::ENOENT | libc::ENODEV | libc::ENXIO | libc::ENODATA => Error::NotFound(text.into()),
        libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::EMFILE | libc::ENFILE => {
            Error::InsufficientResources(text.into())
        }
        libc::EPERM | libc::EACCES => Error::InvalidPermission(text.into()),
        libc::EBUSY => Error::ResourceBusy(text.into()),
        libc::ENOSYS | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT => Error::Unsupported(text.into()),
        libc::ETIMEDOUT => Error::Timeout(text.into()),
        libc::ECANCELED => Error::Canceled(text.into()),
        _ => Error::Other(text.into()),
    }
}

/// The error for a verb of the provider interface this provider does not
/// implement yet (issue 16, deliver 1: PD, CQ, MR, SRQ, AV, QP).
pub fn not_yet(verb: &str) -> Error {
    Error::Unsupported(
        format!(
            "the rdma provider does not implement {verb} yet: it lists, opens and queries \
             devices and ports only (docs/rdma-provider.md)"
        )
        .into(),
    )
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

    #[test]
    fn every_wc_status_code_maps_and_only_success_is_success() {
        use wc_status::*;
        let exact = [
            (SUCCESS, WcStatus::Success),
            (LOC_LEN_ERR, WcStatus::LocalLengthError),
            (LOC_QP_OP_ERR, WcStatus::LocalQpOpError),
            (LOC_PROT_ERR, WcStatus::LocalProtectionError),
            (WR_FLUSH_ERR, WcStatus::WrFlushError),
            (REM_INV_REQ_ERR, WcStatus::RemoteInvalidRequest),
            (REM_ACCESS_ERR, WcStatus::RemoteAccessError),
            (REM_OP_ERR, WcStatus::RemoteOpError),
            (RETRY_EXC_ERR, WcStatus::RetryExceeded),
            (RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExceeded),
        ];
        for (code, status) in exact {
            assert_eq!(wc_status_from_code(code), status, "code {code}");
        }
        let nearest = [
            (LOC_EEC_OP_ERR, WcStatus::LocalQpOpError),
            (MW_BIND_ERR, WcStatus::LocalProtectionError),
            (BAD_RESP_ERR, WcStatus::RemoteOpError),
            (LOC_ACCESS_ERR, WcStatus::LocalProtectionError),
            (LOC_RDD_VIOL_ERR, WcStatus::LocalProtectionError),
            (REM_INV_RD_REQ_ERR, WcStatus::RemoteInvalidRequest),
            (REM_ABORT_ERR, WcStatus::RemoteOpError),
            (INV_EECN_ERR, WcStatus::LocalQpOpError),
            (INV_EEC_STATE_ERR, WcStatus::LocalQpOpError),
            (FATAL_ERR, WcStatus::RemoteOpError),
            (RESP_TIMEOUT_ERR, WcStatus::RetryExceeded),
            (GENERAL_ERR, WcStatus::RemoteOpError),
        ];
        for (code, status) in nearest {
            assert_eq!(wc_status_from_code(code), status, "code {code}");
        }
        for code in 1..=64 {
            assert_ne!(wc_status_from_code(code), WcStatus::Success, "code {code}");
        }
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

    #[test]
    fn errnos_map_to_al_errors_that_name_the_call_and_the_errno() {
        let e = errno_error("ibv_get_device_list", libc::ENOSYS);
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "unsupported: ibv_get_device_list: Function not implemented (errno 38, ENOSYS)"
        );
        // By IBAL status name: InsufficientResources and the rest carry text.
        let cases = [
            (libc::EINVAL, "IB_INVALID_PARAMETER"),
            (libc::EFAULT, "IB_INVALID_PARAMETER"),
            (libc::ENOENT, "IB_NOT_FOUND"),
            (libc::ENODEV, "IB_NOT_FOUND"),
            (libc::ENXIO, "IB_NOT_FOUND"),
            (libc::ENOMEM, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EAGAIN, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EMFILE, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EPERM, "IB_INVALID_PERMISSION"),
            (libc::EACCES, "IB_INVALID_PERMISSION"),
            (libc::EBUSY, "IB_RESOURCE_BUSY"),
            (libc::EOPNOTSUPP, "IB_UNSUPPORTED"),
            (libc::ETIMEDOUT, "IB_TIMEOUT"),
            (libc::ECANCELED, "IB_CANCELED"),
            (libc::EIO, "IB_ERROR"),
        ];
        for (errno, status) in cases {
            let e = errno_error("ibv_create_qp", errno);
            assert_eq!(e.status(), status, "errno {errno}: {e:?}");
            let text = e.to_string();
            assert!(text.contains("ibv_create_qp: "), "{text}");
            assert!(text.contains(&format!("(errno {errno}")), "{text}");
            assert!(!text.contains("os error"), "{text}");
        }
        assert!(errno_text("x", 12345).ends_with("(errno 12345)"));
    }

    #[test]
    fn verbs_not_done_yet_say_so() {
        let e = not_yet("alloc_pd");
        assert!(matches!(e, Error::Unsupported(_)));
        assert!(
            e.to_string().contains("does not implement alloc_pd yet"),
            "{e}"
        );
    }
}
