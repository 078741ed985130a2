//! The object lifecycle rules, one test per rule (see docs/ownership.md).
// These run on the normal build; the loom build has its own models.
#![cfg(not(ibal_loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use al::{
    create, post_callback, Al, AlConfig, Error, ExecutorMode, Handle, Kind, Obj, Object, RawHandle,
};

/// A top-level test object.
#[derive(Debug)]
struct Widget {
    label: u32,
}
impl Object for Widget {
    const KIND: Kind = Kind::custom(16);
    al::object_table!(Widget);
}

/// A child of a widget.
#[derive(Debug)]
struct Gadget {
    _parent: Arc<Obj<Widget>>,
}
impl Object for Gadget {
    const KIND: Kind = Kind::custom(17);
    al::object_table!(Gadget);
}

fn manual() -> Al {
    Al::open_with(AlConfig {
        executor: ExecutorMode::Manual,
        ..AlConfig::default()
    })
    .unwrap()
}

type Log = Arc<Mutex<Vec<String>>>;

fn logger(log: &Log, what: &str) -> al::DestroyCallback {
    let log = log.clone();
    let what = what.to_string();
    Box::new(move |_| log.lock().unwrap().push(what))
}

fn widget(al: &Al, label: u32) -> Handle<Widget> {
    create(al.instance(), None, |_| Ok(Widget { label }))
        .unwrap()
        .handle()
}

fn gadget(al: &Al, parent: Handle<Widget>) -> Result<Handle<Gadget>, Error> {
    let p = al.resolve(parent)?.to_arc();
    create(al.instance(), Some(p.core()), |_| {
        Ok(Gadget { _parent: p.clone() })
    })
    .map(|g| g.handle())
}

#[test]
fn create_resolve_destroy_runs_the_callback_once_and_counts_return_to_zero() {
    let al = manual();
    let h = widget(&al, 7);
    assert_eq!(al.resolve(h).unwrap().label, 7);
    assert_eq!(al.stats().live(Widget::KIND), 1);
    let log = Log::default();
    al.destroy(h, Some(logger(&log, "w"))).unwrap();
    assert!(matches!(al.resolve(h), Err(Error::InvalidHandle { .. })));
    // Still counted until the destroy callback has run on the executor.
    assert_eq!(al.stats().live(Widget::KIND), 1);
    assert_eq!(al.run_callbacks(), 1);
    assert_eq!(*log.lock().unwrap(), ["w"]);
    assert!(al.stats().is_clean(), "{}", al.stats());
    assert_eq!(al.stats().created(Widget::KIND), 1);
}

#[test]
fn a_second_destroy_is_an_error_and_its_callback_is_not_taken() {
    let al = manual();
    let h = widget(&al, 1);
    // Hold the object so the first destroy cannot finish the removal yet.
    let held = al.resolve(h).unwrap().to_arc();
    let log = Log::default();
    al.destroy(h, Some(logger(&log, "first"))).unwrap();
    let second = al.destroy(h, Some(logger(&log, "second")));
    assert!(
        matches!(second, Err(Error::InvalidHandle { .. })),
        "{second:?}"
    );
    drop(held);
    al.run_callbacks();
    assert_eq!(*log.lock().unwrap(), ["first"]);
}

#[test]
fn concurrent_double_destroy_has_exactly_one_winner() {
    for _ in 0..200 {
        let al = Al::open().unwrap();
        let h = widget(&al, 1);
        let calls = Arc::new(AtomicUsize::new(0));
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let c = calls.clone();
                    let r = al.destroy(
                        h,
                        Some(Box::new(move |_| {
                            c.fetch_add(1, Ordering::SeqCst);
                        })),
                    );
                    match r {
                        Ok(()) => {
                            wins.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::InvalidHandle { .. } | Error::Destroying { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                });
            }
        });
        let stats = al.close().unwrap();
        assert!(stats.is_clean());
        assert_eq!(wins.load(Ordering::SeqCst), 1);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn stale_forged_wrong_type_and_foreign_handles_are_invalid() {
    let a = manual();
    let b = manual();
    let h = widget(&a, 1);
    // Another instance's handle.
    assert!(matches!(b.resolve(h), Err(Error::InvalidHandle { .. })));
    assert!(matches!(
        b.destroy(h, None),
        Err(Error::InvalidHandle { .. })
    ));
    // Wrong type: a widget handle presented as a gadget.
    let as_gadget: Handle<Gadget> = Handle::from_raw(h.raw());
    assert!(matches!(
        a.resolve(as_gadget),
        Err(Error::InvalidHandle { .. })
    ));
    // Forged values.
    for raw in [0, 1, u64::MAX, h.as_u64() ^ (1 << 40), h.as_u64() + 1] {
        let forged: Handle<Widget> = Handle::from_raw(RawHandle::from_u64(raw));
        assert!(a.resolve(forged).is_err(), "{raw:#x}");
    }
    // Stale.
    a.destroy(h, None).unwrap();
    assert!(a.resolve(h).is_err());
    let again = widget(&a, 2);
    assert!(a.resolve(h).is_err());
    assert_eq!(a.resolve(again).unwrap().label, 2);
    // The error text says what happened.
    let text = a.resolve(h).unwrap_err().to_string();
    assert!(text.contains("invalid custom handle"), "{text}");
}

