//! What an arena's memory is worth, as the coordinator needs to know it (Midas §4.3.2):
//! reconstruction time, hits and misses, and *ghost hits*.
//!
//! A ghost hit is a miss on an object the evacuator dropped as cold, counted by how many
//! bytes the arena dropped after it: an object dropped `d` bytes ago would still be there
//! with `d` more bytes of budget (exactly so for LRU, roughly for the hotness order). Summed
//! over a probe size Δ, ghost hits say how many misses, and how much reconstruction time,
//! Δ more bytes would save: the marginal utility the coordinator climbs on. The drop mark
//! lives beside the slot ([`crate::slots`]), so it costs nothing until an object is dropped.

use crate::counters::PoolCounters;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use tidepool_proto::coord::GHOST_BUCKETS;

/// Marks count dropped bytes in these units.
pub(crate) const MARK_SHIFT: u32 = 12;

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
