//! Listening for connection requests: a [`Listen`] object on a service
//! id of one port, whose route is published before the agent can match a
//! REQ to it.

use al::sync::{Arc, Mutex};
use al::{create, AlInstance, Error, Handle, Kind, Result};
use hca::verbs::{Ca, Dev};

use super::dispatch::use_port;
use super::objects::{CmHandler, Listen, ListenHandler};
use super::routes::{Route, Routes};
use crate::agent::CmAgent;
use crate::proto::ConnId;

/// Listen for REQs (and SIDR_REQs) for `service_id` on `port` of `ca`.
/// `on_request` gets each new CEP; `handler` gets the CEP's later events.
/// Cancel with `al.destroy(listen, ..)`.
pub fn listen(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    port: u8,
    service_id: u64,
    on_request: ListenHandler,
    handler: CmHandler,
) -> Result<Handle<Listen>> {
    let ca = al.resolve_live(ca)?;
    let port_use = use_port(&ca, port, None)?;
    let obj = create(al, None, |_| {
        Ok(Listen {
            port: port_use,
            conn: Mutex::new(None),
            service_id,
            on_request,
            cep_handler: handler,
        })
    })?;
    let h = obj.handle();
    let started = {
        let mut conn = obj.conn.lock();
        if obj.core().is_destroying() {
            // AL close took it before it started: nothing to cancel.
            Err(Error::Destroying {
                kind: Kind::LISTEN,
                raw: h.raw().as_u64(),
            })
        } else {
            let routes = &obj.port.0.routes;
            start_listen(&obj.port.0.agent, routes, service_id, h).map(|id| *conn = Some(id))
        }
    };
    match started {
        Ok(()) => Ok(h),
        Err(e) => {
            // Nothing of it was published: gone, and uncounted, before we
            // return, so a refused listen leaves no Listen counted live.
            al::destroy_unused(obj);
            Err(e)
        }
    }
}

/// Sets how many requests `listen` holds that nobody has answered yet
/// (accepted, rejected or destroyed; a request waiting in a handler's own
/// queue counts) before its port refuses new ones with REJ "no resources"
/// (reason 3), at once. At least 1; [`DEFAULT_BACKLOG`] until set.
/// `docs/cm-protocol.md`, "Bursts".
///
/// [`DEFAULT_BACKLOG`]: crate::proto::DEFAULT_BACKLOG
pub fn set_backlog(al: &Arc<AlInstance>, listen: Handle<Listen>, backlog: u32) -> Result<()> {
    let l = al.resolve_live(listen)?;
    let conn = *l.conn.lock();
    match conn {
        Some(id) => l.port.0.agent.set_backlog(id, backlog),
        None => Err(Error::invalid_state("the listen has not started")),
    }
}

/// Start the agent's listener, its route published before any REQ can be
/// matched to it.
fn start_listen(
    agent: &CmAgent<Dev>,
    routes: &Routes,
    service_id: u64,
    h: Handle<Listen>,
) -> Result<ConnId> {
    #[cfg(not(ibal_mutant = "route_after_start"))]
    return agent.listen_published(service_id, |id| routes.publish(id, Route::Listen(h.raw())));
    // MUTANT (loom-tests/run.sh --mutants): the route is published after
    // the agent call, as the old code did: what arrives in between is lost.
    #[cfg(ibal_mutant = "route_after_start")]
    return agent
        .listen(service_id)
        .inspect(|&id| routes.publish(id, Route::Listen(h.raw())));
}
