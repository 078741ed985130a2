//! The messages that end a connection: DREQ (IBTA Vol 1 Table 112) and
//! DREP (113).

use super::{Body, PrivateData};
use crate::wire::attr;
use crate::wire::bits::{Blob, Field, Reader, Writer};
use crate::wire::error::WireError;

pub(crate) mod dreq_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "DREQ LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "DREQ RemoteCommID");
    pub const REMOTE_QPN_EECN: Field = Field::data(8, 0, 24, "DREQ RemoteQPN/EECN");
    pub const PRIVATE_DATA: Blob = Blob::data(12, 220);

    pub const FIELDS: &[Field] = &[LOCAL_COMM_ID, REMOTE_COMM_ID, REMOTE_QPN_EECN];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Disconnect request (DREQ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dreq {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// 24 bits: the receiver's QPN (or EECN for RD).
    pub remote_qpn_eecn: u32,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<220>,
}

impl Body for Dreq {
    const ATTR: u16 = attr::DREQ;
    const FIELDS: &'static [Field] = dreq_layout::FIELDS;
    const BLOBS: &'static [Blob] = dreq_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use dreq_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            remote_qpn_eecn: r.u32(l::REMOTE_QPN_EECN),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use dreq_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(l::REMOTE_QPN_EECN, self.remote_qpn_eecn.into())?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

pub(crate) mod drep_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "DREP LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "DREP RemoteCommID");
    pub const PRIVATE_DATA: Blob = Blob::data(8, 224);

    pub const FIELDS: &[Field] = &[LOCAL_COMM_ID, REMOTE_COMM_ID];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Disconnect reply (DREP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Drep {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<224>,
}

impl Body for Drep {
    const ATTR: u16 = attr::DREP;
    const FIELDS: &'static [Field] = drep_layout::FIELDS;
    const BLOBS: &'static [Blob] = drep_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use drep_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use drep_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}
