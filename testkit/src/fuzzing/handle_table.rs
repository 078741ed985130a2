//! `handle_table`: operations on a small handle table against a map model.

use std::collections::BTreeMap;

use al::sync::Arc;
use al::{Error, HandleTable, Kind, RawHandle, TableLimits};

/// `handle_table`: interpret bytes as operations on a small table and check
/// every answer against a map model.
///
/// Each operation is two bytes: an opcode and an argument (which issued
/// handle it names, or the low bits of a forged handle).
pub fn handle_table(data: &[u8]) {
    let table = HandleTable::with_limits(
        Kind::custom(18),
        TableLimits {
            max_slots: 6,
            max_generation: 4,
        },
    );
    let mut issued: Vec<(RawHandle, u32)> = Vec::new();
    let mut live: BTreeMap<RawHandle, u32> = BTreeMap::new();
    let mut held = Vec::new();
    let mut next = 0u32;
    for op in data.chunks_exact(2) {
        let (code, arg) = (op[0] % 6, op[1] as usize);
        let pick = |issued: &Vec<(RawHandle, u32)>| {
            (!issued.is_empty()).then(|| issued[arg % issued.len()])
        };
        match code {
            0 => {
                next += 1;
                match table.insert(Arc::new(next)) {
                    Ok(h) => {
                        assert!(
                            issued.iter().all(|(o, _)| *o != h),
                            "handle {h:?} issued twice"
                        );
                        issued.push((h, next));
                        live.insert(h, next);
                    }
                    Err(Error::InsufficientResources(_)) => assert_eq!(table.allocated(), 6),
                    Err(e) => panic!("insert: unexpected {e}"),
                }
            }
            1 => {
                if let Some((h, v)) = pick(&issued) {
                    match table.get(h) {
                        Ok(r) => assert_eq!((*r, live.get(&h)), (v, Some(&v))),
                        Err(_) => assert!(!live.contains_key(&h), "live handle failed to resolve"),
                    }
                }
            }
            2 => {
                if let Some((h, v)) = pick(&issued) {
                    match table.remove(h) {
                        Ok(owned) => assert_eq!((*owned, live.remove(&h)), (v, Some(v))),
                        Err(_) => assert!(!live.contains_key(&h), "live handle failed to remove"),
                    }
                }
            }
            3 => {
                if let Some((h, v)) = pick(&issued) {
                    if let Ok(r) = table.get(h) {
                        held.push((r, v));
                    }
                }
            }
            4 => {
                if !held.is_empty() {
                    let (r, v) = held.swap_remove(arg % held.len());
                    assert_eq!(*r, v, "a held reference changed under us");
                }
            }
            _ => {
                // A forged handle: the right kind with arbitrary generation
                // and index bits, which must resolve only to a live object.
                let raw = RawHandle::new(Kind::custom(18), (arg >> 4) as u32, (arg & 0xf) as u32);
                if let Ok(r) = table.get(raw) {
                    assert_eq!(
                        live.get(&raw),
                        Some(&*r),
                        "forged handle resolved to a dead object"
                    );
                }
            }
        }
    }
    drop(held);
    assert_eq!(table.occupied(), live.len(), "slots leaked");
}
