//! Binding a connection endpoint to a QP through the QP's CID slot.
//!
//! These few functions are the whole protocol by which connect, accept,
//! disconnect completion and QP destroy agree on who owns a CEP; the CEP
//! objects call them, and the loom models (`loom-tests/tests/cep_binding.rs`)
//! check them against QP destroy.
//!
//! Rules (see `docs/ownership.md`, "The CID slot"):
//! * The caller holds its reference to the CEP before its handle is
//!   published in the slot, and for the whole call.
//! * Exactly one party ends up destroying each CEP: the binder that lost,
//!   the unbinder, or the QP destroy that took it out of the slot.

use al::{RawHandle, Result};
use qp::CidSlot;

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
        destroy_cep(cep);
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
    use al::{Error, Kind};
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
