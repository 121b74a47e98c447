//! Fault service: what each kind of missing fault installs, first writes to write-protected
//! pages, and the stride prefetcher's windows, mapped by the same handler right after it woke
//! the faulting thread. The handler threads that call it are in `handler.rs`.

use crate::buffer::StoreJob;
use crate::pager::{hash_page, Inner, RegionInner, ZERO_PAGE};
use crate::prefetcher::{self, Guess};
use crate::sections::{Keep, Prefetch};
use crate::staging::{Staging, PREFETCH_BATCH};
use crate::stats::Counters;
use crate::sys::{Fault, PAGE};
use crate::table::{
    kind, CHANCES, CHANCE_SHIFT, DIRTY, FAR, FAR_VALID, FRAMED, HEAT, HEAT_SHIFT, HISTORY,
    RESIDENT, SLOT_SHIFT, STALE_FRAME, UNTOUCHED, WAS_DIRTY, WP_CLEAN, WRITEBACK,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::ghost_bucket;
use tidepool_store::Key;

/// What a handler does after installing a demand-faulted page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FollowUp {
    /// Evict if over budget, and let the stride detector plan a prefetch.
    Full,
    /// Nothing: the page goes in and the thread is woken. While a fork is under way (nothing
    /// may be evicted that the forking thread just touched for its child) and while the pager's
    /// own threads start.
    InstallOnly,
}

impl Inner {
    pub(crate) fn serve(&self, f: Fault, staging: &mut Staging, follow_up: FollowUp) {
        let taken = Instant::now();
        let Some(region) = self.region_of(f.page_addr) else {
            self.uffd.wake(f.page_addr, PAGE);
            return;
        };
        let page = (f.page_addr - region.base) / PAGE;
        if f.wp {
            self.serve_write_protect(&region, page);
            return;
        }
        Counters::add(&self.counters.missing_faults, 1);
        Counters::add(&self.section_counts(&region, page).faults, 1);
        let word = loop {
            if let Some(w) = region
                .table
                .try_lock(page, &[UNTOUCHED, FAR, WRITEBACK, RESIDENT])
            {
                break w;
            }
            if region.table.flag_waiters(page) {
                // Another thread is moving the page and wakes the faulting thread when done.
                return;
            }
        };
        if kind(word) == RESIDENT {
            self.refill_resident(&region, page, word);
            return;
        }
        self.trace_fault(&region, page, kind(word) != UNTOUCHED);
        let (sampled, measured) = staging.probe.taken(f.tid);
        if let Some((delivery, wake)) = measured {
            self.timings.delivery_and_wake(delivery, wake);
        }
        self.install_demand(&region, page, word, f.write, staging, taken);
        if let Some(s) = sampled {
            staging.probe.woken(s);
        }
        if follow_up == FollowUp::Full {
            self.after_demand(&region, page, staging);
        }
    }

    /// Records a demand fault if [`crate::Pager::trace_faults`] asked for it.
    #[inline]
    fn trace_fault(&self, region: &RegionInner, page: usize, far: bool) {
        if let Some(t) = self.fault_trace.get() {
            t.record(far, region.sections.of(page).index() as u8, region.id, page);
        }
    }

