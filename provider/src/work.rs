//! Work requests and completions: plain data shared by every provider.
//! Memory is named by keys and addresses ([`Sge`]), never by references, as
//! on the wire.

/// One scatter/gather element: `length` bytes at `addr` in the memory
/// region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Address (MR-relative: the MR's `iova` plus an offset).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendImm(u32),
    /// RDMA WRITE to `remote_addr` in the remote MR named by `rkey`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data (consumes a remote receive).
    WriteImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local scatter list.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 8-byte compare-and-swap; the original value lands in the local SGE.
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value compared with.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// 8-byte fetch-and-add; the original value lands in the local SGE.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value added.
        add: u64,
    },
}

/// Datagram destination of a UD (or GSI) send.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a, A> {
    /// The address vector.
    pub av: &'a A,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (if its high bit is set, the sending QP's own
    /// Q_Key is used instead, as IBTA's controlled Q_Key rule says).
    pub remote_qkey: u32,
    /// P_Key index to send with (GSI only; other QPs use their own).
    pub pkey_index: u16,
}

/// A send work request. `A` is the provider's address-vector type.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a, A> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Gather list (for READ and atomics: scatter list for the result).
    pub sg_list: &'a [Sge],
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the solicited-event bit.
    pub solicited: bool,
    /// Destination for UD/GSI sends.
    pub ud: Option<UdDest<'a, A>>,
}

impl<'a, A> SendWr<'a, A> {
    /// A signaled work request.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            solicited: false,
            ud: None,
        }
    }
    /// Set the datagram destination.
    pub fn to(mut self, ud: UdDest<'a, A>) -> Self {
        self.ud = Some(ud);
        self
    }
    /// Set the solicited bit.
    pub fn solicited(mut self) -> Self {
        self.solicited = true;
        self
    }
    /// Do not complete on success.
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

/// Completion status (IBTA 11.6.2; `ib_wc_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// Success.
    #[default]
    Success,
    /// Local length error (message longer than the receive buffer, or too
    /// long for the transport).
    LocalLengthError,
    /// Local QP operation error (malformed work request).
    LocalQpOpError,
    /// Local protection error (bad lkey, bounds, PD or access right).
    LocalProtectionError,
    /// Work request flushed (QP in ERR, or SQE for sends).
    WrFlushError,
    /// Remote access error (bad rkey, bounds, PD or MR access right).
    RemoteAccessError,
    /// Remote invalid request (operation not allowed by the responder QP,
    /// message too long for the remote buffer, misaligned atomic).
    RemoteInvalidRequest,
    /// Remote operation error (the responder failed to complete it).
    RemoteOpError,
    /// Transport retries exhausted (no responder, PSN mismatch).
    RetryExceeded,
    /// RNR NAK retries exhausted (no receive posted at the responder).
    RnrRetryExceeded,
}

/// What a completion completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A send (with or without immediate).
    #[default]
    Send,
    /// An RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// A compare-and-swap.
    CompareSwap,
    /// A fetch-and-add.
    FetchAdd,
    /// A receive (a SEND arrived).
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A work completion (`ib_wc_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes written, including the 40-byte
    /// GRH area on UD).
    pub byte_len: u32,
    /// Immediate data, if any.
    pub imm: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Source LID (receives).
    pub slid: u16,
    /// P_Key index the packet matched (GSI receives).
    pub pkey_index: u16,
    /// A GRH is in the first 40 bytes of the buffer (UD receives).
    pub grh: bool,
    /// The sender set the solicited bit (receives).
    pub solicited: bool,
}

/// How to arm a CQ for notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CqArm {
    /// Notify on the next completion.
    NextCompletion,
    /// Notify on the next solicited receive or error completion.
    Solicited,
}
