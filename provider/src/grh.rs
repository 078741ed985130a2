//! The network header at the start of a UD receive, read back into an
//! address vector to its sender (`ibv_init_ah_from_wc`).
//!
//! The first [`GRH_SIZE`] bytes of every UD receive buffer hold the
//! packet's network header when the completion says so (`Wc::grh`), in one
//! of two layouts (`union rdma_network_hdr` in Linux's `ib_verbs.h`):
//!
//! * **GRH or IPv6** (InfiniBand, RoCEv1, RoCEv2 over IPv6, and our
//!   RoCEv2 provider with `ipv4_grh_as_ipv6`): IP version 6 in the high
//!   nibble of byte 0, traffic class and flow label in bytes 0..4, hop
//!   limit at 7, source GID at 8..24, destination GID at 24..40;
//! * **IPv4** (RoCEv2 over IPv4 as Linux rxe and our RoCEv2 provider fill
//!   it): 20 bytes the device leaves (rxe: zero), then the 20-byte IPv4
//!   header: version 4 and IHL 5 at byte 20, TOS at 21, source address at
//!   32..36, destination at 36..40. The GIDs are the IPv4-mapped addresses.
//!
//! Nothing says which layout a buffer holds, so [`ReceivedHeader::parse`]
//! decides as rdma-core does: byte 0 not version 6 means IPv4 (byte 20
//! must then be an IPv4 header); version 6 means a GRH unless bytes 20..40
//! are an IPv4 header with a correct checksum (a device that writes the
//! IPv4 header without clearing the bytes before it).

use crate::{AvAttr, Gid, GrhAttr, Wc, GRH_SIZE};
use al::{Error, Result};

/// What the network header of a received datagram says: the sender's and
/// our GID, and the sender's traffic class and flow label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReceivedHeader {
    /// The sender's GID (IPv4-mapped for an IPv4 header).
    pub sgid: Gid,
    /// The GID the datagram was sent to: one of the receiving port's.
    pub dgid: Gid,
    /// Traffic class (IPv4: the TOS byte).
    pub traffic_class: u8,
    /// Flow label (IPv4: 0).
    pub flow_label: u32,
    /// Whether the area held an IPv4 header (RoCEv2 over IPv4).
    pub ipv4: bool,
}

/// Byte of the GRH area where an IPv4 header starts.
const V4_AT: usize = 20;

impl ReceivedHeader {
    /// Reads the first [`GRH_SIZE`] bytes of a UD receive buffer (shorter:
    /// `InvalidParameter`; neither layout: `InvalidParameter`).
    ///
    /// ```
    /// use provider::{ReceivedHeader, GRH_SIZE};
    /// // RoCEv2 over IPv4, as rxe fills it: 20 zero bytes, an IPv4 header.
    /// let mut area = [0u8; GRH_SIZE];
    /// area[20] = 0x45;
    /// area[32..36].copy_from_slice(&[192, 0, 2, 1]);
    /// area[36..40].copy_from_slice(&[192, 0, 2, 2]);
    /// let h = ReceivedHeader::parse(&area)?;
    /// assert!(h.ipv4);
    /// assert_eq!(h.sgid[10..], [0xff, 0xff, 192, 0, 2, 1]);
    /// # Ok::<(), al::Error>(())
    /// ```
    pub fn parse(area: &[u8]) -> Result<ReceivedHeader> {
        let Some(area) = area.get(..GRH_SIZE) else {
            return Err(Error::invalid_parameter(format!(
                "a UD receive's network header takes {GRH_SIZE} bytes, got {}",
                area.len()
            )));
        };
        let v4 = &area[V4_AT..];
        let v4_header = v4[0] == 0x45;
        let is_v4 = if area[0] >> 4 == 6 {
            v4_header && ipv4_checksum_ok(v4)
        } else if v4_header {
            true
        } else {
            return Err(Error::invalid_parameter(format!(
                "no GRH, IPv6 or IPv4 header in the receive's first {GRH_SIZE} bytes \
                 (byte 0 is {:#04x}, byte 20 is {:#04x})",
                area[0], v4[0]
            )));
        };
        if is_v4 {
            let mapped = |b: &[u8]| -> Gid {
                let mut g = [0u8; 16];
                g[10] = 0xff;
                g[11] = 0xff;
                g[12..].copy_from_slice(&b[..4]);
                g
            };
            return Ok(ReceivedHeader {
                sgid: mapped(&v4[12..16]),
                dgid: mapped(&v4[16..20]),
                traffic_class: v4[1],
                flow_label: 0,
                ipv4: true,
            });
        }
        let word0 = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
        let gid = |at: usize| -> Gid {
            let mut g = [0u8; 16];
            g.copy_from_slice(&area[at..at + 16]);
            g
        };
        Ok(ReceivedHeader {
            sgid: gid(8),
            dgid: gid(24),
            traffic_class: (word0 >> 20) as u8,
            flow_label: word0 & 0xf_ffff,
            ipv4: false,
        })
    }
}

/// Whether a 20-byte IPv4 header's checksum holds (the ones' complement
/// sum of its ten 16-bit words, the checksum included, is 0xffff).
fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = h[..20]
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

