//! Pages fetched before they are asked for: a detector's plan (`prefetch.rs`) or a section's
//! line, read from the store in batches and installed in runs.

use crate::pager::{hash_page, Inner, RegionInner};
use crate::prefetch::Plan;
use crate::staging::{Staging, PREFETCH_BATCH};
use crate::stats::Counters;
use crate::successor::Chain;
use crate::sys::PAGE;
use crate::table::{
    kind, FAR, FAR_VALID, FRAMED, HISTORY, PREFETCHED, RESIDENT, STALE_FRAME, UNTOUCHED, WAS_DIRTY,
    WP_CLEAN,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Instant;
use tidepool_store::Key;

impl Inner {
    pub(crate) fn prefetch(&self, region: &Arc<RegionInner>, plan: Plan, staging: &mut Staging) {
        self.prefetch_from(
            region,
            plan_pages(&plan),
            plan.trigger,
            staging,
            &[FAR, UNTOUCHED],
        );
    }

    /// Fetches the far pages of a successor chain (`successor.rs`), in its order.
    pub(crate) fn prefetch_chain(
        &self,
        region: &Arc<RegionInner>,
        chain: &Chain,
        staging: &mut Staging,
    ) {
        let pages = chain.pages().iter().copied();
        self.prefetch_from(region, pages, chain.trigger, staging, &[FAR]);
    }

    /// Reads along, after a miss on `page`, the other pages of its aligned block of `line`
    /// that are in far memory (the section's line, [`crate::Policy::line`]); returns how many.
    pub(crate) fn fetch_line(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        line: usize,
        staging: &mut Staging,
    ) -> usize {
        let start = page & !(line - 1);
        let far = (start..(start + line).min(region.table.pages()))
            .any(|p| p != page && kind(region.table.state(p).load(Relaxed)) == FAR);
        if !far {
            return 0;
        }
        let plan = Plan {
            start: start as i64,
            stride: 1,
            count: line as u32,
            trigger: page as i64,
            behind_start: 0,
            behind_count: 0,
        };
        self.prefetch_from(region, plan_pages(&plan), plan.trigger, staging, &[FAR])
    }

    /// Installs the pages of `planned` whose state is one of `from` (all but `trigger`);
    /// returns how many.
    fn prefetch_from(
        &self,
        region: &Arc<RegionInner>,
        mut planned: impl ExactSizeIterator<Item = i64>,
        trigger: i64,
        staging: &mut Staging,
        from: &[u64],
    ) -> usize {
        let pages = region.table.pages() as i64;
        let mut installed = 0;
        let mut batch: Vec<(usize, u64)> = Vec::with_capacity(PREFETCH_BATCH);
        while planned.len() > 0 {
            // Never prefetch past the budget: that would evict pages to make room for guesses.
            batch.clear();
            while batch.len() < PREFETCH_BATCH {
                let Some(p) = planned.next() else {
                    break;
                };
                if p < 0 || p >= pages || p == trigger {
                    continue;
                }
                match region.table.try_lock(p as usize, from) {
                    Some(w) => batch.push((p as usize, w)),
                    None => Counters::add(&self.counters.prefetch_passed, 1),
                }
            }
            if batch.is_empty() {
                continue;
            }
            if !self.make_room(batch.len()) {
                // The evictor cannot keep up: drop the rest of the plan.
                for &(p, w) in &batch {
                    let _ = region.table.unlock(p, w);
                    // A thread that faulted meanwhile found the page BUSY and waits for us.
                    self.uffd.wake(region.addr(p), PAGE);
                }
                let rest = planned.len() + batch.len();
                Counters::add(&self.counters.prefetch_dropped, rest as u64);
                return installed;
            }
            let ghosts = self.prefetch_ghosts(region, &batch);
            let t = Instant::now();
            self.install_prefetched(region, &batch, staging);
            self.count_prefetch_misses(&ghosts, t.elapsed());
            Counters::add(&self.counters.prefetched, batch.len() as u64);
            installed += batch.len();
            if self.local_pages() > self.budget.pages() {
                self.kick_evictor();
            }
        }
        installed
    }

    /// Installs the locked pages of `batch` (index, word before the lock) of `region` as
    /// prefetched pages: far ones read in one call, fresh ones zero-filled, framed ones moved
    /// back; then publishes them and wakes any thread waiting on one.
    pub(crate) fn install_prefetched(
        &self,
        region: &Arc<RegionInner>,
        batch: &[(usize, u64)],
        staging: &mut Staging,
    ) {
        debug_assert!(batch.len() <= PREFETCH_BATCH);
        self.stage_batch(region, batch, staging);
        let list = self.install_runs(region, batch, staging);
        self.publish_prefetched(region, batch, list);
    }

    /// Reads the batch's far pages in one call, then spreads them so that page `i` of the batch
    /// sits in chunk `i` of the staging buffer (the rest are fresh pages, zero-filled), ready
    /// to install in runs.
    fn stage_batch(&self, region: &RegionInner, batch: &[(usize, u64)], staging: &mut Staging) {
        let mut keys = [0 as Key; PREFETCH_BATCH];
        let mut far = 0;
        for &(p, w) in batch {
            if in_store(w) {
                keys[far] = region.key(p);
                far += 1;
            }
        }
        if far > 0 {
            self.read_pages(&keys[..far], staging, "prefetching pages");
            self.drop_copies(&keys[..far], "prefetching pages");
            Counters::add(&self.counters.bytes_read, (far * PAGE) as u64);
        }
        let mut j = far;
        for (i, &(_, w)) in batch.iter().enumerate().rev() {
            let chunk = i * PAGE..(i + 1) * PAGE;
            if w & FRAMED != 0 {
                // Moved in, not copied.
            } else if kind(w) == FAR {
                j -= 1;
                if j != i {
                    staging
                        .buf
                        .copy_within(j * PAGE..(j + 1) * PAGE, chunk.start);
                }
            } else {
                // A stream over fresh memory: map zero pages ahead so the program does not
                // fault on each one.
                staging.buf[chunk].fill(0);
            }
        }
    }

    /// How page word `w` goes in.
    fn how(&self, w: u64) -> How {
        if w & FRAMED != 0 {
            How::Frame
        } else {
            How::Copy {
                wp: in_store(w) && w & WAS_DIRTY == 0 && !self.drops_far_copies(),
            }
        }
    }

    /// Installs the staged batch, one UFFDIO_COPY (or frame move) per run of consecutive pages
    /// that go in the same way. Returns each page's new state, to publish.
    fn install_runs(
        &self,
        region: &Arc<RegionInner>,
        batch: &[(usize, u64)],
        staging: &Staging,
    ) -> Vec<(usize, u64)> {
        let mut list = Vec::with_capacity(batch.len());
        let mut run = 0;
        for (i, &(p, w)) in batch.iter().enumerate() {
            let this = self.how(w);
            let new = self.prefetched_word(region, p, w, this, staging.page(i));
            list.push((p, new));
            let run_ends = batch
                .get(i + 1)
                .is_none_or(|&(q, v)| q != p + 1 || self.how(v) != this);
            if run_ends {
                let first = batch[run].0;
                match this {
                    How::Frame => self.copy_in_frames(region, first, i + 1 - run, false),
                    How::Copy { wp } => {
                        let bytes = &staging.buf[run * PAGE..(i + 1) * PAGE];
                        self.install(region.addr(first), bytes, wp, false);
                    }
                }
                run = i + 1;
            }
        }
        list
    }

    /// The state of prefetched page `p` (word `w`, going in as `how`, staged as `bytes`) once
    /// installed.
    fn prefetched_word(
        &self,
        region: &RegionInner,
        p: usize,
        w: u64,
        how: How,
        bytes: &[u8],
    ) -> u64 {
        match how {
            How::Frame => {
                if self.frames.probation().is_some() {
                    self.tier_touched(w);
                } else {
                    Counters::add(&self.counters.bytes_read, PAGE as u64);
                }
                self.unframed(region, p, w, false) | PREFETCHED | STALE_FRAME
            }
            _ if kind(w) == FAR && self.drops_far_copies() => RESIDENT | PREFETCHED | (w & HISTORY),
            How::Copy { wp } if kind(w) == FAR => {
                if !wp {
                    // Installed writable on a guess (see `install_demand`).
                    region.table.hash(p).store(hash_page(bytes), Relaxed);
                }
                RESIDENT | FAR_VALID | PREFETCHED | if wp { WP_CLEAN } else { 0 } | (w & HISTORY)
            }
            How::Copy { .. } => RESIDENT | PREFETCHED | (w & HISTORY),
        }
    }

    /// Counts the installed batch resident, publishes the pages' new states (`list`) and wakes
    /// the threads waiting on them, then puts them on the clock.
    fn publish_prefetched(
        &self,
        region: &Arc<RegionInner>,
        batch: &[(usize, u64)],
        list: Vec<(usize, u64)>,
    ) {
        // Counted before the pages are published: once unlocked, another thread may evict or
        // discard them and subtract them again.
        self.budget.resident.fetch_add(batch.len(), Relaxed);
        for &(p, _) in batch {
            self.count_resident(region, p, 1);
        }
        let mut waiters = false;
        for &(p, new) in &list {
            region.note_touched(p);
            waiters |= region.table.unlock(p, new);
        }
        // One wake-up for the batch, if a thread waits on one of its pages: woken page by page,
        // a program walking the stream on this CPU would run, fault on the next page and sleep
        // again for every page.
        if let (true, Some(&(first, _)), Some(&(last, _))) =
            (waiters, batch.iter().min(), batch.iter().max())
        {
            self.uffd
                .wake(region.addr(first), (last + 1 - first) * PAGE);
        }
        self.eviction
            .clock
            .extend(region, list.into_iter().map(|(p, _)| p));
    }
}

/// A page in the store, not in a frame of this process: read from the store to come back.
fn in_store(w: u64) -> bool {
    kind(w) == FAR && w & FRAMED == 0
}

/// How a prefetched page goes in: moved back from its frame, or copied from the staging buffer
/// write-protected or writable.
#[derive(PartialEq, Clone, Copy)]
enum How {
    Frame,
    Copy { wp: bool },
}

/// The pages of a stride plan, in order.
fn plan_pages(plan: &Plan) -> impl ExactSizeIterator<Item = i64> {
    let (start, stride) = (plan.start, plan.stride);
    (0..plan.count).map(move |i| start + i as i64 * stride)
}
