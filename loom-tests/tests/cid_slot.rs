//! loom model of the QP's CID slot (production `qp::CidSlot`).
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::{Kind, RawHandle};
use qp::cid;
use qp::{CidSlot, CidState};

mod common;
use common::model;

fn cep(i: u32) -> RawHandle {
    RawHandle::new(Kind::CEP, 0, i)
}

/// Bind vs QP destroy vs unbind: every CEP that is created ends up destroyed
/// exactly once, by exactly one of: the binder that lost, the unbinder
/// (disconnect completion), or QP destroy. No id is lost, none freed twice.
#[test]
fn cid_bind_vs_destroy_vs_unbind() {
    model("cid_bind_vs_destroy_vs_unbind", || {
        let slot = Arc::new(CidSlot::new());
        // destroyed[i]: how many times CEP i was destroyed.
        let destroyed: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());

        let binder = {
            let (slot, destroyed) = (slot.clone(), destroyed.clone());
            thread::spawn(move || {
                // connect: the CEP exists (reference held) before its id is published.
                if cid::bind(&slot, cep(1)).is_err() {
                    destroyed[1].fetch_add(1, Ordering::SeqCst);
                    return;
                }
                // disconnect completion: unbind, and whoever unbinds owns the CEP.
                cid::release(&slot, cep(1), |_| {
                    destroyed[1].fetch_add(1, Ordering::SeqCst);
                });
            })
        };
        let second = {
            let (slot, destroyed) = (slot.clone(), destroyed.clone());
            thread::spawn(move || {
                // a second connect on the same QP
                if cid::bind(&slot, cep(2)).is_err() {
                    destroyed[2].fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        // QP destroy
        cid::tombstone(&slot, |c| {
            destroyed[c.index() as usize].fetch_add(1, Ordering::SeqCst);
        });
        binder.join().unwrap();
        second.join().unwrap();
        assert_eq!(slot.load(), CidState::Tombstone);
        assert_eq!(
            destroyed[1].load(Ordering::SeqCst),
            1,
            "CEP 1 lost or freed twice"
        );
        assert_eq!(
            destroyed[2].load(Ordering::SeqCst),
            1,
            "CEP 2 lost or freed twice"
        );
    });
}
