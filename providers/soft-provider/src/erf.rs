//! Capture files in the Extensible Record Format (ERF), written and read
//! back, with InfiniBand records: each holds one packet from its LRH
//! through its VCRC ([`crate::packet::UdPacket::encode`]).
//!
//! ERF rather than pcap because it is the container Wireshark reads raw
//! InfiniBand from without any setting: record type 21 goes straight to its
//! `infiniband` dissector (`tshark -r FILE` shows every header and the MAD
//! inside), while the pcap link type for raw InfiniBand (247) is not mapped
//! by the Wireshark releases in Debian.
//!
//! A record is a 16-byte header (timestamp as 32.32 fixed-point seconds,
//! little-endian; type; flags; record length, loss counter and wire length,
//! big-endian) and the packet, padded to a multiple of 8 bytes. The file
//! has no header of its own.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

/// ERF record type of an InfiniBand packet (LRH first).
pub const ERF_TYPE_INFINIBAND: u8 = 21;
/// Flag: the record's length varies (it is not a fixed snap length).
const FLAG_VARYING_LENGTH: u8 = 0x04;
const HEADER_LEN: usize = 16;
const ALIGN: usize = 8;

/// Writes InfiniBand records.
pub struct ErfWriter<W: Write> {
    out: W,
    records: u64,
}

impl<W: Write> ErfWriter<W> {
    /// A capture written to `out`.
    pub fn new(out: W) -> Self {
        ErfWriter { out, records: 0 }
    }

    /// Appends one packet seen at `at` (time since the Unix epoch).
    pub fn write(&mut self, at: Duration, packet: &[u8]) -> io::Result<()> {
        let pad = (ALIGN - (HEADER_LEN + packet.len()) % ALIGN) % ALIGN;
        let rlen = u16::try_from(HEADER_LEN + packet.len() + pad).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {}-byte packet does not fit an ERF record", packet.len()),
            )
        })?;
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&timestamp(at).to_le_bytes());
        h[8] = ERF_TYPE_INFINIBAND;
        h[9] = FLAG_VARYING_LENGTH;
        h[10..12].copy_from_slice(&rlen.to_be_bytes());
        // h[12..14]: loss counter, 0.
        h[14..16].copy_from_slice(&(packet.len() as u16).to_be_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(packet)?;
        self.out.write_all(&[0u8; ALIGN][..pad])?;
        self.records += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// 32.32 fixed-point seconds.
fn timestamp(at: Duration) -> u64 {
    let secs = at.as_secs().min(u64::from(u32::MAX));
    let frac = (u64::from(at.subsec_nanos()) << 32) / 1_000_000_000;
    (secs << 32) | frac
}

/// One InfiniBand record of a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErfRecord {
    /// Time since the Unix epoch (to the nanosecond, rounded down).
    pub at: Duration,
    /// The packet.
    pub data: Vec<u8>,
}

/// Why bytes are not a capture [`read`] understands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErfError {
    /// A record runs past the end, or its lengths disagree.
    Truncated {
        /// Records before it.
        index: usize,
    },
    /// A record of another type, or with extension headers.
    NotInfiniband {
        /// Records before it.
        index: usize,
        /// Its type byte.
        kind: u8,
    },
}

impl fmt::Display for ErfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { index } => write!(f, "ERF record {index} is truncated"),
            Self::NotInfiniband { index, kind } => write!(
                f,
                "ERF record {index} has type {kind:#04x}, not a plain InfiniBand record"
            ),
        }
    }
}

impl std::error::Error for ErfError {}

/// Reads a capture of InfiniBand records.
pub fn read(bytes: &[u8]) -> Result<Vec<ErfRecord>, ErfError> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let index = records.len();
        let truncated = ErfError::Truncated { index };
        let h = bytes.get(at..at + HEADER_LEN).ok_or(truncated.clone())?;
        if h[8] != ERF_TYPE_INFINIBAND {
            return Err(ErfError::NotInfiniband { index, kind: h[8] });
        }
        let rlen = usize::from(u16::from_be_bytes([h[10], h[11]]));
        let wlen = usize::from(u16::from_be_bytes([h[14], h[15]]));
        if rlen < HEADER_LEN + wlen || at + rlen > bytes.len() {
            return Err(truncated);
        }
        let ts = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let nanos = ((ts & 0xffff_ffff) * 1_000_000_000) >> 32;
        records.push(ErfRecord {
            at: Duration::new(ts >> 32, nanos as u32),
            data: bytes[at + HEADER_LEN..at + HEADER_LEN + wlen].to_vec(),
        });
        at += rlen;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_reads_back_and_damage_is_refused() {
        let mut w = ErfWriter::new(Vec::new());
        let t = Duration::new(1_700_000_000, 123_456_789);
        w.write(t, &[1, 2, 3]).unwrap();
        w.write(t + Duration::from_micros(5), &[9; 8]).unwrap();
        assert_eq!(w.records(), 2);
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len(), 24 + 24, "records padded to 8 bytes");
        assert_eq!(bytes[8], ERF_TYPE_INFINIBAND);
        let recs = read(&bytes).unwrap();
        assert_eq!(recs.len(), 2);
        // 32.32 fixed point keeps a nanosecond-order resolution.
        assert!(t - recs[0].at < Duration::from_nanos(2), "{:?}", recs[0].at);
        assert_eq!(recs[0].data, vec![1, 2, 3]);
        assert_eq!(recs[1].data, vec![9; 8]);
        for cut in 1..bytes.len() {
            if cut == 24 {
                continue; // a record boundary: a shorter, valid capture
            }
            assert!(read(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
        let mut other = bytes.clone();
        other[24 + 8] = 2; // Ethernet
        assert_eq!(
            read(&other),
            Err(ErfError::NotInfiniband { index: 1, kind: 2 })
        );
        let mut big = ErfWriter::new(Vec::new());
        assert!(big.write(t, &vec![0; 70_000]).is_err());
    }
}
