//! One AL instance with the CM attached to two CAs (two soft HCAs, or
//! two RoCEv2 ports), a listen whose callback accepts, and the QP pairs
//! the rounds connect.

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use al::{Al, AlConfig, AlInstance, ExecutorMode, Handle};
use cep::cm::{self, AcceptReply, CmDrive, CmHandler, CmPort, ConnectRequest, ListenHandler};
use cep::ip::IpConnect;
use cep::proto::Event;
use cep::wire::ip_cm::PortSpace;
use hca::verbs::{self, Ca, Cq, Pd};
use ibal::roce::RoceProvider;
use ibal::verbs::SoftProvider;
use ibal_testkit::devices;
use provider::{QpCaps, QpType};
use qp::{create_qp, Qp, QpCreate};

use super::config::{SERVICE_ID, UNLISTENED_SERVICE_ID, WAIT};
use super::roce_ports;
use super::tracker::{active_handler, Times, TrackState, Tracker};
use crate::{al_err, BenchResult};

/// The listen's handlers: the request callback accepts on the passive QP
/// reserved for the requesting active QP; the passive handler stamps
/// `Established` and answers a DREQ.
pub(super) fn listen_handlers(
    inst: &StdArc<AlInstance>,
    track: &StdArc<Tracker>,
) -> (ListenHandler, CmHandler) {
    let (i, t) = (inst.clone(), track.clone());
    let on_request: ListenHandler = StdArc::new(move |_l, cep, ev| {
        let now = Instant::now();
        let Event::ConnectRequest { req, .. } = ev else {
            return;
        };
        let found = t.with(|s| {
            let found = s.reserved.get(&req.local_qpn).copied();
            if let Some((slot, _)) = found {
                s.slots[slot].request = Some(now);
                s.passive.insert(cep, slot);
            }
            found
        });
        match found {
            Some((slot, qp)) => {
                if let Err(e) = cm::accept(&i, cep, qp, &AcceptReply::default()) {
                    t.error(format!("connection {slot}: accept failed: {e}"));
                }
            }
            None => t.error(format!("a REQ from unknown QPN {:#x}", req.local_qpn)),
        }
    });
    let (i, t) = (inst.clone(), track.clone());
    let passive: CmHandler = StdArc::new(move |cep, ev| {
        let now = Instant::now();
        match ev {
            Event::Established { .. } => {
                if let Some(slot) = t.with(|s| s.passive.get(&cep).copied()) {
                    t.established(slot, false, now);
                }
            }
            Event::DisconnectRequest { .. } => {
                let _ = cm::disconnect_reply(&i, cep, &[]);
            }
            _ => {}
        }
    });
    (on_request, passive)
}

/// Which network a [`Bench`] runs on.
pub(super) enum Net {
    /// Two soft HCAs of the embedded fabric (LIDs 1 and 2).
    Soft(SoftProvider),
    /// Two RoCEv2 devices of one provider on real UDP sockets
    /// (`roce_ports::ADDRS`); the CAs, for their port counters.
    Udp {
        /// Kept until the AL has closed (its directory names the ports).
        _provider: RoceProvider,
        cas: [Handle<Ca>; 2],
    },
}

/// The AL, both CAs with the CM attached, the listen, and per-HCA PD + CQ.
pub(super) struct Bench {
    pub(super) drive: CmDrive,
    pub(super) al: Al,
    pub(super) net: Net,
    pub(super) pds: [Handle<Pd>; 2],
    pub(super) cqs: [Handle<Cq>; 2],
    pub(super) ports: Vec<Handle<CmPort>>,
    pub(super) track: StdArc<Tracker>,
    /// `live_connections` of the agents with nothing but the listen.
    pub(super) idle_connections: usize,
}

impl Bench {
    /// A fresh fabric (so the ports are new and take `drive`), an AL whose
    /// executor is a thread (threaded CM) or manual (polled CM).
    pub(super) fn open(drive: CmDrive) -> BenchResult<Bench> {
        Bench::open_on(drive, false)
    }

