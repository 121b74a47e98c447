//! A section's line storage: every line in one aligned buffer, and beside it one state word per
//! line that counts the line's borrows and keeps the section's flag bits. This is the crate's
//! only unsafe code; everything above it is safe.
//!
//! Why not a `RefCell<Box<[u64]>>` per line: a line in its own allocation behind a 40-byte slot
//! struct costs three or four cache misses per access (slot, `RefCell` flag, box pointer, data)
//! where a native load costs one. Here an access reads one 4-byte state word from a dense array
//! (hot in cache for any section whose lines are not tiny) and then the data.
//!
//! Invariant: a line's bytes are reachable only through this type, and the state word says
//! who holds them: no borrow, `readers` shared borrows (`&[T]` in a [`LineRef`]), or one
//! exclusive borrow (`&mut [T]` in a [`LineMut`]). Every way in checks the word first, so no
//! `&mut` ever aliases another reference. The buffer is never moved or freed while a guard
//! borrows `self`.

use std::alloc::Layout;
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// State word: low 8 bits are the section's flags; then a count of shared borrows; the top bit
/// is the exclusive borrow.
const FLAGS: u32 = 0xFF;
const READER: u32 = 1 << 8;
const WRITER: u32 = 1 << 31;
const READERS: u32 = WRITER - READER;

/// Lines are aligned to this (a cache line), and elements to at most 8 (lines are multiples
/// of 8 bytes).
const ALIGN: usize = 64;

pub(crate) struct LineBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    line_bytes: usize,
    states: Box<[Cell<u32>]>,
}

