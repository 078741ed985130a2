//! The only module that calls libibverbs: each `unsafe` call is wrapped in
//! a small safe function or type with a `// SAFETY:` argument, and every
//! failure becomes an [`al::Error`] naming the call and its errno
//! ([`crate::convert::errno_error`]).
//!
//! * [`DeviceList`]: `ibv_get_device_list` / `ibv_free_device_list`; its
//!   entries ([`ListedDevice`]) borrow it, so no `ibv_device` pointer
//!   outlives the list.
//! * [`Context`]: `ibv_open_device` / `ibv_close_device`, and the queries
//!   (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`,
//!   `ibv_query_pkey`).
//!
//! **Thread safety.** Each wrapper is `Send` and `Sync` by an `unsafe
//! impl` with its own argument, all resting on what rdma-core documents
//! for libibverbs (`verbs(7)`, "thread safety"): every verb may be called
//! from any thread, on the same object too (the library and the driver
//! library lock what they share), as long as an object is destroyed once
//! and not used after. This provider never asks for the exceptions (a
//! thread domain, a single-threaded context). Destruction always takes
//! the wrapper by value or `&mut` (its `Drop`), and every parent is held
//! by its children's `Arc`s, so no object is destroyed while a verb runs
//! on it or on a child. The few fields read directly (`qp_num`, the MR's
//! keys, the fds) are fixed when the object is created.
//!
//! One file per kind of object: `device` (listing, opening, queries,
//! asynchronous events, and [`check`]), `cq`, `mr` (PDs and MRs), `ah`,
//! `qp` (QPs and SRQs). Sizable for FFI, but each file is one kind of
//! object's calls.
#![allow(unsafe_code)]

mod ah;
mod cq;
mod device;
mod mr;
mod qp;

