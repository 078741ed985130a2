//! RoCEv2 wire codec: the InfiniBand transport headers carried in UDP
//! datagrams to port 4791 (IBTA vol. 1 ch. 9 and Annex A17).
//!
//! Sans-IO: every function takes and returns bytes; nothing here opens a
//! socket, reads a clock or allocates except where a `Vec` is returned.
//!
//! * [`Opcode`] and its [`Layout`]: every RC, UC and UD opcode (and the
//!   RoCEv2 CNP), with the extension headers that follow it and whether a
//!   payload may follow.
//! * Headers, each with typed fields, [`WireHeader::encode`] and
//!   [`WireHeader::decode`]: [`Bth`], [`Reth`], [`Aeth`], [`AtomicEth`],
//!   [`AtomicAckEth`], [`Deth`], [`ImmDt`], [`Ieth`].
//! * [`Packet`]: one UDP payload (BTH, extension headers, payload, pad,
//!   ICRC), encoded and decoded against the [`Endpoints`] the receiver will
//!   see, so that the ICRC covers the IP and UDP headers as IBTA A17 says.
//! * [`icrc`]: the invariant CRC, computed exactly as Linux rxe does.
//! * [`Frame`]: a whole IPv4 or IPv6 + UDP + RoCE datagram, for captures.
//!
//! Decoding never panics: any byte string gives a typed value or a
//! [`DecodeError`]. See `docs/roce-wire.md` for the formats and their
//! sources.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod aeth;
mod bth;
mod bytes;
mod error;
mod ext;
mod frame;
pub mod fuzzing;
pub mod icrc;
mod ip;
mod opcode;
mod packet;

pub use aeth::{Aeth, NakCode, Syndrome};
pub use bth::Bth;
pub use error::{DecodeError, EncodeError};
pub use ext::{AtomicAckEth, AtomicEth, Deth, Ieth, ImmDt, Reth};
pub use frame::{Frame, IpHeader, Ipv4Header, Ipv6Header};
pub use ip::{gid_of, ip_of_gid, Endpoints, V4Endpoints, V6Endpoints};
pub use opcode::{Layout, Opcode, Transport};
pub use packet::{encode_append_filled, Headers, Packet};

/// The IANA-assigned UDP destination port of RoCEv2 (IBTA A17.2).
pub const ROCE_UDP_PORT: u16 = 4791;

/// Length of the invariant CRC that ends every packet.
pub const ICRC_LEN: usize = 4;

/// A fixed-length header of the InfiniBand transport.
pub trait WireHeader: Sized {
    /// Its length on the wire, in bytes.
    const LEN: usize;
    /// Its name, as errors print it.
    const NAME: &'static str;
    /// Reads the header from the first [`Self::LEN`] bytes of `bytes`
    /// (more bytes may follow; fewer is [`DecodeError::Truncated`]).
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
    /// Writes the header into the first [`Self::LEN`] bytes of `out`.
    /// Fails if `out` is shorter or a field does not fit its width.
    fn encode(&self, out: &mut [u8]) -> Result<(), EncodeError>;
    /// The header as a fresh buffer of [`Self::LEN`] bytes.
    fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut v = vec![0; Self::LEN];
        self.encode(&mut v)?;
        Ok(v)
    }
}
