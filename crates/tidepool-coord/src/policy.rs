//! How the soft-memory pool is split (Midas §4.3.2). No I/O: the server feeds in what it
//! measured and sends out what comes back.
//!
//! - `midas`: maximise Σ wᵢ Γᵢ(mᵢ) with Γᵢ = −(time spent reconstructing). The marginal
//!   utility of an application is the reconstruction time per second that Δ more bytes would
//!   save, read off its ghost hits ([`tidepool_soft::demand`]); memory climbs from the
//!   application where it is worth least to the one where it is worth most, a step at a time.
//!   Each application has its own stride: it lengthens while the application keeps
//!   receiving and halves when it turns to giving (damping). One shared stride was shrunk
//!   to a segment by the small caches' back-and-forth, and the application that needed a
//!   lot more (a dear one filling up) then climbed at a segment a move.
//! - `hitrate`: the same climb on hits per second instead of time (Cliffhanger: the best
//!   overall hit rate, whatever a miss costs).
//! - `static`: an even split (by weight), whatever the applications need.
//!
//! Idle memory not yet wanted stays unallocated and is granted, in steps, to applications that
//! are evicting (they want more): small grants that the next epoch's utilities judge.
//!
//! Ghost hits tell what more memory would *gain*; what a giver would *lose* is another
//! number, and for a concave utility a larger one. An application that holds everything it
//! uses drops nothing, has no ghost hits, and looks worth nothing as a giver, though every
//! byte taken from it is an object to rebuild. So the planner remembers, for each
//! application, the slopes its curve showed at smaller budgets (a probe by revocation that
//! has already happened): the loss of giving a step is what it was worth within a step below
//! its budget, fading with a half-life of `memory_epochs`. Gains are read off the curve's
//! hull (a scan gains nothing until it fits, then everything), losses off its slope (a scan
//! that does not fit loses nothing from less), as Talus reads a cliff.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A coordination policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Midas,
    Hitrate,
    Static,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "midas" => Ok(Policy::Midas),
            "hitrate" => Ok(Policy::Hitrate),
            "static" => Ok(Policy::Static),
            _ => Err(format!(
                "unknown policy {s:?}: choose midas, hitrate or static"
            )),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Midas => "midas",
            Policy::Hitrate => "hitrate",
            Policy::Static => "static",
        })
    }
}

/// What the planner knows of one application.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub weight: f64,
    pub budget: u64,
    /// The most it may have (an arena's address space, a paged program's maximum).
    pub capacity: u64,
    /// The least it should have while the pool allows (its minimum, else the coordinator's
    /// floor).
    pub min: u64,
    /// Marginal utility: what one more byte would save per second (reconstruction
    /// nanoseconds for `midas`, hits for `hitrate`), smoothed: the best over any extension
    /// the pool allows (its miss curve's hull).
    pub utility: f64,
    /// The same over the next step alone (the curve's slope at its budget): what the bytes
    /// at the edge of its budget save, and so what giving some up would lose. Far under the
    /// hull for a scan that does not fit, which misses on every page with less as with more.
    pub near: f64,
    /// It dropped objects to make room lately: it wants more.
    pub demand: bool,
    /// Budget it has had for a while without using (not counting an evacuating arena's
    /// free segments): giving it up costs nothing.
    pub unused: u64,
    /// A floor on what a byte it holds is worth (same unit as `utility`), from its hits and
    /// what a miss costs it: what giving memory up costs an application that has never been
    /// smaller, and so has no utilities remembered below its budget. 0 if its hits are not
    /// seen (a paged program's are plain memory accesses).
    pub held_worth: f64,
    /// The budget its miss curve reaches (its farthest recent ghost hit): more than that
    /// would save nothing. 0 if not known.
    pub reach_to: u64,
}

impl Candidate {
    fn value(&self) -> f64 {
        self.weight * self.utility
    }

    /// What it could use over budget `b`: up to its curve's reach (in whole segments) and
    /// its capacity.
    fn room(&self, b: u64, segment: u64) -> u64 {
        let gap = self.capacity.saturating_sub(b);
        match self.reach_to {
            0 => gap,
            r => (r.saturating_sub(b).div_ceil(segment) * segment).min(gap),
        }
    }
}

