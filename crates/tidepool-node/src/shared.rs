//! The state every connection thread, I/O worker and the metrics thread share: the arena, the
//! sections and their allocators' queues, tenants and sessions, limits and counters.

use crate::arena::Arena;
use crate::counters::NodeMetrics;
use crate::section::Section;
use crate::tenants::{Sessions, Tenants};
use crate::tls::TlsServer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// State every connection thread shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub arena: Arena,
    pub sections: Vec<Arc<Section>>,
    pub tenants: Tenants,
    pub sessions: Sessions,
    /// Random per start, carried in handles.
    pub epoch: u16,
    pub capacity: u64,
    pub max_body: u32,
    /// How long an I/O worker keeps polling after it last had work, before it sleeps.
    pub busy_poll: std::time::Duration,
    pub max_connections: usize,
    /// Unsent answers past which a connection is not read until it drains.
    pub max_outstanding: usize,
    /// `Some`: every connection is TLS.
    pub tls: Option<TlsServer>,
    pub connections: AtomicUsize,
    pub stopping: AtomicBool,
    pub metrics: NodeMetrics,
}

impl Shared {
    /// Sections in the order a connection should ask them for memory: most room first,
    /// discounted by how many requests are already queued there, so neither space nor allocator
    /// load piles up in one section. `rotor` breaks ties differently per call.
    pub fn schedule(&self, rotor: usize) -> Vec<u16> {
        let n = self.sections.len();
        let mut order: Vec<(u64, u16)> = (0..n)
            .map(|k| {
                let s = &self.sections[(rotor + k) % n];
                let used = s.used_bytes.load(Ordering::Relaxed);
                let reserved = s.reserved_bytes.load(Ordering::Relaxed);
                let room = s.len.saturating_sub(used + reserved);
                let queued = s.requests.len() as u64;
                (room / (1 + queued), s.id)
            })
            .collect();
        // Stable: equal scores keep the rotated order.
        order.sort_by_key(|&(score, _)| std::cmp::Reverse(score));
        order.into_iter().map(|(_, id)| id).collect()
    }

    pub fn node_counters(&self) -> Vec<(String, u64)> {
        let sum = |f: &dyn Fn(&Section) -> u64| self.sections.iter().map(|s| f(s)).sum::<u64>();
        vec![
            ("node.capacity".into(), self.capacity),
            (
                "node.bytes_allocated".into(),
                sum(&|s| s.used_bytes.load(Ordering::Relaxed)),
            ),
            (
                "node.bytes_reserved".into(),
                sum(&|s| s.reserved_bytes.load(Ordering::Relaxed)),
            ),
            (
                "node.free_page_bytes".into(),
                sum(&|s| s.free_page_bytes.load(Ordering::Relaxed)),
            ),
            (
                "node.metadata_bytes".into(),
                sum(&|s| s.slots.metadata_bytes() as u64),
            ),
            (
                "node.allocator_requests".into(),
                sum(&|s| s.served.load(Ordering::Relaxed)),
            ),
            ("node.sections".into(), self.sections.len() as u64),
            (
                "node.connections".into(),
                self.connections.load(Ordering::Relaxed) as u64,
            ),
            ("node.tenants".into(), self.tenants.all().len() as u64),
        ]
    }
}
