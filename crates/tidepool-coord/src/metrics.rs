//! Prometheus metrics (OpenMetrics text) by the usual conventions: what only grows is a counter
//! ending in `_total` (rates are the query's business, `rate(...[1m])`), what goes up and down is
//! a gauge in base units, latencies are histograms, and `tidepool_build_info` says which build
//! answers. Gauges and counters are read from a snapshot; the histograms live in the state.

use crate::Snapshot;
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppLabels {
    app: String,
    id: u32,
    /// soft or paged.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CurveLabels {
    app: String,
    id: u32,
    kind: String,
    /// Memory beyond its budget.
    extra_bytes: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

type F64Gauge = Gauge<f64, AtomicU64>;
type F64Counter = Counter<f64, AtomicU64>;
/// A per-application metric: name, help, and how to read it.
type AppMetric = (&'static str, &'static str, fn(&crate::AppSnapshot) -> f64);
type AppCount = (&'static str, &'static str, fn(&crate::AppSnapshot) -> u64);

/// The coordinator's latencies, observed as they happen.
#[derive(Debug, Clone)]
pub(crate) struct Latencies {
    /// From a budget cut until the application held no more than its budget (Midas's "at once").
    pub reclaim: Histogram,
    /// One control tick: measuring memory and cgroups, planning, cutting, punching.
    pub tick: Histogram,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            // 1 ms .. 16 s
            reclaim: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 10 us .. 160 ms
            tick: Histogram::new(exponential_buckets(1e-5, 2.0, 15)),
        }
    }
}

