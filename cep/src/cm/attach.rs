//! Attaching the CM to a CA's ports: a [`CmPort`] per port keeps the
//! port's agent running (the port answers CM MADs) while it lives, and
//! [`poll`] serves a port whose agent has no thread ([`CmDrive::Poll`]).

use std::fmt;

use al::sync::Arc;
use al::{create, AlInstance, Handle, Kind, Obj, Object, Result};
use hca::verbs::Ca;

use super::dispatch::use_port;
use super::port::{CmDrive, PortUse};
use crate::agent::{AgentStats, PollOutcome};
use crate::proto::{ConnId, State};

/// The connection manager attached to one port of an opened CA: while it
/// lives, the port answers CM MADs (a REQ for an unknown service gets a REJ,
/// a DREQ for an unknown connection a DREP), as every IB port must. A child
/// of its CA, so closing the CA (or the AL) detaches it.
pub struct CmPort {
    port: PortUse,
}

impl Object for CmPort {
    const KIND: Kind = Kind::CM_PORT;
    al::object_table!(CmPort);

    /// `port N routes N`: the connection ids it routes to objects (of
    /// every AL on the port).
    fn describe(obj: &Obj<Self>, out: &mut al::Attrs) {
        out.num("port", obj.port())
            .num("routes", obj.routes() as u64);
    }
}

impl CmPort {
    /// The port number.
    pub fn port(&self) -> u8 {
        self.port.0.agent.port()
    }
    /// The agent's counters.
    pub fn stats(&self) -> AgentStats {
        self.port.0.agent.stats()
    }
    /// Connection ids the port routes to CEP and listen objects: one per
    /// listen and per CEP whose connection the agent still holds. A leak
    /// check: with no CEP or listen of any AL left on the port, 0.
    pub fn routes(&self) -> usize {
        self.port.0.routes.len()
    }
    /// Every connection the port's agent still holds, with its protocol
    /// state (a leak check: a CEP that is gone leaves its connection in
    /// TIMEWAIT at most, until timewait ends).
    pub fn connections(&self) -> Vec<(ConnId, State)> {
        self.port.0.agent.ceps()
    }
    /// How the port's agent is driven.
    pub fn drive(&self) -> CmDrive {
        self.port.0.drive
    }
}

impl fmt::Debug for CmPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmPort")
            .field("port", &self.port())
            .finish()
    }
}

/// Attach the connection manager to every port of `ca` (what opening a CA
/// through the `ibal` facade does). Returns one handle per port.
pub fn attach_ca(al: &Arc<AlInstance>, ca: Handle<Ca>) -> Result<Vec<Handle<CmPort>>> {
    let ca = al.resolve_live(ca)?;
    attach_ports(al, &ca, None)
}

/// [`attach_ca`] with the agents driven as `drive` says. A port already
/// attached (by any AL) in the other mode fails with `InvalidSetting`.
pub fn attach_ca_with(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    drive: CmDrive,
) -> Result<Vec<Handle<CmPort>>> {
    let ca = al.resolve_live(ca)?;
    attach_ports(al, &ca, Some(drive))
}

fn attach_ports(
    al: &Arc<AlInstance>,
    ca: &Arc<Obj<Ca>>,
    drive: Option<CmDrive>,
) -> Result<Vec<Handle<CmPort>>> {
    let mut ports = Vec::new();
    for port in 1..=ca.attr().num_ports {
        let port_use = use_port(ca, port, drive)?;
        let obj = create(al, Some(ca.core()), |_| Ok(CmPort { port: port_use }))?;
        ports.push(obj.handle());
    }
    Ok(ports)
}

/// Serve `port`'s CM agent once on this thread: take every MAD QP1 has
/// received, run it through the protocol, send the answers, fire due
/// timers (retries, timewait), and route the events (callbacks still run
/// on the AL executor). This is how a [`CmDrive::Poll`] port makes
/// progress; on a threaded port it is allowed and only takes some of the
/// agent thread's work.
pub fn poll(al: &AlInstance, port: Handle<CmPort>) -> Result<PollOutcome> {
    let p = al.resolve_live(port)?;
    p.port.0.agent.serve()
}
