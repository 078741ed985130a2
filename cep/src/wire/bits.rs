//! Bounds-checked big-endian bit-field access on a 256-byte MAD.
//!
//! Every CM field is described once, as data (a [`Field`] or a [`Blob`]), and the
//! same description drives decoding, encoding and the defined-bits mask. That keeps
//! the three from drifting apart: the randomized tests compare the mask against
//! what encode and decode actually touch.
//!
//! Field positions follow the IBTA `Byte[Bit]` notation: `bit` counts from the most
//! significant bit of the byte at `off` (bit 0), and a field may run across byte
//! boundaries (24-bit QPNs, the 20-bit flow label).

use super::error::WireError;
use super::frame::{HEADER_LEN, MAD_LEN};

/// An unsigned integer field of up to 64 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Field {
    /// Byte offset in the MAD (header included).
    pub off: usize,
    /// First bit, counted from the most significant bit of byte `off`.
    pub bit: u32,
    /// Width in bits, `1..=64`.
    pub width: u32,
    /// Human-readable name used in error messages.
    pub name: &'static str,
}

impl Field {
    /// A field given by its offset in the CM data area (after the 24-byte header),
    /// which is how the IBTA tables and `cm-wire.md` number them.
    pub const fn data(off: usize, bit: u32, width: u32, name: &'static str) -> Self {
        Self {
            off: HEADER_LEN + off,
            bit,
            width,
            name,
        }
    }

    /// A field given by its offset in the MAD header.
    pub const fn header(off: usize, width: u32, name: &'static str) -> Self {
        Self {
            off,
            bit: 0,
            width,
            name,
        }
    }

    /// Largest value the field can hold.
    pub const fn max(self) -> u64 {
        if self.width >= 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    /// Number of bytes the field touches.
    const fn span(self) -> usize {
        (self.bit + self.width).div_ceil(8) as usize
    }

    /// True when the field lies inside a MAD and fits the 64-bit window used to
    /// access it. Checked for every table entry by the tests.
    pub const fn is_well_formed(self) -> bool {
        self.width >= 1
            && self.width <= 64
            && self.bit < 8
            && self.bit + self.width <= 64
            && self.off + self.span() <= MAD_LEN
    }
}

/// A byte-aligned run of opaque bytes (GIDs, ARI, additional information,
/// private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blob {
    /// Byte offset in the MAD (header included).
    pub off: usize,
    pub len: usize,
}

impl Blob {
    /// A blob given by its offset in the CM data area.
    pub const fn data(off: usize, len: usize) -> Self {
        Self {
            off: HEADER_LEN + off,
            len,
        }
    }

    pub const fn is_well_formed(self) -> bool {
        self.off + self.len <= MAD_LEN
    }
}

/// The aligned-to-nothing 8-byte big-endian word a field is accessed
/// through: it starts at the field's first byte, or at `MAD_LEN - 8` for a
/// field that ends less than 8 bytes before the end of the MAD. Fixed-size
/// loads and stores compile to single moves; the bytes around the field
/// are written back unchanged.
#[derive(Clone, Copy)]
struct Window {
    start: usize,
    /// Right shift that brings the field's least significant bit to bit 0.
    shift: u32,
}

impl Window {
    #[inline(always)]
    fn of(f: Field) -> Option<Window> {
        if !f.is_well_formed() {
            return None;
        }
        let start = f.off.min(MAD_LEN - 8);
        let lead = (f.off - start) as u32 * 8 + f.bit;
        Some(Window {
            start,
            shift: 64 - lead - f.width,
        })
    }

    #[inline(always)]
    fn load(self, buf: &[u8; MAD_LEN]) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&buf[self.start..self.start + 8]);
        u64::from_be_bytes(word)
    }
}

