//! How a port's events reach the CM's objects: each event the agent
//! delivers is routed by its connection id (`routes.rs`) to its CEP, or
//! to the listen a request names (which gets a new passive CEP), and
//! handed over on the AL executor, in order. A port's agent is started
//! with this as its sink ([`use_port`]), so every user of a port takes it
//! here.

use al::fast_hash::IdMap;
use al::sync::Mutex;
use al::{create, post_callback, Handle, Obj, Object, Result};
use hca::verbs::Ca;

use super::objects::{destroy_cep, Cep, CepState, Listen};
use super::port::{CmDrive, PortUse};
use super::routes::{Route, Routes};
use crate::agent::Delivery;
use crate::proto::{ConnId, Event, PeerAddr};
use crate::wire::Req;

/// A use of `port`'s CM on `ca`, its agent (if this starts it) delivering
/// to the port's objects through [`deliver`]. See [`PortUse::acquire`].
pub(super) fn use_port(ca: &Obj<Ca>, port: u8, drive: Option<CmDrive>) -> Result<PortUse> {
    PortUse::acquire(ca, port, drive, deliver)
}

/// The agent's event sink: route each event to its object, in order.
fn deliver(routes: &Routes, ev: Event) -> Delivery {
    let after = {
        let mut table = routes.inner.lock();
        route_event(&mut table, ev)
    };
    match after {
        Some(After::Refuse(conn)) => Delivery::Refuse(conn),
        Some(After::DestroyCep(cep)) => {
            destroy_cep(cep.raw());
            Delivery::Taken
        }
        None => Delivery::Taken,
    }
}

/// What routing decided to do once the routes lock is released.
enum After {
    /// Refuse a request whose listen is gone or closing (the agent sends
    /// the REJ: [`Delivery::Refuse`]).
    Refuse(ConnId),
    /// End a request whose listen was cancelled after it was routed (the
    /// CEP's teardown, which takes the routes lock, sends the REJ).
    DestroyCep(Handle<Cep>),
}

/// The routing key of an event: a request names the new connection but
/// belongs to its listener.
fn route_key(ev: &Event) -> ConnId {
    match ev {
        Event::ConnectRequest { listener, .. } | Event::SidrRequest { listener, .. } => *listener,
        other => other.conn(),
    }
}

/// Route one event with the routes lock held (the caller's `table`).
/// Returns what to do once the lock is released.
fn route_event(table: &mut IdMap<ConnId, Route>, ev: Event) -> Option<After> {
    let key = route_key(&ev);
    match table.get(&key).copied() {
        Some(Route::Cep(cep)) => {
            if matches!(ev, Event::Released { .. }) {
                table.remove(&key);
            }
            dispatch_cep(Handle::from_raw(cep), ev);
            None
        }
        Some(Route::Listen(listen)) => match ev {
            Event::ConnectRequest { conn: new, .. } | Event::SidrRequest { conn: new, .. } => {
                let listen = Handle::from_raw(listen);
                match new_passive_cep(listen, new) {
                    Some(cep) => {
                        table.insert(new, Route::Cep(cep.raw()));
                        dispatch_request(listen, cep, ev)
                    }
                    // The listen is gone or its AL is closing.
                    #[cfg(not(ibal_mutant = "refuse_dropped"))]
                    None => Some(After::Refuse(new)),
                    // MUTANT (loom-tests/run.sh --mutants): a request no
                    // listen will take is dropped unanswered (left in
                    // REQ_RCVD, the peer waits for nothing).
                    #[cfg(ibal_mutant = "refuse_dropped")]
                    None => None,
                }
            }
            Event::Released { .. } => {
                table.remove(&key);
                None
            }
            _ => None,
        },
        // No route: the object is gone (its teardown removed the route and
        // told the agent); what is left of its connection is dropped.
        None => None,
    }
}

/// The CEP of a request a listen takes (none if the listen is gone or
/// going): a child of nothing, in the listen's AL, with its handler.
fn new_passive_cep(listen: Handle<Listen>, conn: ConnId) -> Option<Handle<Cep>> {
    let l = Listen::table().get(listen.raw()).ok()?.to_arc();
    if l.core().is_destroying() {
        return None;
    }
    let obj = create(l.al(), None, |_| {
        Ok(Cep {
            port: l.port.clone(),
            handler: l.cep_handler.clone(),
            state: Mutex::new(CepState {
                conn: Some(conn),
                passive: true,
                ..CepState::default()
            }),
        })
    })
    .ok()?;
    Some(obj.handle())
}

/// Hand a request's new CEP to its listen's request callback, on the AL
/// executor.
fn dispatch_request(listen: Handle<Listen>, cep: Handle<Cep>, ev: Event) -> Option<After> {
    let Ok(l) = Listen::table().get(listen.raw()) else {
        // The listen was cancelled between routing and now: nobody will
        // answer this request, so end it (the CEP's teardown sends the
        // REJ) rather than leave the peer to time out.
        #[cfg(not(ibal_mutant = "listen_cancel_leaks_request"))]
        return Some(After::DestroyCep(cep));
        // MUTANT (loom-tests/run.sh --mutants): the request of a cancelled
        // listen dropped without ending its CEP (no REJ, the CEP leaks).
        #[cfg(ibal_mutant = "listen_cancel_leaks_request")]
        return {
            let _ = After::DestroyCep(cep);
            None
        };
    };
    let l = l.to_arc();
    // Remember the REQ on the CEP (accept derives the QP attributes from it).
    // Taking a CEP's state lock under the routes lock inverts the usual
    // order, but this CEP was created just now under that same lock and no
    // one else can name it yet.
    if let (Event::ConnectRequest { req, peer, .. }, Ok(c)) = (&ev, Cep::table().get(cep.raw())) {
        let mut st = c.state.lock();
        st.req = Some(req_from_packet(req, peer));
        st.peer = Some(*peer);
    }
    post_callback(&l, move |l| {
        if l.core().is_destroying() {
            // Cancelled while this request waited for the executor.
            // (MUTANT listen_cancel_drops_queued_request: dropped without
            // ending its CEP.)
            #[cfg(not(ibal_mutant = "listen_cancel_drops_queued_request"))]
            destroy_cep(cep.raw());
            return;
        }
        (l.on_request)(l.handle(), cep, &ev)
    });
    None
}

/// The REQ as the passive side uses it: on a GID-routed path (RoCE) the
/// peer's GID is the one the REQ's packet came from (its GRH, or on
/// RoCEv2 its IP source), which the agent read, rather than the GID the
/// REQ claims; Linux's CM builds its address from the packet too. What
/// the handler receives in the event is the REQ as sent.
fn req_from_packet(req: &Req, peer: &PeerAddr) -> Req {
    let mut r = *req;
    if !r.primary_path.subnet_local && peer.gid != [0; 16] {
        r.primary_path.local_gid = peer.gid;
    }
    r
}

/// Hand an event to its CEP: the reactions that touch its QP, then its
/// handler, on the AL executor; `Released` ends the CEP.
fn dispatch_cep(cep: Handle<Cep>, ev: Event) {
    let Ok(c) = Cep::table().get(cep.raw()) else {
        // Destroyed meanwhile: its teardown already told the agent.
        return;
    };
    post_callback(&c.to_arc(), move |c| {
        c.react(&ev);
        (c.handler)(c.handle(), &ev);
        if matches!(ev, Event::Released { .. }) {
            Cep::finish(c);
        }
    });
}
