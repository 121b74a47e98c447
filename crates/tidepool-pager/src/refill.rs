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

use crate::region::{RegionInner, CHUNK_PAGES};
use crate::table::{kind, BUSY, HEAT, HEAT_SHIFT, WRITEBACK};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// Page states a pass reads at most per region, from where its last pass stopped, up to the
/// highest page the region ever mapped: the preload library's large-object region spans a
/// terabyte of address space, and reading all of its words held the evictor for seconds.
const SCAN_PAGES: usize = 1 << 16;

/// Pages brought back per wake of the evictor (every 20 ms at most): 4 MiB, 200 MiB/s, so a
/// refill shares the store with other programs' faults rather than swamping it.
const REFILL_PAGES: usize = 1024;

/// What refill needs of the pager that runs it. Refill knows pages, their states and the
/// budget's room through it, never the pager's own state.
pub(crate) trait Host {
    /// What installing a batch needs (the fault path's buffers).
    type Staging;
    /// Most pages installed in one batch (one store read).
    const BATCH: usize;
    /// Pages that fit under the budget now, less two margins (0 if none).
    fn spare_pages(&self) -> usize;
    /// Whether `n` more pages fit under the budget now, a margin to spare, and the pager is not
    /// stopping.
    fn fits(&self, n: usize) -> bool;
    /// The regions now.
    fn regions(&self) -> Vec<Arc<RegionInner>>;
    /// The eviction sequence number now: it moves whenever a page is evicted.
    fn evict_seq(&self) -> u32;
    /// Whether page `page` of `region`, whose word is `w`, is out in the far store and may be
    /// brought back (the program can read it: an inaccessible page could not be evicted again
    /// until the program opens it).
    fn is_refillable(&self, region: &RegionInner, page: usize, w: u64) -> bool;
    /// Releases locked page `page` (word `w` before the lock) untouched, waking a thread that
    /// waits for it.
    fn release(&self, region: &RegionInner, page: usize, w: u64);
    /// Counts, then installs, the locked far pages of `batch` (index, word before the lock).
    fn bring_back(
        &self,
        region: &Arc<RegionInner>,
        batch: &[(usize, u64)],
        staging: &mut Self::Staging,
    );
}

/// Refill's state: where its sweep is. Only the evictor thread runs it.
#[derive(Debug, Default)]
pub(crate) struct Refill {
    sweep: Mutex<Sweep>,
}

/// Where the sweep is in each region, and what it has seen since it last found a page to bring
/// back.
#[derive(Debug, Default)]
struct Sweep {
    /// Per region (by id): where the next pass starts, and the page states read since a pass
    /// last brought a page back or saw one on its way out.
    at: HashMap<u32, (usize, usize)>,
    /// `evict_seq` when the dry streak began.
    dry_seq: u32,
    dry: bool,
    /// `Some(seq)`: a whole lap of every region found nothing to bring back, and nothing was
    /// evicted after `seq`; passes wait for the next eviction.
    idle: Option<u32>,
    /// Page states read so far.
    read: u64,
}

impl Refill {
    /// Brings far pages back while the budget has room to spare (see the module's comment).
    /// Returns how many.
    pub(crate) fn run<H: Host>(&self, host: &H, staging: &mut H::Staging) -> usize {
        let _section = crate::gate::section();
        let mut sweep = self.sweep.lock();
        let seq = host.evict_seq();
        if sweep.idle == Some(seq) {
            return 0; // a lap found nothing, and nothing went out since
        }
        sweep.idle = None;
        let room = host.spare_pages().min(REFILL_PAGES);
        if room < H::BATCH {
            return 0;
        }
        let regions = host.regions();
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
            if brought + H::BATCH > room {
                lapped &= dry >= end;
                continue;
            }
            let from = if from >= end { 0 } else { from };
            let (ranges, to) = evicted_chunks(region, from, end);
            sweep.read += ranges.iter().map(|r| r.len() as u64).sum::<u64>();
            let pages = ranges.into_iter().flatten();
            let (b, l) = range(host, region, pages, room - brought, staging);
            brought += b;
            leaving |= l;
            let dry = dry + (to - from);
            lapped &= dry >= end;
            sweep.at.insert(region.id, (to, dry));
        }
        sweep.after_pass(brought > 0 || leaving, lapped);
        brought
    }

    /// Page states read so far.
    #[cfg(test)]
    pub(crate) fn states_read(&self) -> u64 {
        self.sweep.lock().read
    }
}

impl Sweep {
    /// After a pass that found pages to bring back (or on their way out) or not, and went
    /// round every region without finding any (`lapped`).
    fn after_pass(&mut self, found: bool, lapped: bool) {
        if found {
            self.dry = false;
            self.at.values_mut().for_each(|(_, dry)| *dry = 0);
        } else if lapped {
            // Pages evicted during the lap may lie where it had passed: idle only as of the
            // lap's start.
            self.idle = Some(self.dry_seq);
            self.dry = false;
            self.at.values_mut().for_each(|(_, dry)| *dry = 0);
        } else {
            self.dry = true;
        }
    }
}

/// The pages of `region` from `from` to at most `end` in chunks that had evictions,
/// [`SCAN_PAGES`] of them at most, and where the next pass starts.
fn evicted_chunks(
    region: &RegionInner,
    from: usize,
    end: usize,
) -> (Vec<std::ops::Range<usize>>, usize) {
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
    (ranges, to)
}

/// Brings back up to `want` far pages of `pages` of `region` (none for a dead region), the
/// hottest (most often fetched again soon after an eviction) first. Returns how many, and
/// whether a page of them is on its way to the store (it will be far soon).
fn range<H: Host>(
    host: &H,
    region: &Arc<RegionInner>,
    pages: impl Iterator<Item = usize>,
    want: usize,
    staging: &mut H::Staging,
) -> (usize, bool) {
    let mut by_heat: [Vec<usize>; 4] = Default::default();
    let mut leaving = false;
    for p in pages {
        let w = region.table.state(p).load(Relaxed);
        // On its way to the store, or locked by a thread that may be evicting it (the
        // eviction's sequence number is taken before the page turns FAR: a pass reading the
        // new number and the page still BUSY went idle, and the page stayed far).
        leaving |= matches!(kind(w), WRITEBACK | BUSY);
        if host.is_refillable(region, p, w) {
            let heat = ((w & HEAT) >> HEAT_SHIFT) as usize;
            if by_heat[heat].len() < want {
                by_heat[heat].push(p);
            }
        }
    }
    let mut pages: Vec<usize> = by_heat.into_iter().rev().flatten().take(want).collect();
    let mut brought = 0;
    while !pages.is_empty() {
        let rest = pages.split_off(pages.len().min(H::BATCH));
        let mut batch: Vec<(usize, u64)> = Vec::with_capacity(H::BATCH);
        pages.sort_unstable();
        for &p in &pages {
            // Faulted on (or evicted again) since the scan: skipped.
            if let Some(w) = region.table.try_lock(p, &[crate::table::FAR]) {
                batch.push((p, w));
            }
        }
        pages = rest;
        if batch.is_empty() {
            continue;
        }
        // The program may have taken the room meanwhile: never evict for a guess.
        if !host.fits(batch.len()) {
            for &(p, w) in &batch {
                host.release(region, p, w);
            }
            break;
        }
        host.bring_back(region, &batch, staging);
        brought += batch.len();
    }
    (brought, leaving)
}