    /// [`Bench::open`] on the soft fabric, or (`udp`) on two RoCEv2
    /// devices of one provider bound to `roce_ports::ADDRS` (ephemeral UDP ports,
    /// found through the provider's directory), with an rdma_cm-style
    /// listen (`cep::ip`) on the second.
    pub(super) fn open_on(drive: CmDrive, udp: bool) -> BenchResult<Bench> {
        let executor = match drive {
            CmDrive::Thread => ExecutorMode::Thread,
            CmDrive::Poll => ExecutorMode::Manual,
        };
        let al = Al::open_with(AlConfig {
            executor,
            ..AlConfig::default()
        })
        .map_err(al_err("opening the AL"))?;
        let mut cas: Vec<Handle<Ca>> = Vec::new();
        let mut pds = Vec::new();
        let mut cqs = Vec::new();
        let mut ports = Vec::new();
        let (soft, roce) = if udp {
            (None, Some(roce_ports::provider()))
        } else {
            (Some(devices::default_provider()), None)
        };
        let guids = if udp {
            roce_ports::GUIDS
        } else {
            devices::DEFAULT_NODE_GUIDS
        };
        for guid in guids {
            let ca = match (&soft, &roce) {
                (Some(p), _) => verbs::open_ca(al.instance(), p, guid),
                (_, Some(p)) => verbs::open_ca(al.instance(), p, guid),
                _ => unreachable!("one provider"),
            }
            .map_err(al_err("open_ca"))?;
            ports.extend(
                cm::attach_ca_with(al.instance(), ca, drive).map_err(al_err("attach the CM"))?,
            );
            pds.push(verbs::alloc_pd(al.instance(), ca).map_err(al_err("alloc_pd"))?);
            cqs.push(
                verbs::create_cq(al.instance(), ca, 1024, None, None)
                    .map_err(al_err("create_cq"))?,
            );
            cas.push(ca);
        }
        let track = StdArc::new(Tracker::default());
        let (on_request, passive) = listen_handlers(al.instance(), &track);
        if udp {
            cep::ip::listen(
                al.instance(),
                cas[1],
                roce_ports::listen_addr(),
                PortSpace::Tcp,
                on_request,
                passive,
            )
        } else {
            cm::listen(al.instance(), cas[1], 1, SERVICE_ID, on_request, passive)
        }
        .map_err(al_err("listen"))?;
        let net = match (soft, roce) {
            (Some(p), _) => Net::Soft(p),
            (_, Some(p)) => Net::Udp {
                _provider: p,
                cas: [cas[0], cas[1]],
            },
            _ => unreachable!("one provider"),
        };
        let mut bench = Bench {
            drive,
            al,
            net,
            pds: [pds[0], pds[1]],
            cqs: [cqs[0], cqs[1]],
            ports,
            track,
            idle_connections: 0,
        };
        bench.idle_connections = bench.live_connections();
        Ok(bench)
    }

    /// Datagrams dropped for want of a receive buffer: the soft fabric's
    /// count, or the RoCEv2 ports' `rx_no_receive` (QP1 included).
    pub(super) fn dropped_no_recv(&self) -> u64 {
        match &self.net {
            Net::Soft(p) => p.fabric().stats().dropped_no_recv,
            Net::Udp { .. } => self.roce_ports_sum(|c| c.rx_no_receive),
        }
    }

    /// One counter of the RoCEv2 ports, summed over both (0 on the soft
    /// fabric).
    pub(super) fn roce_ports_sum(&self, counter: fn(&ibal::roce::PortCounters) -> u64) -> u64 {
        let Net::Udp { cas, .. } = &self.net else {
            return 0;
        };
        cas.iter()
            .filter_map(|ca| {
                let ca = self.al.resolve(*ca).ok()?;
                match ca.device() {
                    hca::any::AnyDevice::Roce(d) => d.port_counters(1).map(|c| counter(&c)),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            })
            .sum()
    }

    /// Polled CM: serve both ports, then run the callbacks that produced.
    /// Threaded CM: nothing (the agent and executor threads do it).
    pub(super) fn pump(&self) -> BenchResult<()> {
        if self.drive == CmDrive::Poll {
            for &port in &self.ports {
                cm::poll(&self.al, port).map_err(al_err("polling a CM port"))?;
            }
            self.al.run_callbacks();
        }
        Ok(())
    }

    /// Wait until `done` holds: on the condition variable (threaded), or
    /// pumping the CM on this thread (polled). Out of line so a profiler
    /// can collect exactly the timed windows (`connect` plus `wait`; see
    /// docs/benchmarks.md).
    #[inline(never)]
    pub(super) fn wait(&self, what: &str, done: impl Fn(&TrackState) -> bool) -> BenchResult<()> {
        if self.drive == CmDrive::Thread {
            return self.track.wait(what, done);
        }
        let deadline = Instant::now() + WAIT;
        while !self.track.check(&done)? {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            self.pump()?;
        }
        Ok(())
    }

    pub(super) fn live_connections(&self) -> usize {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok().map(|p| p.stats().live_connections))
            .sum()
    }

