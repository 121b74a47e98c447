//! `FarVec<T>`: a fixed-length vector of plain values in far memory, cached by lines.

use crate::section::{Section, DIRTY, EVICTABLE, FILLING, PINNED, REFERENCED};
use crate::{Far, FarError, LINE_BITS};
use std::cell::{Cell, Ref, RefMut};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;
use std::time::Instant;
use tidepool_store::{FetchMode, Key};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Lines written to the store per call when filling or flushing.
const BATCH: usize = 256;

/// A vector of `len` values of `T` in far memory. Elements are kept in lines of the section's
/// line size; reading one brings its whole line into the section.
///
/// Lines never written read as zeros (nothing is stored for them).
pub struct FarVec<T> {
    far: Far,
    section: Rc<Section>,
    base: u64,
    len: usize,
    per_line: usize,
    /// Lines an iterator fetches with a miss, beyond the one it needs.
    ahead: Cell<usize>,
    _t: PhantomData<T>,
}

impl<T> std::fmt::Debug for FarVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarVec")
            .field("len", &self.len)
            .field("per_line", &self.per_line)
            .field("base", &self.base)
            .field("section", &self.section)
            .finish()
    }
}

impl<T> FarVec<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// A far vector of `len` zeros, cached in `section`.
    pub fn new(far: &Far, section: &Rc<Section>, len: usize) -> Result<FarVec<T>, FarError> {
        let size = std::mem::size_of::<T>();
        let lb = section.line_bytes();
        if size == 0 || !lb.is_multiple_of(size) || std::mem::align_of::<T>() > 8 {
            return Err(FarError::Config(format!(
                "a line of {lb} bytes does not hold whole elements of {size} bytes aligned to {}",
                std::mem::align_of::<T>()
            )));
        }
        let per_line = lb / size;
        if len.div_ceil(per_line) as u64 >= 1 << LINE_BITS {
            return Err(FarError::Config(format!(
                "{len} elements are too many lines"
            )));
        }
        Ok(FarVec {
            far: far.clone(),
            section: section.clone(),
            base: far.new_base(),
            len,
            per_line,
            ahead: Cell::new((section.lines() / 4).clamp(1, 64)),
            _t: PhantomData,
        })
    }

    /// A far vector holding `values`, written to the store directly (not through the cache).
    pub fn from_slice(
        far: &Far,
        section: &Rc<Section>,
        values: &[T],
    ) -> Result<FarVec<T>, FarError> {
        let v = FarVec::new(far, section, values.len())?;
        let lb = section.line_bytes();
        let mut buf = vec![0u8; BATCH * lb];
        for (b, chunk) in values.chunks(BATCH * v.per_line).enumerate() {
            let bytes = chunk.as_bytes();
            buf[..bytes.len()].copy_from_slice(bytes);
            buf[bytes.len()..].fill(0);
            let lines = chunk.len().div_ceil(v.per_line);
            let items: Vec<(Key, &[u8])> = (0..lines)
                .map(|i| {
                    let key = v.base + (b * BATCH + i) as u64;
                    (key, &buf[i * lb..(i + 1) * lb])
                })
                .collect();
            v.far.store.write_many(&items)?;
        }
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements per line.
    pub fn per_line(&self) -> usize {
        self.per_line
    }

    pub fn section(&self) -> &Rc<Section> {
        &self.section
    }

    /// Lines in all.
    pub fn lines(&self) -> usize {
        self.len.div_ceil(self.per_line)
    }

    /// Sets how many lines past the one it needs an iterator fetches in the same round trip.
    pub fn set_prefetch(&self, lines: usize) {
        self.ahead.set(lines);
    }

    fn check(&self, index: usize) -> Result<(), FarError> {
        if index >= self.len {
            return Err(FarError::OutOfBounds {
                index,
                len: self.len,
            });
        }
        Ok(())
    }

    /// The elements of line `line` that exist (the last line may be short).
    fn valid(&self, line: usize) -> std::ops::Range<usize> {
        let first = line * self.per_line;
        first..(first + self.per_line).min(self.len)
    }

    /// The slot holding line `line`, fetching it (and `ahead` more lines in the same round
    /// trip) if it is not resident.
    fn ensure(&self, line: usize, ahead: usize, index: usize) -> Result<usize, FarError> {
        if let Some(s) = self.section.lookup(self.base + line as u64) {
            self.section.bump(|s| s.hits += 1);
            return Ok(s);
        }
        let last = (line + 1 + ahead).min(self.lines());
        let lines: Vec<usize> = (line..last).collect();
        self.fill(&lines, true, index)?;
        self.section
            .lookup(self.base + line as u64)
            .ok_or(FarError::AllBorrowed { index })
    }

    /// Fetches the lines of `lines` that are not resident, writing back the dirty lines they
    /// replace, in one round trip. With `required`, the first line must find a slot; the
    /// others are prefetches, skipped when no slot is free.
    fn fill(&self, lines: &[usize], required: bool, index: usize) -> Result<(), FarError> {
        let sec = &self.section;
        // (slot, new key, old tag, old flags)
        let mut taken: Vec<(usize, Key, u64, u8)> = Vec::new();
        for (n, &line) in lines.iter().enumerate() {
            let key = self.base + line as u64;
            if sec.find(key).is_some() {
                continue;
            }
            let Some(slot) = sec.victim(key) else {
                if required && n == 0 {
                    self.undo(&taken);
                    return Err(FarError::AllBorrowed { index });
                }
                continue;
            };
            let s = sec.slot(slot);
            taken.push((slot, key, s.tag.get(), s.flags.get()));
            sec.install(slot, key, FILLING | REFERENCED);
        }
        if taken.is_empty() {
            return Ok(());
        }
        let dirty: Vec<&(usize, Key, u64, u8)> = taken
            .iter()
            .filter(|t| t.2 != 0 && t.3 & DIRTY != 0)
            .collect();
        let t0 = Instant::now();
        let result = {
            let guards: Vec<Ref<'_, Box<[u64]>>> =
                dirty.iter().map(|t| sec.slot(t.0).data.borrow()).collect();
            let evict: Vec<(Key, &[u8])> = dirty
                .iter()
                .zip(&guards)
                .map(|(t, g)| (t.2 - 1, g.as_bytes()))
                .collect();
            let fetch: Vec<Key> = taken.iter().map(|t| t.1).collect();
            self.far.store.evict_fetch(&evict, &fetch, FetchMode::Keep)
        };
        let values = match result {
            Ok(v) => v,
            Err(e) => {
                // Nothing lost: the dirty lines are still here, under their own keys.
                self.undo(&taken);
                return Err(e.into());
            }
        };
        let nanos = t0.elapsed().as_nanos() as u64;
        let lb = sec.line_bytes();
        let mut bad = None;
        for (t, v) in taken.iter().zip(values) {
            let s = sec.slot(t.0);
            let mut d = s.data.borrow_mut();
            match v {
                Some(v) if v.len() == lb => d.as_mut_bytes().copy_from_slice(&v),
                Some(v) => {
                    bad.get_or_insert(FarError::BadLine {
                        got: v.len(),
                        want: lb,
                    });
                    drop(d);
                    sec.clear(t.0);
                    continue;
                }
                None => d.fill(0),
            }
            s.flags.set(REFERENCED);
        }
        let n = taken.len() as u64;
        sec.bump(|s| {
            s.misses += n;
            s.prefetched += n - required as u64;
            s.writebacks += dirty.len() as u64;
            s.fetches += 1;
            s.fetch_nanos += nanos;
        });
        bad.map_or(Ok(()), Err)
    }

    /// Gives slots taken for a fill that failed back to the lines they held.
    fn undo(&self, taken: &[(usize, Key, u64, u8)]) {
        for &(slot, _, old, flags) in taken.iter().rev() {
            if old == 0 {
                self.section.clear(slot);
            } else {
                self.section.install(slot, old - 1, flags);
            }
        }
    }

    /// Split phase, first half: brings in the lines holding `indices` that are not resident,
    /// all in one round trip, so the accesses that follow hit (Mira's `fetch` before `wait`;
    /// a program that knows its next accesses, as a graph walk knows the nodes of the edges
    /// ahead, turns many misses into one). A hint: lines that find no free slot are skipped,
    /// and asking for more lines than the section holds evicts some of them again.
    pub fn request(&self, indices: &[usize]) -> Result<(), FarError> {
        let mut lines: Vec<usize> = indices
            .iter()
            .filter(|&&i| i < self.len)
            .map(|&i| i / self.per_line)
            .collect();
        lines.sort_unstable();
        lines.dedup();
        self.fill(&lines, false, 0)
    }

    /// A guard on the line holding element `index`: its elements are a plain slice.
    pub fn line(&self, index: usize) -> Result<LineRef<'_, T>, FarError> {
        self.check(index)?;
        let line = index / self.per_line;
        let slot = self.ensure(line, 0, index)?;
        self.readable(line, slot)
    }

    fn readable(&self, line: usize, slot: usize) -> Result<LineRef<'_, T>, FarError> {
        let valid = self.valid(line);
        let data = self
            .section
            .slot(slot)
            .data
            .try_borrow()
            .map_err(|_| FarError::Borrowed {
                line,
                how: "for writing",
                want: "for reading",
            })?;
        let n = valid.len();
        Ok(LineRef {
            first: valid.start,
            data: Ref::map(data, |d| &as_elems::<T>(d)[..n]),
        })
    }

    /// A writable guard on the line holding element `index` (the line becomes dirty).
    pub fn line_mut(&self, index: usize) -> Result<LineMut<'_, T>, FarError> {
        self.check(index)?;
        let line = index / self.per_line;
        let slot = self.ensure(line, 0, index)?;
        self.writable(line, slot)
    }

    fn writable(&self, line: usize, slot: usize) -> Result<LineMut<'_, T>, FarError> {
        let valid = self.valid(line);
        let s = self.section.slot(slot);
        let data = s.data.try_borrow_mut().map_err(|_| FarError::Borrowed {
            line,
            how: "already",
            want: "for writing",
        })?;
        s.flags.set(s.flags.get() | DIRTY);
        let n = valid.len();
        Ok(LineMut {
            first: valid.start,
            data: RefMut::map(data, |d| &mut as_elems_mut::<T>(d)[..n]),
        })
    }

    /// A writable guard on the line holding `index`, whose old contents are not fetched:
    /// the caller writes the whole line (it starts as zeros).
    pub fn overwrite_line(&self, index: usize) -> Result<LineMut<'_, T>, FarError> {
        self.check(index)?;
        let line = index / self.per_line;
        let key = self.base + line as u64;
        let slot = match self.section.lookup(key) {
            Some(s) => s,
            None => {
                let slot = self
                    .section
                    .victim(key)
                    .ok_or(FarError::AllBorrowed { index })?;
                let s = self.section.slot(slot);
                let (old, flags) = (s.tag.get(), s.flags.get());
                if old != 0 && flags & DIRTY != 0 {
                    let d = s.data.borrow();
                    self.far.store.write_many(&[(old - 1, d.as_bytes())])?;
                    self.section.bump(|s| s.writebacks += 1);
                }
                self.section.install(slot, key, REFERENCED);
                s.data.borrow_mut().fill(0);
                self.section.bump(|s| s.misses += 1);
                slot
            }
        };
        self.writable(line, slot)
    }

    /// Element `index`.
    pub fn get(&self, index: usize) -> Result<T, FarError> {
        let l = self.line(index)?;
        Ok(l[index - l.first])
    }

    /// Sets element `index`.
    pub fn set(&self, index: usize, value: T) -> Result<(), FarError> {
        let mut l = self.line_mut(index)?;
        let first = l.first;
        l[index - first] = value;
        Ok(())
    }

    /// The elements in order, a line at a time (each miss fetches further lines with it).
    pub fn iter(&self) -> FarIter<'_, T> {
        self.iter_range(0..self.len)
    }

    /// The elements of `range` in order.
    pub fn iter_range(&self, range: std::ops::Range<usize>) -> FarIter<'_, T> {
        FarIter {
            v: self,
            next: range.start,
            end: range.end.min(self.len),
            cur: None,
        }
    }

    /// Every element, copied out.
    pub fn to_vec(&self) -> Result<Vec<T>, FarError> {
        self.iter().collect()
    }

    /// Writes this vector's dirty lines back to the store (they stay cached, clean).
    pub fn flush(&self) -> Result<(), FarError> {
        let hi = self.base + self.lines() as u64;
        let dirty: Vec<usize> = self
            .section
            .resident_in(self.base, hi)
            .filter(|&i| self.section.slot(i).flags.get() & DIRTY != 0)
            .collect();
        for chunk in dirty.chunks(BATCH) {
            let guards: Vec<Ref<'_, Box<[u64]>>> = chunk
                .iter()
                .map(|&i| self.section.slot(i).data.borrow())
                .collect();
            let items: Vec<(Key, &[u8])> = chunk
                .iter()
                .zip(&guards)
                .map(|(&i, g)| (self.section.slot(i).tag.get() - 1, g.as_bytes()))
                .collect();
            self.far.store.write_many(&items)?;
            drop(items);
            drop(guards);
            for &i in chunk {
                let s = self.section.slot(i);
                s.flags.set(s.flags.get() & !DIRTY);
            }
            self.section.bump(|s| s.writebacks += chunk.len() as u64);
        }
        Ok(())
    }

    /// Eviction hint: the program is done with the line holding `index` for now; it goes
    /// before any line CLOCK would choose.
    pub fn evictable(&self, index: usize) {
        let key = self.base + (index / self.per_line) as u64;
        if let Some(i) = self.section.find(key) {
            let s = self.section.slot(i);
            s.flags.set((s.flags.get() | EVICTABLE) & !REFERENCED);
        }
    }

    /// Keeps the line holding `index` resident until [`FarVec::unpin`].
    pub fn pin(&self, index: usize) -> Result<(), FarError> {
        self.check(index)?;
        let slot = self.ensure(index / self.per_line, 0, index)?;
        let s = self.section.slot(slot);
        s.flags.set(s.flags.get() | PINNED);
        Ok(())
    }

    pub fn unpin(&self, index: usize) {
        let key = self.base + (index / self.per_line) as u64;
        if let Some(i) = self.section.find(key) {
            let s = self.section.slot(i);
            s.flags.set(s.flags.get() & !PINNED);
        }
    }
}

