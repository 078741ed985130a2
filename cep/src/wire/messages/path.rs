//! The path record a REQ carries (primary and alternate) and a LAP
//! carries (alternate): [`PathInfo`], and where its fields live in each
//! message ([`PathLayout`]).

use crate::wire::bits::{Blob, Field, Reader, Writer};
use crate::wire::error::WireError;

/// One path as carried in a REQ or LAP.
///
/// The all-zero path is what a REQ carries when there is no alternate path;
/// see [`PathInfo::is_present`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathInfo {
    /// Local Port LID: LID of the sender's port on this path.
    pub local_lid: u16,
    /// Remote Port LID: LID of the receiver's port on this path.
    pub remote_lid: u16,
    /// Local Port GID: GID of the sender's port on this path.
    pub local_gid: [u8; 16],
    /// Remote Port GID: GID of the receiver's port on this path.
    pub remote_gid: [u8; 16],
    /// Flow Label for the GRH, 20 bits.
    pub flow_label: u32,
    /// Packet Rate: static rate of the path, 6 bits, IBTA rate encoding.
    pub packet_rate: u8,
    /// Traffic Class for the GRH.
    pub traffic_class: u8,
    /// Hop Limit for the GRH.
    pub hop_limit: u8,
    /// Service level, 4 bits.
    pub sl: u8,
    /// Set when the remote port is in the local subnet (no GRH needed).
    pub subnet_local: bool,
    /// Local ACK timeout, 5 bits, CM timeout encoding.
    pub local_ack_timeout: u8,
}

impl PathInfo {
    /// Whether the record describes a path. A REQ without an alternate path
    /// zeroes the alternate fields; on RoCE the LIDs are zero even for real
    /// paths, hence the GID check.
    pub fn is_present(&self) -> bool {
        self.local_lid != 0 || self.local_gid != [0u8; 16]
    }
}

/// Where the fields of one [`PathInfo`] live. REQ and LAP order the
/// traffic class, hop limit and packet rate differently, hence a table rather
/// than a base offset.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PathLayout {
    pub local_lid: Field,
    pub remote_lid: Field,
    pub local_gid: Blob,
    pub remote_gid: Blob,
    pub flow_label: Field,
    pub packet_rate: Field,
    pub traffic_class: Field,
    pub hop_limit: Field,
    pub sl: Field,
    pub subnet_local: Field,
    pub local_ack_timeout: Field,
}

impl PathLayout {
    pub fn fields(&self) -> [Field; 9] {
        [
            self.local_lid,
            self.remote_lid,
            self.flow_label,
            self.packet_rate,
            self.traffic_class,
            self.hop_limit,
            self.sl,
            self.subnet_local,
            self.local_ack_timeout,
        ]
    }

    pub fn blobs(&self) -> [Blob; 2] {
        [self.local_gid, self.remote_gid]
    }

    #[inline(always)]
    pub(super) fn read(&self, r: &Reader<'_>) -> PathInfo {
        PathInfo {
            local_lid: r.u16(self.local_lid),
            remote_lid: r.u16(self.remote_lid),
            local_gid: r.bytes(self.local_gid),
            remote_gid: r.bytes(self.remote_gid),
            flow_label: r.u32(self.flow_label),
            packet_rate: r.u8(self.packet_rate),
            traffic_class: r.u8(self.traffic_class),
            hop_limit: r.u8(self.hop_limit),
            sl: r.u8(self.sl),
            subnet_local: r.flag(self.subnet_local),
            local_ack_timeout: r.u8(self.local_ack_timeout),
        }
    }

    #[inline(always)]
    pub(super) fn write(&self, p: &PathInfo, w: &mut Writer) -> Result<(), WireError> {
        w.uint(self.local_lid, p.local_lid.into())?;
        w.uint(self.remote_lid, p.remote_lid.into())?;
        w.bytes(self.local_gid, &p.local_gid);
        w.bytes(self.remote_gid, &p.remote_gid);
        w.uint(self.flow_label, p.flow_label.into())?;
        w.uint(self.packet_rate, p.packet_rate.into())?;
        w.uint(self.traffic_class, p.traffic_class.into())?;
        w.uint(self.hop_limit, p.hop_limit.into())?;
        w.uint(self.sl, p.sl.into())?;
        w.flag(self.subnet_local, p.subnet_local);
        w.uint(self.local_ack_timeout, p.local_ack_timeout.into())
    }
}