#[test]
fn destroying_a_parent_cascades_and_its_callback_comes_after_its_childrens() {
    let al = manual();
    let w = widget(&al, 1);
    let log = Log::default();
    let g1 = gadget(&al, w).unwrap();
    let g2 = gadget(&al, w).unwrap();
    assert_eq!(al.stats().live(Gadget::KIND), 2);
    // Give the children callbacks through an explicit destroy of one and the
    // cascade of the other.
    al.destroy(g1, Some(logger(&log, "g1"))).unwrap();
    al.destroy(w, Some(logger(&log, "w"))).unwrap();
    assert!(al.resolve(g2).is_err(), "cascade removed the child");
    al.run_callbacks();
    let log = log.lock().unwrap().clone();
    assert_eq!(log, ["g1", "w"]);
    assert!(al.stats().is_clean(), "{}", al.stats());
}

#[test]
fn a_child_alive_elsewhere_delays_its_parents_destroy_callback() {
    let al = manual();
    let w = widget(&al, 1);
    let g = gadget(&al, w).unwrap();
    let held_child = al.resolve(g).unwrap().to_arc();
    let log = Log::default();
    al.destroy(w, Some(logger(&log, "w"))).unwrap();
    al.run_callbacks();
    assert!(log.lock().unwrap().is_empty(), "parent outlives its child");
    drop(held_child);
    al.run_callbacks();
    assert_eq!(*log.lock().unwrap(), ["w"]);
    assert!(al.stats().is_clean());
}

#[test]
fn destroy_while_another_holds_a_reference_calls_back_only_after_release() {
    let al = manual();
    let h = widget(&al, 3);
    let held = al.resolve(h).unwrap().to_arc();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    al.destroy(
        h,
        Some(Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        })),
    )
    .unwrap();
    al.run_callbacks();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(held.label, 3, "the holder can still use the object");
    assert!(held.core().is_destroying());
    drop(held);
    al.run_callbacks();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn no_child_can_be_created_under_a_destroying_parent() {
    let al = manual();
    let w = widget(&al, 1);
    let parent = al.resolve(w).unwrap().to_arc();
    al.destroy(w, None).unwrap();
    let r = create(al.instance(), Some(parent.core()), |_| {
        Ok(Gadget {
            _parent: parent.clone(),
        })
    });
    assert!(matches!(r, Err(Error::Destroying { .. })), "{r:?}");
    drop(parent);
    al.run_callbacks();
    assert!(al.stats().is_clean(), "{}", al.stats());
}

#[test]
fn a_failed_build_leaves_nothing_behind() {
    let al = manual();
    let r = create::<Widget>(al.instance(), None, |_| {
        Err(Error::invalid_parameter("bad size"))
    });
    assert!(matches!(r, Err(Error::InvalidParameter(_))));
    al.run_callbacks();
    assert!(al.stats().is_clean());
}

#[test]
fn closing_the_al_destroys_everything_and_waits() {
    let al = Al::open().unwrap();
    let mut gadgets = Vec::new();
    for i in 0..10 {
        let w = widget(&al, i);
        for _ in 0..3 {
            gadgets.push(gadget(&al, w).unwrap());
        }
    }
    assert_eq!(al.stats().live(Gadget::KIND), 30);
    let handle = al.handle();
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
    assert_eq!(stats.created(Gadget::KIND), 30);
    assert!(Al::lookup(handle).is_err(), "the AL left its table");
}

