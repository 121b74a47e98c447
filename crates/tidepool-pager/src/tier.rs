//! The probation tier: with a far store elsewhere (a memory node, Redis, memcached), part of
//! the local budget holds evicted pages as frames in the regions' shadows before they go to the
//! store ([`crate::Config::probation`]).
//!
//! The pager cannot see a program's accesses to mapped pages, only its faults, so CLOCK evicts
//! pages that are in use as readily as pages that are not (an access bit it cannot read). An
//! evicted page first moves to its frame with UFFDIO_MOVE (a page-table change, no copy); if
//! the program touches it there, it moves back for the price of a fault, not a round trip,
//! and the touch is the reference CLOCK missed. Pages nobody touches leave the tier oldest
//! first: clean ones (the store holds their bytes) are dropped, the others written to the store.
//!
//! The tier's share of the budget follows what it catches: every 1024 pages that leave it
//! (touched or spilled), it grows by a hundredth of the budget while more than 30% were
//! touched, and shrinks by as much while fewer than 10% were, between a hundredth and a fifth.
//! Measured on this project's 2-vCPU VM with a node backend at 50% local, three runs each
//! interleaved (medians): CPython building a dict of 1.5M strings 3.30 s against 3.77 s
//! without the tier (-12%), a Zipfian workload +5%, uniform random writes -1.5% (random pages
//! gain nothing; the tier shrinks to its least). A fixed twentieth did as well on Python; a
//! fixed fifth was slower (hot pages bounce through a large tier).
//!
//! In front of the store in this process (`local:` with a codec) the tier keeps its least
//! share and never grows: a far read there costs a decompression (2 us a page), little more
//! than the fault and copy of a tier hit, while every page of the tier is one fewer mapped
//! page, whose touches cost nothing. Growing on touches feeds itself (a larger tier leaves
//! fewer pages mapped, so more of them are evicted in use and touched in the tier): Go's
//! map of 3M strings at 50% local held the tier at its fifth and took 16.6-27.0 s (seven runs,
//! median 19.3), against 14.6-19.4 s (eight runs, median 15.9) with the least share;
//! CPython's dict, the JVM's HashMap and V8's Map shrank it to the least share by themselves.

use crate::region::RegionInner;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;

/// Tier events (touches and spills) between two sizing decisions.
pub(crate) const WINDOW: u64 = 1024;

/// The tier's state (all zero and unused when the tier is off).
#[derive(Debug, Default)]
pub(crate) struct Tier {
    /// Pages the whole budget allows: the tier's share plus `Budget::pages`.
    pub(crate) total: AtomicUsize,
    /// The tier's share now, in pages.
    pub(crate) cap: AtomicUsize,
    /// Frames in the tier now.
    pub(crate) held: AtomicUsize,
    /// Frames, oldest first, with the eviction sequence number they went out with: an entry
    /// whose page has left the tier (or left and come back) since is stale and skipped.
    pub(crate) fifo: Mutex<VecDeque<(Arc<RegionInner>, usize, u32)>>,
    /// Pages that left the tier touched and spilled, since the last sizing decision.
    pub(crate) window_touched: AtomicU64,
    pub(crate) window_spilled: AtomicU64,
    /// Whether the share may grow past its least (a store elsewhere; see the module
    /// documentation).
    pub(crate) grows: bool,
}

impl Tier {
    /// The tier's first share of a budget of `total` pages: a twentieth.
    fn first_cap(total: usize) -> usize {
        total / 20
    }

    pub(crate) fn step(total: usize) -> usize {
        (total / 100).max(16)
    }

    /// A tier that may grow (`grows`) or keeps its least share.
    pub(crate) fn new(grows: bool) -> Tier {
        Tier {
            grows,
            ..Default::default()
        }
    }

    /// The tier's smallest and largest share of a budget of `total` pages.
    pub(crate) fn bounds(&self, total: usize) -> (usize, usize) {
        let max = total / 5;
        let min = Self::step(total).min(max);
        (min, if self.grows { max } else { min })
    }

    /// A new budget of `total` pages: returns the pages left for mapped pages and write-back.
    pub(crate) fn set_total(&self, total: usize) -> usize {
        let old = self.total.swap(total, Relaxed);
        let (min, max) = self.bounds(total);
        let cap = if old == 0 {
            Self::first_cap(total)
        } else {
            self.cap.load(Relaxed)
        };
        let cap = cap.clamp(min, max);
        self.cap.store(cap, Relaxed);
        total - cap
    }
}
