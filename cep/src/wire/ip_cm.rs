//! rdma_cm-style IP addressing carried by IB CM messages.
//!
//! Linux's RDMA connection manager (`drivers/infiniband/core/cma.c`) lets
//! peers address each other by IP address and port, over InfiniBand and
//! RoCE alike. Two things put that addressing on the wire:
//!
//! * the **service id** of a REQ or SIDR_REQ names the port space and the
//!   destination port: `(port_space << 16) | port`, with nothing in the top
//!   32 bits ([`service_id`], [`parse_service_id`]);
//! * the first [`HEADER_LEN`] bytes of the REQ or SIDR_REQ **private data**
//!   hold a small header ([`IpCmHeader`], Linux's `struct cma_hdr`): a
//!   version byte, the IP version, the active side's source port, and the
//!   source and destination addresses. The application's own private data
//!   follows it, so a REQ leaves [`MAX_REQ_USER_DATA`] bytes for it and a
//!   SIDR_REQ [`MAX_SIDR_REQ_USER_DATA`].
//!
//! Only REQ and SIDR_REQ carry the header; REP, REJ, RTU, DREQ, DREP, MRA,
//! LAP, APR and SIDR_REP private data is the application's, untouched.
//! rdma_cm ids bound to native IB addresses (`AF_IB`) send no header either.
//!
//! RoCE names a port by a GID derived from its IP address: [`gid_of`] and
//! [`ip_of_gid`] convert, IPv4 as the IPv4-mapped IPv6 address
//! `::ffff:a.b.c.d`.
//!
//! Everything here is pure and never panics; `docs/cm-wire-codec.md`
//! ("rdma_cm addressing") has the layout table and where each fact comes
//! from.
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use cep::wire::ip_cm::{self, IpCmHeader, PortSpace};
//!
//! // An rdma_cm client on 10.0.0.1:40000 connecting to 10.0.0.2:7471 (TCP).
//! let sid = ip_cm::service_id(PortSpace::Tcp, 7471);
//! assert_eq!(sid, 0x0000_0000_0106_1D2F);
//! let hdr = IpCmHeader {
//!     src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
//!     src_port: 40000,
//!     dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
//! };
//! let pd = hdr.private_data::<92>(b"hello")?; // REQ private data
//! let (back, user) = IpCmHeader::decode(pd.as_bytes())?;
//! assert_eq!(back, hdr);
//! assert_eq!(&user[..5], b"hello");
//! assert_eq!(user.len(), ip_cm::MAX_REQ_USER_DATA);
//! # Ok::<(), ip_cm::IpCmError>(())
//! ```

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::messages::PrivateData;

/// An rdma_cm port space: the namespace a port number lives in, and bits
/// 16..31 of the service id (Linux `enum rdma_ucm_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum PortSpace {
    /// IP over InfiniBand (`RDMA_PS_IPOIB`, 0x0002).
    Ipoib = 0x0002,
    /// Reliable connected, TCP-like (`RDMA_PS_TCP`, 0x0106).
    Tcp = 0x0106,
    /// Unreliable datagram, UDP-like (`RDMA_PS_UDP`, 0x0111).
    Udp = 0x0111,
    /// Any InfiniBand QP type (`RDMA_PS_IB`, 0x013F).
    Ib = 0x013F,
}

impl PortSpace {
    /// Every port space, in numeric order.
    pub const ALL: [PortSpace; 4] = [Self::Ipoib, Self::Tcp, Self::Udp, Self::Ib];

    /// The 16-bit value rdma_cm uses for this port space.
    pub const fn value(self) -> u16 {
        self as u16
    }

    /// The port space with this value, if it is one of the four.
    pub const fn from_value(value: u16) -> Option<Self> {
        Some(match value {
            0x0002 => Self::Ipoib,
            0x0106 => Self::Tcp,
            0x0111 => Self::Udp,
            0x013F => Self::Ib,
            _ => return None,
        })
    }
}

/// The service id bits that hold the port space (and must otherwise be
/// zero) in an IP-based service id (librdmacm `RDMA_IB_IP_PS_MASK`).
pub const SERVICE_ID_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
/// The service id bits that hold the port (librdmacm
/// `RDMA_IB_IP_PORT_MASK`).
pub const SERVICE_ID_PORT_MASK: u64 = 0x0000_0000_0000_FFFF;

