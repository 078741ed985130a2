//! A device's event thread (`rdma-ev-<name>`): it `poll(2)`s the
//! completion channel's fd, the context's async-event fd and a wake-up
//! socket, and calls the hooks:
//!
//! * a completion event: the CQ's `on_completion`;
//! * `IBV_EVENT_CQ_ERR`: the CQ's `on_async_error(CqOverflow)`;
//! * a QP's events (fatal, request and access errors, communication
//!   established, SQ drained, path migration, last WQE reached): the QP's
//!   hook ([`crate::RdmaDevice::set_qp_event_hook`]);
//! * port events (active, down, LID, P_Key, SM, GID changes, client
//!   reregister) and the device's fatal error: the device's hook
//!   ([`crate::RdmaDevice::set_device_event_hook`]).
//!
//! Each object's hook is looked up by the object's address **before** the
//! event is acknowledged (`ibv_destroy_cq`/`ibv_destroy_qp` wait for the
//! acknowledgement, so until then the address cannot name a newer object),
//! the event is acknowledged at once, and the hook runs with no lock held
//! (so it may destroy its object). Events no hook takes (an SRQ's, a WQ's,
//! an object without a hook, a code newer than the bindings) are counted.
//! The thread stops when the device and every object holding it are gone;
//! the join happens on the dropping thread, or on the reaper when that is a
//! provider thread or a callback (`reaper.rs`).

use al::sync::atomic::{AtomicU64, Ordering};
use al::sync::thread::JoinHandle;
use al::sync::{Arc, Mutex, MutexGuard};
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use al::{Error, Result};
use provider::{AsyncEvent, AsyncHook, CompletionHook};

use crate::events::{self, DeviceEventHook, Element, QpEventHook};
use crate::sys::{self, CompChannel, Context};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// A CQ's hooks.
pub(crate) struct CqHooks {
    pub(crate) on_completion: Option<CompletionHook>,
    pub(crate) on_async_error: Option<AsyncHook>,
    /// Overflow events seen so far (rdma-core does not say how many
    /// completions an overflow lost: each event counts one).
    pub(crate) lost: AtomicU64,
}

/// A QP's hook, settable after creation.
#[derive(Default)]
pub(crate) struct QpHook {
    hook: Mutex<Option<QpEventHook>>,
}

impl QpHook {
    pub(crate) fn set(&self, hook: Option<QpEventHook>) {
        *lock(&self.hook) = hook;
    }

    pub(crate) fn get(&self) -> Option<QpEventHook> {
        lock(&self.hook).clone()
    }
}

/// What the event thread shares with the device.
pub(crate) struct EventState {
    ctx: Arc<Context>,
    pub(crate) channel: Arc<CompChannel>,
    /// The hooks of each live CQ, by its `sys::Cq::key`.
    cqs: Mutex<HashMap<usize, Arc<CqHooks>>>,
    /// The hook of each live QP, by its `sys::Qp::key`.
    qps: Mutex<HashMap<usize, Arc<QpHook>>>,
    /// The device's hook for port and device events.
    device: Mutex<Option<DeviceEventHook>>,
    /// Asynchronous events no hook took.
    unrouted: AtomicU64,
}

impl EventState {
    fn cq_hooks(&self, key: usize) -> Option<Arc<CqHooks>> {
        lock(&self.cqs).get(&key).cloned()
    }

    fn qp_hook(&self, key: usize) -> Option<QpEventHook> {
        let slot = lock(&self.qps).get(&key).cloned()?;
        slot.get()
    }

