//! Work requests as the transport keeps them: a send's ([`SendWqe`]) and
//! a receive's ([`RecvWqe`]), with their gather or scatter lists.

use al::sync::Arc;

use provider::{SendOp, Sge, WcOpcode, WcStatus};

use crate::psn;

/// A work request's gather or scatter list: most have one or two
/// entries, kept inline (a heap list per post was ~400 instructions of
/// allocation and free per message).
pub(crate) type SgList = smallvec::SmallVec<[Sge; 2]>;

/// Whether `op` is a READ or an atomic: completed by response data, not by
/// an ACK (and its local memory is written).
pub(crate) fn needs_response(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
    )
}

/// One send work request as the transport keeps it.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe<R> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: SgList,
    pub signaled: bool,
    pub solicited: bool,
    pub route: Option<R>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// The gathered message (SEND, WRITE), shared with the packets that
    /// carry it.
    pub data: Arc<Vec<u8>>,
    /// Message length in bytes.
    pub len: u32,
    /// First PSN and number of PSNs the message takes.
    pub first_psn: u32,
    pub npkts: u32,
    /// READ response packets received so far (READ).
    pub resp_pkts: u32,
    /// The packet index the READ request last sent starts at: a READ
    /// retried after `resp_pkts` responses asks only for the rest, and its
    /// responses are numbered first/middle/last from there.
    pub read_base: u32,
    /// Failed at post time with this status (completed in order).
    pub failed: Option<WcStatus>,
    /// Not copied at post: the memory leased `sges` ([`Memory::lease`])
    /// and each packet gathers its bytes when it is sent; the lease is
    /// given back when the request leaves the queue.
    pub leased: bool,
}

impl<R> SendWqe<R> {
    pub(crate) fn last_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts - 1)
    }
    /// A READ or an atomic: completed by response data, not by an ACK.
    pub(crate) fn needs_response(&self) -> bool {
        needs_response(&self.op)
    }
    pub(crate) fn contains(&self, p: u32) -> bool {
        let d = psn::diff(p, self.first_psn);
        d >= 0 && (d as u32) < self.npkts
    }
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            SendOp::Send | SendOp::SendImm(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// One receive work request.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: SgList,
}
