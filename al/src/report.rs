//! What an AL instance reports about its objects: the live counts per kind
//! ([`Stats`]) and, when a close gives up waiting, what is still held
//! ([`LeakReport`], the payload of [`Error::Leaked`](crate::Error::Leaked)).
//!
//! Plain values below [`crate::error`] and [`crate::instance`], so the error
//! type can carry a report without importing the instance.

use std::fmt;
use std::time::Duration;

use crate::handle::{Kind, RawHandle, MAX_KINDS};

/// One object still held when a close gave up waiting; see [`LeakReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldObject {
    /// Its kind.
    pub kind: Kind,
    /// Its handle (no longer resolvable: the object was destroyed).
    pub handle: RawHandle,
    /// Its parent's handle; `None` for a top-level object (a child of the AL).
    pub parent: Option<RawHandle>,
    /// References to the object (`Arc<Obj<_>>` clones, `Ref`s, queued
    /// callbacks of it, other objects' bodies) besides the destroyer's own
    /// when its destroy call finished. Each is someone's to drop.
    pub object_refs: usize,
    /// References to its core besides the object's own when its destroy
    /// finished: its children's parent links, or `Arc<Core>` clones.
    pub core_refs: usize,
    /// How many of the other held objects are its children (each keeps its
    /// parent's core, and often the parent object, alive).
    pub children_held: usize,
}

impl fmt::Display for HeldObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#018x})", self.handle, self.handle.as_u64())?;
        if let Some(parent) = self.parent {
            write!(f, ", child of {parent}")?;
        }
        write!(
            f,
            ": destroyed while {} other reference(s) to it",
            self.object_refs
        )?;
        if self.core_refs != 0 {
            write!(f, " and {} to its core", self.core_refs)?;
        }
        write!(f, " were held")?;
        if self.children_held != 0 {
            write!(f, "; held children keep it: {}", self.children_held)?;
        }
        Ok(())
    }
}

/// What a close that gave up waiting found still held: the payload of
/// [`Error::Leaked`](crate::Error::Leaked).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeakReport {
    /// The AL instance's handle.
    pub al: RawHandle,
    /// How long the close waited.
    pub waited: Duration,
    /// Objects that outlived their destroy call and are still referenced,
    /// in handle order.
    pub held: Vec<HeldObject>,
    /// Live objects not in `held`: their last reference is gone but their
    /// destroy callback has not run yet (queued behind a callback that does
    /// not return), or a destroy started elsewhere has not finished.
    pub unlisted: usize,
    /// Jobs (callbacks) posted to the executor and not finished.
    pub queued_callbacks: usize,
    /// The live counters when the close gave up.
    pub stats: Stats,
}

impl LeakReport {
    /// Whether `handle` is among the held objects.
    pub fn holds(&self, handle: RawHandle) -> bool {
        self.held.iter().any(|o| o.handle == handle)
    }
}

/// Held objects listed in a report's text; the rest are counted.
const LISTED_IN_TEXT: usize = 16;

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "closing AL {} gave up after {:?}: {} object(s) still held",
            self.al,
            self.waited,
            self.held.len()
        )?;
        for (i, o) in self.held.iter().take(LISTED_IN_TEXT).enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{o}")?;
        }
        if self.held.len() > LISTED_IN_TEXT {
            write!(f, "; and {} more", self.held.len() - LISTED_IN_TEXT)?;
        }
        if self.unlisted != 0 {
            write!(
                f,
                "; {} more live object(s) whose destroy callback has not run",
                self.unlisted
            )?;
        }
        if self.queued_callbacks != 0 {
            write!(
                f,
                "; {} callback(s) queued or running on the AL executor (a callback that does \
                 not return holds up the rest)",
                self.queued_callbacks
            )?;
        }
        write!(
            f,
            " (live: {}). Each object is released, and its destroy callback run, when its \
             last reference is dropped",
            self.stats
        )
    }
}

/// Live-object counts of one AL instance, per kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub(crate) live: [usize; MAX_KINDS],
    pub(crate) created: [usize; MAX_KINDS],
}

impl Stats {
    /// Objects of `kind` created and not yet fully gone (destroy callback
    /// not yet run).
    pub fn live(&self, kind: Kind) -> usize {
        self.live[kind.index()]
    }
    /// Objects of `kind` ever created in this instance.
    pub fn created(&self, kind: Kind) -> usize {
        self.created[kind.index()]
    }
    /// All live objects.
    pub fn total_live(&self) -> usize {
        self.live.iter().sum()
    }
    /// Whether nothing is live: the "nothing leaked" check.
    pub fn is_clean(&self) -> bool {
        self.total_live() == 0
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut any = false;
        for id in 1..MAX_KINDS as u8 {
            let kind = Kind::from_id(id).expect("1..MAX_KINDS are kinds");
            let (live, created) = (self.live(kind), self.created(kind));
            if live == 0 && created == 0 {
                continue;
            }
            if any {
                f.write_str(", ")?;
            }
            write!(f, "{kind}: {live} live / {created} created")?;
            any = true;
        }
        if !any {
            f.write_str("no objects")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
