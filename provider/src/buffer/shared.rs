//! The bytes of registered memory as a lock hands them out: [`Shared`]
//! under a read lock, [`Exclusive`] under a write lock.
//!
//! Memory that no device maps (the soft and RoCEv2 providers copy every
//! byte themselves, under the same lock) is handed to closures as plain
//! slices: the lock excludes every other access, so a `&[u8]` or
//! `&mut [u8]` is sound and costs nothing.
//!
//! Memory that a device maps for DMA (an MR of the `rdma` provider: the
//! NIC writes a receive, a remote RDMA WRITE or an atomic whenever it
//! likes, and reads a SEND or a remote READ, with no lock of ours) is
//! never spanned by a Rust reference, because a `&[u8]` promises that the
//! bytes do not change while it lives and a `&mut [u8]` that nothing else
//! reads or writes them: both would be broken by the device. Instead every
//! copy in or out is made through raw pointers with **volatile** loads and
//! stores (8 bytes at a time where both sides allow it): the compiler then
//! assumes nothing about the bytes between two accesses (it neither caches,
//! merges, re-reads nor invents accesses), which is what memory changed by
//! an agent outside the program needs. A closure that wants a slice gets one
//! over a private copy ([`Shared::view`]; [`Exclusive::view_mut`] copies
//! back the bytes the closure changed, and only those).
//!
//! What a reader sees while the device writes the same bytes is not
//! defined by the device (a remote WRITE lands in the NIC's own order and
//! size of stores): any mix of old and new bytes ("torn" data). The
//! application's protocol with its peer (a completion, a flag it polls)
//! says when bytes are final, as with every verbs API; what this module
//! guarantees is that such a race is only a race on the values, never
//! undefined behaviour.
#![allow(unsafe_code)]

use std::marker::PhantomData;

/// Bytes a read lock (or an equivalent) hands out.
pub struct Shared<'a> {
    ptr: *const u8,
    len: usize,
    device: bool,
    _lock: PhantomData<&'a [u8]>,
}

/// Bytes a write lock (or an equivalent) hands out.
pub struct Exclusive<'a> {
    ptr: *mut u8,
    len: usize,
    device: bool,
    _lock: PhantomData<&'a mut [u8]>,
}

/// Panic (never undefined behaviour) when `at..at+n` is not inside `len`:
/// the bounds a slice index would check.
#[track_caller]
fn check(at: usize, n: usize, len: usize) {
    assert!(
        at.checked_add(n).is_some_and(|end| end <= len),
        "range {at}+{n} outside {len} bytes"
    );
}

impl<'a> Shared<'a> {
    /// # Safety
    ///
    /// For `'a`: `ptr` is valid for reads of `len` bytes (or `len` is 0),
    /// no Rust code writes those bytes (a read lock is held), and, unless
    /// `device`, nothing outside Rust writes them either.
    pub(super) unsafe fn new(ptr: *const u8, len: usize, device: bool) -> Shared<'a> {
        Shared {
            ptr,
            len,
            device,
            _lock: PhantomData,
        }
    }

    /// Run `f` on the bytes: the memory itself when no device maps it, a
    /// private copy (volatile loads) when one does.
    pub fn view<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.device {
            let mut copy = vec![0; self.len];
            self.read(0, &mut copy);
            f(&copy)
        } else if self.len == 0 {
            f(&[])
        } else {
            // SAFETY: by `new`'s contract the bytes are valid and nothing
            // writes them for `'a`, which outlives this call; the slice
            // does not escape `f`.
            f(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
        }
    }

    /// Copy `out.len()` bytes from `at` into `out`. Panics when the range
    /// is outside.
    #[track_caller]
    pub fn read(&self, at: usize, out: &mut [u8]) {
        check(at, out.len(), self.len);
        if out.is_empty() {
            return;
        }
        // SAFETY: `at..at+n` is inside the valid bytes (checked); `out` is
        // a distinct, private buffer; `load` uses volatile reads when a
        // device may write the source.
        unsafe { transfer(self.ptr.add(at), out.as_mut_ptr(), out.len(), self.device) }
    }
}

