//! Eviction: the evictor thread (and any handler short of room) takes a batch of victims (see
//! `victims.rs`); runs of consecutive victims may move to the region's shadow (frames),
//! everything else is saved in spans (one write-protection a span: clean pages dropped, dirty
//! ones copied to write-back slots) and dropped with one vectored `MADV_DONTNEED`.

use crate::buffer::{PageWrite, StoreJob};
use crate::pager::{hash_page, is_zero_page, Inner, RegionInner};
use crate::stats::Counters;
use crate::sys::{self, page_bytes, PAGE};
use crate::table::{
    DIRTY, FAR, FAR_VALID, HEAT, HISTORY, SLOT_SHIFT, UNTOUCHED, WAS_DIRTY, WP_CLEAN, WRITEBACK,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;
use tidepool_store::Key;

/// A run of pages saved for eviction, not yet dropped.
pub(crate) struct SavedRun {
    new_words: Vec<u64>,
    writes: Vec<PageWrite>,
    removes: Vec<Key>,
    /// Pages that needed no write, and pages that read as zeros.
    clean: u64,
    zero: u64,
}

use crate::victims::{clock_entry, is_hole, Ask, Victim, Victims, EVICT_REACH};

/// Splits sorted victims into spans: victims of one region at most [`EVICT_REACH`] pages apart
/// with only holes (see [`is_hole`]) between them. One write-protection freezes a span, where
/// each run of consecutive pages would cost one, and each costs a TLB shootdown of every CPU
/// the program runs on; the kernel's own reclaim batches its flushes the same way.
pub(crate) fn spans_of(victims: &[(Arc<RegionInner>, usize, u64)]) -> Vec<std::ops::Range<usize>> {
    let n = victims.len();
    let mut spans = Vec::new();
    let mut start = 0;
    while start < n {
        let region = &victims[start].0;
        let mut end = start + 1;
        while end < n
            && victims[end].0.id == region.id
            && victims[end].1 - victims[end - 1].1 <= EVICT_REACH
            && (victims[end - 1].1 + 1..victims[end].1)
                .all(|p| is_hole(region.table.state(p).load(Acquire)))
        {
            end += 1;
        }
        spans.push(start..end);
        start = end;
    }
    spans
}

/// Whether sorted victims of one region are consecutive pages.
fn is_run(victims: &[(Arc<RegionInner>, usize, u64)]) -> bool {
    victims[victims.len() - 1].1 - victims[0].1 + 1 == victims.len()
}

/// Splits sorted victims into runs of consecutive pages of one region.
pub(crate) fn runs_of(victims: &[(Arc<RegionInner>, usize, u64)]) -> Vec<std::ops::Range<usize>> {
    let n = victims.len();
    let mut runs = Vec::new();
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n
            && victims[end].0.id == victims[start].0.id
            && victims[end].1 == victims[end - 1].1 + 1
        {
            end += 1;
        }
        runs.push(start..end);
        start = end;
    }
    runs
}

impl Inner {
    pub(crate) fn evictor_loop(self: Arc<Self>) {
        let mut staging = crate::staging::Staging::new();
        loop {
            {
                if self.evictor_kick.swap(0, AcqRel) == 0 {
                    sys::futex_wait(&self.evictor_kick, 0, Duration::from_millis(20));
                    self.evictor_kick.store(0, Release);
                }
            }
            if self.shutdown.load(Acquire) {
                return;
            }
            // Over budget: evict down to a margin below it, so that the next faults find room
            // without waiting. At or under budget nothing is evicted, so a working set that
            // fits the budget never churns.
            let wanted = self.budget.room_wanted.swap(0, Relaxed);
            if self.local_pages() + wanted > self.budget.pages() {
                while self.local_pages() + self.budget.margin() > self.budget.pages()
                    && !self.shutdown.load(Acquire)
                {
                    if self.evict_batch() == 0 {
                        break;
                    }
                }
            }
            // Stale frames left since the last eviction: memory held twice.
            if self.frames.on() {
                let _section = crate::gate::section();
                self.drop_stale_frames(&[]);
            }
            // A tier over its share (the budget shrank) gives back the difference.
            self.tier_make_room(0);
            // Room to spare: bring evicted pages back before they are asked for (a batch per
            // wake, so a refill shares the store with faults).
            if let Some(refill) = &self.refill {
                refill.run(&*self, &mut staging);
            }
        }
    }

