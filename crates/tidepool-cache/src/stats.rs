//! The server's counters, and `stats` under memcached's names where memcached has one.

pub use crate::counters::{reset, Counters};
use crate::store::Items;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// What `stats` reports besides the counters: the server's settings as it runs with them.
/// [`Settings::new`], then the setters below.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker threads.
    pub(crate) threads: usize,
    /// The largest item, in bytes.
    pub(crate) item_max: usize,
    /// Most connections at once.
    pub(crate) max_connections: usize,
    /// The soft budget's ceiling (`--max`), if any.
    pub(crate) max_bytes: Option<u64>,
}

impl Settings {
    /// A server of `threads` workers taking items of up to `item_max` bytes and up to
    /// `max_connections` connections, with no budget ceiling.
    pub fn new(threads: usize, item_max: usize, max_connections: usize) -> Settings {
        Settings {
            threads,
            item_max,
            max_connections,
            max_bytes: None,
        }
    }

    /// The soft budget's ceiling in bytes (`--max`; default none).
    pub fn max_bytes(mut self, bytes: u64) -> Settings {
        self.max_bytes = Some(bytes);
        self
    }
}

fn rusage() -> (f64, f64) {
    // getrusage through /proc: utime and stime in clock ticks.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (tick(11), tick(12))
}

/// `stats` (no argument): name and value pairs, in memcached's order where it has them.
pub fn general(items: &Items, s: &Settings) -> Vec<(&'static str, String)> {
    let c = &items.counters;
    let g = |a: &AtomicU64| a.load(Relaxed).to_string();
    let (curr_items, bytes) = items.present();
    let (user, system) = rusage();
    let arena = items.arena();
    let soft = items.soft();
    let mut v = vec![
        ("pid", std::process::id().to_string()),
        ("uptime", items.uptime().to_string()),
        ("time", items.unix_now().to_string()),
        ("version", crate::VERSION.to_string()),
        ("pointer_size", (usize::BITS).to_string()),
        ("rusage_user", format!("{user:.6}")),
        ("rusage_system", format!("{system:.6}")),
        ("max_connections", s.max_connections.to_string()),
        ("curr_connections", g(&c.curr_connections)),
        ("total_connections", g(&c.total_connections)),
        ("rejected_connections", g(&c.rejected_connections)),
        ("cmd_get", g(&c.cmd_get)),
        ("cmd_set", g(&c.cmd_set)),
        ("cmd_flush", g(&c.cmd_flush)),
        ("cmd_touch", g(&c.cmd_touch)),
        ("get_hits", g(&c.get_hits)),
        ("get_misses", g(&c.get_misses)),
        ("get_expired", g(&c.expired)),
        ("delete_misses", g(&c.delete_misses)),
        ("delete_hits", g(&c.delete_hits)),
        ("incr_misses", g(&c.incr_misses)),
        ("incr_hits", g(&c.incr_hits)),
        ("decr_misses", g(&c.decr_misses)),
        ("decr_hits", g(&c.decr_hits)),
        ("cas_misses", g(&c.cas_misses)),
        ("cas_hits", g(&c.cas_hits)),
        ("cas_badval", g(&c.cas_badval)),
        ("touch_hits", g(&c.touch_hits)),
        ("touch_misses", g(&c.touch_misses)),
        ("bytes_read", g(&c.bytes_read)),
        ("bytes_written", g(&c.bytes_written)),
        // The soft budget: what the coordinator (or the auto budget) gives now.
        ("limit_maxbytes", arena.budget().to_string()),
        ("threads", s.threads.to_string()),
        ("bytes", bytes.to_string()),
        ("curr_items", curr_items.to_string()),
        ("total_items", g(&c.total_items)),
        ("evictions", g(&c.lost)),
        ("expired_unfetched", "0".into()),
        // Tidepool's own.
        ("soft_budget_bytes", arena.budget().to_string()),
        ("soft_used_bytes", arena.usage().to_string()),
        (
            "soft_segments_revoked",
            arena.counters().segments_revoked.load(Relaxed).to_string(),
        ),
        ("soft_rebuilds", soft.reconstructions.to_string()),
        ("index_keys", items.keys().to_string()),
        ("far_hits", g(&c.far_hits)),
        ("out_of_memory", g(&c.out_of_memory)),
    ];
    if let Some(m) = s.max_bytes {
        v.push(("soft_max_bytes", m.to_string()));
    }
    if let Some(f) = items.far() {
        let c = &f.counters;
        v.extend([
            ("far_writes", g(&c.writes)),
            ("far_removes", g(&c.removes)),
            ("far_skipped", g(&c.skipped)),
            ("far_errors", g(&c.errors)),
            ("far_fetches", g(&c.fetches)),
            ("far_fetch_misses", g(&c.fetch_misses)),
            ("far_unavailable", g(&c.unavailable)),
            ("far_orphaned", g(&c.orphaned)),
        ]);
    }
    v
}

/// `stats settings`.
pub fn settings(s: &Settings) -> Vec<(&'static str, String)> {
    vec![
        ("maxconns", s.max_connections.to_string()),
        ("num_threads", s.threads.to_string()),
        ("item_size_max", s.item_max.to_string()),
        ("cas_enabled", "yes".into()),
        ("evictions", "on".into()),
        (
            "maxbytes",
            s.max_bytes.map_or("auto".into(), |m| m.to_string()),
        ),
    ]
}
