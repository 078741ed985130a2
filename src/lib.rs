//! ibal: the InfiniBand Access Layer object model in Rust.
//!
//! This is the library a verbs consumer imports. It shows what a program
//! calls and nothing of the machinery behind it:
//! * the AL instance, handles and errors (at the crate root);
//! * [`verbs`]: CAs, PDs, CQs, MRs, SRQs, AVs and QPs, work requests and
//!   completions, and the embedded soft provider;
//! * [`cm`]: the IBTA connection manager (connect, listen, accept, SIDR,
//!   their events) and its MAD codec ([`cm::wire`]);
//! * [`prelude`]: all of it, with every verb as a method ([`methods`]);
//! * [`owned`]: optional guards that destroy their object when dropped, for
//!   programs that prefer RAII to IBAL's explicit destroy.
//!
//! The layer crates (`al`, `hca`, `qp`, `cep`) are not re-exported: their
//! internals (the handle table, raw destroy, the CID slot's mutators) are
//! for each other, not for applications. A program cannot reach them
//! through this crate:
//!
//! ```compile_fail
//! // No raw destroy that skips the instance check.
//! use ibal::al::destroy_raw;
//! ```
//!
//! ```compile_fail
//! // No handle table: `table()` belongs to a trait this crate does not
//! // export, so it cannot be called.
//! use ibal::prelude::*;
//! let _ = Cep::table();
//! ```
//!
//! ```compile_fail
//! // The CID slot can be read, never written: the protocol's mutators are
//! // crate-private.
//! use ibal::prelude::*;
//! fn unbind_behind_the_cms_back(al: &Al, qp: Handle<Qp>) {
//!     let qp = al.resolve(qp).unwrap();
//!     let _ = qp.cid().tombstone();
//! }
//! ```
//!
//! Reading it is fine:
//!
//! ```
//! use ibal::prelude::*;
//! use ibal::verbs::CidState;
//! fn is_free(al: &Al, qp: Handle<Qp>) -> bool {
//!     al.resolve(qp).is_ok_and(|qp| qp.cid().load() == CidState::Unbound)
//! }
//! ```
//!
//! Layering is one-way: `al` <- `hca` <- `qp` <- `cep` <- `ibal`.
//!
//! # A first program
//!
//! `use ibal::prelude::*;` brings the types and, as methods, every verb.
//! Every call takes the AL as `&Arc<AlInstance>` (`&al` for an [`Al`]):
//!
//! ```
//! use ibal::prelude::*;
//!
//! # fn main() -> ibal::Result<()> {
//! let fabric = Fabric::new();
//! fabric.add_hca(HcaConfig::new(0xa000, &[1]))?;
//! let provider = SoftProvider::new(fabric);
//! let al = Al::open()?;
//! let ca = al.open_ca(&provider, 0xa000)?;
//! let pd = ca.alloc_pd(&al)?;
//! let cq = ca.create_cq(&al, 64)?;
//! let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
//! assert_eq!(qp.query(&al)?.state, QpState::Reset);
//! let buf = RegisteredBuffer::new(4096);
//! let mr = pd.register(&al, &buf, Access::LOCAL_WRITE)?;
//! let (lkey, _rkey) = mr.keys(&al)?;
//! assert_ne!(lkey, 0);
//! qp.destroy(&al)?;
//! assert!(al.close()?.is_clean());
//! # Ok(())
//! # }
//! ```
//!
//! `examples/rc_pingpong.rs` connects two QPs through the CM with the same
//! calls.
//!
//! # Memory
//!
//! Registration comes in two forms (`docs/memory.md` has the whole design):
//!
//! * **Safe**: [`RegisteredBuffer`](verbs::RegisteredBuffer), memory the
//!   library owns. Every MR over it keeps it alive, and it never moves, so
//!   nothing the application drops can free bytes the HCA may touch. It
//!   is read and written through methods that take the lock the HCA takes
//!   too, so no access is ever a data race.
//! * **`unsafe`**: [`RawRegion`](verbs::RawRegion), memory the caller
//!   manages (zero copy), registered with `pd.register_region(..)`. Its
//!   constructor is the one `unsafe` call, and its contract says what the
//!   caller promises. It cannot be built without that promise:
//!
//! ```compile_fail,E0133
//! use ibal::prelude::*;
//! let mut bytes = vec![0u8; 64];
//! // error[E0133]: call to unsafe function requires an unsafe block
//! let region = RawRegion::new(bytes.as_mut_ptr(), bytes.len());
//! ```
//!
//! Application memory cannot be registered through the safe calls:
//!
//! ```compile_fail,E0308
//! use ibal::prelude::*;
//! fn register_my_vec(al: &Al, pd: Handle<Pd>, mine: &mut Vec<u8>) -> Result<Handle<Mr>> {
//!     pd.register(al, mine, Access::LOCAL_WRITE) // a Vec is not a RegisteredBuffer
//! }
//! ```
//!
//! and a view of registered memory cannot outlive the call that lends it,
//! so no slice survives into a time when the HCA writes the bytes:
//!
//! ```compile_fail
//! use ibal::prelude::*;
//! let buf = RegisteredBuffer::new(64);
//! let kept: &mut [u8] = buf.with_mut(|bytes| bytes).unwrap();
//! ```
//!
//! **Buffers in flight.** From the post of a work request until it
//! finishes (its completion or its flush), the bytes it names are in
//! flight: the buffer's mutating methods refuse them with
//! [`Error::ResourceBusy`] and change nothing, so safe code cannot reuse a
//! receive buffer the HCA is about to fill. Reading is always allowed.
//!
//! ```
//! use ibal::prelude::*;
//! # fn main() -> ibal::Result<()> {
//! # let fabric = Fabric::new();
//! # fabric.add_hca(HcaConfig::new(0xa000, &[1]))?;
//! # let provider = SoftProvider::new(fabric);
//! # let al = Al::open()?;
//! # let ca = al.open_ca(&provider, 0xa000)?;
//! # let pd = ca.alloc_pd(&al)?;
//! # let cq = ca.create_cq(&al, 64)?;
//! # let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
//! # let init = QpModify::to(QpState::Init).pkey_index(0).port(1);
//! # qp.modify(&al, &init.access(Access::LOCAL_WRITE))?;
//! let buf = RegisteredBuffer::new(128);
//! let mr = pd.register(&al, &buf, Access::LOCAL_WRITE)?;
//! let (lkey, _) = mr.keys(&al)?;
//! let sge = [Sge { addr: 0, length: 64, lkey }];
//! qp.post_recv(&al, &[RecvWr { wr_id: 1, sg_list: &sge }])?;
//! assert!(matches!(buf.write(0, b"too early"), Err(Error::ResourceBusy(_))));
//! buf.write(64, b"the other half is mine")?; // not named by the receive
//! qp.destroy(&al)?; // the receive is flushed: the bytes are free again
//! buf.write(0, b"now")?;
//! # assert!(al.close()?.is_clean());
//! # Ok(())
//! # }
//! ```
//!
//! # Async (feature `async`)
//!
//! With the `async` feature, `ibal::asynch` (re-exported by the prelude)
//! turns the callbacks into futures and streams, for any executor: a CQ
//! is a `Stream` of completions (`ca.create_cq_async(..)`, then
//! `cq.stream()`), a listen is a `Stream` of connection requests
//! (`ca.listen_async(..)`), and `qp.connect_async(..)`,
//! `request.accept(..)` and `connection.disconnect(..)` are futures that
//! resolve on ESTABLISHED and on the CEP's release. The library runs no
//! runtime: the AL's executor runs the callbacks, which only record what
//! happened and wake the waiting task. Dropping a future or stream cancels
//! it and leaves nothing behind (a pending connect's CEP is destroyed,
//! which sends the peer a REJ). `docs/async.md` has the waker and arming
//! rules; `examples/async_client_server.rs` a whole exchange.
//!
//! ```
//! # #[cfg(feature = "async")]
//! # fn main() -> ibal::Result<()> {
//! use futures::{executor::block_on, future::join, StreamExt};
//! use ibal::prelude::*;
//!
//! let fabric = Fabric::new();
//! fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
//! fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
//! let provider = SoftProvider::new(fabric);
//! let al = Al::open()?;
//! let qp_on = |guid| -> ibal::Result<(Handle<Ca>, Handle<Qp>)> {
//!     let ca = al.open_ca(&provider, guid)?;
//!     let cq = ca.create_cq_async(&al, 16)?;
//!     let qp = ca.alloc_pd(&al)?.create_qp(&al, QpCreate::new(QpType::Rc, cq.handle()))?;
//!     Ok((ca, qp))
//! };
//! let ((_, qp_a), (ca_b, qp_b)) = (qp_on(0xa)?, qp_on(0xb)?);
//!
//! let mut listener = ca_b.listen_async(&al, 1, 0x42)?;
//! let server = async {
//!     let request = listener.next().await.expect("a request");
//!     request.accept(qp_b, &AcceptReply::default()).await
//! };
//! let client = qp_a.connect_async(&al, &ConnectRequest::new(0x42, 2));
//! let (client, server) = block_on(join(client, server));
//! let (client, server) = (client?, server?);
//! assert_eq!(qp_a.query(&al)?.state, QpState::Rts);
//!
//! block_on(client.disconnect(b"bye"))?; // DREQ, DREP, timewait, released
//! block_on(server.disconnect(&[]))?; // the peer went first: only waits
//! drop(listener);
//! assert!(al.close()?.is_clean());
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "async"))]
//! # fn main() {}
//! ```

