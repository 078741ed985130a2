//! Model-based property tests: random operation sequences run against the
//! real handle table and object lifecycle and against a plain model; every
//! answer must agree, and at the end nothing may be left behind.
// These run on the normal build; the loom build has its own models.
#![cfg(not(ibal_loom))]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use al::{
    create, Al, AlConfig, Error, ExecutorMode, Handle, HandleTable, Kind, Obj, Object, RawHandle,
    TableLimits,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- table --

#[derive(Debug, Clone)]
enum TableOp {
    Insert,
    /// Look up the n-th handle ever issued (live or stale).
    Get(usize),
    Remove(usize),
    /// Take and keep a reference to the n-th handle (pins its slot).
    Hold(usize),
    /// Drop the n-th held reference.
    Release(usize),
    Forged(u64),
}

fn table_op() -> impl Strategy<Value = TableOp> {
    prop_oneof![
        3 => Just(TableOp::Insert),
        3 => any::<usize>().prop_map(TableOp::Get),
        2 => any::<usize>().prop_map(TableOp::Remove),
        1 => any::<usize>().prop_map(TableOp::Hold),
        1 => any::<usize>().prop_map(TableOp::Release),
        1 => any::<u64>().prop_map(TableOp::Forged),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_agrees_with_a_map_model(ops in proptest::collection::vec(table_op(), 1..200)) {
        let kind = Kind::custom(18);
        // Small limits so exhaustion and generation retirement happen.
        let table = HandleTable::with_limits(kind, TableLimits { max_slots: 8, max_generation: 5 });
        let mut issued: Vec<(RawHandle, u64)> = Vec::new();
        let mut live: BTreeMap<RawHandle, u64> = BTreeMap::new();
        let mut held = Vec::new();
        let mut next_value = 0u64;
        for op in ops {
            match op {
                TableOp::Insert => {
                    next_value += 1;
                    match table.insert(Arc::new(next_value)) {
                        Ok(h) => {
                            prop_assert!(!issued.iter().any(|(old, _)| *old == h), "handle reused: {h:?}");
                            issued.push((h, next_value));
                            live.insert(h, next_value);
                        }
                        Err(Error::InsufficientResources(_)) => {
                            // Full only if every slot is live, pinned or retired.
                            prop_assert_eq!(table.allocated(), 8);
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                TableOp::Get(n) if !issued.is_empty() => {
                    let (h, v) = issued[n % issued.len()];
                    match table.get(h) {
                        Ok(r) => {
                            prop_assert!(live.contains_key(&h));
                            prop_assert_eq!(*r, v);
                        }
                        Err(Error::InvalidHandle { .. }) => prop_assert!(!live.contains_key(&h)),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                TableOp::Remove(n) if !issued.is_empty() => {
                    let (h, v) = issued[n % issued.len()];
                    match table.remove(h) {
                        Ok(owned) => {
                            prop_assert_eq!(live.remove(&h), Some(v));
                            prop_assert_eq!(*owned, v);
                        }
                        Err(_) => prop_assert!(!live.contains_key(&h)),
                    }
                }
                TableOp::Hold(n) if !issued.is_empty() => {
                    let (h, v) = issued[n % issued.len()];
                    if let Ok(r) = table.get(h) {
                        prop_assert_eq!(*r, v);
                        held.push((r, v));
                    }
                }
                TableOp::Release(n) if !held.is_empty() => {
                    let (r, v) = held.swap_remove(n % held.len());
                    // A held reference reads its object even after removal.
                    prop_assert_eq!(*r, v);
                }
                TableOp::Forged(raw) => {
                    let h = RawHandle::from_u64(raw);
                    if let Ok(r) = table.get(h) {
                        prop_assert_eq!(live.get(&h).copied(), Some(*r));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(table.occupied() - held_removed(&held, &live), live.len());
        }
        drop(held);
        prop_assert_eq!(table.occupied(), live.len());
    }
}

/// Held references to removed objects keep their slots occupied.
fn held_removed(held: &[(al::Ref<'_, u64>, u64)], live: &BTreeMap<RawHandle, u64>) -> usize {
    let live_values: BTreeSet<u64> = live.values().copied().collect();
    let pinned: BTreeSet<u64> = held
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| !live_values.contains(v))
        .collect();
    pinned.len()
}

// ------------------------------------------------------------ lifecycle --

#[derive(Debug)]
struct Node {
    _parent: Option<Arc<Obj<Node>>>,
}
impl Object for Node {
    const KIND: Kind = Kind::custom(19);
    al::object_table!(Node);
}

#[derive(Debug, Clone)]
enum LifeOp {
    /// Create a node under the n-th known node (or at top level).
    Create(Option<usize>),
    Destroy(usize),
    Resolve(usize),
    Hold(usize),
    Release(usize),
    RunCallbacks,
}

fn life_op() -> impl Strategy<Value = LifeOp> {
    prop_oneof![
        4 => proptest::option::of(any::<usize>()).prop_map(LifeOp::Create),
        2 => any::<usize>().prop_map(LifeOp::Destroy),
        2 => any::<usize>().prop_map(LifeOp::Resolve),
        1 => any::<usize>().prop_map(LifeOp::Hold),
        1 => any::<usize>().prop_map(LifeOp::Release),
        1 => Just(LifeOp::RunCallbacks),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lifecycle_agrees_with_a_tree_model(ops in proptest::collection::vec(life_op(), 1..120), close_at_end in any::<bool>()) {
        let al = Al::open_with(AlConfig { executor: ExecutorMode::Manual, ..AlConfig::default() }).unwrap();
        // Model: every node ever created, its parent, and whether it is live.
        let mut nodes: Vec<(Handle<Node>, Option<usize>)> = Vec::new();
        let mut alive: BTreeSet<usize> = BTreeSet::new();
        // Destroy callbacks seen, and the handles whose destroy took one.
        let callbacks: Arc<Mutex<BTreeMap<RawHandle, usize>>> = Arc::default();
        let mut destroyed_with_callback: BTreeSet<RawHandle> = BTreeSet::new();
        let mut held: Vec<Arc<Obj<Node>>> = Vec::new();
        for op in ops {
            match op {
                LifeOp::Create(parent) => {
                    let parent = parent.filter(|_| !nodes.is_empty()).map(|p| p % nodes.len());
                    let parent_obj = match parent {
                        Some(p) => match al.resolve(nodes[p].0) {
                            Ok(r) => Some(r.to_arc()),
                            Err(_) => { prop_assert!(!alive.contains(&p)); continue; }
                        },
                        None => None,
                    };
                    let r = create(al.instance(), parent_obj.as_ref().map(|p| p.core()), |_| Ok(Node { _parent: parent_obj.clone() }));
                    let obj = r.map_err(|e| TestCaseError::fail(format!("create failed: {e}")))?;
                    nodes.push((obj.handle(), parent));
                    alive.insert(nodes.len() - 1);
                }
                LifeOp::Destroy(n) if !nodes.is_empty() => {
                    let n = n % nodes.len();
                    let cbs = callbacks.clone();
                    let r = al.destroy(nodes[n].0, Some(Box::new(move |h| { *cbs.lock().unwrap().entry(h).or_default() += 1; })));
                    if alive.contains(&n) {
                        prop_assert!(r.is_ok(), "{r:?}");
                        prop_assert!(destroyed_with_callback.insert(nodes[n].0.raw()), "handle destroyed twice");
                        // The model cascades to every live descendant.
                        let mut gone = vec![n];
                        while let Some(x) = gone.pop() {
                            alive.remove(&x);
                            for (i, (_, p)) in nodes.iter().enumerate() {
                                if *p == Some(x) && alive.contains(&i) { gone.push(i); }
                            }
                        }
                    } else {
                        prop_assert!(r.is_err());
                    }
                }
                LifeOp::Resolve(n) if !nodes.is_empty() => {
                    let n = n % nodes.len();
                    prop_assert_eq!(al.resolve(nodes[n].0).is_ok(), alive.contains(&n));
                }
                LifeOp::Hold(n) if !nodes.is_empty() => {
                    let n = n % nodes.len();
                    if let Ok(r) = al.resolve(nodes[n].0) { held.push(r.to_arc()); }
                }
                LifeOp::Release(n) if !held.is_empty() => { held.swap_remove(n % held.len()); }
                LifeOp::RunCallbacks => { al.run_callbacks(); }
                _ => {}
            }
        }
        drop(held);
        al.run_callbacks();
        // Live objects are exactly the model's live nodes once nothing is held.
        prop_assert_eq!(al.stats().live(Node::KIND), alive.len());
        // Every destroy that took a callback ran it exactly once, and no other
        // callback ran: compared with the handles destroyed, so a callback
        // that never ran fails here (iterating only the callbacks seen
        // would pass it).
        let expected: BTreeMap<RawHandle, usize> =
            destroyed_with_callback.iter().map(|&h| (h, 1)).collect();
        prop_assert_eq!(&*callbacks.lock().unwrap(), &expected);
        if close_at_end {
            let stats = al.close().unwrap();
            prop_assert!(stats.is_clean(), "{}", stats);
        } else {
            for n in alive.clone() {
                let _ = al.destroy(nodes[n].0, None);
            }
            al.run_callbacks();
            prop_assert!(al.stats().is_clean(), "{}", al.stats());
        }
    }
}