    fn run(&self, wake: &UnixStream) {
        let fds = [self.channel.fd(), self.ctx.async_fd(), wake.as_raw_fd()];
        loop {
            let ready = match sys::poll_readable(&fds, -1) {
                Ok(r) => r,
                Err(_) => {
                    // poll itself failed (EBADF/ENOMEM): retry slowly
                    // rather than spin; the wake-up still ends the loop.
                    al::sync::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if ready[2] {
                return;
            }
            if ready[0] {
                self.completion_event();
            }
            if ready[1] {
                self.async_event();
            }
        }
    }

    fn completion_event(&self) {
        let Ok(ev) = self.channel.get_cq_event() else {
            return;
        };
        // Look the hooks up before the acknowledgement: until then the CQ
        // cannot be destroyed, so its address cannot name a newer CQ.
        let hooks = self.cq_hooks(ev.key());
        drop(ev);
        if let Some(f) = hooks.as_ref().and_then(|h| h.on_completion.as_ref()) {
            f();
        }
    }

    fn async_event(&self) {
        let Ok(ev) = self.ctx.get_async_event() else {
            return;
        };
        let kind = ev.kind();
        // Every look-up before the acknowledgement, as above.
        let call: Option<Box<dyn FnOnce()>> = match events::element_of(kind.code) {
            Some(Element::Cq) => self.cq_hooks(kind.key).map(|h| {
                Box::new(move || {
                    let lost = h.lost.fetch_add(1, Ordering::SeqCst) + 1;
                    if let Some(f) = &h.on_async_error {
                        f(AsyncEvent::CqOverflow { lost });
                    }
                }) as Box<dyn FnOnce()>
            }),
            Some(Element::Qp) => match (self.qp_hook(kind.key), events::qp_event(kind.code)) {
                (Some(f), Some(e)) => Some(Box::new(move || f(e))),
                _ => None,
            },
            Some(Element::Port | Element::Device) => {
                let hook = lock(&self.device).clone();
                match (hook, events::device_event(kind.code, kind.port)) {
                    (Some(f), Some(e)) => Some(Box::new(move || f(e))),
                    _ => None,
                }
            }
            Some(Element::Srq | Element::Wq) | None => None,
        };
        drop(ev);
        match call {
            Some(call) => call(),
            None => {
                self.unrouted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The running thread, stopped (woken, then joined) when dropped.
pub(crate) struct Events {
    pub(crate) state: Arc<EventState>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Events {
    pub(crate) fn start(ctx: &Arc<Context>, name: &str) -> Result<Events> {
        let channel = Arc::new(CompChannel::new(ctx)?);
        let state = Arc::new(EventState {
            ctx: ctx.clone(),
            channel,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            device: Mutex::new(None),
            unrouted: AtomicU64::new(0),
        });
        let (wake, wake_rx) = UnixStream::pair().map_err(|e| {
            Error::Other(format!("socketpair for {name}'s event thread: {e}").into())
        })?;
        let st = state.clone();
        let thread = al::sync::thread::Builder::new()
            .name(format!("rdma-ev-{name}"))
            .spawn(move || {
                crate::reaper::mark_provider_thread();
                st.run(&wake_rx)
            })
            .map_err(|e| {
                Error::InsufficientResources(format!("{name}'s event thread: {e}").into())
            })?;
        Ok(Events {
            state,
            wake,
            thread: Some(thread),
        })
    }

    /// Registers a CQ's hooks; they leave the table when the entry drops.
    pub(crate) fn add_cq(self: &Arc<Self>, key: usize, hooks: CqHooks) -> CqEntry {
        lock(&self.state.cqs).insert(key, Arc::new(hooks));
        CqEntry {
            key,
            events: self.clone(),
        }
    }

    /// Registers a QP (no hook yet); it leaves the table when the entry
    /// drops.
    pub(crate) fn add_qp(self: &Arc<Self>, key: usize) -> QpEntry {
        let hook = Arc::new(QpHook::default());
        lock(&self.state.qps).insert(key, hook.clone());
        QpEntry {
            key,
            hook,
            events: self.clone(),
        }
    }

    /// Sets (or clears) the device's hook for port and device events.
    pub(crate) fn set_device_hook(&self, hook: Option<DeviceEventHook>) {
        *lock(&self.state.device) = hook;
    }

    /// Asynchronous events no hook took so far.
    pub(crate) fn unrouted(&self) -> u64 {
        self.state.unrouted.load(Ordering::Relaxed)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = (&self.wake).write_all(&[1]);
        if let Some(t) = self.thread.take() {
            // A hook may hold the last reference to the device: then this
            // runs on the event thread itself, which cannot join itself;
            // it sees the wake-up and ends once the hook returns.
            if t.thread().id() == al::sync::thread::current().id() {
                return;
            }
            // Anywhere else the thread ends at once (the wake-up), but the
            // join still waits for it: never on a provider thread or in a
            // callback.
            crate::reaper::teardown(move || {
                let _ = t.join();
            });
        }
    }
}

/// Removes a CQ's hooks from the event thread's table when the CQ's
/// handle goes (destroy or drop), before the CQ itself is destroyed.
pub(crate) struct CqEntry {
    key: usize,
    events: Arc<Events>,
}

impl Drop for CqEntry {
    fn drop(&mut self) {
        lock(&self.events.state.cqs).remove(&self.key);
    }
}

/// A QP's place in the event thread's table, removed when the QP's handle
/// goes, before the QP itself is destroyed (so a newer QP at the same
/// address never loses its entry to this one's removal).
pub(crate) struct QpEntry {
    key: usize,
    pub(crate) hook: Arc<QpHook>,
    events: Arc<Events>,
}

impl Drop for QpEntry {
    fn drop(&mut self) {
        let mut qps = lock(&self.events.state.qps);
        if qps
            .get(&self.key)
            .is_some_and(|h| Arc::ptr_eq(h, &self.hook))
        {
            qps.remove(&self.key);
        }
    }
}
