//! `FarVec<T>`: a fixed-length vector of plain values in far memory, cached by lines.

use crate::lines::{LineMut, LineRef};
use crate::profile::Recorder;
use crate::section::{Section, Table, DIRTY, EVICTABLE, NONE, PINNED, REFERENCED};
use crate::{Far, FarError, LINE_BITS};
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::{Arc, RwLock};
use tidepool_store::Key;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

mod iter;
mod miss;

pub use iter::{FarIter, FarLines};

/// Lines written to the store per call when filling or flushing.
const BATCH: usize = 256;
/// `shift` when elements per line are not a power of two.
const NO_SHIFT: u32 = u32::MAX;

/// Lines asked for ahead of a stream: which (in order), the reply, and the section's
/// write-back count when asked (a write-back since may have made the reply stale).
struct Pending {
    lines: Vec<usize>,
    rx: std::sync::mpsc::Receiver<crate::Fetched>,
    writebacks: u64,
}

/// A vector of `len` values of `T` in far memory. Elements are kept in lines of the section's
/// line size; reading one brings its whole line into the section.
///
/// Lines never written read as zeros (nothing is stored for them).
pub struct FarVec<T> {
    pub(crate) far: Far,
    section: Rc<Section>,
    /// Where each line is resident, kept by the section.
    table: Table,
    base: u64,
    len: usize,
    per_line: usize,
    /// log2 of `per_line`, or `NO_SHIFT`.
    shift: u32,
    /// Lines an iterator fetches with a miss, beyond the one it needs (`None`: the
    /// section's distance from measured round trips, [`Section::distance`]).
    ahead: Cell<Option<usize>>,
    /// The last line an element access missed on, and its distance from the miss before:
    /// two misses the same distance apart fetch further lines along that stride.
    stride: Cell<(usize, isize)>,
    /// Set in a profiling run (see [`crate::profile`]).
    prof: Option<Box<RefCell<Recorder>>>,
    /// An owner shared with readers in other threads: set to false (under the write lock)
    /// before its far copies go.
    shared: RefCell<Option<Arc<RwLock<bool>>>>,
    /// A reader: the owner's flag, read-locked across each fetch.
    reader_of: Option<Arc<RwLock<bool>>>,
    /// Lines a stream asked for ahead, on their way from another thread.
    pending: RefCell<Option<Pending>>,
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
    /// A far vector of `len` zeros, cached in `section`. Its profile's site is the caller's
    /// `file:line`.
    #[track_caller]
    pub fn new(far: &Far, section: &Rc<Section>, len: usize) -> Result<FarVec<T>, FarError> {
        let at = std::panic::Location::caller();
        FarVec::named(far, section, len, &format!("{}:{}", at.file(), at.line()))
    }

    /// [`FarVec::new`], profiled (and tuned) under the site name `site`.
    pub fn named(
        far: &Far,
        section: &Rc<Section>,
        len: usize,
        site: &str,
    ) -> Result<FarVec<T>, FarError> {
        FarVec::at(far, section, far.new_base(), len, site, None)
    }

    /// A vector over the lines under `base` (a reader's, when `reader_of` is set).
    pub(crate) fn at(
        far: &Far,
        section: &Rc<Section>,
        base: u64,
        len: usize,
        site: &str,
        reader_of: Option<Arc<RwLock<bool>>>,
    ) -> Result<FarVec<T>, FarError> {
        let size = std::mem::size_of::<T>();
        let lb = section.line_bytes();
        if size == 0 || !lb.is_multiple_of(size) || std::mem::align_of::<T>() > 8 {
            return Err(FarError::Config(format!(
                "a line of {lb} bytes does not hold whole elements of {size} bytes aligned to {}",
                std::mem::align_of::<T>()
            )));
        }
        let per_line = lb / size;
        let lines = len.div_ceil(per_line);
        if lines as u64 >= 1 << LINE_BITS {
            return Err(FarError::Config(format!(
                "{len} elements are too many lines"
            )));
        }
        Ok(FarVec {
            far: far.clone(),
            section: section.clone(),
            table: section.attach(base, lines),
            base,
            len,
            per_line,
            shift: if per_line.is_power_of_two() {
                per_line.trailing_zeros()
            } else {
                NO_SHIFT
            },
            ahead: Cell::new(None),
            stride: Cell::new((0, 0)),
            prof: far
                .profiling()
                .then(|| Box::new(RefCell::new(Recorder::new(site.to_string(), size, len, lb)))),
            shared: RefCell::new(None),
            reader_of,
            pending: RefCell::new(None),
            _t: PhantomData,
        })
    }