pub(crate) use self::ah::Ah;
pub(crate) use self::cq::{poll_readable, CompChannel, Cq};
pub(crate) use self::device::{check, last_errno, Context, DeviceList, ListedDevice};
pub(crate) use self::mr::{Mr, Pd};
pub(crate) use self::qp::{raw_qp_attr_of, PostResult, Qp, QpCreate, SendReq, Srq};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::qp_mask;
    use crate::convert::{atomic_cap, link_layer, mtu, port_state, wc_status};
    use rdma_sys as ffi;
    use std::ffi::CStr;

    /// The codes of `convert` (written from `verbs.h`) are the values
    /// rdma-sys generated from the installed headers.
    #[test]
    fn convert_codes_match_the_installed_headers() {
        assert_eq!(mtu::MTU_256, ffi::ibv_mtu::IBV_MTU_256);
        assert_eq!(mtu::MTU_4096, ffi::ibv_mtu::IBV_MTU_4096);
        assert_eq!(port_state::NOP, ffi::ibv_port_state::IBV_PORT_NOP);
        assert_eq!(port_state::ACTIVE, ffi::ibv_port_state::IBV_PORT_ACTIVE);
        assert_eq!(
            port_state::ACTIVE_DEFER,
            ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER
        );
        assert_eq!(atomic_cap::GLOB, ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB);
        assert_eq!(wc_status::SUCCESS, ffi::ibv_wc_status::IBV_WC_SUCCESS);
        assert_eq!(
            wc_status::WR_FLUSH_ERR,
            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
        );
        assert_eq!(
            wc_status::RNR_RETRY_EXC_ERR,
            ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
        );
        assert_eq!(
            wc_status::GENERAL_ERR,
            ffi::ibv_wc_status::IBV_WC_GENERAL_ERR
        );
        // The link-layer codes are an anonymous enum rdma-sys does not
        // bind; their order in verbs.h is UNSPECIFIED, INFINIBAND, ETHERNET.
        assert_eq!(
            (
                link_layer::UNSPECIFIED,
                link_layer::INFINIBAND,
                link_layer::ETHERNET
            ),
            (0, 1, 2)
        );
    }

    /// The verbs codes of `convert` against the installed headers.
    #[test]
    fn verbs_codes_match_the_installed_headers() {
        use crate::convert::{
            qp_state_code, qp_type_code, send_flags, wc_flags, wc_opcode, wr_opcode,
        };
        assert_eq!(wc_opcode::SEND, ffi::ibv_wc_opcode::IBV_WC_SEND);
        assert_eq!(wc_opcode::FETCH_ADD, ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD);
        assert_eq!(wc_opcode::RECV, ffi::ibv_wc_opcode::IBV_WC_RECV);
        assert_eq!(
            wc_opcode::RECV_RDMA_WITH_IMM,
            ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
        );
        assert_eq!(wc_flags::GRH, ffi::ibv_wc_flags::IBV_WC_GRH.0);
        assert_eq!(wc_flags::WITH_IMM, ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0);
        assert_eq!(wr_opcode::RDMA_WRITE, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(
            wr_opcode::SEND_WITH_IMM,
            ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        );
        assert_eq!(
            wr_opcode::ATOMIC_FETCH_AND_ADD,
            ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD
        );
        assert_eq!(
            send_flags::SIGNALED,
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        );
        assert_eq!(
            send_flags::SOLICITED,
            ffi::ibv_send_flags::IBV_SEND_SOLICITED.0
        );
        assert_eq!(qp_state_code::ERR, ffi::ibv_qp_state::IBV_QPS_ERR);
        assert_eq!(qp_state_code::SQE, ffi::ibv_qp_state::IBV_QPS_SQE);
        assert_eq!(qp_type_code::UD, ffi::ibv_qp_type::IBV_QPT_UD);
        assert_eq!(qp_mask::STATE, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0);
        assert_eq!(qp_mask::ALT_PATH, ffi::ibv_qp_attr_mask::IBV_QP_ALT_PATH.0);
        assert_eq!(qp_mask::DEST_QPN, ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN.0);
        assert_eq!(
            qp_mask::MAX_DEST_RD_ATOMIC,
            ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
        );
        assert_eq!(
            provider::Access::REMOTE_ATOMIC.bits(),
            ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
        );
        assert_eq!(
            provider::Access::LOCAL_WRITE.bits(),
            ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        );
    }

    /// Our asynchronous event codes and names (`events`) against the
    /// installed headers and `ibv_event_type_str`.
    #[test]
    fn event_codes_and_names_match_the_installed_headers() {
        use crate::events::{event_code::*, event_name};
        use ffi::ibv_event_type as t;
        let codes = [
            (CQ_ERR, t::IBV_EVENT_CQ_ERR),
            (QP_FATAL, t::IBV_EVENT_QP_FATAL),
            (QP_REQ_ERR, t::IBV_EVENT_QP_REQ_ERR),
            (QP_ACCESS_ERR, t::IBV_EVENT_QP_ACCESS_ERR),
            (COMM_EST, t::IBV_EVENT_COMM_EST),
            (SQ_DRAINED, t::IBV_EVENT_SQ_DRAINED),
            (PATH_MIG, t::IBV_EVENT_PATH_MIG),
            (PATH_MIG_ERR, t::IBV_EVENT_PATH_MIG_ERR),
            (DEVICE_FATAL, t::IBV_EVENT_DEVICE_FATAL),
            (PORT_ACTIVE, t::IBV_EVENT_PORT_ACTIVE),
            (PORT_ERR, t::IBV_EVENT_PORT_ERR),
            (LID_CHANGE, t::IBV_EVENT_LID_CHANGE),
            (PKEY_CHANGE, t::IBV_EVENT_PKEY_CHANGE),
            (SM_CHANGE, t::IBV_EVENT_SM_CHANGE),
            (SRQ_ERR, t::IBV_EVENT_SRQ_ERR),
            (SRQ_LIMIT_REACHED, t::IBV_EVENT_SRQ_LIMIT_REACHED),
            (QP_LAST_WQE_REACHED, t::IBV_EVENT_QP_LAST_WQE_REACHED),
            (CLIENT_REREGISTER, t::IBV_EVENT_CLIENT_REREGISTER),
            (GID_CHANGE, t::IBV_EVENT_GID_CHANGE),
            (WQ_FATAL, t::IBV_EVENT_WQ_FATAL),
        ];
        for (ours, theirs) in codes {
            assert_eq!(ours, theirs as u32);
            // SAFETY: `ibv_event_type_str` returns a static string for
            // every code of the enum.
            let s = unsafe { CStr::from_ptr(ffi::ibv_event_type_str(theirs)) };
            assert_eq!(s.to_str().unwrap(), event_name(ours), "code {ours}");
        }
    }

    #[test]
    fn listing_never_panics_and_an_error_names_the_call() {
        match DeviceList::get() {
            Ok(list) => assert_eq!(list.iter().count(), list.len()),
            Err(errno) => assert!(errno > 0, "errno {errno}"),
        }
    }
}
