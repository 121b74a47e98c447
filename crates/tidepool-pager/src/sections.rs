//! Sections: named parts of the paged memory, each with counters of its own, so that
//! `tidepool run --stats` and `tidepool status` say which part of a program the faults, far
//! reads, prefetches and evictions went to (Mira's cache sections, for an unmodified program).
//!
//! Whoever registers a region names its parts: the preload library names each size class of
//! its heap (a rule by address: class spans are equal and aligned, so a page's class is its
//! offset shifted) and each range of its large-object region by what asked for it (a large
//! `malloc`, or an `mmap` and the code that called it). Pages nobody named are in section 0,
//! `rest`. Looking a page's section up is one load: the span rule's table, or a byte per page
//! in a table populated only where ranges were named.

use crate::sys::Mapping;
use parking_lot::Mutex;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use tidepool_proto::coord::{ghost_bucket_limit, GHOST_BUCKETS};

/// Sections a pager tells apart; names past the last share section 0.
pub const SECTIONS_MAX: usize = 128;

/// A section of a pager ([`crate::Pager::section`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SectionId(u8);

impl SectionId {
    /// Pages no one named.
    pub const REST: SectionId = SectionId(0);

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which stride detector plans a section's prefetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Prefetch {
    /// The region's one detector, shared with every other section of the region: the pager's
    /// behaviour without a profile.
    #[default]
    Shared,
    /// A detector of the section's own, in each region: a stream in this section is followed
    /// whatever the program does elsewhere meanwhile (Mira's interleaved graph walk).
    Own,
    /// A sweep detector of the section's own in each region: walks that drift forward
    /// without a stride (see `sweep_detector.rs`).
    Sweep,
    /// No prefetching after faults here.
    Off,
    /// A table of each page's successor among the section's faults, in each region: walks
    /// that repeat an order no stride describes (see `successor.rs`).
    Successor,
}

impl Prefetch {
    fn code(self) -> u8 {
        match self {
            Prefetch::Shared => 0,
            Prefetch::Own => 1,
            Prefetch::Off => 2,
            Prefetch::Sweep => 3,
            Prefetch::Successor => 4,
        }
    }

    fn from_code(c: u8) -> Prefetch {
        match c {
            1 => Prefetch::Own,
            2 => Prefetch::Off,
            3 => Prefetch::Sweep,
            4 => Prefetch::Successor,
            _ => Prefetch::Shared,
        }
    }
}

/// How long a section's pages stay local against the clock hand's second chances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Keep {
    /// A page survives as many passes of the hand as its heat earned (the pager's behaviour
    /// without a profile).
    #[default]
    Normal,
    /// A page fetched on a miss starts with every chance the hottest page has: it outlives
    /// an unreferenced page of a normal section about four times.
    High,
    /// The hand passes over the section's pages while it finds other victims; they go only
    /// when nothing else can (so a pinned set larger than the budget cannot stall the program).
    Pin,
}

impl Keep {
    fn code(self) -> u8 {
        match self {
            Keep::Normal => 0,
            Keep::High => 1,
            Keep::Pin => 2,
        }
    }

    fn from_code(c: u8) -> Keep {
        match c {
            1 => Keep::High,
            2 => Keep::Pin,
            _ => Keep::Normal,
        }
    }
}

/// How the pager serves one section ([`crate::Pager::set_section_policy`]). The default is
/// what every page gets without a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Policy {
    pub prefetch: Prefetch,
    /// Pages read together on a miss: the aligned block of `line` pages around the faulting
    /// one, those of them in far memory (a power of two, 1 to [`LINE_MAX`]).
    pub line: u8,
    /// Its pages' priority against eviction.
    pub keep: Keep,
    /// The most of the budget its pages may hold, in percent (0: no limit). Over it, its
    /// pages lose their second chances and the clock passes over other sections' pages to
    /// take them (Mira's section sizes: a stream needs little room, and what it does not hold
    /// the other sections do).
    pub share: u8,
}

