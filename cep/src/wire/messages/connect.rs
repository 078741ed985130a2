//! The messages that set a connection up: REQ (IBTA Vol 1 Table 106), MRA
//! (107), REJ (108), REP (110) and RTU (111).

use super::path::{PathInfo, PathLayout};
use super::{closed, info_prefix, non_canonical, Body, PrivateData, INFO_LEN};
use crate::wire::attr;
use crate::wire::bits::{Blob, Field, Reader, Writer};
use crate::wire::codes::{
    FailoverAccepted, MessageMraed, MessageRejected, RejectReason, TransportType,
};
use crate::wire::error::WireError;

// ---------------------------------------------------------------------------
// REQ (Table 106)
// ---------------------------------------------------------------------------

pub(crate) mod req_layout {
    use super::{Blob, Field, PathLayout};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "REQ LocalCommID");
    pub const SERVICE_ID: Field = Field::data(8, 0, 64, "REQ ServiceID");
    pub const LOCAL_CA_GUID: Field = Field::data(16, 0, 64, "REQ LocalCAGUID");
    pub const LOCAL_QKEY: Field = Field::data(28, 0, 32, "REQ LocalQKey");
    pub const LOCAL_QPN: Field = Field::data(32, 0, 24, "REQ LocalQPN");
    pub const RESPONDER_RESOURCES: Field = Field::data(35, 0, 8, "REQ ResponderResources");
    pub const LOCAL_EECN: Field = Field::data(36, 0, 24, "REQ LocalEECN");
    pub const INITIATOR_DEPTH: Field = Field::data(39, 0, 8, "REQ InitiatorDepth");
    pub const REMOTE_EECN: Field = Field::data(40, 0, 24, "REQ RemoteEECN");
    pub const REMOTE_CM_RESPONSE_TIMEOUT: Field =
        Field::data(43, 0, 5, "REQ RemoteCMResponseTimeout");
    pub const TRANSPORT_SERVICE_TYPE: Field = Field::data(43, 5, 2, "REQ TransportServiceType");
    pub const END_TO_END_FLOW_CONTROL: Field = Field::data(43, 7, 1, "REQ EndToEndFlowControl");
    pub const STARTING_PSN: Field = Field::data(44, 0, 24, "REQ StartingPSN");
    pub const LOCAL_CM_RESPONSE_TIMEOUT: Field =
        Field::data(47, 0, 5, "REQ LocalCMResponseTimeout");
    pub const RETRY_COUNT: Field = Field::data(47, 5, 3, "REQ RetryCount");
    pub const PKEY: Field = Field::data(48, 0, 16, "REQ P_Key");
    pub const PATH_MTU: Field = Field::data(50, 0, 4, "REQ PathPacketPayloadMTU");
    pub const RDC_EXISTS: Field = Field::data(50, 4, 1, "REQ RDCExists");
    pub const RNR_RETRY_COUNT: Field = Field::data(50, 5, 3, "REQ RNRRetryCount");
    pub const MAX_CM_RETRIES: Field = Field::data(51, 0, 4, "REQ MaxCMRetries");
    pub const SRQ: Field = Field::data(51, 4, 1, "REQ SRQ");
    pub const EXTENDED_TRANSPORT_TYPE: Field = Field::data(51, 5, 3, "REQ ExtendedTransportType");

    pub const PRIMARY: PathLayout = PathLayout {
        local_lid: Field::data(52, 0, 16, "REQ PrimaryLocalPortLID"),
        remote_lid: Field::data(54, 0, 16, "REQ PrimaryRemotePortLID"),
        local_gid: Blob::data(56, 16),
        remote_gid: Blob::data(72, 16),
        flow_label: Field::data(88, 0, 20, "REQ PrimaryFlowLabel"),
        packet_rate: Field::data(91, 2, 6, "REQ PrimaryPacketRate"),
        traffic_class: Field::data(92, 0, 8, "REQ PrimaryTrafficClass"),
        hop_limit: Field::data(93, 0, 8, "REQ PrimaryHopLimit"),
        sl: Field::data(94, 0, 4, "REQ PrimarySL"),
        subnet_local: Field::data(94, 4, 1, "REQ PrimarySubnetLocal"),
        local_ack_timeout: Field::data(95, 0, 5, "REQ PrimaryLocalACKTimeout"),
    };

    pub const ALTERNATE: PathLayout = PathLayout {
        local_lid: Field::data(96, 0, 16, "REQ AlternateLocalPortLID"),
        remote_lid: Field::data(98, 0, 16, "REQ AlternateRemotePortLID"),
        local_gid: Blob::data(100, 16),
        remote_gid: Blob::data(116, 16),
        flow_label: Field::data(132, 0, 20, "REQ AlternateFlowLabel"),
        packet_rate: Field::data(135, 2, 6, "REQ AlternatePacketRate"),
        traffic_class: Field::data(136, 0, 8, "REQ AlternateTrafficClass"),
        hop_limit: Field::data(137, 0, 8, "REQ AlternateHopLimit"),
        sl: Field::data(138, 0, 4, "REQ AlternateSL"),
        subnet_local: Field::data(138, 4, 1, "REQ AlternateSubnetLocal"),
        local_ack_timeout: Field::data(139, 0, 5, "REQ AlternateLocalACKTimeout"),
    };

    pub const SAP_SUPPORTED: Field = Field::data(139, 5, 1, "REQ SAPSupported");
    pub const PRIVATE_DATA: Blob = Blob::data(140, 92);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        SERVICE_ID,
        LOCAL_CA_GUID,
        LOCAL_QKEY,
        LOCAL_QPN,
        RESPONDER_RESOURCES,
        LOCAL_EECN,
        INITIATOR_DEPTH,
        REMOTE_EECN,
        REMOTE_CM_RESPONSE_TIMEOUT,
        TRANSPORT_SERVICE_TYPE,
        END_TO_END_FLOW_CONTROL,
        STARTING_PSN,
        LOCAL_CM_RESPONSE_TIMEOUT,
        RETRY_COUNT,
        PKEY,
        PATH_MTU,
        RDC_EXISTS,
        RNR_RETRY_COUNT,
        MAX_CM_RETRIES,
        SRQ,
        EXTENDED_TRANSPORT_TYPE,
        SAP_SUPPORTED,
    ];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
    pub const PATHS: &[PathLayout] = &[PRIMARY, ALTERNATE];
}

