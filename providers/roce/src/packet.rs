//! A whole RoCEv2 UDP payload: BTH, extension headers in IBTA order, payload,
//! pad to a 4-byte multiple (count in the BTH), ICRC.

use crate::bytes::room;
use crate::{
    icrc, Aeth, AtomicAckEth, AtomicEth, Bth, DecodeError, Deth, EncodeError, Endpoints, Ieth,
    ImmDt, Reth, WireHeader, ICRC_LEN,
};

/// Length of the CNP's reserved body.
const CNP_RESERVED: usize = 16;

/// The BTH and the extension headers of one packet. Which extension headers
/// are present is fixed by the opcode ([`crate::Opcode::layout`]); encoding
/// checks that they match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Headers {
    /// The base transport header.
    pub bth: Bth,
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// RETH (RDMA WRITE first/only, READ request).
    pub reth: Option<Reth>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEth>,
    /// AETH (acknowledgements, READ responses first/last/only).
    pub aeth: Option<Aeth>,
    /// AtomicAckETH (atomic acknowledge).
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// Immediate data (the "with Immediate" opcodes).
    pub imm: Option<ImmDt>,
    /// IETH (the "with Invalidate" opcodes).
    pub ieth: Option<Ieth>,
}

impl Headers {
    /// Just a BTH; set the extension headers the opcode needs.
    pub const fn new(bth: Bth) -> Self {
        Headers {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm: None,
            ieth: None,
        }
    }

    /// Bytes of the BTH and the extension headers its opcode carries.
    pub const fn encoded_len(&self) -> usize {
        Bth::LEN + self.bth.opcode.layout().ext_len()
    }

