//! CM AttributeIDs (IBTA Vol 1, Table 104).

/// Connection request (REQ).
pub const REQ: u16 = 0x0010;
/// Message receipt acknowledgement (MRA).
pub const MRA: u16 = 0x0011;
/// Reject (REJ).
pub const REJ: u16 = 0x0012;
/// Connection reply (REP).
pub const REP: u16 = 0x0013;
/// Ready to use (RTU).
pub const RTU: u16 = 0x0014;
/// Disconnect request (DREQ).
pub const DREQ: u16 = 0x0015;
/// Disconnect reply (DREP).
pub const DREP: u16 = 0x0016;
/// Service ID resolution request (SIDR_REQ).
pub const SIDR_REQ: u16 = 0x0017;
/// Service ID resolution reply (SIDR_REP).
pub const SIDR_REP: u16 = 0x0018;
/// Load alternate path (LAP).
pub const LAP: u16 = 0x0019;
/// Alternate path response (APR).
pub const APR: u16 = 0x001A;

/// Every CM message AttributeID, in numeric order.
pub const ALL: [u16; 11] = [
    REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP, APR,
];

/// Short upper-case name of a CM message attribute (`"REQ"`, ...).
pub const fn name(attr_id: u16) -> Option<&'static str> {
    Some(match attr_id {
        REQ => "REQ",
        MRA => "MRA",
        REJ => "REJ",
        REP => "REP",
        RTU => "RTU",
        DREQ => "DREQ",
        DREP => "DREP",
        SIDR_REQ => "SIDR_REQ",
        SIDR_REP => "SIDR_REP",
        LAP => "LAP",
        APR => "APR",
        _ => return None,
    })
}
