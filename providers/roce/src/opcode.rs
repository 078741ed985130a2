//! BTH opcodes and the headers that follow each one (IBTA vol. 1 §9.2,
//! table "OpCode field"; cross-checked with Linux `include/rdma/ib_pack.h`
//! and `drivers/infiniband/sw/rxe/rxe_opcode.c`).
//!
//! The opcode's top three bits name the transport (000 RC, 001 UC, 011 UD,
//! 100 CNP in RoCEv2), the low five the operation.

use std::fmt;

/// The transport service an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (opcode bits 7..5 = 000).
    Rc,
    /// Unreliable Connected (001).
    Uc,
    /// Unreliable Datagram (011).
    Ud,
    /// RoCEv2 congestion notification (100; IBTA A17.9).
    Cnp,
}

/// Which headers follow the BTH for an opcode, in wire order (DETH, RETH,
/// AtomicETH, AETH, AtomicAckETH, ImmDt, IETH), and whether a payload may
/// follow them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Layout {
    /// A DETH (8 bytes) follows the BTH.
    pub deth: bool,
    /// A RETH (16 bytes).
    pub reth: bool,
    /// An AtomicETH (28 bytes).
    pub atomic_eth: bool,
    /// An AETH (4 bytes).
    pub aeth: bool,
    /// An AtomicAckETH (8 bytes).
    pub atomic_ack_eth: bool,
    /// Immediate data (4 bytes).
    pub imm: bool,
    /// An IETH (4 bytes).
    pub ieth: bool,
    /// 16 reserved bytes (the CNP's body).
    pub cnp_reserved: bool,
    /// A payload may follow the headers (possibly empty, padded to 4 bytes).
    pub payload: bool,
}

impl Layout {
    /// Bytes of the headers after the BTH.
    pub const fn ext_len(&self) -> usize {
        let mut n = 0;
        if self.deth {
            n += 8;
        }
        if self.reth {
            n += 16;
        }
        if self.atomic_eth {
            n += 28;
        }
        if self.aeth {
            n += 4;
        }
        if self.atomic_ack_eth {
            n += 8;
        }
        if self.imm {
            n += 4;
        }
        if self.ieth {
            n += 4;
        }
        if self.cnp_reserved {
            n += 16;
        }
        n
    }
}

const NONE: Layout = Layout {
    deth: false,
    reth: false,
    atomic_eth: false,
    aeth: false,
    atomic_ack_eth: false,
    imm: false,
    ieth: false,
    cnp_reserved: false,
    payload: false,
};
const DATA: Layout = Layout {
    payload: true,
    ..NONE
};
const DATA_IMM: Layout = Layout { imm: true, ..DATA };
const DATA_IETH: Layout = Layout { ieth: true, ..DATA };
const RETH_DATA: Layout = Layout { reth: true, ..DATA };
const RETH_DATA_IMM: Layout = Layout {
    reth: true,
    ..DATA_IMM
};
const RETH_ONLY: Layout = Layout { reth: true, ..NONE };
const AETH_DATA: Layout = Layout { aeth: true, ..DATA };
const AETH_ONLY: Layout = Layout { aeth: true, ..NONE };
const ATOMIC_ACK: Layout = Layout {
    aeth: true,
    atomic_ack_eth: true,
    ..NONE
};
const ATOMIC: Layout = Layout {
    atomic_eth: true,
    ..NONE
};
const DETH_DATA: Layout = Layout { deth: true, ..DATA };
const DETH_DATA_IMM: Layout = Layout {
    deth: true,
    ..DATA_IMM
};
const CNP: Layout = Layout {
    cnp_reserved: true,
    ..NONE
};

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $transport:ident, $layout:ident, $text:literal; )*) => {
        /// A BTH opcode this codec encodes and decodes.
        #[non_exhaustive]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $name = $value, )*
        }

        impl Opcode {
            /// Every opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$name, )* ];

            /// The opcode with this BTH value, if the codec knows it.
            pub const fn from_u8(value: u8) -> Option<Opcode> {
                match value {
                    $( $value => Some(Opcode::$name), )*
                    _ => None,
                }
            }

            /// The transport service the opcode belongs to.
            pub const fn transport(self) -> Transport {
                match self {
                    $( Opcode::$name => Transport::$transport, )*
                }
            }

            /// The headers that follow the BTH, and whether a payload may.
            pub const fn layout(self) -> Layout {
                match self {
                    $( Opcode::$name => $layout, )*
                }
            }

            /// The name IBTA's opcode table gives it, with the transport.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $text, )*
                }
            }
        }
    };
}

