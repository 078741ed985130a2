//! The fixed extension headers other than the AETH (IBTA vol. 1 §9.3):
//! RETH, AtomicETH, AtomicAckETH, DETH, ImmDt and IETH. All fields are
//! big-endian.

use crate::bytes::{fits, put_u24, put_u32, put_u64, room, take, u24_at, u32_at, u64_at};
use crate::{DecodeError, EncodeError, WireHeader};

/// RDMA Extended Transport Header (§9.3.3), 16 bytes: the remote buffer of
/// an RDMA WRITE (first or only packet) or READ request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole transfer in bytes.
    pub dma_len: u32,
}

impl WireHeader for Reth {
    const LEN: usize = 16;
    const NAME: &'static str = "RETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(Reth {
            va: u64_at(b, 0),
            rkey: u32_at(b, 8),
            dma_len: u32_at(b, 12),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        let b = room(out, Self::LEN)?;
        put_u64(b, 0, self.va);
        put_u32(b, 8, self.rkey);
        put_u32(b, 12, self.dma_len);
        Ok(())
    }
}

/// Atomic Extended Transport Header (§9.3.4), 28 bytes: the target and
/// operands of a CmpSwap or FetchAdd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// The swap value (CmpSwap) or the addend (FetchAdd).
    pub swap_add: u64,
    /// The compare value (CmpSwap; ignored by FetchAdd).
    pub compare: u64,
}

impl WireHeader for AtomicEth {
    const LEN: usize = 28;
    const NAME: &'static str = "AtomicETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(AtomicEth {
            va: u64_at(b, 0),
            rkey: u32_at(b, 8),
            swap_add: u64_at(b, 12),
            compare: u64_at(b, 20),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        let b = room(out, Self::LEN)?;
        put_u64(b, 0, self.va);
        put_u32(b, 8, self.rkey);
        put_u64(b, 12, self.swap_add);
        put_u64(b, 20, self.compare);
        Ok(())
    }
}

/// Atomic Acknowledge Extended Transport Header (§9.3.6), 8 bytes: the
/// value the target held before the atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEth {
    /// The original remote data.
    pub original: u64,
}

impl WireHeader for AtomicAckEth {
    const LEN: usize = 8;
    const NAME: &'static str = "AtomicAckETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(AtomicAckEth {
            original: u64_at(b, 0),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        let b = room(out, Self::LEN)?;
        put_u64(b, 0, self.original);
        Ok(())
    }
}

/// Datagram Extended Transport Header (§9.3.2), 8 bytes: Q_Key, one
/// reserved byte (sent as 0, ignored), source QP (24 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key the receiver checks (high bit set: a controlled Q_Key).
    pub qkey: u32,
    /// Source queue pair number (24 bits).
    pub src_qp: u32,
}

impl WireHeader for Deth {
    const LEN: usize = 8;
    const NAME: &'static str = "DETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(Deth {
            qkey: u32_at(b, 0),
            src_qp: u24_at(b, 5),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        fits("DETH source QP", self.src_qp.into(), 24)?;
        let b = room(out, Self::LEN)?;
        put_u32(b, 0, self.qkey);
        b[4] = 0;
        put_u24(b, 5, self.src_qp);
        Ok(())
    }
}

/// Immediate data (§9.3.7), 4 bytes carried to the receiver's completion.
/// The value is the four wire bytes read big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDt {
    /// The immediate data.
    pub value: u32,
}

impl WireHeader for ImmDt {
    const LEN: usize = 4;
    const NAME: &'static str = "ImmDt";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(ImmDt {
            value: u32_at(b, 0),
        })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        put_u32(room(out, Self::LEN)?, 0, self.value);
        Ok(())
    }
}

/// Invalidate Extended Transport Header (§9.3.8), 4 bytes: the R_Key a
/// SEND with Invalidate asks the responder to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ieth {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl WireHeader for Ieth {
    const LEN: usize = 4;
    const NAME: &'static str = "IETH";

    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let b = take(bytes, Self::LEN, Self::NAME)?;
        Ok(Ieth { rkey: u32_at(b, 0) })
    }

    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError> {
        put_u32(room(out, Self::LEN)?, 0, self.rkey);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let r = Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            dma_len: 0x1000,
        };
        let v = r.to_vec().unwrap();
        assert_eq!(v, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0x10, 0]);
        assert_eq!(Reth::decode(&v).unwrap(), r);

        let a = AtomicEth {
            va: 8,
            rkey: 0x11,
            swap_add: 0x2222,
            compare: 0x3333,
        };
        let v = a.to_vec().unwrap();
        assert_eq!(v.len(), 28);
        assert_eq!(&v[12..20], &0x2222u64.to_be_bytes());
        assert_eq!(&v[20..28], &0x3333u64.to_be_bytes());
        assert_eq!(AtomicEth::decode(&v).unwrap(), a);

        let d = Deth {
            qkey: 0x8001_0000,
            src_qp: 1,
        };
        let v = d.to_vec().unwrap();
        assert_eq!(v, [0x80, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Deth::decode(&v).unwrap(), d);
        assert!(Deth {
            qkey: 0,
            src_qp: 1 << 24
        }
        .to_vec()
        .is_err());

        for short in 0..4 {
            assert!(ImmDt::decode(&v[..short]).is_err());
            assert!(Ieth::decode(&v[..short]).is_err());
        }
        assert!(AtomicAckEth::decode(&v[..7]).is_err());
    }
}
