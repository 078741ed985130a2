//! loom models of destroy vs destroy for every verbs object type, on the
//! real objects over the soft provider (compiled with loom's primitives).
#![cfg(ibal_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use al::{Al, AlConfig, Error, ExecutorMode, Handle, Object};
use hca::verbs;
use provider::RegisteredBuffer;
use provider::{Access, AvAttr, QpType, SrqInit};
use qp::{create_qp, QpCreate};
use soft_provider::{Fabric, HcaConfig, SoftProvider};

mod common;
use common::model;

struct World {
    al: Arc<Al>,
    ca: Handle<verbs::Ca>,
    pd: Handle<verbs::Pd>,
    cq: Handle<verbs::Cq>,
    mr: Handle<verbs::Mr>,
    srq: Handle<verbs::Srq>,
    av: Handle<verbs::Av>,
    qp: Handle<qp::Qp>,
}

fn world() -> World {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa000, &[1])).unwrap();
    let provider = SoftProvider::new(fabric);
    let al = Arc::new(
        Al::open_with(AlConfig {
            executor: ExecutorMode::Manual,
            ..AlConfig::default()
        })
        .unwrap(),
    );
    let inst = al.instance();
    let ca = verbs::open_ca(inst, &provider, 0xa000).unwrap();
    let pd = verbs::alloc_pd(inst, ca).unwrap();
    let cq = verbs::create_cq(inst, ca, 4, None, None).unwrap();
    let buf = RegisteredBuffer::new(64);
    let mr = verbs::register_mr(inst, pd, &buf, 0, 64, 0, Access::LOCAL_WRITE).unwrap();
    let srq = verbs::create_srq(
        inst,
        pd,
        SrqInit {
            max_wr: 4,
            max_sge: 1,
        },
    )
    .unwrap();
    let av = verbs::create_av(inst, pd, AvAttr::lid(1, 1)).unwrap();
    let qp = create_qp(inst, pd, QpCreate::new(QpType::Rc, cq)).unwrap();
    World {
        al,
        ca,
        pd,
        cq,
        mr,
        srq,
        av,
        qp,
    }
}

/// Two threads destroy the same object: exactly one wins, the other gets
/// `InvalidHandle` or `Destroying` (or `ResourceBusy` for a CQ with a QP),
/// only the winner's callback runs, once; closing the AL leaves nothing.
fn destroy_vs_destroy<T: Object>(pick: fn(&World) -> Handle<T>) {
    let w = world();
    let h = pick(&w);
    destroy_vs_destroy_in(w, h);
}

fn destroy_vs_destroy_in<T: Object>(w: World, h: Handle<T>) {
    let calls = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let other = {
        let (al, c) = (w.al.clone(), calls[1].clone());
        thread::spawn(move || {
            al.destroy(
                h,
                Some(Box::new(move |_| {
                    c.fetch_add(1, Ordering::SeqCst);
                })),
            )
        })
    };
    let c = calls[0].clone();
    let mine = w.al.destroy(
        h,
        Some(Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        })),
    );
    let theirs = other.join().unwrap();
    for r in [&mine, &theirs] {
        if let Err(e) = r {
            assert!(
                matches!(e, Error::InvalidHandle { .. } | Error::Destroying { .. }),
                "{e}"
            );
        }
    }
    assert!(mine.is_ok() ^ theirs.is_ok(), "exactly one destroy wins");
    w.al.run_callbacks();
    let got = (
        calls[0].load(Ordering::SeqCst),
        calls[1].load(Ordering::SeqCst),
    );
    assert_eq!(got, if mine.is_ok() { (1, 0) } else { (0, 1) });
    let al = Arc::try_unwrap(w.al).unwrap_or_else(|_| panic!("AL still shared"));
    let stats = al.close().unwrap();
    assert!(stats.is_clean(), "{stats}");
}

#[test]
fn destroy_vs_destroy_ca() {
    model("destroy_vs_destroy_ca", || destroy_vs_destroy(|w| w.ca));
}
#[test]
fn destroy_vs_destroy_pd() {
    model("destroy_vs_destroy_pd", || destroy_vs_destroy(|w| w.pd));
}
#[test]
fn destroy_vs_destroy_mr() {
    model("destroy_vs_destroy_mr", || destroy_vs_destroy(|w| w.mr));
}
#[test]
fn destroy_vs_destroy_srq() {
    model("destroy_vs_destroy_srq", || destroy_vs_destroy(|w| w.srq));
}
#[test]
fn destroy_vs_destroy_av() {
    model("destroy_vs_destroy_av", || destroy_vs_destroy(|w| w.av));
}
#[test]
fn destroy_vs_destroy_qp() {
    model("destroy_vs_destroy_qp", || destroy_vs_destroy(|w| w.qp));
}
/// A CQ with a bound QP: both user destroys get `ResourceBusy` until the QP
/// is gone; then exactly one wins.
#[test]
fn destroy_vs_destroy_cq() {
    model("destroy_vs_destroy_cq", || {
        let w = world();
        assert!(matches!(
            w.al.destroy(w.cq, None),
            Err(Error::ResourceBusy(_))
        ));
        w.al.destroy(w.qp, None).unwrap();
        w.al.run_callbacks();
        let cq = w.cq;
        destroy_vs_destroy_in(w, cq);
    });
}
