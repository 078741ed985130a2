//! The two RC QPs the verbs benchmarks run between: one on each HCA of
//! the default fabric, brought to RTS by hand, each with a PD, a CQ and
//! registered memory; and the constants both benchmarks share.

use std::time::Duration;

use al::{Al, Handle};
use hca::verbs::{self, Cq, Pd};
use ibal::verbs::SoftProvider;
use provider::RegisteredBuffer;
use provider::{Access, AvAttr, Mtu, QpCaps, QpModify, QpState, QpType};
use qp::{create_qp, modify_qp, Qp, QpCreate};

use ibal_testkit::devices;

use crate::{al_err, BenchResult};

/// The write-bw target: ibal bandwidth at least this fraction of memcpy's.
pub const WRITE_BW_TARGET: f64 = 0.8;
/// The send-rate target: ibal message rate at least this multiple of mpsc's.
pub const SEND_RATE_TARGET: f64 = 1.0;
/// Payload of send-rate messages, in bytes.
pub const MSG_SIZE: usize = 64;
/// write-bw's default completion moderation: one signaled WRITE in 16.
pub const WRITE_SIGNAL_EVERY: u32 = 16;

/// Send queue depth of the benchmark QPs (bounds `signal_every`).
pub const SQ_DEPTH: u32 = 64;
/// Bytes moved per round per size when `iters` is not given.
pub const AUTO_BYTES_PER_ROUND: u64 = 256 << 20;
/// Largest message size accepted (the MR and `Sge::length` limit is u32).
pub const MAX_SIZE: usize = 1 << 30;

pub(super) struct Side {
    pub(super) pd: Handle<Pd>,
    pub(super) cq: Handle<Cq>,
    pub(super) lid: u16,
}

/// One RC QP on each HCA of the default fabric, connected by hand.
pub(super) struct RcPair {
    pub(super) al: Al,
    pub(super) a: Side,
    pub(super) b: Side,
    pub(super) qa: Handle<Qp>,
    pub(super) qb: Handle<Qp>,
    // Keeps the fabric alive for the run.
    pub(super) _provider: SoftProvider,
}

impl RcPair {
    pub(super) fn open() -> BenchResult<RcPair> {
        let provider = devices::default_provider();
        let al = Al::open().map_err(al_err("opening the AL"))?;
        let side = |i: usize| -> BenchResult<Side> {
            let guid = devices::DEFAULT_NODE_GUIDS[i];
            let ca = verbs::open_ca(al.instance(), &provider, guid).map_err(al_err("open_ca"))?;
            let pd = verbs::alloc_pd(al.instance(), ca).map_err(al_err("alloc_pd"))?;
            let cq = verbs::create_cq(al.instance(), ca, 256, None, None)
                .map_err(al_err("create_cq"))?;
            Ok(Side {
                pd,
                cq,
                lid: devices::DEFAULT_LIDS[i],
            })
        };
        let (a, b) = (side(0)?, side(1)?);
        let rc_qp = |s: &Side| {
            create_qp(
                al.instance(),
                s.pd,
                QpCreate {
                    caps: QpCaps {
                        max_send_wr: SQ_DEPTH,
                        ..QpCaps::default()
                    },
                    ..QpCreate::new(QpType::Rc, s.cq)
                },
            )
            .map_err(al_err("create_qp"))
        };
        let (qa, qb) = (rc_qp(&a)?, rc_qp(&b)?);
        let qpn = |q: Handle<Qp>| -> BenchResult<u32> {
            Ok(al.resolve(q).map_err(al_err("resolving a QP"))?.qpn())
        };
        let (qpn_a, qpn_b) = (qpn(qa)?, qpn(qb)?);
        // a sends with PSN 0x100 and expects 0x200; b the reverse.
        to_rts(&al, qa, b.lid, qpn_b, 0x200, 0x100)?;
        to_rts(&al, qb, a.lid, qpn_a, 0x100, 0x200)?;
        Ok(RcPair {
            al,
            a,
            b,
            qa,
            qb,
            _provider: provider,
        })
    }

    /// Register all of `buf` in `pd` (iova 0); returns (lkey, rkey).
    pub(super) fn register(
        &self,
        pd: Handle<Pd>,
        buf: &RegisteredBuffer,
        access: Access,
    ) -> BenchResult<(u32, u32)> {
        let h = verbs::register_mr(self.al.instance(), pd, buf, 0, buf.len(), 0, access)
            .map_err(al_err("register_mr"))?;
        let mr = self.al.resolve(h).map_err(al_err("resolving an MR"))?;
        Ok((mr.lkey(), mr.rkey()))
    }

    /// Close the AL (destroying every object) and insist nothing is left.
    pub(super) fn close(self) -> BenchResult<()> {
        let stats = self.al.close().map_err(al_err("closing the AL"))?;
        if stats.is_clean() {
            Ok(())
        } else {
            Err(format!("the AL closed with live objects: {stats}"))
        }
    }
}

pub(super) fn to_rts(
    al: &Al,
    qp: Handle<Qp>,
    dlid: u16,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
) -> BenchResult<()> {
    let steps = [
        QpModify::to(QpState::Init)
            .pkey_index(0)
            .port(1)
            .access(Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        QpModify::to(QpState::Rtr)
            .av(AvAttr::lid(1, dlid))
            .path_mtu(Mtu::Mtu4096)
            .dest_qpn(dest_qpn)
            .rq_psn(rq_psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12),
        QpModify::to(QpState::Rts)
            .sq_psn(sq_psn)
            .timeout(14)
            .retry_cnt(7)
            .rnr_retry(7)
            .max_rd_atomic(1),
    ];
    for m in &steps {
        modify_qp(al, qp, m).map_err(al_err("modify_qp"))?;
    }
    Ok(())
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(super) fn gb_per_sec(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9
}
