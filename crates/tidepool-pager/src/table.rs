//! Per-page state: one atomic word per page of a region, plus the hash of its far copy and the
//! moment it was last evicted.
//!
//! A page is in exactly one of these states:
//!
//! ```text
//!             first touch                 eviction (clean)
//!  UNTOUCHED ─────────────► RESIDENT ─────────────────────────► FAR / UNTOUCHED (zero)
//!      ▲   (zero-filled)     ▲   │ eviction (dirty)                │
//!      │                     │   └────────► WRITEBACK ──write done─┘
//!      │ discard             │                 │
//!      └─────────────────────┴─── fault ◄──────┘ (served from the write-back buffer)
//! ```
//!
//! Every transition is made by the one thread that moved the word to `BUSY` with a
//! compare-and-swap; that thread writes the final word. A fault handler that finds a page
//! `BUSY` flags the word ([`WAITERS`]) and leaves the fault alone: the owner's install
//! (UFFDIO_COPY and UFFDIO_MOVE wake waiters) or, if [`PageTable::unlock`] reports the flag,
//! its explicit wake-up retries the access. Owners wake nobody otherwise, which saves a system
//! call per evicted page; a fault whose event is read only after the owner finished finds the
//! page settled, and its handler wakes the thread itself.

use crate::sys::Mapping;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

pub const KIND_MASK: u64 = 0b111;
/// Never written, or known to hold zeroes: a fault maps a zero page, nothing is fetched.
pub const UNTOUCHED: u64 = 0;
/// Mapped in the region.
pub const RESIDENT: u64 = 1;
/// Not mapped; the far store holds the page.
pub const FAR: u64 = 2;
/// A thread is moving the page between states.
pub const BUSY: u64 = 3;
/// Not mapped; the page sits in write-back slot `word >> SLOT_SHIFT` on its way to the store.
pub const WRITEBACK: u64 = 4;
/// Not the pager's: the program mapped something else here (a file, shared memory) over part of
/// a region. Never served, evicted or discarded until the program unmaps it.
pub const FOREIGN: u64 = 5;

/// RESIDENT: the far store holds a copy. If the page was installed writable without a write
/// (on the guess that it would be written), the hash table holds the copy's hash.
/// FAR and FRAMED, in a probation tier: the store holds a copy identical to the frame.
pub const FAR_VALID: u64 = 1 << 3;
/// RESIDENT: installed write-protected and not written since, so identical to its far copy
/// (or to zero if there is none). Eviction needs neither a hash nor a write.
pub const WP_CLEAN: u64 = 1 << 4;
/// RESIDENT: known to have been written since it was installed.
pub const DIRTY: u64 = 1 << 5;
/// RESIDENT: used again since the clock hand last passed (CLOCK's second chance).
pub const REFERENCED: u64 = 1 << 6;
/// RESIDENT: installed by the prefetcher.
pub const PREFETCHED: u64 = 1 << 7;
/// Written during its last residency: installed writable next time, saving a write-protect
/// fault for pages that are written whenever they are used.
pub const WAS_DIRTY: u64 = 1 << 8;
/// FAR: the page is a frame in the region's shadow mapping (the in-process store keeps pages
/// that way, moved in and out with UFFDIO_MOVE), not in the far store.
pub const FRAMED: u64 = 1 << 9;
/// FAR and FRAMED, in a probation tier ([`crate::Config::probation`]): the store also holds an
/// older version of the page under its tag, written over (or dropped) when the frame is spilled.
/// (FAR_VALID on such a page says the store's copy is the frame's bytes: a spill drops the
/// frame and writes nothing.)
pub const STORE_OLD: u64 = 1 << 15;
/// How often the page came back soon after its eviction (0-3, saturating): a page the
/// replacement keeps evicting and fetching again is hot, whatever CLOCK saw of it.
pub const HEAT_SHIFT: u32 = 10;
pub const HEAT: u64 = 0b11 << HEAT_SHIFT;
/// RESIDENT: passes of the clock hand the page survives unreferenced (set from its heat at
/// install; GCLOCK's count).
pub const CHANCE_SHIFT: u32 = 12;
pub const CHANCES: u64 = 0b11 << CHANCE_SHIFT;
/// Flags that survive eviction (history), the rest describe one residency.
pub const HISTORY: u64 = WAS_DIRTY | HEAT;
/// BUSY: a thread faulted on the page and waits for the owner to wake it.
pub const WAITERS: u64 = 1 << 14;
/// RESIDENT, in a forked child: mapped at the fork and not written since, so the frame is the
/// parent's too (copy-on-write). It is counted in the parent's budget, not on this process's
/// clock: evicting it here would free nothing. The first write makes it this process's own
/// (see `fault.rs`, `serve_write_protect`).
/// FAR and FRAMED, in a forked child: a frame of the parent's probation tier, shared likewise;
/// not in this process's tier count, and never spilled here.
pub const INHERITED: u64 = 1 << 16;
/// RESIDENT: copied in from its frame, which stays in the shadow, stale, until the pager drops
/// it with others (see `frames.rs`, [`crate::pager::Inner`]'s `stale` list), or before the
/// page moves out to it again.
pub const STALE_FRAME: u64 = 1 << 17;
pub const SLOT_SHIFT: u32 = 32;

