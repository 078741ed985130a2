//! The connection-id (CID) slot of a queue pair.
//!
//! The old access layer stored the QP's connection id in a plain field that
//! connect, accept and destroy each read and wrote under different locks (or
//! none), so a connect racing a destroy could leak the new connection
//! endpoint or free it twice. Here the slot is one atomic word with three
//! states and exactly four operations:
//!
//! ```text
//!              bind (CAS)                    tombstone (swap)
//!   Unbound ---------------> Bound(cep) ---------------------> Tombstone
//!      ^                        |                                 ^
//!      +------ unbind (CAS) ----+          Unbound --tombstone----+
//! ```
//!
//! * bind ([`bind`], [`bind_and_start`]): compare-exchange `Unbound -> Bound(cep)`. Seeing
//!   `Bound` fails with [`Error::AlreadyConnected`], seeing `Tombstone` with
//!   [`Error::Destroying`]; the loser destroys the CEP it created.
//! * unbind ([`release`]): compare-exchange `Bound(cep) -> Unbound`, never a
//!   blind store, so a stale unbind cannot clear someone else's binding or
//!   resurrect a tombstoned QP.
//! * tombstone ([`tombstone`]): swap in `Tombstone` (terminal); the caller (QP
//!   destroy) gets back whatever CEP was bound, exactly once, and destroys it.
//!
//! The slot stores a CEP *handle*, never an `Arc`, so the `qp` crate does not
//! depend on the connection manager above it.

use std::fmt;

use al::sync::atomic::{AtomicU64, Ordering};
use al::{Error, Kind, RawHandle, Result};

const UNBOUND: u64 = 0;
/// Not a valid handle: kind 0xff is no kind.
const TOMBSTONE: u64 = u64::MAX;

/// What the slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CidState {
    /// No connection endpoint is bound; the QP may connect or accept.
    Unbound,
    /// Bound to this connection endpoint.
    Bound(RawHandle),
    /// The QP is being destroyed; nothing can bind again.
    Tombstone,
}

impl CidState {
    fn from_word(word: u64) -> CidState {
        match word {
            UNBOUND => CidState::Unbound,
            TOMBSTONE => CidState::Tombstone,
            h => CidState::Bound(RawHandle::from_u64(h)),
        }
    }
}

/// The QP's connection-id slot; see the module docs.
pub struct CidSlot {
    word: AtomicU64,
}

impl Default for CidSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl CidSlot {
    /// An unbound slot.
    pub fn new() -> Self {
        CidSlot {
            word: AtomicU64::new(UNBOUND),
        }
    }

    /// The current state (a snapshot: act on it only through the operations).
    pub fn load(&self) -> CidState {
        CidState::from_word(self.word.load(Ordering::Acquire))
    }

    /// Bind `cep`. The caller must already hold its reference to the CEP
    /// (the id is published here, and a reference is taken before an id is
    /// published). Crate-private: other crates go through the protocol's
    /// functions below ([`bind`], [`release`], [`tombstone`]).
    pub(crate) fn bind(&self, cep: RawHandle) -> Result<()> {
        let word = cep.as_u64();
        if word == UNBOUND || word == TOMBSTONE {
            return Err(Error::invalid_parameter("not a connection endpoint handle"));
        }
        self.bind_word(word)
    }

    #[cfg(not(ibal_mutant = "cid_load_store"))]
    fn bind_word(&self, word: u64) -> Result<()> {
        match self
            .word
            .compare_exchange(UNBOUND, word, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(current) => Err(Self::bind_error(current)),
        }
    }

    /// MUTANT (loom-tests/run.sh --mutants): the old access layer's plain
    /// read-then-write of the CID. A destroy between the two is overwritten.
    #[cfg(ibal_mutant = "cid_load_store")]
    fn bind_word(&self, word: u64) -> Result<()> {
        let current = self.word.load(Ordering::Acquire);
        if current != UNBOUND {
            return Err(Self::bind_error(current));
        }
        self.word.store(word, Ordering::Release);
        Ok(())
    }

    fn bind_error(current: u64) -> Error {
        match CidState::from_word(current) {
            CidState::Tombstone => Error::Destroying {
                kind: Kind::QP,
                raw: 0,
            },
            _ => Error::AlreadyConnected,
        }
    }

