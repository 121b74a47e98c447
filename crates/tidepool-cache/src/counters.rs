//! The server's counters, bumped by every thread; `stats` ([`crate::stats`]) and the metrics
//! read them.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Counters every thread bumps (relaxed atomics).
#[derive(Debug, Default)]
pub struct Counters {
    pub cmd_get: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Items found gone from soft memory when read (dropped as cold or revoked): memcached's
    /// `evictions`, counted when seen.
    pub lost: AtomicU64,
    /// Items found past their expiry when read.
    pub expired: AtomicU64,
    pub total_items: AtomicU64,
    /// Values brought back from the far tier.
    pub far_hits: AtomicU64,
    /// Stores refused for want of memory.
    pub out_of_memory: AtomicU64,
}

/// Zeroes the counters `stats reset` zeroes (not the gauges).
pub fn reset(c: &Counters) {
    for a in [
        &c.cmd_get,
        &c.get_hits,
        &c.get_misses,
        &c.cmd_set,
        &c.cmd_touch,
        &c.cmd_flush,
        &c.touch_hits,
        &c.touch_misses,
        &c.delete_hits,
        &c.delete_misses,
        &c.incr_hits,
        &c.incr_misses,
        &c.decr_hits,
        &c.decr_misses,
        &c.cas_hits,
        &c.cas_misses,
        &c.cas_badval,
        &c.total_connections,
        &c.rejected_connections,
        &c.bytes_read,
        &c.bytes_written,
        &c.lost,
        &c.expired,
        &c.total_items,
        &c.far_hits,
        &c.out_of_memory,
    ] {
        a.store(0, Relaxed);
    }
}