opcodes! {
    /// RC SEND First.
    RcSendFirst = 0x00, Rc, DATA, "RC SEND First";
    /// RC SEND Middle.
    RcSendMiddle = 0x01, Rc, DATA, "RC SEND Middle";
    /// RC SEND Last.
    RcSendLast = 0x02, Rc, DATA, "RC SEND Last";
    /// RC SEND Last with Immediate.
    RcSendLastImm = 0x03, Rc, DATA_IMM, "RC SEND Last with Immediate";
    /// RC SEND Only.
    RcSendOnly = 0x04, Rc, DATA, "RC SEND Only";
    /// RC SEND Only with Immediate.
    RcSendOnlyImm = 0x05, Rc, DATA_IMM, "RC SEND Only with Immediate";
    /// RC RDMA WRITE First.
    RcWriteFirst = 0x06, Rc, RETH_DATA, "RC RDMA WRITE First";
    /// RC RDMA WRITE Middle.
    RcWriteMiddle = 0x07, Rc, DATA, "RC RDMA WRITE Middle";
    /// RC RDMA WRITE Last.
    RcWriteLast = 0x08, Rc, DATA, "RC RDMA WRITE Last";
    /// RC RDMA WRITE Last with Immediate.
    RcWriteLastImm = 0x09, Rc, DATA_IMM, "RC RDMA WRITE Last with Immediate";
    /// RC RDMA WRITE Only.
    RcWriteOnly = 0x0a, Rc, RETH_DATA, "RC RDMA WRITE Only";
    /// RC RDMA WRITE Only with Immediate.
    RcWriteOnlyImm = 0x0b, Rc, RETH_DATA_IMM, "RC RDMA WRITE Only with Immediate";
    /// RC RDMA READ Request.
    RcReadRequest = 0x0c, Rc, RETH_ONLY, "RC RDMA READ Request";
    /// RC RDMA READ Response First.
    RcReadResponseFirst = 0x0d, Rc, AETH_DATA, "RC RDMA READ Response First";
    /// RC RDMA READ Response Middle.
    RcReadResponseMiddle = 0x0e, Rc, DATA, "RC RDMA READ Response Middle";
    /// RC RDMA READ Response Last.
    RcReadResponseLast = 0x0f, Rc, AETH_DATA, "RC RDMA READ Response Last";
    /// RC RDMA READ Response Only.
    RcReadResponseOnly = 0x10, Rc, AETH_DATA, "RC RDMA READ Response Only";
    /// RC Acknowledge.
    RcAck = 0x11, Rc, AETH_ONLY, "RC Acknowledge";
    /// RC ATOMIC Acknowledge.
    RcAtomicAck = 0x12, Rc, ATOMIC_ACK, "RC ATOMIC Acknowledge";
    /// RC CmpSwap.
    RcCompareSwap = 0x13, Rc, ATOMIC, "RC CmpSwap";
    /// RC FetchAdd.
    RcFetchAdd = 0x14, Rc, ATOMIC, "RC FetchAdd";
    /// RC SEND Last with Invalidate.
    RcSendLastInvalidate = 0x16, Rc, DATA_IETH, "RC SEND Last with Invalidate";
    /// RC SEND Only with Invalidate.
    RcSendOnlyInvalidate = 0x17, Rc, DATA_IETH, "RC SEND Only with Invalidate";
    /// UC SEND First.
    UcSendFirst = 0x20, Uc, DATA, "UC SEND First";
    /// UC SEND Middle.
    UcSendMiddle = 0x21, Uc, DATA, "UC SEND Middle";
    /// UC SEND Last.
    UcSendLast = 0x22, Uc, DATA, "UC SEND Last";
    /// UC SEND Last with Immediate.
    UcSendLastImm = 0x23, Uc, DATA_IMM, "UC SEND Last with Immediate";
    /// UC SEND Only.
    UcSendOnly = 0x24, Uc, DATA, "UC SEND Only";
    /// UC SEND Only with Immediate.
    UcSendOnlyImm = 0x25, Uc, DATA_IMM, "UC SEND Only with Immediate";
    /// UC RDMA WRITE First.
    UcWriteFirst = 0x26, Uc, RETH_DATA, "UC RDMA WRITE First";
    /// UC RDMA WRITE Middle.
    UcWriteMiddle = 0x27, Uc, DATA, "UC RDMA WRITE Middle";
    /// UC RDMA WRITE Last.
    UcWriteLast = 0x28, Uc, DATA, "UC RDMA WRITE Last";
    /// UC RDMA WRITE Last with Immediate.
    UcWriteLastImm = 0x29, Uc, DATA_IMM, "UC RDMA WRITE Last with Immediate";
    /// UC RDMA WRITE Only.
    UcWriteOnly = 0x2a, Uc, RETH_DATA, "UC RDMA WRITE Only";
    /// UC RDMA WRITE Only with Immediate.
    UcWriteOnlyImm = 0x2b, Uc, RETH_DATA_IMM, "UC RDMA WRITE Only with Immediate";
    /// UD SEND Only.
    UdSendOnly = 0x64, Ud, DETH_DATA, "UD SEND Only";
    /// UD SEND Only with Immediate.
    UdSendOnlyImm = 0x65, Ud, DETH_DATA_IMM, "UD SEND Only with Immediate";
    /// RoCEv2 Congestion Notification Packet (IBTA A17.9.3): BTH, 16
    /// reserved bytes, ICRC.
    Cnp = 0x81, Cnp, CNP, "CNP";
}