    /// Checks that exactly the extension headers of the opcode are present.
    pub fn check(&self) -> Result<(), EncodeError> {
        let opcode = self.bth.opcode;
        let layout = opcode.layout();
        // In the order the wire carries them.
        let wanted = [
            layout.deth,
            layout.reth,
            layout.atomic_eth,
            layout.aeth,
            layout.atomic_ack_eth,
            layout.imm,
            layout.ieth,
        ];
        let has = [
            self.deth.is_some(),
            self.reth.is_some(),
            self.atomic_eth.is_some(),
            self.aeth.is_some(),
            self.atomic_ack_eth.is_some(),
            self.imm.is_some(),
            self.ieth.is_some(),
        ];
        // The common case (every packet the transport builds) by one
        // compare; the error names the first header out of place.
        if wanted == has {
            return Ok(());
        }
        const NAMES: [&str; 7] = [
            Deth::NAME,
            Reth::NAME,
            AtomicEth::NAME,
            Aeth::NAME,
            AtomicAckEth::NAME,
            ImmDt::NAME,
            Ieth::NAME,
        ];
        for ((wanted, has), header) in wanted.into_iter().zip(has).zip(NAMES) {
            match (wanted, has) {
                (true, false) => return Err(EncodeError::MissingHeader { opcode, header }),
                (false, true) => return Err(EncodeError::UnexpectedHeader { opcode, header }),
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes the headers (with `pad_count` in the BTH) at the start of
    /// `out`; returns their length.
    fn encode(&self, pad_count: u8, out: &mut [u8]) -> Result<usize, EncodeError> {
        self.check()?;
        let out = room(out, self.encoded_len())?;
        Bth {
            pad_count,
            ..self.bth
        }
        .encode(out)?;
        let mut at = Bth::LEN;
        fn put<H: WireHeader>(
            h: &Option<H>,
            out: &mut [u8],
            at: &mut usize,
        ) -> Result<(), EncodeError> {
            if let Some(h) = h {
                h.encode(&mut out[*at..])?;
                *at += H::LEN;
            }
            Ok(())
        }
        put(&self.deth, out, &mut at)?;
        put(&self.reth, out, &mut at)?;
        put(&self.atomic_eth, out, &mut at)?;
        put(&self.aeth, out, &mut at)?;
        put(&self.atomic_ack_eth, out, &mut at)?;
        put(&self.imm, out, &mut at)?;
        put(&self.ieth, out, &mut at)?;
        if self.bth.opcode.layout().cnp_reserved {
            out[at..at + CNP_RESERVED].fill(0);
            at += CNP_RESERVED;
        }
        debug_assert_eq!(at, self.encoded_len());
        Ok(at)
    }

    /// Reads the BTH and the extension headers its opcode names from the
    /// start of `bytes`; returns them and their length.
    pub fn decode(bytes: &[u8]) -> Result<(Self, usize), DecodeError> {
        let bth = Bth::decode(bytes)?;
        let layout = bth.opcode.layout();
        let mut at = Bth::LEN;
        fn get<H: WireHeader>(
            wanted: bool,
            bytes: &[u8],
            at: &mut usize,
        ) -> Result<Option<H>, DecodeError> {
            if !wanted {
                return Ok(None);
            }
            let h = H::decode(bytes.get(*at..).unwrap_or_default())?;
            *at += H::LEN;
            Ok(Some(h))
        }
        let mut h = Headers::new(bth);
        h.deth = get(layout.deth, bytes, &mut at)?;
        h.reth = get(layout.reth, bytes, &mut at)?;
        h.atomic_eth = get(layout.atomic_eth, bytes, &mut at)?;
        h.aeth = get(layout.aeth, bytes, &mut at)?;
        h.atomic_ack_eth = get(layout.atomic_ack_eth, bytes, &mut at)?;
        h.imm = get(layout.imm, bytes, &mut at)?;
        h.ieth = get(layout.ieth, bytes, &mut at)?;
        if layout.cnp_reserved {
            crate::bytes::take(
                bytes.get(at..).unwrap_or_default(),
                CNP_RESERVED,
                "CNP reserved",
            )?;
            at += CNP_RESERVED;
        }
        Ok((h, at))
    }
}

/// One RoCEv2 packet: headers and a borrowed payload (without the pad).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packet<'a> {
    /// BTH and extension headers. On encode the BTH pad count is computed
    /// from the payload, whatever it holds; on decode it is the one received.
    pub headers: Headers,
    /// The payload, pad stripped.
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// A packet of these headers and payload, with the BTH pad count set
    /// to the one the payload needs (as decoding such a packet gives).
    pub const fn new(mut headers: Headers, payload: &'a [u8]) -> Self {
        headers.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
        Packet { headers, payload }
    }

    /// Pad bytes after the payload: `(4 - len % 4) % 4`.
    pub const fn pad_count(&self) -> u8 {
        ((4 - self.payload.len() % 4) % 4) as u8
    }

    /// Bytes of the UDP payload [`Packet::encode`] produces.
    pub const fn encoded_len(&self) -> usize {
        self.headers.encoded_len() + self.payload.len() + self.pad_count() as usize + ICRC_LEN
    }

    /// Writes the UDP payload (BTH .. payload, pad, ICRC) to the start of
    /// `out`, with the ICRC computed over the IP and UDP headers the
    /// receiver will see for `endpoints`; returns its length.
    pub fn encode_into(&self, endpoints: &Endpoints, out: &mut [u8]) -> Result<usize, EncodeError> {
        let opcode = self.headers.bth.opcode;
        if !opcode.layout().payload && !self.payload.is_empty() {
            return Err(EncodeError::PayloadNotAllowed {
                opcode,
                len: self.payload.len(),
            });
        }
        let total = self.encoded_len();
        let out = room(out, total)?;
        let pad = self.pad_count();
        let mut at = self.headers.encode(pad, out)?;
        out[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        out[at..at + pad as usize].fill(0);
        at += pad as usize;
        let crc = icrc::icrc(endpoints, &out[..at])?;
        out[at..at + ICRC_LEN].copy_from_slice(&icrc::to_wire(crc));
        Ok(total)
    }

    /// Appends the UDP payload (BTH .. payload, pad, ICRC) for `endpoints`
    /// to `out` and returns its length; on an error `out` is left as it
    /// was. The same bytes as [`Packet::encode_into`], written once each:
    /// a sender that reuses one buffer for many packets does not zero the
    /// room first (a 4 KiB packet's payload is copied from its MR, then
    /// read once for the ICRC while it is in cache).
    pub fn encode_append(
        &self,
        endpoints: &Endpoints,
        out: &mut Vec<u8>,
    ) -> Result<usize, EncodeError> {
        encode_append_filled(
            self.headers,
            self.payload.len(),
            endpoints,
            out,
            |out: &mut Vec<u8>| -> Result<(), EncodeError> {
                out.extend_from_slice(self.payload);
                Ok(())
            },
        )
    }

    /// The UDP payload (BTH .. payload, pad, ICRC) for `endpoints`.
    pub fn encode(&self, endpoints: &Endpoints) -> Result<Vec<u8>, EncodeError> {
        let mut v = vec![0; self.encoded_len()];
        self.encode_into(endpoints, &mut v)?;
        Ok(v)
    }

    /// Parses a UDP payload and checks its ICRC against the IP and UDP
    /// headers `endpoints` describe.
    pub fn decode(udp_payload: &'a [u8], endpoints: &Endpoints) -> Result<Self, DecodeError> {
        let packet = Self::decode_without_icrc(udp_payload)?;
        let (body, carried) = split_icrc(udp_payload)?;
        let computed = icrc::icrc(endpoints, body).map_err(|_| DecodeError::TooLong {
            len: udp_payload.len(),
        })?;
        if computed != carried {
            return Err(DecodeError::IcrcMismatch { carried, computed });
        }
        Ok(packet)
    }

    /// Parses a UDP payload without checking its ICRC (which must still be
    /// present): for callers that checked it themselves, e.g. with
    /// [`icrc::icrc_over_headers`].
    pub fn decode_without_icrc(udp_payload: &'a [u8]) -> Result<Self, DecodeError> {
        let len = udp_payload.len();
        let (headers, at) = Headers::decode(udp_payload)?;
        let (body, _) = split_icrc(udp_payload)?;
        if at > body.len() {
            return Err(DecodeError::Truncated {
                what: "ICRC",
                need: at + ICRC_LEN,
                have: len,
            });
        }
        if len % 4 != 0 {
            return Err(DecodeError::Misaligned { len });
        }
        let rest = &body[at..];
        let opcode = headers.bth.opcode;
        if !opcode.layout().payload && !rest.is_empty() {
            return Err(DecodeError::UnexpectedPayload {
                opcode,
                len: rest.len(),
            });
        }
        let pad = headers.bth.pad_count;
        if usize::from(pad) > rest.len() {
            return Err(DecodeError::PadTooLarge {
                pad,
                available: rest.len(),
            });
        }
        Ok(Packet {
            headers,
            payload: &rest[..rest.len() - usize::from(pad)],
        })
    }
}

/// The bytes before the ICRC, and the ICRC.
fn split_icrc(udp_payload: &[u8]) -> Result<(&[u8], u32), DecodeError> {
    let len = udp_payload.len();
    if len < Bth::LEN + ICRC_LEN {
        return Err(DecodeError::Truncated {
            what: "RoCEv2 packet",
            need: Bth::LEN + ICRC_LEN,
            have: len,
        });
    }
    let (body, tail) = udp_payload.split_at(len - ICRC_LEN);
    Ok((body, icrc::from_wire([tail[0], tail[1], tail[2], tail[3]])))
}

/// Appends the UDP payload (BTH .. payload, pad, ICRC) of a packet with
/// `headers` and `payload_len` bytes of payload to `out`, the payload
/// written by `fill` (which appends exactly `payload_len` bytes or fails),
/// and returns its length; on an error, `fill`'s or the encoding's,
/// `out` is left as it was. For a sender that reads a payload from
/// memory straight into the datagram buffer instead of into a packet of
/// its own first (one copy less per byte; [`Packet::encode_append`] is
/// this with the payload copied from a slice). The BTH pad count is the
/// one `payload_len` needs.
pub fn encode_append_filled<E: From<EncodeError>>(
    mut headers: Headers,
    payload_len: usize,
    endpoints: &Endpoints,
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<usize, E> {
    let opcode = headers.bth.opcode;
    if !opcode.layout().payload && payload_len != 0 {
        return Err(EncodeError::PayloadNotAllowed {
            opcode,
            len: payload_len,
        }
        .into());
    }
    let pad = ((4 - payload_len % 4) % 4) as u8;
    headers.bth.pad_count = pad;
    let mut head = [0u8; 128];
    let n = headers.encode(pad, &mut head)?;
    let start = out.len();
    out.reserve(n + payload_len + pad as usize + ICRC_LEN);
    out.extend_from_slice(&head[..n]);
    let filled = fill(out);
    let got = out.len() - start - n;
    if let Err(e) = filled {
        out.truncate(start);
        return Err(e);
    }
    if got != payload_len {
        out.truncate(start);
        return Err(EncodeError::BufferTooShort {
            need: payload_len,
            have: got,
        }
        .into());
    }
    out.extend_from_slice(&[0u8; 3][..pad as usize]);
    match icrc::icrc(endpoints, &out[start..]) {
        Ok(crc) => {
            out.extend_from_slice(&icrc::to_wire(crc));
            Ok(out.len() - start)
        }
        Err(e) => {
            out.truncate(start);
            Err(e.into())
        }
    }
}
