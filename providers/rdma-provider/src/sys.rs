//! The only module that calls libibverbs: each `unsafe` call is wrapped in
//! a small safe function or type with a `// SAFETY:` argument, and every
//! failure becomes an [`al::Error`] naming the call and its errno
//! ([`crate::convert::errno_error`]).
//!
//! * [`DeviceList`]: `ibv_get_device_list` / `ibv_free_device_list`; its
//!   entries ([`ListedDevice`]) borrow it, so no `ibv_device` pointer
//!   outlives the list.
//! * [`Context`]: `ibv_open_device` / `ibv_close_device`, and the queries
//!   (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`,
//!   `ibv_query_pkey`).
//!
//! **Thread safety.** Each wrapper is `Send` and `Sync` by an `unsafe
//! impl` with its own argument, all resting on what rdma-core documents
//! for libibverbs (`verbs(7)`, "thread safety"): every verb may be called
//! from any thread, on the same object too (the library and the driver
//! library lock what they share), as long as an object is destroyed once
//! and not used after. This provider never asks for the exceptions (a
//! thread domain, a single-threaded context). Destruction always takes
//! the wrapper by value or `&mut` (its `Drop`), and every parent is held
//! by its children's `Arc`s, so no object is destroyed while a verb runs
//! on it or on a child. The few fields read directly (`qp_num`, the MR's
//! keys, the fds) are fixed when the object is created.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use al::Result;
use provider::buffer::for_providers::{map_for_device, DeviceMapping, Memory};
use provider::{RecvWr, SendOp, Sge};
use rdma_sys as ffi;

use crate::convert::{errno_error, qp_mask, RawAh, RawDeviceAttr, RawPortAttr, RawQpAttr, RawWc};
use crate::events::{element_of, Element};

/// The calling thread's errno, as libibverbs left it.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The result of a verb that returns 0 or an error: libibverbs' verbs
/// return the errno itself (positive), older paths -1 with errno set.
pub(crate) fn check(call: &str, rc: c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(errno_error(call, rc)),
        _ => Err(errno_error(call, last_errno())),
    }
}

/// The devices libibverbs sees now (`ibv_get_device_list`), freed on drop.
pub(crate) struct DeviceList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. Fails with the errno when libibverbs cannot list
    /// (no kernel support: `ENOSYS`; no permission to sysfs: `EPERM`); an
    /// empty list is a success. The caller words the error: listing
    /// nothing is "no devices", whatever the errno.
    pub(crate) fn get() -> std::result::Result<DeviceList, i32> {
        let mut n: c_int = 0;
        // SAFETY: `ibv_get_device_list` only writes the count through the
        // valid pointer it is given and returns either NULL (errno set) or
        // a NULL-terminated array of `n` device pointers owned by us until
        // `ibv_free_device_list`.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or_else(last_errno)?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// The listed devices, in libibverbs' order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ListedDevice<'_>> + '_ {
        (0..self.len).filter_map(move |i| {
            // SAFETY: `i < len`, the array has `len` entries (and a NULL
            // after them), and it lives as long as `self`.
            let dev = unsafe { *self.list.as_ptr().add(i) };
            NonNull::new(dev).map(|dev| ListedDevice {
                dev,
                _list: PhantomData,
            })
        })
    }

    /// How many devices are listed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from `ibv_get_device_list` and is freed
        // once, here; every `ListedDevice` borrows `self`, so none is left.
        // Contexts opened from its devices stay valid (libibverbs keeps a
        // reference to the device for each open context).
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// One entry of a [`DeviceList`], valid while the list lives.
#[derive(Clone, Copy)]
pub(crate) struct ListedDevice<'l> {
    dev: NonNull<ffi::ibv_device>,
    _list: PhantomData<&'l DeviceList>,
}

