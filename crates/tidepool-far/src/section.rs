//! Cache sections: local areas that cache lines of far structures (Mira §4.2, §5.3).
//!
//! A section is a fixed set of line slots, allocated once: their data in one aligned buffer
//! (`lines.rs`), and per slot a tag (the far key of the line it holds, plus one; 0 is empty),
//! a few flag bits and a borrow count. A borrowed line is never chosen for eviction and never
//! written while read. Sections are per thread (`Rc`, not `Sync`), as Mira gives each thread
//! private sections for data it does not share for writing.
//!
//! Finding a line does not depend on the structure: each far structure attached to a section
//! keeps a *line table*, one 4-byte slot number per line of the structure (or `NONE`), which the
//! section updates whenever it installs or evicts a line. A lookup is one load from that table,
//! for every structure, where Mira's fully associative sections search a hash table. The cost
//! is 4 bytes of local memory per far line (0.1% of the far data at 4 KiB lines, 6% at 64 B).
//!
//! Structures:
//! - **direct-mapped**: a line can go to one slot (line number plus a hash of its structure,
//!   modulo the slots), so a sequential scan fills slots in order and never conflicts with
//!   itself; replacement is free of bookkeeping.
//! - **k-way set-associative**: to any of the k slots of one set; CLOCK within the set.
//! - **fully associative**: to any slot; CLOCK over all slots.
//!
//! Victims, in order: an empty slot, a slot marked evictable (a hint: the program is done with
//! it), then CLOCK (a slot whose reference bit is clear; passing a slot clears its bit).
//! Pinned and borrowed slots are never victims.

use crate::lines::LineBuf;
use crate::{FarError, LINE_BITS};
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// A far structure's line table: the slot holding each of its lines, or [`NONE`].
pub(crate) type Table = Rc<[Cell<u32>]>;
/// Not resident.
pub(crate) const NONE: u32 = u32::MAX;

/// Sets of up to this many ways are searched whole for an empty or evictable slot; wider
/// ones (fully associative sections) keep counts so that a miss costs O(1), not O(ways).
const NARROW: usize = 16;

#[derive(Debug, Default)]
struct Wide {
    /// Empty slots in the set.
    empty: Cell<u32>,
    /// Eviction hints given and not yet used (at least as many as evictable slots).
    hinted: Cell<u32>,
    /// Where to start looking for an empty slot: past the last one found.
    seek: Cell<u32>,
}

pub(crate) const DIRTY: u8 = 1;
pub(crate) const REFERENCED: u8 = 2;
pub(crate) const EVICTABLE: u8 = 4;
pub(crate) const PINNED: u8 = 8;
/// Taken by the batch being filled: not a victim for the rest of the batch.
pub(crate) const FILLING: u8 = 16;

/// How lines map to slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// One slot per line: no replacement choice to make; for sequential and strided access.
    Direct,
    /// Any of k slots of a set.
    SetAssociative(usize),
    /// Any slot (CLOCK): no conflict misses; for random access with a large working set.
    Full,
}

impl std::fmt::Display for Structure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Structure::Direct => f.write_str("direct"),
            Structure::SetAssociative(k) => write!(f, "{k}-way"),
            Structure::Full => f.write_str("full"),
        }
    }
}

/// A section's shape: [`SectionConfig::new`] with all of it (it has no other settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionConfig {
    /// Where a line may be cached in the section.
    pub(crate) structure: Structure,
    /// Bytes per line: a multiple of 8.
    pub(crate) line_bytes: usize,
    /// Bytes of lines in all (rounded down to whole lines, and to whole sets).
    pub(crate) capacity: usize,
}

impl SectionConfig {
    /// A section of `structure`, with lines of `line_bytes` (a multiple of 8) and `capacity`
    /// bytes of lines in all (rounded down to whole lines, and to whole sets).
    pub fn new(structure: Structure, line_bytes: usize, capacity: usize) -> SectionConfig {
        SectionConfig {
            structure,
            line_bytes,
            capacity,
        }
    }
}

