//! The bare exchange and the UD MAD round trip of `perf conn-rate`: a UD
//! QP on each side of a [`Bench`] sends 256-byte MADs to the other, and
//! [`UdPair::bare_connect`] runs REQ, REP and RTU through the real codec and
//! the CM's own QP transitions with none of the CM around them.
//!
//! On the soft fabric the two sides address each other by LID; on RoCEv2
//! ports by GID (a GRH in every packet, the permissive LID in the REQ's
//! path, as the CM itself does on RoCE): [`Route`].

use std::time::{Duration, Instant};

use al::{Al, Handle};
use cep::cm::{self, ConnectRequest};
use cep::wire::{self, CmMad, CmMessage, PathInfo, Rep, Req, Rtu, TransportType};
use hca::verbs::{self, Av, Cq};
use provider::RegisteredBuffer;
use provider::{
    Access, AvAttr, GrhAttr, Mtu, QpModify, QpState, QpType, RecvWr, SendOp, SendWr, Sge, UdDest,
    Wc,
};
use qp::{create_qp, modify_qp, post_recv, post_send, Qp, QpCreate};

use super::bench::Bench;
use super::config::{GRH_SIZE, MAD_SIZE, SERVICE_ID};
use super::report::us;
use crate::{al_err, poll_one, BenchResult};

/// How the two sides of a [`UdPair`] reach each other.
#[derive(Clone, Copy, Debug)]
pub(super) struct Route {
    /// Side 0's and side 1's LID as the REQ's path names them.
    pub lids: [u16; 2],
    /// RoCEv2: side 0's and side 1's GID (packets carry a GRH); `None`
    /// on a LID-routed fabric.
    pub gids: Option<[[u8; 16]; 2]>,
    /// The REQ's path MTU: the ports' active MTU.
    pub path_mtu: Mtu,
}

impl Route {
    /// The hop limit of a GID-routed path (rdma_cm's default).
    const HOP_LIMIT: u8 = 64;

    /// The address vector side `from` sends to the other side with.
    fn av(&self, from: usize) -> AvAttr {
        let to = 1 - from;
        let mut av = AvAttr::lid(1, self.lids[to]);
        if let Some(gids) = self.gids {
            av.dlid = 0;
            av.grh = Some(GrhAttr {
                dgid: gids[to],
                sgid_index: 0,
                flow_label: 0,
                hop_limit: Self::HOP_LIMIT,
                traffic_class: 0,
            });
        }
        av
    }

    /// The REQ's primary path from side 0 to side 1.
    fn path(&self) -> PathInfo {
        let [local_gid, remote_gid] = self.gids.unwrap_or_default();
        PathInfo {
            local_lid: self.lids[0],
            remote_lid: self.lids[1],
            local_gid,
            remote_gid,
            hop_limit: if self.gids.is_some() {
                Self::HOP_LIMIT
            } else {
                0xff
            },
            subnet_local: self.gids.is_none(),
            local_ack_timeout: 14,
            ..PathInfo::default()
        }
    }
}

/// A UD QP on each HCA, with a buffer ([0, 256): send; then GRH + 256:
/// receive) and an AV to the other side.
pub(super) struct UdPair {
    route: Route,
    qps: [Handle<Qp>; 2],
    cqs: [Handle<Cq>; 2],
    avs: [Handle<Av>; 2],
    qpns: [u32; 2],
    lkeys: [u32; 2],
    pub(super) bufs: [RegisteredBuffer; 2],
}

const UD_QKEY: u32 = 0x1ba1_0c0d;