impl ListedDevice<'_> {
    /// `ibv_get_device_name` (the kernel's name: `mlx5_0`, `rxe0`).
    pub(crate) fn name(&self) -> String {
        // SAFETY: the device pointer is valid while the list lives; the
        // name is a NUL-terminated string inside the device structure.
        let name = unsafe { ffi::ibv_get_device_name(self.dev.as_ptr()) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, and not freed while the list
        // (which `self` borrows) lives; copied out before it goes.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `ibv_get_device_guid`: the node GUID, in host order.
    pub(crate) fn guid(&self) -> u64 {
        // SAFETY: the device pointer is valid while the list lives; the
        // call reads sysfs and returns the GUID by value (big-endian).
        u64::from_be(unsafe { ffi::ibv_get_device_guid(self.dev.as_ptr()) })
    }

    /// `ibv_open_device`.
    pub(crate) fn open(&self) -> Result<Context> {
        // SAFETY: the device pointer is valid while the list lives; the
        // call returns NULL with errno set, or a context we own until
        // `ibv_close_device` (it holds its own reference to the device).
        let ctx = unsafe { ffi::ibv_open_device(self.dev.as_ptr()) };
        NonNull::new(ctx)
            .map(|ctx| Context { ctx })
            .ok_or_else(|| errno_error("ibv_open_device", last_errno()))
    }
}

/// An open device (`struct ibv_context`), closed on drop.
pub(crate) struct Context {
    ctx: NonNull<ffi::ibv_context>,
}

// SAFETY (thread safety of the wrappers below, see the module docs): a
// context is tied to no thread, so it may be closed (`Drop`, exclusive)
// on any. Through `&Context` only thread-safe verbs run (the queries,
// `ibv_get_async_event`, which hands each event to exactly one caller)
// and `async_fd` reads a field fixed at open.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<RawDeviceAttr> {
        // SAFETY: `ibv_device_attr` is plain C data (integers and a char
        // array); all-zero is a valid value.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid, writable struct of
        // the size the headers rdma-sys was generated from declare.
        check("ibv_query_device", unsafe {
            ffi::ibv_query_device(self.ctx.as_ptr(), &mut a)
        })?;
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(RawDeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_sge: a.max_sge,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            atomic_cap: a.atomic_cap,
            max_ah: a.max_ah,
            max_srq: a.max_srq,
            max_srq_wr: a.max_srq_wr,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// `ibv_query_port` (the header's inline `___ibv_query_port`, which
    /// rdma-sys reproduces: the provider's extended op when it has one,
    /// else the compatibility entry point).
    pub(crate) fn query_port(&self, port: u8) -> Result<RawPortAttr> {
        // SAFETY: `ibv_port_attr` is plain C data; all-zero is valid (and
        // is what the C inline clears it to before the compat call).
        let mut a: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `a` is a valid, writable struct
        // of the size passed along; the function reads the context's op
        // table only after checking its size and that the op is present.
        check("ibv_query_port", unsafe {
            ffi::___ibv_query_port(self.ctx.as_ptr(), port, &mut a)
        })?;
        Ok(RawPortAttr {
            state: a.state,
            max_mtu: a.max_mtu,
            active_mtu: a.active_mtu,
            gid_tbl_len: a.gid_tbl_len,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            link_layer: a.link_layer,
        })
    }

    /// `ibv_query_gid`: entry `index` of port `port`'s GID table.
    pub(crate) fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a valid, writable
        // 16-byte union.
        check("ibv_query_gid", unsafe {
            ffi::ibv_query_gid(self.ctx.as_ptr(), port, index, &mut gid)
        })?;
        // SAFETY: every variant of the union is 16 plain bytes; `raw` is
        // initialised (zeroes, then what the call wrote).
        Ok(unsafe { gid.raw })
    }

    /// `ibv_query_pkey`: entry `index` of port `port`'s P_Key table, in
    /// host order.
    pub(crate) fn query_pkey(&self, port: u8, index: i32) -> Result<u16> {
        let mut pkey: u16 = 0;
        // SAFETY: the context is open and `pkey` is a valid, writable
        // `__be16`.
        check("ibv_query_pkey", unsafe {
            ffi::ibv_query_pkey(self.ctx.as_ptr(), port, index, &mut pkey)
        })?;
        Ok(u16::from_be(pkey))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context came from `ibv_open_device` and is closed
        // once, here; every object made on it (channel, PD, CQ and their
        // children) holds an `Arc<Context>`, so none is left.
        let _ = unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

impl Context {
    /// The fd of the context's asynchronous events (`ibv_get_async_event`
    /// reads it).
    pub(crate) fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open; `async_fd` is a plain int field set
        // at open and never changed.
        unsafe { (*self.ctx.as_ptr()).async_fd }
    }

    /// `ibv_get_async_event`: the next asynchronous event. Blocks unless
    /// [`Context::async_fd`] is readable (the caller polls it first).
    pub(crate) fn get_async_event(&self) -> Result<AsyncEvent<'_>> {
        let mut ev = MaybeUninit::<ffi::ibv_async_event>::zeroed();
        // SAFETY: the context is open and `ev` is writable storage of the
        // struct's size; on success the call filled it in.
        check("ibv_get_async_event", unsafe {
            ffi::ibv_get_async_event(self.ctx.as_ptr(), ev.as_mut_ptr())
        })?;
        Ok(AsyncEvent { ev, _ctx: self })
    }
}

/// One asynchronous event, acknowledged (`ibv_ack_async_event`) on drop.
/// While it is not acknowledged, destroying the object it names waits, so
/// the object's address stays a valid key.
pub(crate) struct AsyncEvent<'c> {
    ev: MaybeUninit<ffi::ibv_async_event>,
    _ctx: &'c Context,
}

/// What an [`AsyncEvent`] says: its code, and the element it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AsyncKind {
    /// The `IBV_EVENT_*` code (`crate::events::event_code`).
    pub(crate) code: u32,
    /// The CQ's, QP's, SRQ's or WQ's address ([`Cq::key`], [`Qp::key`]),
    /// 0 for a port or device event or an unknown code.
    pub(crate) key: usize,
    /// The port of a port event, else 0.
    pub(crate) port: u8,
}

impl AsyncEvent<'_> {
    /// The event's meaning.
    pub(crate) fn kind(&self) -> AsyncKind {
        let p = self.ev.as_ptr();
        // SAFETY: `ibv_get_async_event` filled the struct. The event type
        // is read as the `u32` it is in C, not as rdma-sys's Rust enum (a
        // code newer than the bindings would be an invalid enum value).
        let code = unsafe { std::ptr::addr_of!((*p).event_type).cast::<u32>().read() };
        let mut kind = AsyncKind {
            code,
            key: 0,
            port: 0,
        };
        // SAFETY (each arm): `verbs.h` says which union member an event
        // type fills (`events::element_of`); only that member is read, as
        // a plain pointer value or int.
        match element_of(code) {
            Some(Element::Cq) => kind.key = unsafe { (*p).element.cq } as usize,
            Some(Element::Qp) => kind.key = unsafe { (*p).element.qp } as usize,
            Some(Element::Srq) => kind.key = unsafe { (*p).element.srq } as usize,
            Some(Element::Wq) => kind.key = unsafe { (*p).element.wq } as usize,
            Some(Element::Port) => {
                kind.port = u8::try_from(unsafe { (*p).element.port_num }).unwrap_or(0)
            }
            Some(Element::Device) | None => {}
        }
        kind
    }
}

impl Drop for AsyncEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: the event came from `ibv_get_async_event` and is
        // acknowledged once, here.
        unsafe { ffi::ibv_ack_async_event(self.ev.as_mut_ptr()) }
    }
}