/// The longest line, in pages.
pub const LINE_MAX: u8 = 16;

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            prefetch: Prefetch::Shared,
            line: 1,
            keep: Keep::Normal,
            share: 0,
        }
    }
}

impl fmt::Display for Policy {
    /// `shared`, `own`, `sweep`, `successor` or `off`, `/N` for a line of N pages, ` keep` or
    /// ` pin`, and ` N%` for a share of the budget.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.prefetch {
            Prefetch::Own => "own",
            Prefetch::Sweep => "sweep",
            Prefetch::Successor => "successor",
            Prefetch::Off => "off",
            _ => "shared",
        };
        match self.line {
            1 => write!(f, "{p}")?,
            n => write!(f, "{p}/{n}")?,
        }
        match self.keep {
            Keep::High => write!(f, " keep")?,
            Keep::Pin => write!(f, " pin")?,
            _ => {}
        }
        match self.share {
            0 => Ok(()),
            n => write!(f, " {n}%"),
        }
    }
}

impl Policy {
    /// A policy with these settings; `line` is rounded down to a power of two within
    /// 1..=[`LINE_MAX`].
    pub fn new(prefetch: Prefetch, line: u8) -> Policy {
        let line = line.clamp(1, LINE_MAX);
        Policy {
            prefetch,
            line: 1 << (7 - line.leading_zeros()),
            keep: Keep::Normal,
            share: 0,
        }
    }

    /// This policy with its pages kept as `keep` says.
    pub fn keeping(self, keep: Keep) -> Policy {
        Policy { keep, ..self }
    }

    /// This policy with its pages holding at most `percent` of the budget (0: no limit;
    /// above 100, 100).
    pub fn sharing(self, percent: u8) -> Policy {
        Policy {
            share: percent.min(100),
            ..self
        }
    }
}

/// What happened in one section so far.
#[derive(Debug, Default)]
pub(crate) struct SectionCounts {
    pub(crate) faults: AtomicU64,
    pub(crate) far_fetches: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) prefetch_planned: AtomicU64,
    pub(crate) prefetch_credited: AtomicU64,
    pub(crate) line_pages: AtomicU64,
    /// Its pages mapped now, counted as they come and go ([`Policy::share`] reads it; a page
    /// counted out by another path than it was counted in may leave it a little off).
    pub(crate) resident: AtomicI64,
    /// Far reads of pages evicted before, by how many bytes were evicted after them (ghost
    /// buckets: under 1 MiB, 2 MiB, 4 MiB, ...).
    pub(crate) refetched: [AtomicU64; GHOST_BUCKETS],
}

/// A pager's sections: their names and counters.
pub(crate) struct Sections {
    names: Mutex<Vec<String>>,
    counts: [SectionCounts; SECTIONS_MAX],
    /// Each section's policy, read on every fault: [`Prefetch`] codes and line lengths.
    prefetch: [AtomicU8; SECTIONS_MAX],
    line: [AtomicU8; SECTIONS_MAX],
    keep: [AtomicU8; SECTIONS_MAX],
    share: [AtomicU8; SECTIONS_MAX],
    /// Some section has a policy other than the default.
    any_policy: AtomicBool,
    /// Some section's pages are kept otherwise than by heat (the clock then looks them up).
    any_keep: AtomicBool,
    /// Eviction batches left during which pins give way: a batch passed a whole turn of the
    /// clock's pinned pages (more is pinned than the budget holds).
    pins_off: AtomicU32,
    /// Some section has a share of the budget.
    any_share: AtomicBool,
    /// Likewise for shares: batches left during which sections over their share are not
    /// looked for beyond the clock's usual reach.
    shares_off: AtomicU32,
}

/// Batches during which pins give way once a batch passed a whole turn of pinned pages: the
/// evictor then goes on at its usual pace, and such a turn costs one batch in so many.
const PINS_OFF_BATCHES: u32 = 64;

impl fmt::Debug for Sections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sections")
            .field("names", &self.names.lock().len())
            .finish()
    }
}