#![deny(missing_docs)]

pub use al::{
    Al, AlConfig, AlInstance, DestroyCallback, Error, ExecutorMode, Handle, HeldObject, Kind,
    LeakReport, RawHandle, Result, Stats, DEFAULT_CLOSE_TIMEOUT,
};

pub mod verbs {
    //! Verbs objects, their calls (each also a method: [`crate::methods`]),
    //! work requests, completions, and the embedded soft provider.
    pub use hca::verbs::{
        alloc_pd, arm_cq, create_av, create_av_from_wc, create_cq, create_srq, open_ca, poll_cq,
        post_srq_recv, register_mr, register_region, Av, Ca, CompletionCallback, Cq,
        CqEventCallback, Mr, Pd, Srq,
    };
    pub use provider::ReceivedHeader;
    pub use provider::{
        Access, AsyncEvent, AtomicCap, AvAttr, CqArm, DeviceAttr, DeviceInfo, Gid, GrhAttr,
        LinkLayer, MigState, Mtu, PortAttr, PortState, Provider, QpAttr, QpCaps, QpModify, QpState,
        QpType, RecvWr, SendOp, SendWr, Sge, SrqInit, UdDest, Wc, WcOpcode, WcStatus,
    };
    pub use provider::{RawRegion, RegisteredBuffer};
    pub use qp::{create_qp, modify_qp, post_recv, post_send, query_qp, CidState, Qp, QpCreate};
    /// ERF capture files of InfiniBand packets (what tshark reads), for
    /// `--capture` and the checks that read them.
    pub use soft_provider::erf;
    /// The soft fabric's datagrams as InfiniBand packets (LRH, GRH, BTH,
    /// DETH, both CRCs), for captures and the checks that read them.
    pub use soft_provider::packet;
    pub use soft_provider::{
        Fabric, FabricStats, FaultConfig, HcaConfig, HcaLimits, HcaUsage, PortConfig, SoftHca,
        SoftProvider,
    };
}