    /// Missing faults read together on pages in the store (not framed): one store read for all
    /// of them, a round trip instead of one each. Takes them out of `faults`; the rest (and
    /// any page already being moved) are left for [`Inner::serve`].
    pub(crate) fn serve_together(&self, faults: &mut Vec<Fault>, staging: &mut Staging) {
        let taken = Instant::now();
        let _section = crate::gate::section();
        let bell = self.doorbell.addr();
        let mut batch: Vec<(Arc<RegionInner>, usize, u64, bool)> = Vec::new();
        faults.retain(|f| {
            if f.wp || f.page_addr == bell || batch.len() == PREFETCH_BATCH {
                return true;
            }
            let Some(region) = self.region_of(f.page_addr) else {
                return true;
            };
            let page = (f.page_addr - region.base) / PAGE;
            if batch
                .iter()
                .any(|(r, p, ..)| Arc::ptr_eq(r, &region) && *p == page)
            {
                // A second fault on the page: served (woken) by the first's install.
                return true;
            }
            match region.table.try_lock(page, &[FAR]) {
                Some(w) if w & FRAMED == 0 => {
                    batch.push((region, page, w, f.write));
                    false
                }
                Some(w) => {
                    if region.table.unlock(page, w) {
                        self.uffd.wake(region.addr(page), PAGE);
                    }
                    true
                }
                None => true,
            }
        });
        if batch.is_empty() {
            return;
        }
        Counters::add(&self.counters.missing_faults, batch.len() as u64);
        for (region, page, ..) in &batch {
            Counters::add(&self.section_counts(region, *page).faults, 1);
            self.trace_fault(region, *page, true);
        }
        self.fetch_from_store(&batch, staging, taken);
        for (region, page, ..) in &batch {
            self.after_demand(region, *page, staging);
        }
    }

    /// Serves missing faults on locked pages in the store (`(region, page, word before, write)`
    /// each): one store read for all of them, then each installed, its thread woken, and
    /// published.
    pub(crate) fn fetch_from_store(
        &self,
        batch: &[(Arc<RegionInner>, usize, u64, bool)],
        staging: &mut Staging,
        taken: Instant,
    ) {
        let n = batch.len() as u64;
        Counters::add(&self.counters.far_fetches, n);
        Counters::add(&self.counters.bytes_read, n * PAGE as u64);
        let keys: Vec<Key> = batch.iter().map(|(r, p, ..)| r.key(*p)).collect();
        let t = Instant::now();
        self.read_pages(&keys, staging, "reading pages");
        // The pages are locked: nobody reads or writes their keys until they are published.
        self.drop_copies(&keys, "reading pages");
        let read = t.elapsed();
        for (i, (region, page, word, write)) in batch.iter().enumerate() {
            Counters::add(&self.section_counts(region, *page).far_fetches, 1);
            let t = Instant::now();
            let new = self.install_from_store(region, *page, *word, *write, staging.page(i));
            self.timings
                .far_fetch(Some(read), t.elapsed(), taken.elapsed());
            self.publish_demand(region, *page, *word, new);
        }
    }

    /// After a demand install: eviction if the evictor fell behind, and the prefetcher's vote.
    pub(crate) fn after_demand(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        staging: &mut Staging,
    ) {
        let section = region.sections.of(page);
        let counts = self.sections.counts(section);
        let policy = self.sections.policy(section);
        let budget = self.budget.pages();
        if self.local_pages() > budget && self.follow.one_reads() {
            // One reader, on the program's CPU: it evicts itself, while the program runs on
            // (a kicked evictor would share the reader's CPU at the same idle priority, and
            // hold up its next fault for as long as a time slice).
            let t = Instant::now();
            if self.evict_batch() > 0 {
                self.timings.evicted_inline(t.elapsed());
            }
        } else if self.local_pages() > budget {
            // Every handler reads: the evictor thread does the work.
            self.kick_evictor();
            // Far over budget (the evictor is behind): reclaim here before going on.
            if self.local_pages() > budget + self.budget.margin() {
                let t = Instant::now();
                while self.local_pages() > budget + self.budget.margin() && self.evict_batch() > 0 {
                }
                self.timings.evicted_inline(t.elapsed());
            }
        }
        if policy.line > 1 {
            let n = self.fetch_line(region, page, policy.line as usize, staging);
            Counters::add(&counts.line_pages, n as u64);
        }
        let table = &region.table;
        let (guess, credited) = match policy.prefetch {
            Prefetch::Shared => prefetcher::guess(&mut *region.detector.lock(), page as i64, table),
            own => {
                let mut slot = region.section_prefetchers[section.index()].lock();
                let p = slot.get_or_insert_with(|| {
                    prefetcher::for_section(own, self.window_max, self.budget.pages())
                });
                prefetcher::guess(p.as_mut(), page as i64, table)
            }
        };
        Counters::add(&self.counters.prefetch_credited, credited);
        Counters::add(&counts.prefetch_credited, credited);
        match guess {
            Some(Guess::Window(plan)) => {
                Counters::add(&self.counters.prefetch_planned, plan.count as u64);
                Counters::add(&counts.prefetch_planned, plan.count as u64);
                if plan.behind_count > 0 {
                    self.eviction.done.note(region, &plan, self.budget.pages());
                }
                self.prefetch(region, plan, staging);
            }
            Some(Guess::Chain(chain)) => {
                let n = chain.pages().len() as u64;
                Counters::add(&self.counters.prefetch_planned, n);
                Counters::add(&counts.prefetch_planned, n);
                self.prefetch_chain(region, &chain, staging);
            }
            None => {}
        }
    }

