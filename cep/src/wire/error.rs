//! [`WireError`]: why a buffer could not be decoded or a message could
//! not be encoded.

use core::fmt;

use super::frame::{BASE_VERSION, CM_CLASS_VERSION, MAD_LEN, METHOD_SEND, MGMT_CLASS_CM};

/// Why a buffer could not be decoded or a message could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is not exactly [`MAD_LEN`] bytes (or, for
    /// [`MadHeader::decode`], shorter than [`HEADER_LEN`]).
    ///
    /// [`MadHeader::decode`]: crate::wire::MadHeader::decode
    /// [`HEADER_LEN`]: crate::wire::HEADER_LEN
    BadLength {
        /// Length of the buffer that was given.
        got: usize,
    },
    /// BaseVersion other than [`BASE_VERSION`] (the value found).
    BadBaseVersion(u8),
    /// MgmtClass other than CM (0x07).
    BadClass(u8),
    /// ClassVersion other than [`CM_CLASS_VERSION`] (the value found).
    BadClassVersion(u8),
    /// Method byte (R bit included) other than Send (0x03).
    BadMethod(u8),
    /// AttributeID that is not one of the eleven CM messages.
    UnknownAttribute(u16),
    /// Encoding: the value does not fit the field's wire width.
    FieldOutOfRange {
        /// Name of the field, as in the layout tables (`"REQ LocalQPN"`).
        field: &'static str,
        /// The value that does not fit.
        value: u64,
    },
    /// The private data does not fit the message's private data area.
    PrivateDataTooLong {
        /// Size of the message's private data area.
        max: usize,
        /// Length of the data that was given.
        got: usize,
    },
    /// Decoding: an enumerated field holds a reserved value.
    Reserved {
        /// Name of the field, as in the layout tables.
        field: &'static str,
        /// The reserved value found.
        value: u64,
    },
    /// Encoding: an `Other(code)` was given for a code that has a named
    /// variant. Refused so that each wire value has a single representation.
    NonCanonical {
        /// Name of the field, as in the layout tables.
        field: &'static str,
        /// The code that was wrapped in `Other`.
        value: u64,
    },
}

/// A wire error met by an application (private data too long, a field out
/// of range) is a bad parameter, so `?` works in code returning
/// `al::Result`.
impl From<WireError> for al::Error {
    fn from(e: WireError) -> al::Error {
        al::Error::InvalidParameter(e.to_string().into())
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadLength { got } => {
                write!(f, "CM MAD must be exactly {MAD_LEN} bytes, got {got}")
            }
            Self::BadBaseVersion(v) => {
                write!(
                    f,
                    "unsupported MAD BaseVersion {v} (expected {BASE_VERSION})"
                )
            }
            Self::BadClass(c) => write!(
                f,
                "MgmtClass {c:#04x} is not Communication Management ({MGMT_CLASS_CM:#04x})"
            ),
            Self::BadClassVersion(v) => write!(
                f,
                "unsupported CM ClassVersion {v} (expected {CM_CLASS_VERSION})"
            ),
            Self::BadMethod(m) => write!(
                f,
                "Method {m:#04x} is not Send ({METHOD_SEND:#04x}); CM messages are Sends"
            ),
            Self::UnknownAttribute(a) => {
                write!(f, "AttributeID {a:#06x} is not a CM message")
            }
            Self::FieldOutOfRange { field, value } => {
                write!(f, "{field}: value {value:#x} does not fit the field")
            }
            Self::PrivateDataTooLong { max, got } => write!(
                f,
                "private data is {got} bytes, the message carries at most {max}"
            ),
            Self::Reserved { field, value } => {
                write!(f, "{field}: reserved value {value}")
            }
            Self::NonCanonical { field, value } => write!(
                f,
                "{field}: code {value} has a named variant; use it instead of Other"
            ),
        }
    }
}

impl std::error::Error for WireError {}
