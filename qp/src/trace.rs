//! What a `tracing` subscriber is told about QPs (`docs/tracing.md`):
//! each state change a modify makes, and a modify the provider refused.
//! A QP's state is read for the event only when a subscriber wants it.

use provider::trace::Hex;
use provider::{QpModify, QpState, QpType};

/// Whether a subscriber takes QP state changes: only then is the state
/// before a modify worth a query.
pub(crate) fn wants_transitions() -> bool {
    tracing::enabled!(target: "ibal::qp", tracing::Level::DEBUG)
}

/// A modify of QP `qpn` from `from` (when it was read) ended in `result`.
pub(crate) fn modified(
    qpn: u32,
    qp_type: QpType,
    from: Option<QpState>,
    m: &QpModify,
    result: &al::Result<()>,
) {
    match result {
        Ok(()) => tracing::debug!(
            target: "ibal::qp",
            qpn = %Hex(qpn),
            qp_type = ?qp_type,
            from = from.map(tracing::field::debug),
            to = ?m.state,
            "QP state change"
        ),
        Err(e) => tracing::debug!(
            target: "ibal::qp",
            qpn = %Hex(qpn),
            qp_type = ?qp_type,
            from = from.map(tracing::field::debug),
            to = ?m.state,
            error = %e,
            "QP modify refused"
        ),
    }
}
