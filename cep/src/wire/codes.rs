//! Enumerated CM field values.
//!
//! Two flavours exist on purpose. *Closed* enums (`TransportType`,
//! `MessageMraed`, `MessageRejected`, `FailoverAccepted`) select how the rest of
//! the message is interpreted, so a reserved value makes the message
//! meaningless and is a decode error. *Open* enums (`RejectReason`,
//! `SidrStatus`, `ApStatus`) only report an outcome; the tables grow between
//! spec releases, so an unknown value decodes to `Other(code)` and the CM can
//! still treat it as a generic failure instead of dropping the MAD and timing
//! out.
//!
//! Every enum's `Default` is the value whose wire code is zero, so a default
//! message encodes to an all-zero body.

macro_rules! closed_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident = $code:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $var = $code, )*
        }

        impl $name {
            /// The wire code.
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The variant for a wire code, `None` for a reserved code.
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $( $code => Some(Self::$var), )*
                    _ => None,
                }
            }
        }
    };
}

macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($repr:ty) {
            $( $(#[$vmeta:meta])* $var:ident = $code:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $var, )*
            /// A code this codec has no name for (reserved today, or defined by
            /// a later spec release). Encoding `Other` with a code that does
            /// have a name is rejected, so that every value has exactly one
            /// representation and decoding is the inverse of encoding.
            Other($repr),
        }

        impl $name {
            /// The wire code.
            pub const fn code(self) -> $repr {
                match self {
                    $( Self::$var => $code, )*
                    Self::Other(code) => code,
                }
            }

            /// The variant for a wire code; never fails.
            pub const fn from_code(code: $repr) -> Self {
                match code {
                    $( $code => Self::$var, )*
                    other => Self::Other(other),
                }
            }

            /// False for `Other(code)` when `code` has a named variant.
            pub const fn is_canonical(self) -> bool {
                match self {
                    Self::Other(code) => matches!(Self::from_code(code), Self::Other(_)),
                    _ => true,
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::from_code(0)
            }
        }
    };
}

closed_enum! {
    /// REQ `TransportServiceType` (2 bits). IBTA assigns 2 to Reliable
    /// Datagram, which this stack does not implement; it is treated as
    /// reserved.
    pub enum TransportType {
        /// Reliable Connected.
        #[default]
        Rc = 0,
        /// Unreliable Connected.
        Uc = 1,
        /// The REQ's `ExtendedTransportType` field names the transport
        /// (1 = XRC).
        Extended = 3,
    }
}

closed_enum! {
    /// MRA `MessageMRAed` (2 bits): which message the MRA acknowledges.
    pub enum MessageMraed {
        #[default]
        Req = 0,
        Rep = 1,
        Lap = 2,
    }
}

closed_enum! {
    /// REJ `MessageRejected` (2 bits): which message the REJ answers.
    pub enum MessageRejected {
        #[default]
        Req = 0,
        Rep = 1,
        /// Any other message (in practice a LAP or a stray message).
        Other = 2,
    }
}

closed_enum! {
    /// REP `FailoverAccepted` (2 bits): the passive side's answer to the
    /// alternate path proposed in the REQ.
    pub enum FailoverAccepted {
        #[default]
        Accepted = 0,
        NotSupported = 1,
        Rejected = 2,
    }
}

open_enum! {
    /// REJ `Reason` (16 bits).
    pub enum RejectReason(u16) {
        NoQp = 1,
        NoEec = 2,
        NoResources = 3,
        Timeout = 4,
        UnsupportedRequest = 5,
        InvalidCommId = 6,
        InvalidCommInstance = 7,
        InvalidServiceId = 8,
        InvalidTransportType = 9,
        StaleConnection = 10,
        RdcNotExist = 11,
        InvalidPrimaryGid = 12,
        InvalidPrimaryLid = 13,
        InvalidPrimarySl = 14,
        InvalidPrimaryTrafficClass = 15,
        InvalidPrimaryHopLimit = 16,
        InvalidPrimaryPacketRate = 17,
        InvalidAlternateGid = 18,
        InvalidAlternateLid = 19,
        InvalidAlternateSl = 20,
        InvalidAlternateTrafficClass = 21,
        InvalidAlternateHopLimit = 22,
        InvalidAlternatePacketRate = 23,
        PortCmRedirect = 24,
        PortRedirect = 25,
        InvalidMtu = 26,
        InsufficientResponderResources = 27,
        ConsumerReject = 28,
        InvalidRnrRetry = 29,
        DuplicateLocalCommId = 30,
        InvalidClassVersion = 31,
        InvalidFlowLabel = 32,
        InvalidAlternateFlowLabel = 33,
    }
}

open_enum! {
    /// SIDR_REP `Status` (8 bits).
    pub enum SidrStatus(u8) {
        Success = 0,
        ServiceIdNotSupported = 1,
        RejectedByServiceProvider = 2,
        NoQp = 3,
        Redirect = 4,
        ClassVersionNotSupported = 5,
    }
}

open_enum! {
    /// APR `APStatus` (8 bits): the answer to a LAP.
    pub enum ApStatus(u8) {
        /// The alternate path was loaded.
        Success = 0,
        InvalidCommId = 1,
        Unsupported = 2,
        Rejected = 3,
        Redirect = 4,
        /// The proposed path is already the current (primary) path.
        IsCurrent = 5,
        InvalidQpnEecn = 6,
        InvalidLid = 7,
        InvalidGid = 8,
        InvalidFlowLabel = 9,
        InvalidTrafficClass = 10,
        InvalidHopLimit = 11,
        InvalidPacketRate = 12,
        InvalidSl = 13,
    }
}