pub mod roce {
    //! The RoCEv2-over-UDP provider: devices whose ports are UDP sockets
    //! bound to IP addresses, reaching other processes and hosts (and
    //! Linux rxe or RoCE NICs) with RoCEv2 packets. A CA is opened from it
    //! as from the soft provider (`al.open_ca(&provider, guid)`); every
    //! verb, the CM and the object rules are the same. A port's GID is its
    //! IP address (IPv4-mapped or IPv6); address vectors carry a GRH, and
    //! there are no LIDs (connect with `ConnectRequest::new(service, 0)
    //! .remote_gid(gid)`). See `docs/roce-provider.md`.
    /// Scheduling delays at the provider's protocol points (feature
    /// `delay-points`, for stress tests only).
    #[cfg(feature = "delay-points")]
    pub use roce_provider::delay;
    pub use roce_provider::{
        gid_of, ip_of, DeviceConfig, PortConfig, PortCounters, RoceDevice, RoceLimits,
        RoceProvider, UdpOffload, ROCE_PORT,
    };

    pub mod wire {
        //! The RoCEv2 wire codec the provider speaks (crate `roce`; no
        //! I/O), for tools that build, read or re-sign packets themselves:
        //! a fault relay between two ports, a flood of forged datagrams, a
        //! raw UDP baseline that computes the same ICRC.
        pub use roce::{icrc, Bth, Deth, Endpoints, Headers, Opcode, Packet, ICRC_LEN};
    }
}