/// The service id rdma_cm uses for `port` in `space`:
/// `(space << 16) | port`, the top 32 bits zero. TCP port 7471 gives
/// `0x0000_0000_0106_1D2F`.
pub const fn service_id(space: PortSpace, port: u16) -> u64 {
    ((space as u64) << 16) | port as u64
}

/// The port space and port of an IP-based service id; `None` when the top
/// 32 bits are not zero or bits 16..31 are not a [`PortSpace`].
pub const fn parse_service_id(id: u64) -> Option<(PortSpace, u16)> {
    if id >> 32 != 0 {
        return None;
    }
    match PortSpace::from_value((id >> 16) as u16) {
        Some(space) => Some((space, id as u16)),
        None => None,
    }
}

/// The version byte rdma_cm writes, and the only one it accepts
/// (Linux `CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;
/// Size of the header at the start of REQ and SIDR_REQ private data.
pub const HEADER_LEN: usize = 36;
/// Size of the REQ private data area.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Size of the SIDR_REQ private data area.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Largest application private data an rdma_cm REQ carries after the
/// header (92 - 36).
pub const MAX_REQ_USER_DATA: usize = REQ_PRIVATE_DATA_LEN - HEADER_LEN;
/// Largest application private data an rdma_cm SIDR_REQ carries after the
/// header (216 - 36).
pub const MAX_SIDR_REQ_USER_DATA: usize = SIDR_REQ_PRIVATE_DATA_LEN - HEADER_LEN;

/// The Q_Key of every UD QP in rdma_cm's UDP port space (Linux
/// `RDMA_UDP_QKEY`): a SIDR_REP for a service in that space carries it,
/// and rdma_cm refuses a reply with another one. Both ends' QPs use it.
///
/// ```
/// assert_eq!(cep::wire::ip_cm::RDMA_UDP_QKEY, 0x0123_4567);
/// ```
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Header offsets: version byte, IP version (high nibble), source port,
/// source and destination address (16 bytes each; IPv4 in the last four).
const OFF_VERSION: usize = 0;
const OFF_IP_VERSION: usize = 1;
const OFF_PORT: usize = 2;
const OFF_SRC: usize = 4;
const OFF_DST: usize = 20;
/// Where an IPv4 address sits inside a 16-byte address slot.
const V4_IN_SLOT: usize = 12;

/// Why an rdma_cm header could not be decoded or encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IpCmError {
    /// Decoding: fewer than [`HEADER_LEN`] bytes.
    TooShort {
        /// Length of the buffer that was given.
        got: usize,
    },
    /// Encoding: the output buffer is shorter than [`HEADER_LEN`].
    BufferTooSmall {
        /// Length of the buffer that was given.
        got: usize,
    },
    /// The version byte is not [`CMA_VERSION`] (the value found).
    UnsupportedVersion(u8),
    /// The IP version nibble is neither 4 nor 6 (the nibble found).
    UnknownIpVersion(u8),
    /// Encoding: the source and destination are not both IPv4 or both IPv6.
    MixedFamilies,
    /// The application data does not fit after the header.
    UserDataTooLong {
        /// Room left after the header.
        max: usize,
        /// Length of the data that was given.
        got: usize,
    },
}

impl fmt::Display for IpCmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { got } => write!(
                f,
                "rdma_cm header needs {HEADER_LEN} bytes of private data, got {got}"
            ),
            Self::BufferTooSmall { got } => write!(
                f,
                "rdma_cm header needs a {HEADER_LEN}-byte buffer, got {got}"
            ),
            Self::UnsupportedVersion(v) => write!(
                f,
                "rdma_cm header version {v} (only {CMA_VERSION} is defined)"
            ),
            Self::UnknownIpVersion(v) => {
                write!(f, "rdma_cm header IP version {v} (expected 4 or 6)")
            }
            Self::MixedFamilies => write!(
                f,
                "rdma_cm header source and destination must both be IPv4 or both IPv6"
            ),
            Self::UserDataTooLong { max, got } => write!(
                f,
                "private data is {got} bytes, {max} fit after the rdma_cm header"
            ),
        }
    }
}