impl Sections {
    pub(crate) fn new() -> Sections {
        Sections {
            names: Mutex::new(vec!["rest".to_string()]),
            counts: std::array::from_fn(|_| SectionCounts::default()),
            prefetch: std::array::from_fn(|_| AtomicU8::new(0)),
            line: std::array::from_fn(|_| AtomicU8::new(1)),
            keep: std::array::from_fn(|_| AtomicU8::new(0)),
            share: std::array::from_fn(|_| AtomicU8::new(0)),
            any_policy: AtomicBool::new(false),
            any_keep: AtomicBool::new(false),
            pins_off: AtomicU32::new(0),
            any_share: AtomicBool::new(false),
            shares_off: AtomicU32::new(0),
        }
    }

    pub(crate) fn set_policy(&self, id: SectionId, p: Policy) {
        self.prefetch[id.index()].store(p.prefetch.code(), Relaxed);
        self.line[id.index()].store(p.line, Relaxed);
        self.keep[id.index()].store(p.keep.code(), Relaxed);
        self.share[id.index()].store(p.share, Relaxed);
        if p.share != 0 {
            self.any_share.store(true, Relaxed);
        }
        if p != Policy::default() {
            self.any_policy.store(true, Relaxed);
        }
        if p.keep != Keep::Normal {
            self.any_keep.store(true, Relaxed);
        }
    }

    /// Whether this eviction batch passes over pinned pages: some section is pinned, and pins
    /// are not giving way (each call counts a batch of that down).
    pub(crate) fn pins_hold(&self) -> bool {
        if !self.any_keep.load(Relaxed) {
            return false;
        }
        self.pins_off
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_err()
    }

    /// A batch passed a whole turn of pinned pages: pins give way for the next batches.
    pub(crate) fn pins_give_way(&self) {
        self.pins_off.store(PINS_OFF_BATCHES, Relaxed);
    }

    /// The sections holding more than their share of `budget` pages, a bit each (bit `i` for
    /// section `i`); none while shares give way.
    pub(crate) fn over_shares(&self, budget: usize) -> u128 {
        if !self.any_share.load(Relaxed)
            || self
                .shares_off
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            return 0;
        }
        let mut over = 0;
        for (i, share) in self.share.iter().enumerate() {
            let share = share.load(Relaxed) as i64;
            if share != 0 && self.counts[i].resident.load(Relaxed) * 100 > share * budget as i64 {
                over |= 1 << i;
            }
        }
        over
    }

    /// A batch passed a whole turn of the clock without finding a page of a section over its
    /// share (they were all on their way somewhere else): shares give way for the next batches.
    pub(crate) fn shares_give_way(&self) {
        self.shares_off.store(PINS_OFF_BATCHES, Relaxed);
    }

    /// How page `page` of the region `map` maps is kept: one load, and no lookup of its
    /// section, when no section says otherwise (the fault and eviction paths ask per page).
    #[inline]
    pub(crate) fn keep_of(&self, map: &SectionMap, page: usize) -> Keep {
        if !self.any_keep.load(Relaxed) {
            return Keep::Normal;
        }
        Keep::from_code(self.keep[map.of(page).index()].load(Relaxed))
    }

    #[inline]
    pub(crate) fn policy(&self, id: SectionId) -> Policy {
        if !self.any_policy.load(Relaxed) {
            return Policy::default();
        }
        Policy {
            prefetch: Prefetch::from_code(self.prefetch[id.index()].load(Relaxed)),
            line: self.line[id.index()].load(Relaxed),
            keep: Keep::from_code(self.keep[id.index()].load(Relaxed)),
            share: self.share[id.index()].load(Relaxed),
        }
    }

    /// The section named `name`, made if new; [`SectionId::REST`] once all are taken.
    pub(crate) fn intern(&self, name: &str) -> SectionId {
        let mut names = self.names.lock();
        if let Some(i) = names.iter().position(|n| n == name) {
            return SectionId(i as u8);
        }
        if names.len() == SECTIONS_MAX {
            return SectionId::REST;
        }
        names.push(name.to_string());
        SectionId((names.len() - 1) as u8)
    }

    #[inline]
    pub(crate) fn counts(&self, id: SectionId) -> &SectionCounts {
        &self.counts[id.index()]
    }

    /// Every section's name, by index.
    pub(crate) fn names(&self) -> Vec<String> {
        self.names.lock().clone()
    }

    /// Every section that saw a fault or an eviction, busiest first.
    pub(crate) fn snapshot(&self) -> Vec<SectionStats> {
        let names = self.names.lock().clone();
        let mut all: Vec<SectionStats> = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let c = &self.counts[i];
                SectionStats {
                    index: i,
                    name,
                    policy: self.policy(SectionId(i as u8)),
                    faults: c.faults.load(Relaxed),
                    far_fetches: c.far_fetches.load(Relaxed),
                    evicted: c.evicted.load(Relaxed),
                    prefetch_planned: c.prefetch_planned.load(Relaxed),
                    prefetch_credited: c.prefetch_credited.load(Relaxed),
                    line_pages: c.line_pages.load(Relaxed),
                    refetched: std::array::from_fn(|k| c.refetched[k].load(Relaxed)),
                    resident_pages: None,
                }
            })
            .filter(|s| s.faults + s.evicted > 0)
            .collect();
        all.sort_by(|a, b| b.faults.cmp(&a.faults).then(a.name.cmp(&b.name)));
        all
    }
}

