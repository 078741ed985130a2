//! loom models of connect / accept racing QP destroy, at the CEP level.
//!
//! They run the production binding protocol (`qp::cid::{bind_and_start,
//! release, tombstone}` on the real `CidSlot`) with real access-layer
//! objects (handle tables, destroy, `destroy_raw`, cascades, destroy
//! callbacks). The QP and CEP bodies are stand-ins: the real ones own a
//! provider QP and a CM agent with its own threads, which loom cannot run.
//! Their teardowns do what the real ones do with the slot: QP teardown
//! tombstones it and destroys the CEP it got back; CEP teardown releases
//! its binding.
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::sync::Mutex;
use al::{
    create, destroy_raw, Al, AlConfig, Error, ExecutorMode, Handle, Kind, Obj, Object, RawHandle,
};
use qp::cid::{self, CidSlot, CidState};

mod common;
use common::model;

struct ModelQp {
    cid: CidSlot,
}
impl Object for ModelQp {
    const KIND: Kind = Kind::QP;
    al::object_table!(ModelQp);
    fn teardown(obj: &Arc<Obj<Self>>) {
        cid::tombstone(&obj.cid, |cep| {
            let _ = destroy_raw(cep);
        });
    }
}

struct ModelCep {
    qp: Mutex<Option<Arc<Obj<ModelQp>>>>,
}
impl Object for ModelCep {
    const KIND: Kind = Kind::CEP;
    al::object_table!(ModelCep);
    fn teardown(obj: &Arc<Obj<Self>>) {
        if let Some(qp) = obj.qp.lock().take() {
            cid::release(&qp.cid, obj.core().handle(), |_| {});
        }
    }
}

fn manual_al() -> Arc<Al> {
    Arc::new(
        Al::open_with(AlConfig {
            executor: ExecutorMode::Manual,
            ..AlConfig::default()
        })
        .unwrap(),
    )
}

fn new_qp(inst: &Arc<al::AlInstance>) -> Arc<Obj<ModelQp>> {
    create(inst, None, |_| {
        Ok(ModelQp {
            cid: CidSlot::new(),
        })
    })
    .unwrap()
}

fn new_cep(inst: &Arc<al::AlInstance>) -> al::Result<Arc<Obj<ModelCep>>> {
    create(inst, None, |_| {
        Ok(ModelCep {
            qp: Mutex::new(None),
        })
    })
}

/// What `cep::cm::connect` does with the slot: create the CEP, publish it
/// with `bind_and_start` (the start records the QP on the CEP), and let the
/// loser destroy its own CEP. `None` if the CEP could not be created.
fn connect(
    inst: &Arc<al::AlInstance>,
    qp: &Arc<Obj<ModelQp>>,
) -> Option<(RawHandle, al::Result<()>)> {
    let cep = new_cep(inst).ok()?;
    let h = cep.core().handle();
    let r = cid::bind_and_start(
        &qp.cid,
        h,
        || {
            *cep.qp.lock() = Some(qp.clone());
            Ok(())
        },
        |c| {
            let _ = destroy_raw(c);
        },
    );
    Some((h, r))
}