/// The climb's state between epochs.
#[derive(Debug, Clone)]
pub struct Planner {
    pub policy: Policy,
    /// Bytes a budget rounds to.
    pub segment: u64,
    /// No budget goes under this (while the pool allows).
    pub floor: u64,
    /// Bytes a first move to an application shifts.
    step: u64,
    /// Per application: the bytes a move to it shifts, and whether its last move was
    /// receiving.
    strides: HashMap<u32, Stride>,
    /// A move needs the receiver's value over the giver's by this factor.
    pub hysteresis: f64,
    /// Plans made so far.
    epoch: u64,
    /// Per application: utilities it showed at budgets it had, newest last.
    seen: HashMap<u32, Vec<Seen>>,
    /// Epochs over which a remembered utility halves.
    pub memory_epochs: f64,
}

/// One application's climb.
#[derive(Debug, Clone, Copy)]
struct Stride {
    step: u64,
    received: bool,
}

/// The slope of its curve an application showed at a budget.
#[derive(Debug, Clone, Copy)]
struct Seen {
    budget: u64,
    near: f64,
    epoch: u64,
}

/// Budgets remembered per application.
const SEEN: usize = 64;

/// Raises budgets to their minimums (within capacity), most valuable first, as far as idle
/// memory (`spare`) allows.
fn give_minimums(apps: &[Candidate], b: &mut [u64], spare: &mut u64) {
    let mut order: Vec<usize> = (0..apps.len()).collect();
    order.sort_by(|&x, &y| apps[y].value().total_cmp(&apps[x].value()));
    for &i in &order {
        let g = apps[i]
            .min
            .min(apps[i].capacity)
            .saturating_sub(b[i])
            .min(*spare);
        b[i] += g;
        *spare -= g;
    }
}

impl Planner {
    pub fn new(policy: Policy, segment: u64, floor: u64) -> Planner {
        Planner {
            policy,
            segment,
            floor,
            step: 0,
            strides: HashMap::new(),
            hysteresis: 1.1,
            epoch: 0,
            seen: HashMap::new(),
            memory_epochs: 120.0,
        }
    }

    /// Records what each application is worth at its budget now, and forgets applications
    /// that left.
    fn remember(&mut self, apps: &[Candidate]) {
        self.epoch += 1;
        self.seen.retain(|id, _| apps.iter().any(|a| a.id == *id));
        self.strides
            .retain(|id, _| apps.iter().any(|a| a.id == *id));
        // (Slopes of 0 count too while it still shows a gain: a scan that does not fit.)
        for a in apps.iter().filter(|a| a.utility > 0.0 || a.near > 0.0) {
            let seen = self.seen.entry(a.id).or_default();
            seen.retain(|s| s.budget != a.budget);
            if seen.len() == SEEN {
                seen.remove(0);
            }
            seen.push(Seen {
                budget: a.budget,
                near: a.near,
                epoch: self.epoch,
            });
        }
    }

    /// What giving up `bytes` would cost `a` (weighted): the slope its curve showed in the
    /// `bytes` under its budget as remembered (a mean: the most of many noisy epochs would be
    /// noise; old memories weigh less and fade), or its slope now if more. Slopes, not the
    /// hull: the curve read backwards (Talus both ways). A thrashing scan showed a large
    /// hull and no slope; with the hull it was kept and a Zipfian program cut.
    pub fn loss(&self, a: &Candidate, bytes: u64) -> f64 {
        let (mut sum, mut weights) = (0.0, 0.0);
        for s in self.seen.get(&a.id).into_iter().flatten() {
            if s.budget < a.budget && s.budget + bytes >= a.budget {
                let w = 0.5f64.powf((self.epoch - s.epoch) as f64 / self.memory_epochs);
                sum += w * s.near;
                weights += w;
            }
        }
        let used = bytes.saturating_sub(a.unused) as f64 / bytes.max(1) as f64;
        a.weight * a.near.max(sum / weights.max(1.0)).max(a.held_worth) * used
    }

