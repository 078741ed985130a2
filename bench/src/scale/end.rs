//! One end of the run: an AL with one CA, the CM attached to its port, a
//! PD, one CQ every connection of the end shares, and the 128-byte buffer
//! of the ping-pong (send at 0, receive at [`MSG`]).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use al::{Al, Handle, Stats};
use cep::cm::{self, CmPort};
use hca::any::AnyProvider;
use hca::verbs::{Ca, Cq, Pd};
use ibal::prelude::*;
use ibal::roce::{DeviceConfig, PortConfig};
use provider::QpCaps;

use super::config::{MSG, QUEUE_DEPTH};
use crate::{al_err, BenchResult};

/// Node GUIDs of the two ends' devices (soft HCAs or RoCEv2 devices).
pub(crate) const GUIDS: [u64; 2] = [0x0249_4241_4c53_4301, 0x0249_4241_4c53_4302];
/// LIDs of the two soft HCAs' ports.
pub(crate) const LIDS: [u16; 2] = [1, 2];
/// The two ends' addresses over RoCEv2 (the listener is the second).
pub(crate) const ADDRS: [&str; 2] = ["127.0.0.1", "127.0.0.2"];

/// QPs a device must allow for `connections` connections: one per
/// connection and the special QPs, with head room.
fn qps_for(connections: u32) -> u32 {
    connections.saturating_add(64)
}

/// The soft fabric of the run: two HCAs whose limits take `connections`
/// QPs each.
pub(crate) fn soft_provider(connections: u32) -> BenchResult<SoftProvider> {
    let fabric = Fabric::new();
    for (guid, lid) in GUIDS.into_iter().zip(LIDS) {
        let mut cfg = HcaConfig::new(guid, &[lid]);
        cfg.name = format!("scale{lid}");
        cfg.limits.max_qp = cfg.limits.max_qp.max(qps_for(connections));
        fabric.add_hca(cfg).map_err(al_err("adding a soft HCA"))?;
    }
    Ok(SoftProvider::new(fabric))
}

/// A RoCEv2 device on `ip` (ephemeral UDP port) whose limits take
/// `connections` QPs.
pub(crate) fn roce_device(idx: usize, ip: IpAddr, connections: u32) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(
        format!("scale{idx}"),
        GUIDS[idx],
        vec![PortConfig::new(SocketAddr::new(ip, 0))],
    );
    cfg.limits.max_qp = cfg.limits.max_qp.max(qps_for(connections));
    cfg
}

/// The provider an end opens its CA on.
pub(crate) enum Net<'a> {
    Soft(&'a SoftProvider),
    Udp(&'a RoceProvider),
}

/// One end (see the module documentation).
pub(crate) struct End {
    pub(crate) al: Al,
    pub(crate) ca: Handle<Ca>,
    pub(crate) pd: Handle<Pd>,
    pub(crate) cq: Handle<Cq>,
    pub(crate) ports: Vec<Handle<CmPort>>,
    /// The ping-pong's send and receive SGEs.
    pub(crate) send_sge: [Sge; 1],
    pub(crate) recv_sge: [Sge; 1],
}

impl End {
    /// Opens device `GUIDS[idx]` of `net` with a CQ of `cq_depth`.
    pub(crate) fn open(net: Net<'_>, idx: usize, cq_depth: u32) -> BenchResult<End> {
        let al = Al::open().map_err(al_err("opening the AL"))?;
        let provider: &dyn AnyProvider = match net {
            Net::Soft(p) => p,
            Net::Udp(p) => p,
        };
        let ca =
            hca::verbs::open_ca(al.instance(), provider, GUIDS[idx]).map_err(al_err("open_ca"))?;
        let ports = cm::attach_ca(al.instance(), ca).map_err(al_err("attaching the CM"))?;
        let pd = ca.alloc_pd(al.instance()).map_err(al_err("alloc_pd"))?;
        let cq = ca
            .create_cq(al.instance(), cq_depth)
            .map_err(al_err("create_cq"))?;
        let buf = RegisteredBuffer::new(2 * MSG);
        let lkey = pd
            .register(al.instance(), &buf, Access::LOCAL_WRITE)
            .and_then(|mr| mr.keys(al.instance()))
            .map_err(al_err("registering the ping-pong buffer"))?
            .0;
        // The MR keeps the buffer's memory alive.
        let sge = |addr: u64| {
            [Sge {
                addr,
                length: MSG as u32,
                lkey,
            }]
        };
        Ok(End {
            ca,
            pd,
            cq,
            ports,
            send_sge: sge(0),
            recv_sge: sge(MSG as u64),
            al,
        })
    }

    /// A connection's RC QP: 4-deep queues, one SGE, on the end's CQ.
    pub(crate) fn rc_qp(&self) -> BenchResult<Handle<Qp>> {
        rc_qp(self.al.instance(), self.pd, self.cq)
    }

    /// The AL's live objects by kind.
    pub(crate) fn stats(&self) -> Stats {
        self.al.stats()
    }

    /// Connections the end's CM agents hold (not the listen).
    pub(crate) fn cm_connections(&self) -> usize {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok())
            .map(|p| p.stats().live_connections)
            .sum()
    }

    /// What `qp` costs the access layer and its provider (bytes).
    pub(crate) fn qp_footprint(&self, qp: Handle<Qp>) -> BenchResult<(usize, usize)> {
        let (object, provider) = self
            .al
            .resolve(qp)
            .map_err(al_err("resolving a QP"))?
            .footprint();
        Ok((object.total(), provider))
    }

    /// MADs the end's CM agents have sent (retransmissions included).
    pub(crate) fn mads_sent(&self) -> u64 {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok())
            .map(|p| p.stats().mads_sent)
            .sum()
    }

    /// Closes the AL: how long it took and what it left live.
    pub(crate) fn close(self) -> BenchResult<(Duration, Stats)> {
        let start = Instant::now();
        let stats = self.al.close().map_err(al_err("closing the AL"))?;
        Ok((start.elapsed(), stats))
    }
}

/// An RC QP with [`QUEUE_DEPTH`]-deep queues on `cq`.
pub(crate) fn rc_qp(
    al: &std::sync::Arc<al::AlInstance>,
    pd: Handle<Pd>,
    cq: Handle<Cq>,
) -> BenchResult<Handle<Qp>> {
    let caps = QpCaps {
        max_send_wr: QUEUE_DEPTH,
        max_recv_wr: QUEUE_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    pd.create_qp(al, QpCreate::new(QpType::Rc, cq).caps(caps))
        .map_err(al_err("create_qp"))
}
