//! A live view of one AL instance's objects: what
//! [`AlInstance::snapshot`](crate::AlInstance::snapshot) returns, printed in
//! the shape of `rdma res show` (one line per object) or as JSON.
//!
//! Plain values (like [`crate::report`]'s): the walk that fills them is in
//! [`crate::object`], beside the lifecycle it reads.
//!
//! **Consistency.** A snapshot is not atomic across objects. Each object is
//! read on its own, with a short-lived reference that keeps it from being
//! freed while it is described (its counts and details are as of that
//! moment); objects created or destroyed while the walk runs may or may not
//! appear, and a parent may be listed without a child created after it was
//! passed (or the reverse). Nothing is stopped or locked for the walk as a
//! whole, so take two snapshots apart in time to see a trend, and compare
//! exact contents only when nothing else runs.

use std::fmt;

use crate::attrs::{json_escape, Attrs};
use crate::handle::{Kind, RawHandle};
use crate::report::Stats;

/// Where an object is in its lifecycle when the snapshot met it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ObjectState {
    /// Live: resolvable by its handle, no destroy started.
    Live,
    /// A destroy has started (it no longer takes new work); the object is
    /// still in its table, read through a reference a lookup or the
    /// destroyer itself holds. Details are still given.
    Destroying,
    /// Destroyed and out of its table, but still referenced by someone (the
    /// objects a [`LeakReport`](crate::LeakReport) lists if the AL closed
    /// now). No details: only its counts from when its destroy finished.
    Destroyed,
}

impl ObjectState {
    /// `live`, `destroying` or `destroyed`.
    pub const fn name(self) -> &'static str {
        match self {
            ObjectState::Live => "live",
            ObjectState::Destroying => "destroying",
            ObjectState::Destroyed => "destroyed",
        }
    }
}

impl fmt::Display for ObjectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One object of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectInfo {
    /// Its kind.
    pub kind: Kind,
    /// Its handle.
    pub handle: RawHandle,
    /// Its parent's handle; `None` for a top-level object (a child of the AL).
    pub parent: Option<RawHandle>,
    /// Live, destroying, or destroyed and still held.
    pub state: ObjectState,
    /// References to the object besides its table's own (for a destroyed
    /// one, besides its destroyer's, when the destroy finished), counted as
    /// [`HeldObject::object_refs`](crate::HeldObject::object_refs): typed
    /// `Arc`s in other objects' bodies (a QP's to its PD and CQs), clones a
    /// call or callback holds. The snapshot's own short reference is not
    /// counted.
    pub object_refs: usize,
    /// References to its core besides the object's own, as
    /// [`HeldObject::core_refs`](crate::HeldObject::core_refs): mostly its
    /// children's parent links.
    pub core_refs: usize,
    /// Registered children (0 for a destroyed object: its children were
    /// destroyed with it).
    pub children: usize,
    /// Kind-specific details ([`Object::describe`](crate::Object::describe)).
    pub attrs: Attrs,
}

impl ObjectInfo {
    /// A bare entry (no details), for the object walk and for tests that
    /// build the snapshot they expect.
    pub fn new(kind: Kind, handle: RawHandle, parent: Option<RawHandle>) -> ObjectInfo {
        ObjectInfo {
            kind,
            handle,
            parent,
            state: ObjectState::Live,
            object_refs: 0,
            core_refs: 0,
            children: 0,
            attrs: Attrs::new(),
        }
    }

    /// The object as one JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"kind\":\"{}\",\"handle\":\"{}\",\"parent\":{},\"state\":\"{}\",\
             \"object_refs\":{},\"core_refs\":{},\"children\":{},\"attrs\":{}}}",
            kind_slug(self.kind),
            self.handle,
            self.parent
                .map_or_else(|| "null".to_string(), |p| format!("\"{p}\"")),
            self.state,
            self.object_refs,
            self.core_refs,
            self.children,
            self.attrs.to_json()
        )
    }
}

/// `qp QP#3g0 parent PD#1g0 obj-refs 1 core-refs 0 children 0 lqpn 18 ...`
impl fmt::Display for ObjectInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", kind_slug(self.kind), self.handle)?;
        if let Some(parent) = self.parent {
            write!(f, " parent {parent}")?;
        }
        if self.state != ObjectState::Live {
            write!(f, " {}", self.state)?;
        }
        write!(
            f,
            " obj-refs {} core-refs {} children {}",
            self.object_refs, self.core_refs, self.children
        )?;
        if !self.attrs.is_empty() {
            write!(f, " {}", self.attrs)?;
        }
        Ok(())
    }
}

