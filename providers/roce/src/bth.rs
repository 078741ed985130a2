//! The Base Transport Header (IBTA vol. 1 §9.2), 12 bytes:
//!
//! ```text
//! byte 0     OpCode
//! byte 1     SE(7) M(6) PadCnt(5..4) TVer(3..0)
//! bytes 2-3  P_Key
//! byte 4     FECN(7) BECN(6) Resv6(5..0)   <- "Resv8a", masked by the ICRC
//! bytes 5-7  DestQP
//! byte 8     A(7) Resv7(6..0)
//! bytes 9-11 PSN
//! ```

use crate::bytes::{fits, put_u16, put_u24, room, take, u16_at, u24_at};
use crate::{DecodeError, EncodeError, Opcode, WireHeader};

/// A Base Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// The operation.
    pub opcode: Opcode,
    /// Solicited event: the responder should raise a completion event.
    pub solicited: bool,
    /// MigReq: the path migration state of the sender.
    pub mig_req: bool,
    /// Pad bytes (0..=3) after the payload that make it a 4-byte multiple.
    /// [`crate::Packet::encode`] computes it from the payload.
    pub pad_count: u8,
    /// Transport header version (4 bits); only 0 is defined.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// The 6 reserved bits after BECN (sent as 0, ignored on receipt).
    pub resv6: u8,
    /// Destination queue pair number (24 bits).
    pub dest_qp: u32,
    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub ack_req: bool,
    /// The 7 reserved bits after AckReq (sent as 0, ignored on receipt).
    pub resv7: u8,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A BTH with this opcode, destination QP and PSN, P_Key 0xffff (the
    /// default partition) and every flag clear.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }
}

impl WireHeader for Bth {
    const LEN: usize = 12;
    const NAME: &'static str = "BTH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        let opcode = Opcode::from_u8(b[0]).ok_or(DecodeError::UnknownOpcode(b[0]))?;
        let tver = b[1] & 0x0f;
        if tver != 0 {
            return Err(DecodeError::UnsupportedTransportVersion(tver));
        }
        Ok(Bth {
            opcode,
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 0x3,
            tver,
            pkey: u16_at(b, 2),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            resv6: b[4] & 0x3f,
            dest_qp: u24_at(b, 5),
            ack_req: b[8] & 0x80 != 0,
            resv7: b[8] & 0x7f,
            psn: u24_at(b, 9),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        fits("BTH pad count", self.pad_count.into(), 2)?;
        fits("BTH transport header version", self.tver.into(), 4)?;
        fits("BTH reserved (byte 4)", self.resv6.into(), 6)?;
        fits("BTH destination QP", self.dest_qp.into(), 24)?;
        fits("BTH reserved (byte 8)", self.resv7.into(), 7)?;
        fits("BTH PSN", self.psn.into(), 24)?;
        let b = room(out, Self::LEN)?;
        b[0] = self.opcode.value();
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | (self.pad_count << 4)
            | self.tver;
        put_u16(b, 2, self.pkey);
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | self.resv6;
        put_u24(b, 5, self.dest_qp);
        b[8] = (u8::from(self.ack_req) << 7) | self.resv7;
        put_u24(b, 9, self.psn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_lands_on_its_bits() {
        let bth = Bth {
            opcode: Opcode::UcSendOnly,
            solicited: true,
            mig_req: true,
            pad_count: 2,
            tver: 0,
            pkey: 0x8001,
            fecn: true,
            becn: false,
            resv6: 0x15,
            dest_qp: 0x00ab_cdef,
            ack_req: true,
            resv7: 0x2a,
            psn: 0x0012_3456,
        };
        let bytes = bth.to_vec().unwrap();
        assert_eq!(
            bytes,
            [0x24, 0xe0, 0x80, 0x01, 0x95, 0xab, 0xcd, 0xef, 0xaa, 0x12, 0x34, 0x56]
        );
        assert_eq!(Bth::decode(&bytes).unwrap(), bth);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            Bth::decode(&[0; 11]),
            Err(DecodeError::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        let mut b = Bth::new(Opcode::RcAck, 1, 2).to_vec().unwrap();
        b[1] |= 1;
        assert_eq!(
            Bth::decode(&b),
            Err(DecodeError::UnsupportedTransportVersion(1))
        );
        b[1] = 0;
        b[0] = 0x15;
        assert_eq!(Bth::decode(&b), Err(DecodeError::UnknownOpcode(0x15)));
        let wide = Bth::new(Opcode::RcAck, 1 << 24, 0);
        assert!(matches!(
            wide.to_vec(),
            Err(EncodeError::FieldOutOfRange { .. })
        ));
        assert!(matches!(
            Bth::new(Opcode::RcAck, 1, 1).encode(&mut [0; 4]),
            Err(EncodeError::BufferTooShort { need: 12, have: 4 })
        ));
    }
}
