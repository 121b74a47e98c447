//! Choosing eviction's victims: policies behind one trait ([`VictimPolicy`]), one file each,
//! asked in turn until a batch is full: the pages streams walked past first ([`Done`], SEQ),
//! then the clock hand's ([`Clock`], GCLOCK). A policy locks the pages it chooses; eviction
//! (`evict.rs`) saves and releases them.

mod clock;
mod done;

pub(crate) use clock::{clock_entry, stale, Clock, EVICT_REACH};
pub(crate) use done::Done;

use crate::budget::EVICT_BATCH;
use crate::region::RegionInner;
use crate::sections::Sections;
use crate::table::{kind, FAR, UNTOUCHED, WRITEBACK};
use std::sync::Arc;

/// A page chosen for eviction, locked: its region, its index, its word before the lock.
pub(crate) type Victim = (Arc<RegionInner>, usize, u64);
pub(crate) type Victims = Vec<Victim>;

/// What a policy may ask of the pager besides the pages themselves.
pub(crate) struct Ask<'a> {
    /// The sections' keeps, pins and shares.
    pub(crate) sections: &'a Sections,
    /// The budget now, in pages.
    pub(crate) budget_pages: usize,
    /// Whether eviction writes out in spans (else it moves pages into frames one by one).
    pub(crate) spans: bool,
}

/// A source of eviction victims.
pub(crate) trait VictimPolicy {
    /// Locks victims and adds them to `victims` until it holds [`EVICT_BATCH`] or the policy
    /// has nothing more to give this time.
    fn take(&self, ask: &Ask, victims: &mut Victims);
}

/// Where eviction takes its victims from, in turn.
#[derive(Debug, Default)]
pub(crate) struct Eviction {
    /// Pages streams walked past.
    pub(crate) done: Done,
    /// Every resident page, in the order it joined.
    pub(crate) clock: Clock,
}

impl Eviction {
    /// A batch of locked victims, at most [`EVICT_BATCH`] (and their neighbours).
    pub(crate) fn choose(&self, ask: &Ask) -> Victims {
        let mut victims = Vec::with_capacity(EVICT_BATCH);
        let policies: [&dyn VictimPolicy; 2] = [&self.done, &self.clock];
        // Each is asked even when the batch is full: the clock's pass decides whether pins
        // and shares give way, batch by batch.
        for policy in policies {
            policy.take(ask, &mut victims);
        }
        victims
    }

    /// Forgets every page (a forked child starts with none of its own).
    pub(crate) fn clear(&self) {
        self.done.clear();
        self.clock.entries().clear();
    }
}

/// A page nothing maps in the program's view but through its lock (not mapped, and not the
/// program's own mapping): a write-protection over it changes nothing, and one that lands on it
/// after an install costs at most one write-protect fault (`serve_write_protect`).
pub(crate) fn is_hole(word: u64) -> bool {
    matches!(kind(word), FAR | UNTOUCHED | WRITEBACK)
}
