//! The only module that calls librdmacm (the sibling of `sys`, which calls
//! libibverbs): each `unsafe` call is wrapped in a small safe function or
//! type with a `// SAFETY:` argument, and every failure becomes an
//! [`al::Error`] naming the call and its errno.
//!
//! * [`EventChannel`]: `rdma_create_event_channel` /
//!   `rdma_destroy_event_channel`, and `rdma_get_cm_event`, whose event
//!   ([`RawEvent`]) is acknowledged (`rdma_ack_cm_event`) when dropped.
//! * [`Id`]: `rdma_create_id` / `rdma_destroy_id` and the calls on an id.
//!
//! librdmacm's calls return 0, or -1 with `errno` set.
//!
//! **The CM lock.** librdmacm writes the fields of an `rdma_cm_id` that
//! the getters here read (`verbs`, `port_num`, the route's addresses):
//! inside the calls on the id (`rdma_bind_addr`, `rdma_resolve_addr`, ...)
//! on whichever thread makes them, and inside `rdma_get_cm_event` on the
//! event thread (`ADDR_RESOLVED`, `ROUTE_RESOLVED` query the kernel into
//! the id). So every call on an id and every read of its fields takes one
//! process-wide lock, proven by a [`CmGuard`] argument, which the event
//! thread also holds across `rdma_get_cm_event`. That fetch never blocks
//! with the lock held: the channel's fd is non-blocking (an event gone
//! between `poll` and the read, with its destroyed id, gives an error, not
//! a wait). No call made under the lock waits for a thread that needs it:
//! `rdma_destroy_id` waits only for the event thread to acknowledge the
//! id's fetched events, which it does without the lock.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use al::sync::{Mutex, MutexGuard};

use al::Result;
use rdma_sys as ffi;

use crate::cm::ConnParam;
use crate::convert::{errno_error, RawQpAttr};
use crate::sys::{check, last_errno};

/// A socket address as the `sockaddr_storage` librdmacm reads.
fn storage_of(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid `sockaddr_storage` (plain integers).
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for
            // every socket address type; we write one `sockaddr_in`.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for one `sockaddr_in6`.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    st
}