#[test]
fn nothing_can_be_created_in_a_closing_al() {
    let al = manual();
    al.instance().close_async(None).unwrap();
    let r = create(al.instance(), None, |_| Ok(Widget { label: 0 }));
    assert!(matches!(r, Err(Error::Destroying { .. })), "{r:?}");
}

#[test]
fn a_callback_may_destroy_its_own_object_and_blocking_calls_in_it_are_refused() {
    let al = Al::open().unwrap();
    let obj = create(al.instance(), None, |_| Ok(Widget { label: 9 })).unwrap();
    let h = obj.handle();
    let result = Arc::new(Mutex::new(None));
    let r2 = result.clone();
    post_callback(&obj, move |o| {
        let al = o.al();
        let sync = al.destroy_sync(o.handle());
        let own = al.destroy(o.handle(), None);
        *r2.lock().unwrap() = Some((sync, own));
    });
    drop(obj);
    al.executor()
        .wait_until("test", || result.lock().unwrap().is_some())
        .unwrap();
    let (sync, own) = result.lock().unwrap().take().unwrap();
    assert!(matches!(sync, Err(Error::WouldDeadlock(_))), "{sync:?}");
    own.unwrap();
    assert!(al.resolve(h).is_err());
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn close_from_a_callback_is_refused_and_the_drop_closes_asynchronously() {
    let outer = Al::open().unwrap();
    let inner = Arc::new(Mutex::new(Some(Al::open().unwrap())));
    let inner_handle = inner.lock().unwrap().as_ref().unwrap().handle();
    widget(inner.lock().unwrap().as_ref().unwrap(), 1);
    let obj = create(outer.instance(), None, |_| Ok(Widget { label: 0 })).unwrap();
    let result = Arc::new(Mutex::new(None));
    let (r2, i2) = (result.clone(), inner.clone());
    post_callback(&obj, move |_| {
        let al = i2.lock().unwrap().take().unwrap();
        *r2.lock().unwrap() = Some(al.close().map(|_| ()));
    });
    drop(obj);
    outer
        .executor()
        .wait_until("test", || result.lock().unwrap().is_some())
        .unwrap();
    let got = result.lock().unwrap().take().unwrap();
    assert!(matches!(got, Err(Error::WouldDeadlock(_))), "{got:?}");
    // The refused close dropped the Al, which started the close anyway.
    assert!(Al::lookup(inner_handle).is_err());
    assert!(outer.close().unwrap().is_clean());
}

#[test]
fn each_objects_callbacks_arrive_in_order_one_at_a_time() {
    let al = Al::open().unwrap();
    let obj = create(al.instance(), None, |_| Ok(Widget { label: 0 })).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(AtomicUsize::new(0));
    for i in 0..500 {
        let (log, running) = (log.clone(), running.clone());
        post_callback(&obj, move |_| {
            assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
            log.lock().unwrap().push(i);
            running.fetch_sub(1, Ordering::SeqCst);
        });
    }
    let d = log.clone();
    al.destroy(
        obj.handle(),
        Some(Box::new(move |_| d.lock().unwrap().push(usize::MAX))),
    )
    .unwrap();
    drop(obj);
    assert!(al.close().unwrap().is_clean());
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 501);
    assert!(log[..500].iter().copied().eq(0..500));
    assert_eq!(log[500], usize::MAX, "destroy callback last");
}

#[test]
fn the_al_destroy_callback_runs_once_everything_is_gone_in_both_modes() {
    for mode in [ExecutorMode::Thread, ExecutorMode::Manual] {
        let al = Al::open_with(AlConfig {
            executor: mode,
            ..AlConfig::default()
        })
        .unwrap();
        let w = widget(&al, 1);
        gadget(&al, w).unwrap();
        let log = Log::default();
        let handle = al.handle();
        al.instance().close_async(Some(logger(&log, "al"))).unwrap();
        assert!(Al::lookup(handle).is_err());
        // Dropping the last owner finishes the close; in manual mode the drop
        // drives the executor, in thread mode its thread does.
        let waiter = al.instance().clone();
        drop(al);
        waiter.wait_closed().unwrap();
        drop(waiter);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while log.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(*log.lock().unwrap(), ["al"], "{mode:?}");
    }
}

