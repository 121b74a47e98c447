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

use crate::config::Config;
use crate::region::RegionInner;
use crate::table::{kind, FAR, FRAMED, INHERITED};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;

/// Where evicted pages can wait as frames in the regions' shadow mappings, and what the
/// frames are: decided once, when the pager starts ([`Frames::new`]). The fault path and
/// eviction ask it ([`Frames::on`], [`Frames::in_probation`], [`Frames::probation`]) instead of
/// combining options.
#[derive(Debug)]
pub(crate) struct Frames {
    shape: Shape,
    /// Pages copied in from their frames ([`crate::table::STALE_FRAME`]): the frames left in
    /// the shadows, dropped together by the next eviction or the evictor's next round.
    pub(crate) stale: Mutex<Vec<(Arc<RegionInner>, usize)>>,
}

/// The three shapes of [`Frames`].
#[derive(Debug)]
enum Shape {
    /// No shadows: evicted pages go to the far store.
    Off,
    /// The frames are the far store ([`Config::in_process_frames`]): evicted pages move to
    /// them, and the store receives only the pages the kernel will not move.
    Store,
    /// The frames are a probation tier in front of a far store elsewhere
    /// ([`Config::probation`]).
    Probation(Tier),
}

impl Frames {
    /// The frames `config` asks for, over a store private to this process or not, where the
    /// kernel can (`can_move`) or cannot move pages: both kinds need UFFDIO_MOVE, and the
    /// frames as the store wins over a probation tier.
    pub(crate) fn new(config: &Config, private_store: bool, can_move: bool) -> Frames {
        let shape = if !can_move {
            Shape::Off
        } else if config.in_process_frames {
            Shape::Store
        } else if config.probation {
            Shape::Probation(Tier::new(config.probation_grows.unwrap_or(!private_store)))
        } else {
            Shape::Off
        };
        Frames {
            shape,
            stale: Mutex::new(Vec::new()),
        }
    }

    /// Whether regions have shadows to keep frames in.
    pub(crate) fn on(&self) -> bool {
        !matches!(self.shape, Shape::Off)
    }

    /// The probation tier, if the frames are one.
    pub(crate) fn probation(&self) -> Option<&Tier> {
        match &self.shape {
            Shape::Probation(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the page whose word is `w` waits in the probation tier: local, though its kind
    /// says far.
    pub(crate) fn in_probation(&self, w: u64) -> bool {
        matches!(self.shape, Shape::Probation(_)) && w & FRAMED != 0
    }

    /// Whether the page whose word is `w` is out in the far store (not waiting in the
    /// probation tier).
    pub(crate) fn is_far(&self, w: u64) -> bool {
        kind(w) == FAR && !self.in_probation(w)
    }

    /// Whether eviction writes pages out in spans (see `evict::spans_of`): always but where
    /// the frames are the store, whose moves are its writes.
    pub(crate) fn evicts_in_spans(&self) -> bool {
        !matches!(self.shape, Shape::Store)
    }

    /// A whole budget of `total` pages: returns the pages left for mapped pages and
    /// write-back, the probation tier taking its share.
    pub(crate) fn split_budget(&self, total: usize) -> usize {
        match &self.shape {
            Shape::Probation(t) => t.set_total(total),
            _ => total,
        }
    }

    /// The whole budget, of which `mapped` pages are for mapped pages and write-back.
    pub(crate) fn whole_budget(&self, mapped: usize) -> usize {
        match &self.shape {
            Shape::Probation(t) => t.total.load(Relaxed),
            _ => mapped,
        }
    }
}

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

    /// A page (`word` its word in the tier) left the tier because it was touched or dropped.
    pub(crate) fn left(&self, word: u64, touched: bool) {
        // A frame a forked child shares with its parent is not in the child's count.
        if word & INHERITED == 0 {
            self.held.fetch_sub(1, Relaxed);
        }
        if touched {
            self.window_touched.fetch_add(1, Relaxed);
        }
    }

    /// Pages over the tier's share if `n` more came in (0: they fit).
    pub(crate) fn over(&self, n: usize) -> usize {
        (self.held.load(Relaxed) + n).saturating_sub(self.cap.load(Relaxed))
    }

    /// `n` pages left the tier for the store.
    pub(crate) fn spilled(&self, n: usize) {
        self.held.fetch_sub(n, Relaxed);
        self.window_spilled.fetch_add(n as u64, Relaxed);
    }

    /// Every [`WINDOW`] pages out of the tier, grows or shrinks it by what they say: returns
    /// the pages then left for mapped pages and write-back, if the share changed.
    pub(crate) fn resize(&self) -> Option<usize> {
        let (touched, spilled) = (
            self.window_touched.load(Relaxed),
            self.window_spilled.load(Relaxed),
        );
        if touched + spilled < WINDOW {
            return None;
        }
        self.window_touched.fetch_sub(touched, Relaxed);
        self.window_spilled.fetch_sub(spilled, Relaxed);
        let ratio = touched as f64 / (touched + spilled) as f64;
        let total = self.total.load(Relaxed);
        let step = Self::step(total);
        let (min, max) = self.bounds(total);
        let cap = self.cap.load(Relaxed);
        let cap = if ratio > 0.3 {
            (cap + step).min(max)
        } else if ratio < 0.1 {
            cap.saturating_sub(step).max(min)
        } else {
            return None;
        };
        self.cap.store(cap, Relaxed);
        Some(total - cap)
    }

    /// In a forked child: the frames listed are the parent's as much as the child's. They are
    /// marked inherited (uncounted when they leave) and the tier starts empty.
    pub(crate) fn forget_at_fork(&self) {
        let mut fifo = self.fifo.lock();
        for (r, p, _) in fifo.iter() {
            let w = r.table.state(*p).load(Relaxed);
            if kind(w) == FAR && w & FRAMED != 0 {
                r.table.state(*p).fetch_or(INHERITED, Relaxed);
            }
        }
        fifo.clear();
        self.held.store(0, Relaxed);
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
