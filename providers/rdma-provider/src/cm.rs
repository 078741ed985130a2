//! librdmacm's events and connection parameters as plain data, and how
//! they read: no system library, so this is compiled and tested without
//! the `rdma` feature too.
//!
//! With the feature, `CmChannel` and `CmId` (in `cm_channel`) drive
//! librdmacm itself: one event thread per channel fetches each
//! `rdma_cm_event`, copies it into a [`CmEventKind`] (with [`event_kind`])
//! and acknowledges it before anyone acts on it.
//!
//! Facts this module relies on (rdma-core's `librdmacm/cma.c`, `man
//! rdma_get_cm_event`, `man rdma_connect`, `man rdma_establish`, and
//! Linux's `drivers/infiniband/core/cma.c`; see `docs/rdma-provider.md`,
//! "Connections"):
//!
//! * an id without a QP (`rdma_connect` with `qp_num` only) gets
//!   `RDMA_CM_EVENT_CONNECT_RESPONSE` for the REP; the application moves
//!   its QP and calls `rdma_establish`, which sends the RTU;
//! * `RDMA_CM_EVENT_REJECTED`'s `status` is the REJ's reason code (8:
//!   nobody listens, 28: consumer reject) and its `private_data` the REJ's;
//! * `RDMA_CM_EVENT_UNREACHABLE` with `-ETIMEDOUT` means the REQ (or REP)
//!   ran out of retries; address, route and connect errors carry a
//!   negative errno;
//! * `RDMA_CM_EVENT_DISCONNECTED` stands both for the peer's DREQ and for
//!   the end of our own disconnect (DREP or DREQ timeout): only the
//!   caller's state tells them apart.

use al::{Error, Result};
use provider::{Access, QpModify};

use crate::convert::{
    av_from_raw, errno_error, mig_state_from_code, mtu_from_code, qp_mask, qp_state_from_code,
    RawQpAttr,
};

/// `enum rdma_cm_event_type` codes, in the header's order.
pub mod event_code {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    pub const ADDR_RESOLVED: u32 = 0;
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    pub const ADDR_ERROR: u32 = 1;
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    pub const ROUTE_RESOLVED: u32 = 2;
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    pub const ROUTE_ERROR: u32 = 3;
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    pub const CONNECT_REQUEST: u32 = 4;
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    pub const CONNECT_RESPONSE: u32 = 5;
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    pub const CONNECT_ERROR: u32 = 6;
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    pub const UNREACHABLE: u32 = 7;
    /// `RDMA_CM_EVENT_REJECTED`.
    pub const REJECTED: u32 = 8;
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    pub const ESTABLISHED: u32 = 9;
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    pub const DISCONNECTED: u32 = 10;
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    pub const DEVICE_REMOVAL: u32 = 11;
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    pub const MULTICAST_JOIN: u32 = 12;
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    pub const MULTICAST_ERROR: u32 = 13;
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    pub const ADDR_CHANGE: u32 = 14;
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// `enum rdma_port_space`: `RDMA_PS_TCP` (reliable connections).
pub const PS_TCP: u32 = 0x0106;

/// librdmacm's name of an event code (as `rdma_event_str` spells it).
pub fn event_name(code: u32) -> &'static str {
    use event_code::*;
    match code {
        ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        REJECTED => "RDMA_CM_EVENT_REJECTED",
        ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "UNKNOWN EVENT",
    }
}

/// `struct rdma_conn_param` as plain data: what `rdma_connect` and
/// `rdma_accept` send, and what a connect request, response or
/// establishment event reports of the peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// The application's private data (after rdma_cm's header in a REQ).
    pub private_data: Vec<u8>,
    /// RDMA READ/atomic requests accepted from the peer.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests outstanding at the peer.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (3 bits; ignored in an accept).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7 = forever).
    pub rnr_retry_count: u8,
    /// The QP takes receives from an SRQ.
    pub srq: bool,
    /// The QP number (ours when sending, the peer's in an event).
    pub qp_num: u32,
}

/// Most bytes of private data each message can carry through rdma_cm
/// (IB CM sizes; a REQ loses rdma_cm's 36-byte header, `cma.c`'s
/// `cma_user_data_offset`).
pub mod private_data_len {
    /// REQ (`rdma_connect`): 92 - 36.
    pub const CONNECT: usize = 56;
    /// REP (`rdma_accept`).
    pub const ACCEPT: usize = 196;
    /// REJ (`rdma_reject`).
    pub const REJECT: usize = 148;
}

