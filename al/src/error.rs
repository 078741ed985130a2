//! The one error type of the access layer.
//!
//! Each variant carries the meaning of one of IBAL's `ib_api_status_t`
//! codes ([`Error::status`] names it), plus enough context for the
//! `Display` text to say what went wrong without a debugger.

use std::borrow::Cow;
use std::fmt;

use crate::handle::Kind;
use crate::report::LeakReport;

/// Short description carried by several variants.
pub type Detail = Cow<'static, str>;

/// Every failure the access layer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The handle names no live object of the expected type in this AL
    /// instance: stale (destroyed), forged, of another type, or of another
    /// AL instance. (`IB_INVALID_HANDLE` and its typed siblings.)
    InvalidHandle {
        /// The kind of object the call expected.
        expected: Kind,
        /// The handle's raw value, as given.
        raw: u64,
    },
    /// The object is being destroyed; the first destroy call owns it now.
    Destroying {
        /// The kind of the object being destroyed.
        kind: Kind,
        /// Its handle's raw value (0 when the object has none to report).
        raw: u64,
    },
    /// The call is not valid in the object's current state (`IB_INVALID_STATE`).
    InvalidState(Detail),
    /// A QP state transition the IBTA state machine does not allow
    /// (`IB_INVALID_QP_STATE`).
    InvalidQpState(Detail),
    /// The object is still in use by others and cannot go (`IB_RESOURCE_BUSY`).
    ResourceBusy(Detail),
    /// A parameter is out of range or inconsistent (`IB_INVALID_PARAMETER`).
    InvalidParameter(Detail),
    /// A setting is not supported by the device (`IB_INVALID_SETTING`).
    InvalidSetting(Detail),
    /// A table or queue is full (`IB_INSUFFICIENT_RESOURCES`).
    InsufficientResources(Detail),
    /// An allocation failed (`IB_INSUFFICIENT_MEMORY`).
    InsufficientMemory,
    /// No such device, port, service or entry (`IB_NOT_FOUND`).
    NotFound(Detail),
    /// The operation timed out (`IB_TIMEOUT`).
    Timeout(Detail),
    /// The operation was cancelled (`IB_CANCELED`).
    Canceled(Detail),
    /// The device or build does not support this (`IB_UNSUPPORTED`).
    Unsupported(Detail),
    /// A memory key or access right does not allow the access
    /// (`IB_INVALID_PERMISSION`, `IB_INVALID_LKEY`, `IB_INVALID_RKEY`).
    InvalidPermission(Detail),
    /// A queue overflowed (`IB_OVERFLOW`).
    Overflow(Detail),
    /// The QP is already bound to a connection (IBAL reports
    /// `IB_INVALID_STATE`; kept apart here because callers act on it).
    AlreadyConnected,
    /// The QP is in timewait and cannot connect yet (`IB_QP_IN_TIMEWAIT`).
    QpInTimewait,
    /// A blocking `*_sync` call was made from the callback executor, where
    /// waiting would deadlock; use the asynchronous call instead.
    WouldDeadlock(Detail),
    /// The remote side reported an error (`IB_REMOTE_ERROR`).
    RemoteError(Detail),
    /// Closing an AL instance gave up waiting: after destroying everything
    /// it owned, objects were still held (by references kept past their
    /// call, or callbacks that did not return) when its close timeout
    /// passed. The report names each of them. The close itself is done:
    /// nothing new can be created, and each leftover is released (its
    /// destroy callback run) once its last reference goes. IBAL would
    /// answer `IB_RESOURCE_BUSY`.
    Leaked(Box<LeakReport>),
    /// Anything else (`IB_ERROR`).
    Other(Detail),
}