#[inline]
pub fn kind(word: u64) -> u64 {
    word & KIND_MASK
}

/// The state of every page of one region.
#[derive(Debug)]
pub struct PageTable {
    states: Mapping,
    hashes: Mapping,
    evicted_at: Mapping,
    tags: Mapping,
    pages: usize,
}

impl PageTable {
    pub fn new(pages: usize) -> io::Result<PageTable> {
        Ok(PageTable {
            states: Mapping::reserve(pages * 8)?,
            hashes: Mapping::reserve(pages * 8)?,
            evicted_at: Mapping::reserve(pages * 4)?,
            tags: Mapping::reserve(pages * 4)?,
            pages,
        })
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    #[inline]
    pub fn state(&self, page: usize) -> &AtomicU64 {
        &self.states.as_table::<AtomicU64>()[page]
    }

    /// Whether page `page` (a detector's guess, perhaps outside the table) is in the table
    /// and of kind `k` now.
    #[inline]
    pub fn is(&self, page: i64, k: u64) -> bool {
        page >= 0
            && (page as usize) < self.pages
            && kind(self.state(page as usize).load(Relaxed)) == k
    }

    #[inline]
    pub fn hash(&self, page: usize) -> &AtomicU64 {
        &self.hashes.as_table::<AtomicU64>()[page]
    }

    #[inline]
    pub fn evicted_at(&self, page: usize) -> &AtomicU32 {
        &self.evicted_at.as_table::<AtomicU32>()[page]
    }

    /// The tag of the page's far copy (see `tags.rs`); zero for a store private to the process.
    #[inline]
    pub fn tag(&self, page: usize) -> &AtomicU32 {
        &self.tags.as_table::<AtomicU32>()[page]
    }

    /// Moves `page` to BUSY if its kind is one of `from`; returns the word it had.
    #[inline]
    pub fn try_lock(&self, page: usize, from: &[u64]) -> Option<u64> {
        let s = self.state(page);
        let mut cur = s.load(Acquire);
        loop {
            if !from.contains(&kind(cur)) {
                return None;
            }
            match s.compare_exchange_weak(cur, BUSY | (cur & HISTORY), AcqRel, Acquire) {
                Ok(_) => {
                    crate::tr!(page, "lock", cur);
                    return Some(cur);
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Moves `page` to BUSY whatever its state, waiting out another owner; returns the word.
    pub fn lock_any(&self, page: usize) -> u64 {
        let s = self.state(page);
        let mut spins = 0u32;
        loop {
            let cur = s.load(Acquire);
            if kind(cur) != BUSY
                && s.compare_exchange_weak(cur, BUSY | (cur & HISTORY), AcqRel, Acquire)
                    .is_ok()
            {
                crate::tr!(page, "lock", cur);
                return cur;
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Ends a transition: publishes the page's new word. True if a thread faulted on the page
    /// meanwhile and waits to be woken ([`WAITERS`]).
    #[inline]
    #[must_use = "a thread that faulted on the page meanwhile sleeps until someone wakes it"]
    pub fn unlock(&self, page: usize, word: u64) -> bool {
        debug_assert!(kind(word) != BUSY);
        crate::tr!(page, "unlock", word);
        self.state(page).swap(word, AcqRel) & WAITERS != 0
    }

    /// Asks the owner of a BUSY page to wake waiters when done; false if the page is not (or
    /// no longer) BUSY, and the caller must look at it again.
    #[inline]
    pub fn flag_waiters(&self, page: usize) -> bool {
        let s = self.state(page);
        let mut cur = s.load(Acquire);
        loop {
            if kind(cur) != BUSY {
                return false;
            }
            if cur & WAITERS != 0 {
                return true;
            }
            match s.compare_exchange_weak(cur, cur | WAITERS, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_learns_of_waiters_only_when_one_flagged_the_page() {
        let t = PageTable::new(4).unwrap();
        assert!(!t.unlock(0, FAR | WAS_DIRTY));
        // Not BUSY: nothing to flag, the caller must look again.
        assert!(!t.flag_waiters(0));
        let word = t.try_lock(0, &[FAR]).expect("FAR locks");
        assert_eq!(word, FAR | WAS_DIRTY);
        // History survives the lock; a second lock attempt fails.
        assert_eq!(t.state(0).load(Relaxed), BUSY | WAS_DIRTY);
        assert!(t.try_lock(0, &[FAR]).is_none());
        assert!(!t.unlock(0, RESIDENT), "nobody flagged it");
        t.try_lock(0, &[RESIDENT]).unwrap();
        assert!(t.flag_waiters(0));
        assert!(t.flag_waiters(0), "flagging twice is harmless");
        assert!(t.unlock(0, FAR), "the owner sees the flag");
        assert_eq!(t.state(0).load(Relaxed), FAR, "and the flag is gone");
    }
}
