//! Completion queues and their completion channels (`ibv_create_cq`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_get_cq_event`), and waiting on
//! several channels' fds at once ([`poll_readable`]).

use al::sync::Arc;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::ptr::NonNull;

use al::Result;
use rdma_sys as ffi;

use super::device::{check, last_errno, Context};
use crate::convert::{errno_error, RawWc};

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

/// A completion queue (`ibv_create_cq`) on a completion channel, destroyed
/// on drop.
pub(crate) struct Cq {
    pub(super) cq: NonNull<ffi::ibv_cq>,
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