    /// Unbind `cep` if (and only if) it is the one bound. Returns whether it
    /// was; `false` means someone else (QP destroy, another unbind) already
    /// took the binding and owns its cleanup.
    #[cfg(not(ibal_mutant = "cid_blind_unbind"))]
    pub(crate) fn unbind(&self, cep: RawHandle) -> bool {
        self.word
            .compare_exchange(cep.as_u64(), UNBOUND, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// MUTANT (loom-tests/run.sh --mutants): the old layer cleared the CID
    /// with a plain store after checking it, which can clear a tombstone
    /// (or another CEP's binding) written in between.
    #[cfg(ibal_mutant = "cid_blind_unbind")]
    pub(crate) fn unbind(&self, cep: RawHandle) -> bool {
        if self.word.load(Ordering::Acquire) != cep.as_u64() {
            return false;
        }
        self.word.store(UNBOUND, Ordering::Release);
        true
    }

    /// Make the slot terminal and return the CEP that was bound, if any. Only
    /// the first call can return `Some`.
    pub(crate) fn tombstone(&self) -> Option<RawHandle> {
        match CidState::from_word(self.word.swap(TOMBSTONE, Ordering::AcqRel)) {
            CidState::Bound(cep) => Some(cep),
            CidState::Unbound | CidState::Tombstone => None,
        }
    }
}

impl fmt::Debug for CidSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.load(), f)
    }
}

// ------------------------------------------------------------ binding --
//
// The whole protocol by which connect, accept, disconnect completion and QP
// destroy agree on who owns a CEP. The CEP objects (cep crate) and QP
// teardown call these; the loom models check them.
//
// * The caller holds its reference to the CEP before its handle is
//   published in the slot, and for the whole call.
// * Exactly one party ends up destroying each CEP: the binder that lost, the
//   unbinder, or the QP destroy that took it out of the slot.

/// Publish `cep` in `cid` (compare-exchange `Unbound -> Bound`): the first
/// step of [`bind_and_start`], for a caller that runs its start itself and
/// gives the binding back with [`release`] if the start fails.
pub fn bind(cid: &CidSlot, cep: RawHandle) -> Result<()> {
    cid.bind(cep)
}

/// Publish `cep` in `cid`, then run `start` (send the REQ or REP). If the
/// bind loses (the QP is connected or being destroyed), `destroy_cep` is
/// called for the CEP this caller created and the bind error is returned.
/// If `start` fails, the binding is taken back; if QP destroy took it first,
/// QP destroy owns the CEP's destruction, so it is not destroyed twice.
pub fn bind_and_start(
    cid: &CidSlot,
    cep: RawHandle,
    start: impl FnOnce() -> Result<()>,
    destroy_cep: impl FnOnce(RawHandle),
) -> Result<()> {
    if let Err(e) = cid.bind(cep) {
        // MUTANT (loom-tests/run.sh --mutants): the old layer returned the
        // error and forgot the CEP it had created for the attempt.
        #[cfg(not(ibal_mutant = "bind_loser_leaks"))]
        destroy_cep(cep);
        #[cfg(ibal_mutant = "bind_loser_leaks")]
        let _ = destroy_cep;
        return Err(e);
    }
    match start() {
        Ok(()) => Ok(()),
        Err(e) => {
            release(cid, cep, destroy_cep);
            Err(e)
        }
    }
}

/// The connection of `cep` is over (rejected, timed out, disconnected and out
/// of timewait, or the CEP is being destroyed): free the QP for a new
/// connection. Only if this call took the binding does it destroy the CEP;
/// a QP destroy that took it first does that instead.
pub fn release(cid: &CidSlot, cep: RawHandle, destroy_cep: impl FnOnce(RawHandle)) -> bool {
    if cid.unbind(cep) {
        destroy_cep(cep);
        true
    } else {
        false
    }
}

/// QP destroy: make the slot terminal and destroy the CEP that was bound,
/// exactly once.
pub fn tombstone(cid: &CidSlot, destroy_cep: impl FnOnce(RawHandle)) {
    if let Some(cep) = cid.tombstone() {
        destroy_cep(cep);
    }
}

#[cfg(all(test, not(ibal_loom)))]
mod tests {
    use super::*;

    fn cep(i: u32) -> RawHandle {
        RawHandle::new(Kind::CEP, 0, i)
    }