impl UdPair {
    pub(super) fn open(b: &Bench, route: Route) -> BenchResult<UdPair> {
        let inst = b.al.instance();
        let mut qps = Vec::new();
        let mut cqs = Vec::new();
        let mut avs = Vec::new();
        let mut qpns = Vec::new();
        let mut lkeys = Vec::new();
        let mut bufs = Vec::new();
        for side in 0..2 {
            let ca =
                b.al.resolve(b.pds[side])
                    .map_err(al_err("resolving a PD"))?
                    .ca()
                    .handle();
            let cq = verbs::create_cq(inst, ca, 64, None, None).map_err(al_err("create_cq"))?;
            let qp = create_qp(
                inst,
                b.pds[side],
                QpCreate {
                    sq_sig_all: true,
                    ..QpCreate::new(QpType::Ud, cq)
                },
            )
            .map_err(al_err("create a UD QP"))?;
            for m in [
                QpModify::to(QpState::Init)
                    .pkey_index(0)
                    .port(1)
                    .qkey(UD_QKEY),
                QpModify::to(QpState::Rtr),
                QpModify::to(QpState::Rts).sq_psn(0),
            ] {
                modify_qp(&b.al, qp, &m).map_err(al_err("modify a UD QP"))?;
            }
            let av =
                verbs::create_av(inst, b.pds[side], route.av(side)).map_err(al_err("create_av"))?;
            let buf = RegisteredBuffer::from_vec(
                (0..MAD_SIZE + GRH_SIZE + MAD_SIZE)
                    .map(|i| (i as u8).wrapping_mul(7).wrapping_add(side as u8))
                    .collect(),
            );
            let mr = verbs::register_mr(
                inst,
                b.pds[side],
                &buf,
                0,
                buf.len(),
                0,
                Access::LOCAL_WRITE,
            )
            .map_err(al_err("register_mr"))?;
            lkeys.push(b.al.resolve(mr).map_err(al_err("resolving an MR"))?.lkey());
            qpns.push(b.al.resolve(qp).map_err(al_err("resolving a QP"))?.qpn());
            qps.push(qp);
            cqs.push(cq);
            avs.push(av);
            bufs.push(buf);
        }
        let [b0, b1]: [RegisteredBuffer; 2] =
            bufs.try_into().map_err(|_| "two buffers".to_string())?;
        Ok(UdPair {
            route,
            qps: [qps[0], qps[1]],
            cqs: [cqs[0], cqs[1]],
            avs: [avs[0], avs[1]],
            qpns: [qpns[0], qpns[1]],
            lkeys: [lkeys[0], lkeys[1]],
            bufs: [b0, b1],
        })
    }

    /// One 256-byte SEND from `from` to the other side, received there.
    fn one_way(&self, al: &Al, from: usize, wc: &mut [Wc; 1]) -> BenchResult<()> {
        let to = 1 - from;
        let rsge = [Sge {
            addr: MAD_SIZE as u64,
            length: (GRH_SIZE + MAD_SIZE) as u32,
            lkey: self.lkeys[to],
        }];
        post_recv(
            al,
            self.qps[to],
            &[RecvWr {
                wr_id: 2,
                sg_list: &rsge,
            }],
        )
        .map_err(al_err("post_recv"))?;
        let ssge = [Sge {
            addr: 0,
            length: MAD_SIZE as u32,
            lkey: self.lkeys[from],
        }];
        let wr = SendWr::new(1, SendOp::Send, &ssge).to(UdDest {
            av: &self.avs[from],
            remote_qpn: self.qpns[to],
            remote_qkey: UD_QKEY,
            pkey_index: 0,
        });
        post_send(al, self.qps[from], &[wr]).map_err(al_err("post_send"))?;
        poll_one(al, self.cqs[from], wc)?;
        let r = poll_one(al, self.cqs[to], wc)?;
        if r.byte_len as usize != GRH_SIZE + MAD_SIZE {
            return Err(format!(
                "a UD receive of {} bytes, expected {}",
                r.byte_len,
                GRH_SIZE + MAD_SIZE
            ));
        }
        Ok(())
    }

    pub(super) fn round_trip(&self, al: &Al, wc: &mut [Wc; 1]) -> BenchResult<Duration> {
        let t0 = Instant::now();
        self.one_way(al, 0, wc)?;
        self.one_way(al, 1, wc)?;
        Ok(t0.elapsed())
    }

    /// Encode `mad` into `from`'s send area and SEND it to the other side.
    fn send_mad(&self, al: &Al, from: usize, mad: &CmMad, wc: &mut [Wc; 1]) -> BenchResult<()> {
        let bytes =
            wire::encode(mad).map_err(|e| format!("encoding a {}: {e}", mad.message_kind()))?;
        self.bufs[from]
            .write(0, &bytes)
            .map_err(al_err("writing a send buffer"))?;
        self.one_way(al, from, wc)
    }

    /// Decode the MAD that side `to` just received.
    fn received_mad(&self, to: usize) -> BenchResult<CmMessage> {
        let mut mad = [0u8; MAD_SIZE];
        self.bufs[to]
            .read(MAD_SIZE + GRH_SIZE, &mut mad)
            .map_err(al_err("reading a receive buffer"))?;
        Ok(wire::decode(&mad)
            .map_err(|e| format!("decoding a received MAD: {e}"))?
            .message)
    }

