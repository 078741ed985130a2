//! A RoCEv2-over-UDP verbs provider: devices whose ports are UDP sockets
//! bound to IP addresses, carrying RC, UC and UD traffic (and the GSI
//! QP1) in RoCEv2 packets, with the per-QP transport of `roce-transport`
//! and the wire codec of `roce`.
//!
//! * [`RoceProvider`] ([`provider::Provider`]): a configured list of
//!   devices ([`DeviceConfig`]), each with ports ([`PortConfig`]: a local
//!   IP address and UDP port, the UDP port peers listen on, the MTU).
//! * [`RoceDevice`] ([`provider::Device`]): the verbs. Opening one binds
//!   its sockets and starts one receive thread per port and a timer
//!   thread; dropping the last handle (it is `Clone`) stops them, and a
//!   reaper thread joins them ([`RoceDevice::close_watch`]): the drop
//!   never waits, wherever it happens.
//! * A port's GID (index 0, its only one) is its IP address as a RoCEv2
//!   GID: IPv4-mapped (`::ffff:a.b.c.d`) or the IPv6 address. Every
//!   address vector carries a GRH; there is no LID routing (LID 0).
//! * [`RoceDevice::port_counters`]: per-port counts of traffic and of
//!   dropped or NAKed packets by reason ([`PortCounters`]).
//!
//! See `docs/roce-provider.md` for addressing, threads, timers and what is
//! not done yet.
#![deny(missing_docs)]
// `deny`, not `forbid`: `mmsg` (recvmmsg, which no safe crate wraps),
// `gso` (sendmmsg with UDP_SEGMENT, likewise) and `clock` (clock_gettime
// through libc) are the modules allowed `unsafe`.
#![deny(unsafe_code)]

mod clock;
mod config;
mod counters;
mod cq;
#[cfg(feature = "delay-points")]
pub mod delay;
#[cfg(not(feature = "delay-points"))]
mod delay;
mod device;
mod driver;
#[cfg(ibal_loom)]
mod fake_net;
mod feed;
mod gso;
mod held_acks;
mod keys;
mod limits;
mod mmsg;
#[cfg(ibal_loom)]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod model;
mod mr;
mod objects;
mod poll_watch;
mod port;
mod provider_threads;
mod qp;
mod qp_map;
mod roce_provider;
mod shared;
mod shutdown;
mod timer_thread;
mod timers;
mod trace;
mod tx_batch;
mod verbs;

pub use config::{gid_of, ip_of, DeviceConfig, PortConfig, RoceLimits, UdpOffload, ROCE_PORT};
pub use counters::PortCounters;
pub use device::RoceDevice;
pub use objects::{RoceAv, RoceCq, RoceMr, RocePd, RoceQp, RoceSrq};
pub use roce_provider::RoceProvider;
pub use shutdown::CloseWatch;
pub use timers::TimerStats;