/// The socket address in a `sockaddr_storage` (IPv4 or IPv6); `None` for
/// another family (nothing resolved yet: family 0).
fn addr_of(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match c_int::from(st.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`;
            // the storage is large enough and aligned for it.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((st as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for a `sockaddr_in6`.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((st as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// Proof that the process's CM lock is held (module docs).
pub(crate) struct CmGuard(#[allow(dead_code)] MutexGuard<'static, ()>);

/// Takes the process's CM lock.
pub(crate) fn lock() -> CmGuard {
    al::global! {
        static CM_LOCK: Mutex<()> = Mutex::new(());
    }
    CmGuard(CM_LOCK.lock())
}

/// An event channel (`rdma_create_event_channel`): the fd every event of
/// its ids arrives on. Destroyed on drop (after every id on it).
pub(crate) struct EventChannel {
    ch: NonNull<ffi::rdma_event_channel>,
}

// SAFETY: tied to no thread; destroyed in `Drop` (exclusive, after every
// id on it: the channel's owner outlives them). Through `&EventChannel`:
// `fd` reads a field fixed at creation, `rdma_get_cm_event` runs under the
// CM lock (a `CmGuard` argument), and `rdma_create_id` only names the
// channel (librdmacm locks its own id table).
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// `rdma_create_event_channel`. Fails (ENODEV, ENOSYS) when the kernel
    /// has no rdma_cm (`/dev/infiniband/rdma_cm` missing).
    pub(crate) fn new() -> Result<EventChannel> {
        // SAFETY: no arguments; returns NULL with errno set, or a channel
        // we own until `rdma_destroy_event_channel`.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        let ch = NonNull::new(ch)
            .map(|ch| EventChannel { ch })
            .ok_or_else(|| errno_error("rdma_create_event_channel", last_errno()))?;
        // Non-blocking, so that a fetch under the CM lock never waits.
        let fd = ch.fd();
        // SAFETY: `fd` is the channel's open fd; F_GETFL/F_SETFL only read
        // and set its status flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(errno_error(
                "fcntl(O_NONBLOCK) on the rdma_cm channel",
                last_errno(),
            ));
        }
        Ok(ch)
    }

    /// The channel's fd (readable when an event waits).
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// `rdma_get_cm_event`: the next event, or an error when there is
    /// none (the fd is non-blocking; call it when [`fd`](Self::fd) is
    /// readable). Under the CM lock: librdmacm writes the event's id here.
    pub(crate) fn get_event(&self, _cm: &CmGuard) -> Result<RawEvent<'_>> {
        let mut ev: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is live; on success `ev` is an event we
        // must acknowledge exactly once (`RawEvent`'s drop).
        check("rdma_get_cm_event", unsafe {
            ffi::rdma_get_cm_event(self.ch.as_ptr(), &mut ev)
        })?;
        let ev = NonNull::new(ev)
            .ok_or_else(|| al::Error::Other("rdma_get_cm_event: succeeded with no event".into()))?;
        Ok(RawEvent {
            ev,
            _ch: std::marker::PhantomData,
        })
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created by `rdma_create_event_channel`, destroyed once,
        // after every id on it (each id holds the channel's owner).
        unsafe { ffi::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// One event from `rdma_get_cm_event`, acknowledged on drop. While it is
/// not acknowledged, `rdma_destroy_id` of its id waits, so its id pointers
/// cannot name a newer id.
pub(crate) struct RawEvent<'c> {
    ev: NonNull<ffi::rdma_cm_event>,
    _ch: std::marker::PhantomData<&'c EventChannel>,
}

impl RawEvent<'_> {
    fn ev(&self) -> &ffi::rdma_cm_event {
        // SAFETY: the event is live until acknowledged (our drop).
        unsafe { self.ev.as_ref() }
    }

    /// The event code (`enum rdma_cm_event_type`).
    pub(crate) fn code(&self) -> u32 {
        self.ev().event
    }

    /// The status (0, a negative errno, or a REJ reason).
    pub(crate) fn status(&self) -> i32 {
        self.ev().status
    }

    /// The id the event concerns, as a key (its address).
    pub(crate) fn id_key(&self) -> usize {
        self.ev().id as usize
    }

    /// The listening id of a connect request, as a key.
    pub(crate) fn listen_key(&self) -> usize {
        self.ev().listen_id as usize
    }

    /// The connection parameters (events that carry them: connect
    /// request, response, established, rejected), private data copied.
    pub(crate) fn conn(&self) -> ConnParam {
        // SAFETY: for the connected port space every event's `param` is
        // the `conn` member (`rdma_get_cm_event` fills it, zero for events
        // without one); plain data and a pointer checked below.
        let c = unsafe { self.ev().param.conn };
        let private_data = if c.private_data.is_null() || c.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm points `private_data` at
            // `private_data_len` bytes inside the event, valid until it is
            // acknowledged.
            unsafe {
                std::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    usize::from(c.private_data_len),
                )
            }
            .to_vec()
        };
        ConnParam {
            private_data,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control != 0,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq != 0,
            qp_num: c.qp_num,
        }
    }

    /// The new id of a connect request, now ours to destroy.
    ///
    /// Call only for `RDMA_CM_EVENT_CONNECT_REQUEST`, once.
    pub(crate) fn take_new_id(&self) -> Option<Id> {
        NonNull::new(self.ev().id).map(|id| Id { id })
    }
}

impl Drop for RawEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: from `rdma_get_cm_event`, acknowledged once.
        let _ = unsafe { ffi::rdma_ack_cm_event(self.ev.as_ptr()) };
    }
}

/// An rdma_cm id (`rdma_create_id`, or the new id of a connect request).
/// Not destroyed on drop: [`Id::destroy`] is called by its owner (who must
/// not hold an unacknowledged event of it, or it waits forever).
pub(crate) struct Id {
    id: NonNull<ffi::rdma_cm_id>,
}

// SAFETY: an id is tied to no thread (librdmacm's calls on it may come
// from any); it is destroyed once, by `destroy(self)`.
unsafe impl Send for Id {}
// SAFETY: every method that calls librdmacm on the id or reads its fields
// takes a `&CmGuard`, so threads sharing `&Id` use it one at a time, and
// never while `rdma_get_cm_event` rewrites its fields (module docs); `key`
// reads only the pointer's value.
unsafe impl Sync for Id {}

impl Id {
    /// `rdma_create_id` on `ch` in the port space `ps`, no QP.
    pub(crate) fn create(ch: &EventChannel, ps: u32) -> Result<Id> {
        let mut id: *mut ffi::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: the channel is live and outlives the id (its owner keeps
        // it); the context pointer is unused (NULL).
        check("rdma_create_id", unsafe {
            ffi::rdma_create_id(ch.ch.as_ptr(), &mut id, std::ptr::null_mut(), ps)
        })?;
        NonNull::new(id)
            .map(|id| Id { id })
            .ok_or_else(|| al::Error::Other("rdma_create_id: succeeded with no id".into()))
    }

    /// The id's address, the key its events carry.
    pub(crate) fn key(&self) -> usize {
        self.id.as_ptr() as usize
    }

    /// `rdma_resolve_addr` from `src` (or any local address) to `dst`.
    pub(crate) fn resolve_addr(
        &self,
        _cm: &CmGuard,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<()> {
        let mut s = src.map(|a| storage_of(&a));
        let mut d = storage_of(&dst);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: the id is live; both addresses are valid for the call
        // (librdmacm copies them).
        check("rdma_resolve_addr", unsafe {
            ffi::rdma_resolve_addr(
                self.id.as_ptr(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        })
    }

    /// `rdma_resolve_route`.
    pub(crate) fn resolve_route(&self, _cm: &CmGuard, timeout_ms: i32) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_resolve_route", unsafe {
            ffi::rdma_resolve_route(self.id.as_ptr(), timeout_ms)
        })
    }

    /// `rdma_bind_addr`.
    pub(crate) fn bind_addr(&self, _cm: &CmGuard, addr: SocketAddr) -> Result<()> {
        let mut a = storage_of(&addr);
        // SAFETY: the id is live; the address is valid for the call.
        check("rdma_bind_addr", unsafe {
            ffi::rdma_bind_addr(
                self.id.as_ptr(),
                (&mut a as *mut libc::sockaddr_storage).cast(),
            )
        })
    }

    /// `rdma_listen`.
    pub(crate) fn listen(&self, _cm: &CmGuard, backlog: i32) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_listen", unsafe {
            ffi::rdma_listen(self.id.as_ptr(), backlog)
        })
    }

    fn with_param<R>(p: &ConnParam, f: impl FnOnce(&mut ffi::rdma_conn_param) -> R) -> R {
        let mut c = ffi::rdma_conn_param {
            private_data: if p.private_data.is_empty() {
                std::ptr::null()
            } else {
                p.private_data.as_ptr().cast::<c_void>()
            },
            private_data_len: u8::try_from(p.private_data.len()).unwrap_or(u8::MAX),
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: u8::from(p.flow_control),
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: u8::from(p.srq),
            qp_num: p.qp_num,
        };
        f(&mut c)
    }

    /// `rdma_connect` with `p` (its `qp_num` names the QP; the id has none).
    pub(crate) fn connect(&self, _cm: &CmGuard, p: &ConnParam) -> Result<()> {
        Self::with_param(p, |c| {
            // SAFETY: the id is live; the parameters and the private data
            // they point at are valid for the call (librdmacm copies them).
            check("rdma_connect", unsafe {
                ffi::rdma_connect(self.id.as_ptr(), c)
            })
        })
    }

    /// `rdma_accept` with `p`.
    pub(crate) fn accept(&self, _cm: &CmGuard, p: &ConnParam) -> Result<()> {
        Self::with_param(p, |c| {
            // SAFETY: as for `connect`.
            check("rdma_accept", unsafe {
                ffi::rdma_accept(self.id.as_ptr(), c)
            })
        })
    }

    /// `rdma_reject` with `private_data`.
    pub(crate) fn reject(&self, _cm: &CmGuard, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len()).unwrap_or(u8::MAX);
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast::<c_void>()
        };
        // SAFETY: the id is live; the data is valid for the call.
        check("rdma_reject", unsafe {
            ffi::rdma_reject(self.id.as_ptr(), ptr, len)
        })
    }

    /// `rdma_establish` (an id without a QP, after the connect response).
    pub(crate) fn establish(&self, _cm: &CmGuard) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_establish", unsafe {
            ffi::rdma_establish(self.id.as_ptr())
        })
    }

    /// `rdma_disconnect` (DREQ, or DREP after the peer's DREQ).
    pub(crate) fn disconnect(&self, _cm: &CmGuard) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_disconnect", unsafe {
            ffi::rdma_disconnect(self.id.as_ptr())
        })
    }

    /// `rdma_init_qp_attr` for `state` (an `ibv_qp_state` code): the
    /// attributes and `IBV_QP_*` mask to move a QP of this connection.
    pub(crate) fn init_qp_attr(&self, _cm: &CmGuard, state: u32) -> Result<(RawQpAttr, u32)> {
        // SAFETY: all-zero is valid for `ibv_qp_attr` (integers, unions
        // of integers).
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        let mut mask: c_int = 0;
        // SAFETY: the id is live; both out-pointers are valid.
        check("rdma_init_qp_attr", unsafe {
            ffi::rdma_init_qp_attr(self.id.as_ptr(), &mut a, &mut mask)
        })?;
        Ok((crate::sys::raw_qp_attr_of(&a), mask as u32))
    }

    fn verbs(&self, _cm: &CmGuard) -> Option<NonNull<ffi::ibv_context>> {
        // SAFETY: the id is live; `verbs` is a plain field, NULL until an
        // address is bound or resolved.
        NonNull::new(unsafe { (*self.id.as_ptr()).verbs })
    }

    /// The node GUID (host order) and name of the device the id is bound
    /// to, once an address is bound or resolved.
    pub(crate) fn device(&self, cm: &CmGuard) -> Option<(u64, String)> {
        let ctx = self.verbs(cm)?;
        // SAFETY: the context librdmacm opened for the id is live while
        // the id is; its `device` pointer is valid while the context is.
        let dev = unsafe { (*ctx.as_ptr()).device };
        if dev.is_null() {
            return None;
        }
        // SAFETY: `dev` is a live device (above); the GUID is returned by
        // value, the name is a NUL-terminated string in the device,
        // copied out here.
        let guid = u64::from_be(unsafe { ffi::ibv_get_device_guid(dev) });
        // SAFETY: as above.
        let name = unsafe { ffi::ibv_get_device_name(dev) };
        let name = if name.is_null() {
            String::new()
        } else {
            // SAFETY: non-NULL, NUL-terminated, live with the device.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        Some((guid, name))
    }

    /// The device port the id is bound to (0 before).
    pub(crate) fn port_num(&self, _cm: &CmGuard) -> u8 {
        // SAFETY: the id is live; `port_num` is a plain field.
        unsafe { (*self.id.as_ptr()).port_num }
    }

    /// The local and peer addresses of the route (`rdma_get_local_addr`,
    /// `rdma_get_peer_addr`, inline in the header: the route's addresses).
    pub(crate) fn addrs(&self, _cm: &CmGuard) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: the id is live; the route's address unions are plain
        // `sockaddr_storage`-sized data librdmacm fills in, every member
        // readable as the storage.
        let (src, dst) = unsafe {
            let r = &(*self.id.as_ptr()).route.addr;
            (r.src_addr_union.src_storage, r.dst_addr_union.dst_storage)
        };
        (addr_of(&src), addr_of(&dst))
    }

    /// `rdma_notify(IBV_EVENT_COMM_EST)`: the QP of this connection
    /// received before the RTU came; the kernel's CM moves the connection
    /// to established (and the id then reports `ESTABLISHED`).
    pub(crate) fn notify_comm_est(&self, _cm: &CmGuard) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_notify", unsafe {
            ffi::rdma_notify(self.id.as_ptr(), ffi::ibv_event_type::IBV_EVENT_COMM_EST)
        })
    }

    /// `rdma_destroy_id`. Waits until every event of the id that was
    /// fetched is acknowledged (`cma.c`: `rdma_destroy_id` waits for
    /// `events_completed`); the kernel sends the REJ or DREQ the
    /// connection's state calls for.
    pub(crate) fn destroy(self, _cm: &CmGuard) -> Result<()> {
        // SAFETY: created by `rdma_create_id` or handed over by a connect
        // request; destroyed once (`self` is consumed).
        check("rdma_destroy_id", unsafe {
            ffi::rdma_destroy_id(self.id.as_ptr())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_sockaddr_storage() {
        for a in ["192.168.77.2:7471", "[fe80::1]:1", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(addr_of(&storage_of(&a)), Some(a));
        }
        // SAFETY: all-zero is a valid `sockaddr_storage`.
        let empty: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(addr_of(&empty), None);
    }

    #[test]
    fn our_event_codes_match_the_installed_headers() {
        use crate::cm::event_code::*;
        use ffi::rdma_cm_event_type as t;
        assert_eq!(ADDR_RESOLVED, t::RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(CONNECT_REQUEST, t::RDMA_CM_EVENT_CONNECT_REQUEST);
        assert_eq!(CONNECT_RESPONSE, t::RDMA_CM_EVENT_CONNECT_RESPONSE);
        assert_eq!(REJECTED, t::RDMA_CM_EVENT_REJECTED);
        assert_eq!(DISCONNECTED, t::RDMA_CM_EVENT_DISCONNECTED);
        assert_eq!(TIMEWAIT_EXIT, t::RDMA_CM_EVENT_TIMEWAIT_EXIT);
        assert_eq!(crate::cm::PS_TCP, ffi::rdma_port_space::RDMA_PS_TCP);
        for code in 0..=15 {
            // SAFETY: `rdma_event_str` returns a static string for any code.
            let s = unsafe { CStr::from_ptr(ffi::rdma_event_str(code)) };
            assert_eq!(
                s.to_str().unwrap(),
                crate::cm::event_name(code),
                "code {code}"
            );
        }
    }
}