/// Connection request (REQ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Req {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Service ID: the service the active side wants to reach.
    pub service_id: u64,
    /// Local CA GUID: GUID of the sender's channel adapter.
    pub local_ca_guid: u64,
    /// Local Q_Key: the sender's Q_Key.
    pub local_qkey: u32,
    /// Local QPN: the sender's QP number, 24 bits.
    pub local_qpn: u32,
    /// Responder Resources: how many RDMA Read/atomic requests the sender
    /// will accept outstanding at once.
    pub responder_resources: u8,
    /// Local EECN: the sender's EE context number (RD only), 24 bits.
    pub local_eecn: u32,
    /// Initiator Depth: how many RDMA Read/atomic requests the sender may
    /// have outstanding at once.
    pub initiator_depth: u8,
    /// Remote EECN: the receiver's EE context number (RD only), 24 bits.
    pub remote_eecn: u32,
    /// Remote CM Response Timeout: how long the receiver's CM may take to
    /// answer this REQ; 5 bits, CM timeout encoding.
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type of the connection.
    pub transport_service_type: TransportType,
    /// End-to-End Flow Control: whether the sender's receive queue
    /// generates end-to-end credits.
    pub end_to_end_flow_control: bool,
    /// Starting PSN: the first PSN the sender will transmit (the receiver's
    /// expected receive PSN), 24 bits.
    pub starting_psn: u32,
    /// Local CM Response Timeout: how long the sender's CM may take to
    /// answer; 5 bits, CM timeout encoding.
    pub local_cm_response_timeout: u8,
    /// Retry Count: how often the transport retries after a local ACK
    /// timeout, 3 bits.
    pub retry_count: u8,
    /// P_Key: partition key of the connection.
    pub pkey: u16,
    /// Path Packet Payload MTU, 4 bits, IBTA MTU encoding (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC Exists: set when a reliable datagram channel already exists (RD only).
    pub rdc_exists: bool,
    /// RNR Retry Count: how often the receiver retries after an RNR NAK from
    /// the sender (7 = without limit), 3 bits.
    pub rnr_retry_count: u8,
    /// Max CM Retries: how many times the sender resends a CM message that
    /// gets no answer, 4 bits.
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP takes receives from a shared receive queue.
    pub srq: bool,
    /// Extended Transport Type, 3 bits; meaningful when
    /// `transport_service_type` is `Extended` (1 = XRC).
    pub extended_transport_type: u8,
    /// Primary path of the connection.
    pub primary_path: PathInfo,
    /// Alternate path for automatic path migration; all zero when there is
    /// none.
    pub alternate_path: PathInfo,
    /// SAPSupported flag, kept as sent (this stack does not act on it).
    pub sap_supported: bool,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<92>,
}

