//! Conversions from what libibverbs reports to the provider interface's
//! types, and from errno values to [`al::Error`].
//!
//! Nothing here calls libibverbs: the inputs are plain numbers as
//! `<infiniband/verbs.h>` defines them ([`RawDeviceAttr`], [`RawPortAttr`],
//! the `IBV_*` codes below), filled in by the FFI layer when the `rdma`
//! feature is on. So this module builds and is tested on every machine,
//! with or without rdma-core; with the feature on, a test checks each code
//! against the value rdma-sys generated from the installed headers.

use al::{Error, Result};
use provider::{
    Access, AtomicCap, AvAttr, DeviceAttr, GrhAttr, LinkLayer, MigState, Mtu, PortAttr, PortState,
    QpAttr, QpCaps, QpModify, QpState, QpType, SendOp, Wc, WcOpcode, WcStatus,
};

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

/// `enum ibv_wc_opcode` (`verbs.h`).
pub mod wc_opcode {
    /// `IBV_WC_SEND`.
    pub const SEND: u32 = 0;
    /// `IBV_WC_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 1;
    /// `IBV_WC_RDMA_READ`.
    pub const RDMA_READ: u32 = 2;
    /// `IBV_WC_COMP_SWAP`.
    pub const COMP_SWAP: u32 = 3;
    /// `IBV_WC_FETCH_ADD`.
    pub const FETCH_ADD: u32 = 4;
    /// `IBV_WC_RECV`.
    pub const RECV: u32 = 128;
    /// `IBV_WC_RECV_RDMA_WITH_IMM`.
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_flags` bits (`verbs.h`).
pub mod wc_flags {
    /// `IBV_WC_GRH`: a GRH is in the first 40 bytes of the buffer.
    pub const GRH: u32 = 1;
    /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
    pub const WITH_IMM: u32 = 2;
}

/// `enum ibv_wr_opcode` (`verbs.h`).
pub mod wr_opcode {
    /// `IBV_WR_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 0;
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// `IBV_WR_SEND`.
    pub const SEND: u32 = 2;
    /// `IBV_WR_SEND_WITH_IMM`.
    pub const SEND_WITH_IMM: u32 = 3;
    /// `IBV_WR_RDMA_READ`.
    pub const RDMA_READ: u32 = 4;
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
}

/// `enum ibv_send_flags` bits (`verbs.h`).
pub mod send_flags {
    /// `IBV_SEND_SIGNALED`.
    pub const SIGNALED: u32 = 2;
    /// `IBV_SEND_SOLICITED`.
    pub const SOLICITED: u32 = 4;
}

/// `enum ibv_qp_state` (`verbs.h`).
pub mod qp_state_code {
    /// `IBV_QPS_RESET`.
    pub const RESET: u32 = 0;
    /// `IBV_QPS_INIT`.
    pub const INIT: u32 = 1;
    /// `IBV_QPS_RTR`.
    pub const RTR: u32 = 2;
    /// `IBV_QPS_RTS`.
    pub const RTS: u32 = 3;
    /// `IBV_QPS_SQD`.
    pub const SQD: u32 = 4;
    /// `IBV_QPS_SQE`.
    pub const SQE: u32 = 5;
    /// `IBV_QPS_ERR`.
    pub const ERR: u32 = 6;
}

/// `enum ibv_qp_type` (`verbs.h`): the three this provider creates.
pub mod qp_type_code {
    /// `IBV_QPT_RC`.
    pub const RC: u32 = 2;
    /// `IBV_QPT_UC`.
    pub const UC: u32 = 3;
    /// `IBV_QPT_UD`.
    pub const UD: u32 = 4;
}

