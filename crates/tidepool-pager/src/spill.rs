//! The probation tier's moves (see `tier.rs`): pages touched in the tier come back, and the
//! oldest frames leave for the store when the tier needs room; the tier's share is resized from
//! what it caught.

use crate::budget::EVICT_BATCH;
use crate::buffer::{PageWrite, StoreJob};
use crate::pager::Inner;
use crate::stats::Counters;
use crate::sys::{self, page_bytes, PAGE};
use crate::table::{kind, BUSY, FAR, FAR_VALID, FRAMED, HISTORY, SLOT_SHIFT, STORE_OLD, WRITEBACK};
use crate::tier::Tier;
use std::sync::atomic::Ordering::*;

impl Inner {
    /// A page (`word` its word in the tier) left the probation tier because the program
    /// touched it.
    pub(crate) fn tier_touched(&self, word: u64) {
        if let Some(tier) = self.frames.probation() {
            tier.left(word, true);
            Counters::add(&self.counters.tier_touched, 1);
        }
    }

    /// Makes room for `n` frames in the probation tier by spilling the oldest; false if it
    /// could not (the store's write-back slots are all in use). True without a tier: frames
    /// as the store always have room.
    pub(crate) fn tier_make_room(&self, n: usize) -> bool {
        let Some(tier) = self.frames.probation() else {
            return true;
        };
        loop {
            // Read again each time: other threads move frames in and out, and the tier
            // resizes, meanwhile.
            let over = tier.over(n);
            if over == 0 {
                return true;
            }
            if self.spill(tier, over.max(EVICT_BATCH)) == 0 {
                return false;
            }
        }
    }

    /// Moves up to `max` of the oldest frames out of `tier`: clean ones dropped, the others
    /// written to the store through write-back slots. Returns how many left.
    pub(crate) fn spill(&self, tier: &Tier, max: usize) -> usize {
        let mut writes = Vec::new();
        let mut removes = Vec::new();
        let mut busy = Vec::new();
        let mut out = Vec::new();
        let current = self.tags.current();
        while out.len() < max {
            let Some((region, page, seq)) = tier.fifo.lock().pop_front() else {
                break;
            };
            if region.dead.load(Acquire) || region.table.evicted_at(page).load(Relaxed) != seq {
                continue;
            }
            let Some(w) = region.table.try_lock(page, &[FAR]) else {
                if kind(region.table.state(page).load(Relaxed)) == BUSY {
                    // Someone is moving it (in, most likely): look again later.
                    busy.push((region, page, seq));
                }
                continue;
            };
            if w & FRAMED == 0 {
                // A fault meanwhile found the page BUSY and waits for us to wake it.
                if region.table.unlock(page, w) {
                    self.uffd.wake(region.addr(page), PAGE);
                }
                continue;
            }
            let new = if w & FAR_VALID != 0 {
                // The store holds these bytes.
                FAR | (w & HISTORY)
            } else {
                let Some(slot) = self.slots.try_take_up_to(1).pop() else {
                    if region.table.unlock(page, w) {
                        self.uffd.wake(region.addr(page), PAGE);
                    }
                    busy.push((region, page, seq));
                    break;
                };
                if w & STORE_OLD != 0 && region.table.tag(page).load(Relaxed) != current {
                    // The old copy went to a process forked since: kept for it (see `tags.rs`).
                    self.tags.drop_copy(region.key(page), &mut removes);
                }
                region.table.tag(page).store(current, Relaxed);
                // SAFETY: a FRAMED page has its frame in the shadow, which only the pager
                // touches, and we hold the page's lock.
                self.slots
                    .fill(slot, unsafe { page_bytes(region.shadow_addr(page)) });
                writes.push(PageWrite {
                    region: region.clone(),
                    page,
                    slot,
                    key: region.key(page),
                });
                WRITEBACK | ((slot as u64) << SLOT_SHIFT) | (w & HISTORY)
            };
            out.push((region, page, new));
        }
        if !busy.is_empty() {
            let mut fifo = tier.fifo.lock();
            for e in busy.into_iter().rev() {
                fifo.push_front(e);
            }
        }
        // The frames go in one call, before the pages are released: a released page could go
        // out again into its frame.
        let ranges: Vec<(usize, usize)> = out
            .iter()
            .map(|(r, p, _)| (r.shadow_addr(*p), PAGE))
            .collect();
        sys::discard_many(&ranges);
        // Queued before the pages are released, as an eviction's (see `release_span`).
        if !removes.is_empty() {
            self.jobs.send(StoreJob::Remove(removes));
        }
        if !writes.is_empty() {
            self.jobs.send(StoreJob::Write(writes));
        }
        for (region, page, new) in &out {
            if region.table.unlock(*page, *new) {
                self.uffd.wake(region.addr(*page), PAGE);
            }
        }
        let n = out.len();
        tier.spilled(n);
        Counters::add(&self.counters.tier_spilled, n as u64);
        if let Some(mapped) = tier.resize() {
            self.budget.set_pages(mapped);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use crate::table::*;
    use crate::testkit::*;
    use crate::tier::Tier;

    /// Spills every frame of the tier and waits for the writes to land.
    fn spill_all(pager: &crate::Pager, region: &crate::Region, pages: std::ops::Range<usize>) {
        {
            let _s = crate::gate::section();
            let i = inner(pager);
            let tier = i.frames.probation().expect("a probation pager");
            while i.spill(tier, usize::MAX) > 0 {}
        }
        for p in pages {
            landed(region, p);
        }
    }

    #[test]
    fn a_page_touched_in_the_tier_comes_back_without_the_store() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let Some((pager, mut region)) = probation_pager(store.clone(), 8) else {
            return;
        };
        fill(&mut region, 1, 0x3c);
        evict_all(&pager, &region);
        let w = word(&region, 1);
        assert!(kind(w) == FAR && w & FRAMED != 0, "{w:#x}");
        assert_eq!(pager.stats().tier_pages, 1);
        assert!(holds(&region, 1, 0x3c));
        let s = pager.stats();
        assert_eq!((s.tier_touched, s.far_fetches, s.tier_pages), (1, 0, 0));
        assert!(store.log.lock().is_empty(), "{:?}", store.log.lock());
    }

    #[test]
    fn spilled_frames_reach_the_store_and_clean_ones_are_not_written_again() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let Some((pager, mut region)) = probation_pager(store.clone(), 8) else {
            return;
        };
        for p in 0..8 {
            fill(&mut region, p, p as u8 + 1);
        }
        evict_all(&pager, &region);
        spill_all(&pager, &region, 0..8);
        assert_eq!(store.log.lock().len(), 8, "{:?}", store.log.lock());
        // Read back from the store, not written, out to the tier and spilled again: the store
        // has these bytes, nothing is written.
        for p in 0..8 {
            assert!(holds(&region, p, p as u8 + 1), "page {p}");
        }
        let s = pager.stats();
        assert_eq!((s.tier_touched, s.bytes_read), (0, 8 * 4096), "{s:?}");
        evict_all(&pager, &region);
        for p in 0..8 {
            let w = word(&region, p);
            assert!(w & FRAMED != 0 && w & FAR_VALID != 0, "page {p}: {w:#x}");
        }
        spill_all(&pager, &region, 0..8);
        assert_eq!(store.log.lock().len(), 8, "{:?}", store.log.lock());
        for p in 0..8 {
            assert!(holds(&region, p, p as u8 + 1), "page {p}");
        }
        assert_eq!(pager.stats().tier_spilled, 16);
    }

