//! The node's Prometheus (OpenMetrics text) rendering for `tidepool node --metrics ADDR`:
//! sums the I/O workers' counter blocks ([`crate::counters`]) into a fresh registry on the
//! metrics thread, off the data path.

use crate::counters::{Failure, BUCKETS_NS, FAILURE_KINDS, OPS};
use crate::shared::Shared;
use crate::tenants::Tenant;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use tidepool_proto::ErrorCode;
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Escaped(String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        tidepool_proto::exposition::escape_label_value(&self.0, encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: Escaped,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// A per-tenant gauge: name, help, and how to read it.
type TenantGauge = (&'static str, &'static str, fn(&Tenant) -> u64);

/// Labelled series in the order given (a `Family` would print them in hash order): ops in
/// protocol order, error kinds in code order, tenants in the order they first connected.
#[derive(Debug)]
struct Series<L, M> {
    kind: MetricType,
    series: Vec<(L, M)>,
}

impl<L: EncodeLabelSet, M: EncodeMetric> EncodeMetric for Series<L, M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, metric) in &self.series {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// A histogram already counted (by the workers), encoded as one.
#[derive(Debug)]
struct CountedHistogram {
    sum_seconds: f64,
    count: u64,
    /// (upper bound in seconds, count in this bucket alone); the last bound is `f64::MAX`.
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for CountedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn counter(value: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(value);
    c
}

fn gauge(value: u64) -> Gauge {
    let g = Gauge::default();
    g.set(value.min(i64::MAX as u64) as i64);
    g
}

/// The node's metrics now, as OpenMetrics text.
pub(crate) fn render(sh: &Shared) -> String {
    let mut root = Registry::default();
    root.register(
        "tidepool_build",
        "The version and commit of this build",
        Info::new(BuildLabels {
            version: tidepool_proto::build::VERSION,
            commit: tidepool_proto::build::COMMIT,
        }),
    );
    let r = root.sub_registry_with_prefix("tidepool_node");
    register_counters(r, sh);
    register_latency(r, sh);
    register_gauges(r, sh);
    register_tenants(r, sh);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &root);
    out
}

/// The counters: requests by op, errors by kind, bytes, connections (prometheus-client
/// appends `_total`).
fn register_counters(r: &mut Registry, sh: &Shared) {
    let m = &sh.metrics;
    let requests = Series {
        kind: MetricType::Counter,
        series: OPS
            .iter()
            .enumerate()
            .map(|(i, (_, op))| (OpLabel { op }, counter(m.sum(|w| &w.requests[i]))))
            .collect(),
    };
    r.register("requests", "Requests served, by op", requests);
    let mut errors = Series {
        kind: MetricType::Counter,
        series: vec![],
    };
    for i in 0..FAILURE_KINDS {
        let Some(kind) = Failure::name(i) else {
            continue;
        };
        let mut n = m.sum(|w| &w.failures[i]);
        if i == ErrorCode::Busy as usize {
            n += m.refused_busy.load(Ordering::Relaxed);
        }
        errors.series.push((KindLabel { kind }, counter(n)));
    }
    r.register(
        "errors",
        "Requests and connections refused, by kind (batch items each count)",
        errors,
    );
    r.register(
        "auth_failures",
        "Hellos refused: unknown tenant or wrong token",
        counter(m.sum(|w| &w.auth_failures)),
    );
    r.register(
        "received_bytes",
        "Bytes read from clients (TLS records included)",
        counter(m.sum(|w| &w.received_bytes)),
    );
    r.register(
        "sent_bytes",
        "Bytes sent to clients (TLS records included)",
        counter(m.sum(|w| &w.sent_bytes)),
    );
    r.register(
        "connections_accepted",
        "Connections accepted",
        counter(m.accepted.load(Ordering::Relaxed)),
    );
}

/// The latency histogram, summed over the workers.
fn register_latency(r: &mut Registry, sh: &Shared) {
    let m = &sh.metrics;
    let mut buckets: Vec<(f64, u64)> = BUCKETS_NS
        .iter()
        .enumerate()
        .map(|(i, &ns)| (ns as f64 / 1e9, m.sum(|w| &w.latency_buckets[i])))
        .collect();
    buckets.push((f64::MAX, m.sum(|w| &w.latency_buckets[BUCKETS_NS.len()])));
    r.register(
        "request_duration_seconds",
        "Time to serve a request, from its bytes read to its answer queued (each request of a \
         batch read together counts the batch's mean)",
        CountedHistogram {
            sum_seconds: m.sum(|w| &w.latency_sum_ns) as f64 / 1e9,
            count: buckets.iter().map(|b| b.1).sum(),
            buckets,
        },
    );
}

/// The node's gauges: connections, memory, unsent answers.
fn register_gauges(r: &mut Registry, sh: &Shared) {
    let m = &sh.metrics;
    let node = sh.node_counters();
    let get = |name: &str| node.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v);
    for (name, help, value) in [
        (
            "connections",
            "Connections open",
            sh.connections.load(Ordering::Relaxed) as u64,
        ),
        ("capacity_bytes", "Memory served", sh.capacity),
        (
            "allocated_bytes",
            "Memory in blocks holding objects",
            get("node.bytes_allocated"),
        ),
        (
            "reserved_bytes",
            "Memory in blocks reserved by connections for their next puts",
            get("node.bytes_reserved"),
        ),
        (
            "metadata_bytes",
            "Memory of the slot tables",
            get("node.metadata_bytes"),
        ),
        (
            "unsent_bytes",
            "Answers waiting for clients to read them, all connections together",
            m.unsent_bytes(),
        ),
        (
            "max_outstanding_bytes",
            "Unsent answers past which a connection is not read (--max-outstanding)",
            sh.max_outstanding as u64,
        ),
    ] {
        r.register(name, help, gauge(value));
    }
}

/// Each tenant's gauges, tenants in the order they first connected.
fn register_tenants(r: &mut Registry, sh: &Shared) {
    let tenants = sh.tenants.all();
    let per_tenant: [TenantGauge; 5] = [
        (
            "tenant_stored_bytes",
            "Bytes of the tenant's objects",
            |t| t.stats.bytes_live.load(Ordering::Relaxed),
        ),
        (
            "tenant_allocated_bytes",
            "Block bytes charged to the tenant's quota",
            |t| t.stats.bytes_allocated.load(Ordering::Relaxed),
        ),
        ("tenant_quota_bytes", "The tenant's quota", |t| t.quota),
        ("tenant_objects", "Objects the tenant holds", |t| {
            t.stats.objects.load(Ordering::Relaxed)
        }),
        (
            "tenant_connections",
            "Connections of the tenant open",
            |t| t.stats.connections.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, f) in per_tenant {
        let series = tenants
            .iter()
            .map(|t| {
                let label = TenantLabel {
                    tenant: Escaped(t.name.clone()),
                };
                (label, gauge(f(t)))
            })
            .collect();
        r.register(
            name,
            help,
            Series {
                kind: MetricType::Gauge,
                series,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let label = TenantLabel {
            tenant: Escaped("we\"b\\\nx".into()),
        };
        let mut r = Registry::default();
        r.register(
            "t",
            "t",
            Series {
                kind: MetricType::Gauge,
                series: vec![(label, gauge(1))],
            },
        );
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(out.contains(r#"t{tenant="we\"b\\\nx"} 1"#), "{out}");
    }
}
