//! The QP attributes a transport is created from, and its errors.

use provider::{Access, Mtu, QpType, DEFAULT_PKEY};

/// The attributes of a QP in RTS that its transport needs (the subset of
/// `provider::QpAttr` that reaches the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// RC, UC, UD or GSI (GSI behaves as UD).
    pub qp_type: QpType,
    /// This QP's number (24 bits).
    pub qpn: u32,
    /// The connected peer's QP number (RC, UC).
    pub dest_qpn: u32,
    /// First PSN this QP sends.
    pub sq_psn: u32,
    /// First PSN this QP expects (RC, UC).
    pub rq_psn: u32,
    /// Path MTU (256..=4096).
    pub path_mtu: Mtu,
    /// Local ACK timeout code: 4.096 us x 2^timeout, 0 = infinite (RC).
    pub timeout: u8,
    /// Transport retries after a timeout or a PSN sequence NAK, 0..=7 (RC).
    /// 7 is seven retries, as IBTA says (Linux rxe retries forever).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK, 0..=7, 7 = infinite (RC).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP's responder sends (RC).
    pub min_rnr_timer: u8,
    /// READs/atomics this QP may have outstanding as requester (RC).
    pub max_rd_atomic: u8,
    /// READs/atomics this QP serves at once as responder, and the size of
    /// its replay cache for duplicate READ and atomic requests (RC).
    pub max_dest_rd_atomic: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// P_Key this QP sends and accepts.
    pub pkey: u16,
    /// Remote access rights the responder grants (RC, UC).
    pub access: Access,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
}

impl Config {
    /// An RC QP `qpn` connected to `dest_qpn`, PSNs 0, MTU 1024, every
    /// remote right, timeout 14 (67 ms), retry 7, RNR retry 7, RNR timer 1
    /// (10 us), 16 READs/atomics each way, queues of 128.
    pub fn rc(qpn: u32, dest_qpn: u32) -> Config {
        Config {
            qp_type: QpType::Rc,
            qpn,
            dest_qpn,
            sq_psn: 0,
            rq_psn: 0,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            qkey: 0,
            pkey: DEFAULT_PKEY,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_sge: 4,
        }
    }

    /// Checks the ranges the transport relies on.
    pub fn validate(&self) -> Result<(), Error> {
        let q = |v: u32| v <= crate::psn::PSN_MASK;
        if !q(self.qpn) || !q(self.dest_qpn) {
            return Err(Error::InvalidConfig("QP number wider than 24 bits"));
        }
        if !q(self.sq_psn) || !q(self.rq_psn) {
            return Err(Error::InvalidConfig("PSN wider than 24 bits"));
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(Error::InvalidConfig("retry count above 7"));
        }
        if self.timeout > 31 || self.min_rnr_timer > 31 {
            return Err(Error::InvalidConfig("timer code above 31"));
        }
        if self.max_send_wr == 0 || self.max_recv_wr == 0 || self.max_sge == 0 {
            return Err(Error::InvalidConfig("empty queue"));
        }
        if self.max_send_wr > 1 << 16 || self.max_recv_wr > 1 << 16 || self.max_sge > 64 {
            return Err(Error::InvalidConfig(
                "queue larger than the transport bounds",
            ));
        }
        if self.access.undefined_bits() != 0 {
            return Err(Error::InvalidConfig("undefined access bits"));
        }
        Ok(())
    }
}

/// Errors of the transport's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// A [`Config`] value out of range.
    InvalidConfig(&'static str),
    /// The queue (or the completions not yet polled) is full.
    QueueFull,
    /// A work request this QP type cannot carry.
    InvalidWr(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::InvalidConfig(s) => write!(f, "invalid transport configuration: {s}"),
            Error::QueueFull => f.write_str("queue full"),
            Error::InvalidWr(s) => write!(f, "invalid work request: {s}"),
        }
    }
}

impl std::error::Error for Error {}
