//! Queue pairs: state, type and migration-state codes, address handles
//! ([`RawAh`]), and `ibv_qp_attr` with its attribute mask ([`RawQpAttr`],
//! [`qp_mask`]) both ways: a `QpModify` to what `ibv_modify_qp` takes, what
//! `ibv_query_qp` gives to a `QpAttr`.

use al::{Error, Result};
use provider::{Access, AvAttr, GrhAttr, MigState, Mtu, QpAttr, QpCaps, QpModify, QpState, QpType};

use super::attrs::{mtu_code, mtu_from_code};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::mtu;

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
}
