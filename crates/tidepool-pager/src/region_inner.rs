//! A region as the pager's threads share it: where it is, its page table, its prefetch
//! detector, its shadow of frames and what the program said about its parts.

use crate::marks::Marks;
use crate::prefetch::Detector;
use crate::sys::{Mapping, PAGE};
use crate::table::PageTable;
use crate::tags;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use tidepool_store::Key;

pub(crate) struct RegionInner {
    pub(crate) id: u32,
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) table: PageTable,
    pub(crate) detector: Mutex<Detector>,
    /// Highest page index ever mapped + 1 (bounds the walk when the region is dropped).
    pub(crate) touched_end: AtomicUsize,
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
}