impl LineBuf {
    /// `lines` lines of `line_bytes` (a positive multiple of 8), zeroed; `None` if that much
    /// cannot be allocated.
    pub(crate) fn new(lines: usize, line_bytes: usize) -> Option<LineBuf> {
        assert!(line_bytes > 0 && line_bytes.is_multiple_of(8) && lines > 0);
        let layout = Layout::from_size_align(lines.checked_mul(line_bytes)?, ALIGN).ok()?;
        // SAFETY: the layout's size is not zero (both factors are positive).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(LineBuf {
            ptr,
            layout,
            line_bytes,
            states: (0..lines).map(|_| Cell::new(0)).collect(),
        })
    }

    pub(crate) fn lines(&self) -> usize {
        self.states.len()
    }

    #[inline]
    pub(crate) fn flags(&self, line: usize) -> u8 {
        (self.states[line].get() & FLAGS) as u8
    }

    #[inline]
    pub(crate) fn set_flags(&self, line: usize, flags: u8) {
        let s = &self.states[line];
        s.set((s.get() & !FLAGS) | flags as u32);
    }

    /// Whether a guard holds the line.
    #[inline]
    pub(crate) fn is_borrowed(&self, line: usize) -> bool {
        self.states[line].get() & !FLAGS != 0
    }

    /// Sets `set` and clears `clear` in the flags of `line`, writing only on a change.
    #[inline]
    fn touch(&self, s: &Cell<u32>, st: u32, set: u8, clear: u8) {
        let new = (st | set as u32) & !(clear as u32);
        if new != st {
            s.set(new);
        }
    }

    /// Start of element `elem` of `line`, for `n` elements of `T` from there, which may run on
    /// through the lines after it; panics if they would leave the buffer or the `span` lines
    /// from `line` (a caller's bug, never data-dependent).
    #[inline]
    fn elem_ptr<T>(&self, line: usize, span: usize, elem: usize, n: usize) -> *mut T {
        const { assert!(std::mem::align_of::<T>() <= 8 && std::mem::size_of::<T>() > 0) };
        assert!(
            (elem + n) * std::mem::size_of::<T>() <= self.line_bytes * span
                && line + span <= self.lines(),
            "elements {elem}..{} of lines {line}..{} are outside them",
            elem + n,
            line + span
        );
        let offset = line * self.line_bytes + elem * std::mem::size_of::<T>();
        // SAFETY: `offset` plus the elements' size is within the allocation (checked above:
        // the elements fit in the `span` lines from `line`, all of them among `lines()`).
        unsafe { self.ptr.as_ptr().add(offset).cast() }
    }

    /// Element `elem` of `line`, unless the line is borrowed for writing; then updates its flags.
    #[inline]
    pub(crate) fn load<T: FromBytes>(
        &self,
        line: usize,
        elem: usize,
        set: u8,
        clear: u8,
    ) -> Option<T> {
        let s = &self.states[line];
        let st = s.get();
        if st & WRITER != 0 {
            return None;
        }
        let p = self.elem_ptr::<T>(line, 1, elem, 1);
        self.touch(s, st, set, clear);
        // SAFETY: in bounds and aligned (`elem_ptr`: the buffer is 64-aligned, lines are
        // multiples of 8 bytes, elements of `T` are at most 8-aligned and sit at multiples of
        // their size); no `&mut` to the line exists (no writer); any bytes are a valid `T`
        // (`FromBytes`).
        Some(unsafe { p.read() })
    }

    /// Writes element `elem` of `line`, unless the line is borrowed; then updates its flags.
    #[inline]
    pub(crate) fn store<T: IntoBytes>(
        &self,
        line: usize,
        elem: usize,
        value: T,
        set: u8,
        clear: u8,
    ) -> bool {
        let s = &self.states[line];
        let st = s.get();
        if st & !FLAGS != 0 {
            return false;
        }
        let p = self.elem_ptr::<T>(line, 1, elem, 1);
        self.touch(s, st, set, clear);
        // SAFETY: in bounds and aligned as in `load`; no reference to the line exists (no
        // borrow at all), so this write aliases nothing.
        unsafe { p.write(value) };
        true
    }

    /// A shared borrow of the first `n` elements of the `span` lines from `line` (consecutive
    /// lines hold consecutive elements), unless one is borrowed for writing (or has as many
    /// readers as the count holds).
    #[inline]
    pub(crate) fn read<T: FromBytes + Immutable + KnownLayout>(
        &self,
        line: usize,
        span: usize,
        n: usize,
        first: usize,
        set: u8,
        clear: u8,
    ) -> Option<LineRef<'_, T>> {
        let ptr = self.elem_ptr::<T>(line, span, 0, n);
        let states = &self.states[line..line + span];
        if states
            .iter()
            .any(|s| s.get() & WRITER != 0 || s.get() & READERS == READERS)
        {
            return None;
        }
        for s in states {
            self.touch(s, s.get(), set, clear);
            s.set(s.get() + READER);
        }
        Some(LineRef {
            first,
            buf: self,
            line,
            span,
            // SAFETY: `elem_ptr` points into the allocation, so it is not null.
            ptr: unsafe { NonNull::new_unchecked(ptr) },
            len: n,
            _t: PhantomData,
        })
    }

    /// An exclusive borrow of the first `n` elements of the `span` lines from `line`, unless
    /// one is borrowed at all.
    #[inline]
    pub(crate) fn write<T: FromBytes + IntoBytes + KnownLayout>(
        &self,
        line: usize,
        span: usize,
        n: usize,
        first: usize,
        set: u8,
        clear: u8,
    ) -> Option<LineMut<'_, T>> {
        let ptr = self.elem_ptr::<T>(line, span, 0, n);
        let states = &self.states[line..line + span];
        if states.iter().any(|s| s.get() & !FLAGS != 0) {
            return None;
        }
        for s in states {
            self.touch(s, s.get(), set, clear);
            s.set(s.get() | WRITER);
        }
        Some(LineMut {
            first,
            buf: self,
            line,
            span,
            // SAFETY: as in `read`.
            ptr: unsafe { NonNull::new_unchecked(ptr) },
            len: n,
            _t: PhantomData,
        })
    }

    /// The whole line as bytes (to write it back), unless it is borrowed for writing.
    pub(crate) fn bytes(&self, line: usize) -> Option<LineRef<'_, u8>> {
        self.read::<u8>(line, 1, self.line_bytes, 0, 0, 0)
    }

    /// Replaces the line's bytes with `src` (zeros after it), unless the line is borrowed.
    pub(crate) fn fill(&self, line: usize, src: &[u8]) -> bool {
        match self.write::<u8>(line, 1, self.line_bytes, 0, 0, 0) {
            Some(mut w) => {
                let n = src.len().min(w.len());
                w[..n].copy_from_slice(&src[..n]);
                w[n..].fill(0);
                true
            }
            None => false,
        }
    }
}