    /// Writes dirty lines back and gives what a reader in another thread needs to open the
    /// lines in a section of its own (see [`crate::FarShare`]).
    pub(crate) fn share_parts(&self) -> Result<(u64, usize, Arc<RwLock<bool>>), FarError> {
        self.flush()?;
        let flag = self
            .shared
            .borrow_mut()
            .get_or_insert_with(|| Arc::new(RwLock::new(true)))
            .clone();
        Ok((self.base, self.len, flag))
    }

    /// A far vector holding `values`, written to the store directly (not through the cache).
    #[track_caller]
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
        self.table.len()
    }

    /// Sets how many lines past the one it needs an iterator (or a strided run of misses)
    /// fetches in the same round trip, instead of the distance the section derives from
    /// measured round trips.
    pub fn set_prefetch(&self, lines: usize) {
        self.ahead.set(Some(lines));
    }

    /// Records an access in a profiling run.
    #[cold]
    #[inline(never)]
    fn note(&self, first: usize, n: usize, write: bool) {
        if let Some(p) = &self.prof {
            p.borrow_mut().access(first, n, write);
        }
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

    /// The line holding element `index`, and the element's place in it.
    #[inline]
    fn split(&self, index: usize) -> (usize, usize) {
        if self.shift != NO_SHIFT {
            (index >> self.shift, index & (self.per_line - 1))
        } else {
            (index / self.per_line, index % self.per_line)
        }
    }

    /// The slot holding line `line`, if resident.
    #[inline]
    fn resident(&self, line: usize) -> Option<usize> {
        let slot = self.table[line].get();
        (slot != NONE).then_some(slot as usize)
    }

    #[inline]
    fn hit(&self) {
        let h = &self.section.hits;
        h.set(h.get() + 1);
    }

    /// Elements in line `line` (the last line may be short).
    #[inline]
    fn valid(&self, line: usize) -> usize {
        (self.len - line * self.per_line).min(self.per_line)
    }

    /// The slot holding line `line`, fetching it (and `ahead` more lines in the same round
    /// trip) if it is not resident.
    #[inline]
    fn ensure(&self, line: usize, ahead: usize, index: usize) -> Result<usize, FarError> {
        if let Some(s) = self.resident(line) {
            self.hit();
            return Ok(s);
        }
        self.miss(line, ahead, index)
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
            .map(|&i| self.split(i).0)
            .filter(|&l| self.resident(l).is_none())
            .collect();
        if lines.is_empty() {
            return Ok(());
        }
        lines.sort_unstable();
        lines.dedup();
        self.fill(&lines, false, 0)
    }

    /// A guard on the line holding element `index`: its elements are a plain slice.
    #[inline]
    pub fn line(&self, index: usize) -> Result<LineRef<'_, T>, FarError> {
        self.check(index)?;
        let line = self.split(index).0;
        if self.prof.is_some() {
            self.note(line * self.per_line, self.valid(line), false);
        }
        self.line_quiet(line, index)
    }

    /// [`FarVec::line`] of a checked index, not profiled.
    fn line_quiet(&self, line: usize, index: usize) -> Result<LineRef<'_, T>, FarError> {
        let slot = self.ensure(line, 0, index)?;
        self.readable(line, slot)
    }

    #[inline]
    fn readable(&self, line: usize, slot: usize) -> Result<LineRef<'_, T>, FarError> {
        self.section
            .buf
            .read(
                slot,
                1,
                self.valid(line),
                line * self.per_line,
                REFERENCED,
                EVICTABLE,
            )
            .ok_or(FarError::Borrowed {
                line,
                how: "for writing",
                want: "for reading",
            })
    }

    /// A writable guard on the line holding element `index` (the line becomes dirty).
    #[inline]
    pub fn line_mut(&self, index: usize) -> Result<LineMut<'_, T>, FarError> {
        self.check(index)?;
        let line = self.split(index).0;
        if self.prof.is_some() {
            self.note(line * self.per_line, self.valid(line), true);
        }
        self.line_mut_quiet(line, index)
    }

    fn line_mut_quiet(&self, line: usize, index: usize) -> Result<LineMut<'_, T>, FarError> {
        let slot = self.ensure(line, 0, index)?;
        self.writable(line, slot)
    }

    #[inline]
    fn writable(&self, line: usize, slot: usize) -> Result<LineMut<'_, T>, FarError> {
        self.section
            .buf
            .write(
                slot,
                1,
                self.valid(line),
                line * self.per_line,
                REFERENCED | DIRTY,
                EVICTABLE,
            )
            .ok_or(FarError::Borrowed {
                line,
                how: "already",
                want: "for writing",
            })
    }

    /// A guard on line `line` (not element), fetching it and the prefetch distance of lines
    /// after it if it is not resident.
    pub(crate) fn line_ahead(&self, line: usize) -> Result<LineRef<'_, T>, FarError> {
        if self.prof.is_some() {
            self.note(line * self.per_line, self.valid(line), false);
        }
        let slot = self.ensure(line, self.distance(), line * self.per_line)?;
        self.readable(line, slot)
    }

    pub(crate) fn is_resident(&self, line: usize) -> bool {
        self.resident(line).is_some()
    }

    /// The store keys of the vector's lines, in order.
    pub(crate) fn keys(&self) -> std::ops::Range<Key> {
        self.base..self.base + self.lines() as u64
    }

    /// Lines not resident, and resident lines that are dirty.
    pub(crate) fn residency(&self) -> (usize, usize) {
        let mut missing = 0;
        let mut dirty = 0;
        for s in self.table.iter() {
            match s.get() {
                NONE => missing += 1,
                s if self.section.flags(s as usize) & DIRTY != 0 => dirty += 1,
                _ => {}
            }
        }
        (missing, dirty)
    }

    /// Sets every element `i` to `f(i)`, a line at a time through the section without
    /// fetching (whole lines are written), then writes the lines back: how a vector larger
    /// than its section is filled.
    pub fn fill_with(&self, mut f: impl FnMut(usize) -> T) -> Result<(), FarError> {
        for l in 0..self.lines() {
            let mut line = self.overwrite_line(l * self.per_line)?;
            let first = line.first;
            for (k, x) in line.iter_mut().enumerate() {
                *x = f(first + k);
            }
        }
        self.flush()
    }

    /// Brings every line of the vector in, many lines per round trip; lines that find no free
    /// slot are skipped (the section is smaller than the vector). Use before [`FarVec::local`].
    pub fn load_all(&self) -> Result<(), FarError> {
        let lines: Vec<usize> = (0..self.lines())
            .filter(|&l| self.resident(l).is_none())
            .collect();
        for chunk in lines.chunks(4 * BATCH) {
            self.fill(chunk, false, 0)?;
        }
        Ok(())
    }

    /// The first slot of the run of slots holding every line in order, if there is one.
    fn run(&self) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        let first = self.resident(0)?;
        (1..self.lines())
            .all(|l| self.resident(l) == Some(first + l))
            .then_some(first)
    }

    /// The whole vector as one plain slice, when every line is resident in consecutive slots,
    /// in order: as they are after [`FarVec::load_all`] in a direct-mapped section at least as
    /// large as the vector that it has to itself. Then the vector costs what a `Vec` costs,
    /// the case Mira compiles to native loads. `None` otherwise (use the line guards); nothing
    /// is fetched. No line is evicted while the guard lives.
    pub fn local(&self) -> Option<LineRef<'_, T>> {
        let first = self.run()?;
        if self.prof.is_some() {
            self.note(0, self.len, false);
        }
        self.section
            .buf
            .read(first, self.lines(), self.len, 0, REFERENCED, EVICTABLE)
    }

    /// [`FarVec::local`], writable (every line becomes dirty).
    pub fn local_mut(&self) -> Option<LineMut<'_, T>> {
        let first = self.run()?;
        if self.prof.is_some() {
            self.note(0, self.len, true);
        }
        self.section.buf.write(
            first,
            self.lines(),
            self.len,
            0,
            REFERENCED | DIRTY,
            EVICTABLE,
        )
    }

    /// A writable guard on the line holding `index`, whose old contents are not fetched:
    /// the caller writes the whole line (it starts as zeros).
    pub fn overwrite_line(&self, index: usize) -> Result<LineMut<'_, T>, FarError> {
        self.check(index)?;
        let line = self.split(index).0;
        if self.prof.is_some() {
            self.note(line * self.per_line, self.valid(line), true);
        }
        let slot = match self.resident(line) {
            Some(s) => {
                self.hit();
                s
            }
            None => {
                let key = self.base + line as u64;
                let sec = &self.section;
                let slot = sec.victim(key).ok_or(FarError::AllBorrowed { index })?;
                let (old, flags) = (sec.tag(slot), sec.flags(slot));
                if old != 0 && flags & DIRTY != 0 {
                    let d = sec.buf.bytes(slot).expect("a victim is not borrowed");
                    self.far.store.write_many(&[(old - 1, &d[..])])?;
                    sec.bump(|s| s.writebacks += 1);
                }
                sec.install(slot, key, REFERENCED);
                sec.buf.fill(slot, &[]);
                sec.bump(|s| s.misses += 1);
                slot
            }
        };
        self.writable(line, slot)
    }

    /// Element `index`. A resident line makes this a bounds check, a table load, a state load
    /// and the load itself (not counted in [`crate::SectionStats::hits`]: a counter on this path
    /// costs a quarter of its time on random access).
    #[inline]
    pub fn get(&self, index: usize) -> Result<T, FarError> {
        if self.prof.is_some() {
            self.note(index, 1, false);
        }
        if index < self.len {
            let (line, at) = self.split(index);
            if let Some(slot) = self.resident(line) {
                if let Some(x) = self.section.buf.load(slot, at, REFERENCED, EVICTABLE) {
                    return Ok(x);
                }
            }
        }
        self.get_cold(index)
    }

    #[inline(never)]
    fn get_cold(&self, index: usize) -> Result<T, FarError> {
        self.check(index)?;
        let l = self.line_quiet(self.split(index).0, index)?;
        Ok(l[index - l.first])
    }

    /// Sets element `index`.
    #[inline]
    pub fn set(&self, index: usize, value: T) -> Result<(), FarError> {
        if self.prof.is_some() {
            self.note(index, 1, true);
        }
        if index < self.len {
            let (line, at) = self.split(index);
            if let Some(slot) = self.resident(line) {
                if self
                    .section
                    .buf
                    .store(slot, at, value, REFERENCED | DIRTY, EVICTABLE)
                {
                    return Ok(());
                }
            }
        }
        self.set_cold(index, value)
    }

    #[inline(never)]
    fn set_cold(&self, index: usize, value: T) -> Result<(), FarError> {
        self.check(index)?;
        let mut l = self.line_mut_quiet(self.split(index).0, index)?;
        let first = l.first;
        l[index - first] = value;
        Ok(())
    }

    /// Replaces element `index` with `f` applied to a copy of it (one lookup for a
    /// read-modify-write). `f` may use this vector: the result is written to wherever the
    /// element is when `f` returns (fetching its line again if `f` caused its eviction), and an
    /// error if `f` left a guard on its line alive.
    #[inline]
    pub fn update<R, F: FnOnce(&mut T) -> R>(&self, index: usize, f: F) -> Result<R, FarError> {
        if self.prof.is_some() {
            self.note(index, 1, true);
        }
        if index < self.len {
            let (line, at) = self.split(index);
            if let Some(slot) = self.resident(line) {
                let buf = &self.section.buf;
                if let Some(mut x) = buf.load::<T>(slot, at, REFERENCED, EVICTABLE) {
                    let r = f(&mut x);
                    let same = self.resident(line) == Some(slot);
                    if !(same && buf.store(slot, at, x, REFERENCED | DIRTY, EVICTABLE)) {
                        self.set_cold(index, x)?;
                    }
                    return Ok(r);
                }
            }
        }
        let mut x = self.get_cold(index)?;
        let r = f(&mut x);
        self.set_cold(index, x)?;
        Ok(r)
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

    /// The lines of the vector in order, as guards (each miss fetches further lines with it):
    /// within one, elements are a plain slice.
    pub fn line_iter(&self) -> FarLines<'_, T> {
        FarLines { v: self, next: 0 }
    }

    /// Copies elements `first..first + out.len()` into `out`: the lines under them are asked
    /// for in one round trip, then copied a line at a time.
    pub fn read_into(&self, first: usize, out: &mut [T]) -> Result<(), FarError> {
        let end = self.range_end(first, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let per = self.per_line;
        let lines: Vec<usize> = (first / per..=(end - 1) / per).map(|l| l * per).collect();
        self.request(&lines)?;
        let mut at = first;
        while at < end {
            let l = self.line(at)?;
            let from = at - l.first;
            let n = (l.len() - from).min(end - at);
            out[at - first..at - first + n].copy_from_slice(&l[from..from + n]);
            at += n;
        }
        Ok(())
    }

    /// Copies `src` over elements `first..first + src.len()`. Lines it covers whole are
    /// overwritten without being fetched; the partial lines at either end are fetched first.
    pub fn write_from(&self, first: usize, src: &[T]) -> Result<(), FarError> {
        let end = self.range_end(first, src.len())?;
        let mut at = first;
        while at < end {
            let (line, _) = self.split(at);
            let line_first = line * self.per_line;
            let whole = at == line_first && end >= line_first + self.valid(line);
            let mut l = if whole {
                self.overwrite_line(at)?
            } else {
                self.line_mut(at)?
            };
            let from = at - l.first;
            let n = (l.len() - from).min(end - at);
            l[from..from + n].copy_from_slice(&src[at - first..at - first + n]);
            at += n;
        }
        Ok(())
    }

    /// The end of `n` elements from `first`, if they are all in the vector.
    fn range_end(&self, first: usize, n: usize) -> Result<usize, FarError> {
        match first.checked_add(n) {
            Some(end) if end <= self.len => Ok(end),
            _ => Err(FarError::OutOfBounds {
                index: first.saturating_add(n),
                len: self.len,
            }),
        }
    }

    /// Every element, copied out.
    pub fn to_vec(&self) -> Result<Vec<T>, FarError> {
        self.iter().collect()
    }

    /// Slots holding this vector's lines.
    fn resident_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.table
            .iter()
            .map(|s| s.get())
            .filter(|&s| s != NONE)
            .map(|s| s as usize)
    }

    /// Writes this vector's dirty lines back to the store (they stay cached, clean).
    pub fn flush(&self) -> Result<(), FarError> {
        let sec = &self.section;
        let dirty: Vec<usize> = self
            .resident_slots()
            .filter(|&i| sec.flags(i) & DIRTY != 0)
            .collect();
        for chunk in dirty.chunks(BATCH) {
            let guards: Vec<LineRef<'_, u8>> = chunk
                .iter()
                .map(|&i| {
                    sec.buf.bytes(i).ok_or(FarError::Borrowed {
                        line: (sec.tag(i) - 1 - self.base) as usize,
                        how: "for writing",
                        want: "to flush it",
                    })
                })
                .collect::<Result<_, _>>()?;
            let items: Vec<(Key, &[u8])> = chunk
                .iter()
                .zip(&guards)
                .map(|(&i, g)| (sec.tag(i) - 1, &g[..]))
                .collect();
            self.far.store.write_many(&items)?;
            drop(items);
            drop(guards);
            for &i in chunk {
                sec.set_flags(i, sec.flags(i) & !DIRTY);
            }
            sec.bump(|s| s.writebacks += chunk.len() as u64);
        }
        Ok(())
    }

    /// Eviction hint: the program is done with the line holding `index` for now; it goes
    /// before any line CLOCK would choose.
    pub fn evictable(&self, index: usize) {
        if index < self.len {
            if let Some(i) = self.resident(self.split(index).0) {
                self.section.hint_evictable(i);
            }
        }
    }

    /// Keeps the line holding `index` resident until [`FarVec::unpin`].
    pub fn pin(&self, index: usize) -> Result<(), FarError> {
        self.check(index)?;
        let slot = self.ensure(self.split(index).0, 0, index)?;
        self.section
            .set_flags(slot, self.section.flags(slot) | PINNED);
        Ok(())
    }

    pub fn unpin(&self, index: usize) {
        if index < self.len {
            if let Some(i) = self.resident(self.split(index).0) {
                self.section.set_flags(i, self.section.flags(i) & !PINNED);
            }
        }
    }
}

impl<T> Drop for FarVec<T> {
    fn drop(&mut self) {
        if let Some(p) = self.prof.take() {
            self.far.add_profile(p.into_inner().finish());
        }
        self.section.detach(self.base);
        if self.reader_of.is_some() {
            // The lines are the owner's.
            return;
        }
        if let Some(flag) = self.shared.borrow().as_ref() {
            // Readers in other threads fetch no more from now on.
            *flag.write().unwrap_or_else(|e| e.into_inner()) = false;
        }
        // The far copies go too (a failure leaves garbage in the store, nothing worse).
        let hi = self.base + self.table.len() as u64;
        let mut key = self.base;
        while key < hi {
            let n = (hi - key).min(4096);
            let keys: Vec<Key> = (key..key + n).collect();
            let _ = self.far.store.remove_many(&keys);
            key += n;
        }
    }
}