impl Error {
    /// The IBAL status code name this error corresponds to.
    pub fn status(&self) -> &'static str {
        match self {
            Error::InvalidHandle { .. } => "IB_INVALID_HANDLE",
            Error::Destroying { .. } => "IB_INVALID_STATE",
            Error::InvalidState(_) | Error::AlreadyConnected => "IB_INVALID_STATE",
            Error::InvalidQpState(_) => "IB_INVALID_QP_STATE",
            Error::ResourceBusy(_) => "IB_RESOURCE_BUSY",
            Error::InvalidParameter(_) => "IB_INVALID_PARAMETER",
            Error::InvalidSetting(_) => "IB_INVALID_SETTING",
            Error::InsufficientResources(_) => "IB_INSUFFICIENT_RESOURCES",
            Error::InsufficientMemory => "IB_INSUFFICIENT_MEMORY",
            Error::NotFound(_) => "IB_NOT_FOUND",
            Error::Timeout(_) => "IB_TIMEOUT",
            Error::Canceled(_) => "IB_CANCELED",
            Error::Unsupported(_) => "IB_UNSUPPORTED",
            Error::InvalidPermission(_) => "IB_INVALID_PERMISSION",
            Error::Overflow(_) => "IB_OVERFLOW",
            Error::QpInTimewait => "IB_QP_IN_TIMEWAIT",
            Error::WouldDeadlock(_) => "IB_INVALID_STATE",
            Error::RemoteError(_) => "IB_REMOTE_ERROR",
            Error::Leaked(_) => "IB_RESOURCE_BUSY",
            Error::Other(_) => "IB_ERROR",
        }
    }

    /// Whether this error says the object of `kind` the call named is gone
    /// or going (`Destroying` of that kind, or `InvalidHandle` for a handle
    /// of that kind). For example, a failed `cep::cm::accept` left its CEP
    /// as it was unless `e.is_gone(Kind::CEP)`.
    pub fn is_gone(&self, kind: Kind) -> bool {
        match self {
            Error::Destroying { kind: k, .. } => *k == kind,
            Error::InvalidHandle { expected, .. } => *expected == kind,
            _ => false,
        }
    }

    /// Shorthand for [`Error::InvalidState`].
    pub fn invalid_state(detail: impl Into<Detail>) -> Self {
        Error::InvalidState(detail.into())
    }

    /// Shorthand for [`Error::InvalidParameter`].
    pub fn invalid_parameter(detail: impl Into<Detail>) -> Self {
        Error::InvalidParameter(detail.into())
    }

    /// Shorthand for [`Error::InsufficientResources`].
    pub fn insufficient_resources(detail: impl Into<Detail>) -> Self {
        Error::InsufficientResources(detail.into())
    }

    /// Shorthand for [`Error::ResourceBusy`].
    pub fn busy(detail: impl Into<Detail>) -> Self {
        Error::ResourceBusy(detail.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidHandle { expected, raw } => write!(
                f,
                "invalid {expected} handle {raw:#018x}: no live {expected} of this AL instance has it \
                 (destroyed, forged, another type or another instance)"
            ),
            Error::Destroying { kind, raw } => {
                write!(f, "{kind} {raw:#018x} is already being destroyed")
            }
            Error::InvalidState(d) => write!(f, "invalid state: {d}"),
            Error::InvalidQpState(d) => write!(f, "invalid QP state transition: {d}"),
            Error::ResourceBusy(d) => write!(f, "resource busy: {d}"),
            Error::InvalidParameter(d) => write!(f, "invalid parameter: {d}"),
            Error::InvalidSetting(d) => write!(f, "invalid setting: {d}"),
            Error::InsufficientResources(d) => write!(f, "insufficient resources: {d}"),
            Error::InsufficientMemory => write!(f, "insufficient memory"),
            Error::NotFound(d) => write!(f, "not found: {d}"),
            Error::Timeout(d) => write!(f, "timed out: {d}"),
            Error::Canceled(d) => write!(f, "canceled: {d}"),
            Error::Unsupported(d) => write!(f, "unsupported: {d}"),
            Error::InvalidPermission(d) => write!(f, "permission denied: {d}"),
            Error::Overflow(d) => write!(f, "overflow: {d}"),
            Error::AlreadyConnected => {
                write!(f, "the QP is already bound to a connection endpoint")
            }
            Error::QpInTimewait => write!(f, "the QP is in timewait"),
            Error::WouldDeadlock(d) => write!(
                f,
                "{d}: a blocking call was made from the callback executor, where it would wait \
                 for itself; use the asynchronous form"
            ),
            Error::RemoteError(d) => write!(f, "remote error: {d}"),
            Error::Leaked(report) => fmt::Display::fmt(report, f),
            Error::Other(d) => write!(f, "{d}"),
        }
    }
}

impl std::error::Error for Error {}

/// The access layer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(all(test, not(ibal_loom)))]
mod tests {
    use super::*;

    #[test]
    fn is_gone_names_only_the_kind_the_error_is_about() {
        let destroying = Error::Destroying {
            kind: Kind::CEP,
            raw: 7,
        };
        let stale = Error::InvalidHandle {
            expected: Kind::CEP,
            raw: 7,
        };
        let stale_qp = Error::InvalidHandle {
            expected: Kind::QP,
            raw: 7,
        };
        assert!(destroying.is_gone(Kind::CEP) && stale.is_gone(Kind::CEP));
        assert!(!destroying.is_gone(Kind::QP) && !stale_qp.is_gone(Kind::CEP));
        assert!(!Error::AlreadyConnected.is_gone(Kind::CEP));
        assert!(!Error::invalid_state("x").is_gone(Kind::CEP));
    }
}
