//! Under the model checker only (`--cfg ibal_loom`): the ports' UDP
//! sockets replaced by a loopback "network" of per-address datagram
//! queues, so a loom model runs a whole device (its receive thread, its
//! pollers, its shutdown) without a system call. `port`, `mmsg`,
//! `tx_batch` and `shutdown` name this [`UdpSocket`] instead of std's in
//! that build; the normal build never compiles this file.
//!
//! What it keeps of a UDP socket: binding an address (port 0 picks a
//! fresh port; a bound address is taken), datagrams queued per bound
//! address in arrival order, each sent datagram delivered at once (or
//! dropped, as UDP does, when nothing is bound there), a blocking receive
//! that waits for one, a non-blocking one that returns none at once. Read
//! timeouts are recorded but a blocking receive waits without one (loom
//! has no clock; the receive thread lifts its timeout anyway).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use al::sync::{Condvar, Mutex};

/// One bound address's queue.
#[derive(Default)]
struct Queue {
    datagrams: Mutex<VecDeque<(Vec<u8>, SocketAddr)>>,
    arrived: Condvar,
}

/// Every bound address, and the next port a bind to port 0 gets. The
/// queues are shared through std's `Arc`: their lock and condvar, which
/// carry the datagrams between threads, are loom's (`al::sync`); the count
/// only keeps a queue while the registry or its socket holds it, which is
/// not a protocol under test (and the registry lives in an execution's
/// global, outside loom's leak check of its own `Arc`s).
struct Net {
    bound: HashMap<SocketAddr, std::sync::Arc<Queue>>,
    next_port: u16,
}

al::global! {
    /// The network (one per loom execution).
    static NET: Mutex<Net> = Mutex::new(Net {
        bound: HashMap::new(),
        next_port: 40_000,
    });
}

/// A socket of the fake network, with std's `UdpSocket` calls the
/// provider makes.
pub(crate) struct UdpSocket {
    local: SocketAddr,
    queue: std::sync::Arc<Queue>,
}

impl UdpSocket {
    /// Binds `addr` (port 0: a fresh port).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
        let mut net = NET.lock();
        let mut local = addr;
        if local.port() == 0 {
            local.set_port(net.next_port);
            net.next_port += 1;
        }
        if net.bound.contains_key(&local) {
            return Err(io::ErrorKind::AddrInUse.into());
        }
        let queue = std::sync::Arc::new(Queue::default());
        net.bound.insert(local, queue.clone());
        Ok(UdpSocket { local, queue })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Accepted and ignored (see the module's comment).
    pub(crate) fn set_read_timeout(&self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    /// Queues `bytes` at `to` (dropped if nothing is bound there).
    pub(crate) fn send_to(&self, bytes: &[u8], to: SocketAddr) -> io::Result<usize> {
        send(self.local, bytes, to);
        Ok(bytes.len())
    }

    /// The oldest queued datagram, waiting for one if `wait`.
    pub(crate) fn take(&self, wait: bool) -> Option<(Vec<u8>, SocketAddr)> {
        let mut q = self.queue.datagrams.lock();
        loop {
            if let Some(d) = q.pop_front() {
                return Some(d);
            }
            if !wait {
                return None;
            }
            self.queue.arrived.wait(&mut q);
        }
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let mut net = NET.lock();
        if net
            .bound
            .get(&self.local)
            .is_some_and(|q| std::sync::Arc::ptr_eq(q, &self.queue))
        {
            net.bound.remove(&self.local);
        }
    }
}

/// Delivers a datagram from `from` to whatever is bound at `to`.
pub(crate) fn send(from: SocketAddr, bytes: &[u8], to: SocketAddr) {
    let Some(queue) = NET.lock().bound.get(&to).cloned() else {
        return;
    };
    queue.datagrams.lock().push_back((bytes.to_vec(), from));
    queue.arrived.notify_all();
}
