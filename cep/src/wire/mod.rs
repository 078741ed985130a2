//! InfiniBand Communication Management (CM) MAD codec.
//!
//! Converts between the 256-byte CM MADs of IBTA Vol 1 chapter 12 and plain
//! Rust values. The codec is pure: no I/O, no state, no dependency on the rest
//! of the stack, so it can be fuzzed and tested in isolation and reused by
//! anything that needs to look at CM traffic.
//!
//! * [`decode`] accepts exactly one MAD (exactly [`MAD_LEN`] bytes; a MAD is
//!   a fixed-size datagram payload, so a longer buffer means the caller framed
//!   it wrongly rather than "a MAD plus trailing bytes"). It validates the
//!   header (BaseVersion 1, class 0x07, ClassVersion 2, Method Send), the
//!   AttributeID and the enumerations whose reserved values would leave the
//!   message meaningless. It never panics, whatever the input.
//! * [`encode`] checks that every field fits its wire width (for example a
//!   QPN of 2^24 is an error rather than silently truncated) and writes every
//!   reserved bit as zero.
//! * For every message `decode(&encode(m)?) == Ok(m)`, and for every buffer
//!   `b` that decodes, `encode(decode(b)?)` equals `b` on every bit of
//!   [`defined_bits_mask`].
//!
//! The layout of every message, what is reserved and what is validated is
//! written up in `docs/cm-wire-codec.md`.
//!
//! ```
//! use cep::wire::{self, CmMad, CmMessage, Dreq, PrivateData, WireError};
//!
//! let dreq = Dreq {
//!     local_comm_id: 7,
//!     remote_comm_id: 9,
//!     remote_qpn_eecn: 0x00_1234,
//!     private_data: PrivateData::new(b"bye")?,
//! };
//! let bytes = wire::encode(&CmMad::new(0x42, dreq))?;
//! assert_eq!(&bytes[32..35], &[0x00, 0x12, 0x34]); // data offset 8
//!
//! let mad = wire::decode(&bytes)?;
//! assert_eq!(mad.message, CmMessage::Dreq(dreq));
//!
//! let too_wide = Dreq { remote_qpn_eecn: 1 << 24, ..dreq };
//! assert!(matches!(
//!     wire::encode(&CmMad::new(0x42, too_wide)),
//!     Err(WireError::FieldOutOfRange { .. })
//! ));
//! # Ok::<(), WireError>(())
//! ```

pub mod attr;
mod bits;
mod codes;
mod error;
mod frame;
mod header;
pub mod ip_cm;
mod messages;

#[cfg(test)]
mod tests;

use bits::{Reader, Writer};
use messages::Body;

pub use codes::{
    ApStatus, FailoverAccepted, MessageMraed, MessageRejected, RejectReason, SidrStatus,
    TransportType,
};
pub use error::WireError;
pub use frame::{
    BASE_VERSION, CM_CLASS_VERSION, DATA_LEN, HEADER_LEN, MAD_LEN, METHOD_SEND, MGMT_CLASS_CM,
};
pub use header::MadHeader;
pub use messages::{
    Apr, Drep, Dreq, Lap, Mra, PathInfo, PrivateData, Rej, Rep, Req, Rtu, SidrRep, SidrReq,
    INFO_LEN,
};

/// Any CM message body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// Connection request.
    Req(Req),
    /// Message receipt acknowledgement.
    Mra(Mra),
    /// Reject.
    Rej(Rej),
    /// Connection reply.
    Rep(Rep),
    /// Ready to use.
    Rtu(Rtu),
    /// Disconnect request.
    Dreq(Dreq),
    /// Disconnect reply.
    Drep(Drep),
    /// Service ID resolution request.
    SidrReq(SidrReq),
    /// Service ID resolution reply.
    SidrRep(SidrRep),
    /// Load alternate path.
    Lap(Lap),
    /// Alternate path response.
    Apr(Apr),
}

