//! An epoch's reading of one application's reports: its miss rate and miss cost, its miss
//! curve, its marginal utility, whether it wants more; with what no program can have done
//! clamped.

use crate::policy::Policy;
use crate::registry::{App, DEMAND_EPOCHS};
use tidepool_proto::coord::{ghost_bucket_limit, GHOST_BUCKETS};

/// Miss time per second a report may claim, per CPU: threads blocked on far faults spend no
/// CPU, so a paged program with many threads may wait more than its CPUs' time.
const MISS_TIME_CPUS: f64 = 16.0;

/// An epoch's reports, read: counts over the epoch, and the scales that clamp the ghost
/// figures to what the application can have done.
struct EpochDeltas {
    hits: f64,
    misses: f64,
    /// Miss time (ns), clamped to what its CPUs allow.
    clamp_time: f64,
    /// Per ghost bucket: hits, and miss time (ns).
    ghost_hits: Vec<f64>,
    ghost_nanos: Vec<f64>,
    hit_scale: f64,
    nano_scale: f64,
}

impl App {
    /// Reads the reports since the last epoch (`epochs`: the coordinator's count, `probe`: the
    /// bytes the planner's next move to it would shift, `pool`: the memory shared).
    pub(crate) fn read_epoch(&mut self, epochs: u64, probe: u64, pool: u64, policy: Policy) {
        // The smallest ghost bucket that covers the probe.
        let k = (0..GHOST_BUCKETS)
            .find(|&k| ghost_bucket_limit(k) >= probe)
            .unwrap_or(GHOST_BUCKETS - 1);
        let secs = self.last_report.duration_since(self.base_at).as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let dl = self.epoch_deltas(secs);
        self.read_rates(&dl, secs);
        let (best, reach, near) = gains(&dl, k, pool, policy);
        let (r, b) = (&self.report, &self.base);
        // Dropping objects (evicting pages) to make room is wanting more. (Not also "holds
        // its whole budget": an arena keeps a few segments of its budget unpopulated as it
        // evacuates, so that test starved every application of grants.)
        if r.bytes_dropped > b.bytes_dropped {
            self.dropped_epoch = Some(epochs);
        }
        // Ghost hits say what more memory would save only while memory is short: one that
        // has room to spare (it neither dropped nor evicted lately, and holds well under its
        // budget) is fetching back what was dropped before it had this budget, and more would
        // save nothing. (A paged program refilling after a grant showed its best utility of
        // the run with half its budget unused, and kept pulling memory it never filled.)
        let short = self
            .dropped_epoch
            .is_some_and(|e| epochs - e < DEMAND_EPOCHS)
            || self.held + 4 * self.segment + self.budget / 32 >= self.budget;
        let u = if short { best / secs } else { 0.0 };
        self.utility = 0.5 * self.utility + 0.5 * u;
        // The slope over the probe alone: what the bytes at its budget's edge are worth, and
        // so (the curve read backwards) what giving a step up would lose. A scan over more
        // than it has gains from more memory (the hull) but loses nothing from less: it
        // misses on every page either way. With the hull as its loss, a thrashing scan was
        // kept whole and a Zipfian program, whose every byte saved faults, was cut instead.
        let n = if short { near / secs } else { 0.0 };
        self.near = 0.5 * self.near + 0.5 * n;
        // The budget past which its curve shows nothing to gain (the farthest ghost hit
        // over its budget now): grants stop there. A scan of 770 MiB had been granted 1090
        // while a dear cache waited. Kept through epochs without ghost hits.
        if short && reach > 0 {
            self.reach_to = self.budget + reach;
        }
        self.demand = self
            .dropped_epoch
            .is_some_and(|e| e > self.grown_epoch && epochs - e < DEMAND_EPOCHS);
        let (r, b) = (&self.report, &self.base);
        tracing::debug!(
            app = self.id,
            name = %self.name,
            budget = self.budget >> 20,
            held = self.held >> 20,
            dropped = r.bytes_dropped.saturating_sub(b.bytes_dropped) >> 20,
            utility = self.utility,
            demand = self.demand,
            secs,
            "epoch"
        );
        self.base = r.clone();
        self.base_at = self.last_report;
    }

