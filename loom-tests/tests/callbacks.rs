//! loom model: destroy while a callback of the object is running.
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::{create, post_callback, Al, AlConfig, ExecutorMode, Kind, Object};

mod common;
use common::model;

struct Widget;
impl Object for Widget {
    const KIND: Kind = Kind::custom(16);
    al::object_table!(Widget);
}

/// Two threads drive a manual executor while a third destroys the object
/// whose two callbacks are queued: the callbacks run one at a time, in
/// order, and the destroy callback runs exactly once, after both returned.
#[test]
fn destroy_while_a_callback_runs() {
    model("destroy_while_a_callback_runs", || {
        let al = Arc::new(
            Al::open_with(AlConfig {
                executor: ExecutorMode::Manual,
                ..AlConfig::default()
            })
            .unwrap(),
        );
        let obj = create(al.instance(), None, |_| Ok(Widget)).unwrap();
        let h = obj.handle();
        let running = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        for i in 0..2 {
            let (r, f) = (running.clone(), finished.clone());
            post_callback(&obj, move |_| {
                assert_eq!(r.fetch_add(1, Ordering::SeqCst), 0, "two callbacks at once");
                assert_eq!(f.load(Ordering::SeqCst), i, "callbacks out of order");
                r.fetch_sub(1, Ordering::SeqCst);
                f.fetch_add(1, Ordering::SeqCst);
            });
        }
        drop(obj);
        let driver = {
            let al = al.clone();
            thread::spawn(move || {
                al.run_callbacks();
            })
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let (c, seen) = (calls.clone(), finished.clone());
        al.destroy(
            h,
            Some(Box::new(move |_| {
                assert_eq!(
                    seen.load(Ordering::SeqCst),
                    2,
                    "destroy callback ran before the object's callbacks returned"
                );
                c.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .unwrap();
        al.run_callbacks();
        driver.join().unwrap();
        al.run_callbacks();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let al = Arc::try_unwrap(al).unwrap_or_else(|_| panic!("AL still shared"));
        assert!(al.close().unwrap().is_clean());
    });
}
