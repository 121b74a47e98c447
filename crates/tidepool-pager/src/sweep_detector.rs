//! A prefetcher for walks that move forward without a stride: a section's faults that stay
//! within a few dozen pages of each other and drift upwards (CPython iterating a dict whose
//! keys and values sit in pools of different size classes of one arena: faults at +4, +3, -3,
//! +2, -2, +5, ...). The stride detector (`prefetch.rs`) finds no majority stride there and
//! plans nothing; this one plans the pages ahead of the highest fault seen.
//!
//! Detection: the last [`HISTORY`] faults span at most [`SPAN`] pages and most steps between
//! them go forward. Then it plans a window ahead of the highest of them, leaving the window's
//! middle page unmapped as a trigger (as the stride detector does); a fault at or past the
//! trigger plans the next, larger window and credits the pages passed. A fault further than
//! [`SPAN`] behind the walk or ahead of its window ends it.

use crate::prefetch::{History, Plan, HISTORY, LAG};

/// Pages the recent faults of a walk may spread over, and how far behind its latest window a
/// fault may land and still be part of it.
const SPAN: i64 = 64;
/// First window, in pages.
const WINDOW_MIN: u32 = 8;

#[derive(Debug, Clone, Copy)]
struct Walk {
    /// Where the current window began, and the first page not yet planned.
    window_start: i64,
    next: i64,
    trigger: i64,
    window: u32,
    /// The first page behind the walk not yet called done.
    done_mark: i64,
}

/// The sweep detector of one section in one region.
#[derive(Debug)]
pub struct SweepDetector {
    history: History,
    walk: Option<Walk>,
    window_max: u32,
    /// Pages planned so far, and planned pages the program has since walked past.
    pub planned: u64,
    pub credited: u64,
}

impl SweepDetector {
    pub fn new(window_max: u32) -> SweepDetector {
        SweepDetector {
            history: History::default(),
            walk: None,
            window_max: window_max.max(WINDOW_MIN),
            planned: 0,
            credited: 0,
        }
    }

    /// Records a demand fault on `page`; returns what to prefetch, if anything.
    pub fn on_fault(&mut self, page: i64) -> Option<Plan> {
        if let Some(w) = self.walk {
            if page >= w.trigger && page < w.next + SPAN {
                // The program passed the middle of the window: the pages before it were used.
                self.credited += (page.min(w.next) - w.window_start).max(0) as u64;
                let window = (w.window * 2).min(self.window_max);
                let from = w.next.max(page + 1);
                return Some(self.plan(page, from, window, w.done_mark));
            }
            if page >= w.window_start - SPAN && page < w.next + SPAN {
                // Jitter inside the walk, or a page of the window that could not be mapped.
                self.history.push(page);
                return None;
            }
            self.walk = None;
        }
        self.history.push(page);
        if !self.found() {
            return None;
        }
        let top = *self.history.pages().iter().max().expect("a full history");
        Some(self.plan(page, top + 1, WINDOW_MIN, page - LAG))
    }

    fn plan(&mut self, fault: i64, from: i64, window: u32, mark: i64) -> Plan {
        let edge = fault - LAG;
        let behind_count = (edge - mark).clamp(0, 4096) as u32;
        self.walk = Some(Walk {
            window_start: fault,
            next: from + window as i64,
            trigger: from + window as i64 / 2,
            window,
            done_mark: mark + behind_count as i64,
        });
        self.planned += window as u64;
        Plan {
            start: from,
            stride: 1,
            count: window,
            trigger: from + window as i64 / 2,
            behind_start: mark,
            behind_count,
        }
    }

    /// A walk: a full history within `SPAN` pages, most steps forward, ending higher than it
    /// began.
    fn found(&self) -> bool {
        let h = self.history.pages();
        if h.len() < HISTORY {
            return false;
        }
        let (lo, hi) = (h.iter().min().unwrap(), h.iter().max().unwrap());
        let forward = h.windows(2).filter(|w| w[1] > w[0]).count();
        hi - lo <= SPAN && forward * 2 > HISTORY && h[HISTORY - 1] > h[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Faults of a program visiting `pages` in order; a page is faulted on only if it was
    /// not prefetched (or is a trigger). Returns the faults taken.
    fn run(d: &mut SweepDetector, pages: impl Iterator<Item = i64>) -> u64 {
        let mut mapped = HashSet::new();
        let mut faults = 0;
        for p in pages {
            if mapped.insert(p) {
                faults += 1;
                if let Some(plan) = d.on_fault(p) {
                    for i in 0..plan.count as i64 {
                        let q = plan.start + i * plan.stride;
                        if q != plan.trigger {
                            mapped.insert(q);
                        }
                    }
                }
            }
        }
        faults
    }

    #[test]
    fn a_jittery_forward_walk_is_followed() {
        // Two interleaved walks a few pages apart, as two pools of one arena: 3, 0, 4, 1, ...
        let pages = (0..20_000i64).flat_map(|i| [i + 3, i]);
        let mut d = SweepDetector::new(256);
        let faults = run(&mut d, pages);
        assert!(faults < 20_000 / 20, "{faults} faults");
        assert!(
            d.credited * 10 >= d.planned * 8,
            "{} of {}",
            d.credited,
            d.planned
        );
    }

    #[test]
    fn random_faults_plan_nothing() {
        let mut d = SweepDetector::new(256);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let pages = (0..10_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000_000) as i64
        });
        run(&mut d, pages);
        assert!(d.planned < 100, "{} planned", d.planned);
    }

    #[test]
    fn a_backward_walk_is_not_a_sweep() {
        let mut d = SweepDetector::new(256);
        run(&mut d, (0..10_000i64).rev());
        assert_eq!(d.planned, 0);
    }
}
