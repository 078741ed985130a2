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
        /// The MRA acknowledges a REQ.
        #[default]
        Req = 0,
        /// The MRA acknowledges a REP.
        Rep = 1,
        /// The MRA acknowledges a LAP.
        Lap = 2,
    }
}

closed_enum! {
    /// REJ `MessageRejected` (2 bits): which message the REJ answers.
    pub enum MessageRejected {
        /// The REJ answers a REQ.
        #[default]
        Req = 0,
        /// The REJ answers a REP.
        Rep = 1,
        /// Any other message (in practice a LAP or a stray message).
        Other = 2,
    }
}

closed_enum! {
    /// REP `FailoverAccepted` (2 bits): the passive side's answer to the
    /// alternate path proposed in the REQ.
    pub enum FailoverAccepted {
        /// The alternate path was accepted.
        #[default]
        Accepted = 0,
        /// The passive side does not support failover.
        NotSupported = 1,
        /// The alternate path was refused.
        Rejected = 2,
    }
}

open_enum! {
    /// REJ `Reason` (16 bits).
    pub enum RejectReason(u16) {
        /// No QP available.
        NoQp = 1,
        /// No EE context available (RD).
        NoEec = 2,
        /// The receiver is out of resources.
        NoResources = 3,
        /// The sender gave up waiting for a reply.
        Timeout = 4,
        /// The request is not supported.
        UnsupportedRequest = 5,
        /// The communication ID matches no connection.
        InvalidCommId = 6,
        /// Invalid communication instance.
        InvalidCommInstance = 7,
        /// Nobody listens on the requested Service ID.
        InvalidServiceId = 8,
        /// The transport service type is not supported.
        InvalidTransportType = 9,
        /// The request clashes with an existing or stale connection.
        StaleConnection = 10,
        /// The RD channel named in the request does not exist.
        RdcNotExist = 11,
        /// Primary path: invalid GID.
        InvalidPrimaryGid = 12,
        /// Primary path: invalid LID.
        InvalidPrimaryLid = 13,
        /// Primary path: invalid service level.
        InvalidPrimarySl = 14,
        /// Primary path: invalid traffic class.
        InvalidPrimaryTrafficClass = 15,
        /// Primary path: invalid hop limit.
        InvalidPrimaryHopLimit = 16,
        /// Primary path: invalid packet rate.
        InvalidPrimaryPacketRate = 17,
        /// Alternate path: invalid GID.
        InvalidAlternateGid = 18,
        /// Alternate path: invalid LID.
        InvalidAlternateLid = 19,
        /// Alternate path: invalid service level.
        InvalidAlternateSl = 20,
        /// Alternate path: invalid traffic class.
        InvalidAlternateTrafficClass = 21,
        /// Alternate path: invalid hop limit.
        InvalidAlternateHopLimit = 22,
        /// Alternate path: invalid packet rate.
        InvalidAlternatePacketRate = 23,
        /// Send CM messages to another port; the ARI says where.
        PortCmRedirect = 24,
        /// Connect through another port; the ARI says which.
        PortRedirect = 25,
        /// The path MTU is not acceptable.
        InvalidMtu = 26,
        /// Not enough responder resources for the requested initiator depth.
        InsufficientResponderResources = 27,
        /// The application refused the connection.
        ConsumerReject = 28,
        /// The RNR retry count is not acceptable.
        InvalidRnrRetry = 29,
        /// The sender's Local Communication ID is already in use.
        DuplicateLocalCommId = 30,
        /// The CM ClassVersion is not supported.
        InvalidClassVersion = 31,
        /// Primary path: invalid flow label.
        InvalidFlowLabel = 32,
        /// Alternate path: invalid flow label.
        InvalidAlternateFlowLabel = 33,
    }
}

open_enum! {
    /// SIDR_REP `Status` (8 bits).
    pub enum SidrStatus(u8) {
        /// The service was found; QPN and Q_Key are valid.
        Success = 0,
        /// No service is registered under the Service ID.
        ServiceIdNotSupported = 1,
        /// The service refused the request.
        RejectedByServiceProvider = 2,
        /// The service has no QP available.
        NoQp = 3,
        /// Ask elsewhere; the additional information says where.
        Redirect = 4,
        /// The CM ClassVersion is not supported.
        ClassVersionNotSupported = 5,
    }
}

open_enum! {
    /// APR `APStatus` (8 bits): the answer to a LAP.
    pub enum ApStatus(u8) {
        /// The alternate path was loaded.
        Success = 0,
        /// The communication ID matches no connection.
        InvalidCommId = 1,
        /// Loading an alternate path is not supported.
        Unsupported = 2,
        /// The receiver refused the alternate path.
        Rejected = 3,
        /// Redirected; the additional information says where.
        Redirect = 4,
        /// The proposed path is already the current (primary) path.
        IsCurrent = 5,
        /// The Remote QPN/EECN matches no connection.
        InvalidQpnEecn = 6,
        /// Proposed path: invalid LID.
        InvalidLid = 7,
        /// Proposed path: invalid GID.
        InvalidGid = 8,
        /// Proposed path: invalid flow label.
        InvalidFlowLabel = 9,
        /// Proposed path: invalid traffic class.
        InvalidTrafficClass = 10,
        /// Proposed path: invalid hop limit.
        InvalidHopLimit = 11,
        /// Proposed path: invalid packet rate.
        InvalidPacketRate = 12,
        /// Proposed path: invalid service level.
        InvalidSl = 13,
    }
}