impl<T> Drop for FarVec<T> {
    fn drop(&mut self) {
        let lines = self.len.div_ceil(self.per_line) as u64;
        let hi = self.base + lines;
        let resident: Vec<usize> = self.section.resident_in(self.base, hi).collect();
        for i in resident {
            self.section.clear(i);
        }
        // The far copies go too (a failure leaves garbage in the store, nothing worse).
        let mut key = self.base;
        while key < hi {
            let n = (hi - key).min(4096);
            let keys: Vec<Key> = (key..key + n).collect();
            let _ = self.far.store.remove_many(&keys);
            key += n;
        }
    }
}

fn as_elems<T: FromBytes + Immutable + KnownLayout>(d: &[u64]) -> &[T] {
    // Element size and alignment were checked against the line when the vector was made.
    <[T]>::ref_from_bytes(d.as_bytes()).expect("line holds whole aligned elements")
}

fn as_elems_mut<T: FromBytes + IntoBytes + KnownLayout>(d: &mut [u64]) -> &mut [T] {
    <[T]>::mut_from_bytes(d.as_mut_bytes()).expect("line holds whole aligned elements")
}

/// A resident line, borrowed for reading: its elements are a slice.
pub struct LineRef<'a, T> {
    /// Index of its first element in the vector.
    pub first: usize,
    data: Ref<'a, [T]>,
}