impl Opcode {
    /// The value carried in the BTH.
    pub const fn value(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_transport_matches_top_bits() {
        for &op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op.value()), Some(op));
            let expected = match op.value() >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                other => panic!("unexpected transport bits {other}"),
            };
            assert_eq!(op.transport(), expected, "{op}");
        }
        let known = (0..=255u8)
            .filter(|v| Opcode::from_u8(*v).is_some())
            .count();
        assert_eq!(known, Opcode::ALL.len());
        assert_eq!(Opcode::ALL.len(), 23 + 12 + 2 + 1);
    }

    #[test]
    fn uc_and_rc_share_the_low_five_bits() {
        for &op in Opcode::ALL {
            if op.transport() == Transport::Uc {
                let rc = Opcode::from_u8(op.value() & 0x1f).expect("an RC twin");
                assert_eq!(rc.layout(), op.layout(), "{op} vs {rc}");
            }
        }
    }

    #[test]
    fn extension_lengths() {
        assert_eq!(Opcode::RcWriteOnlyImm.layout().ext_len(), 20);
        assert_eq!(Opcode::RcAtomicAck.layout().ext_len(), 12);
        assert_eq!(Opcode::RcFetchAdd.layout().ext_len(), 28);
        assert_eq!(Opcode::UdSendOnlyImm.layout().ext_len(), 12);
        assert_eq!(Opcode::Cnp.layout().ext_len(), 16);
        assert!(!Opcode::RcReadRequest.layout().payload);
        assert!(Opcode::RcReadResponseMiddle.layout().payload);
    }
}