/// Every object of one AL instance, as [`AlInstance::snapshot`] found them
/// (see the module docs for what "as found" means: not atomic).
///
/// [`AlInstance::snapshot`]: crate::AlInstance::snapshot
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The AL instance's handle.
    pub al: RawHandle,
    /// Whether the instance was closing.
    pub closing: bool,
    /// The objects, by kind (in [`Kind`] order) and then by slot index.
    pub objects: Vec<ObjectInfo>,
    /// The live counters, read after the walk (they also count objects
    /// whose destroy callback has not run yet, which the walk may not meet).
    pub stats: Stats,
    /// Callbacks queued or running on the AL executor.
    pub queued_callbacks: usize,
}

impl Snapshot {
    /// The entry of `handle`, if the walk met it.
    pub fn get(&self, handle: RawHandle) -> Option<&ObjectInfo> {
        self.objects.iter().find(|o| o.handle == handle)
    }

    /// The entries of one kind.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &ObjectInfo> + '_ {
        self.objects.iter().filter(move |o| o.kind == kind)
    }

    /// The snapshot as one JSON object (one line): `al`, `closing`,
    /// `queued_callbacks`, `live` (count per kind, non-zero only) and
    /// `objects` (each as [`ObjectInfo::to_json`]).
    pub fn to_json(&self) -> String {
        let live: Vec<String> = Kind::NAMED
            .iter()
            .filter(|k| self.stats.live(**k) != 0)
            .map(|k| format!("\"{}\":{}", kind_slug(*k), self.stats.live(*k)))
            .collect();
        let objects: Vec<String> = self.objects.iter().map(ObjectInfo::to_json).collect();
        format!(
            "{{\"al\":\"{}\",\"closing\":{},\"queued_callbacks\":{},\"live\":{{{}}},\
             \"objects\":[{}]}}",
            json_escape(&self.al.to_string()),
            self.closing,
            self.queued_callbacks,
            live.join(","),
            objects.join(",")
        )
    }
}

/// A first line for the instance, then one line per object (each ending in
/// a newline), in the shape of `rdma res show`.
impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "al {}{} objects {} queued-callbacks {} live {}",
            self.al,
            if self.closing { " closing" } else { "" },
            self.objects.len(),
            self.queued_callbacks,
            self.stats
        )?;
        writeln!(f)?;
        for o in &self.objects {
            writeln!(f, "{o}")?;
        }
        Ok(())
    }
}

/// The word a kind is printed as at the start of a line and in JSON: its
/// name in lower case with `_` for spaces (`qp`, `cep`, `cm_port`); custom
/// kinds carry their number (`custom16`).
pub fn kind_slug(kind: Kind) -> String {
    if kind.id() >= Kind::FIRST_CUSTOM {
        return format!("custom{}", kind.id());
    }
    kind.name().to_ascii_lowercase().replace(' ', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_json_name_kind_handle_parent_and_details() {
        let pd = RawHandle::new(Kind::PD, 0, 1);
        let mut qp = ObjectInfo::new(Kind::QP, RawHandle::new(Kind::QP, 2, 3), Some(pd));
        qp.object_refs = 1;
        qp.attrs.num("lqpn", 18u32).text("state", "RTS");
        let mut gone = ObjectInfo::new(
            Kind::custom(17),
            RawHandle::new(Kind::custom(17), 0, 0),
            None,
        );
        gone.state = ObjectState::Destroyed;
        assert_eq!(
            qp.to_string(),
            "qp QP#3g2 parent PD#1g0 obj-refs 1 core-refs 0 children 0 lqpn 18 state RTS"
        );
        assert_eq!(
            gone.to_string(),
            "custom17 custom#0g0 destroyed obj-refs 0 core-refs 0 children 0"
        );
        assert_eq!(
            qp.to_json(),
            "{\"kind\":\"qp\",\"handle\":\"QP#3g2\",\"parent\":\"PD#1g0\",\"state\":\"live\",\
             \"object_refs\":1,\"core_refs\":0,\"children\":0,\
             \"attrs\":{\"lqpn\":18,\"state\":\"RTS\"}}"
        );
        assert!(gone
            .to_json()
            .contains("\"parent\":null,\"state\":\"destroyed\""));
        assert_eq!(kind_slug(Kind::CM_PORT), "cm_port");
        assert_eq!(kind_slug(Kind::RDMA_CEP), "rdma_cm_cep");
    }
}
