//! Where a port's CM events go: the table from connection id to the CEP or
//! listen object that owns it. Objects are named by their raw handles, so
//! this table sits below the objects (`objects.rs`) and the port registry
//! (`port.rs`) that hold it; `dispatch.rs` resolves them.

use al::fast_hash::IdMap;
use al::sync::Mutex;
use al::RawHandle;

use crate::proto::ConnId;

/// The object a connection id belongs to: a CEP, or a listen (which owns
/// the requests that name it until each gets a CEP).
#[derive(Clone, Copy, Debug)]
pub(super) enum Route {
    /// A [`super::Cep`].
    Cep(RawHandle),
    /// A [`super::Listen`].
    Listen(RawHandle),
}

/// ConnId -> object. Every id is published here before the first MAD that
/// could draw an answer leaves (see `publish`), and removed by the
/// object's teardown or by the id's `Released`; so an event whose id has
/// no route belongs to an object already gone and is dropped.
#[derive(Default)]
pub(super) struct Routes {
    pub(super) inner: Mutex<IdMap<ConnId, Route>>,
}

impl Routes {
    /// Publish `key -> route`. Called by the agent's `*_published` calls
    /// under the agent lock, after the id is allocated and before the
    /// request is sent: the routes lock is a leaf below the agent lock.
    pub(super) fn publish(&self, key: ConnId, route: Route) {
        self.inner.lock().insert(key, route);
    }

    /// Routes currently published (a leak check for tests and stress).
    pub(super) fn len(&self) -> usize {
        self.inner.lock().len()
    }
}
