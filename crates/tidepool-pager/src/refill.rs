//! Refill: when the budget has room to spare and pages the pager evicted are out in far memory,
//! the evictor brings them back in batches, hottest first, before the program asks.
//!
//! Without it a budget that grows (a coordinator's grant, the end of host pressure, `tidepool
//! resize`) helps only as fast as the program faults its pages back one round trip at a time:
//! a program walking a Zipfian working set larger than its first budget took a minute and a
//! half to fault back the 80 MiB its start had evicted, running at half speed all along, though
//! the budget had room for all of it after a few seconds. A batch of 64 pages costs one store
//! read.
//!
//! It never evicts to make room: it fills to two margins under the budget and stops, so the
//! faults that follow find room and the evictor does not churn what it just brought back. Once
//! a whole lap of every region finds nothing to bring back (and nothing on its way out), no
//! pass runs until something is evicted again.

use crate::fault::Staging;
use crate::pager::{Inner, PREFETCH_BATCH};
use crate::region::{RegionInner, CHUNK_PAGES};
use crate::stats::Counters;
use crate::table::{kind, BUSY, FAR, FRAMED, HEAT, HEAT_SHIFT, WRITEBACK};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// Page states a pass reads at most per region, from where its last pass stopped, up to the
/// highest page the region ever mapped: the preload library's large-object region spans a
/// terabyte of address space, and reading all of its words held the evictor for seconds.
const SCAN_PAGES: usize = 1 << 16;

/// Pages brought back per wake of the evictor (every 20 ms at most): 4 MiB, 200 MiB/s, so a
/// refill shares the store with other programs' faults rather than swamping it.
const REFILL_PAGES: usize = 1024;

impl Inner {
    /// Brings far pages back while the budget has room to spare (see the module's comment).
    /// Returns how many. Only the evictor thread calls it.
    pub(crate) fn refill(&self, staging: &mut Staging) -> usize {
        if !self.refill {
            return 0;
        }
        let _section = crate::gate::section();
        let mut sweep = self.sweep.lock();
        let seq = self.evict_seq.load(Acquire);
        if sweep.idle == Some(seq) {
            return 0; // a lap found nothing, and nothing went out since
        }
        sweep.idle = None;
        let room = self
            .budget
            .pages()
            .saturating_sub(self.local_pages().saturating_add(2 * self.budget.margin()))
            .min(REFILL_PAGES);
        if room < PREFETCH_BATCH {
            return 0;
        }
        let regions: Vec<Arc<RegionInner>> = self.regions.read().clone();
        sweep.at.retain(|id, _| regions.iter().any(|r| r.id == *id));
        if !sweep.dry {
            sweep.dry_seq = seq;
        }
        let (mut brought, mut leaving, mut lapped) = (0, false, true);
        for region in &regions {
            let end = if region.dead.load(Acquire) {
                0
            } else {
                region.touched_end.load(Acquire).min(region.table.pages())
            };
            let (from, dry) = sweep.at.get(&region.id).copied().unwrap_or_default();
            if brought + PREFETCH_BATCH > room {
                lapped &= dry >= end;
                continue;
            }
            let from = if from >= end { 0 } else { from };
            // The states of chunks that had evictions, SCAN_PAGES of them at most.
            let (mut ranges, mut to, mut read) = (Vec::new(), from, 0);
            while to < end && read < SCAN_PAGES {
                let start = region.next_evicted_chunk(to, end);
                if start >= end {
                    to = end;
                    break;
                }
                let stop = ((start / CHUNK_PAGES + 1) * CHUNK_PAGES)
                    .min(end)
                    .min(start + SCAN_PAGES - read);
                ranges.push(start..stop);
                read += stop - start;
                to = stop;
            }
            sweep.read += read as u64;
            let pages = ranges.into_iter().flatten();
            let (b, l) = self.refill_range(region, pages, room - brought, staging);
            brought += b;
            leaving |= l;
            let dry = dry + (to - from);
            lapped &= dry >= end;
            sweep.at.insert(region.id, (to, dry));
        }
        if brought > 0 || leaving {
            sweep.dry = false;
            sweep.at.values_mut().for_each(|(_, dry)| *dry = 0);
        } else if lapped {
            // Pages evicted during the lap may lie where it had passed: idle only as of the
            // lap's start.
            sweep.idle = Some(sweep.dry_seq);
            sweep.dry = false;
            sweep.at.values_mut().for_each(|(_, dry)| *dry = 0);
        } else {
            sweep.dry = true;
        }
        brought
    }

