//! The registry: every application the coordinator knows, with what it was given, holds and
//! reported, and the shared state the transport, the control loop and HTTP read and change.

use crate::access;
use crate::metrics;
use crate::policy::{Candidate, Planner, Policy};
use crate::snapshot::{AppSnapshot, Sample, Snapshot};
use crate::Config;
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{FromCoord, Report};
use tidepool_soft::budget::memory_stall_us;
use tidepool_soft::coord::Channel;

pub(crate) struct App {
    pub(crate) id: u32,
    pub(crate) name: String,
    /// As the kernel saw it connect (SO_PEERCRED), not as it said.
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) weight: f64,
    pub(crate) segment: u64,
    pub(crate) capacity: u64,
    pub(crate) memfd: OwnedFd,
    pub(crate) chan: Arc<Channel>,
    pub(crate) budget: u64,
    pub(crate) held: u64,
    pub(crate) report: Report,
    pub(crate) base: Report,
    pub(crate) base_at: Instant,
    pub(crate) last_report: Instant,
    pub(crate) joined: Instant,
    pub(crate) utility: f64,
    pub(crate) demand: bool,
    /// The last epoch in which it dropped objects to make room, and the last in which its
    /// budget grew (a drop counts as wanting more only if it came after the growth).
    pub(crate) dropped_epoch: Option<u64>,
    pub(crate) grown_epoch: u64,
    pub(crate) hit_rate: f64,
    pub(crate) reads_per_s: f64,
    pub(crate) rebuild_share: f64,
    pub(crate) punched_since_report: HashSet<u32>,
    pub(crate) shrink_deadline: Option<Instant>,
    pub(crate) punched_bytes: u64,
}

impl App {
    pub(crate) fn measure(&mut self) {
        if let Ok(st) = rustix::fs::fstat(&self.memfd) {
            self.held = st.st_blocks as u64 * 512;
        }
    }

    /// What the planner sees of it (`epochs`: the coordinator's count).
    pub(crate) fn candidate(&self, epochs: u64) -> Candidate {
        // Budget given in the last seconds is being rebuilt into, not unused.
        let settled = !self.demand && epochs > self.grown_epoch + 2 * DEMAND_EPOCHS;
        Candidate {
            unused: if settled {
                self.budget.saturating_sub(self.held + 2 * self.segment)
            } else {
                0
            },
            id: self.id,
            weight: self.weight,
            budget: self.budget,
            capacity: self.capacity,
            utility: self.utility,
            demand: self.demand,
        }
    }

    pub(crate) fn send(&self, m: &FromCoord) {
        // A failed send means the runtime is gone; its own thread notices and removes it.
        let _ = self.chan.send(&m.encode());
    }

    pub(crate) fn snapshot(&self, policy: Policy) -> AppSnapshot {
        AppSnapshot {
            id: self.id,
            name: self.name.clone(),
            pid: self.pid,
            uid: self.uid,
            weight: self.weight,
            budget: self.budget,
            held: self.held,
            hits: self.report.hits,
            misses: self.report.misses,
            reconstructions: self.report.reconstructions,
            reconstruction_seconds: self.report.reconstruct_nanos as f64 / 1e9,
            hit_rate: self.hit_rate,
            reads_per_s: self.reads_per_s,
            rebuild_share: self.rebuild_share,
            utility_per_mib: self.utility
                * (1 << 20) as f64
                * if policy == Policy::Midas { 1e-6 } else { 1.0 },
            punched_bytes: self.punched_bytes,
            seconds: self.joined.elapsed().as_secs_f64(),
        }
    }
}

pub(crate) struct State {
    pub(crate) apps: Vec<App>,
    /// Soft memory in all never exceeds this (the operator may change it).
    pub(crate) max: u64,
    pub(crate) next_id: u32,
    pub(crate) planner: Planner,
    pub(crate) mem_available: u64,
    pub(crate) headroom: u64,
    pub(crate) pool: u64,
    pub(crate) pressure: f64,
    pub(crate) below_since: Option<Instant>,
    pub(crate) longest_below: Duration,
    pub(crate) punched_bytes: u64,
    pub(crate) epoch_due: bool,
    /// Epochs so far.
    pub(crate) epochs: u64,
    pub(crate) history: VecDeque<Sample>,
}

/// Epochs a drop counts as wanting more. Evacuation drops in bursts: an application that
/// holds nearly all it uses drops a few objects every second or two, not every epoch.
pub(crate) const DEMAND_EPOCHS: u64 = 8;

pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The user the coordinator runs as: it (and root) may change any registration.
    pub(crate) owner_uid: u32,
    /// Bearer token for changes over HTTP.
    pub(crate) token: String,
    /// The token's file, and whether this coordinator made it (then it goes at stop).
    pub(crate) token_file: PathBuf,
    pub(crate) made_token: bool,
    pub(crate) latencies: metrics::Latencies,
    pub(crate) state: Mutex<State>,
    pub(crate) stop: AtomicBool,
    pub(crate) started: Instant,
}

impl Shared {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let s = self.state.lock();
        let below = s
            .below_since
            .map(|t| t.elapsed())
            .unwrap_or_default()
            .max(s.longest_below);
        Snapshot {
            seconds: self.started.elapsed().as_secs_f64(),
            policy: s.planner.policy,
            reserve: self.config.reserve,
            mem_available: s.mem_available,
            headroom: s.headroom,
            pool: s.pool,
            granted: s.apps.iter().map(|a| a.budget).sum(),
            held: s.apps.iter().map(|a| a.held).sum(),
            pressure: s.pressure,
            memory_stall_seconds: memory_stall_us().unwrap_or(0) as f64 / 1e6,
            longest_below_reserve_ms: below.as_secs_f64() * 1e3,
            punched_bytes: s.punched_bytes,
            apps: s
                .apps
                .iter()
                .map(|a| a.snapshot(s.planner.policy))
                .collect(),
        }
    }

    /// A weight change asked for over the socket by `peer` (from application `own`'s connection,
    /// if it has registered): the answer to send back.
    pub(crate) fn command_set_weight(
        &self,
        peer: tidepool_soft::coord::Peer,
        own: Option<u32>,
        app: u32,
        weight: f64,
    ) -> FromCoord {
        let app_uid = self
            .state
            .lock()
            .apps
            .iter()
            .find(|a| a.id == app)
            .map(|a| a.uid);
        let Some(app_uid) = app_uid else {
            return FromCoord::Error {
                message: format!("no application {app}"),
            };
        };
        if !access::may_change(peer, self.owner_uid, app_uid, own == Some(app)) {
            tracing::warn!(
                app,
                uid = peer.uid,
                pid = peer.pid,
                "coordinator: refused a weight change from another user"
            );
            return FromCoord::Error {
                message: format!(
                    "refused: uid {} may change only applications that run as uid {0}, and \
                     application {app} does not; ask the coordinator's owner (uid {}) or root",
                    peer.uid, self.owner_uid
                ),
            };
        }
        if self.set_weight(app, weight) {
            FromCoord::Weight { weight }
        } else {
            FromCoord::Error {
                message: format!("no application {app}"),
            }
        }
    }

    pub(crate) fn set_weight(&self, app: u32, weight: f64) -> bool {
        if !(weight.is_finite() && weight > 0.0) {
            return false;
        }
        let mut s = self.state.lock();
        let Some(a) = s.apps.iter_mut().find(|a| a.id == app) else {
            return false;
        };
        a.weight = weight;
        a.send(&FromCoord::Weight { weight });
        tracing::info!(app, name = %a.name, weight, "weight changed");
        s.epoch_due = true;
        true
    }
}
