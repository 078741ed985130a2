//! The ACK Extended Transport Header (IBTA vol. 1 §9.3.5 and §9.7.5.1):
//! a syndrome byte and a 24-bit message sequence number.
//!
//! Syndrome bits: 7 reserved (0); 6..5 the type (00 ACK, 01 RNR NAK,
//! 10 reserved, 11 NAK); 4..0 the credit count, the RNR timer or the NAK code.

use crate::bytes::{fits, put_u24, room, take, u24_at};
use crate::{DecodeError, EncodeError, WireHeader};

/// The NAK codes of a NAK syndrome (type 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (the responder expected an earlier PSN).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error (R_Key or bounds).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
}

impl NakCode {
    /// The 5-bit code.
    pub const fn value(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }

    /// The code with this value, if it is not reserved.
    pub const fn from_value(v: u8) -> Option<Self> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// What an AETH says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// A positive acknowledgement with the responder's end-to-end credit
    /// count (5 bits; 31 means "invalid", no credit information).
    Ack {
        /// The credit count code, 0..=31.
        credits: u8,
    },
    /// Receiver not ready: retry after the encoded time.
    RnrNak {
        /// The RNR NAK timer code, 0..=31 (IBTA table "RNR NAK timer field").
        timer: u8,
    },
    /// A negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Credit count code meaning "no credit information" (IBTA §9.7.7.2).
    pub const INVALID_CREDITS: u8 = 31;

    /// The syndrome byte. Fails if a credit count or timer exceeds 5 bits.
    pub fn to_u8(self) -> Result<u8, EncodeError> {
        Ok(match self {
            Syndrome::Ack { credits } => {
                fits("AETH credit count", credits.into(), 5)?;
                credits
            }
            Syndrome::RnrNak { timer } => {
                fits("AETH RNR timer", timer.into(), 5)?;
                0x20 | timer
            }
            Syndrome::Nak(code) => 0x60 | code.value(),
        })
    }

    /// The syndrome a byte encodes, or an error for reserved values.
    pub fn from_u8(b: u8) -> Result<Self, DecodeError> {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Ok(Syndrome::Ack { credits: low }),
            1 => Ok(Syndrome::RnrNak { timer: low }),
            3 => NakCode::from_value(low)
                .map(Syndrome::Nak)
                .ok_or(DecodeError::ReservedSyndrome(b)),
            _ => Err(DecodeError::ReservedSyndrome(b)),
        }
    }
}

/// An ACK Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK, with its 5-bit argument.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits): messages the responder completed.
    pub msn: u32,
}

impl WireHeader for Aeth {
    const LEN: usize = 4;
    const NAME: &'static str = "AETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(Aeth {
            syndrome: Syndrome::from_u8(b[0])?,
            msn: u24_at(b, 1),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        let syndrome = self.syndrome.to_u8()?;
        fits("AETH MSN", self.msn.into(), 24)?;
        let b = room(out, Self::LEN)?;
        b[0] = syndrome;
        put_u24(b, 1, self.msn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes() {
        let cases = [
            (Syndrome::Ack { credits: 31 }, 0x1f),
            (Syndrome::Ack { credits: 0 }, 0x00),
            (Syndrome::RnrNak { timer: 14 }, 0x2e),
            (Syndrome::Nak(NakCode::PsnSequenceError), 0x60),
            (Syndrome::Nak(NakCode::InvalidRequest), 0x61),
            (Syndrome::Nak(NakCode::RemoteAccessError), 0x62),
            (Syndrome::Nak(NakCode::RemoteOperationalError), 0x63),
            (Syndrome::Nak(NakCode::InvalidRdRequest), 0x64),
        ];
        for (s, b) in cases {
            assert_eq!(s.to_u8().unwrap(), b);
            assert_eq!(Syndrome::from_u8(b).unwrap(), s);
        }
        for reserved in [0x40, 0x5f, 0x65, 0x7f, 0x80, 0xe0] {
            assert_eq!(
                Syndrome::from_u8(reserved),
                Err(DecodeError::ReservedSyndrome(reserved))
            );
        }
        assert!(Syndrome::RnrNak { timer: 32 }.to_u8().is_err());
    }

    #[test]
    fn aeth_bytes() {
        let a = Aeth {
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn: 0x01_0203,
        };
        let v = a.to_vec().unwrap();
        assert_eq!(v, [0x62, 1, 2, 3]);
        assert_eq!(Aeth::decode(&v).unwrap(), a);
        assert!(Aeth::decode(&v[..3]).is_err());
    }
}
