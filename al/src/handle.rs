//! Typed, generational object handles.
//!
//! A handle is a name, never a reference: a `u64` packing the object kind,
//! the slot generation and the slot index. Holding one keeps nothing alive,
//! and resolving a stale or forged one fails cleanly.
//!
//! ```text
//!  63      56 55                 32 31                              0
//! +----------+---------------------+---------------------------------+
//! |   kind   |     generation      |              index              |
//! +----------+---------------------+---------------------------------+
//!    8 bits         24 bits                     32 bits
//! ```
//!
//! Kind 0 is never used, so no valid handle is `0`.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

/// Bits of the slot index.
pub const INDEX_BITS: u32 = 32;
/// Bits of the generation.
pub const GENERATION_BITS: u32 = 24;
/// The largest generation a handle can carry; a slot that reaches it is retired.
pub const MAX_GENERATION: u32 = (1 << GENERATION_BITS) - 1;
/// How many distinct object kinds the per-instance counters track.
pub const MAX_KINDS: usize = 32;

/// The type of an access-layer object, as carried in its handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(u8);

impl Kind {
    /// An access-layer instance.
    pub const AL: Kind = Kind(1);
    /// An opened channel adapter (HCA).
    pub const CA: Kind = Kind(2);
    /// A protection domain.
    pub const PD: Kind = Kind(3);
    /// A completion queue.
    pub const CQ: Kind = Kind(4);
    /// A memory region.
    pub const MR: Kind = Kind(5);
    /// A shared receive queue.
    pub const SRQ: Kind = Kind(6);
    /// An address vector.
    pub const AV: Kind = Kind(7);
    /// A queue pair.
    pub const QP: Kind = Kind(8);
    /// A connection endpoint.
    pub const CEP: Kind = Kind(9);
    /// A CM listen.
    pub const LISTEN: Kind = Kind(10);
    /// The connection manager's attachment to one port of an opened CA.
    pub const CM_PORT: Kind = Kind(11);
    /// A connection endpoint backed by librdmacm (CAs of the `rdma`
    /// provider, where QP1 is the kernel's).
    pub const RDMA_CEP: Kind = Kind(12);
    /// A listen backed by librdmacm.
    pub const RDMA_LISTEN: Kind = Kind(13);
    /// The first kind free for tests and tools.
    pub const FIRST_CUSTOM: u8 = 16;
    /// Kinds 16..32 are free for tests and tools (benchmarks, models);
    /// the library's own objects never use them, so a tool's object type
    /// cannot take the destroy dispatch of a library kind.
    pub const fn custom(id: u8) -> Kind {
        assert!(
            id >= Kind::FIRST_CUSTOM && (id as usize) < MAX_KINDS,
            "custom kinds are 16..32"
        );
        Kind(id)
    }

    /// All named kinds, in counter order.
    pub const NAMED: [Kind; 13] = [
        Kind::AL,
        Kind::CA,
        Kind::PD,
        Kind::CQ,
        Kind::MR,
        Kind::SRQ,
        Kind::AV,
        Kind::QP,
        Kind::CEP,
        Kind::LISTEN,
        Kind::CM_PORT,
        Kind::RDMA_CEP,
        Kind::RDMA_LISTEN,
    ];

    /// The kind's number (as stored in handles).
    pub const fn id(self) -> u8 {
        self.0
    }

    /// Index into per-kind counter arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Rebuild from a number; `None` for a number that is no kind.
    pub const fn from_id(id: u8) -> Option<Kind> {
        if id == 0 || id as usize >= MAX_KINDS {
            None
        } else {
            Some(Kind(id))
        }
    }

    /// Human-readable name.
    pub const fn name(self) -> &'static str {
        match self.0 {
            1 => "AL",
            2 => "CA",
            3 => "PD",
            4 => "CQ",
            5 => "MR",
            6 => "SRQ",
            7 => "AV",
            8 => "QP",
            9 => "CEP",
            10 => "listen",
            11 => "CM port",
            12 => "rdma_cm CEP",
            13 => "rdma_cm listen",
            16..=31 => "custom",
            _ => "unknown",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An untyped handle: what is stored in child lists and CID slots.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawHandle(u64);

impl RawHandle {
    /// Pack the three fields. `generation` must fit in [`GENERATION_BITS`].
    pub const fn new(kind: Kind, generation: u32, index: u32) -> RawHandle {
        debug_assert!(generation <= MAX_GENERATION);
        RawHandle(
            ((kind.0 as u64) << 56)
                | (((generation & MAX_GENERATION) as u64) << INDEX_BITS)
                | index as u64,
        )
    }
    /// Any `u64`, for handles that crossed a boundary (FFI, wire, user input).
    /// Nothing is checked here; resolving checks everything.
    pub const fn from_u64(raw: u64) -> RawHandle {
        RawHandle(raw)
    }
    /// The packed value.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
    /// The kind number carried (not validated).
    pub const fn kind_id(self) -> u8 {
        (self.0 >> 56) as u8
    }
    /// The generation carried.
    pub const fn generation(self) -> u32 {
        ((self.0 >> INDEX_BITS) as u32) & MAX_GENERATION
    }
    /// The slot index carried.
    pub const fn index(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Debug for RawHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Kind::from_id(self.kind_id()) {
            Some(k) => write!(f, "{k}#{}g{}", self.index(), self.generation()),
            None => write!(f, "?{:#018x}", self.0),
        }
    }
}

impl fmt::Display for RawHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A handle to an object of type `T`: what the public API hands out.
pub struct Handle<T> {
    raw: RawHandle,
    _type: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// Wrap a raw handle. The type is checked when the handle is resolved,
    /// not here, so a forged or mistyped handle is caught at use.
    pub const fn from_raw(raw: RawHandle) -> Self {
        Handle {
            raw,
            _type: PhantomData,
        }
    }
    /// The untyped handle.
    pub const fn raw(self) -> RawHandle {
        self.raw
    }
    /// The packed `u64`.
    pub const fn as_u64(self) -> u64 {
        self.raw.0
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl<T> Eq for Handle<T> {}
impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state)
    }
}
impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.raw, f)
    }
}
impl<T> fmt::Display for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.raw, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_and_never_yields_zero() {
        let h = RawHandle::new(Kind::QP, MAX_GENERATION, u32::MAX);
        assert_eq!(h.kind_id(), Kind::QP.id());
        assert_eq!(h.generation(), MAX_GENERATION);
        assert_eq!(h.index(), u32::MAX);
        let h0 = RawHandle::new(Kind::AL, 0, 0);
        assert_ne!(h0.as_u64(), 0);
        assert_eq!(RawHandle::from_u64(h.as_u64()), h);
    }

    #[test]
    fn unknown_kind_ids_are_rejected() {
        assert_eq!(Kind::from_id(0), None);
        assert_eq!(Kind::from_id(MAX_KINDS as u8), None);
        assert_eq!(Kind::from_id(255), None);
        assert_eq!(Kind::from_id(8), Some(Kind::QP));
    }
}