/// One section's counters, as [`crate::PagerStats::sections`] reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SectionStats {
    /// Its place in the pager's table of sections.
    pub(crate) index: usize,
    pub name: String,
    /// How it was served (the default unless a profile said otherwise).
    pub policy: Policy,
    /// Missing faults on its pages.
    pub faults: u64,
    /// Of those, the ones served by a far read (or a move from a frame).
    pub far_fetches: u64,
    /// Its pages evicted.
    pub evicted: u64,
    /// Pages the prefetcher planned after faults here, and how many of them the program used.
    pub prefetch_planned: u64,
    pub prefetch_credited: u64,
    /// Pages read along with a miss for the section's line ([`Policy::line`]).
    pub line_pages: u64,
    /// Its reuse distances: far reads of pages evicted before, by how many bytes of pages
    /// were evicted after them (bucket `k`: under `2^k` MiB). Those within a few MiB would
    /// have stayed local with that much more room: what keeping the section longer can win.
    pub refetched: [u64; GHOST_BUCKETS],
    /// Its pages mapped now, if counted ([`crate::Pager::report`] counts them; `stats`,
    /// which a coordinator samples, does not).
    pub resident_pages: Option<u64>,
}

impl SectionStats {
    /// Used planned pages over planned pages, if any were planned.
    pub fn prefetch_accuracy(&self) -> Option<f64> {
        (self.prefetch_planned > 0)
            .then(|| self.prefetch_credited as f64 / self.prefetch_planned as f64)
    }

    /// Far reads of pages evicted fewer than `bytes` bytes of evictions before (rounded down
    /// to a ghost bucket's bound).
    pub fn refetched_within(&self, bytes: u64) -> u64 {
        refetched_within(&self.refetched, bytes)
    }
}

/// Of reuse distances by ghost bucket (`refetched`), those under `bytes` (whole buckets).
pub fn refetched_within(refetched: &[u64], bytes: u64) -> u64 {
    refetched
        .iter()
        .enumerate()
        .take_while(|&(k, _)| ghost_bucket_limit(k) <= bytes)
        .map(|(_, n)| n)
        .sum()
}

/// Spans a region may be cut into by rule.
const SPANS_MAX: usize = 64;

/// Which section each page of one region is in.
pub(crate) struct SectionMap {
    /// Non-zero: page `p` is in `spans[(p << PAGE_SHIFT) >> span_shift]` (the last for any
    /// page past them), and `bytes` is not read.
    span_shift: AtomicU32,
    spans: [AtomicU8; SPANS_MAX],
    /// A section per page, zero (rest) where nothing was named.
    bytes: Mapping,
}