    /// Bytes the next move to application `id` shifts (0 until the first plan).
    pub fn step(&self, id: u32) -> u64 {
        self.strides.get(&id).map_or(self.step, |s| s.step)
    }

    fn round(&self, bytes: u64) -> u64 {
        bytes / self.segment * self.segment
    }

    /// Budgets for `apps` (same order) that sum to at most `total`.
    pub fn plan(&mut self, apps: &[Candidate], total: u64) -> Vec<u64> {
        if apps.is_empty() {
            return Vec::new();
        }
        if self.step == 0 {
            self.step = self.round(total / 16).max(self.segment);
        }
        if self.policy == Policy::Static {
            return self.even(apps, total);
        }
        self.remember(apps);
        let mut b: Vec<u64> = apps.iter().map(|a| a.budget.min(a.capacity)).collect();
        let sum: u64 = b.iter().sum();
        if sum > total {
            tracing::debug!(sum, total, "over the pool");
            self.shrink(apps, &mut b, sum - total);
            return b;
        }
        let mut spare = total - sum;
        give_minimums(apps, &mut b, &mut spare);
        let wanting = self.grant(apps, &mut b, &mut spare, total);
        // The climb: from the one that would lose least to the most valuable that wants more.
        if let Some(&to) = wanting.first() {
            self.climb(apps, &mut b, to, total);
        }
        b
    }

    /// Grants idle memory (`spare`) to the applications that want more, most valuable
    /// first; returns them in that order.
    fn grant(&self, apps: &[Candidate], b: &mut [u64], spare: &mut u64, total: u64) -> Vec<usize> {
        let mut wanting: Vec<usize> = (0..apps.len()).filter(|&i| apps[i].demand).collect();
        wanting.sort_by(|&x, &y| apps[y].value().total_cmp(&apps[x].value()));
        let grant = self.round(total / 8).max(self.segment);
        for &i in &wanting {
            let g = self
                .round((*spare).min(grant))
                .min(apps[i].room(b[i], self.segment));
            b[i] += g;
            *spare -= g;
        }
        wanting
    }

    /// One move of the climb to application `to`, from the one that would lose least, if
    /// `to` is worth more than that loss (by the hysteresis).
    fn climb(&mut self, apps: &[Candidate], b: &mut [u64], to: usize, total: u64) {
        let step = self.step(apps[to].id);
        let loss: Vec<f64> = apps.iter().map(|a| self.loss(a, step)).collect();
        let from = (0..apps.len())
            .filter(|&i| i != to && b[i] > apps[i].min)
            .min_by(|&x, &y| loss[x].total_cmp(&loss[y]));
        let Some(from) = from else {
            tracing::debug!(to = apps[to].id, "no move: nobody to take from");
            return;
        };
        let (vt, vf) = (apps[to].value(), loss[from]);
        if vt <= 0.0 || vt <= vf * self.hysteresis {
            tracing::debug!(
                to = apps[to].id,
                from = apps[from].id,
                vt,
                vf,
                "no move: not worth it"
            );
            return;
        }
        let pair = (apps[from].id, apps[to].id);
        let moved = self.stride_move(pair, total);
        let room = apps[to].room(b[to], self.segment);
        let moved = moved.min(b[from] - apps[from].min).min(room);
        b[from] -= moved;
        b[to] += moved;
        tracing::debug!(from = pair.0, to = pair.1, moved, vt, vf, "move");
    }

    /// Updates the strides of a move from `pair.0` to `pair.1` and returns the receiver's
    /// stride before it lengthened: what this move shifts, at most.
    fn stride_move(&mut self, pair: (u32, u32), total: u64) -> u64 {
        let (first, segment, cap) = (
            self.step,
            self.segment,
            self.round(total / 4).max(self.segment),
        );
        // The giver turned back: its optimum is between; smaller steps to it.
        let g = self.strides.entry(pair.0).or_insert(Stride {
            step: first,
            received: false,
        });
        if g.received {
            g.step = (g.step / 2 / segment * segment).max(segment);
        }
        g.received = false;
        // The same receiver again: its climb is far from the top; longer strides. (At least
        // a segment longer: half of one segment rounds back down to it.)
        let r = self.strides.entry(pair.1).or_insert(Stride {
            step: first,
            received: false,
        });
        let moved = r.step;
        if r.received {
            r.step = (r.step * 3 / 2 / segment * segment)
                .max(r.step + segment)
                .min(cap);
        }
        r.received = true;
        moved
    }