/// What a section did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionStats {
    /// Line lookups by guards and iterators that found the line resident (`get`, `set` and
    /// `update` do not count theirs: see [`crate::FarVec::get`]).
    pub hits: u64,
    /// Lines fetched (or installed without fetching) on a miss or a prefetch.
    pub misses: u64,
    /// Of those, lines fetched from the store (what `fetch_nanos` was spent on).
    pub fetched: u64,
    /// Lines brought in ahead of use.
    pub prefetched: u64,
    /// Dirty lines written back.
    pub writebacks: u64,
    /// Round trips to the store for misses.
    pub fetches: u64,
    /// Nanoseconds spent in those round trips.
    pub fetch_nanos: u64,
}

/// A local cache area for far lines. See the module docs.
pub struct Section {
    config: SectionConfig,
    pub(crate) buf: LineBuf,
    /// Per slot: far key + 1; 0: empty.
    tags: Box<[Cell<u64>]>,
    sets: usize,
    ways: usize,
    /// The structures cached here, by structure number: line table, and the set their line
    /// 0 maps to.
    owners: RefCell<FxHashMap<u64, (Table, u64)>>,
    /// CLOCK hands: one per set (one set in all when fully associative).
    hands: Box<[Cell<u32>]>,
    /// Per set, for sets of more than [`NARROW`] ways (empty otherwise): what spares
    /// `victim` from looking at every way on every miss.
    wide: Box<[Wide]>,
    /// Hits, counted apart: they are on every access's fast path.
    pub(crate) hits: Cell<u64>,
    /// Round trips seen, for the prefetch distance.
    fetch_model: Cell<FetchModel>,
    stats: Cell<SectionStats>,
}

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Section")
            .field("config", &self.config)
            .field("slots", &self.lines())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Section {
    pub fn new(config: SectionConfig) -> Result<Rc<Section>, FarError> {
        let lb = config.line_bytes;
        if lb == 0 || !lb.is_multiple_of(8) {
            return Err(FarError::Config(format!(
                "line size {lb} is not a positive multiple of 8 bytes"
            )));
        }
        let n = config.capacity / lb;
        let ways = match config.structure {
            Structure::Direct => 1,
            Structure::SetAssociative(k) if k >= 1 => k,
            Structure::SetAssociative(_) => {
                return Err(FarError::Config(
                    "a set-associative section needs at least one way".into(),
                ))
            }
            Structure::Full => n.max(1),
        };
        let sets = n / ways;
        if sets == 0 {
            return Err(FarError::Config(format!(
                "{} bytes hold {n} lines of {lb} bytes, fewer than one set of {ways}",
                config.capacity
            )));
        }
        let slots = sets * ways;
        if slots >= NONE as usize {
            return Err(FarError::Config("2^32 lines or more in one section".into()));
        }
        let buf = LineBuf::new(slots, lb).ok_or_else(|| {
            FarError::Config(format!(
                "cannot allocate {} bytes for the section's lines",
                slots * lb
            ))
        })?;
        Ok(Rc::new(Section {
            config,
            buf,
            tags: (0..slots).map(|_| Cell::new(0)).collect(),
            sets,
            ways,
            owners: RefCell::new(FxHashMap::default()),
            hands: (0..sets).map(|_| Cell::new(0)).collect(),
            wide: if ways > NARROW {
                (0..sets)
                    .map(|_| Wide {
                        empty: Cell::new(ways as u32),
                        ..Wide::default()
                    })
                    .collect()
            } else {
                Box::default()
            },
            hits: Cell::new(0),
            fetch_model: Cell::new(FetchModel::default()),
            stats: Cell::new(SectionStats::default()),
        }))
    }

    pub fn config(&self) -> SectionConfig {
        self.config
    }

    pub fn line_bytes(&self) -> usize {
        self.config.line_bytes
    }

    /// Line slots in all.
    pub fn lines(&self) -> usize {
        self.buf.lines()
    }

    pub fn stats(&self) -> SectionStats {
        SectionStats {
            hits: self.hits.get(),
            ..self.stats.get()
        }
    }

    /// Records a round trip that fetched `lines` lines in `nanos`.
    pub(crate) fn observe_fetch(&self, lines: usize, nanos: u64) {
        let mut m = self.fetch_model.get();
        m.add(lines as f64, nanos as f64);
        self.fetch_model.set(m);
    }

    /// Lines to fetch past a miss when streaming: enough that the round trip's fixed cost is at
    /// most a tenth of the time spent moving lines, from a least-squares fit of the round
    /// trips seen (time = fixed + lines x per line), at least the starting distance and within
    /// a quarter of the section and 1 MiB. Until
    /// the fit has two batch sizes to go on, a quarter of the section (at most 64) and half
    /// of it alternate, which gives it them.
    pub fn distance(&self) -> usize {
        // A quarter of the section, and at most 1 MiB a round trip: larger batches only add
        // a larger staging buffer to fault in.
        let cap = (self.lines() / 4).min((1 << 20) / self.line_bytes()).max(1);
        let start = cap.min(64);
        let m = self.fetch_model.get();
        match m.fit() {
            // Never below the starting distance: a fit from a few round trips can read a
            // fixed cost of almost nothing, and batches of one or two lines then cost a
            // wake-up of the fetch-ahead thread each.
            Some((fixed, per_line)) => {
                ((fixed / (0.1 * per_line)).ceil() as usize).clamp(start, cap)
            }
            None if m.n as u64 % 2 == 1 => (start / 2).max(1),
            None => start,
        }
    }

    pub(crate) fn bump(&self, f: impl FnOnce(&mut SectionStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Starts caching the structure whose keys begin at `base` (`lines` lines): its table.
    ///
    /// A structure alone in its section maps line `i` to set `i` (modulo the sets), so one that
    /// fits a direct-mapped section lies in it in order, as one run of slots; structures that
    /// share a section start at sets hashed from their numbers, so that their first lines do
    /// not all compete for the same sets.
    pub(crate) fn attach(&self, base: u64, lines: usize) -> Table {
        let table: Table = (0..lines).map(|_| Cell::new(NONE)).collect();
        let mut owners = self.owners.borrow_mut();
        let id = base >> LINE_BITS;
        let start = if owners.is_empty() {
            0
        } else {
            id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32
        };
        owners.insert(id, (table.clone(), start));
        table
    }

    /// Drops every line of the structure at `base` (not written back) and forgets it.
    pub(crate) fn detach(&self, base: u64) {
        let Some((table, _)) = self.owners.borrow_mut().remove(&(base >> LINE_BITS)) else {
            return;
        };
        for t in table.iter() {
            let slot = t.replace(NONE);
            if slot != NONE {
                self.tags[slot as usize].set(0);
                self.buf.set_flags(slot as usize, 0);
                if let Some(w) = self.wide.get(slot as usize / self.ways) {
                    w.empty.set(w.empty.get() + 1);
                }
            }
        }
    }

    #[inline]
    pub(crate) fn tag(&self, slot: usize) -> u64 {
        self.tags[slot].get()
    }

    #[inline]
    pub(crate) fn flags(&self, slot: usize) -> u8 {
        self.buf.flags(slot)
    }

    #[inline]
    pub(crate) fn set_flags(&self, slot: usize, flags: u8) {
        self.buf.set_flags(slot, flags)
    }

    /// The set a key maps to: its line number plus its structure's start (see `attach`), so
    /// a structure's consecutive lines take consecutive sets.
    fn set_of(&self, key: u64) -> usize {
        let start = self
            .owners
            .borrow()
            .get(&(key >> LINE_BITS))
            .map_or(0, |o| o.1);
        let line = key & ((1 << LINE_BITS) - 1);
        (start.wrapping_add(line) % self.sets as u64) as usize
    }

    /// The table entry of `key`'s line; `None` if its structure is not attached.
    fn entry<R>(&self, key: u64, f: impl FnOnce(&Cell<u32>) -> R) -> Option<R> {
        let owners = self.owners.borrow();
        let (table, _) = owners.get(&(key >> LINE_BITS))?;
        table.get((key & ((1 << LINE_BITS) - 1)) as usize).map(f)
    }

    /// A slot for `key` (not resident): empty, evictable, or CLOCK's choice; never pinned,
    /// borrowed or filling. `None` if every candidate is.
    pub(crate) fn victim(&self, key: u64) -> Option<usize> {
        let set = match self.config.structure {
            Structure::Full => 0,
            _ => self.set_of(key),
        };
        let first = set * self.ways;
        let free =
            |i: usize| self.buf.flags(i) & (PINNED | FILLING) == 0 && !self.buf.is_borrowed(i);
        let candidates = first..first + self.ways;
        let evictable = |i: &usize| self.buf.flags(*i) & EVICTABLE != 0 && free(*i);
        if let Some(w) = self.wide.get(set) {
            if w.empty.get() > 0 {
                let start = w.seek.get() as usize;
                let found = (0..self.ways)
                    .map(|k| (start + k) % self.ways)
                    .find(|&j| self.tags[first + j].get() == 0 && free(first + j));
                if let Some(j) = found {
                    w.seek.set(((j + 1) % self.ways) as u32);
                    return Some(first + j);
                }
            }
            if w.hinted.get() > 0 {
                match candidates.clone().find(evictable) {
                    Some(i) => {
                        w.hinted.set(w.hinted.get() - 1);
                        return Some(i);
                    }
                    None => w.hinted.set(0),
                }
            }
        } else {
            if let Some(i) = candidates
                .clone()
                .find(|&i| self.tags[i].get() == 0 && free(i))
            {
                return Some(i);
            }
            if let Some(i) = candidates.clone().find(evictable) {
                return Some(i);
            }
        }
        // CLOCK: at most two sweeps (the first may only clear reference bits).
        let hand = &self.hands[set];
        for _ in 0..2 * self.ways {
            let i = first + hand.get() as usize;
            hand.set(((hand.get() as usize + 1) % self.ways) as u32);
            if !free(i) {
                continue;
            }
            let f = self.buf.flags(i);
            if f & REFERENCED != 0 {
                self.buf.set_flags(i, f & !REFERENCED);
            } else {
                return Some(i);
            }
        }
        None
    }

    /// Makes slot `i` hold `key` (its old line already written back or clean).
    pub(crate) fn install(&self, i: usize, key: u64, flags: u8) {
        self.clear(i);
        self.entry(key, |e| e.set(i as u32))
            .expect("a line of an attached structure");
        self.tags[i].set(key + 1);
        self.buf.set_flags(i, flags);
        if let Some(w) = self.wide.get(i / self.ways) {
            w.empty.set(w.empty.get() - 1);
        }
    }

    /// Marks slot `i` to go before any line CLOCK would choose.
    pub(crate) fn hint_evictable(&self, i: usize) {
        self.set_flags(i, (self.flags(i) | EVICTABLE) & !REFERENCED);
        if let Some(w) = self.wide.get(i / self.ways) {
            w.hinted.set(w.hinted.get() + 1);
        }
    }

    /// Empties slot `i` (its line dropped without writing back).
    pub(crate) fn clear(&self, i: usize) {
        let old = self.tags[i].get();
        if old != 0 {
            self.entry(old - 1, |e| e.set(NONE));
            if let Some(w) = self.wide.get(i / self.ways) {
                w.empty.set(w.empty.get() + 1);
            }
        }
        self.tags[i].set(0);
        self.buf.set_flags(i, 0);
    }
}

/// Sums for a least-squares line through (lines fetched, nanoseconds) of round trips.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FetchModel {
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl FetchModel {
    pub(crate) fn add(&mut self, x: f64, y: f64) {
        self.n += 1.0;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.xy += x * y;
    }

    /// (fixed nanoseconds per round trip, nanoseconds per line), once round trips of at
    /// least two sizes were seen and the fit is sensible (a positive cost per line).
    pub(crate) fn fit(&self) -> Option<(f64, f64)> {
        let d = self.n * self.xx - self.x * self.x;
        if self.n < 2.0 || d.abs() < 1e-9 * self.n * self.xx.max(1.0) {
            return None;
        }
        let per_line = (self.n * self.xy - self.x * self.y) / d;
        if per_line <= 0.0 {
            return None;
        }
        let fixed = ((self.y - per_line * self.x) / self.n).max(0.0);
        Some((fixed, per_line))
    }
}