impl ConnParam {
    /// Checks what librdmacm would refuse or truncate: private data over
    /// `max` bytes (it takes a `u8` length), 24-bit QPN, 3-bit counts.
    pub fn check(&self, call: &str, max: usize) -> Result<()> {
        if self.private_data.len() > max {
            return Err(Error::invalid_parameter(format!(
                "{call}: {} bytes of private data, at most {max} fit",
                self.private_data.len()
            )));
        }
        if self.qp_num > 0x00ff_ffff {
            return Err(Error::invalid_parameter(format!(
                "{call}: QPN {:#x} is over 24 bits",
                self.qp_num
            )));
        }
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(Error::invalid_parameter(format!(
                "{call}: retry counts are 3 bits (retry {}, RNR retry {})",
                self.retry_count, self.rnr_retry_count
            )));
        }
        Ok(())
    }
}

/// One rdma_cm event, copied out of librdmacm before its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` found the address and its device.
    AddrResolved,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// A REQ arrived on a listening id (the new id comes with the event).
    ConnectRequest(ConnParam),
    /// The REP for our REQ (id without a QP): move the QP, then
    /// `rdma_establish`.
    ConnectResponse(ConnParam),
    /// The connection is established (passive side: the RTU arrived).
    Established(ConnParam),
    /// The peer's REJ: its reason code and private data.
    Rejected {
        /// The REJ's reason (IBTA code).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The REQ or REP was never answered (`UNREACHABLE` with `-ETIMEDOUT`,
    /// or address/route resolution timing out).
    TimedOut {
        /// The event code it came as.
        code: u32,
    },
    /// Address or route resolution, the connection or the device failed:
    /// the event code and the errno it carried.
    Failed {
        /// The event code.
        code: u32,
        /// The errno (positive), 0 when the event carried none.
        errno: i32,
    },
    /// DREQ received, or our disconnect finished (DREP or DREQ timeout).
    Disconnected,
    /// The kernel left timewait for the connection.
    TimewaitExit,
    /// An event this layer does not use (multicast, address change).
    Other {
        /// The event code.
        code: u32,
        /// Its status.
        status: i32,
    },
}

impl CmEventKind {
    /// The error a failure event means, with the event's name and errno
    /// in its message.
    pub fn error(&self) -> Option<Error> {
        match self {
            CmEventKind::TimedOut { code } => Some(errno_error(event_name(*code), libc::ETIMEDOUT)),
            CmEventKind::Failed { code, errno } => Some(errno_error(event_name(*code), *errno)),
            _ => None,
        }
    }
}

/// Reads an event from its code, `status` and (for the events that carry
/// one) its connection parameters.
pub fn event_kind(code: u32, status: i32, conn: ConnParam) -> CmEventKind {
    use event_code::*;
    let failed = |code| {
        if status == -libc::ETIMEDOUT {
            CmEventKind::TimedOut { code }
        } else {
            CmEventKind::Failed {
                code,
                errno: status.unsigned_abs() as i32,
            }
        }
    };
    match code {
        // A successful event has status 0; anything else is its failure.
        ADDR_RESOLVED if status == 0 => CmEventKind::AddrResolved,
        ROUTE_RESOLVED if status == 0 => CmEventKind::RouteResolved,
        ADDR_RESOLVED | ADDR_ERROR | ROUTE_RESOLVED | ROUTE_ERROR | CONNECT_ERROR | UNREACHABLE
        | DEVICE_REMOVAL => failed(code),
        CONNECT_REQUEST => CmEventKind::ConnectRequest(conn),
        CONNECT_RESPONSE if status == 0 => CmEventKind::ConnectResponse(conn),
        CONNECT_RESPONSE => failed(code),
        ESTABLISHED if status == 0 => CmEventKind::Established(conn),
        ESTABLISHED => failed(code),
        REJECTED => CmEventKind::Rejected {
            // For IB and RoCE the status is the REJ's reason code
            // (positive); a negative status is a local failure.
            reason: u16::try_from(status).unwrap_or(0),
            private_data: conn.private_data,
        },
        DISCONNECTED => CmEventKind::Disconnected,
        TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
        code => CmEventKind::Other { code, status },
    }
}

