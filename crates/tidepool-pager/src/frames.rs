//! Frames: with [`crate::Config::in_process_frames`], far pages stay in this process as page
//! frames in a shadow mapping beside each region, moved out with UFFDIO_MOVE (a page-table
//! change, no copy) and copied back in with UFFDIO_COPY. Pages the kernel will not move take
//! the copying path.
//!
//! Why copy in (issue 55, item 3): a move takes the page out of the shadow's page table, which
//! flushes its TLB entry on every CPU running a thread of the process, one interrupt to each
//! per page, and the write-back thread compresses on the other CPU. A copy into a missing page
//! flushes nothing. Measured on the 2-vCPU VM, one CPU, fault to wake-up: UFFDIO_COPY
//! 5.5-5.7 us, UFFDIO_MOVE 6.9 us (`ZEROPAGE` 4.5). The frame a copy leaves behind is stale:
//! the page says so ([`STALE_FRAME`]) and sits on the pager's `stale` list until the next
//! eviction drops the whole list in one vectored discard, one flush for all of them (or the
//! page moves out again, which drops its own first). Out, a move stays: a copy out would
//! need the page write-protected first, a flush of its own per run.

use crate::buffer::StoreJob;
use crate::pager::{hash_page, is_zero_page, Inner, RegionInner};
use crate::stats::Counters;
use crate::sys::{self, page_bytes, PAGE};
use crate::table::{
    kind, BUSY, DIRTY, FAR, FAR_VALID, FRAMED, HISTORY, RESIDENT, STALE_FRAME, STORE_OLD,
    UNTOUCHED, WAS_DIRTY, WP_CLEAN,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use tidepool_store::Key;

impl Inner {
    /// The new word of locked page `page` (word `w`), just moved out to its frame, and whether
    /// the frame holds only zeros (the caller drops it before releasing the page: once
    /// released, the page could come back and go out again into the same frame, which a late
    /// drop would destroy).
    pub(crate) fn framed(
        &self,
        region: &RegionInner,
        page: usize,
        w: u64,
        seq: u32,
        removes: &mut Vec<Key>,
    ) -> (u64, bool) {
        region.table.evicted_at(page).store(seq, Relaxed);
        let history = (w & HISTORY) | if w & DIRTY != 0 { WAS_DIRTY } else { 0 };
        // Checked in the shadow, where nobody writes: zero pages are never kept.
        // SAFETY: the page was just moved there, so the frame exists (possibly the shared zero
        // page), and only this thread, holding the page's lock, uses it.
        let bytes = unsafe { page_bytes(region.shadow_addr(page)) };
        let far_valid = w & FAR_VALID != 0;
        if is_zero_page(bytes) {
            if far_valid {
                self.tags.drop_copy(region.key(page), removes);
            }
            return (UNTOUCHED | history, true);
        }
        if self.frames.probation().is_none() {
            if far_valid {
                // The frame is the far copy now.
                removes.push(region.key(page));
            }
            return (FAR | FRAMED | history, false);
        }
        // A probation frame: the store keeps what it has, and the word says what that is.
        let copy = if !far_valid {
            0
        } else if w & WP_CLEAN != 0 {
            FAR_VALID
        } else if w & DIRTY == 0 && hash_page(bytes) == region.table.hash(page).load(Relaxed) {
            // Installed writable on a guess, and not written.
            FAR_VALID
        } else if region.table.tag(page).load(Relaxed) == self.tags.current() {
            STORE_OLD
        } else {
            // The old copy went to a process forked since: kept for it.
            self.tags.drop_copy(region.key(page), removes);
            0
        };
        (FAR | FRAMED | copy | history, false)
    }

    /// The word of framed page `page` (word `w`), about to be copied in for a fault that wrote
    /// (`write`), or for the prefetcher (neither). A page whose frame the store holds comes back
    /// writable, hashed here, while nobody can write its frame, so that eviction can tell
    /// whether it was written. (Pages came back by UFFDIO_MOVE, which maps them writable, when
    /// this was written; a copy could install them write-protected instead.)
    pub(crate) fn unframed(&self, region: &RegionInner, page: usize, w: u64, write: bool) -> u64 {
        let dirty = if write { DIRTY } else { 0 };
        if self.frames.probation().is_none() {
            return RESIDENT | dirty | (w & HISTORY);
        }
        if w & FAR_VALID != 0 {
            if !write {
                // SAFETY: a FRAMED page has its frame in the shadow, which only the pager
                // touches, and the caller holds the page's lock.
                let bytes = unsafe { page_bytes(region.shadow_addr(page)) };
                region.table.hash(page).store(hash_page(bytes), Relaxed);
            }
            RESIDENT | FAR_VALID | dirty | (w & HISTORY)
        } else if w & STORE_OLD != 0 {
            RESIDENT | FAR_VALID | DIRTY | (w & HISTORY)
        } else {
            RESIDENT | dirty | (w & HISTORY)
        }
    }

    /// Copies locked framed pages `[first, first + count)` of `region` in from their frames,
    /// waking whoever waits there if `wake`; the frames stay, stale, on the `stale` list. The
    /// caller's new words carry [`STALE_FRAME`].
    pub(crate) fn copy_in_frames(
        &self,
        region: &Arc<RegionInner>,
        first: usize,
        count: usize,
        wake: bool,
    ) {
        // SAFETY: FRAMED pages have their frames in the shadow, which only the pager touches,
        // and the caller holds their locks: nobody moves or drops them meanwhile.
        let frames = unsafe {
            std::slice::from_raw_parts(region.shadow_addr(first) as *const u8, count * PAGE)
        };
        self.install(region.addr(first), frames, false, wake);
        Counters::add(&self.counters.copied_in, count as u64);
        self.frames
            .stale
            .lock()
            .extend((first..first + count).map(|p| (region.clone(), p)));
    }

    /// Drops the stale frames of the `stale` list and those of `victims` (locked, about to be
    /// evicted) in one vectored discard: one TLB flush for all of them. A listed page another
    /// thread holds stays listed; one no longer resident has no stale frame (its frame, if
    /// any, is its contents).
    pub(crate) fn drop_stale_frames(&self, victims: &[(Arc<RegionInner>, usize, u64)]) {
        let listed = std::mem::take(&mut *self.frames.stale.lock());
        if listed.is_empty() && victims.iter().all(|v| v.2 & STALE_FRAME == 0) {
            return;
        }
        let mut ranges: Vec<(usize, usize)> = victims
            .iter()
            .filter(|v| v.2 & STALE_FRAME != 0)
            .map(|(r, p, _)| (r.shadow_addr(*p), PAGE))
            .collect();
        let mut locked = Vec::with_capacity(listed.len());
        let mut held = Vec::new();
        for (region, page) in listed {
            if region.dead.load(Acquire) {
                continue;
            }
            let w = region.table.state(page).load(Acquire);
            match kind(w) {
                RESIDENT if w & STALE_FRAME != 0 => {}
                // Perhaps the page's own eviction, which drops its frame (then the page is no
                // longer resident), or a write fault (then it is still stale).
                BUSY => {
                    held.push((region, page));
                    continue;
                }
                _ => continue,
            }
            match region.table.try_lock(page, &[RESIDENT]) {
                Some(w) if w & STALE_FRAME != 0 => {
                    ranges.push((region.shadow_addr(page), PAGE));
                    locked.push((region, page, w));
                }
                Some(w) => {
                    if region.table.unlock(page, w) {
                        self.uffd.wake(region.addr(page), PAGE);
                    }
                }
                None => held.push((region, page)),
            }
        }
        ranges.sort_unstable();
        ranges.dedup();
        // Neighbouring frames (a prefetched run) in one range.
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for (addr, len) in ranges {
            match merged.last_mut() {
                Some((a, l)) if *a + *l == addr => *l += len,
                _ => merged.push((addr, len)),
            }
        }
        sys::discard_many(&merged);
        for (region, page, w) in locked {
            if region.table.unlock(page, w & !STALE_FRAME) {
                self.uffd.wake(region.addr(page), PAGE);
            }
        }
        if !held.is_empty() {
            self.frames.stale.lock().extend(held);
        }
    }

    /// Moves pages `[first, first + count)` of a framed region in from its shadow, waking
    /// whoever waits there if `wake`. A page the kernel will not move (shared with a forked
    /// child, EBUSY) is copied instead and its frame dropped.
    pub(crate) fn move_in(&self, region: &RegionInner, first: usize, count: usize, wake: bool) {
        let (mut p, end) = (first, first + count);
        while p < end {
            let (n, err) = self.uffd.move_pages(
                region.addr(p),
                region.shadow_addr(p),
                (end - p) * PAGE,
                wake,
            );
            #[cfg(feature = "trace")]
            crate::trace::move_call(
                region.base,
                region.shadow_addr(0),
                p,
                end - p,
                n,
                &err,
                true,
            );
            p += n / PAGE;
            let Some(e) = err else { break };
            crate::tr!(p, "move_in_err", e.raw_os_error().unwrap_or(0));
            match e.raw_os_error() {
                Some(libc::EBUSY) | Some(libc::EINVAL) => {
                    // SAFETY: a FRAMED page has a frame in the shadow, which only the pager
                    // touches, and only where it has frames.
                    let bytes = unsafe { page_bytes(region.shadow_addr(p)) };
                    self.install(region.addr(p), bytes, false, wake);
                    sys::discard(region.shadow_addr(p), PAGE);
                    p += 1;
                }
                // The process is exiting.
                Some(libc::ESRCH) => return,
                // A page already in the region (EEXIST) or no frame (ENOENT): if the frame is
                // in the region and not in the shadow, the kernel moved it without a request.
                Some(libc::EEXIST) | Some(libc::ENOENT) if self.adopt_moved(region, p, true) => {
                    if wake {
                        self.uffd.wake(region.addr(p), PAGE);
                    }
                    p += 1;
                }
                _ => {
                    #[cfg(feature = "trace")]
                    eprintln!(
                        "region {}\nshadow {}\npage {p}:\n{}calls nearby:\n{}",
                        crate::trace::page_report(region.addr(p)),
                        crate::trace::page_report(region.shadow_addr(p)),
                        crate::trace::dump_page(p),
                        crate::trace::dump_calls(p.saturating_sub(64), p + 64)
                    );
                    self.fatal("moving a page in from its frame", &e)
                }
            }
        }
    }

    /// A move found a framed page where it should not be: moving in (`into_region`), a page
    /// already in the region or no frame in the shadow; moving out, a frame already in the
    /// shadow. If the page is on the side the move was to make it and not on the other, the
    /// kernel already moved it without a request: true, and it counts as moved. Seen on Linux
    /// 6.18 with UFFDIO_MOVE under CPU contention, about once in a hundred runs of the
    /// verification workload; how it happens is not known. False otherwise (a genuine
    /// error, or a stale frame).
    pub(crate) fn adopt_moved(&self, region: &RegionInner, page: usize, into_region: bool) -> bool {
        let in_region = sys::is_mapped(region.addr(page));
        let in_shadow = sys::is_mapped(region.shadow_addr(page));
        let adopted = if into_region {
            in_region && !in_shadow
        } else {
            in_shadow && !in_region
        };
        if adopted {
            crate::tr!(page, "adopt", into_region);
            Counters::add(&self.counters.frames_repaired, 1);
        }
        adopted
    }

    /// Counts a page that just became a probation frame in the tier, before its lock is
    /// released: once it is, another thread may touch the frame and take it out of the count
    /// (which must not go below zero, even for a moment: the tier's room is decided from it, and
    /// a forked child's copy starts from it). Its place in the tier's list comes with the run's.
    fn tier_counted(
        &self,
        framed: &mut Vec<(Arc<RegionInner>, usize, u32)>,
        region: &Arc<RegionInner>,
        page: usize,
        seq: u32,
    ) {
        if let Some(tier) = self.frames.probation() {
            tier.held.fetch_add(1, Relaxed);
            framed.push((region.clone(), page, seq));
        }
    }

    /// Evicts a run of consecutive locked pages of a framed region by moving them into its
    /// shadow; pages the kernel will not move (shared with a forked child) go to `refused`,
    /// for [`Inner::copy_out`].
    pub(crate) fn move_out(
        &self,
        run: &[(Arc<RegionInner>, usize, u64)],
        refused: &mut Vec<(Arc<RegionInner>, usize, u64)>,
    ) {
        let region = &run[0].0;
        let first = run[0].1;
        let mut m = MoveOut {
            seq: self.evict_seq.fetch_add(run.len() as u32, Relaxed).max(1),
            removes: Vec::new(),
            zero_count: 0,
            waiters: false,
            framed: Vec::new(),
            moved: 0,
        };
        let mut i = 0;
        while i < run.len() {
            let p = first + i;
            let (n, err) = self.uffd.move_pages(
                region.shadow_addr(p),
                region.addr(p),
                (run.len() - i) * PAGE,
                false,
            );
            #[cfg(feature = "trace")]
            crate::trace::move_call(
                region.base,
                region.shadow_addr(0),
                p,
                run.len() - i,
                n,
                &err,
                false,
            );
            self.moved_out(region, &run[i..i + n / PAGE], &mut m);
            i += n / PAGE;
            let Some(e) = err else { break };
            match self.move_refused(&run[i], &e, &mut m) {
                Refusal::Next => {}
                Refusal::Copy => refused.push(run[i].clone()),
                Refusal::Retry => continue,
                Refusal::Exiting => {
                    for (_, page, w) in &run[i..] {
                        let _ = region.table.unlock(*page, *w);
                    }
                    self.uffd.wake(region.addr(first), run.len() * PAGE);
                    return;
                }
            }
            i += 1;
        }
        self.moved_out_done(region, first, run.len(), m);
    }

    /// Publishes pages `done` of `region`, just moved into its shadow, as framed (or untouched,
    /// if they read as zeros).
    fn moved_out(
        &self,
        region: &Arc<RegionInner>,
        done: &[(Arc<RegionInner>, usize, u64)],
        m: &mut MoveOut,
    ) {
        let mut zeros = Vec::new();
        let mut new_words = Vec::with_capacity(done.len());
        for (_, page, w) in done {
            let (new, zero) = self.framed(region, *page, *w, m.seq, &mut m.removes);
            if zero {
                zeros.push((region.shadow_addr(*page), PAGE));
            }
            new_words.push(new);
        }
        sys::discard_many(&zeros);
        m.zero_count += zeros.len() as u64;
        self.queue_removes(&mut m.removes);
        for ((_, page, _), new) in done.iter().zip(new_words) {
            crate::tr!(*page, "move_out", new);
            Counters::add(&self.section_counts(region, *page).evicted, 1);
            self.count_resident(region, *page, -1);
            if new & FRAMED != 0 {
                self.tier_counted(&mut m.framed, region, *page, m.seq);
            }
            m.waiters |= region.table.unlock(*page, new);
        }
        m.moved += done.len() as u64;
    }

    /// What to do with the page the kernel refused to move out with error `e`.
    fn move_refused(
        &self,
        (region, page, w): &(Arc<RegionInner>, usize, u64),
        e: &std::io::Error,
        m: &mut MoveOut,
    ) -> Refusal {
        let (page, w) = (*page, *w);
        crate::tr!(page, "move_out_err", e.raw_os_error().unwrap_or(0));
        match e.raw_os_error() {
            // Shared with a forked child (EBUSY), or in a mapping the program made read-only
            // (EINVAL): the copying path takes it.
            Some(libc::EBUSY) | Some(libc::EINVAL) => Refusal::Copy,
            // No page there: the program dropped it behind our back (a direct MADV_DONTNEED
            // system call), so it reads as zeros.
            Some(libc::ENOENT) => {
                if w & FAR_VALID != 0 {
                    m.removes.push(region.key(page));
                    self.queue_removes(&mut m.removes);
                }
                self.budget.resident.fetch_sub(1, Relaxed);
                self.count_resident(region, page, -1);
                m.waiters |= region.table.unlock(page, UNTOUCHED);
                Refusal::Next
            }
            // A frame already in the shadow. If the page is not in the region, the kernel
            // moved it there without a request: it is the page, keep it.
            Some(libc::EEXIST) if self.adopt_moved(region, page, false) => {
                let (new, zero) = self.framed(region, page, w, m.seq, &mut m.removes);
                if zero {
                    sys::discard(region.shadow_addr(page), PAGE);
                    m.zero_count += 1;
                } else {
                    self.tier_counted(&mut m.framed, region, page, m.seq);
                }
                self.queue_removes(&mut m.removes);
                m.moved += 1;
                Counters::add(&self.section_counts(region, page).evicted, 1);
                self.count_resident(region, page, -1);
                m.waiters |= region.table.unlock(page, new);
                Refusal::Next
            }
            // Both hold a page: the shadow's is stale (the region's is the one the program
            // used). Drop it and try again.
            Some(libc::EEXIST) => {
                sys::discard(region.shadow_addr(page), PAGE);
                Refusal::Retry
            }
            // The process is exiting.
            Some(libc::ESRCH) => Refusal::Exiting,
            _ => self.fatal("moving a page out to its frame", e),
        }
    }

    /// Queues `removes` for the store, before the pages they concern are released (see
    /// `release_span`).
    fn queue_removes(&self, removes: &mut Vec<Key>) {
        if !removes.is_empty() {
            self.jobs.send(StoreJob::Remove(std::mem::take(removes)));
        }
    }

    /// Counts a finished `move_out` of the `len` pages from `first` of `region`, and wakes the
    /// threads that faulted on them meanwhile.
    fn moved_out_done(&self, region: &RegionInner, first: usize, len: usize, m: MoveOut) {
        self.budget.resident.fetch_sub(m.moved as usize, Relaxed);
        if let Some(tier) = self.frames.probation() {
            tier.fifo.lock().extend(m.framed);
        }
        Counters::add(&self.counters.evicted_zero, m.zero_count);
        if m.waiters {
            // Threads that faulted on the pages meanwhile retry now and find them framed.
            self.uffd.wake(region.addr(first), len * PAGE);
        }
        Counters::add(&self.counters.evicted, m.moved);
        Counters::add(&self.counters.moved_out, m.moved);
        if self.frames.probation().is_none() {
            // Into the in-process backend; a probation tier writes when it spills.
            Counters::add(&self.counters.bytes_written, m.moved * PAGE as u64);
        }
    }
}

/// What a `move_out` has done so far.
struct MoveOut {
    /// The eviction sequence number of the run's pages.
    seq: u32,
    /// Store copies to remove, queued before their pages are released.
    removes: Vec<Key>,
    /// Pages that read as zeros (dropped, not framed).
    zero_count: u64,
    /// A thread waits on one of the pages released.
    waiters: bool,
    /// Probation frames made, for the tier's list.
    framed: Vec<(Arc<RegionInner>, usize, u32)>,
    /// Pages moved out.
    moved: u64,
}

/// What happens to a page the kernel refused to move out.
enum Refusal {
    /// Dealt with; go on with the next page.
    Next,
    /// The copying path takes it.
    Copy,
    /// Move it again.
    Retry,
    /// The process is exiting: stop.
    Exiting,
}

#[cfg(test)]
mod tests {
    use crate::sys::PAGE;
    use crate::table::*;
    use crate::testkit::*;

    #[test]
    fn a_framed_page_moves_out_and_back_without_a_store_write() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let (pager, mut region) = pager(store.clone(), true, 8);
        fill(&mut region, 1, 0xc3);
        fill(&mut region, 2, 0);
        evict_all(&pager, &region);
        let w = word(&region, 1);
        assert!(kind(w) == FAR && w & FRAMED != 0, "{w:#x}");
        assert_eq!(
            kind(word(&region, 2)),
            UNTOUCHED,
            "a zero frame is not kept"
        );
        assert!(holds(&region, 1, 0xc3));
        assert!(store.log.lock().is_empty(), "{:?}", store.log.lock());
        assert!(pager.stats().moved_out >= 2);
    }

    /// A page copied back from its frame leaves the frame behind, stale, flagged on the page;
    /// dropping the stale frames unmaps it and clears the flag, and a page written since goes
    /// out again with its new bytes, never the stale ones.
    #[test]
    fn a_stale_frame_is_dropped_and_never_taken_for_the_page() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), true, 8);
        let r = region_inner(&region).clone();
        for round in 0..3u8 {
            fill(&mut region, 1, 0x10 + round);
            evict_all(&pager, &region);
            assert!(holds(&region, 1, 0x10 + round), "round {round}");
            let w = word(&region, 1);
            assert_eq!(kind(w), RESIDENT, "{w:#x}");
            // The evictor may have dropped it already (or may now): once the flag is gone,
            // so is the frame.
            if w & STALE_FRAME == 0 {
                assert!(!crate::sys::is_mapped(r.shadow_addr(1)), "{w:#x}");
            }
            if round == 1 {
                let _s = crate::gate::section();
                inner(&pager).drop_stale_frames(&[]);
                assert_eq!(word(&region, 1) & STALE_FRAME, 0);
                assert!(!crate::sys::is_mapped(r.shadow_addr(1)));
            }
        }
        evict_all(&pager, &region);
        assert!(holds(&region, 1, 0x12));
        let s = pager.stats();
        assert!(s.copied_in >= 1, "{s:?}");
        assert_eq!(s.frames_repaired, 0, "{s:?}");
    }

    /// A page copied back from its frame and then dropped by the program behind the pager's
    /// back (a direct MADV_DONTNEED) reads as zeros: its stale frame is not taken for it.
    #[test]
    fn a_page_dropped_behind_the_pagers_back_never_comes_back_from_its_stale_frame() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, mut region) = pager(Recorder::new(), true, 8);
        fill(&mut region, 2, 0x77);
        evict_all(&pager, &region);
        assert!(holds(&region, 2, 0x77));
        let addr = region_inner(&region).addr(2);
        // What a direct madvise system call does: the pager does not see it.
        crate::sys::discard(addr, PAGE);
        assert!(holds(&region, 2, 0), "the page reads as zeros");
        assert_eq!(pager.stats().frames_repaired, 0);
    }
}
