//! The registry: every application the coordinator knows, with what it was given, holds and
//! reported, and the shared state the transport, the control loop and HTTP read and change.

use crate::access;
use crate::metrics;
use crate::policy::{Candidate, Planner, Policy};
use crate::snapshot::{AppSnapshot, CurvePoint, Sample, Snapshot};
use crate::Config;
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{ghost_bucket_limit, AppKind, FromCoord, Report, GHOST_BUCKETS};
use tidepool_soft::budget::memory_stall_us;
use tidepool_soft::coord::Channel;

pub(crate) struct App {
    pub(crate) id: u32,
    /// Soft memory or a paged program (`tidepool run`).
    pub(crate) kind: AppKind,
    pub(crate) name: String,
    /// As the kernel saw it connect (SO_PEERCRED), not as it said.
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) weight: f64,
    pub(crate) segment: u64,
    /// Its budget's bounds: at most `capacity`; at least `min` while the pool allows.
    pub(crate) capacity: u64,
    pub(crate) min: u64,
    /// A soft arena's memory (measured and punched here); none for a paged program.
    pub(crate) memfd: Option<OwnedFd>,
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
    /// Mean time of a miss over the last epoch (a reconstruction, or a page fault served
    /// from far memory), nanoseconds.
    pub(crate) miss_nanos: f64,
    /// Per ghost bucket, smoothed: misses per second, and miss time per second (ns), that
    /// 2^k MiB more would have saved.
    pub(crate) curve_hits: [f64; GHOST_BUCKETS],
    pub(crate) curve_nanos: [f64; GHOST_BUCKETS],
    /// The budget its miss curve reaches: past it, more saved nothing lately (0: not known).
    pub(crate) reach_to: u64,
    /// Marginal utility over the probe alone (the miss curve's local slope), smoothed.
    pub(crate) near: f64,
    /// What it held at the end of each of the last epochs, oldest first.
    pub(crate) held_seen: VecDeque<u64>,
    /// Whether a report has come (the first is the base of the deltas).
    pub(crate) reported: bool,
    /// What it reported that made no sense, once said (so the log says it once).
    pub(crate) clamped_said: bool,
    pub(crate) punched_since_report: HashSet<u32>,
    pub(crate) shrink_deadline: Option<Instant>,
    pub(crate) punched_bytes: u64,
}

impl App {
    /// What it holds: a soft arena's memfd blocks; a paged program's resident bytes as it
    /// reports them, but never more than its process's resident set (the kernel's word).
    pub(crate) fn measure(&mut self) {
        match &self.memfd {
            Some(fd) => {
                if let Ok(st) = rustix::fs::fstat(fd) {
                    self.held = st.st_blocks as u64 * 512;
                }
            }
            None => {
                self.held = match resident_bytes(self.pid) {
                    Some(rss) => self.report.usage.min(rss),
                    None => 0, // gone
                };
            }
        }
    }

    /// Whether what it holds grew by more than two segments over the last epochs.
    pub(crate) fn filling(&self) -> bool {
        match (self.held_seen.front(), self.held_seen.back()) {
            (Some(&old), Some(&new)) => new > old + 2 * self.segment,
            _ => false,
        }
    }

    /// Notes what it holds at the end of an epoch (the last [`DEMAND_EPOCHS`] are kept).
    pub(crate) fn note_held(&mut self) {
        if self.held_seen.len() == DEMAND_EPOCHS as usize {
            self.held_seen.pop_front();
        }
        self.held_seen.push_back(self.held);
    }

    /// What a byte it holds saves per second at least (the planner's unit: nanoseconds for
    /// `midas`, hits for `hitrate`): its hits a second, times what a miss costs, over what it holds, times
    /// [`HELD_WORTH_SHARE`] (the bytes given up are its coldest, which take fewer than their
    /// share of the hits). 0 for a paged program (its hits are not seen).
    fn held_worth(&self, policy: Policy) -> f64 {
        if self.kind == AppKind::Paged || self.held == 0 {
            return 0.0;
        }
        let hits = self.reads_per_s * self.hit_rate;
        let each = match policy {
            Policy::Hitrate => 1.0,
            _ => self.miss_nanos,
        };
        hits * each / self.held as f64 * HELD_WORTH_SHARE
    }

