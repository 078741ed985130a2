//! The bytes of a [`super::RegisteredBuffer`]: a heap allocation that
//! starts on a 4 KiB page boundary.
//!
//! Why aligned: a real device maps an MR's iova onto its memory page by
//! page, so the kernel refuses a registration whose iova and address sit
//! at different offsets in their pages (`ib_uverbs_reg_mr`: EINVAL). With
//! the buffer on a page boundary, registering from `offset` at an iova
//! with the same page offset (a page-aligned iova for offset 0) works on
//! every provider, as the library-owned form promises. The soft and
//! RoCEv2 providers do not care; the rdma provider does
//! (`docs/rdma-provider.md`).
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::shared::{Exclusive, Shared};

/// The alignment of every buffer (the x86-64 and most arm64 page size).
pub const PAGE: usize = 4096;

/// `len` bytes at a page-aligned address, zero-initialised or copied in;
/// freed on drop. Never moves or resizes.
pub struct PageBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `PageBytes` owns its allocation exclusively, like `Box<[u8]>`.
unsafe impl Send for PageBytes {}
// SAFETY: through `&PageBytes` Rust code only reads the bytes (a `&[u8]`
// when no device maps them, volatile copies when one does), like
// `Box<[u8]>`; writes need `&mut PageBytes`. A device writing them is
// outside Rust and is handled by the volatile copies (`shared.rs`).
unsafe impl Sync for PageBytes {}

impl PageBytes {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len, PAGE).ok()
    }

    /// A copy of `data` in a page-aligned allocation.
    ///
    /// Panics only where `Box<[u8]>` would: the size overflows `isize`
    /// (no `Vec` can be that large) or the allocator fails.
    pub fn from_slice(data: &[u8]) -> PageBytes {
        let len = data.len();
        if len == 0 {
            return PageBytes {
                // A dangling, aligned pointer: never dereferenced for 0
                // bytes, never freed.
                ptr: NonNull::new(PAGE as *mut u8).unwrap_or(NonNull::dangling()),
                len: 0,
            };
        }
        let layout = Self::layout(len).expect("a Vec's length fits a Layout");
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is a fresh allocation of `len` bytes that cannot
        // overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), len) };
        PageBytes { ptr, len }
    }
}

impl PageBytes {
    /// Length in bytes (without making a slice).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address (what a device registers).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The bytes behind a read lock; `device` when a device maps them
    /// (then they are copied with volatile accesses, never sliced).
    pub(super) fn shared(&self, device: bool) -> Shared<'_> {
        // SAFETY: `ptr` is valid for `len` bytes while `self` lives; `&self`
        // (a read guard) means no Rust code writes them meanwhile, and
        // only a device mapping them (then `device`) writes them otherwise.
        unsafe { Shared::new(self.ptr.as_ptr(), self.len, device) }
    }

    /// The bytes behind a write lock, as [`PageBytes::shared`].
    pub(super) fn exclusive(&mut self, device: bool) -> Exclusive<'_> {
        // SAFETY: as `shared`, and `&mut self` (a write guard) excludes
        // every other Rust access.
        unsafe { Exclusive::new(self.ptr.as_ptr(), self.len, device) }
    }
}

// The slices below are made only when no device maps the bytes (the
// callers check under the lock; `docs/memory.md`).
impl std::ops::Deref for PageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (or dangling
        // and aligned for 0) while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PageBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBytes {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `from_slice` with this very layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_page_aligned_and_copied() {
        for len in [0usize, 1, 100, 4096, 5000] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut b = PageBytes::from_slice(&data);
            assert_eq!(&b[..], &data[..]);
            assert_eq!(b.as_ptr() as usize % PAGE, 0, "len {len}");
            if len > 0 {
                b[len - 1] = 0xee;
                assert_eq!(b[len - 1], 0xee);
            }
        }
    }
}
