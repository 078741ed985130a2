//! Devices: listing them (`ibv_get_device_list`), opening one
//! (`ibv_open_device`) and its queries and asynchronous events; and the
//! errno of a failed call as an error ([`check`]).

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::ptr::NonNull;

use al::Result;
use rdma_sys as ffi;

use crate::convert::{errno_error, RawDeviceAttr, RawPortAttr};
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
    pub(super) ctx: NonNull<ffi::ibv_context>,
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
