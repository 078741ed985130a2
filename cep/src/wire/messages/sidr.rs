//! Service ID resolution: SIDR_REQ (IBTA Vol 1 Table 119) and SIDR_REP
//! (120).

use super::{info_prefix, non_canonical, Body, PrivateData, INFO_LEN};
use crate::wire::attr;
use crate::wire::bits::{Blob, Field, Reader, Writer};
use crate::wire::codes::SidrStatus;
use crate::wire::error::WireError;

pub(crate) mod sidr_req_layout {
    use super::{Blob, Field};

    pub const REQUEST_ID: Field = Field::data(0, 0, 32, "SIDR_REQ RequestID");
    pub const PKEY: Field = Field::data(4, 0, 16, "SIDR_REQ P_Key");
    pub const SERVICE_ID: Field = Field::data(8, 0, 64, "SIDR_REQ ServiceID");
    pub const PRIVATE_DATA: Blob = Blob::data(16, 216);

    pub const FIELDS: &[Field] = &[REQUEST_ID, PKEY, SERVICE_ID];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Service ID resolution request (SIDR_REQ), for UD services.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SidrReq {
    /// Request ID: the sender's id for this lookup, echoed in the SIDR_REP.
    pub request_id: u32,
    /// P_Key: the partition the requester will use to reach the service.
    pub pkey: u16,
    /// Service ID: the UD service to resolve.
    pub service_id: u64,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<216>,
}

impl Body for SidrReq {
    const ATTR: u16 = attr::SIDR_REQ;
    const FIELDS: &'static [Field] = sidr_req_layout::FIELDS;
    const BLOBS: &'static [Blob] = sidr_req_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use sidr_req_layout as l;
        Ok(Self {
            request_id: r.u32(l::REQUEST_ID),
            pkey: r.u16(l::PKEY),
            service_id: r.u64(l::SERVICE_ID),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use sidr_req_layout as l;
        w.uint(l::REQUEST_ID, self.request_id.into())?;
        w.uint(l::PKEY, self.pkey.into())?;
        w.uint(l::SERVICE_ID, self.service_id)?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

pub(crate) mod sidr_rep_layout {
    use super::{Blob, Field};

    pub const REQUEST_ID: Field = Field::data(0, 0, 32, "SIDR_REP RequestID");
    pub const STATUS: Field = Field::data(4, 0, 8, "SIDR_REP Status");
    pub const ADDITIONAL_INFO_LENGTH: Field =
        Field::data(5, 0, 8, "SIDR_REP AdditionalInformationLength");
    pub const QPN: Field = Field::data(8, 0, 24, "SIDR_REP QPN");
    pub const SERVICE_ID: Field = Field::data(12, 0, 64, "SIDR_REP ServiceID");
    pub const QKEY: Field = Field::data(20, 0, 32, "SIDR_REP Q_Key");
    pub const ADDITIONAL_INFO: Blob = Blob::data(24, 72);
    pub const PRIVATE_DATA: Blob = Blob::data(96, 136);

    pub const FIELDS: &[Field] = &[
        REQUEST_ID,
        STATUS,
        ADDITIONAL_INFO_LENGTH,
        QPN,
        SERVICE_ID,
        QKEY,
    ];
    pub const BLOBS: &[Blob] = &[ADDITIONAL_INFO, PRIVATE_DATA];
}

/// Service ID resolution reply (SIDR_REP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// Request ID: copied from the SIDR_REQ being answered.
    pub request_id: u32,
    /// Status: outcome of the lookup.
    pub status: SidrStatus,
    /// Additional Information Length: how many bytes of `additional_info`
    /// are meaningful.
    pub additional_info_length: u8,
    /// QPN: the service's UD QP number, 24 bits.
    pub qpn: u32,
    /// Service ID: the service this reply is for.
    pub service_id: u64,
    /// Q_Key: the Q_Key to use when sending to the service's QP.
    pub qkey: u32,
    /// Additional Information, whole area (redirection information for
    /// status `Redirect`).
    pub additional_info: [u8; INFO_LEN],
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<136>,
}

impl SidrRep {
    /// The meaningful part of the additional information (clamped).
    pub fn additional_info_bytes(&self) -> &[u8] {
        info_prefix(&self.additional_info, self.additional_info_length)
    }
}

impl Default for SidrRep {
    fn default() -> Self {
        Self {
            request_id: 0,
            status: SidrStatus::default(),
            additional_info_length: 0,
            qpn: 0,
            service_id: 0,
            qkey: 0,
            additional_info: [0; INFO_LEN],
            private_data: PrivateData::default(),
        }
    }
}

impl Body for SidrRep {
    const ATTR: u16 = attr::SIDR_REP;
    const FIELDS: &'static [Field] = sidr_rep_layout::FIELDS;
    const BLOBS: &'static [Blob] = sidr_rep_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use sidr_rep_layout as l;
        Ok(Self {
            request_id: r.u32(l::REQUEST_ID),
            status: SidrStatus::from_code(r.u8(l::STATUS)),
            additional_info_length: r.u8(l::ADDITIONAL_INFO_LENGTH),
            qpn: r.u32(l::QPN),
            service_id: r.u64(l::SERVICE_ID),
            qkey: r.u32(l::QKEY),
            additional_info: r.bytes(l::ADDITIONAL_INFO),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use sidr_rep_layout as l;
        if !self.status.is_canonical() {
            return Err(non_canonical(l::STATUS, self.status.code().into()));
        }
        w.uint(l::REQUEST_ID, self.request_id.into())?;
        w.uint(l::STATUS, self.status.code().into())?;
        w.uint(
            l::ADDITIONAL_INFO_LENGTH,
            self.additional_info_length.into(),
        )?;
        w.uint(l::QPN, self.qpn.into())?;
        w.uint(l::SERVICE_ID, self.service_id)?;
        w.uint(l::QKEY, self.qkey.into())?;
        w.bytes(l::ADDITIONAL_INFO, &self.additional_info);
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}