    /// A missing fault on a page we think is mapped: either a stale event (a second thread
    /// faulted on the page before it was installed) or the program dropped the page behind our
    /// back (a direct MADV_DONTNEED system call), which reads as zeros.
    pub(crate) fn refill_resident(&self, region: &Arc<RegionInner>, page: usize, word: u64) {
        if word & STALE_FRAME != 0 {
            // The frame in the shadow is the copy the page came back from, older than what
            // the program dropped: never the page. Dropped here; the page reads as zeros.
            crate::sys::discard(region.shadow_addr(page), PAGE);
        } else if region.shadow.is_some() && self.adopt_moved(region, page, false) {
            // The kernel moved the page out to its frame without a request: bring it back.
            self.move_in(region, page, 1, true);
            // Installed with a wake-up: anyone waiting on the page is awake.
            let _ = region.table.unlock(page, word);
            return;
        }
        if self.copy_in(region.addr(page), &ZERO_PAGE, false) {
            crate::tr!(page, "refill_zero", word);
            if word & FAR_VALID != 0 {
                let mut removes = Vec::new();
                self.tags.drop_copy(region.key(page), &mut removes);
                if !removes.is_empty() {
                    self.jobs.send(StoreJob::Remove(removes));
                }
            }
            self.adopt_inherited(region, page, word);
            // Installed with a wake-up.
            let _ = region
                .table
                .unlock(page, RESIDENT | DIRTY | (word & HISTORY));
        } else {
            let _ = region.table.unlock(page, word);
            // Installed by another thread after the fault, perhaps without a wake-up (it wakes
            // only waiters it knows of).
            self.uffd.wake(region.addr(page), PAGE);
        }
    }

