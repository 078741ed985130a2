//! The device's asynchronous events (`ibv_get_async_event`) as the
//! provider hands them on: what each `IBV_EVENT_*` code is about (a CQ, a
//! QP, an SRQ, a port, the device) and, for the QP and the device/port
//! ones, their meaning as [`QpEvent`] and [`DeviceEvent`]. Device-free
//! (built without the `rdma` feature too); the device's event thread
//! routes them (`docs/rdma-provider.md`, "Asynchronous events").

use al::sync::Arc;

/// The `enum ibv_event_type` codes of `verbs.h` (checked against the
/// installed headers by `sys::tests`).
#[allow(missing_docs)]
pub mod event_code {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const PATH_MIG: u32 = 6;
    pub const PATH_MIG_ERR: u32 = 7;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const LID_CHANGE: u32 = 11;
    pub const PKEY_CHANGE: u32 = 12;
    pub const SM_CHANGE: u32 = 13;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
    pub const CLIENT_REREGISTER: u32 = 17;
    pub const GID_CHANGE: u32 = 18;
    pub const WQ_FATAL: u32 = 19;
}

/// Which member of `ibv_async_event::element` an event code fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// `element.cq`.
    Cq,
    /// `element.qp`.
    Qp,
    /// `element.srq`.
    Srq,
    /// `element.wq`.
    Wq,
    /// `element.port_num`.
    Port,
    /// None: the whole device.
    Device,
}

/// The element an event code names; `None` for a code this provider does
/// not know (newer than `verbs.h` as written here): such an event is only
/// counted.
pub fn element_of(code: u32) -> Option<Element> {
    use event_code::*;
    Some(match code {
        CQ_ERR => Element::Cq,
        QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR | COMM_EST | SQ_DRAINED | PATH_MIG | PATH_MIG_ERR
        | QP_LAST_WQE_REACHED => Element::Qp,
        SRQ_ERR | SRQ_LIMIT_REACHED => Element::Srq,
        WQ_FATAL => Element::Wq,
        PORT_ACTIVE | PORT_ERR | LID_CHANGE | PKEY_CHANGE | SM_CHANGE | CLIENT_REREGISTER
        | GID_CHANGE => Element::Port,
        DEVICE_FATAL => Element::Device,
        _ => return None,
    })
}

/// An asynchronous event of one QP, as its hook hears it
/// (`RdmaDevice::set_qp_event_hook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpEvent {
    /// `IBV_EVENT_QP_FATAL`: an error the device could not report in a
    /// completion; the QP is in ERR.
    Fatal,
    /// `IBV_EVENT_QP_REQ_ERR`: the responder saw an invalid request
    /// (transport error); the QP is in ERR.
    RequestError,
    /// `IBV_EVENT_QP_ACCESS_ERR`: the responder saw a request it may not
    /// serve (protection, rights); the QP is in ERR.
    AccessError,
    /// `IBV_EVENT_COMM_EST`: the first packet arrived in RTR, before the
    /// CM's RTU (an rdma_cm connection then wants `rdma_notify`).
    CommEstablished,
    /// `IBV_EVENT_SQ_DRAINED`: a QP moved to SQD has no send in progress.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`: the QP migrated to its alternate path.
    PathMigrated,
    /// `IBV_EVENT_PATH_MIG_ERR`: the path migration failed.
    PathMigrationError,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ in ERR has taken
    /// its last receive.
    LastWqeReached,
}

/// The QP event of a code, if it is one.
pub fn qp_event(code: u32) -> Option<QpEvent> {
    use event_code::*;
    Some(match code {
        QP_FATAL => QpEvent::Fatal,
        QP_REQ_ERR => QpEvent::RequestError,
        QP_ACCESS_ERR => QpEvent::AccessError,
        COMM_EST => QpEvent::CommEstablished,
        SQ_DRAINED => QpEvent::SqDrained,
        PATH_MIG => QpEvent::PathMigrated,
        PATH_MIG_ERR => QpEvent::PathMigrationError,
        QP_LAST_WQE_REACHED => QpEvent::LastWqeReached,
        _ => return None,
    })
}