/// `struct ibv_qp_attr` as plain data (`ibv_query_qp`, `rdma_init_qp_attr`).
pub(crate) fn raw_qp_attr_of(a: &ffi::ibv_qp_attr) -> RawQpAttr {
    RawQpAttr {
        state: a.qp_state,
        cur_state: a.cur_qp_state,
        path_mtu: a.path_mtu,
        mig_state: a.path_mig_state,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qpn: a.dest_qp_num,
        access: a.qp_access_flags,
        caps: [
            a.cap.max_send_wr,
            a.cap.max_recv_wr,
            a.cap.max_send_sge,
            a.cap.max_recv_sge,
        ],
        ah: raw_ah_of(&a.ah_attr),
        alt_ah: raw_ah_of(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port: a.alt_port_num,
        alt_timeout: a.alt_timeout,
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (`poll(2)`
/// with `POLLIN`); returns which are readable. An interrupted wait
/// (`EINTR`) reports none.
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs that
    // `poll` may write the `revents` of.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let errno = last_errno();
        if errno == libc::EINTR {
            return Ok(vec![false; fds.len()]);
        }
        return Err(errno_error("poll", errno));
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// A completion channel (`ibv_create_comp_channel`): the fd the device's
/// completion events arrive on, for every CQ created with it.
pub(crate) struct CompChannel {
    ch: NonNull<ffi::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: tied to no thread; destroyed in `Drop` (exclusive). Through
// `&CompChannel`: `fd` reads a field fixed at creation, and
// `ibv_get_cq_event` is thread safe (each event goes to one caller; only
// the device's event thread calls it anyway); `ibv_create_cq` from other
// threads only names the channel.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// `ibv_create_comp_channel`.
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<CompChannel> {
        // SAFETY: the context is open (the Arc keeps it so for the
        // channel's life); NULL with errno on failure.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.ctx.as_ptr()) };
        NonNull::new(ch)
            .map(|ch| CompChannel {
                ch,
                _ctx: ctx.clone(),
            })
            .ok_or_else(|| errno_error("ibv_create_comp_channel", last_errno()))
    }

    /// The channel's fd (readable when an event is queued).
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is set at creation.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// `ibv_get_cq_event`: the next completion event. Blocks unless
    /// [`CompChannel::fd`] is readable (the caller polls it first).
    pub(crate) fn get_cq_event(&self) -> Result<CqEvent<'_>> {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the channel is live; both out-pointers are valid.
        check("ibv_get_cq_event", unsafe {
            ffi::ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx)
        })?;
        Ok(CqEvent { cq, _ch: self })
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_comp_channel`, destroyed once;
        // every CQ on it holds an `Arc` of the channel, so none is left.
        let _ = unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

/// One completion event, acknowledged (`ibv_ack_cq_events`) on drop.
/// `ibv_destroy_cq` waits until every event it reported is acknowledged,
/// so the CQ pointer stays valid (and [`CqEvent::key`] names that CQ, not
/// a later one at the same address) until this is dropped.
pub(crate) struct CqEvent<'c> {
    cq: *mut ffi::ibv_cq,
    _ch: &'c CompChannel,
}

impl CqEvent<'_> {
    /// The CQ's [`Cq::key`].
    pub(crate) fn key(&self) -> usize {
        self.cq as usize
    }
}

impl Drop for CqEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: the CQ reported this event and cannot be destroyed
        // before it is acknowledged (see above); acknowledged once, here.
        unsafe { ffi::ibv_ack_cq_events(self.cq, 1) }
    }
}

/// A protection domain (`ibv_alloc_pd`), deallocated on drop.
pub(crate) struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    freed: bool,
    _ctx: Arc<Context>,
}

// SAFETY: tied to no thread; freed by `dealloc(self)` or `Drop`
// (exclusive). `&Pd` only passes the pointer to thread-safe verbs
// (create CQ/QP/SRQ/AH, register MR).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub(crate) fn alloc(ctx: &Arc<Context>) -> Result<Pd> {
        // SAFETY: the context is open and stays so (the Arc).
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) };
        NonNull::new(pd)
            .map(|pd| Pd {
                pd,
                freed: false,
                _ctx: ctx.clone(),
            })
            .ok_or_else(|| errno_error("ibv_alloc_pd", last_errno()))
    }

    /// `ibv_dealloc_pd`, with its error. Every child holds an `Arc<Pd>`,
    /// so by the time this can be called none is left.
    pub(crate) fn dealloc(mut self) -> Result<()> {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once (`freed` stops
        // the drop from trying again after a success).
        let rc = unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
        check("ibv_dealloc_pd", rc)?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `dealloc`.
            let _ = unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
        }
    }
}

/// A completion queue (`ibv_create_cq`) on a completion channel, destroyed
/// on drop.
pub(crate) struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    freed: bool,
    _channel: Arc<CompChannel>,
    _ctx: Arc<Context>,
}

// SAFETY: tied to no thread; destroyed by `destroy(self)` or `Drop`
// (exclusive). Through `&Cq`: `ibv_poll_cq` and `ibv_req_notify_cq`,
// thread safe (the driver library locks the CQ: no single-threaded
// context or thread domain is ever asked for), and `key` (the pointer's
// value).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

/// How many `ibv_wc` one `ibv_poll_cq` call fills at most.
const POLL_BATCH: usize = 16;

impl Cq {
    /// `ibv_create_cq` with `cqe` entries, events on `channel`.
    pub(crate) fn new(ctx: &Arc<Context>, channel: &Arc<CompChannel>, cqe: i32) -> Result<Cq> {
        // SAFETY: context and channel are live (held by the Arcs for the
        // CQ's life); the CQ context pointer is unused (NULL).
        let cq = unsafe {
            ffi::ibv_create_cq(
                ctx.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                channel.ch.as_ptr(),
                0,
            )
        };
        NonNull::new(cq)
            .map(|cq| Cq {
                cq,
                freed: false,
                _channel: channel.clone(),
                _ctx: ctx.clone(),
            })
            .ok_or_else(|| errno_error("ibv_create_cq", last_errno()))
    }

    /// The CQ's identity in events ([`CqEvent::key`], [`AsyncKind`]).
    pub(crate) fn key(&self) -> usize {
        self.cq.as_ptr() as usize
    }

    /// `ibv_req_notify_cq`.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is live; rdma-sys's inline calls the provider's
        // op, which every provider has.
        check("ibv_req_notify_cq", unsafe {
            ffi::ibv_req_notify_cq(self.cq.as_ptr(), i32::from(solicited_only))
        })
    }

    /// `ibv_poll_cq` until `out` is full or the CQ is empty.
    pub(crate) fn poll(&self, out: &mut [RawWc]) -> Result<usize> {
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            let mut wcs = MaybeUninit::<[ffi::ibv_wc; POLL_BATCH]>::zeroed();
            // SAFETY: the CQ is live; `wcs` has room for `want` entries.
            let n =
                unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), want as i32, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                // Providers return -1 with errno set, or a negative errno.
                let errno = if n == -1 { last_errno() } else { -n };
                return Err(errno_error("ibv_poll_cq", errno));
            }
            let n = n as usize;
            // SAFETY: all-zero is a valid `ibv_wc` (plain integers and a
            // union of integers), and the call wrote the first `n`.
            let wcs = unsafe { wcs.assume_init() };
            for (o, w) in out[done..].iter_mut().zip(&wcs[..n]) {
                *o = RawWc {
                    wr_id: w.wr_id,
                    status: w.status,
                    opcode: w.opcode,
                    byte_len: w.byte_len,
                    // SAFETY: both union members are a u32.
                    imm_data_be: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
                    qp_num: w.qp_num,
                    src_qp: w.src_qp,
                    wc_flags: w.wc_flags,
                    pkey_index: w.pkey_index,
                    slid: w.slid,
                };
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// `ibv_destroy_cq`, with its error (it waits until this CQ's events
    /// are acknowledged: the event thread acknowledges at once).
    pub(crate) fn destroy(mut self) -> Result<()> {
        // SAFETY: created by `ibv_create_cq`; every QP on it holds an
        // `Arc<Cq>`, so none is left; destroyed once.
        check("ibv_destroy_cq", unsafe {
            ffi::ibv_destroy_cq(self.cq.as_ptr())
        })?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `destroy`.
            let _ = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        }
    }
}

/// A memory region (`ibv_reg_mr_iova2`) over memory it keeps alive and
/// maps for the device, deregistered on drop.
pub(crate) struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    freed: bool,
    /// Keeps the memory alive and every access to it device-safe (no
    /// Rust reference into its bytes, volatile copies) until the device
    /// can no longer reach it: dropped after `ibv_dereg_mr`.
    mapping: Option<DeviceMapping>,
    _pd: Arc<Pd>,
}

// SAFETY: the `ibv_mr` is only read for its keys (written once by
// `ibv_reg_mr_iova2` before the pointer is ours, never changed after) and
// deregistered through `&mut self`/`self`, so moving it to another thread
// or reading the keys from several threads cannot race; libibverbs ties an
// MR to no thread.
unsafe impl Send for Mr {}
// SAFETY: as above: `&Mr` gives only the immutable keys.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes from `offset` of `mem` at `iova` with
    /// `access` (the `IBV_ACCESS_*` bits, which are [`provider::Access`]'s).
    ///
    /// The memory is first mapped for the device
    /// ([`map_for_device`]): from then on no access makes a Rust
    /// reference into its bytes, whatever the access flags (the device
    /// writes receives and READ responses with local write, and remote
    /// WRITEs and atomics with remote rights, at any moment). The address
    /// is the mapping's: an owned buffer's allocation (which never moves
    /// or resizes) or a raw region's base (which the `RawRegion::new`
    /// contract keeps valid until deregistration). The mapping (and with
    /// it the memory) is held until the MR is deregistered, so the bytes
    /// the device may DMA into stay allocated.
    pub(crate) fn register(
        pd: &Arc<Pd>,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Mr> {
        let total = mem.len();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(al::Error::invalid_parameter(format!(
                "range {offset}+{len} outside memory of {total} bytes"
            )));
        }
        let mapping = map_for_device(mem)
            .ok_or_else(|| al::Error::invalid_parameter("memory was invalidated"))?;
        let addr = mapping.addr() + offset;
        // The kernel maps an MR page by page and refuses (EINVAL) an iova
        // at another offset in its page than the address; say so plainly.
        let page = provider::buffer::PAGE as u64;
        if (addr as u64 ^ iova) % page != 0 {
            return Err(al::Error::invalid_parameter(format!(
                "iova {iova:#x} is at offset {:#x} in its page but the memory at offset \
                 {offset} is at {:#x}: a device maps an MR page by page, so both must match",
                iova % page,
                addr as u64 % page
            )));
        }
        // SAFETY: the PD is live (Arc); `addr..addr+len` lies inside `mem`
        // (checked above), which stays allocated at that address while the
        // MR lives (the mapping held in the MR keeps the `Arc<Memory>`;
        // owned memory is an allocation that never moves, raw memory is
        // the caller's promise), and no Rust reference into it exists from
        // the mapping on. The kernel pins the pages; NULL with errno on
        // failure.
        let mr = unsafe {
            ffi::ibv_reg_mr_iova2(pd.pd.as_ptr(), addr as *mut c_void, len, iova, access)
        };
        NonNull::new(mr)
            .map(|mr| Mr {
                mr,
                freed: false,
                mapping: Some(mapping),
                _pd: pd.clone(),
            })
            .ok_or_else(|| errno_error("ibv_reg_mr_iova2", last_errno()))
    }

    /// (lkey, rkey).
    pub(crate) fn keys(&self) -> (u32, u32) {
        // SAFETY: the MR is live; the keys are set at registration.
        unsafe { ((*self.mr.as_ptr()).lkey, (*self.mr.as_ptr()).rkey) }
    }

    /// The device no longer reaches the memory: end the mapping and, for a
    /// raw region, invalidate it.
    fn unmap(&mut self) {
        if let Some(m) = self.mapping.take() {
            let mem = m.memory().clone();
            drop(m);
            mem.invalidate();
        }
    }

    /// `ibv_dereg_mr`, with its error; a raw region is then invalidated.
    pub(crate) fn deregister(mut self) -> Result<()> {
        // SAFETY: registered by `ibv_reg_mr_iova2`, deregistered once.
        check("ibv_dereg_mr", unsafe {
            ffi::ibv_dereg_mr(self.mr.as_ptr())
        })?;
        self.freed = true;
        self.unmap();
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `deregister`.
            let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
            if rc != 0 {
                // The device may still reach the bytes: keep them alive
                // and device-safe for the rest of the process rather than
                // hand them back.
                std::mem::forget(self.mapping.take());
                return;
            }
        }
        self.unmap();
    }
}

fn ffi_ah_attr(r: &RawAh) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: r.dgid },
            flow_label: r.flow_label,
            sgid_index: r.sgid_index,
            hop_limit: r.hop_limit,
            traffic_class: r.traffic_class,
        },
        dlid: r.dlid,
        sl: r.sl,
        src_path_bits: r.src_path_bits,
        static_rate: r.static_rate,
        is_global: u8::from(r.is_global),
        port_num: r.port,
    }
}

fn raw_ah_of(a: &ffi::ibv_ah_attr) -> RawAh {
    RawAh {
        // SAFETY: every member of the GID union is 16 plain bytes.
        dgid: unsafe { a.grh.dgid.raw },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port: a.port_num,
    }
}

/// An address handle (`ibv_create_ah`), destroyed on drop.
pub(crate) struct Ah {
    ah: NonNull<ffi::ibv_ah>,
    freed: bool,
    _pd: Arc<Pd>,
}

// SAFETY: tied to no thread; destroyed by `destroy(self)` or `Drop`
// (exclusive). `&Ah` only lends the pointer to `ibv_post_send`, which
// reads the AH (thread safe).
unsafe impl Send for Ah {}
// SAFETY: as above.
unsafe impl Sync for Ah {}

impl Ah {
    /// `ibv_create_ah`.
    pub(crate) fn new(pd: &Arc<Pd>, attr: &RawAh) -> Result<Ah> {
        let mut a = ffi_ah_attr(attr);
        // SAFETY: the PD is live; `a` is a valid attribute struct.
        let ah = unsafe { ffi::ibv_create_ah(pd.pd.as_ptr(), &mut a) };
        NonNull::new(ah)
            .map(|ah| Ah {
                ah,
                freed: false,
                _pd: pd.clone(),
            })
            .ok_or_else(|| errno_error("ibv_create_ah", last_errno()))
    }

    /// `ibv_destroy_ah`, with its error.
    pub(crate) fn destroy(mut self) -> Result<()> {
        // SAFETY: created by `ibv_create_ah`, destroyed once.
        check("ibv_destroy_ah", unsafe {
            ffi::ibv_destroy_ah(self.ah.as_ptr())
        })?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `destroy`.
            let _ = unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
        }
    }
}

/// Scatter lists and receive requests in libibverbs' layout, built from
/// the provider interface's (the `ibv_sge` arrays must outlive the post).
fn recv_wrs(wrs: &[RecvWr<'_>]) -> (Vec<Vec<ffi::ibv_sge>>, Vec<ffi::ibv_recv_wr>) {
    let mut sges: Vec<Vec<ffi::ibv_sge>> = wrs.iter().map(|w| ffi_sges(w.sg_list)).collect();
    let mut out: Vec<ffi::ibv_recv_wr> = wrs
        .iter()
        .zip(sges.iter_mut())
        .map(|(w, s)| ffi::ibv_recv_wr {
            wr_id: w.wr_id,
            next: std::ptr::null_mut(),
            sg_list: s.as_mut_ptr(),
            num_sge: s.len() as c_int,
        })
        .collect();
    let base = out.as_mut_ptr();
    for i in 1..out.len() {
        // SAFETY: `i < out.len()`: a pointer to the next element of the
        // same vector, which is not resized after this.
        out[i - 1].next = unsafe { base.add(i) };
    }
    (sges, out)
}

fn ffi_sges(sg: &[Sge]) -> Vec<ffi::ibv_sge> {
    sg.iter()
        .map(|s| ffi::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect()
}

/// The index of `bad` in the chain starting at `base` (what libibverbs
/// says failed), or `len` if it is not one of them.
fn index_of<T>(base: *const T, len: usize, bad: *const T) -> usize {
    (0..len)
        .find(|&i| base.wrapping_add(i) == bad)
        .unwrap_or(len)
}

/// A post's outcome: on failure, the index of the first request not
/// posted (the ones before it are) and the error naming it.
pub(crate) type PostResult = std::result::Result<(), (usize, al::Error)>;

/// A post failure naming the request: "call: request i of n: <errno>".
fn post_error(call: &str, rc: c_int, i: usize, n: usize) -> al::Error {
    let errno = if rc > 0 { rc } else { last_errno() };
    errno_error(&format!("{call}: request {i} of {n}"), errno)
}

/// A shared receive queue (`ibv_create_srq`), destroyed on drop.
pub(crate) struct Srq {
    srq: NonNull<ffi::ibv_srq>,
    freed: bool,
    _pd: Arc<Pd>,
}

// SAFETY: tied to no thread; destroyed by `destroy(self)` or `Drop`
// (exclusive). Through `&Srq` only `ibv_post_srq_recv`, thread safe (the
// driver library locks the queue).
unsafe impl Send for Srq {}
// SAFETY: as above.
unsafe impl Sync for Srq {}

impl Srq {
    /// `ibv_create_srq`.
    pub(crate) fn new(pd: &Arc<Pd>, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live; `init` is valid and may be written (the
        // call reports the sizes it gave back into it).
        let srq = unsafe { ffi::ibv_create_srq(pd.pd.as_ptr(), &mut init) };
        NonNull::new(srq)
            .map(|srq| Srq {
                srq,
                freed: false,
                _pd: pd.clone(),
            })
            .ok_or_else(|| errno_error("ibv_create_srq", last_errno()))
    }

    /// `ibv_post_srq_recv`; on failure the requests before the failing one
    /// are posted, and the error is that index and an error naming it.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> PostResult {
        if wrs.is_empty() {
            return Ok(());
        }
        let (_sges, mut chain) = recv_wrs(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live; the chain and its scatter lists are
        // valid for the call (the device copies them into its queue).
        let rc = unsafe { ffi::ibv_post_srq_recv(self.srq.as_ptr(), chain.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let i = index_of(chain.as_ptr(), chain.len(), bad);
        Err((i, post_error("ibv_post_srq_recv", rc, i, wrs.len())))
    }

    /// `ibv_destroy_srq`, with its error.
    pub(crate) fn destroy(mut self) -> Result<()> {
        // SAFETY: created by `ibv_create_srq`; every QP on it holds an
        // `Arc<Srq>`, so none is left; destroyed once.
        check("ibv_destroy_srq", unsafe {
            ffi::ibv_destroy_srq(self.srq.as_ptr())
        })?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `destroy`.
            let _ = unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
        }
    }
}

/// What [`Qp::new`] is asked for.
pub(crate) struct QpCreate<'a> {
    pub(crate) qp_type: u32,
    pub(crate) send_cq: &'a Arc<Cq>,
    pub(crate) recv_cq: &'a Arc<Cq>,
    pub(crate) srq: Option<&'a Arc<Srq>>,
    pub(crate) caps: [u32; 4],
    pub(crate) sq_sig_all: bool,
}

/// One send request in libibverbs' terms: the interface's request with
/// its address handle resolved (UD).
pub(crate) struct SendReq<'a> {
    pub(crate) wr_id: u64,
    pub(crate) opcode: u32,
    pub(crate) flags: u32,
    pub(crate) op: SendOp,
    pub(crate) sg_list: &'a [Sge],
    pub(crate) ud: Option<(&'a Ah, u32, u32)>,
}

/// A queue pair (`ibv_create_qp`), destroyed on drop.
pub(crate) struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    freed: bool,
    _srq: Option<Arc<Srq>>,
    _recv_cq: Arc<Cq>,
    _send_cq: Arc<Cq>,
    _pd: Arc<Pd>,
}

// SAFETY: tied to no thread; destroyed by `destroy(self)` or `Drop`
// (exclusive). Through `&Qp`: `ibv_post_send`, `ibv_post_recv`,
// `ibv_modify_qp`, `ibv_query_qp` (thread safe: the driver library locks
// each queue, the kernel serialises modify and query), `qp_num` (a field
// fixed at creation) and `key` (the pointer's value).
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    /// `ibv_create_qp`; returns the QP and the capacities the device gave.
    pub(crate) fn new(pd: &Arc<Pd>, c: &QpCreate<'_>) -> Result<(Qp, [u32; 4])> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: c.send_cq.cq.as_ptr(),
            recv_cq: c.recv_cq.cq.as_ptr(),
            srq: c.srq.map_or(std::ptr::null_mut(), |s| s.srq.as_ptr()),
            cap: ffi::ibv_qp_cap {
                max_send_wr: c.caps[0],
                max_recv_wr: c.caps[1],
                max_send_sge: c.caps[2],
                max_recv_sge: c.caps[3],
                max_inline_data: 0,
            },
            qp_type: c.qp_type,
            sq_sig_all: c_int::from(c.sq_sig_all),
        };
        // SAFETY: the PD, CQs and SRQ are live and stay so (the QP holds
        // their Arcs); `init` is valid and receives the granted caps.
        let qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| errno_error("ibv_create_qp", last_errno()))?;
        let caps = [
            init.cap.max_send_wr,
            init.cap.max_recv_wr,
            init.cap.max_send_sge,
            init.cap.max_recv_sge,
        ];
        Ok((
            Qp {
                qp,
                freed: false,
                _srq: c.srq.cloned(),
                _recv_cq: c.recv_cq.clone(),
                _send_cq: c.send_cq.clone(),
                _pd: pd.clone(),
            },
            caps,
        ))
    }

    /// The QP's identity in asynchronous events ([`AsyncKind::key`]).
    pub(crate) fn key(&self) -> usize {
        self.qp.as_ptr() as usize
    }

    /// The QP number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is set at creation.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp` with the attributes `mask` names.
    pub(crate) fn modify(&self, r: &RawQpAttr, mask: u32) -> Result<()> {
        // SAFETY: all-zero is a valid `ibv_qp_attr` (integers and AH
        // structs of integers and a byte union).
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = r.state;
        a.cur_qp_state = r.cur_state;
        a.path_mtu = r.path_mtu;
        a.path_mig_state = r.mig_state;
        a.qkey = r.qkey;
        a.rq_psn = r.rq_psn;
        a.sq_psn = r.sq_psn;
        a.dest_qp_num = r.dest_qpn;
        a.qp_access_flags = r.access;
        a.ah_attr = ffi_ah_attr(&r.ah);
        a.alt_ah_attr = ffi_ah_attr(&r.alt_ah);
        a.pkey_index = r.pkey_index;
        a.alt_pkey_index = r.pkey_index;
        a.en_sqd_async_notify = r.en_sqd_async_notify;
        a.max_rd_atomic = r.max_rd_atomic;
        a.max_dest_rd_atomic = r.max_dest_rd_atomic;
        a.min_rnr_timer = r.min_rnr_timer;
        a.port_num = r.port;
        a.timeout = r.timeout;
        a.retry_cnt = r.retry_cnt;
        a.rnr_retry = r.rnr_retry;
        a.alt_port_num = r.alt_port;
        a.alt_timeout = r.alt_timeout;
        // SAFETY: the QP is live; `a` is valid; the mask names only bits of
        // `enum ibv_qp_attr_mask`.
        check("ibv_modify_qp", unsafe {
            ffi::ibv_modify_qp(self.qp.as_ptr(), &mut a, mask as c_int)
        })
    }

    /// `ibv_query_qp` of every attribute.
    pub(crate) fn query(&self) -> Result<RawQpAttr> {
        // SAFETY: all-zero is valid for both structs (integers, pointers
        // that may be NULL, unions of integers).
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; both out-structs are valid.
        check("ibv_query_qp", unsafe {
            ffi::ibv_query_qp(
                self.qp.as_ptr(),
                &mut a,
                qp_mask::QUERY_ALL as c_int,
                &mut init,
            )
        })?;
        Ok(raw_qp_attr_of(&a))
    }

    /// `ibv_post_send`; on failure the requests before the failing one are
    /// posted and the error names its index.
    pub(crate) fn post_send(&self, reqs: &[SendReq<'_>]) -> PostResult {
        if reqs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<Vec<ffi::ibv_sge>> = reqs.iter().map(|r| ffi_sges(r.sg_list)).collect();
        let mut chain: Vec<ffi::ibv_send_wr> = Vec::with_capacity(reqs.len());
        for (r, s) in reqs.iter().zip(sges.iter_mut()) {
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL
            // pointers, unions of those).
            let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = r.wr_id;
            w.sg_list = s.as_mut_ptr();
            w.num_sge = s.len() as c_int;
            w.opcode = r.opcode;
            w.send_flags = r.flags;
            match r.op {
                SendOp::Send | SendOp::Read { .. } | SendOp::Write { .. } => {}
                SendOp::SendImm(imm) | SendOp::WriteImm { imm, .. } => {
                    w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {}
            }
            match r.op {
                SendOp::Write {
                    remote_addr, rkey, ..
                }
                | SendOp::WriteImm {
                    remote_addr, rkey, ..
                }
                | SendOp::Read { remote_addr, rkey } => {
                    w.wr.rdma = ffi::rdma_t { remote_addr, rkey };
                }
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => {
                    w.wr.atomic = ffi::atomic_t {
                        remote_addr,
                        compare_add: compare,
                        swap,
                        rkey,
                    };
                }
                SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    w.wr.atomic = ffi::atomic_t {
                        remote_addr,
                        compare_add: add,
                        swap: 0,
                        rkey,
                    };
                }
                SendOp::Send | SendOp::SendImm(_) => {}
            }
            if let Some((ah, remote_qpn, remote_qkey)) = r.ud {
                w.wr.ud = ffi::ud_t {
                    ah: ah.ah.as_ptr(),
                    remote_qpn,
                    remote_qkey,
                };
            }
            chain.push(w);
        }
        let base = chain.as_mut_ptr();
        for i in 1..chain.len() {
            // SAFETY: `i < chain.len()`; the vector is not resized after.
            chain[i - 1].next = unsafe { base.add(i) };
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain, its scatter lists and the AHs
        // it names (borrowed by `reqs`) are valid for the call; the device
        // copies the requests (and the AH's address) into its queue.
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), chain.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let i = index_of(chain.as_ptr(), chain.len(), bad);
        Err((i, post_error("ibv_post_send", rc, i, reqs.len())))
    }

    /// `ibv_post_recv`, with the same partial-failure rule.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> PostResult {
        if wrs.is_empty() {
            return Ok(());
        }
        let (_sges, mut chain) = recv_wrs(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain and its scatter lists are
        // valid for the call.
        let rc = unsafe { ffi::ibv_post_recv(self.qp.as_ptr(), chain.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let i = index_of(chain.as_ptr(), chain.len(), bad);
        Err((i, post_error("ibv_post_recv", rc, i, wrs.len())))
    }

    /// `ibv_destroy_qp`, with its error.
    pub(crate) fn destroy(mut self) -> Result<()> {
        // SAFETY: created by `ibv_create_qp`, destroyed once.
        check("ibv_destroy_qp", unsafe {
            ffi::ibv_destroy_qp(self.qp.as_ptr())
        })?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: as in `destroy`.
            let _ = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{atomic_cap, link_layer, mtu, port_state, wc_status};

    /// The codes of `convert` (written from `verbs.h`) are the values
    /// rdma-sys generated from the installed headers.
    #[test]
    fn convert_codes_match_the_installed_headers() {
        assert_eq!(mtu::MTU_256, ffi::ibv_mtu::IBV_MTU_256);
        assert_eq!(mtu::MTU_4096, ffi::ibv_mtu::IBV_MTU_4096);
        assert_eq!(port_state::NOP, ffi::ibv_port_state::IBV_PORT_NOP);
        assert_eq!(port_state::ACTIVE, ffi::ibv_port_state::IBV_PORT_ACTIVE);
        assert_eq!(
            port_state::ACTIVE_DEFER,
            ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER
        );
        assert_eq!(atomic_cap::GLOB, ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB);
        assert_eq!(wc_status::SUCCESS, ffi::ibv_wc_status::IBV_WC_SUCCESS);
        assert_eq!(
            wc_status::WR_FLUSH_ERR,
            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
        );
        assert_eq!(
            wc_status::RNR_RETRY_EXC_ERR,
            ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
        );
        assert_eq!(
            wc_status::GENERAL_ERR,
            ffi::ibv_wc_status::IBV_WC_GENERAL_ERR
        );
        // The link-layer codes are an anonymous enum rdma-sys does not
        // bind; their order in verbs.h is UNSPECIFIED, INFINIBAND, ETHERNET.
        assert_eq!(
            (
                link_layer::UNSPECIFIED,
                link_layer::INFINIBAND,
                link_layer::ETHERNET
            ),
            (0, 1, 2)
        );
    }

    /// The verbs codes of `convert` against the installed headers.
    #[test]
    fn verbs_codes_match_the_installed_headers() {
        use crate::convert::{
            qp_state_code, qp_type_code, send_flags, wc_flags, wc_opcode, wr_opcode,
        };
        assert_eq!(wc_opcode::SEND, ffi::ibv_wc_opcode::IBV_WC_SEND);
        assert_eq!(wc_opcode::FETCH_ADD, ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD);
        assert_eq!(wc_opcode::RECV, ffi::ibv_wc_opcode::IBV_WC_RECV);
        assert_eq!(
            wc_opcode::RECV_RDMA_WITH_IMM,
            ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
        );
        assert_eq!(wc_flags::GRH, ffi::ibv_wc_flags::IBV_WC_GRH.0);
        assert_eq!(wc_flags::WITH_IMM, ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0);
        assert_eq!(wr_opcode::RDMA_WRITE, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(
            wr_opcode::SEND_WITH_IMM,
            ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        );
        assert_eq!(
            wr_opcode::ATOMIC_FETCH_AND_ADD,
            ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD
        );
        assert_eq!(
            send_flags::SIGNALED,
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        );
        assert_eq!(
            send_flags::SOLICITED,
            ffi::ibv_send_flags::IBV_SEND_SOLICITED.0
        );
        assert_eq!(qp_state_code::ERR, ffi::ibv_qp_state::IBV_QPS_ERR);
        assert_eq!(qp_state_code::SQE, ffi::ibv_qp_state::IBV_QPS_SQE);
        assert_eq!(qp_type_code::UD, ffi::ibv_qp_type::IBV_QPT_UD);
        assert_eq!(qp_mask::STATE, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0);
        assert_eq!(qp_mask::ALT_PATH, ffi::ibv_qp_attr_mask::IBV_QP_ALT_PATH.0);
        assert_eq!(qp_mask::DEST_QPN, ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN.0);
        assert_eq!(
            qp_mask::MAX_DEST_RD_ATOMIC,
            ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
        );
        assert_eq!(
            provider::Access::REMOTE_ATOMIC.bits(),
            ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
        );
        assert_eq!(
            provider::Access::LOCAL_WRITE.bits(),
            ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        );
    }

    /// Our asynchronous event codes and names (`events`) against the
    /// installed headers and `ibv_event_type_str`.
    #[test]
    fn event_codes_and_names_match_the_installed_headers() {
        use crate::events::{event_code::*, event_name};
        use ffi::ibv_event_type as t;
        let codes = [
            (CQ_ERR, t::IBV_EVENT_CQ_ERR),
            (QP_FATAL, t::IBV_EVENT_QP_FATAL),
            (QP_REQ_ERR, t::IBV_EVENT_QP_REQ_ERR),
            (QP_ACCESS_ERR, t::IBV_EVENT_QP_ACCESS_ERR),
            (COMM_EST, t::IBV_EVENT_COMM_EST),
            (SQ_DRAINED, t::IBV_EVENT_SQ_DRAINED),
            (PATH_MIG, t::IBV_EVENT_PATH_MIG),
            (PATH_MIG_ERR, t::IBV_EVENT_PATH_MIG_ERR),
            (DEVICE_FATAL, t::IBV_EVENT_DEVICE_FATAL),
            (PORT_ACTIVE, t::IBV_EVENT_PORT_ACTIVE),
            (PORT_ERR, t::IBV_EVENT_PORT_ERR),
            (LID_CHANGE, t::IBV_EVENT_LID_CHANGE),
            (PKEY_CHANGE, t::IBV_EVENT_PKEY_CHANGE),
            (SM_CHANGE, t::IBV_EVENT_SM_CHANGE),
            (SRQ_ERR, t::IBV_EVENT_SRQ_ERR),
            (SRQ_LIMIT_REACHED, t::IBV_EVENT_SRQ_LIMIT_REACHED),
            (QP_LAST_WQE_REACHED, t::IBV_EVENT_QP_LAST_WQE_REACHED),
            (CLIENT_REREGISTER, t::IBV_EVENT_CLIENT_REREGISTER),
            (GID_CHANGE, t::IBV_EVENT_GID_CHANGE),
            (WQ_FATAL, t::IBV_EVENT_WQ_FATAL),
        ];
        for (ours, theirs) in codes {
            assert_eq!(ours, theirs as u32);
            // SAFETY: `ibv_event_type_str` returns a static string for
            // every code of the enum.
            let s = unsafe { CStr::from_ptr(ffi::ibv_event_type_str(theirs)) };
            assert_eq!(s.to_str().unwrap(), event_name(ours), "code {ours}");
        }
    }

    #[test]
    fn listing_never_panics_and_an_error_names_the_call() {
        match DeviceList::get() {
            Ok(list) => assert_eq!(list.iter().count(), list.len()),
            Err(errno) => assert!(errno > 0, "errno {errno}"),
        }
    }
}
