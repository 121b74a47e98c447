//! What a pool counts (Midas §4.4): hits and misses, reconstructions and their cost, and the
//! warnings a profile that says soft memory does not pay deserves.

use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

/// Counter shards: readers on different threads do not share a cache line, and a plain
/// load-and-store increment (no locked instruction, which would stall the reads in flight
/// behind it) loses counts only when two threads share a shard at the same moment.
const SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard {
    hits: AtomicU64,
    misses: AtomicU64,
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MY_SHARD: Cell<usize> = Cell::new(NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS);
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Relaxed) + 1, Relaxed);
}

/// Rebuilding costs more than this per read (microseconds, mean reconstruction time times
/// miss rate): the profiler warns.
const COSTLY_US_PER_READ: f64 = 10.0;
/// At most one such warning per pool in this long.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What a pool counts (Midas §4.4: the profile that says whether soft memory pays).
#[derive(Debug, Default)]
pub struct PoolCounters {
    name: Mutex<String>,
    shards: [Shard; SHARDS],
    reconstructions: AtomicU64,
    reconstruct_nanos: AtomicU64,
    reconstruct_failures: AtomicU64,
    /// Debug mode: hits are checked against a fresh reconstruction.
    debug: AtomicBool,
    mismatches: AtomicU64,
    last_warning: Mutex<Option<Instant>>,
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolStats {
    pub hits: u64,
    pub misses: u64,
    pub reconstructions: u64,
    pub reconstruct_failures: u64,
    /// Mean time of one reconstruction, in microseconds.
    pub reconstruct_us: f64,
    /// Debug mode: hits whose value the reconstructor did not reproduce.
    pub mismatches: u64,
}

impl PoolStats {
    /// The share of reads that missed.
    pub fn miss_rate(&self) -> f64 {
        let reads = self.hits + self.misses;
        if reads == 0 {
            0.0
        } else {
            self.misses as f64 / reads as f64
        }
    }

    /// Microseconds of rebuilding per read, on average: what soft memory costs this pool.
    pub fn rebuild_us_per_read(&self) -> f64 {
        self.miss_rate() * self.reconstruct_us
    }
}

impl PoolCounters {
    pub(crate) fn named(name: &str) -> PoolCounters {
        PoolCounters {
            name: Mutex::new(name.to_string()),
            ..Default::default()
        }
    }

    /// Names the pool in warnings and debug reports.
    pub(crate) fn rename(&self, name: &str) {
        *self.name.lock() = name.to_string();
    }

    pub(crate) fn debugging(&self) -> bool {
        self.debug.load(Relaxed)
    }

    pub(crate) fn set_debug(&self, on: bool) {
        self.debug.store(on, Relaxed);
    }

    /// Debug mode found a hit the reconstructor disagrees with.
    pub(crate) fn mismatch(&self) {
        let n = self.mismatches.fetch_add(1, Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::error!(
                pool = %self.name.lock(),
                mismatches = n,
                "soft memory debug mode: a cached value differs from what the reconstructor \
                 builds for it; the reconstructor is not deterministic, or a write went to soft \
                 memory without going to the source"
            );
        }
    }

    /// Warns (rarely) when rebuilding costs too much per read.
    fn check_cost(&self) {
        if !self.reconstructions.load(Relaxed).is_multiple_of(256) {
            return;
        }
        let s = self.snapshot();
        if s.rebuild_us_per_read() <= COSTLY_US_PER_READ {
            return;
        }
        let mut last = self.last_warning.lock();
        if last.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        tracing::warn!(
            pool = %self.name.lock(),
            reconstruct_us = s.reconstruct_us,
            miss_rate = s.miss_rate(),
            "soft memory: rebuilding costs {:.1} us per read ({:.1}% of reads miss, {:.1} us \
             each); give the arena a larger budget, or keep this state in normal memory",
            s.rebuild_us_per_read(),
            100.0 * s.miss_rate(),
            s.reconstruct_us
        );
    }

    fn shard(&self) -> &Shard {
        &self.shards[MY_SHARD.with(Cell::get)]
    }

    pub(crate) fn hit(&self, hit: bool) {
        let s = self.shard();
        bump(if hit { &s.hits } else { &s.misses });
    }

    pub(crate) fn reconstructed(&self, nanos: u64) {
        self.reconstructions.fetch_add(1, Relaxed);
        self.reconstruct_nanos.fetch_add(nanos, Relaxed);
        self.check_cost();
    }

    /// A rebuild someone else made (a cache's client, between its miss and its set): counted
    /// for the coordinator, without the advice to the owner of a reconstructor.
    pub(crate) fn rebuilt_elsewhere(&self, nanos: u64) {
        self.reconstructions.fetch_add(1, Relaxed);
        self.reconstruct_nanos.fetch_add(nanos, Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.reconstruct_failures.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> PoolStats {
        let n = self.reconstructions.load(Relaxed);
        PoolStats {
            hits: self.shards.iter().map(|s| s.hits.load(Relaxed)).sum(),
            misses: self.shards.iter().map(|s| s.misses.load(Relaxed)).sum(),
            reconstructions: n,
            reconstruct_failures: self.reconstruct_failures.load(Relaxed),
            reconstruct_us: if n == 0 {
                0.0
            } else {
                self.reconstruct_nanos.load(Relaxed) as f64 / n as f64 / 1e3
            },
            mismatches: self.mismatches.load(Relaxed),
        }
    }
}