impl Req {
    /// `ExtendedTransportType` value for XRC.
    pub const EXTENDED_TRANSPORT_XRC: u8 = 1;

    /// Whether the REQ asks for an XRC connection (`Extended` transport,
    /// extended type [`Req::EXTENDED_TRANSPORT_XRC`]).
    pub fn is_xrc(&self) -> bool {
        self.transport_service_type == TransportType::Extended
            && self.extended_transport_type == Self::EXTENDED_TRANSPORT_XRC
    }
}

impl Body for Req {
    const ATTR: u16 = attr::REQ;
    const FIELDS: &'static [Field] = req_layout::FIELDS;
    const BLOBS: &'static [Blob] = req_layout::BLOBS;
    const PATHS: &'static [PathLayout] = req_layout::PATHS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use req_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            service_id: r.u64(l::SERVICE_ID),
            local_ca_guid: r.u64(l::LOCAL_CA_GUID),
            local_qkey: r.u32(l::LOCAL_QKEY),
            local_qpn: r.u32(l::LOCAL_QPN),
            responder_resources: r.u8(l::RESPONDER_RESOURCES),
            local_eecn: r.u32(l::LOCAL_EECN),
            initiator_depth: r.u8(l::INITIATOR_DEPTH),
            remote_eecn: r.u32(l::REMOTE_EECN),
            remote_cm_response_timeout: r.u8(l::REMOTE_CM_RESPONSE_TIMEOUT),
            transport_service_type: closed(
                r.u8(l::TRANSPORT_SERVICE_TYPE),
                l::TRANSPORT_SERVICE_TYPE,
                TransportType::from_code,
            )?,
            end_to_end_flow_control: r.flag(l::END_TO_END_FLOW_CONTROL),
            starting_psn: r.u32(l::STARTING_PSN),
            local_cm_response_timeout: r.u8(l::LOCAL_CM_RESPONSE_TIMEOUT),
            retry_count: r.u8(l::RETRY_COUNT),
            pkey: r.u16(l::PKEY),
            path_mtu: r.u8(l::PATH_MTU),
            rdc_exists: r.flag(l::RDC_EXISTS),
            rnr_retry_count: r.u8(l::RNR_RETRY_COUNT),
            max_cm_retries: r.u8(l::MAX_CM_RETRIES),
            srq: r.flag(l::SRQ),
            extended_transport_type: r.u8(l::EXTENDED_TRANSPORT_TYPE),
            primary_path: l::PRIMARY.read(r),
            alternate_path: l::ALTERNATE.read(r),
            sap_supported: r.flag(l::SAP_SUPPORTED),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use req_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::SERVICE_ID, self.service_id)?;
        w.uint(l::LOCAL_CA_GUID, self.local_ca_guid)?;
        w.uint(l::LOCAL_QKEY, self.local_qkey.into())?;
        w.uint(l::LOCAL_QPN, self.local_qpn.into())?;
        w.uint(l::RESPONDER_RESOURCES, self.responder_resources.into())?;
        w.uint(l::LOCAL_EECN, self.local_eecn.into())?;
        w.uint(l::INITIATOR_DEPTH, self.initiator_depth.into())?;
        w.uint(l::REMOTE_EECN, self.remote_eecn.into())?;
        w.uint(
            l::REMOTE_CM_RESPONSE_TIMEOUT,
            self.remote_cm_response_timeout.into(),
        )?;
        w.uint(
            l::TRANSPORT_SERVICE_TYPE,
            self.transport_service_type.code().into(),
        )?;
        w.flag(l::END_TO_END_FLOW_CONTROL, self.end_to_end_flow_control);
        w.uint(l::STARTING_PSN, self.starting_psn.into())?;
        w.uint(
            l::LOCAL_CM_RESPONSE_TIMEOUT,
            self.local_cm_response_timeout.into(),
        )?;
        w.uint(l::RETRY_COUNT, self.retry_count.into())?;
        w.uint(l::PKEY, self.pkey.into())?;
        w.uint(l::PATH_MTU, self.path_mtu.into())?;
        w.flag(l::RDC_EXISTS, self.rdc_exists);
        w.uint(l::RNR_RETRY_COUNT, self.rnr_retry_count.into())?;
        w.uint(l::MAX_CM_RETRIES, self.max_cm_retries.into())?;
        w.flag(l::SRQ, self.srq);
        w.uint(
            l::EXTENDED_TRANSPORT_TYPE,
            self.extended_transport_type.into(),
        )?;
        l::PRIMARY.write(&self.primary_path, w)?;
        l::ALTERNATE.write(&self.alternate_path, w)?;
        w.flag(l::SAP_SUPPORTED, self.sap_supported);
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// MRA (Table 107)
// ---------------------------------------------------------------------------

