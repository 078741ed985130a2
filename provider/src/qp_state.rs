//! The IBTA queue-pair state machine as pure functions.
//!
//! This module knows nothing about providers: it answers "may a QP of this
//! type go from state A to state B with these attributes?" (IBTA vol. 1,
//! 10.3 and 11.2.4.2, the same table libibverbs and the Linux kernel use).
//! The soft provider calls it on every `modify_qp`; the `qp` crate reuses it
//! to validate requests before they reach a provider.
//!
//! ```text
//!            +---------------------------------------------+
//!            v                                             | (any state -> RESET)
//!  RESET --> INIT --> RTR --> RTS <--> SQD                  |
//!                              |  ^                         |
//!                              v  |  (UD/UC/GSI only)       |
//!                              SQE                          |
//!  (any state -> ERR; ERR -> RESET)                         |
//! ```

use al::{Error, Result};

use crate::qp_attr::{AttrSet, QpModify, QpState, QpType};
use crate::{AvAttr, Mtu};

/// Required and optional attributes of one legal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes that must be given.
    pub required: AttrSet,
    /// Attributes that may be given.
    pub optional: AttrSet,
}

const fn rule(required: AttrSet, optional: AttrSet) -> Option<TransitionRule> {
    Some(TransitionRule { required, optional })
}

const E: AttrSet = AttrSet::EMPTY;

const fn u(a: AttrSet, b: AttrSet) -> AttrSet {
    a.union(b)
}