fn finish(al: Arc<Al>) {
    al.run_callbacks();
    let al = Arc::try_unwrap(al).unwrap_or_else(|_| panic!("AL still shared"));
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

/// connect (create CEP, publish it in the slot, start) vs QP destroy: one
/// winner; the CEP is destroyed exactly once either way and nothing leaks.
#[test]
fn connect_vs_qp_destroy() {
    model("connect_vs_qp_destroy", || {
        let al = manual_al();
        let qp = new_qp(al.instance());
        let qh: Handle<ModelQp> = qp.handle();
        let connector = {
            let (al, qp) = (al.clone(), qp.clone());
            thread::spawn(move || connect(al.instance(), &qp).expect("AL open"))
        };
        al.destroy(qh, None).unwrap();
        drop(qp);
        let (cep, r) = connector.join().unwrap();
        match r {
            Ok(()) => {}
            Err(e) => assert!(matches!(e, Error::Destroying { .. }), "{e}"),
        }
        // Either way the CEP is gone: the loser destroyed its own, or the
        // QP destroy destroyed the one it found bound.
        let cep: Handle<ModelCep> = Handle::from_raw(cep);
        assert!(al.resolve(cep).is_err(), "CEP left behind");
        finish(al);
    });
}

/// accept (bind an existing CEP, start) vs QP destroy: if the QP destroy
/// wins the bind, accept fails and destroys the CEP; if accept wins, the QP
/// destroy destroys it. Exactly once.
#[test]
fn accept_vs_qp_destroy() {
    model("accept_vs_qp_destroy", || {
        let al = manual_al();
        let qp = new_qp(al.instance());
        let qh: Handle<ModelQp> = qp.handle();
        let destroyed = Arc::new(AtomicUsize::new(0));
        let cep = new_cep(al.instance()).unwrap();
        let ch: Handle<ModelCep> = cep.handle();
        let acceptor = {
            let (al, qp, destroyed) = (al.clone(), qp.clone(), destroyed.clone());
            thread::spawn(move || {
                let r = cid::bind_and_start(
                    &qp.cid,
                    ch.raw(),
                    || {
                        *cep.qp.lock() = Some(qp.clone());
                        Ok(())
                    },
                    |_| {},
                );
                if let Err(e) = &r {
                    assert!(matches!(e, Error::Destroying { .. }), "{e}");
                    // QP destroy won: accept destroys the connection's CEP.
                    if al.destroy(ch, None).is_ok() {
                        destroyed.fetch_add(1, Ordering::SeqCst);
                    }
                }
                r.is_ok()
            })
        };
        al.destroy(qh, None).unwrap();
        drop(qp);
        let accepted = acceptor.join().unwrap();
        assert!(al.resolve(ch).is_err(), "CEP left behind");
        if accepted {
            assert_eq!(
                destroyed.load(Ordering::SeqCst),
                0,
                "accept won: only QP destroy destroys"
            );
        } else {
            assert_eq!(destroyed.load(Ordering::SeqCst), 1);
        }
        finish(al);
    });
}

/// Two connects on one QP, then the QP is destroyed: exactly one binds,
/// the loser's CEP is destroyed by the loser, the winner's by QP destroy.
#[test]
fn two_connects_on_one_qp() {
    model("two_connects_on_one_qp", || {
        let al = manual_al();
        let qp = new_qp(al.instance());
        let qh: Handle<ModelQp> = qp.handle();
        let connect = |al: Arc<Al>, qp: Arc<Obj<ModelQp>>| {
            thread::spawn(move || {
                let (h, r) = connect(al.instance(), &qp).expect("AL open");
                (h, r.is_ok())
            })
        };
        let a = connect(al.clone(), qp.clone());
        let b = connect(al.clone(), qp.clone());
        let (ha, oka) = a.join().unwrap();
        let (hb, okb) = b.join().unwrap();
        assert!(oka ^ okb, "exactly one connect binds");
        let (winner, loser): (RawHandle, RawHandle) = if oka { (ha, hb) } else { (hb, ha) };
        assert_eq!(qp.cid.load(), CidState::Bound(winner));
        let loser: Handle<ModelCep> = Handle::from_raw(loser);
        assert!(al.resolve(loser).is_err(), "the loser's CEP leaked");
        al.destroy(qh, None).unwrap();
        let winner: Handle<ModelCep> = Handle::from_raw(winner);
        assert!(al.resolve(winner).is_err(), "QP destroy left its CEP");
        assert_eq!(qp.cid.load(), CidState::Tombstone);
        drop(qp);
        finish(al);
    });
}

/// A connection ending (release) races QP destroy: the slot ends
/// Tombstone, and the CEP is destroyed exactly once.
#[test]
fn release_vs_qp_destroy() {
    model("release_vs_qp_destroy", || {
        let al = manual_al();
        let qp = new_qp(al.instance());
        let qh: Handle<ModelQp> = qp.handle();
        let cep = new_cep(al.instance()).unwrap();
        let ch: Handle<ModelCep> = cep.handle();
        cid::bind_and_start(&qp.cid, ch.raw(), || Ok(()), |_| {}).unwrap();
        *cep.qp.lock() = Some(qp.clone());
        drop(cep);
        let ender = {
            let qp = qp.clone();
            thread::spawn(move || {
                cid::release(&qp.cid, ch.raw(), |c| {
                    let _ = destroy_raw(c);
                })
            })
        };
        al.destroy(qh, None).unwrap();
        ender.join().unwrap();
        assert_eq!(
            qp.cid.load(),
            CidState::Tombstone,
            "a release undid the tombstone"
        );
        assert!(al.resolve(ch).is_err(), "CEP left behind");
        drop(qp);
        finish(al);
    });
}

/// Timewait expiry (the `Released` path: release the binding, destroy the
/// CEP) races the user destroying the CEP (whose teardown releases the
/// binding): the CEP's destroy callback runs exactly once and the QP ends
/// unbound.
#[test]
fn timewait_expiry_vs_destroy() {
    model("timewait_expiry_vs_destroy", || {
        let al = manual_al();
        let qp = new_qp(al.instance());
        let cep = new_cep(al.instance()).unwrap();
        let ch: Handle<ModelCep> = cep.handle();
        cid::bind_and_start(&qp.cid, ch.raw(), || Ok(()), |_| {}).unwrap();
        *cep.qp.lock() = Some(qp.clone());
        drop(cep);
        let calls = Arc::new(AtomicUsize::new(0));
        let expiry = {
            let qp = qp.clone();
            thread::spawn(move || {
                cid::release(&qp.cid, ch.raw(), |c| {
                    let _ = destroy_raw(c);
                });
            })
        };
        let c = calls.clone();
        let user = al.destroy(
            ch,
            Some(Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            })),
        );
        expiry.join().unwrap();
        if let Err(e) = &user {
            assert!(
                matches!(e, Error::InvalidHandle { .. } | Error::Destroying { .. }),
                "{e}"
            );
        }
        al.run_callbacks();
        assert!(al.resolve(ch).is_err());
        assert_eq!(qp.cid.load(), CidState::Unbound);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            usize::from(user.is_ok()),
            "the user's destroy callback runs once if its destroy won"
        );
        drop(qp);
        finish(al);
    });
}

/// AL close races a connect in progress on another thread: whatever the
/// interleaving, the close reclaims the CEP (creation fails with
/// `Destroying`, or the cascade destroys it). The QP belongs to another
/// AL instance here, so QP destroy cannot mask a CEP that escaped the
/// close: only the close's own sealing and cascade are checked.
#[test]
fn al_close_vs_connect() {
    model("al_close_vs_connect", || {
        let al = manual_al();
        let other = manual_al();
        let qp = new_qp(other.instance());
        let connector = {
            let (inst, qp) = (al.instance().clone(), qp.clone());
            thread::spawn(move || {
                // Creation fails once the close has started; either way the
                // model only checks what the close leaves behind.
                let _ = connect(&inst, &qp);
            })
        };
        al.instance().close_async(None).unwrap();
        connector.join().unwrap();
        al.run_callbacks();
        let stats = al.stats();
        assert!(stats.is_clean(), "AL close left {stats}");
        drop(al);
        drop(qp);
        finish(other);
    });
}