impl CmMessage {
    /// AttributeID that carries this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Self::Req(_) => attr::REQ,
            Self::Mra(_) => attr::MRA,
            Self::Rej(_) => attr::REJ,
            Self::Rep(_) => attr::REP,
            Self::Rtu(_) => attr::RTU,
            Self::Dreq(_) => attr::DREQ,
            Self::Drep(_) => attr::DREP,
            Self::SidrReq(_) => attr::SIDR_REQ,
            Self::SidrRep(_) => attr::SIDR_REP,
            Self::Lap(_) => attr::LAP,
            Self::Apr(_) => attr::APR,
        }
    }

    /// Short upper-case name, for logs and traces (`"REQ"`, `"SIDR_REP"`, ...).
    pub const fn message_kind(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
            Self::SidrReq(_) => "SIDR_REQ",
            Self::SidrRep(_) => "SIDR_REP",
            Self::Lap(_) => "LAP",
            Self::Apr(_) => "APR",
        }
    }

    fn read(attribute_id: u16, r: &Reader<'_>) -> Result<Self, WireError> {
        Ok(match attribute_id {
            attr::REQ => Self::Req(Req::read(r)?),
            attr::MRA => Self::Mra(Mra::read(r)?),
            attr::REJ => Self::Rej(Rej::read(r)?),
            attr::REP => Self::Rep(Rep::read(r)?),
            attr::RTU => Self::Rtu(Rtu::read(r)?),
            attr::DREQ => Self::Dreq(Dreq::read(r)?),
            attr::DREP => Self::Drep(Drep::read(r)?),
            attr::SIDR_REQ => Self::SidrReq(SidrReq::read(r)?),
            attr::SIDR_REP => Self::SidrRep(SidrRep::read(r)?),
            attr::LAP => Self::Lap(Lap::read(r)?),
            attr::APR => Self::Apr(Apr::read(r)?),
            other => return Err(WireError::UnknownAttribute(other)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        match self {
            Self::Req(m) => m.write(w),
            Self::Mra(m) => m.write(w),
            Self::Rej(m) => m.write(w),
            Self::Rep(m) => m.write(w),
            Self::Rtu(m) => m.write(w),
            Self::Dreq(m) => m.write(w),
            Self::Drep(m) => m.write(w),
            Self::SidrReq(m) => m.write(w),
            Self::SidrRep(m) => m.write(w),
            Self::Lap(m) => m.write(w),
            Self::Apr(m) => m.write(w),
        }
    }
}

macro_rules! impl_from_message {
    ($($variant:ident),*) => {
        $(impl From<$variant> for CmMessage {
            fn from(m: $variant) -> Self {
                Self::$variant(m)
            }
        })*
    };
}
impl_from_message!(Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep, Lap, Apr);

/// A decoded CM MAD: the message plus the header fields that vary between
/// MADs. The constant header fields (versions, class, method) and the
/// AttributeID (implied by the message) are not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// Chosen by the sender of a request; replies reuse the request's.
    pub transaction_id: u64,
    /// Zero except where ECE uses it (REQ, REP, SIDR_REP); kept verbatim for
    /// every message.
    pub attribute_modifier: u32,
    /// The message body; it also determines the AttributeID.
    pub message: CmMessage,
}

impl CmMad {
    /// A MAD carrying `message` under `transaction_id`, with AttributeModifier 0.
    pub fn new(transaction_id: u64, message: impl Into<CmMessage>) -> Self {
        Self {
            transaction_id,
            attribute_modifier: 0,
            message: message.into(),
        }
    }

    /// See [`decode`].
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        decode(buf)
    }

    /// See [`encode`].
    pub fn encode(&self) -> Result<[u8; MAD_LEN], WireError> {
        encode(self)
    }

    /// The header this MAD is sent with.
    pub fn header(&self) -> MadHeader {
        MadHeader::cm_send(
            self.message.attribute_id(),
            self.transaction_id,
            self.attribute_modifier,
        )
    }

    /// Short upper-case name of the message; see [`CmMessage::message_kind`].
    pub const fn message_kind(&self) -> &'static str {
        self.message.message_kind()
    }
}

/// Decodes one CM MAD. `buf` must be exactly [`MAD_LEN`] bytes.
pub fn decode(buf: &[u8]) -> Result<CmMad, WireError> {
    let mad: &[u8; MAD_LEN] = buf
        .try_into()
        .map_err(|_| WireError::BadLength { got: buf.len() })?;
    let r = Reader::new(mad);
    let header = MadHeader::read(&r);
    header.validate_cm()?;
    let message = CmMessage::read(header.attribute_id, &r)?;
    Ok(CmMad {
        transaction_id: header.transaction_id,
        attribute_modifier: header.attribute_modifier,
        message,
    })
}

/// Encodes one CM MAD, with every reserved bit zero.
pub fn encode(mad: &CmMad) -> Result<[u8; MAD_LEN], WireError> {
    let mut w = Writer::new();
    mad.header().write(&mut w);
    mad.message.write(&mut w)?;
    Ok(w.finish())
}

/// Whether [`encode`] would accept `mad`, with the same error, without
/// building the bytes (every field's range is checked, nothing is stored).
pub fn validate(mad: &CmMad) -> Result<(), WireError> {
    mad.message.write(&mut Writer::checker())
}

/// The bits of a MAD with this AttributeID that survive
/// `encode(decode(b))`: every defined field of the message, plus the header
/// fields the codec keeps (BaseVersion, MgmtClass, ClassVersion, Method,
/// TransactionID, AttributeID, AttributeModifier). Everything else is reserved
/// and encoded as zero. `None` for an AttributeID that is not a CM message.
pub fn defined_bits_mask(attribute_id: u16) -> Option<[u8; MAD_LEN]> {
    fn body<B: Body>(w: &mut Writer) {
        debug_assert!(attr::name(B::ATTR).is_some());
        B::fill_mask(w);
    }

    let mut w = Writer::new();
    for f in header::PRESERVED_FIELDS {
        w.fill_field(*f);
    }
    match attribute_id {
        attr::REQ => body::<Req>(&mut w),
        attr::MRA => body::<Mra>(&mut w),
        attr::REJ => body::<Rej>(&mut w),
        attr::REP => body::<Rep>(&mut w),
        attr::RTU => body::<Rtu>(&mut w),
        attr::DREQ => body::<Dreq>(&mut w),
        attr::DREP => body::<Drep>(&mut w),
        attr::SIDR_REQ => body::<SidrReq>(&mut w),
        attr::SIDR_REP => body::<SidrRep>(&mut w),
        attr::LAP => body::<Lap>(&mut w),
        attr::APR => body::<Apr>(&mut w),
        _ => return None,
    }
    Some(w.finish())
}

/// Duration of a CM timeout exponent, in nanoseconds: 4.096 us x 2^`t`.
///
/// The wire fields are 5 bits, so real values are 0..=31 (about 2.4 hours at
/// 31). Larger inputs are not masked (a caller that adds exponents, say for
/// 2 x PacketLifeTime, should get a longer wait, not a wrapped-around short
/// one); they saturate at `u64::MAX`.
pub const fn cm_timeout_to_nanos(t: u8) -> u64 {
    const BASE_NS: u64 = 4096;
    // 4096 = 2^12, so the product overflows from t = 52 on.
    if t >= 52 {
        u64::MAX
    } else {
        BASE_NS << t
    }
}
