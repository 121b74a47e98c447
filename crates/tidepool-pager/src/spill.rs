//! The probation tier's moves (see `tier.rs`): pages touched in the tier come back, and the
//! oldest frames leave for the store when the tier needs room; the tier's share is resized from
//! what it caught.

use crate::budget::EVICT_BATCH;
use crate::buffer::{PageWrite, StoreJob};
use crate::pager::Inner;
use crate::stats::Counters;
use crate::sys::{self, page_bytes, PAGE};
use crate::table::{
    kind, BUSY, FAR, FAR_VALID, FRAMED, HISTORY, INHERITED, SLOT_SHIFT, STORE_OLD, WRITEBACK,
};
use crate::tier::{Tier, WINDOW};
use std::sync::atomic::Ordering::*;

impl Inner {
    /// A page (`word` its word in the tier) left the tier because the program touched it.
    pub(crate) fn tier_touched(&self, word: u64) {
        // A frame a forked child shares with its parent is not in the child's count.
        if word & INHERITED == 0 {
            self.tier.held.fetch_sub(1, Relaxed);
        }
        Counters::add(&self.counters.tier_touched, 1);
        self.tier.window_touched.fetch_add(1, Relaxed);
    }

    /// Whether `n` more frames fit the tier.
    pub(crate) fn tier_has_room(&self, n: usize) -> bool {
        self.tier.held.load(Relaxed) + n <= self.tier.cap.load(Relaxed)
    }

    /// Makes room for `n` frames by spilling the oldest; false if it could not (the store's
    /// write-back slots are all in use).
    pub(crate) fn tier_make_room(&self, n: usize) -> bool {
        while !self.tier_has_room(n) {
            // Read again: other threads move frames in and out, and the tier resizes, since
            // the test above.
            let over =
                (self.tier.held.load(Relaxed) + n).saturating_sub(self.tier.cap.load(Relaxed));
            if self.spill(over.max(EVICT_BATCH)) == 0 {
                return false;
            }
        }
        true
    }

    /// Moves up to `max` of the oldest frames out of the tier: clean ones dropped, the others
    /// written to the store through write-back slots. Returns how many left.
    pub(crate) fn spill(&self, max: usize) -> usize {
        let mut writes = Vec::new();
        let mut removes = Vec::new();
        let mut busy = Vec::new();
        let mut out = Vec::new();
        let current = self.tags.current();
        while out.len() < max {
            let Some((region, page, seq)) = self.tier.fifo.lock().pop_front() else {
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
            let mut fifo = self.tier.fifo.lock();
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
        self.tier.held.fetch_sub(n, Relaxed);
        Counters::add(&self.counters.tier_spilled, n as u64);
        self.tier.window_spilled.fetch_add(n as u64, Relaxed);
        self.tier_resize();
        n
    }

    /// Every [`WINDOW`] pages out of the tier, grows or shrinks it by what they say.
    fn tier_resize(&self) {
        let t = &self.tier;
        let (touched, spilled) = (
            t.window_touched.load(Relaxed),
            t.window_spilled.load(Relaxed),
        );
        if touched + spilled < WINDOW {
            return;
        }
        t.window_touched.fetch_sub(touched, Relaxed);
        t.window_spilled.fetch_sub(spilled, Relaxed);
        let ratio = touched as f64 / (touched + spilled) as f64;
        let total = t.total.load(Relaxed);
        let step = Tier::step(total);
        let (min, max) = t.bounds(total);
        let cap = t.cap.load(Relaxed);
        let cap = if ratio > 0.3 {
            (cap + step).min(max)
        } else if ratio < 0.1 {
            cap.saturating_sub(step).max(min)
        } else {
            return;
        };
        t.cap.store(cap, Relaxed);
        self.budget.set_pages(total - cap);
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
            while inner(pager).spill(usize::MAX) > 0 {}
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