/// `enum ibv_qp_attr_mask` bits (`verbs.h`), in the order of the header.
pub mod qp_mask {
    /// `IBV_QP_STATE`.
    pub const STATE: u32 = 1 << 0;
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: u32 = 1 << 1;
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// `IBV_QP_PORT`.
    pub const PORT: u32 = 1 << 5;
    /// `IBV_QP_QKEY`.
    pub const QKEY: u32 = 1 << 6;
    /// `IBV_QP_AV`.
    pub const AV: u32 = 1 << 7;
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: u32 = 1 << 8;
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: u32 = 1 << 9;
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: u32 = 1 << 12;
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// `IBV_QP_ALT_PATH`.
    pub const ALT_PATH: u32 = 1 << 14;
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: u32 = 1 << 16;
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// `IBV_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// `IBV_QP_CAP`.
    pub const CAP: u32 = 1 << 19;
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: u32 = 1 << 20;
    /// Every attribute `ibv_query_qp` is asked for.
    pub const QUERY_ALL: u32 = (1 << 21) - 1;
}

/// A QP state as its `ibv_qp_state` code.
pub fn qp_state_code(s: QpState) -> u32 {
    use qp_state_code::*;
    match s {
        QpState::Reset => RESET,
        QpState::Init => INIT,
        QpState::Rtr => RTR,
        QpState::Rts => RTS,
        QpState::Sqd => SQD,
        QpState::Sqe => SQE,
        QpState::Err => ERR,
    }
}

/// An `ibv_qp_state` code as a [`QpState`]; `None` for a code the
/// provider interface has no state for (`IBV_QPS_UNKNOWN`).
pub fn qp_state_from_code(code: u32) -> Option<QpState> {
    use qp_state_code::*;
    Some(match code {
        RESET => QpState::Reset,
        INIT => QpState::Init,
        RTR => QpState::Rtr,
        RTS => QpState::Rts,
        SQD => QpState::Sqd,
        SQE => QpState::Sqe,
        ERR => QpState::Err,
        _ => return None,
    })
}

/// The `ibv_qp_type` of an RC, UC or UD QP; `None` for GSI (QP1 belongs
/// to the kernel on a real device).
pub fn qp_type_code(t: QpType) -> Option<u32> {
    match t {
        QpType::Rc => Some(qp_type_code::RC),
        QpType::Uc => Some(qp_type_code::UC),
        QpType::Ud => Some(qp_type_code::UD),
        _ => None,
    }
}

/// `enum ibv_mig_state` codes, in the header's order.
pub fn mig_state_code(m: MigState) -> u32 {
    match m {
        MigState::Migrated => 0,
        MigState::Rearm => 1,
        MigState::Armed => 2,
    }
}

/// An `ibv_mig_state` code; unknown codes read as migrated.
pub fn mig_state_from_code(code: u32) -> MigState {
    match code {
        1 => MigState::Rearm,
        2 => MigState::Armed,
        _ => MigState::Migrated,
    }
}

/// `struct ibv_ah_attr` as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawAh {
    /// `grh.dgid`.
    pub dgid: [u8; 16],
    /// `grh.flow_label`.
    pub flow_label: u32,
    /// `grh.sgid_index`.
    pub sgid_index: u8,
    /// `grh.hop_limit`.
    pub hop_limit: u8,
    /// `grh.traffic_class`.
    pub traffic_class: u8,
    /// `dlid`.
    pub dlid: u16,
    /// `sl`.
    pub sl: u8,
    /// `src_path_bits`.
    pub src_path_bits: u8,
    /// `static_rate`.
    pub static_rate: u8,
    /// `is_global`: the GRH fields are used.
    pub is_global: bool,
    /// `port_num`.
    pub port: u8,
}

/// An address vector as `ibv_ah_attr`.
pub fn raw_ah(av: &AvAttr) -> RawAh {
    let mut r = RawAh {
        dlid: av.dlid,
        sl: av.sl,
        src_path_bits: av.src_path_bits,
        static_rate: av.static_rate,
        port: av.port,
        ..RawAh::default()
    };
    if let Some(g) = av.grh {
        r.is_global = true;
        r.dgid = g.dgid;
        r.flow_label = g.flow_label;
        r.sgid_index = g.sgid_index;
        r.hop_limit = g.hop_limit;
        r.traffic_class = g.traffic_class;
    }
    r
}

