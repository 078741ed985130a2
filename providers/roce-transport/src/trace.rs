//! What a transport tells a `tracing` subscriber (`docs/tracing.md`,
//! target `ibal::roce`): retransmissions, NAKs sent and received, RNR
//! waits, the QP's entry into ERR with its cause, and messages the
//! responder dropped (`ibal::roce::drop`).
//!
//! Only the exceptions are here: nothing on the path of a packet that
//! goes as planned. With no subscriber each call is one check of a global
//! level; the fields are built only for a subscriber that takes them.

use std::time::Duration;

use provider::trace::Hex;
use provider::WcStatus;
use roce::{NakCode, Syndrome};

use crate::config::Config;

/// The requester goes back to PSN `psn` (go-back-N): `cause` is the ACK
/// timeout, a PSN sequence NAK or a response that showed a gap.
pub(crate) fn retransmit(cfg: &Config, psn: u32, retries_left: u8, cause: &'static str) {
    tracing::debug!(
        target: "ibal::roce",
        qpn = %Hex(cfg.qpn),
        dest_qpn = %Hex(cfg.dest_qpn),
        psn = %Hex(psn),
        retries_left,
        cause,
        "retransmit"
    );
}

/// The responder answered with an RNR NAK: the requester waits `delay`.
pub(crate) fn rnr_wait(cfg: &Config, psn: u32, timer: u8, delay: Duration, rnr_left: u8) {
    tracing::debug!(
        target: "ibal::roce",
        qpn = %Hex(cfg.qpn),
        dest_qpn = %Hex(cfg.dest_qpn),
        psn = %Hex(psn),
        rnr_timer = timer,
        wait_us = delay.as_micros() as u64,
        rnr_retries_left = rnr_left,
        "RNR NAK received, waiting"
    );
}

/// A NAK other than RNR received for `psn`: a PSN sequence error (the
/// requester goes back) at `debug`, any other code (the QP goes to ERR)
/// at `info`.
pub(crate) fn nak_received(cfg: &Config, psn: u32, code: NakCode) {
    if code == NakCode::PsnSequenceError {
        tracing::debug!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            psn = %Hex(psn),
            syndrome = ?code,
            "NAK received"
        );
    } else {
        tracing::info!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            psn = %Hex(psn),
            syndrome = ?code,
            "NAK received"
        );
    }
}

/// The responder NAKed `psn`: a PSN sequence error or an RNR NAK at
/// `debug`, an error NAK (the QP goes to ERR) at `info`.
pub(crate) fn nak_sent(cfg: &Config, psn: u32, syndrome: Syndrome) {
    match syndrome {
        Syndrome::Nak(code) if code != NakCode::PsnSequenceError => tracing::info!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            psn = %Hex(psn),
            syndrome = ?syndrome,
            "NAK sent"
        ),
        _ => tracing::debug!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            psn = %Hex(psn),
            syndrome = ?syndrome,
            "NAK sent"
        ),
    }
}

/// The QP entered ERR. `status` is the head work request's completion
/// status when one failed (retry or RNR retry exceeded, a remote error),
/// `why` says what happened. A modify to ERR (the user's or the CM's) is
/// at `debug` (the `ibal::qp` event says it), anything else at `warn`.
pub(crate) fn entered_error(cfg: &Config, status: Option<WcStatus>, why: &'static str) {
    if status.is_none() && why == WHY_MODIFY {
        tracing::debug!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            reason = why,
            "QP entered ERR"
        );
    } else {
        tracing::warn!(
            target: "ibal::roce",
            qpn = %Hex(cfg.qpn),
            dest_qpn = %Hex(cfg.dest_qpn),
            status = status.map(tracing::field::debug),
            reason = why,
            "QP entered ERR"
        );
    }
}

/// [`entered_error`]'s reason for a modify to ERR.
pub(crate) const WHY_MODIFY: &str = "modified to ERR";

/// The responder dropped a request (or a UC/UD message) the receive stage
/// had passed: no receive posted (UC, UD), a PSN gap (UC), READ/atomic
/// resources all busy.
pub(crate) fn dropped(cfg: &Config, psn: u32, reason: &'static str) {
    tracing::debug!(
        target: "ibal::roce::drop",
        qpn = %Hex(cfg.qpn),
        psn = %Hex(psn),
        reason,
        "message dropped"
    );
}