#[test]
fn destroy_raw_dispatches_on_the_kind_and_rejects_unknown_kinds() {
    let al = manual();
    let w = widget(&al, 1);
    al::destroy_raw(w.raw()).unwrap();
    assert!(al.resolve(w).is_err());
    // Losing to (or following) another destroy is not an error.
    al::destroy_raw(w.raw()).unwrap();
    // No kind at all.
    assert!(matches!(
        al::destroy_raw(RawHandle::from_u64(0)),
        Err(Error::InvalidHandle { .. })
    ));
    al.run_callbacks();
    assert!(al.stats().is_clean());
}

/// An object kind only the handle-reuse test creates, so that no test
/// running in parallel takes the slot it watches.
#[derive(Debug)]
struct Probe;
impl Object for Probe {
    const KIND: Kind = Kind::custom(18);
    al::object_table!(Probe);
}

#[test]
fn a_failed_create_never_reissues_the_handle_its_builder_saw() {
    let al = manual();
    let mut seen = None;
    let r = create::<Probe>(al.instance(), None, |core| {
        seen = Some(core.handle());
        Err(Error::invalid_parameter("bad size"))
    });
    assert!(matches!(r, Err(Error::InvalidParameter(_))), "{r:?}");
    let seen = seen.expect("the builder ran");
    let next = create(al.instance(), None, |_| Ok(Probe)).unwrap().handle();
    assert_eq!(
        next.raw().index(),
        seen.index(),
        "the slot itself is reused"
    );
    assert_ne!(
        next.raw(),
        seen,
        "the handle the failed builder saw was issued again"
    );
    assert!(al.resolve(Handle::<Probe>::from_raw(seen)).is_err());
    al.destroy(next, None).unwrap();
    al.run_callbacks();
    assert!(al.stats().is_clean(), "{}", al.stats());
}

/// Run `f` on its own thread and return what it returns, failing the test
/// if it takes longer than `limit`: a hang becomes a failure.
fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not return within {limit:?}: it hangs"))
}

/// Wait (bounded) until `inst` has no live object and no queued callback,
/// running its callbacks here if it is in manual mode.
fn wait_until_finished(inst: &al::AlInstance) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        inst.executor().run_pending();
        if inst.stats().is_clean() && inst.executor().pending() == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never finished: {}",
            inst.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

const SHORT_CLOSE: Duration = Duration::from_millis(200);

fn with_short_close(executor: ExecutorMode) -> Al {
    Al::open_with(AlConfig {
        executor,
        close_timeout: SHORT_CLOSE,
    })
    .unwrap()
}