impl<T> Deref for LineRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for LineRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineRef")
            .field("first", &self.first)
            .field("elems", &self.data.len())
            .finish()
    }
}

/// A resident line, borrowed for writing (it is written back when evicted or flushed).
pub struct LineMut<'a, T> {
    pub first: usize,
    data: RefMut<'a, [T]>,
}

impl<T> Deref for LineMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T> DerefMut for LineMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for LineMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineMut")
            .field("first", &self.first)
            .field("elems", &self.data.len())
            .finish()
    }
}

/// Iterates over a far vector a line at a time: within a line, the next element is a load
/// from the borrowed slice.
pub struct FarIter<'a, T> {
    v: &'a FarVec<T>,
    next: usize,
    end: usize,
    cur: Option<LineRef<'a, T>>,
}

impl<T> std::fmt::Debug for FarIter<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarIter")
            .field("next", &self.next)
            .field("end", &self.end)
            .finish()
    }
}

impl<T> Iterator for FarIter<'_, T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    type Item = Result<T, FarError>;

    #[inline]
    fn next(&mut self) -> Option<Result<T, FarError>> {
        if self.next >= self.end {
            self.cur = None;
            return None;
        }
        let i = self.next;
        if let Some(l) = &self.cur {
            if let Some(&x) = l.get(i.wrapping_sub(l.first)) {
                self.next += 1;
                return Some(Ok(x));
            }
        }
        self.cur = None;
        let line = i / self.v.per_line;
        let r = self
            .v
            .ensure(line, self.v.ahead.get(), i)
            .and_then(|slot| self.v.readable(line, slot));
        match r {
            Ok(l) => {
                let x = l[i - l.first];
                self.cur = Some(l);
                self.next += 1;
                Some(Ok(x))
            }
            Err(e) => {
                self.next = self.end;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end.saturating_sub(self.next);
        (n, Some(n))
    }
}
