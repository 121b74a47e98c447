//! What the node counts. The data path only adds to plain counters: each I/O worker has its own
//! block of them ([`WorkerMetrics`]) that no other thread writes, so an increment is a load and a
//! store on a cache line nobody else touches. Request latency is recorded once per batch of
//! frames read together (every request of the batch counted with the batch's mean time), so a
//! 4 KiB get costs two clock reads per read call, not per request. [`crate::metrics`] renders
//! them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tidepool_proto::{ErrorCode, Op};

/// Every op of the protocol, in the order of [`WorkerMetrics::requests`].
pub(crate) const OPS: [(Op, &str); 15] = [
    (Op::Hello, "hello"),
    (Op::Put, "put"),
    (Op::Get, "get"),
    (Op::Take, "take"),
    (Op::Write, "write"),
    (Op::Free, "free"),
    (Op::PutMany, "put_many"),
    (Op::GetMany, "get_many"),
    (Op::TakeMany, "take_many"),
    (Op::WriteMany, "write_many"),
    (Op::FreeMany, "free_many"),
    (Op::EvictFetch, "evict_fetch"),
    (Op::Stats, "stats"),
    (Op::Scan, "scan"),
    (Op::Gather, "gather"),
];

fn op_index(op: Op) -> usize {
    match op {
        Op::Hello => 0,
        Op::Put => 1,
        Op::Get => 2,
        Op::Take => 3,
        Op::Write => 4,
        Op::Free => 5,
        Op::PutMany => 6,
        Op::GetMany => 7,
        Op::TakeMany => 8,
        Op::WriteMany => 9,
        Op::FreeMany => 10,
        Op::EvictFetch => 11,
        Op::Stats => 12,
        Op::Scan => 13,
        Op::Gather => 14,
    }
}

/// Why something failed, for `tidepool_node_errors_total{kind}`: the protocol's error codes
/// (indexed by their value) and what happens below the protocol.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failure {
    Code(ErrorCode),
    /// A TLS handshake or record that rustls refused.
    Tls,
    /// A plain-TCP client at a node that accepts only TLS.
    TlsRequired,
}

pub(crate) const FAILURE_KINDS: usize = 17;

impl Failure {
    fn index(self) -> usize {
        match self {
            Failure::Code(c) => c as usize,
            Failure::Tls => 14,
            Failure::TlsRequired => 15,
        }
    }

    pub(crate) fn name(index: usize) -> Option<&'static str> {
        use ErrorCode::*;
        if let Ok(code) = ErrorCode::try_from(index as u8) {
            return Some(match code {
                Malformed => "malformed",
                UnsupportedVersion => "unsupported_version",
                NotAuthenticated => "not_authenticated",
                AuthFailed => "auth_failed",
                InvalidHandle => "invalid_handle",
                StaleHandle => "stale_handle",
                QuotaExceeded => "quota_exceeded",
                CapacityExhausted => "capacity_exhausted",
                TooLarge => "too_large",
                Busy => "busy",
                Internal => "internal",
                AlreadyAuthenticated => "already_authenticated",
                BadOffload => "bad_offload",
                StoreMismatch => "store_mismatch",
            });
        }
        match index {
            14 => Some("tls"),
            15 => Some("tls_required"),
            _ => None,
        }
    }
}

/// Upper bounds of the latency buckets, in nanoseconds: 5 us to 100 ms (a 4 KiB get served
/// from memory takes a few microseconds; a batch of a thousand pages a few milliseconds).
pub(crate) const BUCKETS_NS: [u64; 14] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
];

/// Adds to a counter that only the calling thread writes: a plain load and store, no locked
/// instruction. Readers on other threads see some recent value, never a torn one.
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// One I/O worker's counters. Only that worker writes them; aligned so that two workers'
/// blocks never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct WorkerMetrics {
    pub(crate) requests: [AtomicU64; OPS.len()],
    pub(crate) failures: [AtomicU64; FAILURE_KINDS],
    pub(crate) auth_failures: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    pub(crate) sent_bytes: AtomicU64,
    /// Answers this worker's connections hold for clients that have not read them yet
    /// (a gauge: each connection adds the change in its own share).
    pub(crate) unsent_bytes: AtomicU64,
    /// Per bucket (the last is +Inf), not cumulative.
    pub(crate) latency_buckets: [AtomicU64; BUCKETS_NS.len() + 1],
    pub(crate) latency_sum_ns: AtomicU64,
}