    /// The bare exchange: the work any CM connection of two RC QPs must do
    /// on this fabric, and nothing else. The real codec encodes and decodes
    /// a REQ, a REP and an RTU, each sent as a 256-byte UD SEND exactly as
    /// the floor sends it; the two QPs go RESET -> INIT -> RTR -> RTS
    /// through the CM's own `cm::qp_to_init`, `cm::rtr_attrs` and
    /// `cm::rts_attrs`, in the order `cm::connect`, `cm::accept`, `cm::rtu`
    /// and the passive RTU handling apply them. Left out is everything the CM adds on top: CEP objects
    /// and their handles, comm ids and the agent's tables, timers, CID
    /// binding, event queues and executor callbacks. What this costs over
    /// the floor bounds from below what any CM built on these verbs can
    /// reach. The QPs must be fresh (RESET).
    #[inline(never)]
    /// `n` bare exchanges, each on a fresh pair of RC QPs of `bench`
    /// (added to `qps`, which the round's teardown destroys); their times
    /// in microseconds go to `out`.
    pub(super) fn sample_bare(
        &self,
        bench: &Bench,
        qps: &mut Vec<Handle<Qp>>,
        n: usize,
        out: &mut Vec<f64>,
    ) -> BenchResult<()> {
        let mut wc = [Wc::default()];
        for _ in 0..n {
            let pair = [bench.rc_qp(0)?, bench.rc_qp(1)?];
            qps.extend(pair);
            out.push(us(self.bare_connect(&bench.al, pair, &mut wc)?));
        }
        Ok(())
    }

    pub(super) fn bare_connect(
        &self,
        al: &Al,
        qps: [Handle<Qp>; 2],
        wc: &mut [Wc; 1],
    ) -> BenchResult<Duration> {
        let modify = |qp: &Qp, m: &QpModify| qp.modify(m).map_err(al_err("modify_qp"));
        let access = ConnectRequest::new(0, 0).access;
        let t0 = Instant::now();
        // Active: INIT, REQ.
        let active = al.resolve_live(qps[0]).map_err(al_err("resolving a QP"))?;
        cm::qp_to_init(&active, 1, access).map_err(al_err("active QP to INIT"))?;
        let req = Req {
            local_comm_id: 1,
            service_id: SERVICE_ID,
            local_qpn: active.qpn(),
            starting_psn: cm::starting_psn(),
            responder_resources: 4,
            initiator_depth: 4,
            remote_cm_response_timeout: 16,
            local_cm_response_timeout: 16,
            transport_service_type: TransportType::Rc,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 4,
            path_mtu: self.route.path_mtu.ibta_code(),
            pkey: 0xffff,
            primary_path: self.route.path(),
            ..Req::default()
        };
        self.send_mad(al, 0, &CmMad::new(1, req), wc)?;
        // Passive: the REQ; INIT, RTR; REP.
        let CmMessage::Req(req) = self.received_mad(1)? else {
            return Err("the bare exchange received something other than its REQ".into());
        };
        let passive = al.resolve_live(qps[1]).map_err(al_err("resolving a QP"))?;
        cm::qp_to_init(&passive, 1, access).map_err(al_err("passive QP to INIT"))?;
        // Each side's StartingPSN is its own receive PSN, drawn as the
        // CM draws it.
        let passive_psn = cm::starting_psn();
        modify(
            &passive,
            &cm::rtr_attrs(
                1,
                &req,
                cm::PathEnd::Passive,
                req.local_qpn,
                passive_psn,
                req.initiator_depth,
            ),
        )?;
        let rep = Rep {
            local_comm_id: 2,
            remote_comm_id: req.local_comm_id,
            local_qpn: passive.qpn(),
            starting_psn: passive_psn,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            target_ack_delay: 10,
            rnr_retry_count: 7,
            ..Rep::default()
        };
        self.send_mad(al, 1, &CmMad::new(1, rep), wc)?;
        // Active: the REP; RTR, RTS; RTU.
        let CmMessage::Rep(rep) = self.received_mad(0)? else {
            return Err("the bare exchange received something other than its REP".into());
        };
        modify(
            &active,
            &cm::rtr_attrs(
                1,
                &req,
                cm::PathEnd::Active,
                rep.local_qpn,
                req.starting_psn,
                rep.initiator_depth,
            ),
        )?;
        modify(
            &active,
            &cm::rts_attrs(
                rep.starting_psn,
                &req,
                rep.rnr_retry_count,
                rep.responder_resources,
            ),
        )?;
        let rtu = Rtu {
            local_comm_id: rep.remote_comm_id,
            remote_comm_id: rep.local_comm_id,
            ..Rtu::default()
        };
        self.send_mad(al, 0, &CmMad::new(1, rtu), wc)?;
        // Passive: the RTU; RTS.
        let CmMessage::Rtu(_) = self.received_mad(1)? else {
            return Err("the bare exchange received something other than its RTU".into());
        };
        modify(
            &passive,
            &cm::rts_attrs(
                req.starting_psn,
                &req,
                req.rnr_retry_count,
                rep.initiator_depth.min(req.responder_resources),
            ),
        )?;
        Ok(t0.elapsed())
    }
}
