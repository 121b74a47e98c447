//! What an arena's memory is worth, as the coordinator needs to know it (Midas §4.3.2):
//! reconstruction time, hits and misses, and *ghost hits*.
//!
//! A ghost hit is a miss on an object the evacuator dropped as cold, counted by how many
//! bytes the arena dropped after it: an object dropped `d` bytes ago would still be there
//! with `d` more bytes of budget (exactly so for LRU, roughly for the hotness order). Summed
//! over a probe size Δ, ghost hits say how many misses, and how much reconstruction time,
//! Δ more bytes would save: the marginal utility the coordinator climbs on. The drop mark
//! lives beside the slot ([`crate::slots`]), so it costs nothing until an object is dropped.

use crate::pool::PoolCounters;
use crate::SoftArena;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use tidepool_proto::coord::{ghost_bucket, GHOST_BUCKETS};

/// Marks count dropped bytes in these units.
const MARK_SHIFT: u32 = 12;

/// An arena's demand counters (they only grow).
#[derive(Debug, Default)]
pub struct Demand {
    /// Bytes of live objects dropped to make room: cold objects dropped by the evacuator,
    /// and whole segments taken by direct reclamation.
    pub bytes_dropped: AtomicU64,
    pub reconstructions: AtomicU64,
    pub reconstruct_nanos: AtomicU64,
    pub ghost_hits: [AtomicU64; GHOST_BUCKETS],
    pub ghost_nanos: [AtomicU64; GHOST_BUCKETS],
    /// The pools and structures allocating here (for their hit and miss counts).
    pools: Mutex<Vec<Weak<PoolCounters>>>,
    /// Hits and misses of pools that are gone.
    gone: Mutex<(u64, u64)>,
    /// Mark the objects of segments evicted whole too (set once a coordinator is joined).
    pub(crate) track_segments: std::sync::atomic::AtomicBool,
}

/// A snapshot of an arena's demand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemandStats {
    pub hits: u64,
    pub misses: u64,
    pub reconstructions: u64,
    pub reconstruct_nanos: u64,
    pub bytes_dropped: u64,
    pub ghost_hits: [u64; GHOST_BUCKETS],
    pub ghost_nanos: [u64; GHOST_BUCKETS],
}

impl Demand {
    /// Counts a pool's hits and misses with the arena's.
    pub(crate) fn register(&self, pool: &Arc<PoolCounters>) {
        let mut pools = self.pools.lock();
        if pools.len() >= 64 && pools.len().is_power_of_two() {
            self.sweep(&mut pools);
        }
        pools.push(Arc::downgrade(pool));
    }

    /// A pool is being dropped: keep its counts.
    pub(crate) fn retire(&self, pool: &PoolCounters) {
        let s = pool.snapshot();
        let mut gone = self.gone.lock();
        gone.0 += s.hits;
        gone.1 += s.misses;
    }

    fn sweep(&self, pools: &mut Vec<Weak<PoolCounters>>) {
        pools.retain(|p| p.strong_count() > 0);
    }

    pub fn snapshot(&self) -> DemandStats {
        let (mut hits, mut misses) = *self.gone.lock();
        for p in self.pools.lock().iter().filter_map(Weak::upgrade) {
            let s = p.snapshot();
            hits += s.hits;
            misses += s.misses;
        }
        DemandStats {
            hits,
            misses,
            reconstructions: self.reconstructions.load(Relaxed),
            reconstruct_nanos: self.reconstruct_nanos.load(Relaxed),
            bytes_dropped: self.bytes_dropped.load(Relaxed),
            ghost_hits: std::array::from_fn(|k| self.ghost_hits[k].load(Relaxed)),
            ghost_nanos: std::array::from_fn(|k| self.ghost_nanos[k].load(Relaxed)),
        }
    }
}

impl SoftArena {
    /// The evacuator dropped slot `slot`'s object (`bytes` long) as cold.
    pub(crate) fn dropped_cold(&self, slot: u32, bytes: usize) {
        let before = self.demand.bytes_dropped.fetch_add(bytes as u64, Relaxed);
        let mark = ((before >> MARK_SHIFT) as u32).wrapping_add(1).max(1);
        self.slots.mark_dropped(slot, mark);
    }

    /// A closed segment (or run) is about to be evicted whole to make room: its live objects
    /// are dropped as the evacuator would drop them, marks included (call before the
    /// eviction bumps its incarnation).
    pub(crate) fn dropping_segment(&self, seg: u32) {
        // A walk of the segment's headers (tens of thousands for small objects) under the
        // segment lock: only when a coordinator reads the ghost hits.
        if !self.demand.track_segments.load(Relaxed) {
            return;
        }
        let mut live = Vec::new();
        let walked = self.walk_live(seg, |slot, total| live.push((slot, total)));
        if walked.is_err() {
            return; // revoked: nothing of it to remember
        }
        for (slot, total) in live {
            self.dropped_cold(slot, total);
        }
    }

    /// A reconstruction of slot `slot`'s object (if it has one) took `nanos`.
    pub(crate) fn rebuilt(&self, slot: Option<u32>, nanos: u64) {
        let d = &self.demand;
        d.reconstructions.fetch_add(1, Relaxed);
        d.reconstruct_nanos.fetch_add(nanos, Relaxed);
        let Some(mark) = slot.and_then(|s| self.slots.take_dropped(s)) else {
            return;
        };
        let now = (d.bytes_dropped.load(Relaxed) >> MARK_SHIFT) as u32;
        let distance = (now.wrapping_sub(mark.wrapping_sub(1)) as u64) << MARK_SHIFT;
        let k = ghost_bucket(distance);
        d.ghost_hits[k].fetch_add(1, Relaxed);
        d.ghost_nanos[k].fetch_add(nanos, Relaxed);
    }

    /// Hits, misses, reconstruction time and ghost hits so far.
    pub fn demand(&self) -> DemandStats {
        self.demand.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use crate::{ArenaConfig, SoftArena};

    #[test]
    fn a_miss_on_a_dropped_object_is_a_ghost_hit_at_its_distance() {
        let arena = SoftArena::new(ArenaConfig::default()).unwrap();
        arena.dropped_cold(7, 4096);
        arena
            .demand
            .bytes_dropped
            .fetch_add(4 << 20, std::sync::atomic::Ordering::Relaxed); // 4 MiB dropped after it
        arena.rebuilt(Some(7), 1000);
        arena.rebuilt(Some(7), 500); // rebuilt again: no longer a ghost
        arena.rebuilt(Some(8), 10); // never dropped
        arena.rebuilt(None, 10);
        let d = arena.demand();
        assert_eq!(d.reconstructions, 4);
        assert_eq!(d.reconstruct_nanos, 1520);
        // 4 MiB + 4 KiB: bucket 3 (4-8 MiB).
        assert_eq!(d.ghost_hits.iter().sum::<u64>(), 1);
        assert_eq!(d.ghost_hits[3], 1);
        assert_eq!(d.ghost_nanos[3], 1000);
    }
}