impl<'a> Exclusive<'a> {
    /// # Safety
    ///
    /// For `'a`: `ptr` is valid for reads and writes of `len` bytes (or
    /// `len` is 0), no other Rust code reads or writes them (a write lock
    /// is held), and, unless `device`, nothing outside Rust does either.
    pub(super) unsafe fn new(ptr: *mut u8, len: usize, device: bool) -> Exclusive<'a> {
        Exclusive {
            ptr,
            len,
            device,
            _lock: PhantomData,
        }
    }

    /// The same bytes, read only, for as long as `self` is borrowed.
    pub fn shared(&self) -> Shared<'_> {
        // SAFETY: exclusive access implies the shared contract for the
        // borrow's life.
        unsafe { Shared::new(self.ptr, self.len, self.device) }
    }

    /// Run `f` on `at..at+n` with exclusive access: the memory itself
    /// when no device maps it; when one does, a private copy, of which the
    /// bytes `f` changed (and only those) are stored back (volatile), so a
    /// byte the device wrote meanwhile and `f` left alone keeps the
    /// device's value. Panics when the range is outside.
    #[track_caller]
    pub fn view_mut<R>(&mut self, at: usize, n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        check(at, n, self.len);
        if n == 0 {
            return f(&mut []);
        }
        if !self.device {
            // SAFETY: inside the valid bytes (checked); by `new`'s
            // contract nothing else accesses them for `'a`, and `&mut
            // self` makes this the only slice; it does not escape `f`.
            return f(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), n) });
        }
        let mut before = vec![0; n];
        self.shared().read(at, &mut before);
        let mut work = before.clone();
        let r = f(&mut work);
        for (i, (new, old)) in work.iter().zip(&before).enumerate() {
            if new != old {
                // SAFETY: `at + i` is inside the valid bytes (checked
                // above, `i < n`); a volatile store of one byte.
                unsafe { self.ptr.add(at + i).write_volatile(*new) };
            }
        }
        r
    }

    /// Copy `data` to `at`. Panics when the range is outside.
    #[track_caller]
    pub fn write(&mut self, at: usize, data: &[u8]) {
        check(at, data.len(), self.len);
        if data.is_empty() {
            return;
        }
        // SAFETY: inside the valid bytes (checked); `data` is a distinct
        // buffer (no Rust reference into these bytes exists while `self`
        // is borrowed mutably).
        unsafe { transfer(data.as_ptr(), self.ptr.add(at), data.len(), self.device) }
    }

    /// Set every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        if self.len == 0 {
            return;
        }
        if self.device {
            for i in 0..self.len {
                // SAFETY: `i < len`: inside the valid bytes.
                unsafe { self.ptr.add(i).write_volatile(byte) };
            }
        } else {
            self.view_mut(0, self.len, |b| b.fill(byte));
        }
    }

    /// Copy `n` bytes from `from` to `to` inside these bytes (the ranges
    /// may overlap, as `copy_within`). Panics when a range is outside.
    #[track_caller]
    pub fn copy_within(&mut self, from: usize, to: usize, n: usize) {
        check(from, n, self.len);
        check(to, n, self.len);
        if n == 0 || from == to {
            return;
        }
        if !self.device {
            self.view_mut(0, self.len, |b| b.copy_within(from..from + n, to));
            return;
        }
        let mut tmp = vec![0; n];
        self.shared().read(from, &mut tmp);
        self.write(to, &tmp);
    }
}

/// Copy `n` bytes from `src` at `so` to `dst` at `d_off` (two different
/// memories, each locked). Panics when a range is outside.
#[track_caller]
pub fn copy(src: &Shared<'_>, so: usize, dst: &mut Exclusive<'_>, d_off: usize, n: usize) {
    check(so, n, src.len);
    check(d_off, n, dst.len);
    if n == 0 {
        return;
    }
    // SAFETY: both ranges are inside their valid bytes (checked); the two
    // memories are different objects (the caller's two locks), so the
    // ranges do not overlap; volatile when either side is device-mapped.
    unsafe {
        transfer(
            src.ptr.add(so),
            dst.ptr.add(d_off),
            n,
            src.device || dst.device,
        )
    }
}