    /// Takes `over` bytes back: from the one that loses least first, down to its minimum;
    /// then evenly from everyone.
    pub fn shrink(&self, apps: &[Candidate], b: &mut [u64], mut over: u64) {
        let mut order: Vec<usize> = (0..apps.len()).collect();
        if self.policy == Policy::Static {
            // Even: the largest first.
            order.sort_by_key(|&i| std::cmp::Reverse(b[i]));
        } else {
            let loss: Vec<f64> = apps.iter().map(|a| self.loss(a, over)).collect();
            order.sort_by(|&x, &y| loss[x].total_cmp(&loss[y]));
        }
        for &i in &order {
            let take = over.min(b[i].saturating_sub(apps[i].min));
            let take = take.div_ceil(self.segment) * self.segment;
            let take = take.min(b[i]);
            b[i] -= take;
            over = over.saturating_sub(take);
            if over == 0 {
                return;
            }
        }
        // Everyone is at the minimum: under it, evenly.
        while over > 0 {
            let mut took = false;
            for x in b.iter_mut().filter(|x| **x >= self.segment) {
                *x -= self.segment;
                over = over.saturating_sub(self.segment);
                took = true;
                if over == 0 {
                    return;
                }
            }
            if !took {
                return;
            }
        }
    }

    /// The even split, by weight.
    fn even(&self, apps: &[Candidate], total: u64) -> Vec<u64> {
        let w: f64 = apps.iter().map(|a| a.weight).sum();
        apps.iter()
            .map(|a| {
                self.round((total as f64 * a.weight / w) as u64)
                    .min(a.capacity)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 2 << 20;

    fn app(id: u32, budget: u64, utility: f64, demand: bool) -> Candidate {
        Candidate {
            id,
            weight: 1.0,
            budget,
            capacity: 1 << 40,
            min: 4 * S,
            utility,
            near: utility,
            demand,
            unused: 0,
            held_worth: 0.0,
            reach_to: 0,
        }
    }

    #[test]
    fn static_splits_evenly_by_weight() {
        let mut p = Planner::new(Policy::Static, S, 4 * S);
        let mut a = vec![app(1, 0, 9.0, true), app(2, 0, 0.0, false)];
        a[1].weight = 3.0;
        assert_eq!(p.plan(&a, 400 * S), vec![100 * S, 300 * S]);
    }

    #[test]
    fn memory_climbs_to_where_it_is_worth_most() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        let b = p.plan(&a, 100 * S);
        assert!(b[1] > 50 * S && b[0] < 50 * S, "{b:?}");
        assert_eq!(b.iter().sum::<u64>(), 100 * S);
    }

    #[test]
    fn equal_worth_stays_put() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        let a = vec![app(1, 50 * S, 5.0, true), app(2, 50 * S, 5.2, true)];
        assert_eq!(p.plan(&a, 100 * S), vec![50 * S, 50 * S]);
    }

    #[test]
    fn turning_back_halves_the_step() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        let b = p.plan(&a, 100 * S);
        let first = p.step(2);
        // (Over what app 2 was worth before the move, which it would lose now.)
        let back = vec![app(1, b[0], 30.0, true), app(2, b[1], 1.0, true)];
        p.plan(&back, 100 * S);
        assert!(p.step(2) < first);
    }

