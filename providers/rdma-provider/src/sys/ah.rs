//! Address handles (`ibv_create_ah`) and the `ibv_ah_attr` they are made
//! from.

use al::sync::Arc;
use std::ptr::NonNull;

use al::Result;
use rdma_sys as ffi;

use super::device::{check, last_errno};
use super::mr::Pd;
use crate::convert::{errno_error, RawAh};

pub(super) fn ffi_ah_attr(r: &RawAh) -> ffi::ibv_ah_attr {
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

pub(super) fn raw_ah_of(a: &ffi::ibv_ah_attr) -> RawAh {
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
    pub(super) ah: NonNull<ffi::ibv_ah>,
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
