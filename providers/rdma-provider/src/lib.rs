//! A verbs provider over rdma-core's libibverbs (through the `rdma-sys`
//! bindings): real InfiniBand HCAs and RoCE NICs, and Linux's software
//! devices (rxe, siw), behind the provider interface the object layer
//! drives.
//!
//! # Features
//!
//! * Without the `rdma` feature (the default) the crate is only
//!   [`convert`]: how libibverbs' codes and errnos become the provider
//!   interface's types and [`al::Error`]s. It needs no system library, so
//!   the workspace builds and tests everywhere.
//! * With `rdma` (the facade's and `ibal-cli`'s feature of the same name
//!   turn it on) it links libibverbs and offers `RdmaProvider` and
//!   `RdmaDevice`. Building needs rdma-core's development headers,
//!   pkg-config and libclang (rdma-sys runs bindgen); see
//!   `docs/rdma-provider.md` for what was pinned and why.
//!
//! # What works (issue 16, in progress)
//!
//! * Listing devices ([`provider::Provider::devices`],
//!   `RdmaProvider::list`, which also says why there are none), opening
//!   one by node GUID or name, device attributes (read at open) and port
//!   attributes (state, LID, SM LID, LMC, active and max MTU, link layer,
//!   the whole GID and P_Key tables). With no device, or no RDMA support
//!   in the kernel, each says "no RDMA devices found" with the errno, and
//!   never panics.
//! * The verbs objects: PD, CQ on a completion channel (one event thread
//!   per device calls the completion hooks and routes the asynchronous
//!   events: CQ errors to the CQ, a QP's events to its hook, port and
//!   device events to the device's hook; [`events`]), MR over a
//!   `RegisteredBuffer` or a `RawRegion`, SRQ, AH, RC/UC/UD QPs with the
//!   IBTA transition and value checks every provider makes, post
//!   send/recv/SRQ recv, poll. QP1 is the kernel's (`create_gsi_qp` is
//!   `Unsupported`). Posted requests lease their bytes until their
//!   completion is polled (`leases`).
//! * Every rdma-core failure is an [`al::Error`] naming the call and its
//!   errno ([`convert::errno_error`]).
//!
//! * rdma_cm ids without a QP on one event channel per process
//!   (`CmId`, `CmEvent`; librdmacm): an event thread copies each event
//!   out ([`cm::CmEventKind`]) and acknowledges it before the id's hook
//!   runs. The CEP objects over them are `cep_rdmacm` (crate `cep-rdmacm`); [`cm`] (event
//!   codes and translation, `rdma_init_qp_attr` as a modify) is
//!   device-free and built without the feature too.
//!
//! * Teardown that waits for another thread (joining the event thread,
//!   `rdma_destroy_id`) never runs on a provider thread or inside an AL
//!   callback: it goes to one reaper thread (`waits_on_this_thread`).
//!
//! `docs/rdma-provider.md` says what a librdmacm-backed CEP cannot do
//! that the project's own CM does, and what only a NIC can show.
#![deny(missing_docs)]
// `deny`, not `forbid`: `sys` is the one module allowed `unsafe`.
#![deny(unsafe_code)]

pub mod cm;
#[cfg(feature = "rdma")]
mod cm_channel;
pub mod convert;
pub mod events;

#[cfg(feature = "rdma")]
mod device;
#[cfg(feature = "rdma")]
mod event_thread;
#[cfg(feature = "rdma")]
mod objects;
#[cfg(feature = "rdma")]
mod verbs;
// Device-free (tested everywhere); used by the provider.
#[cfg(any(feature = "rdma", test))]
mod leases;
// Device-free (tested everywhere); used by the provider.
#[cfg(any(feature = "rdma", test))]
mod reaper;
#[cfg(feature = "rdma")]
mod sys;
#[cfg(feature = "rdma")]
mod sys_cm;

#[cfg(feature = "rdma")]
pub use cm_channel::{available as rdma_cm_available, CmEvent, CmHook, CmId};
pub use events::{DeviceEvent, DeviceEventHook, QpEvent, QpEventHook};
#[cfg(feature = "rdma")]
pub use reaper::{must_not_wait, waits_on_this_thread};

#[cfg(feature = "rdma")]
pub use device::{RdmaDevice, RdmaProvider, NO_DEVICES};
#[cfg(feature = "rdma")]
pub use objects::{RdmaAv, RdmaCq, RdmaMr, RdmaPd, RdmaQp, RdmaSrq};
