//! Queue pairs and shared receive queues: creating them, modifying and
//! querying QPs (`ibv_qp_attr` both ways), and posting sends and receives.

use al::sync::Arc;
use std::os::raw::c_int;
use std::ptr::NonNull;

use al::Result;
use provider::{RecvWr, SendOp, Sge};
use rdma_sys as ffi;

use super::ah::{ffi_ah_attr, raw_ah_of, Ah};
use super::cq::Cq;
use super::device::{check, last_errno};
use super::mr::Pd;
use crate::convert::{errno_error, qp_mask, RawQpAttr};

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
