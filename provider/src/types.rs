//! The provider interface: what the object layer calls to reach a channel
//! adapter, independent of which provider (soft, rdma-core) implements it.
//!
//! # Shape
//!
//! A [`Provider`] lists devices and opens them; a [`Device`] performs the
//! verbs. Each verbs object (PD, CQ, MR, SRQ, AV, QP) is an *associated type*
//! of the device: an owned value, destroyed by passing it back to the
//! matching `destroy_*`/`dealloc_*`/`deregister_*` call (dropping it has the
//! same effect). The object layer wraps these values in its own objects
//! (handle table, lifecycle) and is generic over the device type; a build
//! that must choose a provider at run time wraps the devices in an enum.
//! Associated types rather than boxed trait objects keep the data path free
//! of downcasts and virtual calls.
//!
//! Work requests and completions ([`SendWr`], [`RecvWr`], [`Wc`]) are plain
//! data shared by every provider. Memory is named by keys and addresses
//! ([`Sge`]), never by references, as on the wire.
//!
//! Errors are [`al::Error`] with IBAL's meanings: a bad argument is
//! `InvalidParameter`, a verb in the wrong QP state `InvalidQpState`, a full
//! queue `InsufficientResources`, an unknown port `NotFound`.

use al::Result;

pub use crate::buffer::{RawRegion, RegisteredBuffer};
pub use crate::qp_state::{AttrSet, QpState, QpType};

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

/// Asynchronous events a provider raises.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A completion was lost because the CQ was full; the CQ is in error.
    CqOverflow {
        /// Number of completions lost so far.
        lost: u64,
    },
}

/// Called when an armed CQ gets a completion. Runs on whichever thread
/// produced the completion, with no provider lock held; it may call any
/// verb (re-arm, poll, post).
///
/// A `std` `Arc` even under the loom build: a hook is a plain callable,
/// not a synchronisation point, and loom's `Arc` cannot hold a `dyn`.
pub type CompletionHook = std::sync::Arc<dyn Fn() + Send + Sync>;
/// Called on an asynchronous error, with no provider lock held.
pub type AsyncHook = std::sync::Arc<dyn Fn(AsyncEvent) + Send + Sync>;

/// CQ creation parameters.
#[derive(Clone, Default)]
pub struct CqInit {
    /// Number of entries.
    pub capacity: u32,
    /// Completion-notification hook.
    pub on_completion: Option<CompletionHook>,
    /// Asynchronous-error hook (CQ overflow).
    pub on_async_error: Option<AsyncHook>,
}

impl std::fmt::Debug for CqInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqInit")
            .field("capacity", &self.capacity)
            .field("on_completion", &self.on_completion.is_some())
            .field("on_async_error", &self.on_async_error.is_some())
            .finish()
    }
}

/// SRQ creation parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInit {
    /// Maximum outstanding receive work requests.
    pub max_wr: u32,
    /// Maximum scatter entries per work request.
    pub max_sge: u32,
}

/// Queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Maximum outstanding send work requests.
    pub max_send_wr: u32,
    /// Maximum outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Maximum gather entries per send.
    pub max_send_sge: u32,
    /// Maximum scatter entries per receive.
    pub max_recv_sge: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
        }
    }
}

/// QP creation parameters.
pub struct QpInit<'a, Cq, Srq> {
    /// Transport type (`Gsi` is created through [`Device::create_gsi_qp`]).
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue, if any.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Signal every send, ignoring [`SendWr::signaled`].
    pub sq_sig_all: bool,
}

/// Path migration state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigState {
    /// Migrated.
    Migrated,
    /// Rearm.
    Rearm,
    /// Armed.
    Armed,
}

/// A modify-QP request: the target state and the attributes given. An
/// attribute is "given" when it is `Some`; [`QpModify::given`] is the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpModify {
    /// Target state.
    pub state: QpState,
    /// The state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// P_Key index.
    pub pkey_index: Option<u16>,
    /// Port number.
    pub port: Option<u8>,
    /// Q_Key.
    pub qkey: Option<u32>,
    /// Access flags (remote read/write/atomic).
    pub access: Option<Access>,
    /// Primary path.
    pub av: Option<AvAttr>,
    /// Alternate path (accepted, not used by the soft provider).
    pub alt_av: Option<AvAttr>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Destination QP number.
    pub dest_qpn: Option<u32>,
    /// Expected receive PSN.
    pub rq_psn: Option<u32>,
    /// Send PSN.
    pub sq_psn: Option<u32>,
    /// Outstanding reads/atomics as responder.
    pub max_dest_rd_atomic: Option<u8>,
    /// Outstanding reads/atomics as initiator.
    pub max_rd_atomic: Option<u8>,
    /// Minimum RNR NAK timer (IBTA encoding).
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout (IBTA encoding).
    pub timeout: Option<u8>,
    /// Transport retry count (0..=7).
    pub retry_cnt: Option<u8>,
    /// RNR retry count (0..=7, 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Path migration state.
    pub path_mig_state: Option<MigState>,
    /// Enable the SQ-drained event.
    pub en_sqd_async_notify: Option<bool>,
}