#[cfg(feature = "rdma")]
pub mod rdma {
    //! Real RDMA devices through rdma-core's libibverbs (feature `rdma`):
    //! InfiniBand HCAs, RoCE NICs, Linux rxe and siw. [`RdmaProvider`]
    //! lists and opens them (`al.open_ca(&RdmaProvider::new(), guid)`);
    //! their device and port attributes, PDs, CQs (woken by the device's
    //! completion channel), MRs, SRQs, AVs and RC/UC/UD QPs work as on
    //! the other providers. With no device it says "no RDMA devices found".
    //! See `docs/rdma-provider.md`.
    /// Whether librdmacm works here (the kernel has rdma_cm), checked
    /// before the connections of [`cm`] are tried.
    pub use rdma_provider::rdma_cm_available;
    pub use rdma_provider::{RdmaDevice, RdmaProvider, NO_DEVICES};

    /// Connections on an `rdma` CA: CEPs backed by librdmacm (QP1 belongs
    /// to the kernel on a real device), with the CM's events, the CID
    /// slot and the one-callback destroy (crate `cep-rdmacm`;
    /// `docs/rdma-provider.md`, "Connections").
    pub mod cm {
        pub use cep_rdmacm::*;
    }
}

pub mod cm {
    //! The IBTA connection manager: listen, connect, accept and the rest
    //! (each also a method: [`crate::methods`]), SIDR, the events a CEP's
    //! handler receives, and the MAD codec ([`wire`]).
    //!
    //! A connection: B listens and accepts each request on its QP; A
    //! connects, answers the reply with the RTU, and both sides see
    //! `Established` in their CEP's handler.
    //!
    //! ```
    //! use ibal::prelude::*;
    //! use std::{sync::mpsc, time::Duration};
    //! # fn main() -> ibal::Result<()> {
    //! let fabric = Fabric::new();
    //! fabric.add_hca(HcaConfig::new(0xa0, &[1]))?;
    //! fabric.add_hca(HcaConfig::new(0xb0, &[2]))?;
    //! let provider = SoftProvider::new(fabric);
    //! let al = Al::open()?;
    //! let rc_qp = |guid| -> Result<_> {
    //!     let ca = al.open_ca(&provider, guid)?;
    //!     let cq = ca.create_cq(&al, 16)?;
    //!     Ok((ca, ca.alloc_pd(&al)?.create_qp(&al, QpCreate::new(QpType::Rc, cq))?))
    //! };
    //! let ((_, qp_a), (ca_b, qp_b)) = (rc_qp(0xa0)?, rc_qp(0xb0)?);
    //! let (tx, established) = mpsc::channel();
    //!
    //! let (inst, tx_b) = (Arc::clone(&al), tx.clone());
    //! let on_request: ListenHandler = Arc::new(move |_listen, cep, _req| {
    //!     let _ = cep.accept(&inst, qp_b, &AcceptReply::default());
    //! });
    //! let passive: CmHandler = Arc::new(move |_cep, ev| {
    //!     if let Event::Established { .. } = ev {
    //!         let _ = tx_b.send("B");
    //!     }
    //! });
    //! ca_b.listen(&al, 1, 0x42, on_request, passive)?;
    //!
    //! let inst = Arc::clone(&al);
    //! let active: CmHandler = Arc::new(move |cep, ev| match ev {
    //!     Event::ReplyReceived { .. } => {
    //!         let _ = cep.rtu(&inst, &[]);
    //!     }
    //!     Event::Established { .. } => {
    //!         let _ = tx.send("A");
    //!     }
    //!     _ => {}
    //! });
    //! // Service 0x42 on the port with LID 2.
    //! let cep = qp_a.connect(&al, &ConnectRequest::new(0x42, 2), active)?;
    //! for _ in 0..2 {
    //!     established.recv_timeout(Duration::from_secs(5)).expect("established");
    //! }
    //! cep.disconnect(&al, &[])?;
    //! assert!(al.close()?.is_clean());
    //! # Ok(())
    //! # }
    //! ```
    //!
    //! **CM-only CEPs.** A consumer that owns its QP (a proxy, another
    //! verbs stack) can use the CM alone: [`connect_unbound`] (on the CA)
    //! and [`accept_unbound`] take the QP's number, starting PSN, type and
    //! flags as a [`LocalQpAttrs`] instead of a QP handle, and
    //! [`accept_attrs`] / [`connection_attrs`] give back what to move the
    //! QP with ([`ConnectionAttrs`]: peer QPN and PSN, RDMA depths, path,
    //! and the `init`, `rtr` and `rts` modifies). The CEP never touches
    //! that QP; everything else (RTU, reject, disconnect, events, destroy,
    //! AL close) is the same as for a bound CEP. `docs/cm.md`, "CM-only
    //! CEPs", says what the consumer does with its QP on each event.
    pub use cep::cm::{
        accept, accept_attrs, accept_unbound, active_ports, apr, attach_ca, attach_ca_with,
        connect, connect_unbound, connection_attrs, disconnect, disconnect_reply, lap, listen, mra,
        poll, reject, rtr_attrs, rts_attrs, rtu, set_backlog, sidr_reply, sidr_request,
        AcceptReply, Cep, CmDrive, CmHandler, CmPort, ConnectRequest, ConnectionAttrs, Listen,
        ListenHandler, LocalQpAttrs, PathEnd,
    };
    pub use cep::cm::{ready_for_connection, READY_ACCESS};
    pub use cep::proto::{
        ConnId, DisconnectCause, Event, LapParams, PeerAddr, RejectOrigin, Resends, SidrParams,
        SidrReplyParams, State, TimedOut, DEFAULT_BACKLOG,
    };
    pub use cep::wire;