impl AvAttr {
    /// An address vector back to the sender of a received UD datagram
    /// (`ibv_init_ah_from_wc`): from `port`, to the completion's source
    /// LID, and, when the completion says a network header was received
    /// (`wc.grh`: always on RoCE), to the sender's GID read from `grh`,
    /// the first [`GRH_SIZE`] bytes of the receive buffer
    /// ([`ReceivedHeader::parse`], both RoCEv2 layouts), with its traffic
    /// class and flow label and hop limit 255. The source GID index is 0;
    /// `pd.create_av_from_wc(..)` picks the index of the GID the datagram
    /// was sent to. Without `wc.grh` the bytes are not read.
    ///
    /// ```
    /// use provider::{AvAttr, Wc, WcOpcode, GRH_SIZE};
    /// let mut area = [0u8; GRH_SIZE];
    /// area[0] = 0x60; // a GRH (IPv6 layout) from GID fe80::7
    /// area[8] = 0xfe;
    /// area[9] = 0x80;
    /// area[23] = 7;
    /// let wc = Wc { opcode: WcOpcode::Recv, src_qp: 5, grh: true, ..Wc::default() };
    /// let av = AvAttr::from_wc(&wc, &area, 1)?;
    /// assert_eq!(av.port, 1);
    /// assert_eq!(av.grh.unwrap().dgid[..2], [0xfe, 0x80]);
    /// assert_eq!(av.grh.unwrap().dgid[15], 7);
    /// # Ok::<(), al::Error>(())
    /// ```
    pub fn from_wc(wc: &Wc, grh: &[u8], port: u8) -> Result<AvAttr> {
        let mut av = AvAttr::lid(port, wc.slid);
        if wc.grh {
            let h = ReceivedHeader::parse(grh)?;
            av.grh = Some(GrhAttr {
                dgid: h.sgid,
                sgid_index: 0,
                flow_label: h.flow_label,
                hop_limit: 0xff,
                traffic_class: h.traffic_class,
            });
        }
        Ok(av)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{WcOpcode, WcStatus};

    fn v4_header(src: [u8; 4], dst: [u8; 4], tos: u8) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        h
    }

    fn mapped(ip: [u8; 4]) -> Gid {
        let mut g = [0u8; 16];
        g[10..12].copy_from_slice(&[0xff, 0xff]);
        g[12..].copy_from_slice(&ip);
        g
    }

    fn recv_wc(grh: bool, slid: u16) -> Wc {
        Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 100,
            imm: None,
            qp_num: 2,
            src_qp: 3,
            slid,
            pkey_index: 0,
            grh,
            solicited: false,
        }
    }

    #[test]
    fn an_ipv4_area_rxe_style_and_behind_garbage_reads_as_mapped_gids() {
        let v4 = v4_header([10, 0, 0, 1], [10, 0, 0, 2], 0x28);
        let mut rxe = [0u8; GRH_SIZE];
        rxe[20..].copy_from_slice(&v4);
        let h = ReceivedHeader::parse(&rxe).unwrap();
        assert!(h.ipv4);
        assert_eq!(h.sgid, mapped([10, 0, 0, 1]));
        assert_eq!(h.dgid, mapped([10, 0, 0, 2]));
        assert_eq!((h.traffic_class, h.flow_label), (0x28, 0));
        // A device that leaves version-6-looking bytes before the header:
        // the checksum says IPv4.
        let mut dirty = rxe;
        dirty[..20].fill(0x66);
        assert_eq!(ReceivedHeader::parse(&dirty).unwrap(), h);
        // The same bytes with a broken checksum are a GRH.
        dirty[30] ^= 1;
        assert!(!ReceivedHeader::parse(&dirty).unwrap().ipv4);
    }

    #[test]
    fn a_grh_area_reads_gids_traffic_class_and_flow_label() {
        let mut area = [0u8; GRH_SIZE];
        let word0 = (6u32 << 28) | (0xa5 << 20) | 0x1_2345;
        area[..4].copy_from_slice(&word0.to_be_bytes());
        area[7] = 9;
        // An IPv4-mapped source whose address starts with 0x45 (69.x):
        // byte 20 looks like an IPv4 header but the checksum says no.
        area[8..24].copy_from_slice(&mapped([69, 1, 2, 3]));
        area[24..40].copy_from_slice(&mapped([69, 1, 2, 4]));
        let h = ReceivedHeader::parse(&area).unwrap();
        assert!(!h.ipv4);
        assert_eq!(h.sgid, mapped([69, 1, 2, 3]));
        assert_eq!(h.dgid, mapped([69, 1, 2, 4]));
        assert_eq!((h.traffic_class, h.flow_label), (0xa5, 0x1_2345));
        let av = AvAttr::from_wc(&recv_wc(true, 0), &area, 2).unwrap();
        let g = av.grh.unwrap();
        assert_eq!((av.port, av.dlid, g.dgid), (2, 0, h.sgid));
        assert_eq!(
            (g.traffic_class, g.flow_label, g.hop_limit),
            (0xa5, 0x1_2345, 255)
        );
    }

    #[test]
    fn no_grh_flag_gives_a_lid_av_and_a_bad_area_is_refused() {
        let av = AvAttr::from_wc(&recv_wc(false, 7), &[], 1).unwrap();
        assert_eq!(av, AvAttr::lid(1, 7));
        assert!(AvAttr::from_wc(&recv_wc(true, 7), &[0u8; 39], 1).is_err());
        assert!(AvAttr::from_wc(&recv_wc(true, 7), &[0u8; GRH_SIZE], 1).is_err());
    }
}