    /// The counts of the `secs` since the last epoch, with what no program can have done
    /// clamped (and said so, once).
    fn epoch_deltas(&mut self, secs: f64) -> EpochDeltas {
        let (r, b) = (&self.report, &self.base);
        let d = |x: u64, y: u64| x.saturating_sub(y) as f64;
        let hits = d(r.hits, b.hits);
        let misses = d(r.misses, b.misses);
        // What no program can have done is clamped: more miss time per second than every
        // CPU spending all of it (times a margin for threads blocked on faults), or ghost
        // hits beyond its misses and ghost time beyond its miss time.
        let limit = secs * 1e9 * MISS_TIME_CPUS * tidepool_sys::online_cpus().max(1) as f64;
        let miss_time = d(r.reconstruct_nanos, b.reconstruct_nanos);
        let ghost_hits: Vec<f64> = (0..GHOST_BUCKETS)
            .map(|i| d(r.ghost_hits[i], b.ghost_hits[i]))
            .collect();
        let ghost_nanos: Vec<f64> = (0..GHOST_BUCKETS)
            .map(|i| d(r.ghost_nanos[i], b.ghost_nanos[i]))
            .collect();
        let (gh, gn) = (
            ghost_hits.iter().sum::<f64>(),
            ghost_nanos.iter().sum::<f64>(),
        );
        // (Counters a report reads one after the other race with the misses they count: a
        // little more ghost than miss is normal, and not clamped.)
        let clamp_time = miss_time.min(limit);
        let (most_hits, most_time) = (misses * 1.25 + 64.0, clamp_time * 1.25 + 1e6);
        let hit_scale = if gh > most_hits { most_hits / gh } else { 1.0 };
        let nano_scale = if gn > most_time { most_time / gn } else { 1.0 };
        if (miss_time > limit || hit_scale < 1.0 || nano_scale < 1.0) && !self.clamped_said {
            tracing::warn!(
                app = self.id,
                name = %self.name,
                miss_seconds_per_s = miss_time / secs / 1e9,
                ghost_hits = gh,
                misses,
                "coordinator: an application reported more than it can have done (miss time \
                 past what the CPUs allow, or ghost hits past its misses); its figures are \
                 clamped"
            );
            self.clamped_said = true;
        }
        EpochDeltas {
            hits,
            misses,
            clamp_time,
            ghost_hits,
            ghost_nanos,
            hit_scale,
            nano_scale,
        }
    }

    /// Its hit rate, reads and rebuild time per second, miss cost and smoothed miss curve,
    /// from the epoch's counts.
    fn read_rates(&mut self, dl: &EpochDeltas, secs: f64) {
        let (hits, misses) = (dl.hits, dl.misses);
        self.hit_rate = if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            self.hit_rate
        };
        self.reads_per_s = (hits + misses) / secs;
        self.rebuild_share = dl.clamp_time / secs / 1e9;
        let r = &self.report;
        if misses > 0.0 {
            self.miss_nanos = dl.clamp_time / misses;
        } else if r.misses > 0 && self.miss_nanos == 0.0 {
            // No miss this epoch, none seen yet: what its misses cost over its life.
            self.miss_nanos = (r.reconstruct_nanos as f64 / r.misses as f64).min(1e9);
        }
        let (mut ch, mut cn) = (0.0, 0.0);
        for i in 0..GHOST_BUCKETS {
            ch += dl.ghost_hits[i] * dl.hit_scale / secs;
            cn += dl.ghost_nanos[i] * dl.nano_scale / secs;
            self.curve_hits[i] = 0.5 * self.curve_hits[i] + 0.5 * ch;
            self.curve_nanos[i] = 0.5 * self.curve_nanos[i] + 0.5 * cn;
        }
    }
}

/// Gain per byte: over the probe (bucket `k`; the `near` slope), or over any larger extension
/// the `pool` could give, whichever is more (`best`: the miss curve's convex hull, as Talus
/// makes a cache's); and `reach`, the farthest extension that saved anything. A scan over
/// more than it has hits nothing until it fits: its ghost hits all lie at one distance, past
/// any one step, and with the probe alone it looked worth nothing while 90 MiB more would
/// have made it run at full speed.
fn gains(dl: &EpochDeltas, k: usize, pool: u64, policy: Policy) -> (f64, u64, f64) {
    let saved = |i: usize| match policy {
        Policy::Hitrate => dl.ghost_hits[i] * dl.hit_scale,
        _ => dl.ghost_nanos[i] * dl.nano_scale,
    };
    let mut sum: f64 = (0..k).map(saved).sum();
    let (mut best, mut reach, mut near) = (0.0f64, 0, 0.0);
    for i in k..GHOST_BUCKETS {
        if i > k && ghost_bucket_limit(i - 1) > pool {
            break;
        }
        sum += saved(i);
        best = best.max(sum / ghost_bucket_limit(i) as f64);
        if i == k {
            near = best;
        }
        if saved(i) > 0.0 {
            reach = ghost_bucket_limit(i);
        }
    }
    (best, reach, near)
}