impl WorkerMetrics {
    pub fn request(&self, op: Op) {
        bump(&self.requests[op_index(op)], 1);
    }

    pub fn failure(&self, f: Failure) {
        bump(&self.failures[f.index()], 1);
    }

    pub fn auth_failure(&self) {
        bump(&self.auth_failures, 1);
    }

    pub fn received(&self, n: usize) {
        bump(&self.received_bytes, n as u64);
    }

    pub fn sent(&self, n: usize) {
        bump(&self.sent_bytes, n as u64);
    }

    /// Changes the unsent-bytes gauge by `now - before` (one connection's share).
    pub fn unsent_changed(&self, before: usize, now: usize) {
        let delta = (now as u64).wrapping_sub(before as u64);
        bump(&self.unsent_bytes, delta);
    }

    /// Records `requests` served together in `elapsed`: each with the batch's mean time.
    pub fn served(&self, requests: u64, elapsed: Duration) {
        if requests == 0 {
            return;
        }
        let total = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        let each = total / requests;
        let bucket = BUCKETS_NS
            .iter()
            .position(|&bound| each <= bound)
            .unwrap_or(BUCKETS_NS.len());
        bump(&self.latency_buckets[bucket], requests);
        bump(&self.latency_sum_ns, total);
    }
}

/// Counters of the accept thread and the blocks of the I/O workers.
#[derive(Debug)]
pub(crate) struct NodeMetrics {
    pub accepted: AtomicU64,
    /// Connections turned away at the connection limit.
    pub refused_busy: AtomicU64,
    pub workers: Box<[WorkerMetrics]>,
}

impl NodeMetrics {
    pub fn new(workers: usize) -> NodeMetrics {
        NodeMetrics {
            accepted: AtomicU64::new(0),
            refused_busy: AtomicU64::new(0),
            workers: (0..workers).map(|_| WorkerMetrics::default()).collect(),
        }
    }

    pub(crate) fn sum(&self, f: impl Fn(&WorkerMetrics) -> &AtomicU64) -> u64 {
        self.workers
            .iter()
            .map(|w| f(w).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Answers held for slow readers, all connections together.
    pub fn unsent_bytes(&self) -> u64 {
        self.sum(|w| &w.unsent_bytes)
    }
}

/// A label value from outside (a tenant's name), escaped as it is written.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_kind_and_op_has_a_name() {
        for code in 1..=13u8 {
            let code = ErrorCode::try_from(code).unwrap();
            assert!(Failure::name(Failure::Code(code).index()).is_some());
        }
        assert_eq!(Failure::name(Failure::Tls.index()), Some("tls"));
        assert_eq!(
            Failure::name(Failure::TlsRequired.index()),
            Some("tls_required")
        );
        for (i, (op, _)) in OPS.iter().enumerate() {
            assert_eq!(op_index(*op), i);
        }
    }

    #[test]
    fn latency_goes_to_the_bucket_of_the_mean() {
        let w = WorkerMetrics::default();
        w.served(4, Duration::from_micros(24)); // 6 us each
        w.served(1, Duration::from_secs(1));
        assert_eq!(w.latency_buckets[1].load(Ordering::Relaxed), 4);
        assert_eq!(
            w.latency_buckets[BUCKETS_NS.len()].load(Ordering::Relaxed),
            1
        );
        assert_eq!(w.latency_sum_ns.load(Ordering::Relaxed), 1_000_024_000);
    }

    #[test]
    fn the_unsent_gauge_follows_each_connections_share() {
        let w = WorkerMetrics::default();
        w.unsent_changed(0, 100);
        w.unsent_changed(0, 50);
        w.unsent_changed(100, 10);
        assert_eq!(w.unsent_bytes.load(Ordering::Relaxed), 60);
    }
}