/// The rule for `from -> to` on a QP of type `ty`, or `None` when the
/// transition is illegal.
///
/// Any state may go to RESET or ERR with no attributes. The others follow
/// IBTA 11.2.4.2 (the table libibverbs and the kernel also use):
/// RESET->INIT, INIT->INIT, INIT->RTR, RTR->RTS, RTS->RTS, RTS->SQD,
/// SQD->SQD, SQD->RTS, and SQE->RTS (UD, UC and GSI only).
pub fn transition_rule(ty: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    use AttrSet as A;
    use QpState::*;
    use QpType::*;
    if matches!(to, Reset | Err) {
        return rule(E, E);
    }
    match (from, to) {
        (Reset, Init) => match ty {
            Ud => rule(u(u(A::PKEY_INDEX, A::PORT), A::QKEY), E),
            Gsi => rule(u(A::PKEY_INDEX, A::QKEY), E),
            Uc | Rc => rule(u(u(A::PKEY_INDEX, A::PORT), A::ACCESS_FLAGS), E),
        },
        (Init, Init) => match ty {
            Ud => rule(E, u(u(A::PKEY_INDEX, A::PORT), A::QKEY)),
            Gsi => rule(E, u(A::PKEY_INDEX, A::QKEY)),
            Uc | Rc => rule(E, u(u(A::PKEY_INDEX, A::PORT), A::ACCESS_FLAGS)),
        },
        (Init, Rtr) => match ty {
            Ud | Gsi => rule(E, u(A::PKEY_INDEX, A::QKEY)),
            Uc => rule(
                u(u(A::AV, A::PATH_MTU), u(A::DEST_QPN, A::RQ_PSN)),
                u(u(A::ALT_PATH, A::ACCESS_FLAGS), A::PKEY_INDEX),
            ),
            Rc => rule(
                u(
                    u(u(A::AV, A::PATH_MTU), u(A::DEST_QPN, A::RQ_PSN)),
                    u(A::MAX_DEST_RD_ATOMIC, A::MIN_RNR_TIMER),
                ),
                u(u(A::ALT_PATH, A::ACCESS_FLAGS), A::PKEY_INDEX),
            ),
        },
        (Rtr, Rts) => match ty {
            Ud | Gsi => rule(A::SQ_PSN, u(A::CUR_STATE, A::QKEY)),
            Uc => rule(
                A::SQ_PSN,
                u(
                    u(A::CUR_STATE, A::ALT_PATH),
                    u(A::ACCESS_FLAGS, A::PATH_MIG_STATE),
                ),
            ),
            Rc => rule(
                u(
                    u(A::TIMEOUT, A::RETRY_CNT),
                    u(u(A::RNR_RETRY, A::SQ_PSN), A::MAX_QP_RD_ATOMIC),
                ),
                u(
                    u(u(A::CUR_STATE, A::ALT_PATH), A::ACCESS_FLAGS),
                    u(A::MIN_RNR_TIMER, A::PATH_MIG_STATE),
                ),
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match ty {
            Ud | Gsi => rule(E, u(A::CUR_STATE, A::QKEY)),
            Uc => rule(
                E,
                u(
                    u(A::CUR_STATE, A::ACCESS_FLAGS),
                    u(A::ALT_PATH, A::PATH_MIG_STATE),
                ),
            ),
            Rc => rule(
                E,
                u(
                    u(u(A::CUR_STATE, A::ACCESS_FLAGS), A::ALT_PATH),
                    u(A::PATH_MIG_STATE, A::MIN_RNR_TIMER),
                ),
            ),
        },
        (Rts, Sqd) => rule(E, A::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match ty {
            Ud | Gsi => rule(E, u(A::PKEY_INDEX, A::QKEY)),
            Uc => rule(
                E,
                u(
                    u(u(A::AV, A::ALT_PATH), A::ACCESS_FLAGS),
                    u(A::PKEY_INDEX, A::PATH_MIG_STATE),
                ),
            ),
            Rc => rule(
                E,
                u(
                    u(
                        u(u(A::PORT, A::AV), u(A::TIMEOUT, A::RETRY_CNT)),
                        u(u(A::RNR_RETRY, A::MAX_QP_RD_ATOMIC), A::MAX_DEST_RD_ATOMIC),
                    ),
                    u(
                        u(A::ALT_PATH, A::ACCESS_FLAGS),
                        u(u(A::PKEY_INDEX, A::MIN_RNR_TIMER), A::PATH_MIG_STATE),
                    ),
                ),
            ),
        },
        (Sqe, Rts) => match ty {
            Ud | Gsi => rule(E, u(A::CUR_STATE, A::QKEY)),
            Uc => rule(E, u(A::CUR_STATE, A::ACCESS_FLAGS)),
            Rc => None,
        },
        _ => None,
    }
}

/// Check a modify request: `from -> to` on a QP of type `ty` giving the
/// attributes in `given`.
///
/// * an illegal transition is [`Error::InvalidQpState`];
/// * a missing required attribute, or an attribute the transition does not
///   accept, is [`Error::InvalidParameter`] naming the attributes.
pub fn check_transition(ty: QpType, from: QpState, to: QpState, given: AttrSet) -> Result<()> {
    let Some(rule) = transition_rule(ty, from, to) else {
        return Err(Error::InvalidQpState(
            format!("{ty} QP cannot go from {from} to {to}").into(),
        ));
    };
    let missing = rule.required.difference(given);
    if !missing.is_empty() {
        let names: Vec<_> = missing.names().collect();
        return Err(Error::invalid_parameter(format!(
            "{ty} QP {from}->{to} requires attribute(s) {}",
            names.join(", ")
        )));
    }
    let extra = given.difference(rule.required.union(rule.optional));
    if !extra.is_empty() {
        let names: Vec<_> = extra.names().collect();
        return Err(Error::invalid_parameter(format!(
            "{ty} QP {from}->{to} does not accept attribute(s) {}",
            names.join(", ")
        )));
    }
    Ok(())
}

/// Whether the transition is legal at all (ignoring attributes).
pub fn is_legal(ty: QpType, from: QpState, to: QpState) -> bool {
    transition_rule(ty, from, to).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_happy_path() {
        let init = AttrSet::PKEY_INDEX | AttrSet::PORT | AttrSet::ACCESS_FLAGS;
        check_transition(QpType::Rc, QpState::Reset, QpState::Init, init).unwrap();
        let rtr = AttrSet::AV
            | AttrSet::PATH_MTU
            | AttrSet::DEST_QPN
            | AttrSet::RQ_PSN
            | AttrSet::MAX_DEST_RD_ATOMIC
            | AttrSet::MIN_RNR_TIMER;
        check_transition(QpType::Rc, QpState::Init, QpState::Rtr, rtr).unwrap();
        let rts = AttrSet::SQ_PSN
            | AttrSet::TIMEOUT
            | AttrSet::RETRY_CNT
            | AttrSet::RNR_RETRY
            | AttrSet::MAX_QP_RD_ATOMIC;
        check_transition(QpType::Rc, QpState::Rtr, QpState::Rts, rts).unwrap();
    }

    #[test]
    fn missing_and_extra_are_named() {
        let e =
            check_transition(QpType::Ud, QpState::Reset, QpState::Init, AttrSet::PORT).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, Error::InvalidParameter(_)));
        assert!(s.contains("pkey_index") && s.contains("qkey"), "{s}");
        let e = check_transition(QpType::Ud, QpState::Init, QpState::Rtr, AttrSet::DEST_QPN)
            .unwrap_err();
        assert!(e.to_string().contains("dest_qpn"));
    }

    #[test]
    fn illegal() {
        for (f, t) in [
            (QpState::Reset, QpState::Rtr),
            (QpState::Reset, QpState::Rts),
            (QpState::Init, QpState::Rts),
            (QpState::Err, QpState::Init),
            (QpState::Rtr, QpState::Rtr),
        ] {
            assert!(matches!(
                check_transition(QpType::Rc, f, t, AttrSet::EMPTY),
                Err(Error::InvalidQpState(_))
            ));
        }
        assert!(!is_legal(QpType::Rc, QpState::Sqe, QpState::Rts));
        assert!(is_legal(QpType::Ud, QpState::Sqe, QpState::Rts));
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert!(is_legal(QpType::Rc, s, QpState::Err));
            assert!(is_legal(QpType::Rc, s, QpState::Reset));
        }
    }
}