/// What `rdma_init_qp_attr` returned (an `ibv_qp_attr` and its
/// `IBV_QP_*` mask) as a modify request, with `access` in place of the
/// access flags it gave: rdma_cm offers none before the REP (`cma.c`'s
/// `cma_ib_init_qp_attr` sets 0) and only REMOTE_WRITE (plus READ and
/// ATOMIC with responder resources) after, while the consumer chose its
/// own. A state code with no name is refused.
pub fn modify_from_init_attr(r: &RawQpAttr, mask: u32, access: Access) -> Result<QpModify> {
    use qp_mask::*;
    let state = qp_state_from_code(r.state).ok_or_else(|| {
        Error::Other(format!("rdma_init_qp_attr: unknown QP state code {}", r.state).into())
    })?;
    let mut m = QpModify::to(state);
    let has = |bit: u32| mask & bit != 0;
    if has(PKEY_INDEX) {
        m.pkey_index = Some(r.pkey_index);
    }
    if has(PORT) {
        m.port = Some(r.port);
    }
    if has(QKEY) {
        m.qkey = Some(r.qkey);
    }
    if has(ACCESS_FLAGS) {
        m.access = Some(access);
    }
    if has(AV) {
        m.av = Some(av_from_raw(&r.ah).ok_or_else(|| {
            Error::Other("rdma_init_qp_attr: an address vector with port 0".into())
        })?);
    }
    if has(PATH_MTU) {
        m.path_mtu = Some(mtu_from_code(r.path_mtu).ok_or_else(|| {
            Error::Other(format!("rdma_init_qp_attr: unknown MTU code {}", r.path_mtu).into())
        })?);
    }
    if has(DEST_QPN) {
        m.dest_qpn = Some(r.dest_qpn);
    }
    if has(RQ_PSN) {
        m.rq_psn = Some(r.rq_psn);
    }
    if has(SQ_PSN) {
        m.sq_psn = Some(r.sq_psn);
    }
    if has(MAX_DEST_RD_ATOMIC) {
        m.max_dest_rd_atomic = Some(r.max_dest_rd_atomic);
    }
    if has(MAX_QP_RD_ATOMIC) {
        m.max_rd_atomic = Some(r.max_rd_atomic);
    }
    if has(MIN_RNR_TIMER) {
        m.min_rnr_timer = Some(r.min_rnr_timer);
    }
    if has(TIMEOUT) {
        m.timeout = Some(r.timeout);
    }
    if has(RETRY_CNT) {
        m.retry_cnt = Some(r.retry_cnt);
    }
    if has(RNR_RETRY) {
        m.rnr_retry = Some(r.rnr_retry);
    }
    if has(PATH_MIG_STATE) {
        m.path_mig_state = Some(mig_state_from_code(r.mig_state));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{modify_to_raw, RawAh};
    use provider::{AvAttr, Mtu, QpState};

    #[test]
    fn events_read_as_their_meaning() {
        use event_code::*;
        let c = ConnParam {
            private_data: b"hi".to_vec(),
            qp_num: 0x11,
            ..ConnParam::default()
        };
        assert_eq!(
            event_kind(ADDR_RESOLVED, 0, ConnParam::default()),
            CmEventKind::AddrResolved
        );
        assert_eq!(
            event_kind(CONNECT_RESPONSE, 0, c.clone()),
            CmEventKind::ConnectResponse(c.clone())
        );
        assert_eq!(
            event_kind(CONNECT_REQUEST, 0, c.clone()),
            CmEventKind::ConnectRequest(c.clone())
        );
        assert_eq!(
            event_kind(REJECTED, 8, c.clone()),
            CmEventKind::Rejected {
                reason: 8,
                private_data: b"hi".to_vec()
            }
        );
        assert_eq!(
            event_kind(UNREACHABLE, -libc::ETIMEDOUT, ConnParam::default()),
            CmEventKind::TimedOut { code: UNREACHABLE }
        );
        assert_eq!(
            event_kind(ADDR_ERROR, -libc::EHOSTUNREACH, ConnParam::default()),
            CmEventKind::Failed {
                code: ADDR_ERROR,
                errno: libc::EHOSTUNREACH
            }
        );
        // ADDR_RESOLVED with a status is a failure (cma.c reports some
        // resolution errors that way).
        assert!(matches!(
            event_kind(ADDR_RESOLVED, -libc::ENODEV, ConnParam::default()),
            CmEventKind::Failed { errno, .. } if errno == libc::ENODEV
        ));
        assert_eq!(
            event_kind(DISCONNECTED, 0, ConnParam::default()),
            CmEventKind::Disconnected
        );
        assert_eq!(
            event_kind(MULTICAST_JOIN, 0, ConnParam::default()),
            CmEventKind::Other {
                code: MULTICAST_JOIN,
                status: 0
            }
        );
        assert_eq!(event_name(TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
        assert_eq!(event_name(99), "UNKNOWN EVENT");
    }

    #[test]
    fn failure_events_become_errors_naming_the_event_and_errno() {
        let e = CmEventKind::Failed {
            code: event_code::ADDR_ERROR,
            errno: libc::EHOSTUNREACH,
        }
        .error()
        .unwrap();
        let s = e.to_string();
        assert!(s.contains("RDMA_CM_EVENT_ADDR_ERROR"), "{s}");
        assert!(s.contains(&format!("errno {}", libc::EHOSTUNREACH)), "{s}");
        let t = CmEventKind::TimedOut {
            code: event_code::UNREACHABLE,
        }
        .error()
        .unwrap();
        assert!(matches!(t, Error::Timeout(_)), "{t:?}");
        assert!(CmEventKind::AddrResolved.error().is_none());
    }

    #[test]
    fn conn_params_over_the_limits_are_refused() {
        let ok = ConnParam {
            private_data: vec![0; private_data_len::CONNECT],
            qp_num: 0xff_ffff,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
        ok.check("rdma_connect", private_data_len::CONNECT).unwrap();
        let long = ConnParam {
            private_data: vec![0; private_data_len::CONNECT + 1],
            ..ok.clone()
        };
        let e = long
            .check("rdma_connect", private_data_len::CONNECT)
            .unwrap_err();
        assert!(e.to_string().contains("at most 56"), "{e}");
        let qpn = ConnParam {
            qp_num: 0x100_0000,
            ..ok.clone()
        };
        assert!(qpn.check("rdma_accept", 196).is_err());
        let retry = ConnParam {
            retry_count: 8,
            ..ok
        };
        assert!(retry.check("rdma_connect", 56).is_err());
    }

    #[test]
    fn init_attributes_become_the_modify_that_made_them() {
        // What rdma_init_qp_attr gives for RTR on RoCE: the AV with a GRH,
        // MTU, peer QPN, receive PSN, responder depth, RNR timer.
        let want = QpModify::to(QpState::Rtr)
            .av(AvAttr {
                grh: Some(provider::GrhAttr {
                    dgid: [0xfe; 16],
                    sgid_index: 1,
                    flow_label: 0,
                    hop_limit: 64,
                    traffic_class: 0,
                }),
                ..AvAttr::lid(1, 0)
            })
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(0x12)
            .rq_psn(0xabcdef)
            .max_dest_rd_atomic(4)
            .min_rnr_timer(12);
        let (raw, mask) = modify_to_raw(&want);
        let got = modify_from_init_attr(&raw, mask, Access::NONE).unwrap();
        assert_eq!(got, want);
        // INIT: the consumer's access replaces rdma_cm's.
        let (raw, mask) = modify_to_raw(
            &QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(1)
                .access(Access::NONE),
        );
        let got = modify_from_init_attr(&raw, mask, Access::REMOTE_WRITE).unwrap();
        assert_eq!(got.access, Some(Access::REMOTE_WRITE));
        assert_eq!(got.port, Some(1));
        // An unknown state or an AV naming no port is refused.
        let bad = RawQpAttr {
            state: 9,
            ..RawQpAttr::default()
        };
        assert!(modify_from_init_attr(&bad, qp_mask::STATE, Access::NONE).is_err());
        let no_port = RawQpAttr {
            state: 2,
            ah: RawAh::default(),
            ..RawQpAttr::default()
        };
        assert!(
            modify_from_init_attr(&no_port, qp_mask::STATE | qp_mask::AV, Access::NONE).is_err()
        );
    }
}
