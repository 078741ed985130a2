//! `AlInstance::snapshot`: every object of one instance, with parent,
//! reference counts, lifecycle state and each kind's details; nothing of
//! another instance; objects mid-destroy and destroyed-but-held marked.
#![cfg(not(ibal_loom))]

use std::collections::BTreeSet;
use std::sync::Arc;

use al::{create, Al, Attrs, Handle, Kind, Obj, Object, ObjectState, RawHandle, Snapshot};

/// A top-level test object with a detail.
struct Parcel {
    label: u32,
}
impl Object for Parcel {
    const KIND: Kind = Kind::custom(20);
    al::object_table!(Parcel);
    fn describe(obj: &Obj<Self>, out: &mut Attrs) {
        out.num("label", obj.label);
    }
}

/// A child of a box, holding it (as a QP holds its PD).
struct Item {
    _parent: Arc<Obj<Parcel>>,
}
impl Object for Item {
    const KIND: Kind = Kind::custom(21);
    al::object_table!(Item);
}

fn boxed(al: &Al, label: u32) -> Handle<Parcel> {
    create(al.instance(), None, |_| Ok(Parcel { label }))
        .unwrap()
        .handle()
}

fn item(al: &Al, parent: Handle<Parcel>) -> Handle<Item> {
    let p = al.resolve(parent).unwrap().to_arc();
    create(al.instance(), Some(p.core()), |_| {
        Ok(Item { _parent: p.clone() })
    })
    .unwrap()
    .handle()
}

type Shape = BTreeSet<(RawHandle, Option<RawHandle>, ObjectState)>;

/// (handle, parent, state) of every object. (Slot indices are reused
/// across the tests of this file, so the order of creation is not the
/// order of a snapshot.)
fn shape(s: &Snapshot) -> Shape {
    s.objects
        .iter()
        .map(|o| (o.handle, o.parent, o.state))
        .collect()
}

fn set<const N: usize>(items: [(RawHandle, Option<RawHandle>, ObjectState); N]) -> Shape {
    items.into_iter().collect()
}

#[test]
fn a_snapshot_lists_exactly_the_instances_objects_with_parents_counts_and_details() {
    let al = Al::open().unwrap();
    let other = Al::open().unwrap();
    let b1 = boxed(&al, 1);
    let b2 = boxed(&al, 2);
    let i1 = item(&al, b1);
    let i2 = item(&al, b1);
    let foreign = boxed(&other, 99);
    let foreign_item = item(&other, foreign);

    let s = al.snapshot();
    use ObjectState::Live;
    assert_eq!(
        shape(&s),
        set([
            (b1.raw(), None, Live),
            (b2.raw(), None, Live),
            (i1.raw(), Some(b1.raw()), Live),
            (i2.raw(), Some(b1.raw()), Live),
        ]),
        "{s}"
    );
    // In kind order, then slot order.
    let order: Vec<_> = s
        .objects
        .iter()
        .map(|o| (o.kind, o.handle.index()))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    assert_eq!(s.al, al.handle());
    assert!(!s.closing);
    let b1_info = s.get(b1.raw()).unwrap();
    // Each item's body holds the box (object refs) and its core links to
    // the box's core (core refs).
    assert_eq!(
        (b1_info.object_refs, b1_info.core_refs, b1_info.children),
        (2, 2, 2)
    );
    assert_eq!(b1_info.attrs.get("label").and_then(|v| v.as_u64()), Some(1));
    let b2_info = s.get(b2.raw()).unwrap();
    assert_eq!((b2_info.object_refs, b2_info.core_refs), (0, 0));
    assert!(s.get(i1.raw()).unwrap().attrs.is_empty());
    assert_eq!(s.stats.live(Parcel::KIND), 2);

    let o = other.snapshot();
    assert_eq!(
        shape(&o),
        set([
            (foreign.raw(), None, Live),
            (foreign_item.raw(), Some(foreign.raw()), Live)
        ])
    );
    let all = Al::snapshot_all();
    let mine = all.iter().find(|x| x.al == al.handle()).unwrap();
    let theirs = all.iter().find(|x| x.al == other.handle()).unwrap();
    assert_eq!(shape(mine), shape(&s));
    assert_eq!(shape(theirs), shape(&o));

    // The text: a line for the instance, then one per object.
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].starts_with(&format!("al {} objects 4 ", al.handle())));
    for want in [
        format!("custom20 {b1} obj-refs 2 core-refs 2 children 2 label 1"),
        format!("custom20 {b2} obj-refs 0 core-refs 0 children 0 label 2"),
        format!("custom21 {i1} parent {b1} obj-refs 0 core-refs 0 children 0"),
    ] {
        assert!(lines.contains(&want.as_str()), "{want}\n{text}");
    }
    let json = s.to_json();
    assert!(
        json.contains(&format!(
            "{{\"kind\":\"custom20\",\"handle\":\"{b1}\",\"parent\":null,\"state\":\"live\",\
             \"object_refs\":2,\"core_refs\":2,\"children\":2,\"attrs\":{{\"label\":1}}}}"
        )),
        "{json}"
    );

    // Destroying a box takes its items: the next snapshot has b2 only.
    al.destroy_sync(b1).unwrap();
    assert_eq!(shape(&al.snapshot()), set([(b2.raw(), None, Live)]));
    assert_eq!(shape(&other.snapshot()).len(), 2);
    drop(other);
    al.close().unwrap();
}