    /// Brings back up to `want` far pages of `pages` of `region` (none for a dead region), the
    /// hottest (most often fetched again soon after an eviction) first. Returns how many, and
    /// whether a page of them is on its way to the store (it will be far soon).
    fn refill_range(
        &self,
        region: &Arc<RegionInner>,
        pages: impl Iterator<Item = usize>,
        want: usize,
        staging: &mut Staging,
    ) -> (usize, bool) {
        let mut by_heat: [Vec<usize>; 4] = Default::default();
        let mut leaving = false;
        for p in pages {
            let w = region.table.state(p).load(Relaxed);
            // On its way to the store, or locked by a thread that may be evicting it (the
            // eviction's sequence number is taken before the page turns FAR: a pass reading
            // the new number and the page still BUSY went idle, and the page stayed far).
            leaving |= matches!(kind(w), WRITEBACK | BUSY);
            // A probation tier's frames are local already; an inaccessible page could not be
            // evicted again until the program opens it.
            if kind(w) == FAR && !(self.probation && w & FRAMED != 0) && self.readable(region, p) {
                let heat = ((w & HEAT) >> HEAT_SHIFT) as usize;
                if by_heat[heat].len() < want {
                    by_heat[heat].push(p);
                }
            }
        }
        let mut pages: Vec<usize> = by_heat.into_iter().rev().flatten().take(want).collect();
        let mut brought = 0;
        while !pages.is_empty() {
            let rest = pages.split_off(pages.len().min(PREFETCH_BATCH));
            let mut batch: Vec<(usize, u64)> = Vec::with_capacity(PREFETCH_BATCH);
            pages.sort_unstable();
            for &p in &pages {
                // Faulted on (or evicted again) since the scan: skipped.
                if let Some(w) = region.table.try_lock(p, &[FAR]) {
                    batch.push((p, w));
                }
            }
            pages = rest;
            if batch.is_empty() {
                continue;
            }
            // The program may have taken the room meanwhile: never evict for a guess.
            if self.local_pages() + batch.len() + self.budget.margin() > self.budget.pages()
                || self.shutdown.load(Acquire)
            {
                for &(p, w) in &batch {
                    if region.table.unlock(p, w) {
                        // A thread faulted meanwhile, found the page BUSY and waits for us.
                        self.uffd.wake(region.addr(p), crate::sys::PAGE);
                    }
                }
                break;
            }
            // Counted before the pages show: whoever sees one back sees it counted.
            Counters::add(&self.counters.refilled, batch.len() as u64);
            self.install_prefetched(region, &batch, staging);
            brought += batch.len();
        }
        (brought, leaving)
    }
}

#[cfg(test)]
mod tests {
    use crate::table::*;
    use crate::testkit::*;
    use crate::{Config, PAGE};
    use std::time::{Duration, Instant};

