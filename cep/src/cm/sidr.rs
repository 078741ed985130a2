//! Service ID resolution (SIDR): asking a UD service for its QP
//! ([`sidr_request`], a CEP that goes with the answer) and answering such
//! a request from a listen ([`sidr_reply`]).

use al::sync::{Arc, Mutex};
use al::{create, AlInstance, Handle, Obj, Result};
use hca::verbs::Ca;

use super::dispatch::use_port;
use super::objects::{cep_destroyed, Cep, CepState, CmHandler};
use super::routes::Route;
use crate::proto::{ConnId, SidrParams, SidrReplyParams};

/// Ask a UD service for its QP (SIDR_REQ) from `port` of `ca`; the answer
/// arrives as [`Event::SidrReply`] to `handler`, after which the CEP goes.
///
/// [`Event::SidrReply`]: crate::proto::Event::SidrReply
pub fn sidr_request(
    al: &Arc<AlInstance>,
    ca: Handle<Ca>,
    params: SidrParams,
    port: u8,
    handler: CmHandler,
) -> Result<Handle<Cep>> {
    let ca = al.resolve_live(ca)?;
    let port_use = use_port(&ca, port, None)?;
    let cep = create(al, None, |_| {
        Ok(Cep {
            port: port_use,
            handler,
            state: Mutex::new(CepState {
                port,
                ..CepState::default()
            }),
        })
    })?;
    let h = cep.handle();
    let started = {
        let mut st = cep.state.lock();
        if st.closed {
            Err(cep_destroyed(&cep))
        } else {
            start_sidr(&cep, params, h).map(|conn| st.conn = Some(conn))
        }
    };
    match started {
        Ok(()) => Ok(h),
        Err(e) => {
            let _ = al.destroy(h, None);
            Err(e)
        }
    }
}

/// Send the SIDR_REQ, the CEP's route published before it can leave.
fn start_sidr(cep: &Obj<Cep>, params: SidrParams, h: Handle<Cep>) -> Result<ConnId> {
    let (agent, routes) = (&cep.port.0.agent, &cep.port.0.routes);
    #[cfg(not(ibal_mutant = "route_after_start"))]
    return agent.sidr_request_published(params, |id| routes.publish(id, Route::Cep(h.raw())));
    // MUTANT (loom-tests/run.sh --mutants): published after the SIDR_REQ
    // left: a fast reply and its Released find no route and are dropped.
    #[cfg(ibal_mutant = "route_after_start")]
    return agent
        .sidr_request(params)
        .inspect(|&id| routes.publish(id, Route::Cep(h.raw())));
}

/// Answer a SIDR request (the CEP from the listen callback).
pub fn sidr_reply(al: &AlInstance, cep: Handle<Cep>, reply: SidrReplyParams) -> Result<()> {
    let c = al.resolve(cep)?;
    let conn = c.conn()?;
    c.port
        .0
        .agent
        .sidr_reply(conn, reply)
        .map_err(super::calls::connection_over)
}
