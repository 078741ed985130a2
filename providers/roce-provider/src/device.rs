//! An open device ([`RoceDevice`]): opening it (its ports bound, its
//! receive and timer threads started), its handles and what they report,
//! and handing its shutdown to a reaper when the last handle drops. Its
//! verbs are in `verbs`.

use al::sync::atomic::AtomicBool;
use al::sync::thread::JoinHandle;
use al::sync::Arc;
use std::collections::HashSet;
use std::net::SocketAddr;

use al::sync::Mutex;
use al::{Error, Result};
use provider::{AtomicCap, DeviceAttr};

use crate::config::{DeviceConfig, Directory};
use crate::counters::PortCounters;
use crate::driver::run_port;
use crate::port::PortShared;
use crate::provider_threads::mark_provider_thread;
use crate::qp::{Dev, QPN_MASK};
use crate::shutdown::{self, join_all, signal_stop, CloseWatch, Closed, Reap};
use crate::timer_thread::run_timers;

/// An open RoCEv2 device: its ports' sockets and receive threads, and its
/// verbs objects. Cloning gives another handle to the same device (as the
/// object layer's device enum needs); dropping the last handle stops and
/// joins the threads; objects still
/// alive then keep their memory but see no more traffic.
#[derive(Clone)]
pub struct RoceDevice {
    pub(crate) shared: Arc<Dev>,
    /// Shared by the handles; its drop (the last handle's) stops the
    /// driver.
    _life: Arc<Running>,
}

/// The driver of an open device: what stops it.
struct Running {
    /// Taken by the drop (the reaper holds it last).
    shared: Option<Arc<Dev>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    open: Arc<Mutex<HashSet<u64>>>,
    closed: Arc<Closed>,
}

impl RoceDevice {
    /// Identifies this device among the open devices of the process: two
    /// handles to one device answer the same. Stable while any handle to
    /// the device lives.
    pub fn instance_key(&self) -> usize {
        Arc::as_ptr(&self.shared) as *const () as usize
    }
}

impl std::fmt::Debug for RoceDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceDevice")
            .field("name", &self.shared.attr.name)
            .field(
                "node_guid",
                &format_args!("{:#x}", self.shared.attr.node_guid),
            )
            .field(
                "ports",
                &self
                    .shared
                    .ports
                    .iter()
                    .map(|p| p.local)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RoceDevice {
    pub(crate) fn open(
        cfg: &DeviceConfig,
        directory: Arc<Directory>,
        open: Arc<Mutex<HashSet<u64>>>,
    ) -> Result<RoceDevice> {
        if cfg.ports.is_empty() || cfg.ports.len() > 254 {
            return Err(Error::invalid_parameter(format!(
                "device {:#x}: {} ports (1..=254)",
                cfg.node_guid,
                cfg.ports.len()
            )));
        }
        cfg.limits.check()?;
        let l = &cfg.limits;
        let mut ports = Vec::with_capacity(cfg.ports.len());
        for (i, pc) in cfg.ports.iter().enumerate() {
            ports.push(PortShared::bind(i as u8 + 1, pc, cfg.node_guid)?);
        }
        let attr = DeviceAttr {
            name: cfg.name.clone(),
            node_guid: cfg.node_guid,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            num_ports: ports.len() as u8,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_mr_size: u64::from(u32::MAX),
            max_pd: l.max_pd,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_av: l.max_av,
            max_qp_rd_atomic: 16,
            max_qp_init_rd_atomic: 16,
            atomic_cap: AtomicCap::Hca,
            max_msg_size: roce_transport::MAX_MSG,
        };
        // QP numbers start at a random point (not 2 on every device),
        // unless the configuration names one.
        let first_qpn = cfg
            .first_qpn
            .unwrap_or_else(|| crate::keys::KeyGen::new().next_u32())
            & QPN_MASK;
        let shared: Arc<Dev> = Arc::new(Dev::new(attr, ports, directory, first_qpn));
        for p in &shared.ports {
            shared.directory.set(p.gid, p.local);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            al::sync::thread::Builder::new().name(name).spawn(move || {
                mark_provider_thread();
                f()
            })
        };
        let mut failed = None;
        let (dev, flag) = (shared.clone(), stop.clone());
        match spawn(
            format!("roce-{}-timer", cfg.name),
            Box::new(move || run_timers(dev, flag)),
        ) {
            Ok(h) => {
                shared.timers.set_thread(h.thread().clone());
                threads.push(h);
            }
            Err(e) => failed = Some(e),
        }
        for idx in 0..shared.ports.len() {
            if failed.is_some() {
                break;
            }
            let (dev, flag) = (shared.clone(), stop.clone());
            match spawn(
                format!("roce-{}-p{}", cfg.name, idx + 1),
                Box::new(move || run_port(dev, idx, flag)),
            ) {
                Ok(h) => threads.push(h),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            stop_driver(&shared, &stop, threads);
            return Err(Error::insufficient_resources(format!("driver thread: {e}")));
        }
        Ok(RoceDevice {
            shared: shared.clone(),
            _life: Arc::new(Running {
                shared: Some(shared),
                stop,
                threads: Mutex::new(threads),
                open,
                closed: Arc::default(),
            }),
        })
    }

    /// A watch on this device's shutdown, which starts when its last
    /// handle drops: its threads are joined by a reaper thread, never by
    /// the thread that dropped it ([`CloseWatch`]).
    pub fn close_watch(&self) -> CloseWatch {
        CloseWatch(self._life.closed.clone())
    }

    /// Node GUID.
    pub fn node_guid(&self) -> u64 {
        self.shared.attr.node_guid
    }

    /// The address port `port`'s socket is bound to (with the real UDP
    /// port when the configuration asked for port 0).
    pub fn local_addr(&self, port: u8) -> Option<SocketAddr> {
        self.shared.port(port).map(|p| p.local)
    }

    /// Port `port`'s packet counters: traffic, and drops and NAKs by
    /// reason.
    pub fn port_counters(&self, port: u8) -> Option<PortCounters> {
        self.shared.port(port).map(|p| p.counters.snapshot())
    }

    /// The timer thread's counters: wake-ups, heap entries examined,
    /// timeouts run, and the heap now.
    pub fn timer_stats(&self) -> crate::TimerStats {
        self.shared.timers.stats()
    }

    /// QPs that exist now.
    pub fn qp_count(&self) -> usize {
        self.shared.qps.read().len()
    }
}

/// Stop the driver threads of `shared` and join them (a device whose
/// opening failed: on the opening thread, which may wait).
fn stop_driver(shared: &Dev, stop: &AtomicBool, threads: Vec<JoinHandle<()>>) {
    signal_stop(shared, stop);
    join_all(threads);
}

impl Drop for Running {
    /// The last handle is gone, on whatever thread: the threads are told
    /// to stop, and a reaper joins them (`shutdown`).
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
        shutdown::reap(
            Reap {
                shared,
                threads,
                open: self.open.clone(),
                closed: self.closed.clone(),
            },
            &self.stop,
        );
    }
}