impl std::error::Error for IpCmError {}

/// A bad header given by an application is a bad parameter, so `?` works
/// in code returning `al::Result`.
impl From<IpCmError> for al::Error {
    fn from(e: IpCmError) -> al::Error {
        al::Error::InvalidParameter(e.to_string().into())
    }
}

/// The rdma_cm header at the start of REQ and SIDR_REQ private data (Linux
/// `struct cma_hdr`), as written by the active (connecting) side.
///
/// `src` and `dst` are both IPv4 or both IPv6. An IPv4-mapped IPv6 address
/// stays IPv6: the header's IP version, not the address, decides the
/// family. The destination port is not in the header; it is the low 16
/// bits of the service id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpCmHeader {
    /// The active side's address.
    pub src: IpAddr,
    /// The active side's port (the header's only port).
    pub src_port: u16,
    /// The address the active side connects to.
    pub dst: IpAddr,
}

impl IpCmHeader {
    /// The active side's socket address.
    pub fn src_socket(&self) -> SocketAddr {
        SocketAddr::new(self.src, self.src_port)
    }

    /// The IP version the header carries: 4 or 6, or
    /// [`IpCmError::MixedFamilies`].
    pub fn ip_version(&self) -> Result<u8, IpCmError> {
        match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => Ok(4),
            (IpAddr::V6(_), IpAddr::V6(_)) => Ok(6),
            _ => Err(IpCmError::MixedFamilies),
        }
    }

    /// The passive side's view of a request carrying this header under
    /// `service_id`: its own address (the header's destination, with the
    /// port from the low 16 bits of the service id) and the peer's
    /// (the header's source and port), as Linux's listener records them.
    pub fn passive_endpoints(&self, service_id: u64) -> (SocketAddr, SocketAddr) {
        (
            SocketAddr::new(self.dst, service_id as u16),
            self.src_socket(),
        )
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`:
    /// version [`CMA_VERSION`], the IP version in the high nibble (low
    /// nibble zero), the source port big-endian, then both addresses (an
    /// IPv4 address in the last four bytes of its 16-byte slot, the other
    /// twelve zero). Bytes of `out` past the header are left alone.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), IpCmError> {
        let ip_version = self.ip_version()?;
        let got = out.len();
        let out = out
            .get_mut(..HEADER_LEN)
            .ok_or(IpCmError::BufferTooSmall { got })?;
        out.fill(0);
        out[OFF_VERSION] = CMA_VERSION;
        out[OFF_IP_VERSION] = ip_version << 4;
        out[OFF_PORT..OFF_PORT + 2].copy_from_slice(&self.src_port.to_be_bytes());
        for (ip, at) in [(self.src, OFF_SRC), (self.dst, OFF_DST)] {
            match ip {
                IpAddr::V4(v4) => {
                    out[at + V4_IN_SLOT..at + 16].copy_from_slice(&v4.octets());
                }
                IpAddr::V6(v6) => out[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
        Ok(())
    }

    /// The header as bytes; see [`IpCmHeader::encode`].
    pub fn to_bytes(&self) -> Result<[u8; HEADER_LEN], IpCmError> {
        let mut out = [0; HEADER_LEN];
        self.encode(&mut out)?;
        Ok(out)
    }

    /// A whole private data area of `N` bytes: the header, then `user`,
    /// then zeros. `N` is [`REQ_PRIVATE_DATA_LEN`] for a REQ and
    /// [`SIDR_REQ_PRIVATE_DATA_LEN`] for a SIDR_REQ. A header with mixed
    /// families is refused before the length of `user` is looked at.
    pub fn private_data<const N: usize>(&self, user: &[u8]) -> Result<PrivateData<N>, IpCmError> {
        if N < HEADER_LEN {
            return Err(IpCmError::BufferTooSmall { got: N });
        }
        self.ip_version()?;
        let max = N - HEADER_LEN;
        if user.len() > max {
            return Err(IpCmError::UserDataTooLong {
                max,
                got: user.len(),
            });
        }
        let mut bytes = [0u8; N];
        self.encode(&mut bytes)?;
        bytes[HEADER_LEN..HEADER_LEN + user.len()].copy_from_slice(user);
        Ok(PrivateData::from(bytes))
    }

    /// Reads the header from the start of `buf` (REQ or SIDR_REQ private
    /// data) and returns it with the application data after it (the rest
    /// of `buf`). Refuses a buffer shorter than [`HEADER_LEN`], a version
    /// byte other than [`CMA_VERSION`] and an IP version other than 4 or 6.
    /// The low nibble of the IP version byte and the twelve bytes before an
    /// IPv4 address are ignored, as Linux ignores them.
    pub fn decode(buf: &[u8]) -> Result<(IpCmHeader, &[u8]), IpCmError> {
        let (head, user) = match buf.split_first_chunk::<HEADER_LEN>() {
            Some(split) => split,
            None => return Err(IpCmError::TooShort { got: buf.len() }),
        };
        if head[OFF_VERSION] != CMA_VERSION {
            return Err(IpCmError::UnsupportedVersion(head[OFF_VERSION]));
        }
        let slot = |at: usize| -> [u8; 16] {
            let mut s = [0u8; 16];
            s.copy_from_slice(&head[at..at + 16]);
            s
        };
        let v4 = |at: usize| -> IpAddr {
            let s = slot(at);
            IpAddr::V4(Ipv4Addr::new(s[12], s[13], s[14], s[15]))
        };
        let v6 = |at: usize| -> IpAddr { IpAddr::V6(Ipv6Addr::from(slot(at))) };
        let (src, dst) = match head[OFF_IP_VERSION] >> 4 {
            4 => (v4(OFF_SRC), v4(OFF_DST)),
            6 => (v6(OFF_SRC), v6(OFF_DST)),
            other => return Err(IpCmError::UnknownIpVersion(other)),
        };
        let src_port = u16::from_be_bytes([head[OFF_PORT], head[OFF_PORT + 1]]);
        Ok((IpCmHeader { src, src_port, dst }, user))
    }

    /// The bits of a header of this IP version that decode reads: the
    /// version byte, the high nibble of the IP version byte, the port and
    /// the addresses (for IPv4 only the last four bytes of each slot).
    /// `None` for a version other than 4 or 6.
    pub fn defined_bits_mask(ip_version: u8) -> Option<[u8; HEADER_LEN]> {
        let mut mask = [0u8; HEADER_LEN];
        mask[OFF_VERSION] = 0xFF;
        mask[OFF_IP_VERSION] = 0xF0;
        mask[OFF_PORT] = 0xFF;
        mask[OFF_PORT + 1] = 0xFF;
        let from = match ip_version {
            4 => V4_IN_SLOT,
            6 => 0,
            _ => return None,
        };
        for at in [OFF_SRC, OFF_DST] {
            mask[at + from..at + 16].fill(0xFF);
        }
        Some(mask)
    }
}

/// The RoCE GID of an IP address: the IPv6 address itself, or for IPv4 the
/// IPv4-mapped address `::ffff:a.b.c.d`, as RoCEv2 names IPv4 ports.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCE GID names: an IPv4-mapped GID (`::ffff:a.b.c.d`)
/// gives the IPv4 address, any other GID the IPv6 address.
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The check the `ip_cm_header` fuzz target runs on arbitrary bytes (and the
/// corpus replay test with it); panics on a codec bug, never on bad input.
///
/// * If `data` decodes, encoding the header gives `data` back on every bit
///   of [`IpCmHeader::defined_bits_mask`], the user data is the rest of
///   `data`, and the re-encoded header decodes to the same header.
/// * A header built from the first 35 bytes (family choices from byte 0,
///   port from bytes 1..3, addresses from bytes 3..35) round-trips through
///   [`IpCmHeader::private_data`] with the rest as user data, or is refused
///   with the expected error (mixed families, data too long).
/// * The service id and GID helpers round-trip on values taken from the
///   input.
pub fn fuzz_check(data: &[u8]) {
    match IpCmHeader::decode(data) {
        Ok((hdr, user)) => {
            let version = hdr.ip_version().expect("a decoded header has one family");
            assert_eq!(version, data[OFF_IP_VERSION] >> 4);
            assert_eq!(user, &data[HEADER_LEN..]);
            let bytes = hdr.to_bytes().expect("a decoded header encodes");
            let mask = IpCmHeader::defined_bits_mask(version).expect("4 or 6");
            for i in 0..HEADER_LEN {
                assert_eq!(bytes[i] & mask[i], data[i] & mask[i], "byte {i}");
                assert_eq!(bytes[i] & !mask[i], 0, "byte {i} outside the mask");
            }
            assert_eq!(IpCmHeader::decode(&bytes), Ok((hdr, &[][..])));
        }
        Err(IpCmError::TooShort { got }) => assert!(got < HEADER_LEN && got == data.len()),
        Err(IpCmError::UnsupportedVersion(v)) => assert_ne!(v, CMA_VERSION),
        Err(IpCmError::UnknownIpVersion(v)) => assert!(v != 4 && v != 6),
        Err(e) => panic!("decode cannot fail with {e:?}"),
    }

    if let Some((head, rest)) = data.split_first_chunk::<35>() {
        let slot = |at: usize| -> [u8; 16] {
            let mut s = [0u8; 16];
            s.copy_from_slice(&head[at..at + 16]);
            s
        };
        let addr = |v6: bool, s: [u8; 16]| -> IpAddr {
            if v6 {
                IpAddr::V6(Ipv6Addr::from(s))
            } else {
                IpAddr::V4(Ipv4Addr::new(s[0], s[1], s[2], s[3]))
            }
        };
        let hdr = IpCmHeader {
            src: addr(head[0] & 1 != 0, slot(3)),
            src_port: u16::from_be_bytes([head[1], head[2]]),
            dst: addr(head[0] & 2 != 0, slot(19)),
        };
        let mixed = hdr.src.is_ipv4() != hdr.dst.is_ipv4();
        match hdr.private_data::<REQ_PRIVATE_DATA_LEN>(rest) {
            Ok(pd) => {
                assert!(!mixed && rest.len() <= MAX_REQ_USER_DATA);
                let (back, user) = IpCmHeader::decode(pd.as_bytes()).expect("own encoding");
                assert_eq!(back, hdr);
                assert_eq!(&user[..rest.len()], rest);
                assert!(user[rest.len()..].iter().all(|&b| b == 0));
            }
            Err(IpCmError::MixedFamilies) => assert!(mixed),
            Err(IpCmError::UserDataTooLong { max, got }) => {
                assert!(!mixed && max == MAX_REQ_USER_DATA && got == rest.len() && got > max)
            }
            Err(e) => panic!("private_data cannot fail with {e:?}"),
        }
        assert_eq!(ip_of_gid(gid_of(hdr.src)), hdr.src.to_canonical());
    }

    if let Some(head) = data.first_chunk::<8>() {
        let id = u64::from_be_bytes(*head);
        if let Some((space, port)) = parse_service_id(id) {
            assert_eq!(service_id(space, port), id);
        } else {
            assert!(
                id >> 32 != 0 || PortSpace::from_value((id >> 16) as u16).is_none(),
                "{id:#x} is an IP service id"
            );
        }
        let gid: [u8; 16] = core::array::from_fn(|i| data.get(i).copied().unwrap_or(0));
        assert_eq!(gid_of(ip_of_gid(gid)), gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V4_SRC: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
    const V4_DST: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 20);

    fn v4_hdr() -> IpCmHeader {
        IpCmHeader {
            src: V4_SRC.into(),
            src_port: 0xC350, // 50000
            dst: V4_DST.into(),
        }
    }

    fn v6_hdr() -> IpCmHeader {
        IpCmHeader {
            src: "fe80::1:2:3:4".parse().unwrap(),
            src_port: 0x1234,
            dst: "2001:db8::42".parse().unwrap(),
        }
    }

    // Layout facts used below (Linux drivers/infiniband/core/cma.c,
    // `struct cma_hdr` and `union cma_ip_addr`): one version byte, one byte
    // whose top nibble is the IP version, the big-endian port, then two
    // 16-byte address slots (source at 4, destination at 20). In a slot an
    // IPv4 address is the fourth 32-bit word, after three padding words.

    #[test]
    fn ipv4_header_bytes() {
        let mut expect = [0u8; HEADER_LEN];
        expect[1] = 0x40;
        expect[2..4].copy_from_slice(&[0xC3, 0x50]);
        expect[16..20].copy_from_slice(&[192, 168, 1, 10]);
        expect[32..36].copy_from_slice(&[192, 168, 1, 20]);
        assert_eq!(v4_hdr().to_bytes(), Ok(expect));
        assert_eq!(IpCmHeader::decode(&expect), Ok((v4_hdr(), &[][..])));
    }

    #[test]
    fn ipv6_header_bytes() {
        let expect: [u8; HEADER_LEN] = [
            0x00, 0x60, 0x12, 0x34, // version, IP version 6, port
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 3, 0, 4, // src
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42, // dst
        ];
        assert_eq!(v6_hdr().to_bytes(), Ok(expect));
        assert_eq!(IpCmHeader::decode(&expect), Ok((v6_hdr(), &[][..])));
    }

    #[test]
    fn user_data_follows_the_header() {
        let pd = v4_hdr().private_data::<92>(b"rdma").unwrap();
        let bytes = pd.as_bytes();
        assert_eq!(&bytes[..HEADER_LEN], &v4_hdr().to_bytes().unwrap());
        assert_eq!(&bytes[36..40], b"rdma");
        assert!(bytes[40..].iter().all(|&b| b == 0));
        let (hdr, user) = IpCmHeader::decode(bytes).unwrap();
        assert_eq!(hdr, v4_hdr());
        assert_eq!(user.len(), MAX_REQ_USER_DATA);

        let full = [0xAB; MAX_REQ_USER_DATA];
        let pd = v6_hdr().private_data::<92>(&full).unwrap();
        assert_eq!(IpCmHeader::decode(pd.as_bytes()), Ok((v6_hdr(), &full[..])));

        let sidr = [0xCD; MAX_SIDR_REQ_USER_DATA];
        let pd = v6_hdr().private_data::<216>(&sidr).unwrap();
        assert_eq!(IpCmHeader::decode(pd.as_bytes()), Ok((v6_hdr(), &sidr[..])));
    }

    #[test]
    fn constants() {
        assert_eq!(HEADER_LEN, 36);
        assert_eq!(MAX_REQ_USER_DATA, 56);
        assert_eq!(MAX_SIDR_REQ_USER_DATA, 180);
        assert_eq!(CMA_VERSION, 0);
        // The private data areas of the CM codec's REQ and SIDR_REQ.
        assert_eq!(
            super::super::Req::default().private_data.len(),
            REQ_PRIVATE_DATA_LEN
        );
        assert_eq!(
            super::super::SidrReq::default().private_data.len(),
            SIDR_REQ_PRIVATE_DATA_LEN
        );
    }

    #[test]
    fn decode_errors() {
        let good = v4_hdr().to_bytes().unwrap();
        for len in 0..HEADER_LEN {
            assert_eq!(
                IpCmHeader::decode(&good[..len]),
                Err(IpCmError::TooShort { got: len })
            );
        }
        for v in 1..=255u8 {
            let mut b = good;
            b[0] = v;
            assert_eq!(
                IpCmHeader::decode(&b),
                Err(IpCmError::UnsupportedVersion(v))
            );
        }
        for nibble in (0..16u8).filter(|n| *n != 4 && *n != 6) {
            let mut b = good;
            b[1] = nibble << 4;
            assert_eq!(
                IpCmHeader::decode(&b),
                Err(IpCmError::UnknownIpVersion(nibble))
            );
        }
    }

    #[test]
    fn decode_ignores_what_linux_ignores() {
        let mut b = v4_hdr().to_bytes().unwrap();
        b[1] |= 0x0F; // low nibble of the IP version byte
        b[4..16].fill(0xEE); // padding before the IPv4 source
        b[20..32].fill(0x77); // padding before the IPv4 destination
        assert_eq!(IpCmHeader::decode(&b), Ok((v4_hdr(), &[][..])));
    }

    #[test]
    fn encode_errors() {
        let mixed = IpCmHeader {
            src: V4_SRC.into(),
            src_port: 1,
            dst: "::1".parse().unwrap(),
        };
        assert_eq!(mixed.to_bytes(), Err(IpCmError::MixedFamilies));
        assert_eq!(mixed.ip_version(), Err(IpCmError::MixedFamilies));
        let mixed_other_way = IpCmHeader {
            src: "::1".parse().unwrap(),
            dst: V4_DST.into(),
            ..mixed
        };
        assert_eq!(mixed_other_way.to_bytes(), Err(IpCmError::MixedFamilies));
        assert_eq!(mixed.private_data::<92>(b""), Err(IpCmError::MixedFamilies));

        let mut short = [0u8; HEADER_LEN - 1];
        assert_eq!(
            v4_hdr().encode(&mut short),
            Err(IpCmError::BufferTooSmall { got: 35 })
        );
        assert_eq!(
            v4_hdr().private_data::<20>(b""),
            Err(IpCmError::BufferTooSmall { got: 20 })
        );
        assert_eq!(
            v4_hdr().private_data::<92>(&[0; 57]),
            Err(IpCmError::UserDataTooLong { max: 56, got: 57 })
        );
        assert_eq!(
            v4_hdr().private_data::<216>(&[0; 181]),
            Err(IpCmError::UserDataTooLong { max: 180, got: 181 })
        );
        // Every error has a message.
        for e in [
            IpCmError::TooShort { got: 3 },
            IpCmError::BufferTooSmall { got: 3 },
            IpCmError::UnsupportedVersion(1),
            IpCmError::UnknownIpVersion(5),
            IpCmError::MixedFamilies,
            IpCmError::UserDataTooLong { max: 56, got: 60 },
        ] {
            assert!(!e.to_string().is_empty());
            assert!(matches!(al::Error::from(e), al::Error::InvalidParameter(_)));
        }
    }

    #[test]
    fn encode_leaves_the_rest_of_the_buffer() {
        let mut out = [0x5A; 50];
        v4_hdr().encode(&mut out).unwrap();
        assert_eq!(&out[..HEADER_LEN], &v4_hdr().to_bytes().unwrap());
        assert!(out[HEADER_LEN..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn ipv4_mapped_stays_ipv6() {
        let hdr = IpCmHeader {
            src: "::ffff:10.0.0.1".parse().unwrap(),
            src_port: 9,
            dst: "::ffff:10.0.0.2".parse().unwrap(),
        };
        let b = hdr.to_bytes().unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(IpCmHeader::decode(&b).unwrap().0, hdr);
    }

    #[test]
    fn passive_side_view() {
        let sid = service_id(PortSpace::Tcp, 7471);
        let (local, remote) = v4_hdr().passive_endpoints(sid);
        assert_eq!(local, SocketAddr::new(V4_DST.into(), 7471));
        assert_eq!(remote, SocketAddr::new(V4_SRC.into(), 50000));
        assert_eq!(v4_hdr().src_socket(), remote);
    }

    #[test]
    fn port_space_values() {
        // Linux include/uapi/rdma/rdma_user_cm.h, enum rdma_ucm_port_space.
        assert_eq!(PortSpace::Ipoib.value(), 0x0002);
        assert_eq!(PortSpace::Tcp.value(), 0x0106);
        assert_eq!(PortSpace::Udp.value(), 0x0111);
        assert_eq!(PortSpace::Ib.value(), 0x013F);
        for ps in PortSpace::ALL {
            assert_eq!(PortSpace::from_value(ps.value()), Some(ps));
        }
        assert_eq!(PortSpace::from_value(0x0107), None);
        assert_eq!(PortSpace::from_value(0), None);
    }

    #[test]
    fn service_ids() {
        // librdmacm's examples (rdma_server, rdma_client, rstream) default
        // to port 7471; rping defaults to 7174.
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1D2F);
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1C06);
        assert_eq!(service_id(PortSpace::Udp, 7471), 0x0000_0000_0111_1D2F);
        assert_eq!(service_id(PortSpace::Ib, 0), 0x0000_0000_013F_0000);
        assert_eq!(service_id(PortSpace::Ipoib, 0xFFFF), 0x0000_0000_0002_FFFF);
        // librdmacm's RDMA_IB_IP_PS_TCP / _UDP / RDMA_IB_PS_IB.
        assert_eq!(service_id(PortSpace::Tcp, 0), 0x0106_0000);
        assert_eq!(service_id(PortSpace::Udp, 0), 0x0111_0000);
        assert_eq!(parse_service_id(0x0106_1D2F), Some((PortSpace::Tcp, 7471)));
        assert_eq!(parse_service_id(0x0111_0035), Some((PortSpace::Udp, 53)));
        for ps in PortSpace::ALL {
            for port in [0, 1, 7471, 0xFFFF] {
                let id = service_id(ps, port);
                assert_eq!(id & SERVICE_ID_PORT_MASK, port as u64);
                assert_eq!(id & SERVICE_ID_PS_MASK, (ps.value() as u64) << 16);
                assert_eq!(parse_service_id(id), Some((ps, port)));
            }
        }
        // Outside the IP ranges.
        assert_eq!(parse_service_id(0), None);
        assert_eq!(parse_service_id(0x0107_1D2F), None);
        assert_eq!(parse_service_id(0x0001_0106_1D2F), None);
        assert_eq!(parse_service_id(1 << 63 | 0x0106_1D2F), None);
        // An IBTA-style service id with an OUI in the top bytes.
        assert_eq!(parse_service_id(0x1000_0000_0000_0001), None);
    }

    #[test]
    fn gids() {
        let v4: IpAddr = Ipv4Addr::new(10, 1, 2, 3).into();
        let gid = gid_of(v4);
        assert_eq!(gid, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]);
        assert_eq!(ip_of_gid(gid), v4);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(v6)), v6);
        // A link-local IB GID is not an IP address family change.
        let ib_gid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0x10, 0x20, 0x30,
        ];
        assert_eq!(gid_of(ip_of_gid(ib_gid)), ib_gid);
        assert!(ip_of_gid(ib_gid).is_ipv6());
    }

    #[test]
    fn fuzz_check_accepts_the_fixed_vectors() {
        fuzz_check(&[]);
        fuzz_check(&v4_hdr().to_bytes().unwrap());
        fuzz_check(v6_hdr().private_data::<92>(b"x").unwrap().as_bytes());
        fuzz_check(&[0xFF; 200]);
    }

    fn ip(v6: bool) -> impl Strategy<Value = IpAddr> {
        if v6 {
            any::<[u8; 16]>().prop_map(|b| IpAddr::V6(b.into())).boxed()
        } else {
            any::<[u8; 4]>().prop_map(|b| IpAddr::V4(b.into())).boxed()
        }
    }

    fn header() -> impl Strategy<Value = IpCmHeader> {
        any::<bool>().prop_flat_map(|v6| {
            (ip(v6), any::<u16>(), ip(v6)).prop_map(|(src, src_port, dst)| IpCmHeader {
                src,
                src_port,
                dst,
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn round_trips(hdr in header(), user in proptest::collection::vec(any::<u8>(), 0..=56)) {
            let pd = hdr.private_data::<92>(&user).unwrap();
            let (back, rest) = IpCmHeader::decode(pd.as_bytes()).unwrap();
            prop_assert_eq!(back, hdr);
            prop_assert_eq!(&rest[..user.len()], &user[..]);
            prop_assert_eq!(hdr.to_bytes().unwrap()[1] >> 4, hdr.ip_version().unwrap());
        }

        #[test]
        fn any_bytes_are_checked(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            fuzz_check(&data);
        }

        #[test]
        fn valid_prefixes_are_checked(hdr in header(), tail in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut data = hdr.to_bytes().unwrap().to_vec();
            data.extend_from_slice(&tail);
            fuzz_check(&data);
        }

        #[test]
        fn service_ids_round_trip(id in any::<u64>(), port in any::<u16>(), i in 0usize..4) {
            let ps = PortSpace::ALL[i];
            prop_assert_eq!(parse_service_id(service_id(ps, port)), Some((ps, port)));
            if let Some((ps, port)) = parse_service_id(id) {
                prop_assert_eq!(service_id(ps, port), id);
            }
        }
    }
}
