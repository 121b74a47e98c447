//! How the soft-memory pool is split (Midas §4.3.2). No I/O: the server feeds in what it
//! measured and sends out what comes back.
//!
//! - `midas`: maximise Σ wᵢ Γᵢ(mᵢ) with Γᵢ = −(time spent reconstructing). The marginal
//!   utility of an application is the reconstruction time per second that Δ more bytes would
//!   save, read off its ghost hits ([`tidepool_soft::demand`]); memory climbs from the
//!   application where it is worth least to the one where it is worth most, a step at a time,
//!   the step halving whenever the climb turns back (damping).
//! - `hitrate`: the same climb on hits per second instead of time (Cliffhanger: the best
//!   overall hit rate, whatever a miss costs).
//! - `static`: an even split (by weight), whatever the applications need.
//!
//! Idle memory not yet wanted stays unallocated and is granted, in steps, to applications that
//! are evicting (they want more): small grants that the next epoch's utilities judge.

use serde::{Deserialize, Serialize};

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
    /// Its arena's address space: a budget past it is useless.
    pub capacity: u64,
    /// Marginal utility: what one more byte would save per second (reconstruction
    /// nanoseconds for `midas`, hits for `hitrate`), smoothed.
    pub utility: f64,
    /// It dropped objects to make room lately: it wants more.
    pub demand: bool,
}

impl Candidate {
    fn value(&self) -> f64 {
        self.weight * self.utility
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
    /// Bytes the next move shifts.
    step: u64,
    /// The last move (from, to).
    last_move: Option<(u32, u32)>,
    /// A move needs the receiver's value over the giver's by this factor.
    pub hysteresis: f64,
}

impl Planner {
    pub fn new(policy: Policy, segment: u64, floor: u64) -> Planner {
        Planner {
            policy,
            segment,
            floor,
            step: 0,
            last_move: None,
            hysteresis: 1.1,
        }
    }

    /// Bytes the next move shifts (0 until the first plan).
    pub fn step(&self) -> u64 {
        self.step
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
        let mut b: Vec<u64> = apps.iter().map(|a| a.budget.min(a.capacity)).collect();
        let sum: u64 = b.iter().sum();
        if sum > total {
            self.shrink(apps, &mut b, sum - total);
            return b;
        }
        // Grants: idle memory to the applications that want more, most valuable first.
        let mut spare = total - sum;
        let mut wanting: Vec<usize> = (0..apps.len()).filter(|&i| apps[i].demand).collect();
        wanting.sort_by(|&x, &y| apps[y].value().total_cmp(&apps[x].value()));
        let grant = self.round(total / 8).max(self.segment);
        for &i in &wanting {
            let g = self
                .round(spare.min(grant))
                .min(apps[i].capacity.saturating_sub(b[i]));
            b[i] += g;
            spare -= g;
        }
        // The climb: from the least valuable to the most valuable that wants more.
        let Some(&to) = wanting.first() else {
            return b;
        };
        let from = (0..apps.len())
            .filter(|&i| i != to && b[i] > self.floor)
            .min_by(|&x, &y| apps[x].value().total_cmp(&apps[y].value()));
        let Some(from) = from else { return b };
        let (vt, vf) = (apps[to].value(), apps[from].value());
        if vt <= 0.0 || vt <= vf * self.hysteresis {
            return b;
        }
        let pair = (apps[from].id, apps[to].id);
        match self.last_move {
            // Turned back: the optimum is between; smaller steps.
            Some((_, t)) if t == pair.0 => self.step = self.round(self.step / 2).max(self.segment),
            // The same receiver again: the climb is far from the top; longer strides.
            // (At least a segment longer: half of one segment rounds back down to it.)
            Some((_, t)) if t == pair.1 => {
                self.step = self
                    .round(self.step * 3 / 2)
                    .max(self.step + self.segment)
                    .min(self.round(total / 4).max(self.segment))
            }
            _ => {}
        }
        self.last_move = Some(pair);
        let room = apps[to].capacity.saturating_sub(b[to]);
        let moved = self.step.min(b[from] - self.floor).min(room);
        b[from] -= moved;
        b[to] += moved;
        b
    }

    /// Takes `over` bytes back: from the least valuable first, down to the floor; then
    /// evenly from everyone.
    pub fn shrink(&self, apps: &[Candidate], b: &mut [u64], mut over: u64) {
        let mut order: Vec<usize> = (0..apps.len()).collect();
        if self.policy == Policy::Static {
            // Even: the largest first.
            order.sort_by_key(|&i| std::cmp::Reverse(b[i]));
        } else {
            order.sort_by(|&x, &y| apps[x].value().total_cmp(&apps[y].value()));
        }
        for &i in &order {
            let take = over.min(b[i].saturating_sub(self.floor));
            let take = take.div_ceil(self.segment) * self.segment;
            let take = take.min(b[i]);
            b[i] -= take;
            over = over.saturating_sub(take);
            if over == 0 {
                return;
            }
        }
        // Everyone is at the floor: under it, evenly.
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
            utility,
            demand,
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
        let first = p.step();
        let back = vec![app(1, b[0], 10.0, true), app(2, b[1], 1.0, true)];
        p.plan(&back, 100 * S);
        assert!(p.step() < first);
    }

    #[test]
    fn the_same_receiver_again_lengthens_the_step_even_from_one_segment() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        p.step = S;
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        p.plan(&a, 100 * S);
        p.plan(&a, 100 * S);
        assert!(
            p.step() >= 2 * S,
            "step {} stuck at one segment",
            p.step() / S
        );
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
    fn shrinking_takes_from_the_least_valuable_first() {
        let mut p = Planner::new(Policy::Midas, S, 4 * S);
        let a = vec![app(1, 50 * S, 1.0, true), app(2, 50 * S, 10.0, true)];
        assert_eq!(p.plan(&a, 80 * S), vec![30 * S, 50 * S]);
        // Past every floor: evenly under it.
        let b = p.plan(&a, 6 * S);
        assert!(b.iter().sum::<u64>() <= 6 * S, "{b:?}");
    }
}