impl Drop for LineBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; guards borrow `self`, so none is left.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A resident line (or a run of them) borrowed for reading: its elements are a plain slice,
/// and reading one is a load. While it lives the line stays resident and unwritten.
pub struct LineRef<'a, T> {
    /// Index of its first element in the structure.
    pub first: usize,
    buf: &'a LineBuf,
    line: usize,
    span: usize,
    ptr: NonNull<T>,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

impl<T> Deref for LineRef<'_, T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` elements from `ptr` lie in the line (checked when borrowed), and the
        // line holds a shared borrow for as long as this guard lives: nothing writes it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for LineRef<'_, T> {
    #[inline]
    fn drop(&mut self) {
        for s in &self.buf.states[self.line..self.line + self.span] {
            s.set(s.get() - READER);
        }
    }
}

impl<T> std::fmt::Debug for LineRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineRef")
            .field("first", &self.first)
            .field("elems", &self.len)
            .finish()
    }
}

/// A resident line (or a run of them) borrowed for writing (it is written back when evicted or
/// flushed).
pub struct LineMut<'a, T> {
    /// Index of its first element in the structure.
    pub first: usize,
    buf: &'a LineBuf,
    line: usize,
    span: usize,
    ptr: NonNull<T>,
    len: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T> Deref for LineMut<'_, T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: as for `LineRef`; this guard holds the only borrow of the line.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for LineMut<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `LineRef`, and the line's exclusive borrow is this guard's, reached
        // through `&mut self`, so this is the only reference to the elements.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for LineMut<'_, T> {
    #[inline]
    fn drop(&mut self) {
        for s in &self.buf.states[self.line..self.line + self.span] {
            s.set(s.get() & !WRITER);
        }
    }
}

impl<T> std::fmt::Debug for LineMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineMut")
            .field("first", &self.first)
            .field("elems", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrows_exclude_each_other() {
        let b = LineBuf::new(2, 64).unwrap();
        assert!(b.store::<u64>(1, 7, 42, 0, 0));
        let r = b.read::<u64>(1, 1, 8, 8, 0, 0).unwrap();
        assert_eq!(r[7], 42);
        assert!(b.write::<u64>(1, 1, 8, 8, 0, 0).is_none());
        assert!(!b.store::<u64>(1, 0, 1, 0, 0));
        let r2 = b.read::<u64>(1, 1, 8, 8, 0, 0).unwrap();
        assert_eq!(b.load::<u64>(1, 7, 0, 0), Some(42));
        drop((r, r2));
        let mut w = b.write::<u64>(1, 1, 8, 8, 2, 0).unwrap();
        assert!(b.read::<u64>(1, 1, 8, 8, 0, 0).is_none());
        assert_eq!(b.load::<u64>(1, 7, 0, 0), None);
        assert!(!b.fill(1, &[1; 64]));
        w[0] = 5;
        drop(w);
        assert_eq!(b.flags(1), 2);
        assert!(!b.is_borrowed(1));
        assert_eq!(b.load::<u64>(1, 0, 0, 0), Some(5));
        // The other line was never touched.
        assert_eq!(
            b.bytes(0).unwrap().iter().map(|&x| x as u64).sum::<u64>(),
            0
        );
    }

    #[test]
    fn spans_borrow_every_line() {
        let b = LineBuf::new(3, 64).unwrap();
        let mut w = b.write::<u64>(0, 2, 16, 0, 0, 0).unwrap();
        w[15] = 9;
        assert!(b.is_borrowed(0) && b.is_borrowed(1) && !b.is_borrowed(2));
        assert!(b.read::<u64>(1, 2, 16, 8, 0, 0).is_none());
        drop(w);
        assert_eq!(b.load::<u64>(1, 7, 0, 0), Some(9));
        let r = b.read::<u64>(1, 2, 16, 8, 0, 0).unwrap();
        assert!(b.write::<u64>(2, 1, 8, 16, 0, 0).is_none());
        assert_eq!(r.len(), 16);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn elements_past_the_line_panic() {
        let b = LineBuf::new(2, 64).unwrap();
        let _ = b.load::<u64>(0, 8, 0, 0);
    }
}