pub(crate) mod mra_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "MRA LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "MRA RemoteCommID");
    pub const MESSAGE_MRAED: Field = Field::data(8, 0, 2, "MRA MessageMRAed");
    pub const SERVICE_TIMEOUT: Field = Field::data(9, 0, 5, "MRA ServiceTimeout");
    pub const PRIVATE_DATA: Blob = Blob::data(10, 222);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        REMOTE_COMM_ID,
        MESSAGE_MRAED,
        SERVICE_TIMEOUT,
    ];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Message receipt acknowledgement (MRA): "I got it, the answer will take a
/// while".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mra {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Message MRAed: which message this MRA acknowledges.
    pub message_mraed: MessageMraed,
    /// Service Timeout: how much longer the sender needs before it answers;
    /// 5 bits, CM timeout encoding.
    pub service_timeout: u8,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<222>,
}

impl Body for Mra {
    const ATTR: u16 = attr::MRA;
    const FIELDS: &'static [Field] = mra_layout::FIELDS;
    const BLOBS: &'static [Blob] = mra_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use mra_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            message_mraed: closed(
                r.u8(l::MESSAGE_MRAED),
                l::MESSAGE_MRAED,
                MessageMraed::from_code,
            )?,
            service_timeout: r.u8(l::SERVICE_TIMEOUT),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use mra_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(l::MESSAGE_MRAED, self.message_mraed.code().into())?;
        w.uint(l::SERVICE_TIMEOUT, self.service_timeout.into())?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// REJ (Table 108)
// ---------------------------------------------------------------------------

pub(crate) mod rej_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "REJ LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "REJ RemoteCommID");
    pub const MESSAGE_REJECTED: Field = Field::data(8, 0, 2, "REJ MessageRejected");
    pub const REJECTED_INFO_LENGTH: Field = Field::data(9, 0, 7, "REJ RejectedInfoLength");
    pub const REASON: Field = Field::data(10, 0, 16, "REJ Reason");
    pub const ARI: Blob = Blob::data(12, 72);
    pub const PRIVATE_DATA: Blob = Blob::data(84, 148);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        REMOTE_COMM_ID,
        MESSAGE_REJECTED,
        REJECTED_INFO_LENGTH,
        REASON,
    ];
    pub const BLOBS: &[Blob] = &[ARI, PRIVATE_DATA];
}

/// Reject (REJ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rej {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection (zero
    /// if the sender never learned it).
    pub remote_comm_id: u32,
    /// Message Rejected: which message this REJ answers.
    pub message_rejected: MessageRejected,
    /// 7 bits: how many bytes of `ari` are meaningful. Not checked against
    /// the 72-byte area on decode; see [`Rej::ari_bytes`].
    pub rejected_info_length: u8,
    /// Reason: why the message was rejected.
    pub reason: RejectReason,
    /// Additional rejection information, whole area.
    pub ari: [u8; INFO_LEN],
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<148>,
}

impl Rej {
    /// The meaningful part of the ARI (clamped to the area).
    pub fn ari_bytes(&self) -> &[u8] {
        info_prefix(&self.ari, self.rejected_info_length)
    }
}

impl Default for Rej {
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: MessageRejected::default(),
            rejected_info_length: 0,
            reason: RejectReason::default(),
            ari: [0; INFO_LEN],
            private_data: PrivateData::default(),
        }
    }
}