/// Read access to a received MAD.
///
/// The buffer is a fixed-size array and every offset comes from the constant
/// layout tables, so out-of-range access is a programming error, not an input
/// error. It is still handled without panicking in release builds (reads yield
/// zero) and trips a `debug_assert` so the tests catch a bad table entry.
pub(crate) struct Reader<'a> {
    buf: &'a [u8; MAD_LEN],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8; MAD_LEN]) -> Self {
        Self { buf }
    }

    #[inline(always)]
    pub fn uint(&self, f: Field) -> u64 {
        debug_assert!(f.is_well_formed(), "bad layout entry {f:?}");
        match Window::of(f) {
            Some(w) => (w.load(self.buf) >> w.shift) & f.max(),
            None => 0,
        }
    }

    // The narrowing helpers below are lossless because `uint` masks to the
    // field width and the tables only use them on fields no wider than the
    // target type (checked by `debug_assert`).

    #[inline(always)]
    pub fn u8(&self, f: Field) -> u8 {
        debug_assert!(f.width <= 8);
        self.uint(f) as u8
    }

    #[inline(always)]
    pub fn u16(&self, f: Field) -> u16 {
        debug_assert!(f.width <= 16);
        self.uint(f) as u16
    }

    #[inline(always)]
    pub fn u32(&self, f: Field) -> u32 {
        debug_assert!(f.width <= 32);
        self.uint(f) as u32
    }

    #[inline(always)]
    pub fn u64(&self, f: Field) -> u64 {
        self.uint(f)
    }

    #[inline(always)]
    pub fn flag(&self, f: Field) -> bool {
        self.uint(f) != 0
    }

    #[inline(always)]
    pub fn bytes<const N: usize>(&self, b: Blob) -> [u8; N] {
        debug_assert!(b.is_well_formed() && b.len == N, "bad layout entry {b:?}");
        let mut out = [0u8; N];
        if let Some(src) = self.buf.get(b.off..b.off.saturating_add(N)) {
            out.copy_from_slice(src);
        }
        out
    }
}

/// Builds an outgoing MAD. Starts all-zero, so every bit no field claims
/// (reserved bits, header Status/ClassSpecific/Reserved) goes out as zero.
pub(crate) struct Writer {
    buf: [u8; MAD_LEN],
    /// Check every value against its field but store nothing: what
    /// [`super::validate`] runs, so a message is checked with the exact
    /// rules encoding applies, without building the bytes.
    check_only: bool,
}

impl Writer {
    pub fn new() -> Self {
        Self {
            buf: [0u8; MAD_LEN],
            check_only: false,
        }
    }

    /// A writer that only checks (see `check_only`).
    pub fn checker() -> Self {
        Self {
            buf: [0u8; MAD_LEN],
            check_only: true,
        }
    }

    pub fn finish(self) -> [u8; MAD_LEN] {
        self.buf
    }

    /// Stores `value` after checking it fits the field: a wider value would
    /// silently corrupt its neighbours, so it is an encode error instead.
    #[inline(always)]
    pub fn uint(&mut self, f: Field, value: u64) -> Result<(), WireError> {
        if value > f.max() {
            return Err(WireError::FieldOutOfRange {
                field: f.name,
                value,
            });
        }
        self.raw(f, value);
        Ok(())
    }

    #[inline(always)]
    pub fn flag(&mut self, f: Field, value: bool) {
        self.raw(f, u64::from(value));
    }

    /// Copies `src` into the blob, zero-filling the rest of it. Callers pass
    /// sources no longer than the blob (the types guarantee it); anything longer
    /// is cut rather than spilled into the next field.
    #[inline(always)]
    pub fn bytes(&mut self, b: Blob, src: &[u8]) {
        debug_assert!(b.is_well_formed() && src.len() <= b.len, "bad blob {b:?}");
        if self.check_only {
            return;
        }
        let Some(dst) = self.buf.get_mut(b.off..b.off.saturating_add(b.len)) else {
            return;
        };
        let n = src.len().min(dst.len());
        let (head, tail) = dst.split_at_mut(n);
        head.copy_from_slice(&src[..n]);
        tail.fill(0);
    }

    /// Read-modify-write of the field's bits; `value` must already fit.
    ///
    /// The field's bytes are loaded as one big-endian word, merged under the
    /// field's mask and stored back: a handful of instructions per field
    /// instead of a loop over bytes (a REQ has some fifty fields).
    #[inline(always)]
    fn raw(&mut self, f: Field, value: u64) {
        debug_assert!(f.is_well_formed(), "bad layout entry {f:?}");
        if self.check_only {
            return;
        }
        let Some(w) = Window::of(f) else {
            return;
        };
        let mask = f.max() << w.shift;
        let bits = (value & f.max()) << w.shift;
        let merged = (w.load(&self.buf) & !mask) | bits;
        self.buf[w.start..w.start + 8].copy_from_slice(&merged.to_be_bytes());
    }

    /// Sets every bit of the field; used to build defined-bits masks.
    pub fn fill_field(&mut self, f: Field) {
        self.raw(f, f.max());
    }

    /// Sets every byte of the blob; used to build defined-bits masks.
    pub fn fill_blob(&mut self, b: Blob) {
        if let Some(dst) = self.buf.get_mut(b.off..b.off.saturating_add(b.len)) {
            dst.fill(0xFF);
        }
    }
}