impl fmt::Debug for SectionMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SectionMap")
            .field("span_shift", &self.span_shift.load(Relaxed))
            .finish()
    }
}

const PAGE_SHIFT: u32 = 12;

impl SectionMap {
    pub(crate) fn new(pages: usize) -> io::Result<SectionMap> {
        Ok(SectionMap {
            span_shift: AtomicU32::new(0),
            spans: std::array::from_fn(|_| AtomicU8::new(0)),
            bytes: Mapping::reserve(pages.max(1))?,
        })
    }

    /// The section of page `page`.
    #[inline]
    pub(crate) fn of(&self, page: usize) -> SectionId {
        let shift = self.span_shift.load(Relaxed);
        let id = if shift != 0 {
            let span = ((page << PAGE_SHIFT) >> shift).min(SPANS_MAX - 1);
            self.spans[span].load(Relaxed)
        } else {
            self.bytes.as_table::<AtomicU8>()[page].load(Relaxed)
        };
        SectionId(id)
    }

    /// Cuts the region into spans of `1 << shift` bytes, span `i` in `ids[i]` (pages past the
    /// last named span in the last). Replaces any per-page naming.
    pub(crate) fn set_spans(&self, shift: u32, ids: &[SectionId]) {
        if ids.is_empty() || shift < PAGE_SHIFT {
            return;
        }
        for i in 0..SPANS_MAX {
            let id = ids[i.min(ids.len() - 1)];
            self.spans[i].store(id.0, Relaxed);
        }
        self.span_shift.store(shift, Relaxed);
    }

    /// Puts pages `pages` in section `id`.
    pub(crate) fn set(&self, pages: std::ops::Range<usize>, id: SectionId) {
        let table = self.bytes.as_table::<AtomicU8>();
        let end = pages.end.min(table.len());
        for b in &table[pages.start.min(end)..end] {
            // Most ranges are named once and never again: skip the store (and the page of
            // the table it would populate) where it would write what is there.
            if b.load(Relaxed) != id.0 {
                b.store(id.0, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_interned_and_run_out_into_rest() {
        let s = Sections::new();
        let a = s.intern("class:48");
        assert_ne!(a, SectionId::REST);
        assert_eq!(s.intern("class:48"), a);
        assert_eq!(s.intern("rest"), SectionId::REST);
        for i in 0..2 * SECTIONS_MAX {
            s.intern(&format!("n{i}"));
        }
        assert_eq!(s.intern("one too many"), SectionId::REST);
        assert_eq!(s.intern("class:48"), a);
    }

    #[test]
    fn pages_are_found_by_span_rule_or_by_range() {
        let m = SectionMap::new(1 << 20).unwrap();
        let (a, b) = (SectionId(3), SectionId(7));
        assert_eq!(m.of(5), SectionId::REST);
        m.set(10..20, a);
        assert_eq!(m.of(9), SectionId::REST);
        assert_eq!((m.of(10), m.of(19)), (a, a));
        assert_eq!(m.of(20), SectionId::REST);
        // Spans of 64 KiB (16 pages): span 0 in a, every later one in b.
        m.set_spans(16, &[a, b]);
        assert_eq!((m.of(0), m.of(15), m.of(16), m.of(1 << 19)), (a, a, b, b));
    }

    #[test]
    fn a_snapshot_lists_busy_sections_busiest_first() {
        let s = Sections::new();
        let (a, b) = (s.intern("a"), s.intern("b"));
        s.intern("idle");
        s.counts(a).faults.fetch_add(1, Relaxed);
        s.counts(b).faults.fetch_add(5, Relaxed);
        s.counts(b).prefetch_planned.fetch_add(4, Relaxed);
        s.counts(b).prefetch_credited.fetch_add(3, Relaxed);
        let snap = s.snapshot();
        let names: Vec<&str> = snap.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(snap[0].prefetch_accuracy(), Some(0.75));
        assert_eq!(snap[1].prefetch_accuracy(), None);
    }
}
