//! Cache sections: local areas that cache lines of far structures (Mira §4.2, §5.3).
//!
//! A section is a fixed set of line slots, allocated once. Each slot has a tag (the far key of
//! the line it holds, plus one; 0 is empty), a few flag bits and its data behind a `RefCell`:
//! a line guard is a borrow of that cell, so a borrowed line is never chosen for eviction and
//! a line is never written while read. Sections are per thread (`Rc`, not `Sync`), as Mira
//! gives each thread private sections for data it does not share for writing.
//!
//! Structures:
//! - **direct-mapped**: a line can go to one slot (line number plus a hash of its structure,
//!   modulo the slots), so a sequential scan fills slots in order and never conflicts with
//!   itself; a lookup is one compare.
//! - **k-way set-associative**: to any of the k slots of one set; CLOCK within the set.
//! - **fully associative**: to any slot, found through a hash map; CLOCK over all slots.
//!
//! Victims, in order: an empty slot, a slot marked evictable (a hint: the program is done with
//! it), then CLOCK (a slot whose reference bit is clear; passing a slot clears its bit).
//! Pinned and borrowed slots are never victims.

use crate::{FarError, LINE_BITS};
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub(crate) const DIRTY: u8 = 1;
pub(crate) const REFERENCED: u8 = 2;
pub(crate) const EVICTABLE: u8 = 4;
pub(crate) const PINNED: u8 = 8;
/// Taken by the batch being filled: not a victim for the rest of the batch.
pub(crate) const FILLING: u8 = 16;

/// How lines map to slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// One slot per line: cheapest lookup; for sequential and strided access.
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

/// A section's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionConfig {
    pub structure: Structure,
    /// Bytes per line: a multiple of 8.
    pub line_bytes: usize,
    /// Bytes of lines in all (rounded down to whole lines, and to whole sets).
    pub capacity: usize,
}

impl SectionConfig {
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
    /// Line lookups that found the line resident.
    pub hits: u64,
    /// Lines fetched (or installed without fetching) on a miss or a prefetch.
    pub misses: u64,
    /// Lines brought in ahead of use.
    pub prefetched: u64,
    /// Dirty lines written back.
    pub writebacks: u64,
    /// Round trips to the store for misses.
    pub fetches: u64,
    /// Nanoseconds spent in those round trips.
    pub fetch_nanos: u64,
}

pub(crate) struct Slot {
    /// Far key + 1; 0: empty.
    pub(crate) tag: Cell<u64>,
    pub(crate) flags: Cell<u8>,
    pub(crate) data: RefCell<Box<[u64]>>,
}

/// A local cache area for far lines. See the module docs.
pub struct Section {
    config: SectionConfig,
    slots: Box<[Slot]>,
    sets: usize,
    ways: usize,
    /// Fully associative only: key → slot.
    map: RefCell<FxHashMap<u64, u32>>,
    /// CLOCK hands: one per set (one set in all when fully associative).
    hands: Box<[Cell<u32>]>,
    pub(crate) stats: Cell<SectionStats>,
}

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Section")
            .field("config", &self.config)
            .field("slots", &self.slots.len())
            .field("stats", &self.stats.get())
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
        if sets * ways > u32::MAX as usize {
            return Err(FarError::Config(
                "more than 2^32 lines in one section".into(),
            ));
        }
        let slots = (0..sets * ways)
            .map(|_| Slot {
                tag: Cell::new(0),
                flags: Cell::new(0),
                data: RefCell::new(vec![0u64; lb / 8].into_boxed_slice()),
            })
            .collect();
        Ok(Rc::new(Section {
            config,
            slots,
            sets,
            ways,
            map: RefCell::new(FxHashMap::default()),
            hands: (0..sets).map(|_| Cell::new(0)).collect(),
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
        self.slots.len()
    }

    pub fn stats(&self) -> SectionStats {
        self.stats.get()
    }

    pub(crate) fn bump(&self, f: impl FnOnce(&mut SectionStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    pub(crate) fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    /// The set a key maps to: its line number plus a hash of its structure, so a structure's
    /// consecutive lines take consecutive sets.
    fn set_of(&self, key: u64) -> usize {
        let structure = (key >> LINE_BITS).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let line = key & ((1 << LINE_BITS) - 1);
        (structure.wrapping_add(line) % self.sets as u64) as usize
    }

    /// The slot holding `key`, if resident.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        let tag = key + 1;
        match self.config.structure {
            Structure::Full => self.map.borrow().get(&key).map(|&s| s as usize),
            _ => {
                let first = self.set_of(key) * self.ways;
                (first..first + self.ways).find(|&i| self.slots[i].tag.get() == tag)
            }
        }
    }

    /// The slot holding `key`, if resident; marks it referenced.
    #[inline]
    pub(crate) fn lookup(&self, key: u64) -> Option<usize> {
        let found = self.find(key);
        if let Some(i) = found {
            // Used again: referenced, and no longer done with.
            let s = &self.slots[i];
            s.flags.set((s.flags.get() | REFERENCED) & !EVICTABLE);
        }
        found
    }

    /// A slot for `key` (not resident): empty, evictable, or CLOCK's choice; never pinned,
    /// borrowed or filling. `None` if every candidate is.
    pub(crate) fn victim(&self, key: u64) -> Option<usize> {
        let set = match self.config.structure {
            Structure::Full => 0,
            _ => self.set_of(key),
        };
        let first = set * self.ways;
        let free = |i: usize| {
            let s = &self.slots[i];
            s.flags.get() & (PINNED | FILLING) == 0 && s.data.try_borrow_mut().is_ok()
        };
        let candidates = first..first + self.ways;
        if let Some(i) = candidates
            .clone()
            .find(|&i| self.slots[i].tag.get() == 0 && free(i))
        {
            return Some(i);
        }
        if let Some(i) = candidates
            .clone()
            .find(|&i| self.slots[i].flags.get() & EVICTABLE != 0 && free(i))
        {
            return Some(i);
        }
        // CLOCK: at most two sweeps (the first may only clear reference bits).
        let hand = &self.hands[set];
        for _ in 0..2 * self.ways {
            let i = first + hand.get() as usize;
            hand.set(((hand.get() as usize + 1) % self.ways) as u32);
            if !free(i) {
                continue;
            }
            let s = &self.slots[i];
            if s.flags.get() & REFERENCED != 0 {
                s.flags.set(s.flags.get() & !REFERENCED);
            } else {
                return Some(i);
            }
        }
        None
    }

    /// Makes slot `i` hold `key` (its old line already written back or clean).
    pub(crate) fn install(&self, i: usize, key: u64, flags: u8) {
        let s = &self.slots[i];
        let old = s.tag.get();
        if self.config.structure == Structure::Full {
            let mut map = self.map.borrow_mut();
            if old != 0 {
                map.remove(&(old - 1));
            }
            map.insert(key, i as u32);
        }
        s.tag.set(key + 1);
        s.flags.set(flags);
    }

    /// Empties slot `i` (its line dropped without writing back).
    pub(crate) fn clear(&self, i: usize) {
        let s = &self.slots[i];
        let old = s.tag.get();
        if old != 0 && self.config.structure == Structure::Full {
            self.map.borrow_mut().remove(&(old - 1));
        }
        s.tag.set(0);
        s.flags.set(0);
    }

    /// Slots holding lines whose keys lie in `[lo, hi)`.
    pub(crate) fn resident_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.slots.len()).filter(move |&i| {
            let t = self.slots[i].tag.get();
            t != 0 && (lo..hi).contains(&(t - 1))
        })
    }
}