#[test]
fn objects_mid_destroy_and_destroyed_but_held_are_marked() {
    let al = Al::open().unwrap();
    let pinned = boxed(&al, 5);
    let held = boxed(&al, 6);

    // A lookup in progress across the destroy: still in the table,
    // destroying, details still given.
    let r = al.resolve(pinned).unwrap();
    al.destroy(pinned, None).unwrap();
    // A reference kept past the destroy: out of the table, destroyed.
    let keep = al.resolve(held).unwrap().to_arc();
    al.destroy(held, None).unwrap();

    let s = al.snapshot();
    assert_eq!(
        shape(&s),
        set([
            (pinned.raw(), None, ObjectState::Destroying),
            (held.raw(), None, ObjectState::Destroyed),
        ]),
        "{s}"
    );
    assert_eq!(
        s.get(pinned.raw())
            .unwrap()
            .attrs
            .get("label")
            .and_then(|v| v.as_u64()),
        Some(5)
    );
    let h = s.get(held.raw()).unwrap();
    assert_eq!((h.object_refs, h.attrs.is_empty()), (1, true));
    assert!(s
        .to_string()
        .contains(&format!("custom20 {held} destroyed obj-refs 1")));

    drop(r);
    drop(keep);
    // Both gone once the references are: wait for the destroy callbacks.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !al.snapshot().objects.is_empty() || al.stats().total_live() != 0 {
        assert!(std::time::Instant::now() < deadline, "{}", al.snapshot());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    al.close().unwrap();
}

#[test]
fn snapshots_race_creates_and_destroys_without_harm() {
    let al = Al::open().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..300u32 {
                let b = boxed(&al, round);
                let items: Vec<_> = (0..4).map(|_| item(&al, b)).collect();
                if round % 2 == 0 {
                    al.destroy(items[0], None).unwrap();
                }
                al.destroy(b, None).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut taken = 0;
        while !stop.load(std::sync::atomic::Ordering::Acquire) || taken == 0 {
            let snap = al.snapshot();
            for o in &snap.objects {
                // An item's parent is always a box; a box has no parent.
                match o.kind {
                    k if k == Parcel::KIND => assert_eq!(o.parent, None),
                    k if k == Item::KIND => {
                        assert_eq!(o.parent.map(|p| p.kind_id()), Some(Parcel::KIND.id()))
                    }
                    k => panic!("unexpected kind {k}"),
                }
            }
            taken += 1;
        }
    });
    al.close().unwrap();
}
