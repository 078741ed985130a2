//! Where a CEP's request stands in the request window (`pacing.rs` runs
//! the window; this leaf holds the state it keeps in each CEP, so the
//! endpoint's struct names it without importing the window's code).

use crate::proto::State;

/// Where a CEP's request is in the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Pacing {
    /// No paced request (none outstanding, or a REP).
    #[default]
    Off,
    /// Made but not sent: waits for room in the window. Its retry timer
    /// is not armed; its MAD is `Conn::resend`.
    Waiting,
    /// Sent and not yet answered or ended: holds one place in the window.
    OnWire,
}

/// Whether a request sent in `state` is paced: every request but a REP.
pub(super) fn is_paced(state: State) -> bool {
    matches!(
        state,
        State::ReqSent | State::DreqSent | State::LapSent | State::SidrReqSent
    )
}
