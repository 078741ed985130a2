//! Work requests and completions: the send opcodes and flags a work
//! request carries, and the completions libibverbs reports ([`RawWc`]:
//! status, opcode and flags codes) as the provider interface's `Wc`.

use provider::{SendOp, Wc, WcOpcode, WcStatus};

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
