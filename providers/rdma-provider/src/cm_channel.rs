//! rdma_cm ids on one event channel, with an event thread that hands each
//! event, already acknowledged, to the hook of its id.
//!
//! * One channel per process (`rdma_create_event_channel`), made at the
//!   first [`CmId::create`], and one thread (`rdma-cm-ev`) that `poll(2)`s
//!   its fd, fetches each event (`rdma_get_cm_event`), looks the hook of
//!   its id up **before** acknowledging it (until then `rdma_destroy_id`
//!   of that id waits, so the address cannot name a newer id), copies the
//!   event into a [`CmEventKind`], acknowledges it, and only then calls
//!   the hook with no lock held. So a hook may destroy any id, its own
//!   included, and `rdma_destroy_id` waits at most for the thread's
//!   look-up of one event, never for a hook. The thread lives as long as
//!   the process (it sleeps in `poll` when no id exists).
//! * Every librdmacm call on an id, and every read of its fields, holds
//!   the process's CM lock (`sys_cm::lock`), which the thread also holds
//!   across `rdma_get_cm_event` (librdmacm rewrites id fields there).
//! * Dropping a [`CmId`] removes its hook at once; `rdma_destroy_id`
//!   (which may wait for the event thread) runs there and then on an
//!   application thread, but is handed to the reaper on a provider thread
//!   or inside an AL callback (`reaper.rs`).
//! * A connect request's new id comes with the event
//!   ([`CmEvent::new_id`]); the hook gives it its own hook
//!   ([`CmId::set_hook`]) before returning, so none of the new id's events
//!   (the thread fetches the next one only after the hook returns) is
//!   missed. A new id with no listener hook is destroyed (the kernel
//!   rejects its REQ).
//! * Ids are created without a QP: `rdma_connect`/`rdma_accept` name the
//!   application's QP by number, and [`CmId::init_qp_modify`] turns
//!   `rdma_init_qp_attr` into the modify the application makes itself.

use al::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::net::SocketAddr;

use al::{Error, Result};
use provider::{Access, QpModify, QpState};

use crate::cm::{event_code, event_kind, modify_from_init_attr, CmEventKind, ConnParam, PS_TCP};
use crate::convert::qp_state_code;
use crate::sys;
use crate::sys_cm::{self, EventChannel, Id};

/// Called on the channel's event thread for each event of an id.
pub type CmHook = Arc<dyn Fn(CmEvent) + Send + Sync>;

/// One event of an id, acknowledged already.
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// A connect request's new id (the hook owns it now).
    pub new_id: Option<CmId>,
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("new_id", &self.new_id.is_some())
            .finish()
    }
}

struct Shared {
    ch: EventChannel,
    hooks: Mutex<HashMap<usize, CmHook>>,
}

impl Shared {
    fn hook_of(&self, key: usize) -> Option<CmHook> {
        self.hooks.lock().get(&key).cloned()
    }

    fn set_hook(&self, key: usize, hook: Option<CmHook>) {
        let mut h = self.hooks.lock();
        match hook {
            Some(hook) => h.insert(key, hook),
            None => h.remove(&key),
        };
    }

    fn run(self: &Arc<Self>) {
        let fds = [self.ch.fd()];
        loop {
            match sys::poll_readable(&fds, -1) {
                Ok(r) if r[0] => {}
                Ok(_) => continue,
                Err(_) => {
                    al::sync::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            }
            let cm = sys_cm::lock();
            let Ok(ev) = self.ch.get_event(&cm) else {
                continue;
            };
            drop(cm);
            let code = ev.code();
            let request = code == event_code::CONNECT_REQUEST;
            let key = if request {
                ev.listen_key()
            } else {
                ev.id_key()
            };
            // Before the acknowledgement: the id cannot be destroyed yet.
            let hook = self.hook_of(key);
            let new_id = if request { ev.take_new_id() } else { None };
            let kind = event_kind(code, ev.status(), ev.conn());
            drop(ev);
            let new_id = new_id.map(|id| CmId {
                key: id.key(),
                id: Some(id),
                shared: self.clone(),
            });
            match hook {
                Some(h) => h(CmEvent { kind, new_id }),
                // Nobody listens any more: dropping the new id destroys it
                // (the kernel rejects the REQ).
                None => drop(new_id),
            }
        }
    }
}

fn channel() -> Result<Arc<Shared>> {
    al::global! {
        static CHANNEL: Mutex<Option<Arc<Shared>>> = Mutex::new(None);
    }
    let mut c = CHANNEL.lock();
    if let Some(s) = c.as_ref() {
        return Ok(s.clone());
    }
    let ch = EventChannel::new()?;
    let shared = Arc::new(Shared {
        ch,
        hooks: Mutex::new(HashMap::new()),
    });
    let st = shared.clone();
    al::sync::thread::Builder::new()
        .name("rdma-cm-ev".into())
        .spawn(move || {
            crate::reaper::mark_provider_thread();
            st.run()
        })
        .map_err(|e| Error::InsufficientResources(format!("rdma_cm event thread: {e}").into()))?;
    *c = Some(shared.clone());
    Ok(shared)
}

/// An rdma_cm id (TCP port space, no QP) on the process's event channel.
/// Dropping it removes its hook, then destroys it (`rdma_destroy_id`: the
/// kernel sends the REJ or DREQ its state calls for).
pub struct CmId {
    id: Option<Id>,
    key: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("key", &format_args!("{:#x}", self.key))
            .finish()
    }
}