// ------------------------------------------------------- value checks --

/// What one port of a device allows, for the value checks below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortLimits {
    /// Entries in the port's P_Key table.
    pub pkeys: usize,
    /// Entries in the port's GID table.
    pub gids: usize,
    /// The port's MTU (the largest path MTU a QP on it may use).
    pub mtu: Mtu,
    /// Whether the port routes only by GID (RoCE): every address vector
    /// must then carry a GRH.
    pub gid_only: bool,
}

/// A device's limits for [`check_av`] and [`check_modify_values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits<'a> {
    /// Ports 1.. in order.
    pub ports: &'a [PortLimits],
    /// Outstanding RDMA READ/atomic requests a QP may accept.
    pub max_qp_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests a QP may start.
    pub max_qp_init_rd_atomic: u8,
}

impl DeviceLimits<'_> {
    fn port(&self, n: u8) -> Option<&PortLimits> {
        self.ports.get((n as usize).checked_sub(1)?)
    }
}

/// An address vector must name a port of the device, a GID of that port
/// (and carry a GRH on a GID-only port) and values that fit their IBTA
/// fields (SL 4 bits, flow label 20); anything else is refused, never
/// masked into something else. `what` names the AV in the error ("AV",
/// "av", "alt_av").
pub fn check_av(av: &AvAttr, dev: &DeviceLimits<'_>, what: &str) -> Result<()> {
    let Some(port) = dev.port(av.port) else {
        return Err(Error::invalid_parameter(format!(
            "{what}.port {} does not exist (the device has {})",
            av.port,
            dev.ports.len()
        )));
    };
    if av.sl > 15 {
        return Err(Error::invalid_parameter(format!(
            "{what}.sl {} does not fit 4 bits",
            av.sl
        )));
    }
    let Some(g) = av.grh else {
        if port.gid_only {
            return Err(Error::invalid_parameter(format!(
                "{what} has no GRH: a RoCE port routes by GID only"
            )));
        }
        return Ok(());
    };
    if g.sgid_index as usize >= port.gids {
        return Err(Error::invalid_parameter(format!(
            "{what}.sgid_index {} is outside port {}'s GID table ({} entries)",
            g.sgid_index, av.port, port.gids
        )));
    }
    if g.flow_label > 0xf_ffff {
        return Err(Error::invalid_parameter(format!(
            "{what}.flow_label {:#x} does not fit 20 bits",
            g.flow_label
        )));
    }
    Ok(())
}

