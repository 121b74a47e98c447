//! Prometheus metrics (OpenMetrics text), rendered from a snapshot.

use crate::Snapshot;
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppLabels {
    app: String,
    id: u32,
}

type F64Gauge = Gauge<f64, AtomicU64>;
/// A per-application metric: name, help, and how to read it.
type AppMetric = (&'static str, &'static str, fn(&crate::AppSnapshot) -> f64);

pub(crate) fn render(s: &Snapshot) -> String {
    let mut r = Registry::with_prefix("tidepool_coord");
    let machine: [(&str, &str, f64); 8] = [
        (
            "reserve_bytes",
            "Headroom always left to everything else",
            s.reserve as f64,
        ),
        (
            "mem_available_bytes",
            "MemAvailable",
            s.mem_available as f64,
        ),
        (
            "headroom_bytes",
            "Least headroom of MemAvailable and memory cgroups",
            s.headroom as f64,
        ),
        ("pool_bytes", "Idle memory for soft memory", s.pool as f64),
        ("granted_bytes", "Sum of budgets", s.granted as f64),
        (
            "held_bytes",
            "Soft memory held by all applications",
            s.held as f64,
        ),
        (
            "pressure_ratio",
            "Share of time some task stalled on memory (PSI)",
            s.pressure,
        ),
        (
            "longest_below_reserve_seconds",
            "Longest time the headroom stayed under the reserve",
            s.longest_below_reserve_ms / 1e3,
        ),
    ];
    for (name, help, v) in machine {
        let g = F64Gauge::default();
        g.set(v);
        r.register(name, help, g);
    }
    let per_app: [AppMetric; 7] = [
        ("app_budget_bytes", "Budget", |a| a.budget as f64),
        ("app_held_bytes", "Soft memory held (measured)", |a| {
            a.held as f64
        }),
        ("app_weight", "Operator's weight", |a| a.weight),
        ("app_hit_ratio", "Hit rate over the last epoch", |a| {
            a.hit_rate
        }),
        ("app_reads_per_second", "Reads per second", |a| {
            a.reads_per_s
        }),
        (
            "app_rebuild_ratio",
            "Share of time spent reconstructing",
            |a| a.rebuild_share,
        ),
        (
            "app_punched_bytes",
            "Bytes taken by direct reclamation",
            |a| a.punched_bytes as f64,
        ),
    ];
    for (name, help, f) in per_app {
        let fam = Family::<AppLabels, F64Gauge>::default();
        for a in &s.apps {
            fam.get_or_create(&AppLabels {
                app: a.name.clone(),
                id: a.id,
            })
            .set(f(a));
        }
        r.register(name, help, fam);
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}
