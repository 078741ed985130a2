//! The API calls the run makes and the errors each documents.

use al::{Error, Handle, Kind};
use cep::cm::Cep;

/// The API calls the stress run (and the `al_api` fuzz check) make, each
/// with the errors it is documented to return under concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    OpenAl,
    CloseAl,
    OpenCa,
    AttachCm,
    CloseCa,
    AllocPd,
    DestroyPd,
    CreateCq,
    DestroyCq,
    CreateQp,
    DestroyQp,
    RegisterMr,
    DestroyMr,
    Listen,
    DestroyListen,
    Connect,
    Accept,
    Reject,
    Mra,
    Rtu,
    Disconnect,
    DisconnectReply,
    DestroyCep,
    SidrRequest,
    SidrReply,
}

impl Op {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::OpenAl => "open_al",
            Op::CloseAl => "close_al",
            Op::OpenCa => "open_ca",
            Op::AttachCm => "attach_cm",
            Op::CloseCa => "close_ca",
            Op::AllocPd => "alloc_pd",
            Op::DestroyPd => "destroy_pd",
            Op::CreateCq => "create_cq",
            Op::DestroyCq => "destroy_cq",
            Op::CreateQp => "create_qp",
            Op::DestroyQp => "destroy_qp",
            Op::RegisterMr => "register_mr",
            Op::DestroyMr => "destroy_mr",
            Op::Listen => "listen",
            Op::DestroyListen => "destroy_listen",
            Op::Connect => "connect",
            Op::Accept => "accept",
            Op::Reject => "reject",
            Op::Mra => "mra",
            Op::Rtu => "rtu",
            Op::Disconnect => "disconnect",
            Op::DisconnectReply => "disconnect_reply",
            Op::DestroyCep => "destroy_cep",
            Op::SidrRequest => "sidr_request",
            Op::SidrReply => "sidr_reply",
        }
    }

    /// Whether `e` is an answer this call documents (for a caller racing
    /// other threads, the CM and the network). Anything else is a failure.
    pub fn allows(self, e: &Error) -> bool {
        use Error as E;
        // Any call naming an object may find it destroyed or being destroyed.
        let gone = matches!(e, E::InvalidHandle { .. } | E::Destroying { .. });
        gone || match self {
            Op::OpenAl | Op::CloseAl => false,
            Op::OpenCa | Op::AllocPd | Op::CreateCq | Op::RegisterMr | Op::AttachCm => {
                matches!(e, E::InsufficientResources(_))
            }
            Op::CreateQp => matches!(
                e,
                E::InsufficientResources(_) | E::ResourceBusy(_) | E::InvalidState(_)
            ),
            Op::CloseCa | Op::DestroyPd | Op::DestroyQp | Op::DestroyMr => false,
            Op::DestroyListen | Op::DestroyCep => false,
            Op::DestroyCq => matches!(e, E::ResourceBusy(_)),
            Op::Listen => matches!(e, E::InvalidSetting(_) | E::InsufficientResources(_)),
            Op::Connect => matches!(
                e,
                E::AlreadyConnected
                    | E::QpInTimewait
                    | E::InvalidParameter(_)
                    | E::InvalidState(_)
                    | E::InsufficientResources(_)
            ),
            Op::Accept => matches!(
                e,
                E::AlreadyConnected
                    | E::QpInTimewait
                    | E::InvalidParameter(_)
                    | E::InvalidState(_)
                    | E::InvalidQpState(_)
                    | E::NotFound(_)
            ),
            Op::Rtu => matches!(
                e,
                E::InvalidState(_) | E::InvalidQpState(_) | E::NotFound(_)
            ),
            Op::SidrRequest => matches!(e, E::InsufficientResources(_)),
            Op::Reject | Op::Mra | Op::Disconnect | Op::DisconnectReply | Op::SidrReply => {
                matches!(e, E::InvalidState(_) | E::NotFound(_))
            }
        }
    }
}

/// Whether `e` says the CEP `cep` is gone or going (destroyed by someone):
/// the one error after which `accept` may have changed something
/// (`cep::cm::accept`, "When accept fails").
pub fn says_cep_gone(e: &Error, cep: Handle<Cep>) -> bool {
    match e {
        Error::Destroying { kind, raw } => *kind == Kind::CEP && *raw == cep.as_u64(),
        Error::InvalidHandle { expected, raw } => *expected == Kind::CEP && *raw == cep.as_u64(),
        _ => false,
    }
}

/// The variant name of an error (what the report counts).
pub fn error_name(e: &Error) -> &'static str {
    match e {
        Error::InvalidHandle { .. } => "InvalidHandle",
        Error::Destroying { .. } => "Destroying",
        Error::InvalidState(_) => "InvalidState",
        Error::InvalidQpState(_) => "InvalidQpState",
        Error::ResourceBusy(_) => "ResourceBusy",
        Error::InvalidParameter(_) => "InvalidParameter",
        Error::InvalidSetting(_) => "InvalidSetting",
        Error::InsufficientResources(_) => "InsufficientResources",
        Error::InsufficientMemory => "InsufficientMemory",
        Error::NotFound(_) => "NotFound",
        Error::Timeout(_) => "Timeout",
        Error::Canceled(_) => "Canceled",
        Error::Unsupported(_) => "Unsupported",
        Error::InvalidPermission(_) => "InvalidPermission",
        Error::Overflow(_) => "Overflow",
        Error::AlreadyConnected => "AlreadyConnected",
        Error::QpInTimewait => "QpInTimewait",
        Error::WouldDeadlock(_) => "WouldDeadlock",
        Error::RemoteError(_) => "RemoteError",
        Error::Leaked(_) => "Leaked",
        _ => "Other",
    }
}

pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}
