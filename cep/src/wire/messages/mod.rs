//! The eleven CM messages (IBTA Vol 1, 12.6): typed bodies and their layouts.
//!
//! Each message has a `mod <name>_layout` table that names every defined field
//! with its data-area offset, first bit (from the MSB) and width. Anything not
//! in a table is reserved: ignored on decode and sent as zero.
//!
//! This file holds what every message shares (private data, information
//! areas, the [`Body`] trait the dispatch in `wire/mod.rs` uses); the
//! messages are grouped by the exchange they belong to: `connect.rs` (REQ,
//! MRA, REJ, REP, RTU), `disconnect.rs` (DREQ, DREP), `sidr.rs` (SIDR_REQ,
//! SIDR_REP), `alternate_path.rs` (LAP, APR), with the path record REQ and LAP
//! carry in `path.rs`.

use super::bits::{Blob, Field, Reader, Writer};
use super::error::WireError;

mod alternate_path;
mod connect;
mod disconnect;
mod path;
mod sidr;

pub use alternate_path::{Apr, Lap};
pub use connect::{Mra, Rej, Rep, Req, Rtu};
pub use disconnect::{Drep, Dreq};
pub use path::PathInfo;
pub(crate) use path::PathLayout;
pub use sidr::{SidrRep, SidrReq};

/// Private data of one message: always exactly the size of that message's
/// private data area.
///
/// A receiver cannot tell how many bytes the sender meant (the wire carries no
/// length), so the type does not pretend to know either: shorter input is
/// zero-padded when the value is built, and a decoded value holds the whole
/// area. The length limit is enforced here, once, which is why encoding a
/// message cannot fail on private data.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrivateData<const N: usize>([u8; N]);

impl<const N: usize> PrivateData<N> {
    /// Size of the private data area.
    pub const MAX_LEN: usize = N;

    /// Zero-padded copy of `data`; fails if `data` does not fit.
    pub fn new(data: &[u8]) -> Result<Self, WireError> {
        if data.len() > N {
            return Err(WireError::PrivateDataTooLong {
                max: N,
                got: data.len(),
            });
        }
        let mut area = [0u8; N];
        for (d, s) in area.iter_mut().zip(data) {
            *d = *s;
        }
        Ok(Self(area))
    }

    /// An all-zero area.
    pub const fn zeroed() -> Self {
        Self([0u8; N])
    }

    /// The whole area, padding included.
    pub const fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }

    /// The whole area by value, padding included.
    pub const fn into_bytes(self) -> [u8; N] {
        self.0
    }
}

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl<const N: usize> From<[u8; N]> for PrivateData<N> {
    fn from(area: [u8; N]) -> Self {
        Self(area)
    }
}

impl<const N: usize> TryFrom<&[u8]> for PrivateData<N> {
    type Error = WireError;

    fn try_from(data: &[u8]) -> Result<Self, WireError> {
        Self::new(data)
    }
}

impl<const N: usize> AsRef<[u8]> for PrivateData<N> {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl<const N: usize> core::ops::Deref for PrivateData<N> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl<const N: usize> core::fmt::Debug for PrivateData<N> {
    /// Prints only up to the last non-zero byte: the areas are mostly padding.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(
            f,
            "PrivateData<{N}>({:02x?}",
            self.0.get(..used).unwrap_or(&[])
        )?;
        if used < N {
            write!(f, " + {} zero bytes", N - used)?;
        }
        write!(f, ")")
    }
}

/// Size of REJ ARI, APR and SIDR_REP additional-information areas.
pub const INFO_LEN: usize = 72;

/// Returns the first `len` bytes of an information area, clamped to the area:
/// a length field larger than the area is a sender bug, not a reason to fail.
fn info_prefix(info: &[u8; INFO_LEN], len: u8) -> &[u8] {
    let n = usize::from(len).min(INFO_LEN);
    info.get(..n).unwrap_or(&[])
}

/// Common interface of the message bodies, used by the dispatch in `mod.rs`.
pub(crate) trait Body: Sized {
    /// AttributeID of the message.
    const ATTR: u16;
    /// Integer fields of the body.
    const FIELDS: &'static [Field];
    /// Byte-aligned areas of the body.
    const BLOBS: &'static [Blob];
    /// Path records embedded in the body.
    const PATHS: &'static [PathLayout] = &[];

    fn read(r: &Reader<'_>) -> Result<Self, WireError>;
    fn write(&self, w: &mut Writer) -> Result<(), WireError>;

    /// Sets every defined bit of the body.
    fn fill_mask(w: &mut Writer) {
        for f in Self::FIELDS {
            w.fill_field(*f);
        }
        for b in Self::BLOBS {
            w.fill_blob(*b);
        }
        for p in Self::PATHS {
            for f in p.fields() {
                w.fill_field(f);
            }
            for b in p.blobs() {
                w.fill_blob(b);
            }
        }
    }
}

fn closed<T>(
    value: u8,
    field: Field,
    from_code: impl FnOnce(u8) -> Option<T>,
) -> Result<T, WireError> {
    from_code(value).ok_or(WireError::Reserved {
        field: field.name,
        value: value.into(),
    })
}

fn non_canonical(field: Field, value: u64) -> WireError {
    WireError::NonCanonical {
        field: field.name,
        value,
    }
}
