//! A queue pair's type, state, queue sizes and the attributes of a modify
//! or a query (the values [`crate::qp_state`] checks).

use std::fmt;

use crate::attrs::{Access, AvAttr, Mtu};

/// A queue pair's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, or reset: no work may be posted.
    Reset,
    /// Initialised: receives may be posted, nothing is processed.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (new sends are held until the QP returns to RTS).
    Sqd,
    /// Send queue error (UD, UC and GSI only; receives still work).
    Sqe,
    /// Error: every outstanding and newly posted work request is flushed.
    Err,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

impl QpState {
    /// Whether the receive side accepts incoming packets in this state.
    pub fn can_receive(self) -> bool {
        matches!(
            self,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Whether receive work requests may be posted in this state.
    pub fn can_post_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }
}

/// Transport service type of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// The general services interface QP (QP1) of a port: a UD QP with a
    /// fixed number and port.
    Gsi,
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::Gsi => "GSI",
        })
    }
}

impl QpType {
    /// Datagram types (UD and GSI).
    pub fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

/// A set of QP attributes (a modify mask), one bit per attribute.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrSet(u32);

impl AttrSet {
    /// No attribute.
    pub const EMPTY: AttrSet = AttrSet(0);
    /// The current state the caller believes the QP is in.
    pub const CUR_STATE: AttrSet = AttrSet(1 << 0);
    /// Enable the SQ-drained asynchronous event.
    pub const EN_SQD_ASYNC_NOTIFY: AttrSet = AttrSet(1 << 1);
    /// QP access flags (remote read/write/atomic).
    pub const ACCESS_FLAGS: AttrSet = AttrSet(1 << 2);
    /// P_Key index.
    pub const PKEY_INDEX: AttrSet = AttrSet(1 << 3);
    /// Port number.
    pub const PORT: AttrSet = AttrSet(1 << 4);
    /// Q_Key.
    pub const QKEY: AttrSet = AttrSet(1 << 5);
    /// Primary path (address vector).
    pub const AV: AttrSet = AttrSet(1 << 6);
    /// Path MTU.
    pub const PATH_MTU: AttrSet = AttrSet(1 << 7);
    /// Local ACK timeout.
    pub const TIMEOUT: AttrSet = AttrSet(1 << 8);
    /// Transport retry count.
    pub const RETRY_CNT: AttrSet = AttrSet(1 << 9);
    /// RNR retry count.
    pub const RNR_RETRY: AttrSet = AttrSet(1 << 10);
    /// Expected receive PSN.
    pub const RQ_PSN: AttrSet = AttrSet(1 << 11);
    /// Outstanding RDMA reads/atomics as initiator.
    pub const MAX_QP_RD_ATOMIC: AttrSet = AttrSet(1 << 12);
    /// Alternate path.
    pub const ALT_PATH: AttrSet = AttrSet(1 << 13);
    /// Minimum RNR NAK timer.
    pub const MIN_RNR_TIMER: AttrSet = AttrSet(1 << 14);
    /// Send PSN.
    pub const SQ_PSN: AttrSet = AttrSet(1 << 15);
    /// Outstanding RDMA reads/atomics as responder.
    pub const MAX_DEST_RD_ATOMIC: AttrSet = AttrSet(1 << 16);
    /// Path migration state.
    pub const PATH_MIG_STATE: AttrSet = AttrSet(1 << 17);
    /// Destination QP number.
    pub const DEST_QPN: AttrSet = AttrSet(1 << 18);