    #[test]
    fn others_turning_back_leave_a_climber_its_stride() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        p.step = 2 * S;
        // Without memory of losses (this is about strides).
        p.memory_epochs = 1e-9;
        let mut a = vec![
            app(1, 40 * S, 1.0, true),
            app(2, 40 * S, 1.0, true),
            app(3, 20 * S, 9.0, true),
        ];
        let mut reversals = 0;
        for round in 0..6 {
            // Every other epoch app 3 wants more (and gets it); in between, apps 1 and 2
            // trade memory back and forth.
            a[2].demand = round % 2 == 0;
            a[0].utility = if round % 4 == 1 { 30.0 } else { 1.0 };
            a[1].utility = if round % 4 == 3 { 30.0 } else { 1.0 };
            let b = p.plan(&a, 100 * S);
            if round % 2 == 1 && b[0] != a[0].budget {
                reversals += 1;
            }
            for (x, y) in a.iter_mut().zip(&b) {
                x.budget = *y;
            }
        }
        assert!(reversals >= 2, "apps 1 and 2 should have traded");
        assert!(p.step(3) >= 4 * S, "stride {} segments", p.step(3) / S);
    }

    #[test]
    fn the_same_receiver_again_lengthens_the_step_even_from_one_segment() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        p.step = S;
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        p.plan(&a, 100 * S);
        p.plan(&a, 100 * S);
        assert!(
            p.step(2) >= 2 * S,
            "step {} stuck at one segment",
            p.step(2) / S
        );
    }

    #[test]
    fn an_application_that_just_filled_up_is_not_the_giver() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        p.step = 4 * S;
        // App 2 was worth much a little under its budget; now it holds all it uses.
        let before = vec![
            app(1, 30 * S, 2.0, true),
            app(2, 60 * S, 50.0, true),
            app(3, 10 * S, 3.0, true),
        ];
        p.remember(&before);
        let now = vec![
            app(1, 30 * S, 2.0, false),
            app(2, 62 * S, 0.0, false),
            app(3, 8 * S, 9.0, true),
        ];
        let b = p.plan(&now, 100 * S);
        assert_eq!(b[1], 62 * S, "took from the full one: {b:?}");
        assert!(b[0] < 30 * S && b[2] > 8 * S, "{b:?}");
        // Budget it does not use is free to take.
        let mut idle = now[1].clone();
        idle.unused = 4 * S;
        assert!(p.loss(&idle, 4 * S) < 1e-9);
        // Long forgotten, its loss is what it shows now.
        p.epoch += 100 * p.memory_epochs as u64;
        assert!(p.loss(&now[1], 4 * S) < 1e-9);
    }

    #[test]
    fn idle_memory_goes_to_who_wants_it() {
        let mut p = Planner::new(Policy::Hitrate, S, 4 * S);
        let a = vec![app(1, 10 * S, 0.0, false), app(2, 10 * S, 3.0, true)];
        let b = p.plan(&a, 100 * S);
        assert!(b[0] <= 10 * S, "no demand, no grant");
        assert!(b[1] > 10 * S);
    }

    #[test]
    fn a_cut_takes_from_a_thrashing_scan_before_a_zipfian_program() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        // Both show the same gain per byte; the scan's lies past the edge of its budget.
        let zipf = app(1, 100 * S, 5.0, true);
        let mut scan = app(2, 100 * S, 5.0, true);
        scan.near = 0.1;
        let b = p.plan(&[zipf, scan], 150 * S);
        assert_eq!(b, vec![100 * S, 50 * S]);
    }

    #[test]
    fn grants_stop_where_the_curve_ends() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        // A scan whose curve ends 3 segments over its budget, beside idle memory.
        let mut scan = app(1, 10 * S, 5.0, true);
        scan.reach_to = 13 * S;
        let b = p.plan(&[scan.clone(), app(2, 10 * S, 0.0, false)], 200 * S);
        assert_eq!(b[0], 13 * S, "{b:?}");
        // Nor does the climb take from others past it.
        scan.budget = 13 * S;
        let b = p.plan(&[scan, app(2, 187 * S, 0.1, false)], 200 * S);
        assert_eq!(b[0], 13 * S, "{b:?}");
    }

    #[test]
    fn shrinking_takes_from_the_least_valuable_first() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        assert_eq!(p.plan(&a, 80 * S), vec![30 * S, 50 * S]);
        // Past every floor: evenly under it.
        let b = p.plan(&a, 6 * S);
        assert!(b.iter().sum::<u64>() <= 6 * S, "{b:?}");
    }
}
