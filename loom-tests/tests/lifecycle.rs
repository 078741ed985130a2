//! loom models of the handle table and the object lifecycle, run on the
//! production `al` crate compiled with `--cfg ibal_loom`.
//!
//! Run with `bash loom-tests/run.sh` (see docs/verification.md).
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

mod common;
use common::model;

use al::{create, Al, AlConfig, Error, ExecutorMode, HandleTable, Kind, Obj, Object};

#[derive(Debug)]
struct Widget {
    label: u32,
}
impl Object for Widget {
    const KIND: Kind = Kind::custom(16);
    al::object_table!(Widget);
}

#[derive(Debug)]
struct Gadget {
    _parent: Arc<Obj<Widget>>,
}
impl Object for Gadget {
    const KIND: Kind = Kind::custom(17);
    al::object_table!(Gadget);
}

fn manual_al() -> Al {
    Al::open_with(AlConfig {
        executor: ExecutorMode::Manual,
        ..AlConfig::default()
    })
    .unwrap()
}

fn counting_callback(counter: &Arc<AtomicUsize>) -> al::DestroyCallback {
    let counter = counter.clone();
    Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    })
}

/// A lookup racing a destroy either sees the whole object or a clean
/// `InvalidHandle`, never freed memory; the destroy callback runs once.
#[test]
fn resolve_vs_destroy() {
    model("resolve_vs_destroy", || {
        let al = Arc::new(manual_al());
        let h = create(al.instance(), None, |_| Ok(Widget { label: 42 }))
            .unwrap()
            .handle();
        let calls = Arc::new(AtomicUsize::new(0));
        let reader = {
            let al = al.clone();
            thread::spawn(move || match al.resolve(h) {
                Ok(r) => assert_eq!(r.label, 42),
                Err(e) => assert!(matches!(e, Error::InvalidHandle { .. }), "{e}"),
            })
        };
        al.destroy(h, Some(counting_callback(&calls))).unwrap();
        reader.join().unwrap();
        al.run_callbacks();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(al.stats().is_clean());
        let al = Arc::try_unwrap(al).unwrap();
        assert!(al.close().unwrap().is_clean());
    });
}

/// Two destroys of one object: exactly one wins, the loser gets an error,
/// and only the winner's destroy callback runs, exactly once.
#[test]
fn destroy_vs_destroy() {
    model("destroy_vs_destroy", || {
        let al = Arc::new(manual_al());
        let h = create(al.instance(), None, |_| Ok(Widget { label: 1 }))
            .unwrap()
            .handle();
        let (mine_calls, their_calls) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let other = {
            let (al, calls) = (al.clone(), their_calls.clone());
            thread::spawn(move || al.destroy(h, Some(counting_callback(&calls))).is_ok())
        };
        let mine = al.destroy(h, Some(counting_callback(&mine_calls)));
        if let Err(e) = &mine {
            assert!(
                matches!(e, Error::InvalidHandle { .. } | Error::Destroying { .. }),
                "{e}"
            );
        }
        let theirs = other.join().unwrap();
        assert!(mine.is_ok() ^ theirs, "exactly one destroy wins");
        al.run_callbacks();
        let (m, t) = (
            mine_calls.load(Ordering::SeqCst),
            their_calls.load(Ordering::SeqCst),
        );
        if mine.is_ok() {
            assert_eq!((m, t), (1, 0), "winner's callback once, loser's never");
        } else {
            assert_eq!((m, t), (0, 1), "winner's callback once, loser's never");
        }
        let al = Arc::try_unwrap(al).unwrap();
        assert!(al.close().unwrap().is_clean());
    });
}

/// Destroy while another thread holds a resolved `Arc`: the destroy
/// callback (driven concurrently) never runs while that `Arc` is held.
#[test]
fn destroy_while_another_thread_holds_an_arc() {
    model("destroy_while_another_thread_holds_an_arc", || {
        let al = Arc::new(manual_al());
        let h = create(al.instance(), None, |_| Ok(Widget { label: 5 }))
            .unwrap()
            .handle();
        let holding = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let holder = {
            let (al, holding, released) = (al.clone(), holding.clone(), released.clone());
            thread::spawn(move || {
                if let Ok(r) = al.resolve(h) {
                    let obj = r.to_arc();
                    // Still inside the resolved reference: the object cannot
                    // be gone yet, so its callback cannot have run.
                    holding.store(true, Ordering::SeqCst);
                    drop(r);
                    assert_eq!(obj.label, 5);
                    released.store(true, Ordering::SeqCst);
                    drop(obj);
                }
            })
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let (seen_holding, seen_release) = (holding.clone(), released.clone());
        let c = calls.clone();
        al.destroy(
            h,
            Some(Box::new(move |_| {
                assert!(
                    !seen_holding.load(Ordering::SeqCst) || seen_release.load(Ordering::SeqCst),
                    "destroy callback ran while a reference was held"
                );
                c.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .unwrap();
        al.run_callbacks();
        holder.join().unwrap();
        al.run_callbacks();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let al = Arc::try_unwrap(al).unwrap();
        assert!(al.close().unwrap().is_clean());
    });
}

/// A child created while its parent is destroyed either joins the cascade
/// or fails with `Destroying`; nothing is left live either way.
#[test]
fn create_child_vs_destroy_parent() {
    model("create_child_vs_destroy_parent", || {
        let al = Arc::new(manual_al());
        let parent = create(al.instance(), None, |_| Ok(Widget { label: 0 })).unwrap();
        let ph = parent.handle();
        let creator = {
            let al = al.clone();
            thread::spawn(move || {
                let r = create(al.instance(), Some(parent.core()), |_| {
                    Ok(Gadget {
                        _parent: parent.clone(),
                    })
                });
                match r {
                    Ok(child) => Some(child.handle()),
                    Err(e) => {
                        assert!(matches!(e, Error::Destroying { .. }), "{e}");
                        None
                    }
                }
            })
        };
        al.destroy(ph, None).unwrap();
        let child = creator.join().unwrap();
        if let Some(child) = child {
            assert!(al.resolve(child).is_err(), "the cascade reached the child");
        }
        al.run_callbacks();
        assert!(al.stats().is_clean(), "{}", al.stats());
        let al = Arc::try_unwrap(al).unwrap();
        assert!(al.close().unwrap().is_clean());
    });
}

/// The table alone: a lookup racing remove and re-insert of the same slot
/// never yields the new object through the old handle.
#[test]
fn table_resolve_vs_remove_vs_reuse() {
    model("table_resolve_vs_remove_vs_reuse", || {
        let table = Arc::new(HandleTable::new(Kind::custom(18)));
        let old = table.insert(Arc::new(1u32)).unwrap();
        let reader = {
            let table = table.clone();
            thread::spawn(move || {
                if let Ok(r) = table.get(old) {
                    assert_eq!(*r, 1, "old handle resolved to a later object");
                }
            })
        };
        let owned = table.remove(old).unwrap();
        assert_eq!(*owned, 1);
        let new = table.insert(Arc::new(2u32)).unwrap();
        assert_ne!(new, old);
        reader.join().unwrap();
        assert!(table.get(old).is_err());
        assert_eq!(*table.get(new).unwrap(), 2);
    });
}
