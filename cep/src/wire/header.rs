//! The 24-byte common MAD header (IBTA Vol 1, 13.4.3) as used by the CM class.

use super::bits::{Field, Reader, Writer};
use super::error::WireError;
use super::frame::{
    BASE_VERSION, CM_CLASS_VERSION, HEADER_LEN, MAD_LEN, METHOD_SEND, MGMT_CLASS_CM,
};

const BASE_VERSION_F: Field = Field::header(0, 8, "BaseVersion");
const MGMT_CLASS_F: Field = Field::header(1, 8, "MgmtClass");
const CLASS_VERSION_F: Field = Field::header(2, 8, "ClassVersion");
const METHOD_F: Field = Field::header(3, 8, "Method");
const STATUS_F: Field = Field::header(4, 16, "Status");
const CLASS_SPECIFIC_F: Field = Field::header(6, 16, "ClassSpecific");
const TRANSACTION_ID_F: Field = Field::header(8, 64, "TransactionID");
const ATTRIBUTE_ID_F: Field = Field::header(16, 16, "AttributeID");
const RESERVED_F: Field = Field::header(18, 16, "Reserved");
const ATTRIBUTE_MODIFIER_F: Field = Field::header(20, 32, "AttributeModifier");

/// Header fields a decoded CM MAD keeps. `Status`, `ClassSpecific` and the
/// reserved word carry nothing for CM Sends, so they are not part of the
/// round trip and are always sent as zero.
pub(crate) const PRESERVED_FIELDS: &[Field] = &[
    BASE_VERSION_F,
    MGMT_CLASS_F,
    CLASS_VERSION_F,
    METHOD_F,
    TRANSACTION_ID_F,
    ATTRIBUTE_ID_F,
    ATTRIBUTE_MODIFIER_F,
];

/// The common MAD header, every field as it appears on the wire.
///
/// Parsing does not validate anything beyond the length, so a CM can still read
/// the transaction ID and attribute of a MAD it is about to reject (for example
/// to answer a bad `ClassVersion` with REJ reason 31).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// BaseVersion: version of the MAD format (1).
    pub base_version: u8,
    /// MgmtClass: the management class (0x07 for CM).
    pub mgmt_class: u8,
    /// ClassVersion: version of the class protocol (2 for CM).
    pub class_version: u8,
    /// Method including the R bit (0x80).
    pub method: u8,
    /// Status: result code of a response; zero in CM Sends.
    pub status: u16,
    /// ClassSpecific: defined per class; unused by CM.
    pub class_specific: u16,
    /// TransactionID: pairs a reply with its request.
    pub transaction_id: u64,
    /// AttributeID: which message (attribute) the MAD carries.
    pub attribute_id: u16,
    /// The reserved word at MAD offset 18; zero when sent.
    pub reserved: u16,
    /// AttributeModifier: qualifies the attribute; CM uses it only for ECE.
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// The header of an outgoing CM Send.
    pub const fn cm_send(attribute_id: u16, transaction_id: u64, attribute_modifier: u32) -> Self {
        Self {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            reserved: 0,
            attribute_modifier,
        }
    }

    /// Parses the first 24 bytes of `buf`. Fails only if `buf` is shorter.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let head = buf
            .get(..HEADER_LEN)
            .ok_or(WireError::BadLength { got: buf.len() })?;
        // Reuse the MAD-sized reader: copy the header into a zeroed MAD.
        let mut mad = [0u8; MAD_LEN];
        if let Some(dst) = mad.get_mut(..HEADER_LEN) {
            dst.copy_from_slice(head);
        }
        Ok(Self::read(&Reader::new(&mad)))
    }

    #[inline(always)]
    pub(crate) fn read(r: &Reader<'_>) -> Self {
        Self {
            base_version: r.u8(BASE_VERSION_F),
            mgmt_class: r.u8(MGMT_CLASS_F),
            class_version: r.u8(CLASS_VERSION_F),
            method: r.u8(METHOD_F),
            status: r.u16(STATUS_F),
            class_specific: r.u16(CLASS_SPECIFIC_F),
            transaction_id: r.u64(TRANSACTION_ID_F),
            attribute_id: r.u16(ATTRIBUTE_ID_F),
            reserved: r.u16(RESERVED_F),
            attribute_modifier: r.u32(ATTRIBUTE_MODIFIER_F),
        }
    }

    /// The 24 header bytes, exactly as given (no CM-specific checks).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut w = Writer::new();
        self.write(&mut w);
        let mad = w.finish();
        let mut out = [0u8; HEADER_LEN];
        if let Some(src) = mad.get(..HEADER_LEN) {
            out.copy_from_slice(src);
        }
        out
    }

    #[inline(always)]
    pub(crate) fn write(&self, w: &mut Writer) {
        // Every field is written at its full width, so these cannot fail.
        let fields: [(Field, u64); 10] = [
            (BASE_VERSION_F, self.base_version.into()),
            (MGMT_CLASS_F, self.mgmt_class.into()),
            (CLASS_VERSION_F, self.class_version.into()),
            (METHOD_F, self.method.into()),
            (STATUS_F, self.status.into()),
            (CLASS_SPECIFIC_F, self.class_specific.into()),
            (TRANSACTION_ID_F, self.transaction_id),
            (ATTRIBUTE_ID_F, self.attribute_id.into()),
            (RESERVED_F, self.reserved.into()),
            (ATTRIBUTE_MODIFIER_F, self.attribute_modifier.into()),
        ];
        for (f, v) in fields {
            let _ = w.uint(f, v);
        }
    }

    /// Checks the fields that identify a CM protocol message, in wire order, so
    /// the first mismatch is the one reported.
    pub fn validate_cm(&self) -> Result<(), WireError> {
        if self.base_version != BASE_VERSION {
            return Err(WireError::BadBaseVersion(self.base_version));
        }
        if self.mgmt_class != MGMT_CLASS_CM {
            return Err(WireError::BadClass(self.mgmt_class));
        }
        if self.class_version != CM_CLASS_VERSION {
            return Err(WireError::BadClassVersion(self.class_version));
        }
        if self.method != METHOD_SEND {
            return Err(WireError::BadMethod(self.method));
        }
        Ok(())
    }
}