/// The metrics in OpenMetrics text: the build, the pool's, then each application's.
pub(crate) fn render(s: &Snapshot, latencies: &Latencies) -> String {
    let mut r = Registry::default();
    r.register(
        "tidepool_build",
        "The running build",
        Info::new(BuildLabels {
            version: tidepool_proto::build::VERSION,
            commit: tidepool_proto::build::COMMIT,
        }),
    );
    let c = r.sub_registry_with_prefix("tidepool_coord");
    register_pool(c, s, latencies);
    register_apps(c, s);
    register_miss_time(c, s);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// The host's and the pool's gauges and counters, and the coordinator's latencies.
fn register_pool(c: &mut Registry, s: &Snapshot, latencies: &Latencies) {
    let gauges: [(&str, &str, f64); 7] = [
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
        ("applications", "Applications joined", s.apps.len() as f64),
    ];
    for (name, help, v) in gauges {
        let g = F64Gauge::default();
        g.set(v);
        c.register(name, help, g);
    }
    let punched = Counter::<u64>::default();
    punched.inc_by(s.punched_bytes);
    c.register(
        "punched_bytes",
        "Bytes taken by direct reclamation",
        punched,
    );
    let stall = F64Counter::default();
    stall.inc_by(s.memory_stall_seconds);
    c.register(
        "memory_stall_seconds",
        "Time some task on this host stalled on memory (PSI some total)",
        stall,
    );
    c.register(
        "reclaim_duration_seconds",
        "From a budget cut until the application held no more than its budget",
        latencies.reclaim.clone(),
    );
    c.register(
        "tick_duration_seconds",
        "One control tick: memory measured, budgets planned and applied",
        latencies.tick.clone(),
    );
}

/// Each application's gauges and counters.
fn register_apps(c: &mut Registry, s: &Snapshot) {
    let app_gauges: [AppMetric; 6] = [
        ("app_budget_bytes", "Budget", |a| a.budget as f64),
        ("app_min_bytes", "Least budget it registered for", |a| {
            a.min as f64
        }),
        ("app_max_bytes", "Most budget it registered for", |a| {
            a.max as f64
        }),
        (
            "app_held_bytes",
            "Memory held: a soft arena's (measured), a paged program's resident pages",
            |a| a.held as f64,
        ),
        ("app_weight", "Operator's weight", |a| a.weight),
        (
            "app_miss_seconds",
            "Mean time of one miss over the last epoch (a rebuild, or a far page fault)",
            |a| a.miss_us / 1e6,
        ),
    ];
    for (name, help, f) in app_gauges {
        let fam = Family::<AppLabels, F64Gauge>::default();
        for a in &s.apps {
            fam.get_or_create(&labels(a)).set(f(a));
        }
        c.register(name, help, fam);
    }
    let app_counters: [AppCount; 4] = [
        ("app_hits", "Reads that found their object", |a| a.hits),
        ("app_misses", "Reads that did not", |a| a.misses),
        ("app_reconstructions", "Objects rebuilt", |a| {
            a.reconstructions
        }),
        (
            "app_punched_bytes",
            "Bytes taken from it by direct reclamation",
            |a| a.punched_bytes,
        ),
    ];
    for (name, help, f) in app_counters {
        let fam = Family::<AppLabels, Counter>::default();
        for a in &s.apps {
            fam.get_or_create(&labels(a)).inc_by(f(a));
        }
        c.register(name, help, fam);
    }
}

/// Each application's time spent on misses, and its miss curve.
fn register_miss_time(c: &mut Registry, s: &Snapshot) {
    let rebuilt = Family::<AppLabels, F64Counter>::default();
    for a in &s.apps {
        rebuilt
            .get_or_create(&labels(a))
            .inc_by(a.reconstruction_seconds);
    }
    c.register(
        "app_reconstruction_seconds",
        "Time spent on misses: rebuilding objects (soft), waiting for far pages (paged)",
        rebuilt,
    );
    let curve = Family::<CurveLabels, F64Gauge>::default();
    for a in &s.apps {
        let l = labels(a);
        for p in &a.curve {
            curve
                .get_or_create(&CurveLabels {
                    app: l.app.clone(),
                    id: l.id,
                    kind: l.kind.clone(),
                    extra_bytes: p.extra_mib << 20,
                })
                .set(p.saved_ms_per_s / 1e3);
        }
    }
    c.register(
        "app_curve_saved_time",
        "Its miss curve: the share of time extra_bytes more memory would save (miss seconds \
         a second, from ghost hits over the last epochs)",
        curve,
    );
}

/// An application's labels, its name escaped (names come from the applications).
fn labels(a: &crate::AppSnapshot) -> AppLabels {
    let mut app = String::with_capacity(a.name.len());
    // Writing to a String cannot fail.
    let _ = tidepool_proto::exposition::escape_label_value(&a.name, &mut app);
    AppLabels {
        app,
        id: a.id,
        kind: a.kind.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AppSnapshot, Policy};

    fn snapshot(name: &str) -> Snapshot {
        Snapshot {
            seconds: 1.0,
            policy: Policy::Midas,
            reserve: 1,
            mem_available: 2,
            headroom: 3,
            pool: 4,
            granted: 5,
            held: 6,
            pressure: 0.5,
            memory_stall_seconds: 7.5,
            longest_below_reserve_ms: 0.0,
            punched_bytes: 8192,
            apps: vec![AppSnapshot {
                id: 3,
                kind: "paged".into(),
                name: name.into(),
                pid: 10,
                uid: 0,
                weight: 2.0,
                budget: 1 << 20,
                min: 0,
                max: 1 << 30,
                held: 1 << 19,
                hits: 90,
                misses: 10,
                reconstructions: 10,
                reconstruction_seconds: 0.25,
                hit_rate: 0.9,
                reads_per_s: 100.0,
                rebuild_share: 0.1,
                miss_us: 50.0,
                curve: vec![crate::CurvePoint {
                    extra_mib: 4,
                    misses_per_s: 3.0,
                    saved_ms_per_s: 250.0,
                }],
                utility_per_mib: 1.0,
                punched_bytes: 4096,
                seconds: 1.0,
            }],
        }
    }

    #[test]
    fn counters_end_in_total_and_nothing_is_a_precomputed_rate() {
        let l = Latencies::default();
        l.reclaim.observe(0.003);
        let out = render(&snapshot("web"), &l);
        for line in [
            "tidepool_coord_app_hits_total{app=\"web\",id=\"3\",kind=\"paged\"} 90",
            "tidepool_coord_app_misses_total{app=\"web\",id=\"3\",kind=\"paged\"} 10",
            "tidepool_coord_app_reconstruction_seconds_total{app=\"web\",id=\"3\",kind=\"paged\"} 0.25",
            "tidepool_coord_app_curve_saved_time{app=\"web\",id=\"3\",kind=\"paged\",extra_bytes=\"4194304\"} 0.25",
            "tidepool_coord_app_miss_seconds{app=\"web\",id=\"3\",kind=\"paged\"} 0.00005",
            "tidepool_coord_punched_bytes_total 8192",
            "tidepool_coord_reclaim_duration_seconds_count 1",
            "tidepool_coord_reclaim_duration_seconds_bucket{le=\"0.004\"} 1",
            "# TYPE tidepool_coord_app_hits counter",
            "# TYPE tidepool_coord_reclaim_duration_seconds histogram",
        ] {
            assert!(out.contains(line), "no {line:?} in\n{out}");
        }
        assert!(
            out.contains(&format!(
                "tidepool_build_info{{version=\"{}\",commit=\"{}\"}} 1",
                tidepool_proto::build::VERSION,
                tidepool_proto::build::COMMIT
            )),
            "{out}"
        );
        assert!(
            !out.contains("per_second") && !out.contains("_ratio"),
            "{out}"
        );
    }

    #[test]
    fn a_hostile_name_stays_inside_its_label() {
        let out = render(&snapshot("a\"} 1\nevil_metric 2\\"), &Latencies::default());
        assert!(!out.lines().any(|l| l.starts_with("evil_metric")), "{out}");
        assert!(
            out.contains(r#"app="a\"} 1\nevil_metric 2\\""#),
            "not escaped: {out}"
        );
    }
}