    /// Its floor in the planner: its own minimum, else the coordinator's.
    fn floor(&self, default: u64) -> u64 {
        if self.min > 0 {
            self.min
        } else {
            default
        }
    }

    /// What the planner sees of it (`epochs`: the coordinator's count).
    pub(crate) fn candidate(&self, epochs: u64, floor: u64, policy: Policy) -> Candidate {
        // Budget given in the last seconds is being rebuilt into, not unused; so is budget
        // it is still filling (a paged program refills a page a fault: at a few thousand
        // faults a second, a grant of 100 MiB takes ten seconds to fill, and was taken back
        // as unused after four).
        let settled =
            !self.demand && epochs > self.grown_epoch + 2 * DEMAND_EPOCHS && !self.filling();
        Candidate {
            unused: if settled {
                self.budget.saturating_sub(self.held + 2 * self.segment)
            } else {
                0
            },
            held_worth: self.held_worth(policy),
            id: self.id,
            weight: self.weight,
            budget: self.budget,
            capacity: self.capacity,
            min: self.floor(floor),
            utility: self.utility,
            demand: self.demand,
            reach_to: self.reach_to,
            near: self.near,
        }
    }

    /// Sends without waiting: the control loop must never block on one application. One
    /// that has left its socket full (hundreds of messages unread) is cut off; its thread
    /// then sees the connection end and removes it. Any other failure means it is gone, which
    /// its thread notices too.
    pub(crate) fn send(&self, m: &FromCoord) {
        if let Err(e) = self.chan.send_now(&m.encode()) {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                tracing::warn!(
                    app = self.id,
                    name = %self.name,
                    "coordinator: an application does not read what it is sent; dropped"
                );
                self.chan.shut_down();
            }
        }
    }

    pub(crate) fn snapshot(&self, policy: Policy) -> AppSnapshot {
        AppSnapshot {
            id: self.id,
            kind: self.kind.to_string(),
            name: self.name.clone(),
            pid: self.pid,
            uid: self.uid,
            weight: self.weight,
            budget: self.budget,
            min: self.min,
            max: self.capacity,
            held: self.held,
            hits: self.report.hits,
            misses: self.report.misses,
            reconstructions: self.report.reconstructions,
            reconstruction_seconds: self.report.reconstruct_nanos as f64 / 1e9,
            hit_rate: self.hit_rate,
            reads_per_s: self.reads_per_s,
            rebuild_share: self.rebuild_share,
            miss_us: self.miss_nanos / 1e3,
            curve: (0..GHOST_BUCKETS)
                .map(|k| CurvePoint {
                    extra_mib: ghost_bucket_limit(k) >> 20,
                    misses_per_s: (self.reads_per_s * (1.0 - self.hit_rate) - self.curve_hits[k])
                        .max(0.0),
                    saved_ms_per_s: self.curve_nanos[k] / 1e6,
                })
                .collect(),
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

/// The share of an application's hits its coldest bytes are taken to carry, per byte, when
/// nothing better is known (see `App::held_worth`).
pub(crate) const HELD_WORTH_SHARE: f64 = 0.25;

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
        let weight = clamp_weight(weight, &a.name);
        a.weight = weight;
        a.send(&FromCoord::Weight { weight });
        tracing::info!(app, name = %a.name, weight, "weight changed");
        s.epoch_due = true;
        true
    }
}

/// The resident set of process `pid` in bytes (`/proc/PID/statm`), if it still runs.
fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * tidepool_sys::PAGE as u64)
}

/// The most and least weight a registration may have: an application that asks for more
/// than this cannot take every byte from the others.
pub(crate) const WEIGHTS: std::ops::RangeInclusive<f64> = 0.01..=100.0;

/// An application's weight within [`WEIGHTS`], with a log line if it asked for more or less.
pub(crate) fn clamp_weight(weight: f64, name: &str) -> f64 {
    let w = weight.clamp(*WEIGHTS.start(), *WEIGHTS.end());
    if w != weight {
        tracing::warn!(
            %name,
            asked = weight,
            given = w,
            "coordinator: weight out of range {:?}; clamped",
            WEIGHTS
        );
    }
    w
}
