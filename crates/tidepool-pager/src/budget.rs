//! The budget: how many pages the pager may map, how many it maps, and how much room a thread
//! waits for. One owner for the counts every path checks against.

use crate::sys::PAGE;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Pages evicted in one batch: the margin below the budget is at least one.
pub(crate) const EVICT_BATCH: usize = 64;

/// The pages the pager may map and the pages it maps.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Pages the pager may map, write-back slots included (a probation tier's share is not).
    pages: AtomicUsize,
    /// Pages mapped now. A modular count: it may dip below zero for a moment (a page counted
    /// out before another thread counted it in) and still adds up right.
    pub(crate) resident: AtomicUsize,
    /// The most pages a thread short of room waits for; the evictor makes that much room.
    pub(crate) room_wanted: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(pages: usize) -> Budget {
        Budget {
            pages: AtomicUsize::new(pages),
            resident: AtomicUsize::new(0),
            room_wanted: AtomicUsize::new(0),
        }
    }

    /// Pages the pager may map.
    #[inline]
    pub(crate) fn pages(&self) -> usize {
        self.pages.load(Relaxed)
    }

    pub(crate) fn set_pages(&self, pages: usize) {
        self.pages.store(pages, Relaxed);
    }

    /// Pages kept free below the budget so that faults rarely wait for eviction: a 32nd of the
    /// budget, at least a batch and at most 4096.
    #[inline]
    pub(crate) fn margin(&self) -> usize {
        (self.pages() / 32).clamp(EVICT_BATCH, 4096)
    }
}

/// The pages a budget of `bytes` allows (at least 64).
pub(crate) fn pages_for(bytes: usize) -> usize {
    (bytes / PAGE).max(64)
}