    /// Chooses victims with CLOCK (second chance for referenced pages) and evicts them.
    /// Returns how many pages were evicted.
    pub(crate) fn evict_batch(&self) -> usize {
        let _section = crate::gate::section();
        // No protection changes until the victims are read (see `Inner::protecting`). Never
        // waited for: the thread changing one may itself wait for a fault this one serves;
        // and not taken past a waiting `mprotect`, which overlapping batches would starve.
        let Some(_protecting) = self.protecting.try_read() else {
            return 0;
        };
        let victims = self.eviction.choose(&Ask {
            sections: &self.sections,
            budget_pages: self.budget.pages(),
            spans: self.frames.evicts_in_spans(),
        });
        if victims.is_empty() {
            return 0;
        }
        self.evict_victims(victims)
    }

    /// Evicts the locked `victims`: moved to frames where a frame tier has room, the rest
    /// copied out. Returns how many.
    fn evict_victims(&self, mut victims: Victims) -> usize {
        for (region, page, _) in &victims {
            region.note_evicted(*page);
        }
        victims.sort_by_key(|(r, p, _)| (r.id, *p));
        // Frames pages were copied in from, the victims' own among them: a victim's must go
        // before it moves out to the same place.
        if self.frames.on() {
            self.drop_stale_frames(&victims);
        }
        let mut evicted = 0;
        // With a probation tier, the victims go to frames if the tier has room for them (made
        // by spilling its oldest), else straight to the store.
        if self.frames.on() && self.tier_make_room(victims.len()) {
            let refused = self.move_victims(&victims);
            evicted = victims.len() - refused.len();
            victims = refused;
        }
        if !victims.is_empty() {
            evicted += self.copy_out(&victims);
        }
        evicted
    }

    /// Moves `victims` out as frames; returns those that could not be, in order.
    fn move_victims(&self, victims: &[Victim]) -> Vec<Victim> {
        let mut refused = Vec::new();
        if self.frames.evicts_in_spans() {
            // A move costs a TLB shootdown a run; a span with holes is written out under one
            // write-protection instead (the tier then misses those pages).
            for span in spans_of(victims) {
                let span = &victims[span];
                if is_run(span) {
                    self.move_out(span, &mut refused);
                } else {
                    refused.extend_from_slice(span);
                }
            }
            refused.sort_by_key(|(r, p, _)| (r.id, *p));
        } else {
            for run in runs_of(victims) {
                self.move_out(&victims[run], &mut refused);
            }
        }
        refused
    }

    /// Evicts locked pages (sorted) by copying them out: the write-back path. Returns how many
    /// went: a page that may need a write-back slot when none is free stays (the write-back
    /// thread frees slots, and nothing inside a section may wait for another thread's section).
    pub(crate) fn copy_out(&self, victims: &[(Arc<RegionInner>, usize, u64)]) -> usize {
        let need = victims.iter().filter(|v| v.2 & WP_CLEAN == 0).count();
        let mut slots = self.slots.try_take_up_to(need);
        let mut cut = victims.len();
        if slots.len() < need {
            let mut left = slots.len();
            for (i, v) in victims.iter().enumerate() {
                if v.2 & WP_CLEAN == 0 {
                    if left == 0 {
                        cut = i;
                        break;
                    }
                    left -= 1;
                }
            }
            for (region, page, w) in &victims[cut..] {
                if region.table.unlock(*page, *w) {
                    self.uffd.wake(region.addr(*page), PAGE);
                }
            }
            let mut clock = self.eviction.clock.entries();
            clock.extend(victims[cut..].iter().map(|(r, p, _)| clock_entry(r, *p)));
        }
        let victims = &victims[..cut];
        // Save every span, drop all of their pages in one call, then release them.
        let spans = spans_of(victims);
        let saved: Vec<SavedRun> = spans
            .iter()
            .map(|s| self.save_span(&victims[s.clone()], &mut slots))
            .collect();
        self.slots.give_many(slots);
        let ranges: Vec<(usize, usize)> = runs_of(victims)
            .into_iter()
            .map(|r| (victims[r.start].0.addr(victims[r.start].1), r.len() * PAGE))
            .collect();
        sys::discard_many(&ranges);
        for (s, saved) in spans.into_iter().zip(saved) {
            self.release_span(&victims[s], saved);
        }
        victims.len()
    }

