//! A region as the pager's threads share it: where it is, its page table, its prefetch
//! detector, its shadow of frames and what the program said about its parts.

use crate::marks::Marks;
use crate::prefetch::Detector;
use crate::prefetcher::SectionPrefetcher;
use crate::sections::SectionMap;
use crate::sys::{Mapping, PAGE};
use crate::table::PageTable;
use crate::tags;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use tidepool_store::Key;

/// Pages one bit of [`RegionInner::evicted_chunks`] stands for (16 MiB).
pub(crate) const CHUNK_PAGES: usize = 1 << 12;

pub(crate) struct RegionInner {
    pub(crate) id: u32,
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) table: PageTable,
    pub(crate) detector: Mutex<Detector>,
    /// Which section each page is in (see `sections.rs`).
    pub(crate) sections: SectionMap,
    /// The prefetchers of sections with a policy of their own (all but
    /// [`crate::Prefetch::Shared`]), made at their first fault here.
    pub(crate) section_prefetchers: Box<[SectionPrefetcher]>,
    /// Highest page index ever mapped + 1 (bounds the walk when the region is dropped).
    pub(crate) touched_end: AtomicUsize,
    /// A bit per [`CHUNK_PAGES`] pages, set once a page of the chunk was evicted (never
    /// cleared): refill reads the page states of these chunks only. The preload library's
    /// large-object region spans a terabyte, and a sweep of every state word of it brought
    /// back 826 pages of CPython's in 3 s.
    pub(crate) evicted_chunks: Box<[AtomicU64]>,
    pub(crate) dead: AtomicBool,
    /// Where the region's far pages live as frames ([`crate::Config::in_process_frames`]): page `i`
    /// of the region at page `i` of the shadow. Registered too (UFFDIO_MOVE wants both ends
    /// registered), and never touched where it holds no frame.
    pub(crate) shadow: Option<Mapping>,
    /// Protections and fork advice the program gave parts of the region (see `marks.rs`).
    pub(crate) marks: Mutex<Marks>,
    /// Some page of the region is inaccessible (PROT_NONE): eviction asks `marks` first.
    pub(crate) inaccessible: AtomicBool,
    /// The reservation, if the pager made it.
    pub(crate) _mapping: Option<Mapping>,
}

impl std::fmt::Debug for RegionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .finish()
    }
}

impl RegionInner {
    /// Whether page `page` may be read to be saved (a page the program made inaccessible may
    /// not).
    #[inline]
    pub(crate) fn readable(&self, page: usize) -> bool {
        !self.inaccessible.load(Acquire) || !self.marks.lock().inaccessible(page)
    }

    /// The key of the page's far copy (see `tags.rs`).
    #[inline]
    pub(crate) fn key(&self, page: usize) -> Key {
        tags::key(self.table.tag(page).load(Relaxed), self.id, page)
    }
    #[inline]
    pub(crate) fn addr(&self, page: usize) -> usize {
        self.base + page * PAGE
    }
    #[inline]
    pub(crate) fn shadow_addr(&self, page: usize) -> usize {
        self.shadow.as_ref().expect("a framed region").addr() + page * PAGE
    }
    pub(crate) fn note_touched(&self, page: usize) {
        self.touched_end.fetch_max(page + 1, Relaxed);
    }

    /// The bitmap [`RegionInner::evicted_chunks`] for a region of `pages` pages.
    pub(crate) fn chunk_bits(pages: usize) -> Box<[AtomicU64]> {
        (0..pages.div_ceil(CHUNK_PAGES).div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    /// Notes that `page` is being evicted (before it leaves).
    pub(crate) fn note_evicted(&self, page: usize) {
        let c = page / CHUNK_PAGES;
        if let Some(w) = self.evicted_chunks.get(c / 64) {
            let bit = 1u64 << (c % 64);
            if w.load(Relaxed) & bit == 0 {
                w.fetch_or(bit, Release);
            }
        }
    }

    /// The first page at or after `from`, below `end`, of a chunk that had evictions; `end`
    /// if none.
    pub(crate) fn next_evicted_chunk(&self, from: usize, end: usize) -> usize {
        let mut c = from / CHUNK_PAGES;
        while c * CHUNK_PAGES < end {
            let bits = self
                .evicted_chunks
                .get(c / 64)
                .map_or(0, |w| w.load(Acquire))
                >> (c % 64);
            if bits == 0 {
                c = (c / 64 + 1) * 64;
                continue;
            }
            c += bits.trailing_zeros() as usize;
            return (c * CHUNK_PAGES).max(from).min(end);
        }
        end
    }
}
