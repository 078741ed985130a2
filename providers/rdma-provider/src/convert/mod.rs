//! Conversions from what libibverbs reports to the provider interface's
//! types, and from errno values to [`al::Error`].
//!
//! Nothing here calls libibverbs: the inputs are plain numbers as
//! `<infiniband/verbs.h>` defines them ([`RawDeviceAttr`], [`RawPortAttr`],
//! the `IBV_*` codes), filled in by the FFI layer when the `rdma`
//! feature is on. So this module builds and is tested on every machine,
//! with or without rdma-core; with the feature on, a test checks each code
//! against the value rdma-sys generated from the installed headers.
//!
//! One file per job: `attrs` (device and port attributes), `qp` (QP
//! states, types, address handles, `ibv_qp_attr`), `wr` (work requests and
//! completions), `errno` (errno values as errors).

mod attrs;
mod errno;
mod qp;
mod wr;

pub use self::attrs::{
    atomic_cap, atomic_cap_from_code, device_attr, link_layer, link_layer_from_code, mtu, mtu_code,
    mtu_from_code, port_attr, port_state, port_state_from_code, RawDeviceAttr, RawPortAttr,
};
pub use self::errno::{errno_error, errno_name, errno_text};
pub use self::qp::{
    av_from_raw, mig_state_code, mig_state_from_code, modify_to_raw, qp_attr_from_raw, qp_mask,
    qp_state_code, qp_state_from_code, qp_type_code, raw_ah, RawAh, RawQpAttr,
};
pub use self::wr::{
    send_flags, wc_flags, wc_from_raw, wc_opcode, wc_status, wc_status_from_code, wr_opcode,
    wr_opcode_of, RawWc,
};
