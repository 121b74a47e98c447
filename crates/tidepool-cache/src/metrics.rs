//! `tidepool cache --metrics ADDR`: the `stats` counters as Prometheus metrics (OpenMetrics
//! text), `tidepool_cache_` before memcached's names, so that dashboards made for memcached's
//! exporter read them with a prefix changed. Rendered at each scrape on the metrics thread.

use crate::stats::{general, Settings};
use crate::store::Items;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Stats that go up and down; every other number is a counter.
const GAUGES: &[&str] = &[
    "curr_connections",
    "max_connections",
    "curr_items",
    "bytes",
    "limit_maxbytes",
    "threads",
    "soft_budget_bytes",
    "soft_used_bytes",
    "soft_max_bytes",
    "index_keys",
    "uptime",
];

/// Stats that are not measurements.
const SKIP: &[&str] = &["pid", "time", "version", "pointer_size"];

/// What a stat means, for the metric's help.
fn help(name: &str) -> String {
    match name {
        "evictions" => "Items found gone from soft memory when read (dropped as cold or taken back by the system)".into(),
        "limit_maxbytes" | "soft_budget_bytes" => "The soft-memory budget now (the coordinator's or the auto budget's)".into(),
        "soft_used_bytes" => "Bytes of soft memory the items' segments hold".into(),
        "curr_items" => "Items whose values are in soft memory now".into(),
        "bytes" => "Bytes of keys and values of the items in soft memory".into(),
        "far_hits" => "Values brought back from the far tier".into(),
        "uptime" => "Seconds since the server started".into(),
        _ => format!("memcached's {name}"),
    }
}

/// The metrics, as `/metrics` serves them.
pub fn render(items: &Items, settings: &Settings) -> String {
    let mut registry = Registry::with_prefix("tidepool_cache");
    for (name, value) in general(items, settings) {
        if SKIP.contains(&name) {
            continue;
        }
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if GAUGES.contains(&name) {
            let g = Gauge::<i64>::default();
            g.set(v as i64);
            registry.register(name, help(name), g);
        } else if name.starts_with("rusage_") {
            let c = Counter::<f64>::default();
            c.inc_by(v);
            registry.register(format!("{name}_seconds"), help(name), c);
        } else {
            let c = Counter::<u64>::default();
            c.inc_by(v as u64);
            registry.register(name, help(name), c);
        }
    }
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String does not fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_soft::{ArenaConfig, SoftArena};

    #[test]
    fn stats_become_counters_and_gauges() {
        let arena = SoftArena::new(ArenaConfig::default()).unwrap();
        let items = Items::new(&arena, None);
        items
            .store(crate::store::StoreMode::Set, b"k", 0, 0, b"v", None)
            .unwrap();
        let text = render(&items, &Settings::new(2, 1 << 20, 10));
        assert!(
            text.contains("# TYPE tidepool_cache_curr_items gauge"),
            "{text}"
        );
        assert!(text.contains("tidepool_cache_curr_items 1\n"), "{text}");
        assert!(
            text.contains("# TYPE tidepool_cache_get_hits counter"),
            "{text}"
        );
        assert!(
            text.contains("tidepool_cache_total_items_total 1\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