macro_rules! setters {
    ($($name:ident : $ty:ty),* $(,)?) => {
        $(
            #[doc = concat!("Give `", stringify!($name), "`.")]
            pub fn $name(mut self, v: $ty) -> Self {
                self.$name = Some(v);
                self
            }
        )*
    };
}

impl QpModify {
    /// A request to move to `state` with no attributes yet.
    pub fn to(state: QpState) -> QpModify {
        QpModify {
            state,
            cur_state: None,
            pkey_index: None,
            port: None,
            qkey: None,
            access: None,
            av: None,
            alt_av: None,
            path_mtu: None,
            dest_qpn: None,
            rq_psn: None,
            sq_psn: None,
            max_dest_rd_atomic: None,
            max_rd_atomic: None,
            min_rnr_timer: None,
            timeout: None,
            retry_cnt: None,
            rnr_retry: None,
            path_mig_state: None,
            en_sqd_async_notify: None,
        }
    }

    setters!(
        cur_state: QpState,
        pkey_index: u16,
        port: u8,
        qkey: u32,
        access: Access,
        av: AvAttr,
        alt_av: AvAttr,
        path_mtu: Mtu,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        max_dest_rd_atomic: u8,
        max_rd_atomic: u8,
        min_rnr_timer: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        path_mig_state: MigState,
        en_sqd_async_notify: bool,
    );

    /// The attributes given, as a mask for [`crate::qp_state::check_transition`].
    pub fn given(&self) -> AttrSet {
        let mut m = AttrSet::EMPTY;
        let mut add = |p: bool, a: AttrSet| {
            if p {
                m |= a;
            }
        };
        add(self.cur_state.is_some(), AttrSet::CUR_STATE);
        add(self.pkey_index.is_some(), AttrSet::PKEY_INDEX);
        add(self.port.is_some(), AttrSet::PORT);
        add(self.qkey.is_some(), AttrSet::QKEY);
        add(self.access.is_some(), AttrSet::ACCESS_FLAGS);
        add(self.av.is_some(), AttrSet::AV);
        add(self.alt_av.is_some(), AttrSet::ALT_PATH);
        add(self.path_mtu.is_some(), AttrSet::PATH_MTU);
        add(self.dest_qpn.is_some(), AttrSet::DEST_QPN);
        add(self.rq_psn.is_some(), AttrSet::RQ_PSN);
        add(self.sq_psn.is_some(), AttrSet::SQ_PSN);
        add(
            self.max_dest_rd_atomic.is_some(),
            AttrSet::MAX_DEST_RD_ATOMIC,
        );
        add(self.max_rd_atomic.is_some(), AttrSet::MAX_QP_RD_ATOMIC);
        add(self.min_rnr_timer.is_some(), AttrSet::MIN_RNR_TIMER);
        add(self.timeout.is_some(), AttrSet::TIMEOUT);
        add(self.retry_cnt.is_some(), AttrSet::RETRY_CNT);
        add(self.rnr_retry.is_some(), AttrSet::RNR_RETRY);
        add(self.path_mig_state.is_some(), AttrSet::PATH_MIG_STATE);
        add(
            self.en_sqd_async_notify.is_some(),
            AttrSet::EN_SQD_ASYNC_NOTIFY,
        );
        m
    }
}

/// The attributes of a QP as [`Device::query_qp`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// QP number.
    pub qpn: u32,
    /// Transport type.
    pub qp_type: QpType,
    /// Current state.
    pub state: QpState,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Signal every send.
    pub sq_sig_all: bool,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port number (0 before INIT).
    pub port: u8,
    /// Q_Key.
    pub qkey: u32,
    /// Access flags.
    pub access: Access,
    /// Primary path.
    pub av: Option<AvAttr>,
    /// Alternate path (loaded by a modify with `alt_av`; becomes the
    /// primary path when the QP migrates).
    pub alt_av: Option<AvAttr>,
    /// Path migration state: `Migrated` until an alternate path is loaded
    /// and armed; `Armed` until the QP migrates to it.
    pub path_mig_state: MigState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Destination QP number.
    pub dest_qpn: u32,
    /// Next expected receive PSN.
    pub rq_psn: u32,
    /// Next send PSN.
    pub sq_psn: u32,
    /// Outstanding reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Outstanding reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Minimum RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Local ACK timeout.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
}

/// Identity of a device a provider offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Node GUID (what [`Provider::open`] takes).
    pub node_guid: u64,
}