    pub mod ip {
        //! Addressing by IP address and port, rdma_cm style, over the same
        //! CEPs: [`IpConnect`] (a REQ to `ip:port` with rdma_cm's header in
        //! its private data and timers for a LAN, [`LAN_TIMERS`]), listen
        //! on an address ([`listen`]), and [`request_info`] to read a
        //! received request's addresses. Also methods:
        //! `qp.connect_ip(..)`, `ca.listen_ip(..)`. `docs/cm.md`,
        //! "Addressing by IP".
        //!
        //! UD services by address, in rdma_cm's UDP port space
        //! (`docs/cm.md`, "UD services by IP"): [`resolve`]
        //! (`ca.resolve_ip(..)`) sends a SIDR_REQ with rdma_cm's header to
        //! `ip:port` and reports the service's QPN, Q_Key and an address
        //! vector to it ([`IpResolved`]); a listener in the UDP port space
        //! (`ca.listen_ip_ud(..)`) reads each request's addresses with
        //! [`sidr_request_info`] and answers with [`sidr_accept`]
        //! (`cep.sidr_accept(..)`). Both QPs use [`RDMA_UDP_QKEY`]
        //! ([`ready_ud`], `qp.ready_ud(..)`).
        //!
        //! ```
        //! use ibal::prelude::*;
        //! use std::{net::SocketAddr, sync::mpsc, time::Duration};
        //! # fn main() -> ibal::Result<()> {
        //! let port = |ip: &str| PortConfig::new(SocketAddr::new(ip.parse().unwrap(), 0));
        //! let provider = RoceProvider::new(vec![
        //!     DeviceConfig::new("a", 0xa1, vec![port("127.0.0.1")]),
        //!     DeviceConfig::new("b", 0xb1, vec![port("127.0.0.2")]),
        //! ]);
        //! let al = Al::open()?;
        //! let ud_qp = |guid| -> Result<_> {
        //!     let ca = al.open_ca(&provider, guid)?;
        //!     let pd = ca.alloc_pd(&al)?;
        //!     let qp = pd.create_qp(&al, QpCreate::new(QpType::Ud, ca.create_cq(&al, 8)?))?;
        //!     qp.ready_ud(&al, 1)?; // RTS, Q_Key RDMA_UDP_QKEY
        //!     Ok((ca, pd, qp))
        //! };
        //! let ((ca_a, pd_a, _qp_a), (ca_b, _, qp_b)) = (ud_qp(0xa1)?, ud_qp(0xb1)?);
        //!
        //! // B: the UD service at 127.0.0.2:4000 answers with its QP.
        //! let (inst, (seen_tx, seen)) = (Arc::clone(&al), mpsc::channel());
        //! let on_request: ListenHandler = Arc::new(move |_listen, cep, ev| {
        //!     if let Event::SidrRequest { req, .. } = ev {
        //!         let _ = seen_tx.send(ibal::cm::ip::sidr_request_info(req).map(|i| i.source));
        //!         cep.sidr_accept(&inst, qp_b, b"welcome").expect("SIDR_REP");
        //!     }
        //! });
        //! let service: SocketAddr = "127.0.0.2:4000".parse().unwrap();
        //! ca_b.listen_ip_ud(&al, service, on_request, Arc::new(|_, _| {}))?;
        //!
        //! // A: resolve it; the answer comes once, to the closure.
        //! let (tx, answer) = mpsc::channel();
        //! ca_a.resolve_ip(&al, 1, &IpResolve::new(service), Arc::new(move |r| {
        //!     let _ = tx.send(r);
        //! }))?;
        //! let found = answer.recv_timeout(Duration::from_secs(5)).expect("an answer")?;
        //! assert_eq!((found.qpn, found.qkey), (qp_b.query(&al)?.qpn, RDMA_UDP_QKEY));
        //! assert_eq!(&found.private_data[..7], b"welcome");
        //! let from = seen.recv_timeout(Duration::from_secs(5)).expect("a request")?;
        //! assert_eq!(from.ip().to_string(), "127.0.0.1"); // and an ephemeral port
        //! // Sends from A go to UdDest { av: &av, remote_qpn: found.qpn, remote_qkey: found.qkey, .. }.
        //! let _av = pd_a.create_av(&al, found.av)?;
        //! assert!(al.close()?.is_clean());
        //! # Ok(())
        //! # }
        //! ```
        pub use cep::ip::{
            address_of, connect, listen, port_of, request_info, IpConnect, IpRequestInfo, Timers,
            LAN_TIMERS,
        };
        pub use cep::ip::{
            ready_ud, resolve, sidr_accept, sidr_request_info, IpResolve, IpResolved,
            ResolveHandler, RDMA_UDP_QKEY,
        };
        pub use cep::wire::ip_cm::{gid_of, ip_of_gid, parse_service_id, service_id, PortSpace};
    }
}