impl CmId {
    /// `rdma_create_id` with `hook` for its events. Fails when the kernel
    /// has no rdma_cm (the error names `rdma_create_event_channel`).
    pub fn create(hook: CmHook) -> Result<CmId> {
        let shared = channel()?;
        let id = Id::create(&shared.ch, PS_TCP)?;
        let key = id.key();
        shared.set_hook(key, Some(hook));
        Ok(CmId {
            id: Some(id),
            key,
            shared,
        })
    }

    fn id(&self) -> &Id {
        self.id.as_ref().expect("an id is live until dropped")
    }

    /// Replaces the hook (a connect request's new id has none).
    pub fn set_hook(&self, hook: CmHook) {
        self.shared.set_hook(self.key, Some(hook));
    }

    /// `rdma_resolve_addr` from any local address to `dst`.
    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> Result<()> {
        self.id()
            .resolve_addr(&sys_cm::lock(), None, dst, timeout_ms)
    }

    /// `rdma_resolve_route`.
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        self.id().resolve_route(&sys_cm::lock(), timeout_ms)
    }

    /// `rdma_bind_addr` then `rdma_listen`.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> Result<()> {
        let cm = sys_cm::lock();
        self.id().bind_addr(&cm, addr)?;
        self.id().listen(&cm, backlog)
    }

    /// `rdma_connect` (checked first: [`ConnParam::check`]).
    pub fn connect(&self, p: &ConnParam) -> Result<()> {
        p.check("rdma_connect", crate::cm::private_data_len::CONNECT)?;
        self.id().connect(&sys_cm::lock(), p)
    }

    /// `rdma_accept` (checked first).
    pub fn accept(&self, p: &ConnParam) -> Result<()> {
        p.check("rdma_accept", crate::cm::private_data_len::ACCEPT)?;
        self.id().accept(&sys_cm::lock(), p)
    }

    /// `rdma_reject` with private data (librdmacm sends reason 28,
    /// consumer defined).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > crate::cm::private_data_len::REJECT {
            return Err(Error::invalid_parameter(format!(
                "rdma_reject: {} bytes of private data, at most {} fit",
                private_data.len(),
                crate::cm::private_data_len::REJECT
            )));
        }
        self.id().reject(&sys_cm::lock(), private_data)
    }

    /// `rdma_establish`: sends the RTU after the connect response.
    pub fn establish(&self) -> Result<()> {
        self.id().establish(&sys_cm::lock())
    }

    /// `rdma_disconnect`: DREQ, or the DREP after the peer's DREQ.
    pub fn disconnect(&self) -> Result<()> {
        self.id().disconnect(&sys_cm::lock())
    }

    /// `rdma_notify(IBV_EVENT_COMM_EST)`: the connection's QP received
    /// before the RTU arrived (its `QpEvent::CommEstablished`); the
    /// kernel's CM then treats the connection as established.
    pub fn notify_comm_est(&self) -> Result<()> {
        self.id().notify_comm_est(&sys_cm::lock())
    }

    /// What `rdma_init_qp_attr` says a QP of this connection needs to
    /// reach `state`, as a modify with `access` for its access flags.
    pub fn init_qp_modify(&self, state: QpState, access: Access) -> Result<QpModify> {
        let (raw, mask) = self
            .id()
            .init_qp_attr(&sys_cm::lock(), qp_state_code(state))?;
        modify_from_init_attr(&raw, mask, access)
    }

    /// Node GUID (host order) and name of the device the id is bound to,
    /// once its address is bound or resolved.
    pub fn device(&self) -> Option<(u64, String)> {
        self.id().device(&sys_cm::lock())
    }

    /// The device port the id is bound to (0 before).
    pub fn port_num(&self) -> u8 {
        self.id().port_num(&sys_cm::lock())
    }

    /// The route's local address (ours) and peer address.
    pub fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        self.id().addrs(&sys_cm::lock())
    }
}

impl Drop for CmId {
    /// No event of the id reaches a hook after this; `rdma_destroy_id`
    /// (the kernel sends the REJ or DREQ the state calls for) runs here,
    /// or on the reaper when this is a provider thread or a callback.
    fn drop(&mut self) {
        self.shared.set_hook(self.key, None);
        if let Some(id) = self.id.take() {
            crate::reaper::teardown(move || {
                let _ = id.destroy(&sys_cm::lock());
            });
        }
    }
}

/// Whether librdmacm can work here: the event channel opens (the kernel
/// has rdma_cm). The error says why not.
pub fn available() -> Result<()> {
    channel().map(|_| ())
}