/// A provider: a source of devices.
pub trait Provider: Send + Sync {
    /// The device type.
    type Device: Device;
    /// Provider name ("soft", "rdma").
    fn name(&self) -> &str;
    /// The devices present now.
    fn devices(&self) -> Vec<DeviceInfo>;
    /// Open the device with this node GUID (`NotFound` when absent).
    fn open(&self, node_guid: u64) -> Result<Self::Device>;
}

/// One channel adapter and its verbs.
///
/// Objects are owned values; `destroy_*` consumes them and dropping them
/// has the same effect. A child keeps what it needs of its parents alive
/// internally, so the provider never frees memory in use; the object layer
/// still enforces the IBAL order (children before parents).
pub trait Device: Send + Sync {
    /// Protection domain.
    type Pd: Send + Sync;
    /// Completion queue.
    type Cq: Send + Sync;
    /// Memory region.
    type Mr: Send + Sync;
    /// Shared receive queue.
    type Srq: Send + Sync;
    /// Address vector.
    type Av: Send + Sync;
    /// Queue pair.
    type Qp: Send + Sync;

    /// Device attributes.
    fn query(&self) -> DeviceAttr;
    /// Attributes of port `port` (1-based); `NotFound` for a bad number.
    fn query_port(&self, port: u8) -> Result<PortAttr>;

    /// Allocate a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd>;
    /// Free a protection domain.
    fn dealloc_pd(&self, pd: Self::Pd) -> Result<()>;

    /// Create a completion queue.
    fn create_cq(&self, init: CqInit) -> Result<Self::Cq>;
    /// Destroy a completion queue.
    fn destroy_cq(&self, cq: Self::Cq) -> Result<()>;
    /// Request a notification for the next (solicited) completion.
    fn arm_cq(&self, cq: &Self::Cq, arm: CqArm) -> Result<()>;
    /// Move up to `out.len()` completions into `out`; returns how many.
    fn poll_cq(&self, cq: &Self::Cq, out: &mut [Wc]) -> Result<usize>;

    /// Register `len` bytes of `buf` from `offset`; the MR's iova is `iova`.
    fn register_mr(
        &self,
        pd: &Self::Pd,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Self::Mr>;
    /// Register caller-managed memory (see [`RawRegion::new`] for the
    /// contract, which was accepted when the region was built).
    fn register_region(&self, pd: &Self::Pd, region: RawRegion, access: Access)
        -> Result<Self::Mr>;
    /// The (lkey, rkey) pair of an MR.
    fn mr_keys(&self, mr: &Self::Mr) -> (u32, u32);
    /// Deregister: when this returns no access to the memory is in progress
    /// and none will start.
    fn deregister_mr(&self, mr: Self::Mr) -> Result<()>;

    /// Create a shared receive queue.
    fn create_srq(&self, pd: &Self::Pd, init: SrqInit) -> Result<Self::Srq>;
    /// Destroy a shared receive queue.
    fn destroy_srq(&self, srq: Self::Srq) -> Result<()>;
    /// Post receives to an SRQ.
    fn post_srq_recv(&self, srq: &Self::Srq, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// Create an address vector.
    fn create_av(&self, pd: &Self::Pd, attr: &AvAttr) -> Result<Self::Av>;
    /// Destroy an address vector.
    fn destroy_av(&self, av: Self::Av) -> Result<()>;

    /// Create an RC, UC or UD queue pair in RESET.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self::Cq, Self::Srq>) -> Result<Self::Qp>;
    /// Create port `port`'s GSI QP (QP1) in RESET. One per port at a time.
    fn create_gsi_qp(
        &self,
        pd: &Self::Pd,
        port: u8,
        init: &QpInit<'_, Self::Cq, Self::Srq>,
    ) -> Result<Self::Qp>;
    /// The QP number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// Modify a QP (state machine in [`crate::qp_state`]).
    fn modify_qp(&self, qp: &Self::Qp, m: &QpModify) -> Result<()>;
    /// Query a QP.
    fn query_qp(&self, qp: &Self::Qp) -> Result<QpAttr>;
    /// Destroy a QP.
    fn destroy_qp(&self, qp: Self::Qp) -> Result<()>;
    /// Post send work requests, in order. On error the requests before the
    /// failing one are posted, the rest are not; the error names the index.
    ///
    /// A request names its datagram destination's AV as `H` (the object
    /// layer uses its AV handles); `av_of(i)` is request `i`'s AV, resolved
    /// by the caller, and is asked for datagram QPs only. A connected QP's
    /// requests go through as they are: no copy, no lookup.
    fn post_send<'v, H>(
        &self,
        qp: &Self::Qp,
        wrs: &[SendWr<'_, H>],
        av_of: &dyn Fn(usize) -> Option<&'v Self::Av>,
    ) -> Result<()>;
    /// Post receive work requests, with the same partial-failure rule.
    fn post_recv(&self, qp: &Self::Qp, wrs: &[RecvWr<'_>]) -> Result<()>;
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