/// Copy `n` bytes from `src` to `dst`, which do not overlap; with
/// `volatile`, every load and store is volatile, 8 bytes at a time when
/// both pointers sit at the same offset in a word.
///
/// # Safety
///
/// `src` is valid for reads and `dst` for writes of `n` bytes, the two
/// ranges do not overlap, and no Rust reference spans `dst`'s bytes during
/// the call (nor `src`'s with write access).
unsafe fn transfer(src: *const u8, dst: *mut u8, n: usize, volatile: bool) {
    if !volatile {
        // SAFETY: the caller's contract, exactly `copy_nonoverlapping`'s.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    const W: usize = std::mem::size_of::<u64>();
    let mut i = 0;
    if (src as usize) % W == (dst as usize) % W {
        let head = (W - (src as usize) % W) % W;
        while i < head.min(n) {
            // SAFETY: `i < n`: inside both ranges.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
            i += 1;
        }
        while i + W <= n {
            // SAFETY: `i..i+W` is inside both ranges, and both pointers
            // are 8-byte aligned here (same offset in a word, the head
            // done), as `u64` accesses need.
            unsafe {
                let w = src.add(i).cast::<u64>().read_volatile();
                dst.add(i).cast::<u64>().write_volatile(w);
            }
            i += W;
        }
    }
    while i < n {
        // SAFETY: `i < n`: inside both ranges.
        unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(device: bool) {
        let mut a: Vec<u8> = (0..100).collect();
        let mut b = vec![0u8; 100];
        // SAFETY: the two vectors are live, private and not otherwise
        // touched while the views exist.
        let (sa, mut eb) = unsafe {
            (
                Shared::new(a.as_mut_ptr(), a.len(), device),
                Exclusive::new(b.as_mut_ptr(), b.len(), device),
            )
        };
        for (so, d, n) in [(0, 0, 100), (3, 9, 50), (1, 0, 97), (7, 7, 0)] {
            copy(&sa, so, &mut eb, d, n);
            let mut out = vec![0; n];
            eb.shared().read(d, &mut out);
            assert_eq!(out, (so as u8..so as u8 + n as u8).collect::<Vec<_>>());
        }
        eb.copy_within(10, 12, 20);
        eb.copy_within(40, 35, 20);
        eb.view_mut(0, 5, |s| s.copy_from_slice(&[9; 5]));
        eb.write(95, &[1, 2, 3, 4, 5]);
        let got = eb.shared().view(|s| s.to_vec());
        // `eb` is not used again: `b` is read directly below.
        let mut want: Vec<u8> = (0..100).collect();
        want.copy_within(1..98, 0);
        want.copy_within(10..30, 12);
        want.copy_within(40..60, 35);
        want[..5].copy_from_slice(&[9; 5]);
        want[95..].copy_from_slice(&[1, 2, 3, 4, 5]);
        assert_eq!(got, want);
        assert_eq!(b, want);
    }

    /// The volatile path gives the same bytes as the plain one, at every
    /// alignment and overlap the copies meet.
    #[test]
    fn volatile_and_plain_copies_agree() {
        both(false);
        both(true);
    }

    /// On device-mapped bytes, `view_mut` stores back only what the
    /// closure changed: a byte the device wrote meanwhile survives.
    #[test]
    fn a_device_write_during_view_mut_survives_unless_the_closure_wrote_that_byte() {
        let mut m = vec![0u8; 16];
        let p = m.as_mut_ptr();
        // SAFETY: `m` is live and touched only through `p` until dropped.
        let mut ex = unsafe { Exclusive::new(p, 16, true) };
        ex.view_mut(0, 16, |s| {
            // The "device" writes bytes 2 and 3 through its own pointer.
            // SAFETY: inside `m`; no reference spans it (the closure's
            // slice is a private copy).
            unsafe {
                p.add(2).write_volatile(0xd2);
                p.add(3).write_volatile(0xd3);
            }
            assert_eq!(s[2], 0, "the copy does not change under the closure");
            s[3] = 0xaa;
            s[5] = 0xbb;
        });
        // `ex` is not used again: `m` is read directly below.
        assert_eq!(&m[..6], &[0, 0, 0xd2, 0xaa, 0, 0xbb]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_range_outside_panics() {
        let mut m = vec![0u8; 4];
        // SAFETY: `m` is live and private.
        let sh = unsafe { Shared::new(m.as_mut_ptr(), 4, true) };
        sh.read(2, &mut [0; 3]);
    }
}
