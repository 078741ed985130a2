//! Loading an alternate path: LAP (IBTA Vol 1 Table 115) and APR (116).

use super::path::{PathInfo, PathLayout};
use super::{info_prefix, non_canonical, Body, PrivateData, INFO_LEN};
use crate::wire::attr;
use crate::wire::bits::{Blob, Field, Reader, Writer};
use crate::wire::codes::ApStatus;
use crate::wire::error::WireError;

pub(crate) mod lap_layout {
    use super::{Blob, Field, PathLayout};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "LAP LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "LAP RemoteCommID");
    pub const REMOTE_QPN_EECN: Field = Field::data(12, 0, 24, "LAP RemoteQPN/EECN");
    pub const REMOTE_CM_RESPONSE_TIMEOUT: Field =
        Field::data(15, 0, 5, "LAP RemoteCMResponseTimeout");

    pub const ALTERNATE: PathLayout = PathLayout {
        local_lid: Field::data(20, 0, 16, "LAP AlternateLocalPortLID"),
        remote_lid: Field::data(22, 0, 16, "LAP AlternateRemotePortLID"),
        local_gid: Blob::data(24, 16),
        remote_gid: Blob::data(40, 16),
        flow_label: Field::data(56, 0, 20, "LAP AlternateFlowLabel"),
        traffic_class: Field::data(59, 0, 8, "LAP AlternateTrafficClass"),
        hop_limit: Field::data(60, 0, 8, "LAP AlternateHopLimit"),
        packet_rate: Field::data(61, 2, 6, "LAP AlternatePacketRate"),
        sl: Field::data(62, 0, 4, "LAP AlternateSL"),
        subnet_local: Field::data(62, 4, 1, "LAP AlternateSubnetLocal"),
        local_ack_timeout: Field::data(63, 0, 5, "LAP AlternateLocalACKTimeout"),
    };

    pub const PRIVATE_DATA: Blob = Blob::data(64, 168);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        REMOTE_COMM_ID,
        REMOTE_QPN_EECN,
        REMOTE_CM_RESPONSE_TIMEOUT,
    ];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
    pub const PATHS: &[PathLayout] = &[ALTERNATE];
}

/// Load alternate path (LAP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lap {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN: the receiver's QP (or EE context) number, 24 bits.
    pub remote_qpn_eecn: u32,
    /// Remote CM Response Timeout: how long the receiver's CM may take to
    /// answer this LAP; 5 bits, CM timeout encoding.
    pub remote_cm_response_timeout: u8,
    /// The proposed alternate path.
    pub alternate_path: PathInfo,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<168>,
}

impl Body for Lap {
    const ATTR: u16 = attr::LAP;
    const FIELDS: &'static [Field] = lap_layout::FIELDS;
    const BLOBS: &'static [Blob] = lap_layout::BLOBS;
    const PATHS: &'static [PathLayout] = lap_layout::PATHS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use lap_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            remote_qpn_eecn: r.u32(l::REMOTE_QPN_EECN),
            remote_cm_response_timeout: r.u8(l::REMOTE_CM_RESPONSE_TIMEOUT),
            alternate_path: l::ALTERNATE.read(r),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use lap_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(l::REMOTE_QPN_EECN, self.remote_qpn_eecn.into())?;
        w.uint(
            l::REMOTE_CM_RESPONSE_TIMEOUT,
            self.remote_cm_response_timeout.into(),
        )?;
        l::ALTERNATE.write(&self.alternate_path, w)?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

pub(crate) mod apr_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "APR LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "APR RemoteCommID");
    pub const ADDITIONAL_INFO_LENGTH: Field =
        Field::data(8, 0, 8, "APR AdditionalInformationLength");
    pub const AP_STATUS: Field = Field::data(9, 0, 8, "APR APStatus");
    pub const ADDITIONAL_INFO: Blob = Blob::data(12, 72);
    pub const PRIVATE_DATA: Blob = Blob::data(84, 148);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        REMOTE_COMM_ID,
        ADDITIONAL_INFO_LENGTH,
        AP_STATUS,
    ];
    pub const BLOBS: &[Blob] = &[ADDITIONAL_INFO, PRIVATE_DATA];
}

/// Alternate path response (APR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Apr {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Additional Information Length: how many bytes of `additional_info`
    /// are meaningful.
    pub additional_info_length: u8,
    /// AP Status: the outcome of the LAP.
    pub ap_status: ApStatus,
    /// Additional Information: detail for the status, whole area.
    pub additional_info: [u8; INFO_LEN],
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<148>,
}

impl Apr {
    /// The meaningful part of the additional information (clamped).
    pub fn additional_info_bytes(&self) -> &[u8] {
        info_prefix(&self.additional_info, self.additional_info_length)
    }
}

impl Default for Apr {
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            additional_info_length: 0,
            ap_status: ApStatus::default(),
            additional_info: [0; INFO_LEN],
            private_data: PrivateData::default(),
        }
    }
}

impl Body for Apr {
    const ATTR: u16 = attr::APR;
    const FIELDS: &'static [Field] = apr_layout::FIELDS;
    const BLOBS: &'static [Blob] = apr_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use apr_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            additional_info_length: r.u8(l::ADDITIONAL_INFO_LENGTH),
            ap_status: ApStatus::from_code(r.u8(l::AP_STATUS)),
            additional_info: r.bytes(l::ADDITIONAL_INFO),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use apr_layout as l;
        if !self.ap_status.is_canonical() {
            return Err(non_canonical(l::AP_STATUS, self.ap_status.code().into()));
        }
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(
            l::ADDITIONAL_INFO_LENGTH,
            self.additional_info_length.into(),
        )?;
        w.uint(l::AP_STATUS, self.ap_status.code().into())?;
        w.bytes(l::ADDITIONAL_INFO, &self.additional_info);
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}