/// `ibv_ah_attr` as an address vector; `None` when it names nothing (no
/// port: a QP before RTR, or a datagram QP).
pub fn av_from_raw(r: &RawAh) -> Option<AvAttr> {
    if r.port == 0 {
        return None;
    }
    Some(AvAttr {
        port: r.port,
        dlid: r.dlid,
        sl: r.sl,
        src_path_bits: r.src_path_bits,
        static_rate: r.static_rate,
        grh: r.is_global.then_some(GrhAttr {
            dgid: r.dgid,
            sgid_index: r.sgid_index,
            flow_label: r.flow_label,
            hop_limit: r.hop_limit,
            traffic_class: r.traffic_class,
        }),
    })
}

/// `struct ibv_qp_attr` as plain data (the fields this provider uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawQpAttr {
    /// `qp_state`.
    pub state: u32,
    /// `cur_qp_state`.
    pub cur_state: u32,
    /// `path_mtu` (an `ibv_mtu` code).
    pub path_mtu: u32,
    /// `path_mig_state`.
    pub mig_state: u32,
    /// `qkey`.
    pub qkey: u32,
    /// `rq_psn`.
    pub rq_psn: u32,
    /// `sq_psn`.
    pub sq_psn: u32,
    /// `dest_qp_num`.
    pub dest_qpn: u32,
    /// `qp_access_flags` (the same bits as [`Access`]).
    pub access: u32,
    /// `cap.max_send_wr`, `max_recv_wr`, `max_send_sge`, `max_recv_sge`.
    pub caps: [u32; 4],
    /// `ah_attr`.
    pub ah: RawAh,
    /// `alt_ah_attr`.
    pub alt_ah: RawAh,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: u8,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `port_num`.
    pub port: u8,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `alt_port_num`.
    pub alt_port: u8,
    /// `alt_timeout`.
    pub alt_timeout: u8,
}

/// A modify request as `ibv_modify_qp`'s attributes and mask: each given
/// attribute sets its field and its `IBV_QP_*` bit, nothing else is set.
/// An alternate path also sets `alt_port_num` and `alt_timeout` (the
/// latter from `timeout` when given), which `IBV_QP_ALT_PATH` covers.
pub fn modify_to_raw(m: &QpModify) -> (RawQpAttr, u32) {
    use qp_mask::*;
    let mut r = RawQpAttr {
        state: qp_state_code(m.state),
        ..RawQpAttr::default()
    };
    let mut mask = STATE;
    if let Some(s) = m.cur_state {
        r.cur_state = qp_state_code(s);
        mask |= CUR_STATE;
    }
    if let Some(v) = m.pkey_index {
        r.pkey_index = v;
        mask |= PKEY_INDEX;
    }
    if let Some(v) = m.port {
        r.port = v;
        mask |= PORT;
    }
    if let Some(v) = m.qkey {
        r.qkey = v;
        mask |= QKEY;
    }
    if let Some(v) = m.access {
        r.access = v.bits();
        mask |= ACCESS_FLAGS;
    }
    if let Some(av) = &m.av {
        r.ah = raw_ah(av);
        mask |= AV;
    }
    if let Some(av) = &m.alt_av {
        r.alt_ah = raw_ah(av);
        r.alt_port = av.port;
        r.alt_timeout = m.timeout.unwrap_or(0);
        mask |= ALT_PATH;
    }
    if let Some(v) = m.path_mtu {
        r.path_mtu = mtu_code(v);
        mask |= PATH_MTU;
    }
    if let Some(v) = m.dest_qpn {
        r.dest_qpn = v;
        mask |= DEST_QPN;
    }
    if let Some(v) = m.rq_psn {
        r.rq_psn = v;
        mask |= RQ_PSN;
    }
    if let Some(v) = m.sq_psn {
        r.sq_psn = v;
        mask |= SQ_PSN;
    }
    if let Some(v) = m.max_dest_rd_atomic {
        r.max_dest_rd_atomic = v;
        mask |= MAX_DEST_RD_ATOMIC;
    }
    if let Some(v) = m.max_rd_atomic {
        r.max_rd_atomic = v;
        mask |= MAX_QP_RD_ATOMIC;
    }
    if let Some(v) = m.min_rnr_timer {
        r.min_rnr_timer = v;
        mask |= MIN_RNR_TIMER;
    }
    if let Some(v) = m.timeout {
        r.timeout = v;
        mask |= TIMEOUT;
    }
    if let Some(v) = m.retry_cnt {
        r.retry_cnt = v;
        mask |= RETRY_CNT;
    }
    if let Some(v) = m.rnr_retry {
        r.rnr_retry = v;
        mask |= RNR_RETRY;
    }
    if let Some(v) = m.path_mig_state {
        r.mig_state = mig_state_code(v);
        mask |= PATH_MIG_STATE;
    }
    if let Some(v) = m.en_sqd_async_notify {
        r.en_sqd_async_notify = u8::from(v);
        mask |= EN_SQD_ASYNC_NOTIFY;
    }
    (r, mask)
}

