//! One side's verbs objects for qp-exchange (a RoCE CA, PD, CQ, RC or UD
//! QP, the message buffer and the WRITE buffer) and the QP's moves to RTR
//! and RTS with the tools' attributes.

use std::hash::BuildHasher;
use std::time::Instant;

use ibal::prelude::*;
use ibal::roce::RoceProvider;

use super::config::QpxConfig;
use crate::oob::{self, Dest};

pub(super) const RECV_WRID: u64 = 1;
pub(super) const SEND_WRID: u64 = 2;
pub(super) const WRITE_IOVA: u64 = 0x1000_0000;

/// A u32 that differs between runs (our PSN, pattern seed and GUID).
pub(super) fn random_u32() -> u32 {
    let h = std::collections::hash_map::RandomState::new()
        .hash_one((std::process::id(), Instant::now()));
    (h ^ (h >> 32)) as u32
}

/// The objects of one side.
pub(super) struct Side {
    pub(super) ca: Handle<Ca>,
    pub(super) pd: Handle<Pd>,
    pub(super) cq: Handle<Cq>,
    pub(super) qp: Handle<Qp>,
    pub(super) mr: Handle<Mr>,
    pub(super) wmr: Handle<Mr>,
    pub(super) av: Option<Handle<Av>>,
    pub(super) buf: RegisteredBuffer,
    pub(super) wbuf: RegisteredBuffer,
    pub(super) lkey: u32,
    pub(super) wlkey: u32,
    pub(super) wrkey: u32,
}

/// Buffer layout: [send area: size][receive area: (40 +) size][WRITE
/// source: size].
pub(super) struct Layout {
    pub(super) size: usize,
    pub(super) recv_at: usize,
    pub(super) recv_len: usize,
    pub(super) wsrc_at: usize,
    pub(super) total: usize,
}

impl Layout {
    pub(super) fn new(size: usize, ud: bool) -> Layout {
        let recv_len = size + if ud { oob::GRH_BYTES } else { 0 };
        Layout {
            size,
            recv_at: size,
            recv_len,
            wsrc_at: size + recv_len,
            total: 2 * size + recv_len,
        }
    }
}

/// Opens the CA on our RoCEv2 port and creates the side's objects, the QP
/// in INIT with the access the run needs.
pub(super) fn open_side(
    al: &Al,
    provider: &RoceProvider,
    guid: u64,
    cfg: &QpxConfig,
    lay: &Layout,
) -> Result<Side, Error> {
    let ca = al.open_ca(provider, guid).map_err(|err| {
        Error::Other(
            format!(
                "cannot open the RoCE port on {}:{}: {err}",
                cfg.local, cfg.udp_port
            )
            .into(),
        )
    })?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq(al, cfg.rx_depth + 8)?;
    let caps = provider::QpCaps {
        max_send_wr: 4,
        max_recv_wr: cfg.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let qp_type = if cfg.ud { QpType::Ud } else { QpType::Rc };
    let qp = pd.create_qp(
        al,
        QpCreate {
            caps,
            ..QpCreate::new(qp_type, cq)
        },
    )?;
    let buf = RegisteredBuffer::new(lay.total);
    let mr = pd.register(al, &buf, Access::LOCAL_WRITE)?;
    let (lkey, _) = mr.keys(al)?;
    // With --rdma-bulk: [WRITE target / our WRITE source: bulk][READ
    // source / our READ sink: bulk], open to the peer for both.
    let (wlen, waccess) = match cfg.bulk {
        Some(b) => (
            2 * b,
            Access::LOCAL_WRITE
                .union(Access::REMOTE_WRITE)
                .union(Access::REMOTE_READ),
        ),
        None => (lay.size, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)),
    };
    let wbuf = RegisteredBuffer::new(wlen);
    let wmr = pd.register_range(al, &wbuf, 0, wlen, WRITE_IOVA, waccess)?;
    let (wlkey, wrkey) = wmr.keys(al)?;
    let mut init = QpModify::to(QpState::Init).pkey_index(0).port(1);
    init = if cfg.ud {
        init.qkey(oob::UD_QKEY)
    } else if cfg.bulk.is_some() {
        init.access(Access::REMOTE_WRITE.union(Access::REMOTE_READ))
    } else if cfg.write {
        init.access(Access::REMOTE_WRITE)
    } else {
        init.access(Access::NONE)
    };
    qp.modify(al, &init)?;
    Ok(Side {
        ca,
        pd,
        cq,
        qp,
        mr,
        wmr,
        av: None,
        buf,
        wbuf,
        lkey,
        wlkey,
        wrkey,
    })
}

/// RTR and RTS with the tools' attributes (RC), or plain RTR/RTS and an
/// address vector to the peer (UD).
pub(super) fn connect_qp(
    al: &Al,
    side: &mut Side,
    cfg: &QpxConfig,
    me: &Dest,
    peer: &Dest,
) -> Result<(), String> {
    let e = |err: Error| err.to_string();
    if !oob::has_interface_id(&peer.gid) {
        return Err(format!(
            "the peer sent GID {} (no interface id): a RoCE peer must send its GID (run ibv_*_pingpong with -g INDEX)",
            std::net::Ipv6Addr::from(peer.gid)
        ));
    }
    let av = AvAttr {
        port: 1,
        dlid: peer.lid,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        grh: Some(provider::GrhAttr {
            dgid: peer.gid,
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 1,
            traffic_class: 0,
        }),
    };
    if cfg.ud {
        side.qp.modify(al, &QpModify::to(QpState::Rtr)).map_err(e)?;
        side.qp
            .modify(al, &QpModify::to(QpState::Rts).sq_psn(me.psn))
            .map_err(e)?;
        side.av = Some(side.pd.create_av(al, av).map_err(e)?);
    } else {
        let rtr = QpModify::to(QpState::Rtr)
            .av(av)
            .path_mtu(cfg.mtu)
            .dest_qpn(peer.qpn)
            .rq_psn(peer.psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12);
        side.qp.modify(al, &rtr).map_err(e)?;
        let rts = QpModify::to(QpState::Rts)
            .timeout(cfg.ack_timeout)
            .retry_cnt(cfg.retry_cnt)
            .rnr_retry(7)
            .sq_psn(me.psn)
            .max_rd_atomic(1);
        side.qp.modify(al, &rts).map_err(e)?;
    }
    Ok(())
}