    const NAMES: [(AttrSet, &'static str); 19] = [
        (AttrSet::CUR_STATE, "cur_state"),
        (AttrSet::EN_SQD_ASYNC_NOTIFY, "en_sqd_async_notify"),
        (AttrSet::ACCESS_FLAGS, "access_flags"),
        (AttrSet::PKEY_INDEX, "pkey_index"),
        (AttrSet::PORT, "port"),
        (AttrSet::QKEY, "qkey"),
        (AttrSet::AV, "av"),
        (AttrSet::PATH_MTU, "path_mtu"),
        (AttrSet::TIMEOUT, "timeout"),
        (AttrSet::RETRY_CNT, "retry_cnt"),
        (AttrSet::RNR_RETRY, "rnr_retry"),
        (AttrSet::RQ_PSN, "rq_psn"),
        (AttrSet::MAX_QP_RD_ATOMIC, "max_rd_atomic"),
        (AttrSet::ALT_PATH, "alt_path"),
        (AttrSet::MIN_RNR_TIMER, "min_rnr_timer"),
        (AttrSet::SQ_PSN, "sq_psn"),
        (AttrSet::MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
        (AttrSet::PATH_MIG_STATE, "path_mig_state"),
        (AttrSet::DEST_QPN, "dest_qpn"),
    ];

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Union.
    pub const fn union(self, other: AttrSet) -> AttrSet {
        AttrSet(self.0 | other.0)
    }
    /// Whether every bit of `other` is in `self`.
    pub const fn contains(self, other: AttrSet) -> bool {
        self.0 & other.0 == other.0
    }
    /// Bits of `self` not in `other`.
    pub const fn difference(self, other: AttrSet) -> AttrSet {
        AttrSet(self.0 & !other.0)
    }
    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The attribute names in this set.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        AttrSet::NAMES
            .iter()
            .filter(move |(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
    }
}

impl std::ops::BitOr for AttrSet {
    type Output = AttrSet;
    fn bitor(self, rhs: AttrSet) -> AttrSet {
        self.union(rhs)
    }
}

impl std::ops::BitOrAssign for AttrSet {
    fn bitor_assign(&mut self, rhs: AttrSet) {
        *self = self.union(rhs);
    }
}

impl fmt::Debug for AttrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
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
    /// Transport type (`Gsi` is created through [`Device::create_gsi_qp`](crate::Device::create_gsi_qp)).
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue, if any.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Signal every send, ignoring [`SendWr::signaled`](crate::SendWr::signaled).
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

/// The attributes of a QP as [`Device::query_qp`](crate::Device::query_qp) reports them.
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

impl QpModify {
    /// Applies the attributes this modify carries to `a`, a QP's
    /// attributes, with the path-migration rules every provider shares; the
    /// values must have been checked first (`qp_state::check_transition`
    /// and `check_modify_values`), and the state (`self.state`) is the
    /// caller's to set.
    pub fn apply_to(&self, a: &mut QpAttr) {
        if let Some(v) = self.pkey_index {
            a.pkey_index = v;
        }
        if let Some(v) = self.port {
            a.port = v;
        }
        if let Some(v) = self.qkey {
            a.qkey = v;
        }
        if let Some(v) = self.access {
            a.access = v;
        }
        if let Some(v) = self.av {
            a.av = Some(v);
        }
        if let Some(v) = self.alt_av {
            a.alt_av = Some(v);
        }
        match self.path_mig_state {
            // A loaded alternate path is armed at once (IBTA 17.2.8: REARM
            // asks the CA to arm, ARMED says it did).
            Some(MigState::Rearm | MigState::Armed) if a.alt_av.is_some() => {
                a.path_mig_state = MigState::Armed;
            }
            Some(MigState::Rearm | MigState::Armed) => a.path_mig_state = MigState::Rearm,
            // A migration the application asks for: the alternate path
            // becomes the primary one, its port the QP's port, and no
            // alternate is left until the next LAP loads one.
            Some(MigState::Migrated) if a.path_mig_state == MigState::Armed => {
                if let Some(alt) = a.alt_av.take() {
                    a.av = Some(alt);
                    a.port = alt.port;
                }
                a.path_mig_state = MigState::Migrated;
            }
            Some(MigState::Migrated) => a.path_mig_state = MigState::Migrated,
            None => {}
        }
        if let Some(v) = self.path_mtu {
            a.path_mtu = v;
        }
        if let Some(v) = self.dest_qpn {
            a.dest_qpn = v;
        }
        if let Some(v) = self.rq_psn {
            a.rq_psn = v;
        }
        if let Some(v) = self.sq_psn {
            a.sq_psn = v;
        }
        if let Some(v) = self.max_dest_rd_atomic {
            a.max_dest_rd_atomic = v;
        }
        if let Some(v) = self.max_rd_atomic {
            a.max_rd_atomic = v;
        }
        if let Some(v) = self.min_rnr_timer {
            a.min_rnr_timer = v;
        }
        if let Some(v) = self.timeout {
            a.timeout = v;
        }
        if let Some(v) = self.retry_cnt {
            a.retry_cnt = v;
        }
        if let Some(v) = self.rnr_retry {
            a.rnr_retry = v;
        }
    }
}