    /// Saves a span of locked pages of one region (see [`spans_of`]) for eviction.
    /// Dirty pages take their write-back slot from `slots`, which holds enough.
    pub(crate) fn save_span(
        &self,
        run: &[(Arc<RegionInner>, usize, u64)],
        slots: &mut Vec<u32>,
    ) -> SavedRun {
        let region = &run[0].0;
        let first = run[0].1;
        let addr = region.addr(first);
        let span = run[run.len() - 1].1 - first + 1;
        let len = span * PAGE;
        // Freeze the contents: a write from now on waits in a write-protect fault until the
        // page is gone, then faults it back in. Pages installed write-protected and never
        // written need nothing.
        if run.iter().any(|(_, _, w)| w & WP_CLEAN == 0) {
            if let Err(e) = self.uffd.write_protect(addr, len, true) {
                if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) {
                    self.fatal("write-protecting pages for eviction", &e);
                }
            }
        }
        // A page the program dropped with a system call the pager did not see reads as zeros
        // now, and reading it here would wait for a fault only this pager can serve.
        let mut exists = Vec::new();
        sys::pages_exist(addr, span, &mut exists);
        let seq = self.evict_seq.fetch_add(run.len() as u32, Relaxed);
        let mut saved = SavedRun {
            new_words: Vec::with_capacity(run.len()),
            writes: Vec::new(),
            removes: Vec::new(),
            clean: 0,
            zero: 0,
        };
        for &(_, page, w) in run {
            let new = self.save_page(region, page, w, exists[page - first], slots, &mut saved);
            saved.new_words.push(new);
            region.table.evicted_at(page).store(seq.max(1), Relaxed);
        }
        let c = &self.counters;
        Counters::add(&c.evicted_clean, saved.clean);
        Counters::add(&c.evicted_zero, saved.zero);
        saved
    }

    /// Saves locked page `page` of `region` (word `w`; `exists`: the kernel still has it):
    /// nothing to write for a page that reads as zeros or whose far copy is good, else its
    /// bytes go to a write-back slot. Returns the page's state once it is gone.
    fn save_page(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        w: u64,
        exists: bool,
        slots: &mut Vec<u32>,
        saved: &mut SavedRun,
    ) -> u64 {
        let history = w & HISTORY;
        let far_valid = w & FAR_VALID != 0;
        if !exists {
            saved.zero += 1;
            if far_valid {
                self.tags.drop_copy(region.key(page), &mut saved.removes);
            }
            return UNTOUCHED | (history & HEAT);
        }
        if w & WP_CLEAN != 0 {
            saved.clean += 1;
            if far_valid {
                return FAR | history;
            }
            saved.zero += 1;
            return UNTOUCHED | history;
        }
        // SAFETY: the page is RESIDENT and locked by us, so mapped (only lock holders unmap
        // pages), readable (checked when chosen, and `protecting` holds off mprotect since),
        // and write-protected by `save_span`, so nobody writes it meanwhile.
        let bytes = unsafe { page_bytes(region.addr(page)) };
        let was_written = w & DIRTY != 0;
        if is_zero_page(bytes) {
            saved.zero += 1;
            if far_valid {
                self.tags.drop_copy(region.key(page), &mut saved.removes);
            }
            return UNTOUCHED | (history & HEAT) | if was_written { WAS_DIRTY } else { history };
        }
        if !was_written && far_valid && hash_page(bytes) == region.table.hash(page).load(Relaxed) {
            // Installed writable on a guess (the install hashed it) and not written this time:
            // install it write-protected next time, which saves the hash.
            saved.clean += 1;
            return FAR | (history & HEAT);
        }
        let tag = self.tags.current();
        if far_valid && region.table.tag(page).load(Relaxed) != tag {
            // The copy went to a process forked since: a new one is written under this
            // process's current tag, the old one is kept for it.
            self.tags.drop_copy(region.key(page), &mut saved.removes);
        }
        region.table.tag(page).store(tag, Relaxed);
        let slot = slots
            .pop()
            .expect("copy_out reserves a slot per dirty page");
        self.slots.fill(slot, bytes);
        saved.writes.push(PageWrite {
            region: region.clone(),
            page,
            slot,
            key: region.key(page),
        });
        WRITEBACK | ((slot as u64) << SLOT_SHIFT) | WAS_DIRTY | (history & HEAT)
    }

    /// Queues the store work of a saved span whose pages are gone, then publishes their new
    /// states and wakes their waiters.
    ///
    /// Queued first, while the pages are still locked: once one is released, another thread
    /// may fault it in from its slot and evict it again, and that later write must queue after
    /// this one, or the store would end with the older bytes (a lost write, seen in forked
    /// children whose small budgets evict a page again within microseconds). The write-back
    /// thread may so find a page still locked when its write lands; it finishes it later.
    pub(crate) fn release_span(&self, run: &[(Arc<RegionInner>, usize, u64)], saved: SavedRun) {
        let region = &run[0].0;
        if !saved.removes.is_empty() {
            self.jobs.send(StoreJob::Remove(saved.removes));
        }
        if !saved.writes.is_empty() {
            self.jobs.send(StoreJob::Write(saved.writes));
        }
        let mut waiters = false;
        for ((_, page, _), new) in run.iter().zip(saved.new_words) {
            waiters |= region.table.unlock(*page, new);
            Counters::add(&self.section_counts(region, *page).evicted, 1);
            self.count_resident(region, *page, -1);
        }
        self.budget.resident.fetch_sub(run.len(), Relaxed);
        if waiters {
            // Threads that faulted after the discard retry now and find the pages' new
            // states. (Writers that hit the write protection wait the eviction out in
            // `serve_write_protect` and wake themselves.)
            for r in runs_of(run) {
                self.uffd.wake(region.addr(run[r.start].1), r.len() * PAGE);
            }
        }
        Counters::add(&self.counters.evicted, run.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::{runs_of, spans_of};
    use crate::table::*;
    use crate::testkit::*;
    use crate::victims::stale;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    #[test]
    fn runs_split_at_gaps() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (_pager, region) = pager(Recorder::new(), false, 16);
        let r = region_inner(&region);
        let victims: Vec<_> = [1, 2, 3, 5, 6, 9]
            .iter()
            .map(|&p| (Arc::clone(r), p, 0u64))
            .collect();
        assert_eq!(runs_of(&victims), vec![0..3, 3..5, 5..6]);
    }

    /// Victims join a span across pages nothing maps, not across a mapped page (a
    /// write-protection would freeze it too) nor further than the reach.
    #[test]
    fn spans_join_victims_across_holes_only() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (_pager, mut region) = pager(Recorder::new(), false, 64);
        fill(&mut region, 10, 1);
        let r = region_inner(&region);
        let victims: Vec<_> = [1, 3, 4, 8, 12, 50]
            .iter()
            .map(|&p| (Arc::clone(r), p, 0u64))
            .collect();
        assert_eq!(spans_of(&victims), vec![0..4, 4..5, 5..6]);
    }

    #[test]
    fn dirty_pages_are_written_back_and_clean_ones_dropped() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let (pager, mut region) = pager(store.clone(), false, 32);
        for p in 0..8 {
            fill(&mut region, p, p as u8 + 1);
        }
        evict_all(&pager, &region);
        for p in 0..8 {
            landed(&region, p);
        }
        for p in 0..8 {
            assert!(holds(&region, p, p as u8 + 1), "page {p}");
        }
        let writes = store.log.lock().len();
        // Read, not written: the far copies stay valid, nothing is written again.
        evict_all(&pager, &region);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(store.log.lock().len(), writes);
        assert!(pager.stats().evicted_clean >= 8);
        for p in 0..8 {
            assert_eq!(kind(word(&region, p)), FAR);
        }
    }

    /// A page another thread holds when the clock hand passes (a write fault lifting its
    /// protection, say) stays on the clock: dropped, it would stay mapped for good, outside the
    /// budget, and a forked child would not know it shares it.
    #[test]
    fn a_page_held_by_another_thread_stays_on_the_clock() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 16);
        fill(&mut region, 0, 1);
        fill(&mut region, 1, 2);
        let r = region_inner(&region);
        let _ = word(&region, 0);
        let held = r
            .table
            .try_lock(0, &[RESIDENT])
            .expect("page 0 is resident");
        // A page just installed reaches the clock a moment after its state (see `evict_all`).
        for _ in 0..20 {
            if kind(word(&region, 1)) != RESIDENT {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            let _s = crate::gate::section();
            while inner(&pager).evict_batch() > 0 {}
        }
        let page_1 = kind(word(&region, 1));
        // Released before asserting: a failed assertion drops the region, which waits for
        // every page's lock (a hang, not a failure, when this test held page 0 then).
        let _ = r.table.unlock(0, held);
        assert_ne!(page_1, RESIDENT);
        evict_all(&pager, &region);
        assert_ne!(kind(word(&region, 0)), RESIDENT, "page 0 left the clock");
        assert!(holds(&region, 0, 1));
    }

    #[test]
    fn an_inaccessible_page_is_never_a_victim() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 16);
        fill(&mut region, 0, 1);
        fill(&mut region, 1, 2);
        let r = region_inner(&region);
        inner(&pager).protect(r, 1..2, libc::PROT_NONE).unwrap();
        evict_all(&pager, &region);
        assert_ne!(kind(word(&region, 0)), RESIDENT);
        assert_eq!(kind(word(&region, 1)), RESIDENT);
        inner(&pager)
            .protect(r, 1..2, libc::PROT_READ | libc::PROT_WRITE)
            .unwrap();
        evict_all(&pager, &region);
        assert_ne!(kind(word(&region, 1)), RESIDENT);
        assert!(holds(&region, 1, 2));
    }

    /// Fills `pages` (page, byte) in order, waits until they are all on the clock, and makes
    /// `hot` ones hot as a page fetched again soon after its eviction is: heat, and a chance
    /// from it.
    fn on_the_clock(
        pager: &crate::Pager,
        region: &mut crate::Region,
        pages: &[(usize, u8)],
        hot: &[usize],
    ) {
        for &(p, v) in pages {
            fill(region, p, v);
        }
        // A page just installed reaches the clock a moment after its state.
        while inner(pager).eviction.clock.entries().len() < pages.len() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for &p in hot {
            region_inner(region)
                .table
                .state(p)
                .fetch_add((1 << HEAT_SHIFT) | (1 << CHANCE_SHIFT), Relaxed);
        }
    }

    /// Moved as frames, a clock victim takes its cold neighbours along, not the hot ones (not
    /// even one whose chances the hand just used up: it went to the back of the line), and the
    /// clock entries they leave behind are known as stale once the pages are back: a page is
    /// never on the clock twice.
    #[test]
    fn cold_neighbours_go_with_a_victim_and_leave_stale_entries() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), true, 16);
        if !inner(&pager).frames.on() {
            eprintln!("skipped: frames need UFFDIO_MOVE (Linux 6.8)");
            return;
        }
        // On the clock in this order: 0, 2, 3, 1, 5; 2 and 5 have a chance each.
        on_the_clock(
            &pager,
            &mut region,
            &[(0, 1), (2, 3), (3, 4), (1, 2), (5, 6)],
            &[2, 5],
        );
        let i = inner(&pager);
        {
            let _s = crate::gate::section();
            // 0 goes, and with it 1 (cold) but not 2 (hot); 2 and 5 are spared, and stay
            // while 3 goes (not 2, its neighbour, spared a moment ago); 1 is held by then.
            assert!(i.evict_batch() >= 3);
        }
        for p in [0, 1, 3] {
            assert_ne!(kind(word(&region, p)), RESIDENT, "page {p}");
        }
        for p in [2, 5] {
            assert_eq!(kind(word(&region, p)), RESIDENT, "page {p}");
        }
        assert!(holds(&region, 1, 2));
        while kind(word(&region, 1)) != RESIDENT {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        let clock = i.eviction.clock.entries();
        let live = |p: usize| clock.iter().filter(|e| e.1 == p && !stale(e)).count();
        assert_eq!(live(1), 1, "page 1's entries");
        assert_eq!(live(0), 0, "page 0's entries");
        assert_eq!(live(2), 1, "page 2's entries");
    }

    /// Written out in spans, a clock victim takes every unreferenced neighbour within reach
    /// along, hot or not, across pages nothing maps; the pages come back whole, and a page
    /// installed in a hole afterwards is the program's as any other.
    #[test]
    fn a_victim_takes_its_neighbours_across_holes() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 64);
        // On the clock in this order: 0, 2, 4, 5, 40; 2 and 40 are hot.
        on_the_clock(
            &pager,
            &mut region,
            &[(0, 1), (2, 3), (4, 5), (5, 6), (40, 7)],
            &[2, 40],
        );
        let i = inner(&pager);
        {
            let _s = crate::gate::section();
            // 0 goes, and with it 2, 4 and 5 across the holes; 40 is out of reach, and
            // spared by the hand for its chance.
            assert!(i.evict_batch() >= 4);
        }
        for p in [0, 2, 4, 5] {
            assert_ne!(kind(word(&region, p)), RESIDENT, "page {p}");
        }
        assert_eq!(kind(word(&region, 40)), RESIDENT);
        fill(&mut region, 1, 9);
        fill(&mut region, 3, 8);
        for (p, v) in [(0, 1), (1, 9), (2, 3), (3, 8), (4, 5), (5, 6), (40, 7)] {
            assert!(holds(&region, p, v), "page {p}");
        }
    }
}
