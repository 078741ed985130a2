//! What the soft fabric tells a `tracing` subscriber (`docs/tracing.md`):
//! packets it drops, with the reason ([`crate::FabricStats`] counts the
//! same), faults it injects, and QPs an error puts in ERR. Target
//! `ibal::soft::drop` at `debug` for drops and faults, `ibal::soft` for
//! ERR. A delivered packet is never traced.

use provider::trace::Hex;
use provider::WcStatus;

/// A packet for QP `dqpn` was dropped for `reason`.
pub(crate) fn dropped(dqpn: u32, reason: &'static str) {
    tracing::debug!(
        target: "ibal::soft::drop",
        dest_qpn = %Hex(dqpn),
        reason,
        "packet dropped"
    );
}

/// Fault injection did `fault` (drop, delay, reorder, duplicate) to a
/// packet for QP `dqpn`.
pub(crate) fn fault(dqpn: u32, fault: &'static str) {
    tracing::debug!(
        target: "ibal::soft::drop",
        dest_qpn = %Hex(dqpn),
        fault = %fault,
        "fault injected"
    );
}

/// QP `qpn` entered ERR: its work request completed with `status`, or
/// (no status) it failed as a responder.
pub(crate) fn entered_error(qpn: u32, status: Option<WcStatus>, why: &'static str) {
    tracing::warn!(
        target: "ibal::soft",
        qpn = %Hex(qpn),
        status = status.map(tracing::field::debug),
        reason = why,
        "QP entered ERR"
    );
}