impl Body for Rej {
    const ATTR: u16 = attr::REJ;
    const FIELDS: &'static [Field] = rej_layout::FIELDS;
    const BLOBS: &'static [Blob] = rej_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use rej_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            message_rejected: closed(
                r.u8(l::MESSAGE_REJECTED),
                l::MESSAGE_REJECTED,
                MessageRejected::from_code,
            )?,
            rejected_info_length: r.u8(l::REJECTED_INFO_LENGTH),
            reason: RejectReason::from_code(r.u16(l::REASON)),
            ari: r.bytes(l::ARI),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use rej_layout as l;
        if !self.reason.is_canonical() {
            return Err(non_canonical(l::REASON, self.reason.code().into()));
        }
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(l::MESSAGE_REJECTED, self.message_rejected.code().into())?;
        w.uint(l::REJECTED_INFO_LENGTH, self.rejected_info_length.into())?;
        w.uint(l::REASON, self.reason.code().into())?;
        w.bytes(l::ARI, &self.ari);
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// REP (Table 110)
// ---------------------------------------------------------------------------

pub(crate) mod rep_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "REP LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "REP RemoteCommID");
    pub const LOCAL_QKEY: Field = Field::data(8, 0, 32, "REP LocalQKey");
    pub const LOCAL_QPN: Field = Field::data(12, 0, 24, "REP LocalQPN");
    pub const LOCAL_EECN: Field = Field::data(16, 0, 24, "REP LocalEECN");
    pub const STARTING_PSN: Field = Field::data(20, 0, 24, "REP StartingPSN");
    pub const RESPONDER_RESOURCES: Field = Field::data(24, 0, 8, "REP ResponderResources");
    pub const INITIATOR_DEPTH: Field = Field::data(25, 0, 8, "REP InitiatorDepth");
    pub const TARGET_ACK_DELAY: Field = Field::data(26, 0, 5, "REP TargetACKDelay");
    pub const FAILOVER_ACCEPTED: Field = Field::data(26, 5, 2, "REP FailoverAccepted");
    pub const END_TO_END_FLOW_CONTROL: Field = Field::data(26, 7, 1, "REP EndToEndFlowControl");
    pub const RNR_RETRY_COUNT: Field = Field::data(27, 0, 3, "REP RNRRetryCount");
    pub const SRQ: Field = Field::data(27, 3, 1, "REP SRQ");
    pub const LOCAL_CA_GUID: Field = Field::data(28, 0, 64, "REP LocalCAGUID");
    pub const PRIVATE_DATA: Blob = Blob::data(36, 196);

    pub const FIELDS: &[Field] = &[
        LOCAL_COMM_ID,
        REMOTE_COMM_ID,
        LOCAL_QKEY,
        LOCAL_QPN,
        LOCAL_EECN,
        STARTING_PSN,
        RESPONDER_RESOURCES,
        INITIATOR_DEPTH,
        TARGET_ACK_DELAY,
        FAILOVER_ACCEPTED,
        END_TO_END_FLOW_CONTROL,
        RNR_RETRY_COUNT,
        SRQ,
        LOCAL_CA_GUID,
    ];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Connection reply (REP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rep {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Local Q_Key: the sender's Q_Key.
    pub local_qkey: u32,
    /// Local QPN: the sender's QP number, 24 bits.
    pub local_qpn: u32,
    /// Local EECN: the sender's EE context number (RD only), 24 bits.
    pub local_eecn: u32,
    /// Starting PSN: the first PSN the sender will transmit (the receiver's
    /// expected receive PSN), 24 bits.
    pub starting_psn: u32,
    /// Responder Resources: how many RDMA Read/atomic requests the sender
    /// will accept outstanding at once.
    pub responder_resources: u8,
    /// Initiator Depth: how many RDMA Read/atomic requests the sender may
    /// have outstanding at once.
    pub initiator_depth: u8,
    /// Target ACK Delay: the longest the sender's CA takes to acknowledge a
    /// request packet; 5 bits, CM timeout encoding.
    pub target_ack_delay: u8,
    /// Failover Accepted: the answer to the alternate path in the REQ.
    pub failover_accepted: FailoverAccepted,
    /// End-to-End Flow Control: whether the sender's receive queue
    /// generates end-to-end credits.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count: how often the receiver retries after an RNR NAK from
    /// the sender (7 = without limit), 3 bits.
    pub rnr_retry_count: u8,
    /// SRQ: the sender's QP takes receives from a shared receive queue.
    pub srq: bool,
    /// Local CA GUID: GUID of the sender's channel adapter.
    pub local_ca_guid: u64,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<196>,
}

impl Body for Rep {
    const ATTR: u16 = attr::REP;
    const FIELDS: &'static [Field] = rep_layout::FIELDS;
    const BLOBS: &'static [Blob] = rep_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use rep_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            local_qkey: r.u32(l::LOCAL_QKEY),
            local_qpn: r.u32(l::LOCAL_QPN),
            local_eecn: r.u32(l::LOCAL_EECN),
            starting_psn: r.u32(l::STARTING_PSN),
            responder_resources: r.u8(l::RESPONDER_RESOURCES),
            initiator_depth: r.u8(l::INITIATOR_DEPTH),
            target_ack_delay: r.u8(l::TARGET_ACK_DELAY),
            failover_accepted: closed(
                r.u8(l::FAILOVER_ACCEPTED),
                l::FAILOVER_ACCEPTED,
                FailoverAccepted::from_code,
            )?,
            end_to_end_flow_control: r.flag(l::END_TO_END_FLOW_CONTROL),
            rnr_retry_count: r.u8(l::RNR_RETRY_COUNT),
            srq: r.flag(l::SRQ),
            local_ca_guid: r.u64(l::LOCAL_CA_GUID),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use rep_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.uint(l::LOCAL_QKEY, self.local_qkey.into())?;
        w.uint(l::LOCAL_QPN, self.local_qpn.into())?;
        w.uint(l::LOCAL_EECN, self.local_eecn.into())?;
        w.uint(l::STARTING_PSN, self.starting_psn.into())?;
        w.uint(l::RESPONDER_RESOURCES, self.responder_resources.into())?;
        w.uint(l::INITIATOR_DEPTH, self.initiator_depth.into())?;
        w.uint(l::TARGET_ACK_DELAY, self.target_ack_delay.into())?;
        w.uint(l::FAILOVER_ACCEPTED, self.failover_accepted.code().into())?;
        w.flag(l::END_TO_END_FLOW_CONTROL, self.end_to_end_flow_control);
        w.uint(l::RNR_RETRY_COUNT, self.rnr_retry_count.into())?;
        w.flag(l::SRQ, self.srq);
        w.uint(l::LOCAL_CA_GUID, self.local_ca_guid)?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// RTU (Table 111)
// ---------------------------------------------------------------------------

pub(crate) mod rtu_layout {
    use super::{Blob, Field};

    pub const LOCAL_COMM_ID: Field = Field::data(0, 0, 32, "RTU LocalCommID");
    pub const REMOTE_COMM_ID: Field = Field::data(4, 0, 32, "RTU RemoteCommID");
    pub const PRIVATE_DATA: Blob = Blob::data(8, 224);

    pub const FIELDS: &[Field] = &[LOCAL_COMM_ID, REMOTE_COMM_ID];
    pub const BLOBS: &[Blob] = &[PRIVATE_DATA];
}

/// Ready to use (RTU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rtu {
    /// Local Communication ID: the sender's id for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's id for this connection.
    pub remote_comm_id: u32,
    /// Private Data: consumer-defined bytes the CM carries without interpreting.
    pub private_data: PrivateData<224>,
}

impl Body for Rtu {
    const ATTR: u16 = attr::RTU;
    const FIELDS: &'static [Field] = rtu_layout::FIELDS;
    const BLOBS: &'static [Blob] = rtu_layout::BLOBS;

    fn read(r: &Reader<'_>) -> Result<Self, WireError> {
        use rtu_layout as l;
        Ok(Self {
            local_comm_id: r.u32(l::LOCAL_COMM_ID),
            remote_comm_id: r.u32(l::REMOTE_COMM_ID),
            private_data: PrivateData(r.bytes(l::PRIVATE_DATA)),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        use rtu_layout as l;
        w.uint(l::LOCAL_COMM_ID, self.local_comm_id.into())?;
        w.uint(l::REMOTE_COMM_ID, self.remote_comm_id.into())?;
        w.bytes(l::PRIVATE_DATA, self.private_data.as_bytes());
        Ok(())
    }
}