    /// Waits until `done` holds (10 s at most).
    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn evicted_pages_come_back_while_the_budget_has_room() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let mut config = Config::new(1 << 30);
        config.refill = true;
        let (pager, mut region) = pager_with(config, Recorder::new(), 256);
        for p in 0..256 {
            fill(&mut region, p, (p % 251) as u8 + 1);
        }
        evict_all(&pager, &region);
        assert!(pager.stats().evicted > 0, "nothing was evicted");
        until("every page back", || {
            (0..256).all(|p| kind(word(&region, p)) == RESIDENT)
        });
        let s = pager.stats();
        assert!(s.refilled > 0, "{s}");
        assert_eq!(
            s.far_fetches, 0,
            "the program faulted them back itself: {s}"
        );
        for p in 0..256 {
            assert!(
                holds(&region, p, (p % 251) as u8 + 1),
                "page {p} came back wrong"
            );
        }
        assert_eq!(pager.stats().far_fetches, 0);
    }

    #[test]
    fn a_refill_stops_two_margins_short_of_the_budget_and_loses_nothing() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let mut config = Config::new(256 * PAGE);
        config.refill = true;
        let (pager, mut region) = pager_with(config, Recorder::new(), 1024);
        for p in 0..1024 {
            fill(&mut region, p, (p % 251) as u8 + 1);
        }
        // Quiet first: the last fault's prefetch window may still be going in.
        let mut last = pager.stats();
        until("the pager to settle under the budget", || {
            std::thread::sleep(Duration::from_millis(50));
            let now = pager.stats();
            let quiet = (now.missing_faults, now.prefetched, now.evicted)
                == (last.missing_faults, last.prefetched, last.evicted);
            last = now;
            quiet && last.resident_pages <= 256
        });
        pager.set_local_budget(512 * PAGE);
        until("a refill", || pager.stats().refilled > 0);
        // Nothing else faults: what the refill brought stays under two margins (64 pages each
        // at this budget) below the budget.
        std::thread::sleep(Duration::from_millis(100));
        let s = pager.stats();
        assert!(
            s.resident_pages <= 512 - 128,
            "{} pages: {s}",
            s.resident_pages
        );
        assert!(s.resident_pages > 256, "{s}");
        for p in 0..1024 {
            assert!(holds(&region, p, (p % 251) as u8 + 1), "page {p} lost");
        }
    }

    #[test]
    fn a_sparse_region_is_refilled_without_reading_what_was_never_evicted() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let mut config = Config::new(1 << 30);
        config.refill = true;
        // 16 GiB of address space, of which the last 256 KiB are used.
        let pages = 1 << 22;
        let (pager, mut region) = pager_with(config, Recorder::new(), pages);
        let used = pages - 64..pages;
        for p in used.clone() {
            fill(&mut region, p, (p % 251) as u8 + 1);
        }
        evict_all(&pager, &region);
        until("every page back", || {
            used.clone().all(|p| kind(word(&region, p)) == RESIDENT)
        });
        // One sweep of every state word up to them reads four million; each pass here reads
        // the one chunk that had evictions (and evict_all, evicting what comes back, makes a
        // few dozen passes).
        let read = inner(&pager).sweep.lock().read;
        assert!(
            read < (pages / 4) as u64,
            "{read} page states read to bring back 64 pages"
        );
        for p in used {
            assert!(
                holds(&region, p, (p % 251) as u8 + 1),
                "page {p} came back wrong"
            );
        }
    }

    #[test]
    fn without_the_option_nothing_comes_back_on_its_own() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 128);
        for p in 0..128 {
            fill(&mut region, p, 7);
        }
        evict_all(&pager, &region);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pager.stats().refilled, 0);
        assert!((0..128).all(|p| kind(word(&region, p)) != RESIDENT));
    }

    #[test]
    fn a_probation_tiers_frames_stay_in_the_tier() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let mut config = Config::new(1 << 30);
        config.probation = true;
        config.refill = true;
        let (pager, mut region) = pager_with(config, Recorder::new(), 128);
        if !inner(&pager).probation {
            eprintln!("skipped: a probation tier needs UFFDIO_MOVE (Linux 6.8)");
            return;
        }
        for p in 0..128 {
            fill(&mut region, p, 9);
        }
        evict_all(&pager, &region);
        std::thread::sleep(Duration::from_millis(100));
        // Local already: moving them in would count as the program touching the tier (and grow
        // a tier that may grow).
        assert_eq!(pager.stats().refilled, 0);
        assert!((0..128).all(|p| holds(&region, p, 9)));
    }
}