/// The values of a modify-QP request that every provider checks the same
/// way, for a QP now on port `cur_port`: the port exists, the P_Key index
/// is in its table, the access flags name rights, the address vectors
/// pass [`check_av`], the path MTU fits the port, QPNs and PSNs fit 24
/// bits, the retry counts 3 bits, the timers 5 bits, and the READ/atomic
/// depths the device's limits. A value out of range is refused, never
/// masked.
pub fn check_modify_values(cur_port: u8, m: &QpModify, dev: &DeviceLimits<'_>) -> Result<()> {
    const MASK24: u32 = 0xff_ffff;
    let nports = dev.ports.len();
    let port = m.port.unwrap_or(cur_port);
    if let Some(p) = m.port {
        if dev.port(p).is_none() {
            return Err(Error::invalid_parameter(format!(
                "port {p} does not exist (the device has {nports})"
            )));
        }
    }
    if let Some(i) = m.pkey_index {
        if dev.port(port).is_none_or(|l| i as usize >= l.pkeys) {
            return Err(Error::invalid_parameter(format!(
                "pkey_index {i} is outside port {port}'s P_Key table"
            )));
        }
    }
    if let Some(a) = m.access {
        if a.undefined_bits() != 0 {
            return Err(Error::invalid_parameter(format!(
                "access_flags {:#x} has bits that name no right ({:#x})",
                a.bits(),
                a.undefined_bits()
            )));
        }
    }
    if let Some(av) = &m.alt_av {
        check_av(av, dev, "alt_av")?;
    }
    if let Some(av) = &m.av {
        check_av(av, dev, "av")?;
    }
    if let (Some(mtu), Some(l)) = (m.path_mtu, dev.port(port)) {
        if mtu > l.mtu {
            return Err(Error::invalid_parameter(format!(
                "path_mtu {} is above port {port}'s MTU",
                mtu.bytes()
            )));
        }
    }
    if m.dest_qpn.is_some_and(|q| q > MASK24) {
        return Err(Error::invalid_parameter("dest_qpn must fit 24 bits"));
    }
    // PSNs are 24 bits (IBTA 9.7.1); a larger value is a caller's mistake
    // to report, not to mask into another PSN.
    if let Some(p) = m.rq_psn.filter(|&p| p > MASK24) {
        return Err(Error::invalid_parameter(format!(
            "rq_psn {p:#x} does not fit 24 bits"
        )));
    }
    if let Some(p) = m.sq_psn.filter(|&p| p > MASK24) {
        return Err(Error::invalid_parameter(format!(
            "sq_psn {p:#x} does not fit 24 bits"
        )));
    }
    if m.retry_cnt.is_some_and(|r| r > 7) {
        return Err(Error::invalid_parameter("retry_cnt must be 0..=7"));
    }
    if m.rnr_retry.is_some_and(|r| r > 7) {
        return Err(Error::invalid_parameter("rnr_retry must be 0..=7"));
    }
    let (max, max_init) = (dev.max_qp_rd_atomic, dev.max_qp_init_rd_atomic);
    if m.max_rd_atomic.is_some_and(|r| r > max_init) {
        return Err(Error::invalid_parameter(format!(
            "max_rd_atomic must be at most {max_init} (max_qp_init_rd_atomic)"
        )));
    }
    if m.max_dest_rd_atomic.is_some_and(|r| r > max) {
        return Err(Error::invalid_parameter(format!(
            "max_dest_rd_atomic must be at most {max}"
        )));
    }
    if m.min_rnr_timer.is_some_and(|r| r > 31) {
        return Err(Error::invalid_parameter("min_rnr_timer must be 0..=31"));
    }
    if m.timeout.is_some_and(|r| r > 31) {
        return Err(Error::invalid_parameter("timeout must be 0..=31"));
    }
    Ok(())
}