    #[test]
    fn a_page_written_since_its_store_copy_is_written_again_over_it() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let Some((pager, mut region)) = probation_pager(store.clone(), 4) else {
            return;
        };
        fill(&mut region, 2, 0x11);
        evict_all(&pager, &region);
        spill_all(&pager, &region, 2..3);
        let key = region_inner(&region).key(2);
        fill(&mut region, 2, 0x22);
        evict_all(&pager, &region);
        let w = word(&region, 2);
        assert!(w & STORE_OLD != 0 && w & FAR_VALID == 0, "{w:#x}");
        // Touched in the tier: still the new bytes, and still owed to the store.
        assert!(holds(&region, 2, 0x22));
        evict_all(&pager, &region);
        spill_all(&pager, &region, 2..3);
        assert_eq!(*store.log.lock(), vec![Op::Write(key), Op::Write(key)]);
        assert!(holds(&region, 2, 0x22));
        // Given back: the store's copy goes too.
        region.discard(2 * crate::PAGE, crate::PAGE);
        let start = std::time::Instant::now();
        while !store.log.lock().contains(&Op::Remove(key)) {
            assert!(start.elapsed().as_secs() < 10, "{:?}", store.log.lock());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn only_a_tier_in_front_of_a_store_elsewhere_grows() {
        let total = 10_000;
        assert_eq!(Tier::new(true).bounds(total), (100, 2000));
        assert_eq!(Tier::new(false).bounds(total), (100, 100));
        // Tiny budgets: the least share is 16 pages, never above the largest.
        assert_eq!(Tier::new(true).bounds(50), (10, 10));
    }

    #[test]
    fn the_tier_is_part_of_the_budget_and_follows_a_resize() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let Some((pager, _region)) = probation_pager(Recorder::new(), 4) else {
            return;
        };
        let s = pager.stats();
        assert_eq!(s.budget_pages, (1 << 30) / 4096);
        // In front of a store in this process, the tier keeps its least share.
        assert_eq!(s.tier_cap_pages, s.budget_pages / 100);
        assert_eq!(pager.local_budget(), 1 << 30);
        pager.set_local_budget(64 << 20);
        let s = pager.stats();
        assert_eq!((s.budget_pages, pager.local_budget()), (16384, 64 << 20));
        assert_eq!(s.tier_cap_pages, 16384 / 100, "{s:?}");
        let i = inner(&pager);
        assert_eq!(i.budget.pages() as u64 + s.tier_cap_pages, 16384);
    }
}
