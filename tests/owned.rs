//! The ownership guards (`ibal::owned`) against leaks: an owned object goes
//! when its guard drops, in any order, inside a callback, or after AL close
//! already took it; `into_handle` keeps it.

use std::time::{Duration, Instant};

use ibal::prelude::*;

fn world() -> (SoftProvider, Al) {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1])).unwrap();
    (SoftProvider::new(fabric), Al::open().unwrap())
}

/// Wait (bounded) until the AL holds nothing: destroy callbacks run on the
/// executor thread.
fn wait_clean(al: &Al) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !al.stats().is_clean() {
        assert!(Instant::now() < deadline, "left: {}", al.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropping_the_guards_destroys_everything_in_any_order() {
    let (p, al) = world();
    for round in 0..200u32 {
        let ca = al.open_ca(&p, 0xa).unwrap().owned(&al);
        let pd = ca.alloc_pd(&al).unwrap().owned(&al);
        let cq = ca.create_cq(&al, 8).unwrap().owned(&al);
        let qp = pd
            .create_qp(&al, QpCreate::new(QpType::Rc, *cq))
            .unwrap()
            .owned(&al);
        let buf = RegisteredBuffer::new(64);
        let mr = pd
            .register(&al, &buf, Access::LOCAL_WRITE)
            .unwrap()
            .owned(&al);
        assert_eq!(qp.query(&al).unwrap().state, QpState::Reset);
        // Children first, parents first, or mixed: nothing is left either way.
        match round % 3 {
            0 => drop((mr, qp, cq, pd, ca)),
            1 => drop((ca, pd, cq, qp, mr)),
            _ => drop((pd, mr, ca, qp, cq)),
        }
        wait_clean(&al);
    }
    assert!(al.close().unwrap().is_clean());
}

#[test]
fn a_guard_dropped_on_the_executor_or_after_close_neither_blocks_nor_panics() {
    let (p, al) = world();
    let ca = al.open_ca(&p, 0xa).unwrap();
    let pd = ca.alloc_pd(&al).unwrap();
    let cq = ca.create_cq(&al, 8).unwrap().owned(&al);
    // Dropped inside a destroy callback, on the AL's executor thread.
    al.destroy(pd, Some(Box::new(move |_| drop(cq)))).unwrap();
    let late = ca.alloc_pd(&al).unwrap().owned(&al);
    let kept = ca.create_cq(&al, 8).unwrap().owned(&al).into_handle();
    let inst = Arc::clone(&al);
    assert!(al.close().unwrap().is_clean());
    // AL close destroyed both already: the guard's destroy finds nothing.
    drop(late);
    assert!(inst.resolve(kept).is_err());
}

#[test]
fn into_handle_keeps_the_object() {
    let (p, al) = world();
    let ca = al.open_ca(&p, 0xa).unwrap();
    let pd = ca.alloc_pd(&al).unwrap().owned(&al).into_handle();
    assert!(al.resolve(pd).is_ok(), "into_handle must not destroy");
    pd.destroy(&al).unwrap();
    ca.destroy(&al).unwrap();
    wait_clean(&al);
    assert!(al.close().unwrap().is_clean());
}
