//! The port agents of the process: one [`CmAgent`] per device port in use,
//! shared by every AL instance, started by the port's first user and shut
//! down (without waiting) by its last; how each is driven ([`CmDrive`]).

use al::fast_hash::{id_map, IdMap};
use al::sync::{Arc, Mutex};
use al::{Error, Obj, Result};
use hca::verbs::{Ca, Dev};

use super::routes::Routes;
use crate::agent::{AgentConfig, CmAgent, Delivery, EventSink};
use crate::proto::Event;

/// What a port's agent does with each event, given the port's routes.
pub(super) type Sink = fn(&Routes, Event) -> Delivery;

/// The CM of one device port: its agent and the table that routes the
/// agent's events to CEP and listen objects.
pub struct PortCm {
    pub(super) key: (usize, u8),
    pub(super) drive: CmDrive,
    pub(super) agent: CmAgent<Dev>,
    pub(super) routes: Arc<Routes>,
}

/// The port agents of the process.
struct Registry {
    /// Keyed by (device instance, port): ours, so the id hash (every
    /// connect and every passive CEP looks its port up here). The count is
    /// the port's users (`PortUse`s); the last one shuts the agent down.
    ports: IdMap<(usize, u8), (Arc<PortCm>, usize)>,
    /// Ports whose agent was told to shut down but may still hold QP1
    /// (a thread was inside the agent then; it destroys QP1 as it leaves).
    /// A new agent on the port first makes sure the old QP1 is gone.
    /// Entries whose QP1 is gone are pruned whenever a port closes.
    closing: IdMap<(usize, u8), Arc<PortCm>>,
}

fn registry() -> &'static Mutex<Registry> {
    al::global! {
        static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
            ports: id_map(),
            closing: id_map(),
        });
    }
    &REGISTRY
}

/// How a port's CM agent is driven. Chosen by whoever attaches the port
/// first ([`attach_ca_with`]); it holds until the last user of the port is
/// gone.
///
/// [`attach_ca_with`]: super::attach_ca_with
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CmDrive {
    /// An agent thread per port wakes on every received MAD and timer.
    /// Nothing to do for the application; each MAD costs a thread wake-up.
    #[default]
    Thread,
    /// No agent thread: the application calls [`poll`] (as it polls its
    /// CQs) and every received MAD is handled on that thread. With an AL in
    /// [`al::ExecutorMode::Manual`], a connection can be set up with no
    /// thread hand-off at all. Retries and timewait advance only while the
    /// port is polled.
    ///
    /// [`poll`]: super::poll
    Poll,
}

/// A counted use of a port's CM; the last use shuts the agent down, without
/// waiting for anything (see [`CmAgent::shutdown`]), wherever that drop
/// runs: an AL executor, an agent thread, under the routes lock.
pub(super) struct PortUse(pub(super) Arc<PortCm>);

impl PortUse {
    /// A use of `port`'s CM, starting its agent if it has none. `drive`
    /// `None` takes the port as it is (a new one is threaded); `Some` must
    /// match how the port already runs. A new agent hands its events to
    /// `sink` with the port's routes (always `dispatch::deliver`: the
    /// layer above says where events go, so this one names no object).
    pub(super) fn acquire(
        ca: &Obj<Ca>,
        port: u8,
        drive: Option<CmDrive>,
        sink: Sink,
    ) -> Result<PortUse> {
        let key = (ca.device().instance_key(), port);
        let mut reg = registry().lock();
        if let Some(old) = reg.closing.remove(&key) {
            // The port's last agent lingers or is shutting down. Take it
            // back if it still lingers (same comm ids: none a peer holds in
            // timewait can be handed out again); otherwise its QP1 must be
            // gone before a new agent can have the port's GSI QP: off the
            // registry lock, a bounded wait for the old agent's lock.
            if drive.is_none_or(|d| d == old.drive) && old.agent.revive() {
                reg.ports.insert(key, (old.clone(), 1));
                return Ok(PortUse(old));
            }
            drop(reg);
            old.agent.finish_shutdown();
            reg = registry().lock();
        }
        if let Some((pcm, users)) = reg.ports.get_mut(&key) {
            if drive.is_some_and(|d| d != pcm.drive) {
                return Err(Error::InvalidSetting(
                    format!(
                        "port {port}'s CM already runs in {:?} mode; detach it everywhere first",
                        pcm.drive
                    )
                    .into(),
                ));
            }
            *users += 1;
            return Ok(PortUse(pcm.clone()));
        }
        // Under loom no agent thread can run: a port no model attached
        // (one started again by a call racing its last user) is polled.
        #[cfg(not(ibal_loom))]
        let drive = drive.unwrap_or_default();
        #[cfg(ibal_loom)]
        let drive = drive.unwrap_or(CmDrive::Poll);
        // The agent draws its comm id key from the OS: a port started
        // again, or a process restarted with the same CA GUID, hands out
        // none of its predecessor's ids (a peer still holding the old
        // connection would take the new REQ for a duplicate of it and
        // ignore it, where it must reject it as stale).
        let agent = CmAgent::new(ca.device().clone(), port, AgentConfig::default())?;
        let routes = Arc::new(Routes::default());
        let sink_routes = routes.clone();
        let event_sink: EventSink = std::sync::Arc::new(move |ev| sink(&sink_routes, ev));
        agent.set_event_sink(Some(event_sink));
        match drive {
            CmDrive::Thread => agent.spawn()?,
            // Under loom time stands still (timers never fire), so every
            // explored execution sees the same clock.
            #[cfg(not(ibal_loom))]
            CmDrive::Poll => agent.use_monotonic_clock()?,
            #[cfg(ibal_loom)]
            CmDrive::Poll => {}
        }
        let pcm = Arc::new(PortCm {
            key,
            drive,
            agent,
            routes,
        });
        reg.ports.insert(key, (pcm.clone(), 1));
        Ok(PortUse(pcm))
    }
}

impl Clone for PortUse {
    fn clone(&self) -> Self {
        let mut reg = registry().lock();
        if let Some((_, users)) = reg.ports.get_mut(&self.0.key) {
            *users += 1;
        }
        PortUse(self.0.clone())
    }
}

impl Drop for PortUse {
    fn drop(&mut self) {
        let mut reg = registry().lock();
        let last = match reg.ports.get_mut(&self.0.key) {
            Some((_, users)) => {
                *users -= 1;
                *users == 0
            }
            None => false,
        };
        if !last {
            return;
        }
        reg.ports.remove(&self.0.key);
        reg.closing.retain(|_, old| !old.agent.qp1_released());
        reg.closing.insert(self.0.key, self.0.clone());
        drop(reg);
        if !self.0.agent.linger() {
            self.0.agent.shutdown();
        }
    }
}

/// Agents running in this process (one per device port in use).
pub fn active_ports() -> usize {
    registry().lock().ports.len()
}