/// What `ibv_query_qp` reported, as [`QpAttr`]. The QP number, type and
/// `sq_sig_all` come from creation (`ibv_query_qp` reports them through
/// the init attributes, which this provider already knows). A state code
/// the interface has no name for is `Other`, naming the code.
pub fn qp_attr_from_raw(
    r: &RawQpAttr,
    qpn: u32,
    qp_type: QpType,
    sq_sig_all: bool,
) -> Result<QpAttr> {
    let state = qp_state_from_code(r.state).ok_or_else(|| {
        Error::Other(format!("ibv_query_qp: unknown QP state code {}", r.state).into())
    })?;
    let connected = !qp_type.is_datagram();
    Ok(QpAttr {
        qpn,
        qp_type,
        state,
        caps: QpCaps {
            max_send_wr: r.caps[0],
            max_recv_wr: r.caps[1],
            max_send_sge: r.caps[2],
            max_recv_sge: r.caps[3],
        },
        sq_sig_all,
        pkey_index: r.pkey_index,
        port: r.port,
        qkey: r.qkey,
        access: Access::from_bits_retain(r.access),
        av: if connected { av_from_raw(&r.ah) } else { None },
        alt_av: if connected {
            av_from_raw(&r.alt_ah)
        } else {
            None
        },
        path_mig_state: mig_state_from_code(r.mig_state),
        path_mtu: mtu_from_code(r.path_mtu).unwrap_or(Mtu::Mtu256),
        dest_qpn: r.dest_qpn,
        rq_psn: r.rq_psn,
        sq_psn: r.sq_psn,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        max_rd_atomic: r.max_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
    })
}

/// `struct ibv_wc` as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawWc {
    /// `wr_id`.
    pub wr_id: u64,
    /// `status` (an `ibv_wc_status` code).
    pub status: u32,
    /// `opcode` (an `ibv_wc_opcode` code; libibverbs defines it only on
    /// success, providers usually set it anyway).
    pub opcode: u32,
    /// `byte_len`.
    pub byte_len: u32,
    /// `imm_data`, still in network order.
    pub imm_data_be: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `src_qp`.
    pub src_qp: u32,
    /// `wc_flags`.
    pub wc_flags: u32,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `slid`.
    pub slid: u16,
}