pub mod snapshot {
    //! A live view of an AL instance's objects: `al.snapshot()`
    //! ([`AlInstance::snapshot`](crate::AlInstance::snapshot)) lists each
    //! with its kind, handle, parent, reference counts and details (a QP's
    //! state and numbers, a CEP's CM state, peer and comm ids), printed
    //! like `rdma res show` or as JSON. Not atomic across objects
    //! ([`al::snapshot`]); `docs/ownership.md`, "Snapshots".
    //!
    //! ```
    //! use ibal::prelude::*;
    //!
    //! let fabric = Fabric::new();
    //! fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
    //! let provider = SoftProvider::new(fabric);
    //! let al = Al::open()?;
    //! let ca = al.open_ca(&provider, 0xa)?;
    //! let pd = ca.alloc_pd(&al)?;
    //! let cq = ca.create_cq(&al, 16)?;
    //! let qp = pd.create_qp(&al, QpCreate::new(QpType::Rc, cq))?;
    //!
    //! let snapshot = al.snapshot();
    //! let line = snapshot.get(qp.raw()).expect("the QP is live");
    //! assert_eq!(line.parent, Some(pd.raw()));
    //! assert_eq!(line.attrs.get("type").and_then(|v| v.as_str()), Some("RC"));
    //! println!("{snapshot}"); // al AL#..., then `qp QP#0g0 parent PD#0g0 ...`
    //! assert!(snapshot.to_json().starts_with("{\"al\":"));
    //! assert!(al.close()?.is_clean());
    //! # Ok::<(), ibal::Error>(())
    //! ```
    pub use al::attrs::{Attrs, Value};
    pub use al::snapshot::{kind_slug, ObjectInfo, ObjectState, Snapshot};
}

#[cfg(feature = "async")]
pub mod asynch;
pub mod methods;
pub mod owned;
pub mod prelude;
