//! A prefetched batch's far fetches, counted as misses for the coordinator (see
//! [`crate::PagerStats::prefetch_reads`]): each at its share of the batch's time, and as a
//! ghost hit if it was evicted before.

use crate::pager::{Inner, RegionInner};
use crate::stats::Counters;
use crate::sys::PAGE;
use std::sync::atomic::Ordering::*;
use std::time::Duration;
use tidepool_proto::coord::ghost_bucket;

impl Inner {
    /// Whether a locked batch's page is a far fetch (a demand fault would count it so: read
    /// from the store, or moved from a frame that is the store) and, if it was evicted before,
    /// its ghost bucket. Read before the install: once published, a page may be evicted again.
    pub(crate) fn prefetch_ghosts(
        &self,
        region: &RegionInner,
        batch: &[(usize, u64)],
    ) -> Vec<Option<Option<usize>>> {
        let now = self.evict_seq.load(Relaxed);
        batch
            .iter()
            .map(|&(p, w)| {
                self.frames.is_far(w).then(|| {
                    let at = region.table.evicted_at(p).load(Relaxed);
                    (at != 0).then(|| ghost_bucket(now.wrapping_sub(at) as u64 * PAGE as u64))
                })
            })
            .collect()
    }

    /// Counts a prefetched batch's far fetches (`ghosts`, from `prefetch_ghosts`) as
    /// misses, each at its share of the batch's time `took`, and those evicted before as ghost
    /// hits (see [`crate::PagerStats::prefetch_reads`]).
    pub(crate) fn count_prefetch_misses(&self, ghosts: &[Option<Option<usize>>], took: Duration) {
        let n = ghosts.iter().filter(|g| g.is_some()).count() as u64;
        if n == 0 {
            return;
        }
        let each = took.as_nanos() as u64 / n;
        Counters::add(&self.counters.prefetch_reads, n);
        Counters::add(&self.counters.prefetch_nanos, each * n);
        for k in ghosts.iter().flatten().flatten() {
            Counters::add(&self.counters.prefetch_ghosts[*k], 1);
            Counters::add(&self.counters.prefetch_ghost_nanos[*k], each);
        }
    }
}
