//! What can go wrong reading or writing a packet.

use std::fmt;

use crate::Opcode;

/// Why a byte string is not a valid RoCEv2 packet (or header, or frame).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the named header or field needs.
    Truncated {
        /// The header or field being read.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there were.
        have: usize,
    },
    /// A BTH opcode this codec does not know (RD, XRC, reserved, vendor).
    UnknownOpcode(u8),
    /// A BTH transport header version other than 0 (IBTA vol. 1 §9.2: the
    /// only version defined; Linux rxe drops others in `rxe_recv.c`).
    UnsupportedTransportVersion(u8),
    /// An AETH syndrome with a reserved type or NAK code.
    ReservedSyndrome(u8),
    /// The packet is not a whole number of 4-byte words (every IBA packet is).
    Misaligned {
        /// Length of the UDP payload.
        len: usize,
    },
    /// The BTH pad count is larger than the bytes after the headers.
    PadTooLarge {
        /// The pad count in the BTH.
        pad: u8,
        /// Bytes between the last header and the ICRC.
        available: usize,
    },
    /// Bytes (payload or pad) after the headers of an opcode that carries none.
    UnexpectedPayload {
        /// The packet's opcode.
        opcode: Opcode,
        /// Bytes between the last header and the ICRC.
        len: usize,
    },
    /// The ICRC the packet carries is not the one computed over it.
    IcrcMismatch {
        /// The ICRC in the packet (as [`crate::icrc`] returns it).
        carried: u32,
        /// The ICRC computed over the packet.
        computed: u32,
    },
    /// The frame's IP version nibble is neither 4 nor 6.
    NotIp {
        /// The version nibble.
        version: u8,
    },
    /// An IPv4 header with options (IHL other than 5): the ICRC pseudo header
    /// has no room for them, and RoCEv2 senders never add them.
    Ipv4Options {
        /// The IHL field, in 32-bit words.
        ihl: u8,
    },
    /// An IPv4 fragment (more-fragments set or a fragment offset): RoCEv2
    /// packets are never fragmented.
    Ipv4Fragment,
    /// The IP header's protocol / next header is not UDP (17).
    NotUdp {
        /// The protocol number.
        protocol: u8,
    },
    /// A UDP payload longer than any UDP datagram over the given IP version.
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A length field disagrees with the bytes present.
    LengthMismatch {
        /// Which length field.
        field: &'static str,
        /// The value the field holds.
        claimed: usize,
        /// The length the bytes imply.
        actual: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { what, need, have } => {
                write!(f, "truncated {what}: needs {need} bytes, {have} present")
            }
            Self::UnknownOpcode(op) => write!(f, "unknown or unsupported BTH opcode {op:#04x}"),
            Self::UnsupportedTransportVersion(v) => {
                write!(f, "BTH transport header version {v} (only 0 is defined)")
            }
            Self::ReservedSyndrome(s) => write!(f, "reserved AETH syndrome {s:#04x}"),
            Self::Misaligned { len } => {
                write!(f, "packet of {len} bytes is not a multiple of 4 bytes")
            }
            Self::PadTooLarge { pad, available } => write!(
                f,
                "BTH pad count {pad} but only {available} bytes follow the headers"
            ),
            Self::UnexpectedPayload { opcode, len } => write!(
                f,
                "{opcode} carries no payload, but {len} bytes follow its headers"
            ),
            Self::IcrcMismatch { carried, computed } => write!(
                f,
                "ICRC mismatch: packet carries {carried:#010x}, computed {computed:#010x}"
            ),
            Self::NotIp { version } => write!(f, "IP version {version} (expected 4 or 6)"),
            Self::Ipv4Options { ihl } => {
                write!(f, "IPv4 header with options (IHL {ihl}, expected 5)")
            }
            Self::Ipv4Fragment => write!(f, "IPv4 fragment (RoCEv2 is never fragmented)"),
            Self::NotUdp { protocol } => write!(f, "IP protocol {protocol} is not UDP (17)"),
            Self::TooLong { len } => {
                write!(
                    f,
                    "UDP payload of {len} bytes exceeds the 65535-byte IP limit"
                )
            }
            Self::LengthMismatch {
                field,
                claimed,
                actual,
            } => write!(
                f,
                "{field} says {claimed} bytes but the data implies {actual}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a packet could not be encoded.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// A field holds a value wider than its wire field.
    FieldOutOfRange {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },
    /// The output buffer is too small.
    BufferTooShort {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The opcode needs an extension header the packet does not have.
    MissingHeader {
        /// The packet's opcode.
        opcode: Opcode,
        /// The missing header.
        header: &'static str,
    },
    /// The packet has an extension header its opcode does not carry.
    UnexpectedHeader {
        /// The packet's opcode.
        opcode: Opcode,
        /// The extra header.
        header: &'static str,
    },
    /// A payload given for an opcode that carries none.
    PayloadNotAllowed {
        /// The packet's opcode.
        opcode: Opcode,
        /// The payload length given.
        len: usize,
    },
    /// The datagram would exceed the 65535-byte UDP/IP length fields.
    TooLong {
        /// The IP packet length it would have.
        len: usize,
    },
    /// Source and destination addresses of different IP versions.
    MixedAddressFamilies,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FieldOutOfRange { field, value, max } => {
                write!(f, "{field} = {value:#x} does not fit (max {max:#x})")
            }
            Self::BufferTooShort { need, have } => {
                write!(f, "buffer of {have} bytes, {need} needed")
            }
            Self::MissingHeader { opcode, header } => write!(f, "{opcode} needs a {header}"),
            Self::UnexpectedHeader { opcode, header } => {
                write!(f, "{opcode} carries no {header}")
            }
            Self::PayloadNotAllowed { opcode, len } => {
                write!(f, "{opcode} carries no payload ({len} bytes given)")
            }
            Self::TooLong { len } => write!(f, "datagram of {len} bytes exceeds 65535"),
            Self::MixedAddressFamilies => {
                write!(f, "source and destination are of different IP versions")
            }
        }
    }
}

impl std::error::Error for EncodeError {}