/// A completion as the provider interface's [`Wc`].
///
/// `ibv_wc` has no solicited flag (the verbs API reports solicitation
/// only through `ibv_req_notify_cq(cq, 1)`), so `solicited` is always
/// false. An opcode code without a meaning here (memory-window bind,
/// local invalidate, TSO) reads as `Send`, the send-side default.
pub fn wc_from_raw(r: &RawWc) -> Wc {
    use wc_opcode::*;
    let opcode = match r.opcode {
        RDMA_WRITE => WcOpcode::RdmaWrite,
        RDMA_READ => WcOpcode::RdmaRead,
        COMP_SWAP => WcOpcode::CompareSwap,
        FETCH_ADD => WcOpcode::FetchAdd,
        RECV => WcOpcode::Recv,
        RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    Wc {
        wr_id: r.wr_id,
        status: wc_status_from_code(r.status),
        opcode,
        byte_len: r.byte_len,
        imm: (r.wc_flags & wc_flags::WITH_IMM != 0).then(|| u32::from_be(r.imm_data_be)),
        qp_num: r.qp_num,
        src_qp: r.src_qp,
        slid: r.slid,
        pkey_index: r.pkey_index,
        grh: r.wc_flags & wc_flags::GRH != 0,
        solicited: false,
    }
}

/// A send operation as its `ibv_wr_opcode`.
pub fn wr_opcode_of(op: &SendOp) -> u32 {
    use wr_opcode::*;
    match op {
        SendOp::Send => SEND,
        SendOp::SendImm(_) => SEND_WITH_IMM,
        SendOp::Write { .. } => RDMA_WRITE,
        SendOp::WriteImm { .. } => RDMA_WRITE_WITH_IMM,
        SendOp::Read { .. } => RDMA_READ,
        SendOp::CompareSwap { .. } => ATOMIC_CMP_AND_SWP,
        SendOp::FetchAdd { .. } => ATOMIC_FETCH_AND_ADD,
    }
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
    fn modify_sets_exactly_the_given_attributes_and_their_mask_bits() {
        let (r, mask) = modify_to_raw(&QpModify::to(QpState::Init));
        assert_eq!(mask, qp_mask::STATE);
        assert_eq!(r.state, qp_state_code::INIT);
        let av = AvAttr {
            grh: Some(GrhAttr {
                dgid: [7; 16],
                sgid_index: 1,
                flow_label: 5,
                hop_limit: 64,
                traffic_class: 3,
            }),
            ..AvAttr::lid(1, 0x22)
        };
        let m = QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(0xab)
            .rq_psn(0x12_3456)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12);
        let (r, mask) = modify_to_raw(&m);
        use qp_mask::*;
        assert_eq!(
            mask,
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
        );
        assert_eq!(
            (
                r.state,
                r.path_mtu,
                r.dest_qpn,
                r.rq_psn,
                r.max_dest_rd_atomic,
                r.min_rnr_timer
            ),
            (qp_state_code::RTR, mtu::MTU_1024, 0xab, 0x12_3456, 1, 12)
        );
        assert_eq!(av_from_raw(&r.ah), Some(av));
        assert!(r.ah.is_global);
        let m = QpModify::to(QpState::Rts)
            .sq_psn(9)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(6)
            .max_rd_atomic(1)
            .access(Access::REMOTE_READ)
            .path_mig_state(MigState::Rearm)
            .cur_state(QpState::Rtr);
        let (r, mask) = modify_to_raw(&m);
        assert_eq!(
            mask,
            STATE
                | SQ_PSN
                | TIMEOUT
                | RETRY_CNT
                | RNR_RETRY
                | MAX_QP_RD_ATOMIC
                | ACCESS_FLAGS
                | PATH_MIG_STATE
                | CUR_STATE
        );
        assert_eq!(
            (
                r.sq_psn,
                r.timeout,
                r.retry_cnt,
                r.rnr_retry,
                r.max_rd_atomic,
                r.access
            ),
            (9, 14, 7, 6, 1, Access::REMOTE_READ.bits())
        );
        assert_eq!((r.mig_state, r.cur_state), (1, qp_state_code::RTR));
    }

    #[test]
    fn qp_states_round_trip_and_unknown_codes_are_errors() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert_eq!(qp_state_from_code(qp_state_code(s)), Some(s));
        }
        assert_eq!(qp_state_from_code(7), None);
        let raw = RawQpAttr {
            state: 7,
            ..RawQpAttr::default()
        };
        let e = qp_attr_from_raw(&raw, 5, QpType::Rc, false).unwrap_err();
        assert!(e.to_string().contains("code 7"), "{e}");
        assert_eq!(qp_type_code(QpType::Gsi), None);
    }

    #[test]
    fn query_result_keeps_paths_only_on_connected_qps() {
        let ah = raw_ah(&AvAttr::lid(1, 4));
        let raw = RawQpAttr {
            state: qp_state_code::RTS,
            path_mtu: mtu::MTU_2048,
            ah,
            caps: [1, 2, 3, 4],
            ..RawQpAttr::default()
        };
        let rc = qp_attr_from_raw(&raw, 9, QpType::Rc, true).unwrap();
        assert_eq!(rc.av, Some(AvAttr::lid(1, 4)));
        assert_eq!(rc.alt_av, None, "port 0: no alternate path loaded");
        assert_eq!(
            (rc.qpn, rc.state, rc.path_mtu),
            (9, QpState::Rts, Mtu::Mtu2048)
        );
        assert_eq!(rc.caps.max_recv_sge, 4);
        assert!(rc.sq_sig_all);
        let ud = qp_attr_from_raw(&raw, 9, QpType::Ud, false).unwrap();
        assert_eq!(ud.av, None);
    }

    #[test]
    fn completions_convert_opcodes_flags_and_immediates() {
        let wc = wc_from_raw(&RawWc {
            wr_id: 3,
            status: wc_status::SUCCESS,
            opcode: wc_opcode::RECV_RDMA_WITH_IMM,
            byte_len: 8,
            imm_data_be: 0x1234_5678u32.to_be(),
            wc_flags: wc_flags::WITH_IMM | wc_flags::GRH,
            qp_num: 7,
            src_qp: 8,
            pkey_index: 0,
            slid: 2,
        });
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm, Some(0x1234_5678));
        assert!(wc.grh);
        assert_eq!((wc.wr_id, wc.qp_num, wc.src_qp, wc.slid), (3, 7, 8, 2));
        let wc = wc_from_raw(&RawWc {
            opcode: wc_opcode::FETCH_ADD,
            status: wc_status::REM_ACCESS_ERR,
            imm_data_be: 5,
            ..RawWc::default()
        });
        assert_eq!(wc.opcode, WcOpcode::FetchAdd);
        assert_eq!(wc.status, WcStatus::RemoteAccessError);
        assert_eq!(wc.imm, None, "no WITH_IMM flag: no immediate");
        for (code, op) in [
            (wc_opcode::SEND, WcOpcode::Send),
            (wc_opcode::RDMA_WRITE, WcOpcode::RdmaWrite),
            (wc_opcode::RDMA_READ, WcOpcode::RdmaRead),
            (wc_opcode::COMP_SWAP, WcOpcode::CompareSwap),
            (wc_opcode::RECV, WcOpcode::Recv),
        ] {
            let wc = wc_from_raw(&RawWc {
                opcode: code,
                ..RawWc::default()
            });
            assert_eq!(wc.opcode, op);
        }
    }

    #[test]
    fn send_opcodes() {
        use wr_opcode::*;
        let rk = 1;
        assert_eq!(wr_opcode_of(&SendOp::Send), SEND);
        assert_eq!(wr_opcode_of(&SendOp::SendImm(1)), SEND_WITH_IMM);
        assert_eq!(
            wr_opcode_of(&SendOp::WriteImm {
                remote_addr: 0,
                rkey: rk,
                imm: 0
            }),
            RDMA_WRITE_WITH_IMM
        );
        assert_eq!(
            wr_opcode_of(&SendOp::FetchAdd {
                remote_addr: 0,
                rkey: rk,
                add: 0
            }),
            ATOMIC_FETCH_AND_ADD
        );
    }
}
