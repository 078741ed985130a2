//! The frame every CM MAD shares: its sizes, and the values the common
//! header holds in every CM message (`header.rs` reads and writes the
//! header; these sit below it and below the error type that names them).

/// Size of every MAD.
pub const MAD_LEN: usize = 256;
/// Size of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Size of the CM data area following the header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// `BaseVersion` of every MAD this codec understands.
pub const BASE_VERSION: u8 = 1;
/// `MgmtClass` of Communication Management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// `ClassVersion` of the CM (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` Send. CM protocol messages are all unsolicited Sends; the R
/// (response) bit, the most significant bit of the Method byte, is clear.
pub const METHOD_SEND: u8 = 0x03;