    /// Maps one page a thread is waiting for; `word` is its state before the lock.
    pub(crate) fn install_demand(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        word: u64,
        write: bool,
        staging: &mut Staging,
        taken: Instant,
    ) {
        let addr = region.addr(page);
        let history = word & HISTORY;
        let new = match kind(word) {
            UNTOUCHED => {
                Counters::add(&self.counters.zero_fills, 1);
                if write {
                    self.copy_in(addr, &ZERO_PAGE, false);
                    RESIDENT | DIRTY | history
                } else {
                    // The shared zero page: no memory until written; a write is a private
                    // copy the kernel makes without us, so the page's state is "unknown"
                    // and eviction hashes it.
                    match self.uffd.zeropage(addr) {
                        Ok(()) => {}
                        // Mapped already; whoever did may not have woken the thread (owners
                        // wake only waiters they know of).
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                            self.uffd.wake(addr, PAGE)
                        }
                        Err(e) => self.fatal("mapping a zero page", &e),
                    }
                    RESIDENT | history
                }
            }
            WRITEBACK => {
                Counters::add(&self.counters.writeback_hits, 1);
                let slot = (word >> SLOT_SHIFT) as u32;
                self.copy_in(addr, self.slots.bytes(slot), false);
                // The write in flight will land; the page is written again at next eviction.
                RESIDENT | DIRTY | history
            }
            _ if self.frames.in_probation(word) => {
                // Touched in the probation tier: a local hit.
                self.tier_touched(word);
                let new = self.unframed(region, page, word, write) | STALE_FRAME;
                self.copy_in_frames(region, page, 1, true);
                new
            }
            _ if word & FRAMED != 0 => {
                Counters::add(&self.counters.far_fetches, 1);
                Counters::add(&self.section_counts(region, page).far_fetches, 1);
                Counters::add(&self.counters.bytes_read, PAGE as u64);
                let t = Instant::now();
                let new = self.unframed(region, page, word, write) | STALE_FRAME;
                self.copy_in_frames(region, page, 1, true);
                self.timings.far_fetch(None, t.elapsed(), taken.elapsed());
                new
            }
            _ => {
                self.fetch_from_store(&[(region.clone(), page, word, write)], staging, taken);
                return;
            }
        };
        self.publish_demand(region, page, word, new);
    }

    /// Installs page `page` (word `word`, locked) from `data`, read from the store, waking the
    /// faulting thread; returns the page's new word.
    pub(crate) fn install_from_store(
        &self,
        region: &RegionInner,
        page: usize,
        word: u64,
        write: bool,
        data: &[u8],
    ) -> u64 {
        if self.drops_far_copies() {
            // No copy is left to be clean against: writable, and written when evicted.
            self.copy_in(region.addr(page), data, false);
            return RESIDENT | if write { DIRTY } else { 0 } | (word & HISTORY);
        }
        let predicted_write = write || word & WAS_DIRTY != 0;
        if predicted_write && !write {
            // Installed writable on a guess: eviction compares hashes to tell whether it was
            // written.
            region.table.hash(page).store(hash_page(data), Relaxed);
        }
        self.copy_in(region.addr(page), data, !predicted_write);
        let clean = if predicted_write {
            if write {
                DIRTY
            } else {
                0
            }
        } else {
            WP_CLEAN
        };
        RESIDENT | FAR_VALID | clean | (word & HISTORY)
    }

    /// Publishes a page a demand fault installed (`word` its word before, `new` after the
    /// install): its heat, the budget's count and the clock.
    pub(crate) fn publish_demand(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        word: u64,
        new: u64,
    ) {
        let referenced = self.recently_evicted(region, page);
        if self.frames.is_far(word) {
            if self.evicted_within(region, page, 8) {
                Counters::add(&self.counters.early_refetches, 1);
            }
            // A ghost hit: how many bytes were evicted after this page.
            let at = region.table.evicted_at(page).load(Relaxed);
            if at != 0 {
                let after = self.evict_seq.load(Relaxed).wrapping_sub(at) as u64 * PAGE as u64;
                let k = ghost_bucket(after);
                Counters::add(&self.counters.ghost_fetches[k], 1);
                Counters::add(&self.section_counts(region, page).refetched[k], 1);
            }
        }
        // A page fetched again soon after its eviction heats up, one fetched late cools
        // down; the hotter, the more passes of the clock hand it survives.
        let heat = (new & HEAT) >> HEAT_SHIFT;
        let heat = if referenced {
            (heat + 1).min(3)
        } else {
            heat / 2
        };
        // A section kept high starts every page with the hottest page's chances.
        let chances = match self.sections.keep_of(&region.sections, page) {
            Keep::Normal => heat,
            _ => 3,
        };
        let new = (new & !(HEAT | CHANCES)) | (heat << HEAT_SHIFT) | (chances << CHANCE_SHIFT);
        self.budget.resident.fetch_add(1, Relaxed);
        self.count_resident(region, page, 1);
        region.note_touched(page);
        // Installed with a wake-up (before this): anyone waiting on the page is awake.
        let _ = region.table.unlock(page, new);
        self.eviction.clock.push(region, page);
    }

    /// Reads whole pages from the store into the staging buffer; a missing or short page is
    /// fatal (the program would read garbage).
    pub(crate) fn read_pages(&self, keys: &[Key], staging: &mut Staging, what: &str) {
        let Staging { buf, lens, .. } = staging;
        let read = self.activity.during(
            crate::activity::Doing::Store,
            keys.first().copied().unwrap_or(0),
            0,
            || self.store.read_many_into(keys, PAGE, buf, lens),
        );
        if let Err(e) = read {
            self.fatal(what, &e);
        }
        for len in &lens[..keys.len()] {
            match len {
                Some(PAGE) => {}
                Some(n) => self.fatal(
                    what,
                    &format!("the store returned {n} bytes for a 4096-byte page"),
                ),
                None => self.fatal(what, &"the store lost a page"),
            }
        }
    }

    /// Removes the far copies of pages just read (locked), under
    /// [`crate::Config::drop_far_copies`].
    pub(crate) fn drop_copies(&self, keys: &[Key], what: &str) {
        if self.drops_far_copies() && !keys.is_empty() {
            if let Err(e) = self.store.remove_many(keys) {
                self.fatal(what, &e);
            }
        }
    }

    /// Installs a page; false if it was already present (EEXIST, left as it is) or the range
    /// is gone.
    pub(crate) fn copy_in(&self, addr: usize, src: &[u8], write_protect: bool) -> bool {
        self.install(addr, src, write_protect, true) == src.len() / PAGE
    }

    /// Installs consecutive pages with as few UFFDIO_COPY calls as the kernel allows, waking
    /// nobody if not `wake`; returns how many were installed. A page already present (EEXIST)
    /// is left as it is and skipped.
    pub(crate) fn install(
        &self,
        addr: usize,
        src: &[u8],
        write_protect: bool,
        wake: bool,
    ) -> usize {
        let (mut done, mut skipped) = (0, 0);
        // One call per run, unless a run turns out to cross mappings (the program split the
        // region with mprotect or madvise): page by page from there.
        let mut step = src.len();
        while done < src.len() {
            let end = (done + step).min(src.len());
            let r = self
                .uffd
                .copy(addr + done, &src[done..end], write_protect, wake);
            #[cfg(feature = "trace")]
            if let Some(region) = self.region_of(addr) {
                let (ok, err) = match &r {
                    Ok(n) => (n / PAGE, None),
                    Err(e) => (0, Some(e)),
                };
                let arg = crate::trace::call_arg(false, (end - done) / PAGE, ok, err);
                crate::trace::event((addr + done - region.base) / PAGE, "copy_call", arg);
            }
            match r {
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    done += PAGE;
                    skipped += 1;
                }
                // UFFDIO_COPY wants its range within one mapping.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && end - done > PAGE => {
                    step = PAGE;
                }
                // This page is not mapped (the program is unmapping it): nothing to install.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    done += PAGE;
                    skipped += 1;
                }
                // The process is exiting.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return done / PAGE - skipped,
                Err(e) => self.fatal("installing a page", &e),
            }
        }
        done / PAGE - skipped
    }

    /// A page evicted within the last half budget of evictions that is wanted again is hot.
    pub(crate) fn recently_evicted(&self, region: &RegionInner, page: usize) -> bool {
        self.evicted_within(region, page, 2)
    }

    /// Whether the page was evicted less than a `part`th of a budget's evictions ago.
    pub(crate) fn evicted_within(&self, region: &RegionInner, page: usize, part: usize) -> bool {
        let at = region.table.evicted_at(page).load(Relaxed);
        at != 0
            && self.evict_seq.load(Relaxed).wrapping_sub(at) as usize <= self.budget.pages() / part
    }

    /// Makes room for `pages` more pages under the budget, evicting on this thread (a hand-off
    /// to the evictor costs two context switches and, if it runs on another CPU, a slow wake-up);
    /// false if there is none to be had.
    pub(crate) fn make_room(&self, pages: usize) -> bool {
        for _ in 0..10 {
            while self.local_pages() + pages > self.budget.pages() {
                if self.evict_batch() == 0 {
                    break;
                }
            }
            if self.local_pages() + pages <= self.budget.pages() {
                return true;
            }
            // Everything evictable is locked by others right now.
            self.budget.room_wanted.fetch_max(pages, Relaxed);
            self.kick_evictor();
            std::thread::sleep(Duration::from_micros(100));
            if self.shutdown.load(Acquire) {
                return false;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use crate::table::*;
    use crate::testkit::*;

    #[test]
    fn a_read_maps_the_zero_page_and_a_write_a_dirty_one() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 16);
        assert_eq!(region.as_slice()[0], 0);
        let w = word(&region, 0);
        assert_eq!(kind(w), RESIDENT);
        assert_eq!(w & DIRTY, 0, "a read does not dirty");
        region.as_mut_slice()[crate::PAGE] = 7;
        assert_ne!(word(&region, 1) & DIRTY, 0);
        assert_eq!(pager.stats().zero_fills, 2);
    }

    #[test]
    fn a_page_fetched_for_reading_is_clean_until_its_first_write() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 16);
        fill(&mut region, 3, 0x5a);
        evict_all(&pager, &region);
        landed(&region, 3);
        // Written last time: installed writable on the guess that it will be again, hashed.
        assert!(holds(&region, 3, 0x5a), "read back from the store");
        let w = word(&region, 3);
        assert!(w & WP_CLEAN == 0 && w & FAR_VALID != 0, "{w:#x}");
        // Not written this time: the hash says clean, and the guess is dropped.
        let written = pager.stats().written_back;
        evict_all(&pager, &region);
        assert_eq!(kind(word(&region, 3)), FAR);
        assert_eq!(
            pager.stats().written_back,
            written,
            "a clean page is not written"
        );
        assert!(holds(&region, 3, 0x5a));
        assert_ne!(word(&region, 3) & WP_CLEAN, 0, "installed write-protected");
        let before = pager.stats().wp_faults;
        region.as_mut_slice()[3 * crate::PAGE] = 1;
        assert_eq!(pager.stats().wp_faults, before + 1);
        let w = word(&region, 3);
        assert!(w & DIRTY != 0 && w & WP_CLEAN == 0, "{w:#x}");
    }

    #[test]
    fn a_page_read_back_soon_after_its_eviction_counts_as_an_early_refetch() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), false, 16);
        fill(&mut region, 0, 1);
        fill(&mut region, 1, 2);
        assert_eq!(
            pager.stats().early_refetches,
            0,
            "first touches are not refetches"
        );
        evict_all(&pager, &region);
        landed(&region, 0);
        landed(&region, 1);
        assert!(holds(&region, 0, 1));
        // The reader is woken by the install, before the handler counts and publishes the
        // page (and unlocks it): wait for that.
        word(&region, 0);
        let s = pager.stats();
        assert_eq!(s.far_fetches, 1);
        // Two evictions ago, of a budget of thousands of pages: an LRU would have kept it.
        assert_eq!(s.early_refetches, 1);
        assert!(
            s.to_string()
                .contains("1 far reads of pages evicted within"),
            "{s}"
        );
    }

    #[test]
    fn a_page_dropped_behind_the_pagers_back_reads_zeros() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (_pager, mut region) = pager(Recorder::new(), false, 16);
        fill(&mut region, 2, 9);
        crate::sys::discard(region.as_ptr() as usize + 2 * crate::PAGE, crate::PAGE);
        assert!(holds(&region, 2, 0));
        assert_eq!(kind(word(&region, 2)), RESIDENT);
    }
}
