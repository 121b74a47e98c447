//! Eviction: the evictor thread (and any handler short of room) takes the pages streams walked
//! past, then GCLOCK victims with unused neighbours; runs of consecutive victims may move to the
//! region's shadow (frames), everything else is saved in spans (one write-protection a span:
//! clean pages dropped, dirty ones copied to write-back slots) and dropped with one vectored
//! `MADV_DONTNEED`.

use crate::buffer::{PageWrite, StoreJob};
use crate::pager::{
    hash_page, is_zero_page, Inner, RegionInner, EVICT_BATCH, EVICT_NEIGHBOURS, EVICT_REACH,
    RUN_NEIGHBOURS,
};
use crate::region_inner::{clock_entry, stale};
use crate::sections::Keep;
use crate::stats::Counters;
use crate::sys::{self, page_bytes, PAGE};
use crate::table::{
    kind, BUSY, CHANCES, CHANCE_SHIFT, DIRTY, FAR, FAR_VALID, HEAT, HISTORY, INHERITED, REFERENCED,
    RESIDENT, SLOT_SHIFT, UNTOUCHED, WAS_DIRTY, WP_CLEAN, WRITEBACK,
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

/// A page chosen for eviction, locked: its region, its index, its word before the lock.
type Victim = (Arc<RegionInner>, usize, u64);
type Victims = Vec<Victim>;

/// One pass of the clock hand: how many entries it may still look at, and the reach that pins
/// and shares give it (see `Inner::take_from_clock`).
struct Pass {
    budget: usize,
    /// Pinned sections' pages are passed over without counting against the pass's budget, up
    /// to a turn of the clock (they gather in a block, which a pass must get across). A pass
    /// that passes a whole turn of them (more is pinned than the budget holds) takes them from
    /// there on, and pins give way for the next batches (see `Sections::pins_hold`), so such a
    /// pass costs one batch in many.
    pin_reach: usize,
    /// Sections over their share of the budget (a bit each): their pages lose their second
    /// chances, and other sections' pages are passed over, up to a turn of the clock, to find
    /// them (shares then give way for some batches, as pins do).
    over: u128,
    share_reach: usize,
}

impl Pass {
    fn new(inner: &Inner, clock_len: usize) -> Pass {
        let over = inner.sections.over_shares(inner.budget_pages.load(Relaxed));
        Pass {
            budget: clock_len.min(EVICT_BATCH * 8),
            pin_reach: if inner.sections.pins_hold() {
                clock_len
            } else {
                0
            },
            over,
            share_reach: if over != 0 { clock_len } else { 0 },
        }
    }
}

/// What the clock hand does with an entry.
enum Seen {
    /// A stale entry: dropped.
    Gone,
    /// Back to the end of the clock (a second chance, held by another thread, unreadable).
    Stays,
    /// Back to the end of the clock without counting against the pass's budget (a pin's or a
    /// share's reach paid for it).
    PassedOver,
    /// To be evicted.
    Victim,
}

/// Spends one of a pass's `reach`; true if that was the last.
fn spend(reach: &mut usize) -> bool {
    *reach -= 1;
    *reach == 0
}

/// A page nothing maps in the program's view but through its lock (not mapped, and not the
/// program's own mapping): a write-protection over it changes nothing, and one that lands on it
/// after an install costs at most one write-protect fault (`serve_write_protect`).
fn is_hole(word: u64) -> bool {
    matches!(kind(word), FAR | UNTOUCHED | WRITEBACK)
}

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
        let mut staging = crate::fault::Staging::new();
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
            let wanted = self.room_wanted.swap(0, Relaxed);
            if self.local_pages() + wanted > self.budget_pages.load(Relaxed) {
                while self.local_pages() + self.margin() > self.budget_pages.load(Relaxed)
                    && !self.shutdown.load(Acquire)
                {
                    if self.evict_batch() == 0 {
                        break;
                    }
                }
            }
            // Stale frames left since the last eviction: memory held twice.
            if self.frames {
                let _section = crate::gate::section();
                self.drop_stale_frames(&[]);
            }
            // A tier over its share (the budget shrank) gives back the difference.
            if self.probation && !self.tier_has_room(0) {
                self.tier_make_room(0);
            }
            // Room to spare: bring evicted pages back before they are asked for (a batch per
            // wake, so a refill shares the store with faults).
            self.refill(&mut staging);
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
        let mut victims: Victims = Vec::with_capacity(EVICT_BATCH);
        self.take_done(&mut victims);
        self.take_from_clock(&mut victims);
        if victims.is_empty() {
            return 0;
        }
        self.evict_victims(victims)
    }

    /// Pages a stream is done with, which go first.
    fn take_done(&self, victims: &mut Victims) {
        let mut done = self.done.lock();
        while victims.len() < EVICT_BATCH {
            let Some((region, page)) = done.pop_back() else {
                break;
            };
            let word = region.table.state(page).load(Acquire);
            if region.dead.load(Acquire)
                || kind(word) != RESIDENT
                || word & (REFERENCED | INHERITED) != 0
                || self.sections.keep_of(&region.sections, page) == Keep::Pin
                || !self.readable(&region, page)
            {
                continue;
            }
            if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                victims.push((region, page, w));
            }
        }
    }

    /// Moves the clock hand until the batch is full or the pass's reach is spent, locking the
    /// victims it chooses and their cold neighbours.
    fn take_from_clock(&self, victims: &mut Victims) {
        let mut clock = self.clock.lock();
        let mut pass = Pass::new(self, clock.len());
        while victims.len() < EVICT_BATCH && pass.budget > 0 {
            pass.budget -= 1;
            let Some(entry) = clock.pop_front() else {
                break;
            };
            if stale(&entry) {
                // Gone, or an entry left by an eviction that took the page out of turn
                // (a stream's, a neighbour's): the page is on the clock elsewhere if at all.
                continue;
            }
            let (region, page) = (entry.0.clone(), entry.1);
            match self.look_at(&mut pass, &region, page) {
                Seen::Gone => {}
                Seen::Stays => clock.push_back(entry),
                Seen::PassedOver => {
                    pass.budget += 1;
                    clock.push_back(entry);
                }
                Seen::Victim => match region.table.try_lock(page, &[RESIDENT]) {
                    Some(w) => {
                        let more = EVICT_BATCH.saturating_sub(victims.len() + 1);
                        self.take_cold_neighbours(&region, page, more, victims);
                        victims.push((region, page, w));
                    }
                    None => clock.push_back(entry),
                },
            }
        }
    }

    /// What the clock hand does with page `page` of `region`: passes it by (spending a second
    /// chance, or the reach pins and shares give the pass), drops a stale entry, or takes it.
    fn look_at(&self, pass: &mut Pass, region: &RegionInner, page: usize) -> Seen {
        let s = region.table.state(page);
        let word = s.load(Acquire);
        if kind(word) == BUSY {
            // Another thread holds the page (a write fault lifting its protection, say): it
            // may stay mapped, and must stay on the clock.
            return Seen::Stays;
        }
        if kind(word) != RESIDENT || word & INHERITED != 0 {
            // A stale entry (evicted or discarded already), or a page a forked child shares
            // with its parent.
            return Seen::Gone;
        }
        // Second chances: a reference, then each chance the page's heat gave it.
        let spared = if word & REFERENCED != 0 {
            Some(word & !REFERENCED)
        } else if word & CHANCES != 0 {
            Some(word - (1 << CHANCE_SHIFT))
        } else {
            None
        };
        let over_share = pass.over != 0 && pass.over & (1 << region.sections.of(page).index()) != 0;
        if let (Some(spared), false) = (spared, over_share) {
            if s.compare_exchange(word, spared, AcqRel, Relaxed).is_ok() {
                return Seen::Stays;
            }
        }
        // Passed over for a section over its share, or kept for being pinned: each spends
        // the pass's reach for it, not its budget.
        let for_share = pass.share_reach > 0 && !over_share;
        let for_pin = !for_share
            && pass.pin_reach > 0
            && self.sections.keep_of(&region.sections, page) == Keep::Pin;
        if for_share && spend(&mut pass.share_reach) {
            self.sections.shares_give_way();
        }
        if for_pin && spend(&mut pass.pin_reach) {
            self.sections.pins_give_way();
        }
        if for_share || for_pin {
            return Seen::PassedOver;
        }
        if !self.readable(region, page) {
            // Inaccessible (PROT_NONE): it cannot be read to be saved; it stays until the
            // program opens it again.
            return Seen::Stays;
        }
        Seen::Victim
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
        if self.frames {
            self.drop_stale_frames(&victims);
        }
        let mut evicted = 0;
        // With a probation tier, the victims go to frames if the tier has room for them (made
        // by spilling its oldest), else straight to the store.
        if self.frames && (!self.probation || self.tier_make_room(victims.len())) {
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
        if self.evicts_in_spans() {
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

    /// Locks up to `max` resident neighbours of clock victim `page` that show no use and adds
    /// them to `victims`: victims then come in runs or spans, frozen or moved by one system call
    /// and one TLB shootdown where scattered victims cost one each (about a miss's worth, more
    /// when the program runs on another CPU). Their clock entries stay behind, stale (see
    /// [`stale`]).
    ///
    /// Written out in spans ([`Inner::evicts_in_spans`]), a neighbour is any resident page up
    /// to [`EVICT_REACH`] pages away, across holes, not referenced since the hand last passed
    /// (a write to a page installed clean, the one use the pager sees without a miss): its
    /// chances and heat do not count, since they only say how soon the page came back after its
    /// last eviction, and a neighbour left behind splits the span (measured, ARCHITECTURE.md). Moved as frames, only a
    /// page with no reference, chance or heat goes, one page apart (a page whose chances the
    /// hand has just used up is still warm, and went to the back of the line).
    fn take_cold_neighbours(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        max: usize,
        victims: &mut Vec<(Arc<RegionInner>, usize, u64)>,
    ) {
        let spans = self.evicts_in_spans();
        let unused = if spans {
            REFERENCED | INHERITED
        } else {
            REFERENCED | CHANCES | HEAT | INHERITED
        };
        let (max, reach) = if spans {
            (max.min(EVICT_NEIGHBOURS), EVICT_REACH)
        } else {
            (max.min(RUN_NEIGHBOURS), RUN_NEIGHBOURS)
        };
        let pages = region.table.pages();
        let mut taken = 0;
        for step in [1isize, -1] {
            let mut p = page;
            for _ in 0..reach {
                if taken == max {
                    return;
                }
                match p.checked_add_signed(step) {
                    Some(next) if next < pages => p = next,
                    _ => break,
                }
                let w = region.table.state(p).load(Acquire);
                if spans && is_hole(w) {
                    continue;
                }
                if kind(w) != RESIDENT || w & unused != 0 || !self.readable(region, p) {
                    break;
                }
                // A section kept longer than by heat keeps its pages out of others' spans.
                if self.sections.keep_of(&region.sections, p) != Keep::Normal {
                    break;
                }
                match region.table.try_lock(p, &[RESIDENT]) {
                    Some(w) => victims.push((region.clone(), p, w)),
                    None => break,
                }
                taken += 1;
            }
        }
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
            self.clock
                .lock()
                .extend(victims[cut..].iter().map(|(r, p, _)| clock_entry(r, *p)));
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
        self.resident.fetch_sub(run.len(), Relaxed);
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
    use crate::region_inner::stale;
    use crate::table::*;
    use crate::testkit::*;
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
        while inner(pager).clock.lock().len() < pages.len() {
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
        if !inner(&pager).frames {
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
        let clock = i.clock.lock();
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