    #[test]
    fn bind_unbind_rebind() {
        let s = CidSlot::new();
        s.bind(cep(1)).unwrap();
        assert_eq!(s.load(), CidState::Bound(cep(1)));
        assert!(matches!(s.bind(cep(2)), Err(Error::AlreadyConnected)));
        assert!(
            !s.unbind(cep(2)),
            "a stale unbind must not clear another binding"
        );
        assert!(s.unbind(cep(1)));
        assert!(!s.unbind(cep(1)), "unbind happens once");
        s.bind(cep(2)).unwrap();
    }

    #[test]
    fn tombstone_is_terminal_and_hands_back_the_cep_once() {
        let s = CidSlot::new();
        s.bind(cep(7)).unwrap();
        assert_eq!(s.tombstone(), Some(cep(7)));
        assert_eq!(s.tombstone(), None);
        assert!(matches!(s.bind(cep(8)), Err(Error::Destroying { .. })));
        assert!(
            !s.unbind(cep(7)),
            "no unbind after destroy took the binding"
        );
        assert_eq!(s.load(), CidState::Tombstone);
    }

    #[test]
    fn invalid_handles_cannot_be_bound() {
        let s = CidSlot::new();
        assert!(s.bind(RawHandle::from_u64(0)).is_err());
        assert!(s.bind(RawHandle::from_u64(u64::MAX)).is_err());
        assert_eq!(s.load(), CidState::Unbound);
    }

    #[test]
    fn racing_binds_and_destroy_lose_nothing() {
        for _ in 0..500 {
            let s = CidSlot::new();
            let outcomes = std::thread::scope(|sc| {
                let binders: Vec<_> = (1..=2)
                    .map(|i| {
                        let s = &s;
                        sc.spawn(move || s.bind(cep(i)).is_ok().then_some(cep(i)))
                    })
                    .collect();
                let destroyer = sc.spawn(|| s.tombstone());
                let bound: Vec<_> = binders
                    .into_iter()
                    .filter_map(|b| b.join().unwrap())
                    .collect();
                (bound, destroyer.join().unwrap())
            });
            let (bound, taken) = outcomes;
            assert!(bound.len() <= 1, "two binds succeeded: {bound:?}");
            // Whatever was bound is handed to exactly one owner: the
            // destroyer, or (bound after the tombstone? impossible) nobody.
            match (bound.first(), taken) {
                (Some(b), Some(t)) => assert_eq!(*b, t),
                (Some(b), None) => panic!("{b:?} bound but never handed to destroy"),
                (None, Some(t)) => panic!("{t:?} handed to destroy but no bind won"),
                (None, None) => {}
            }
        }
    }
}

#[cfg(all(test, not(ibal_loom)))]
mod binding_tests {
    use super::*;
    use std::cell::RefCell;

    fn cep(i: u32) -> RawHandle {
        RawHandle::new(Kind::CEP, 0, i)
    }

    #[test]
    fn the_loser_destroys_its_own_cep_and_the_winner_keeps_it() {
        let slot = CidSlot::new();
        let destroyed = RefCell::new(Vec::new());
        bind_and_start(&slot, cep(1), || Ok(()), |c| destroyed.borrow_mut().push(c)).unwrap();
        let r = bind_and_start(&slot, cep(2), || Ok(()), |c| destroyed.borrow_mut().push(c));
        assert!(matches!(r, Err(Error::AlreadyConnected)));
        assert_eq!(*destroyed.borrow(), [cep(2)]);
        tombstone(&slot, |c| destroyed.borrow_mut().push(c));
        assert_eq!(*destroyed.borrow(), [cep(2), cep(1)]);
    }

    #[test]
    fn a_failed_start_gives_the_qp_back() {
        let slot = CidSlot::new();
        let destroyed = RefCell::new(Vec::new());
        let r = bind_and_start(
            &slot,
            cep(1),
            || Err(Error::Timeout("no answer".into())),
            |c| destroyed.borrow_mut().push(c),
        );
        assert!(r.is_err());
        assert_eq!(*destroyed.borrow(), [cep(1)]);
        bind_and_start(&slot, cep(2), || Ok(()), |_| unreachable!()).unwrap();
    }

    #[test]
    fn release_after_qp_destroy_does_nothing() {
        let slot = CidSlot::new();
        bind_and_start(&slot, cep(1), || Ok(()), |_| unreachable!()).unwrap();
        let destroyed = RefCell::new(0);
        tombstone(&slot, |_| *destroyed.borrow_mut() += 1);
        assert!(!release(&slot, cep(1), |_| *destroyed.borrow_mut() += 1));
        assert_eq!(*destroyed.borrow(), 1);
    }
}