/// An asynchronous event of a port or of the whole device, as the
/// device's hook hears it (`RdmaDevice::set_device_event_hook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceEvent {
    /// `IBV_EVENT_PORT_ACTIVE`: the port came up.
    PortActive(u8),
    /// `IBV_EVENT_PORT_ERR`: the port went down (link lost).
    PortDown(u8),
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange(u8),
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange(u8),
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange(u8),
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister(u8),
    /// `IBV_EVENT_GID_CHANGE`: the port's GID table changed (on RoCE: an
    /// IP address came or went).
    GidChange(u8),
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable; every object
    /// of it must be destroyed.
    Fatal,
}

/// The device or port event of a code (with the event's port number),
/// if it is one.
pub fn device_event(code: u32, port: u8) -> Option<DeviceEvent> {
    use event_code::*;
    Some(match code {
        PORT_ACTIVE => DeviceEvent::PortActive(port),
        PORT_ERR => DeviceEvent::PortDown(port),
        LID_CHANGE => DeviceEvent::LidChange(port),
        PKEY_CHANGE => DeviceEvent::PkeyChange(port),
        SM_CHANGE => DeviceEvent::SmChange(port),
        CLIENT_REREGISTER => DeviceEvent::ClientReregister(port),
        GID_CHANGE => DeviceEvent::GidChange(port),
        DEVICE_FATAL => DeviceEvent::Fatal,
        _ => return None,
    })
}

/// `ibv_event_type_str`'s text for a code (checked against it by
/// `sys::tests`).
pub fn event_name(code: u32) -> &'static str {
    use event_code::*;
    match code {
        CQ_ERR => "CQ error",
        QP_FATAL => "local work queue catastrophic error",
        QP_REQ_ERR => "invalid request local work queue error",
        QP_ACCESS_ERR => "local access violation work queue error",
        COMM_EST => "communication established",
        SQ_DRAINED => "send queue drained",
        PATH_MIG => "path migrated",
        PATH_MIG_ERR => "path migration request error",
        DEVICE_FATAL => "local catastrophic error",
        PORT_ACTIVE => "port active",
        PORT_ERR => "port error",
        LID_CHANGE => "LID change",
        PKEY_CHANGE => "P_Key change",
        SM_CHANGE => "SM change",
        SRQ_ERR => "SRQ catastrophic error",
        SRQ_LIMIT_REACHED => "SRQ limit reached",
        QP_LAST_WQE_REACHED => "last WQE reached",
        CLIENT_REREGISTER => "client reregistration",
        GID_CHANGE => "GID table change",
        WQ_FATAL => "WQ fatal",
        _ => "unknown",
    }
}

/// Called on the device's event thread for each event of a QP, with no
/// lock of the provider held; it may call any verb (destroy the QP too).
pub type QpEventHook = Arc<dyn Fn(QpEvent) + Send + Sync>;

/// Called on the device's event thread for each port or device event,
/// with no lock of the provider held.
pub type DeviceEventHook = Arc<dyn Fn(DeviceEvent) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every known code names one element, and exactly the QP codes have a
    /// QP meaning and the port/device codes a device meaning.
    #[test]
    fn each_code_is_routed_to_one_kind_of_hook() {
        for code in 0..=19 {
            let element = element_of(code).expect("a known code");
            assert_eq!(qp_event(code).is_some(), element == Element::Qp, "{code}");
            assert_eq!(
                device_event(code, 1).is_some(),
                matches!(element, Element::Port | Element::Device),
                "{code}"
            );
            assert_ne!(event_name(code), "unknown");
        }
        assert_eq!(element_of(20), None);
        assert_eq!(event_name(99), "unknown");
        assert_eq!(
            device_event(event_code::PORT_ERR, 2),
            Some(DeviceEvent::PortDown(2))
        );
        assert_eq!(
            qp_event(event_code::COMM_EST),
            Some(QpEvent::CommEstablished)
        );
    }
}
