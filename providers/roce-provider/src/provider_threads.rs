//! Which threads are the provider's own (a port's receive thread, the
//! timer thread): their CQ polls are never an application busy-polling,
//! and a device's last handle dropped on one of them is never joined
//! there.

al::thread_local_value! {
    /// Set on the provider's own threads (receive and timer threads).
    static PROVIDER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as one of the provider's own (a port's
/// receive thread, the timer thread): see [`on_provider_thread`].
pub(crate) fn mark_provider_thread() {
    PROVIDER_THREAD.with(|p| p.set(true));
}

/// Whether the calling thread is one of the provider's own. Its polls of
/// a CQ are never an application busy-polling
/// (`DevShared::note_poll`): they are the CM agent's
/// rounds served inline and the callbacks run after a receive
/// (`al::executor::inline`), each a poll or two per message, and the
/// thread goes back to its socket when they are done. Counted, a stream
/// of CM messages on one port made a run of empty polls and the receive
/// threads stepped aside for a poller that was not there: the next MAD
/// waited out a nap of 100 us to 1.6 ms (`perf conn-rate --transport
/// udp`: p99 ~500 us, REQ -> REJ median 70 us instead of 17).
pub(crate) fn on_provider_thread() -> bool {
    PROVIDER_THREAD.with(|p| p.get())
}