#[test]
fn close_reports_what_stray_references_still_hold_instead_of_hanging() {
    for mode in [ExecutorMode::Thread, ExecutorMode::Manual] {
        let al = with_short_close(mode);
        let inst = al.instance().clone();
        // Destroyed by the application, with a callback, but still held.
        let destroyed = widget(&al, 1);
        let stray_destroyed = al.resolve_live(destroyed).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        al.destroy(
            destroyed,
            Some(Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .unwrap();
        // Left to close: a child still held, which holds its parent.
        let parent = widget(&al, 2);
        let child = gadget(&al, parent).unwrap();
        let stray_child = al.resolve_live(child).unwrap();
        // Not held by anyone: close finishes it.
        let clean = widget(&al, 3);

        let result = within(
            SHORT_CLOSE * 20,
            "Al::close with a stray reference",
            move || al.close(),
        );
        let report = match result {
            Err(Error::Leaked(report)) => report,
            other => panic!("{mode:?}: close must report the leak, got {other:?}"),
        };
        let held: Vec<RawHandle> = report.held.iter().map(|o| o.handle).collect();
        let mut expect = vec![destroyed.raw(), parent.raw(), child.raw()];
        expect.sort();
        assert_eq!(held, expect, "{mode:?}: {report}");
        assert!(!report.holds(clean.raw()));
        let find = |h: RawHandle| *report.held.iter().find(|o| o.handle == h).unwrap();
        let d = find(destroyed.raw());
        assert_eq!((d.kind, d.parent, d.object_refs), (Widget::KIND, None, 1));
        let p = find(parent.raw());
        assert_eq!((p.object_refs, p.core_refs, p.children_held), (1, 1, 1));
        let g = find(child.raw());
        assert_eq!(
            (g.kind, g.parent, g.object_refs),
            (Gadget::KIND, Some(parent.raw()), 1)
        );
        assert_eq!(report.stats.total_live(), 3, "{report}");
        let text = Error::Leaked(report.clone()).to_string();
        for h in &expect {
            assert!(text.contains(&format!("{:#018x}", h.as_u64())), "{text}");
        }
        assert!(text.contains("still held"), "{text}");

        // The close is done: nothing new, nothing resolves, and the held
        // objects are released, each destroy callback once, as they go.
        assert!(create(&inst, None, |_| Ok(Widget { label: 4 })).is_err());
        assert!(inst.resolve(clean).is_err());
        assert_eq!(stray_destroyed.label, 1, "a held object is still usable");
        inst.executor().run_pending();
        assert_eq!(calls.load(Ordering::SeqCst), 0, "still held: not gone yet");
        drop(stray_destroyed);
        drop(stray_child);
        wait_until_finished(&inst);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{mode:?}");
        assert!(inst.leak_report().held.is_empty());
    }
}

#[test]
fn dropping_an_al_with_a_stray_reference_gives_up_within_the_close_timeout() {
    let al = with_short_close(ExecutorMode::Thread);
    let inst = al.instance().clone();
    let w = widget(&al, 1);
    let stray = al.resolve_live(w).unwrap();
    within(
        SHORT_CLOSE * 20,
        "dropping an Al with a stray reference",
        move || drop(al),
    );
    assert_eq!(inst.stats().live(Widget::KIND), 1);
    drop(stray);
    wait_until_finished(&inst);
}

#[test]
fn close_reports_a_callback_that_does_not_return() {
    let al = with_short_close(ExecutorMode::Thread);
    let inst = al.instance().clone();
    let obj = create(al.instance(), None, |_| Ok(Widget { label: 5 })).unwrap();
    let h = obj.handle();
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    post_callback(&obj, move |_| {
        let _ = blocked.recv_timeout(Duration::from_secs(30));
    });
    drop(obj);
    let result = within(
        SHORT_CLOSE * 20,
        "Al::close behind a stuck callback",
        move || al.close(),
    );
    let report = match result {
        Err(Error::Leaked(report)) => report,
        other => panic!("close must report the stuck callback, got {other:?}"),
    };
    // The stuck job holds the object: it is named, and the job counted.
    assert!(report.holds(h.raw()), "{report}");
    assert!(report.queued_callbacks >= 1, "{report}");
    release.send(()).unwrap();
    wait_until_finished(&inst);
}

/// `destroy_unused`: an object its creator undoes before anyone else saw
/// it is gone, and uncounted, when the call returns (no executor run), and
/// a later drop does not count it gone twice; one that someone else still
/// holds is only destroyed, and counted gone the usual way, once.
#[test]
fn destroy_unused_uncounts_at_once() {
    let al = manual();
    let kept = widget(&al, 1);
    let obj = create(al.instance(), None, |_| Ok(Widget { label: 2 })).unwrap();
    let h = obj.handle();
    assert_eq!(al.stats().live(Widget::KIND), 2);
    al::destroy_unused(obj);
    assert!(matches!(al.resolve(h), Err(Error::InvalidHandle { .. })));
    assert_eq!(al.stats().live(Widget::KIND), 1, "uncounted at once");
    al.run_callbacks();
    assert_eq!(al.stats().live(Widget::KIND), 1, "and not twice");
    assert_eq!(al.resolve(kept).unwrap().label, 1);

    // Held elsewhere too: destroyed now, counted gone when the last goes.
    let obj = create(al.instance(), None, |_| Ok(Widget { label: 3 })).unwrap();
    let other = obj.clone();
    al::destroy_unused(obj);
    assert!(matches!(
        al.resolve(other.handle()),
        Err(Error::InvalidHandle { .. })
    ));
    assert_eq!(al.stats().live(Widget::KIND), 2);
    drop(other);
    al.run_callbacks();
    assert_eq!(al.stats().live(Widget::KIND), 1);
    al.destroy(kept, None).unwrap();
    al.run_callbacks();
    assert!(al.stats().is_clean(), "{}", al.stats());
}
