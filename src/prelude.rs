//! `use ibal::prelude::*;` brings what a verbs program needs: the AL, the
//! handle types, every verb as a method ([`crate::methods`]), the work
//! request and completion types, the CM's request and reply builders and
//! events, the embedded soft provider and the RoCEv2 provider.

#[cfg(feature = "async")]
pub use crate::asynch::{
    Accept, AsyncCaMethods, AsyncCq, AsyncQpMethods, Connect, Connection, ConnectionRequest,
    CqStream, Disconnect, Listener,
};
pub use crate::methods::{
    AlMethods, CaMethods, CepMethods, CqMethods, Destroy, MrMethods, PdMethods, QpMethods,
    SrqMethods,
};
#[cfg(feature = "rdma")]
pub use crate::methods::{RdmaCepMethods, RdmaCmListenMethods, RdmaCmMethods};
pub use crate::owned::{Own, Owned};
pub use crate::roce::RoceProvider;
pub use crate::roce::{DeviceConfig, PortConfig};
pub use al::{Al, AlConfig, AlInstance, Error, ExecutorMode, Handle, Kind, Result};
pub use cep::cm::{
    AcceptReply, Cep, CmHandler, CmPort, ConnectRequest, ConnectionAttrs, Listen, ListenHandler,
    LocalQpAttrs,
};
pub use cep::ip::{IpConnect, IpRequestInfo};
pub use cep::proto::LapParams;
pub use cep::proto::{Event, PeerAddr, SidrParams, SidrReplyParams, TimedOut};
pub use cep::wire::{ApStatus, RejectReason};
pub use cep::wire::{PathInfo, PrivateData};
pub use hca::verbs::{Av, Ca, Cq, Mr, Pd, Srq};
pub use provider::GrhAttr;
pub use provider::MigState;
pub use provider::QpCaps;
pub use provider::GRH_SIZE;
pub use provider::{
    Access, AvAttr, CqArm, Mtu, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, SrqInit,
    UdDest, Wc, WcOpcode, WcStatus,
};
pub use provider::{RawRegion, RegisteredBuffer};
pub use qp::{Qp, QpCreate};
pub use soft_provider::{Fabric, HcaConfig, SoftProvider};
pub use std::sync::Arc;