    pub(super) fn mads_sent(&self) -> u64 {
        self.ports
            .iter()
            .filter_map(|p| self.al.resolve(*p).ok().map(|p| p.stats().mads_sent))
            .sum()
    }

    pub(super) fn rc_qp(&self, side: usize) -> BenchResult<Handle<Qp>> {
        create_qp(
            self.al.instance(),
            self.pds[side],
            QpCreate {
                caps: QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                },
                ..QpCreate::new(QpType::Rc, self.cqs[side])
            },
        )
        .map_err(al_err("create_qp"))
    }

    /// A new slot; with `pair`, an active QP whose REQ the listener accepts
    /// on a passive QP reserved for it. Returns (slot, active QP).
    pub(super) fn prepare(
        &self,
        qps: &mut Vec<Handle<Qp>>,
        pair: bool,
    ) -> BenchResult<(usize, Handle<Qp>)> {
        let active = self.rc_qp(0)?;
        qps.push(active);
        let slot = self.track.with(|s| {
            s.slots.push(Times::default());
            s.slots.len() - 1
        });
        if pair {
            let passive = self.rc_qp(1)?;
            qps.push(passive);
            let qpn = self
                .al
                .resolve(active)
                .map_err(al_err("resolving a QP"))?
                .qpn();
            self.track.with(|s| s.reserved.insert(qpn, (slot, passive)));
        }
        Ok((slot, active))
    }

    /// Stamp the start and send the REQ: for the listened service, or
    /// (`listened` false) for one nobody listens on (answered by a REJ).
    /// Over UDP an rdma_cm-style connect to the listen's address (the REQ
    /// is built before the start is stamped, as on the soft fabric).
    #[inline(never)]
    pub(super) fn connect(&self, slot: usize, qp: Handle<Qp>, listened: bool) -> BenchResult<()> {
        let handler = active_handler(self.al.instance().clone(), self.track.clone(), slot);
        let req = match &self.net {
            Net::Soft(_) => ConnectRequest::new(
                if listened {
                    SERVICE_ID
                } else {
                    UNLISTENED_SERVICE_ID
                },
                devices::DEFAULT_LIDS[1],
            ),
            Net::Udp { .. } => {
                let qpn = self.al.resolve(qp).map_err(al_err("resolving a QP"))?.qpn();
                let to = if listened {
                    roce_ports::listen_addr()
                } else {
                    roce_ports::unlistened_addr()
                };
                IpConnect::new(to)
                    .to_request(roce_ports::ADDRS[0], 1, qpn)
                    .map_err(al_err("building the REQ"))?
            }
        };
        self.track
            .with(|s| s.slots[slot].start = Some(Instant::now()));
        cm::connect(self.al.instance(), qp, &req, handler).map_err(al_err("connect"))?;
        Ok(())
    }

    pub(super) fn times(&self, slot: usize) -> Times {
        self.track.with(|s| s.slots[slot])
    }

    /// Destroy `qps` (which tears their connections down) and wait until
    /// the agents hold nothing but the listen: no timewait timer or
    /// teardown MAD may land in the next timed window.
    pub(super) fn teardown(&self, qps: &mut Vec<Handle<Qp>>) -> BenchResult<()> {
        for qp in qps.drain(..) {
            self.al
                .destroy_sync(qp)
                .map_err(al_err("destroying a QP"))?;
        }
        self.track.with(|s| {
            s.reserved.clear();
            s.passive.clear();
        });
        let deadline = Instant::now() + WAIT;
        while self.live_connections() > self.idle_connections {
            if Instant::now() > deadline {
                return Err("the CM agents did not release the connections".into());
            }
            self.pump()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub(super) fn close(self) -> BenchResult<()> {
        let Bench { al, net, .. } = self;
        let stats = al.close().map_err(al_err("closing the AL"))?;
        drop(net);
        if stats.is_clean() {
            Ok(())
        } else {
            Err(format!("the AL closed with live objects: {stats}"))
        }
    }
}
