//! Offline search of section policies against a recorded trace ([`crate::fault_trace`]):
//! what `tidepool tune` asks before it spends a run of the program on a guess.
//!
//! The trace is taken with prefetching off and lines of one page in every section, so it is
//! the program's stream of misses at the tuning's budget, untouched by any policy. A replay
//! runs the pager's own prefetchers (the same detectors the fault path calls) over that stream
//! with the policies under test, against a model of local memory: a first-in first-out set of
//! as many pages as the budget holds, since the pager cannot see which resident pages the
//! program touches (no accessed bits reach user space here) and so evicts in about the order
//! pages came in. A fault on a page the model holds is a hit the policy earned; one on a page
//! it does not is a miss, a far read or a first touch as the trace says. A first touch of a
//! page the model holds with contents is a miss too: the program freed the page in between
//! (the preload discards freed memory), which no policy changes; the trace does not record
//! frees, so until then lines and prefetchers may still count such a page as far. What a
//! prefetch or a line brought in counts as used if the program faulted on it before the model
//! evicted it.
//!
//! [`classes`] sorts a section's faults into sequential, strided and random, and counts the
//! pages it touched and how many came back: the access classes `tidepool tune` prints.

use crate::fault_trace::{FaultTrace, TracedFault};
use crate::prefetch::{Detector, Plan};
use crate::sections::{Prefetch, LINE_MAX};
use crate::successor::SuccessorDetector;
use crate::sweep_detector::SweepDetector;
use std::collections::{HashMap, VecDeque};

/// A section's policy in a replay: its prefetcher and its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub prefetch: Prefetch,
    pub line: u8,
}

impl Candidate {
    /// The pager's behaviour without a profile.
    pub const DEFAULT: Candidate = Candidate {
        prefetch: Prefetch::Shared,
        line: 1,
    };

    /// Whether it brings in pages nobody faulted on.
    pub fn fetches_ahead(self) -> bool {
        self.prefetch != Prefetch::Off || self.line > 1
    }
}

/// What a replay counted for one section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Faults on pages seen before that the model did not hold: reads from far memory.
    pub far_reads: u64,
    /// Faults on pages never seen before (first touches: zero pages).
    pub first_touches: u64,
    /// Far pages a prefetcher or a line brought in.
    pub fetched: u64,
    /// Of those, pages the program faulted on before they were evicted.
    pub used: u64,
}

impl Replayed {
    /// Used fetched pages over fetched pages (`None` if nothing was fetched).
    pub fn accuracy(&self) -> Option<f64> {
        (self.fetched > 0).then(|| self.used as f64 / self.fetched as f64)
    }

    /// Far reads, plus `waste` of a far read for every fetched page not used.
    pub fn cost(&self, waste: f64) -> f64 {
        self.far_reads as f64 + waste * (self.fetched - self.used) as f64
    }

    fn add(&mut self, o: &Replayed) {
        self.far_reads += o.far_reads;
        self.first_touches += o.first_touches;
        self.fetched += o.fetched;
        self.used += o.used;
    }
}

/// A page of the model: (region, page).
type Key = (u16, u64);

#[derive(Debug, Clone, Copy)]
struct Held {
    /// Which entry of the queue is this page's (older ones are stale).
    stamp: u64,
    /// Brought in ahead and not faulted on yet: (the section that fetched it).
    ahead: Option<u8>,
    /// Zero-filled ahead of a stream and not touched yet.
    zero: bool,
}

/// Local memory as the replay models it.
struct Model {
    capacity: usize,
    held: HashMap<Key, Held>,
    queue: VecDeque<(Key, u64)>,
    seen: std::collections::HashSet<Key>,
    next_stamp: u64,
}

impl Model {
    fn new(capacity: usize) -> Model {
        Model {
            capacity: capacity.max(1),
            held: HashMap::new(),
            queue: VecDeque::new(),
            seen: std::collections::HashSet::new(),
            next_stamp: 0,
        }
    }

    fn holds(&self, k: Key) -> bool {
        self.held.contains_key(&k)
    }

    fn is_far(&self, k: Key) -> bool {
        self.seen.contains(&k) && !self.held.contains_key(&k)
    }

    fn bring(&mut self, k: Key, ahead: Option<u8>, zero: bool) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.held.insert(k, Held { stamp, ahead, zero });
        self.seen.insert(k);
        self.queue.push_back((k, stamp));
        while self.held.len() > self.capacity {
            let Some((old, s)) = self.queue.pop_front() else {
                break;
            };
            if self.held.get(&old).is_some_and(|h| h.stamp == s) {
                self.held.remove(&old);
            }
        }
    }
}

/// A prefetcher as the replay runs it (the pager's detectors, without a page table).
enum Guesser {
    Off,
    Stride(Detector),
    Sweep(SweepDetector),
    Successor(Box<SuccessorDetector>),
}

impl Guesser {
    fn new(p: Prefetch, window_max: u32, budget_pages: usize) -> Guesser {
        match p {
            Prefetch::Off => Guesser::Off,
            Prefetch::Sweep => Guesser::Sweep(SweepDetector::new(window_max)),
            Prefetch::Successor => {
                Guesser::Successor(Box::new(SuccessorDetector::new(2 * budget_pages)))
            }
            _ => Guesser::Stride(Detector::new(window_max)),
        }
    }

    /// The pages to bring in after a fault on `page` of `region`, but its trigger; for a
    /// stride window, pages never seen too (the pager zero-fills those ahead of a stream).
    fn guess(&mut self, region: u16, page: i64, model: &Model) -> Vec<i64> {
        let window = |plan: Plan| -> Vec<i64> {
            (0..plan.count)
                .map(|i| plan.start + i as i64 * plan.stride)
                .filter(|&p| p >= 0 && p != plan.trigger)
                .collect()
        };
        match self {
            Guesser::Off => Vec::new(),
            Guesser::Stride(d) => d
                .on_fault(page, |p| p >= 0 && model.holds((region, p as u64)))
                .map_or_else(Vec::new, window),
            Guesser::Sweep(d) => d.on_fault(page).map_or_else(Vec::new, window),
            Guesser::Successor(d) => d
                .on_fault(page, |p| p >= 0 && model.is_far((region, p as u64)))
                .map_or_else(Vec::new, |c| c.pages().to_vec()),
        }
    }
}

/// Replays `trace` with each section served by `policy(section)` against a model of
/// `budget_pages` local pages; returns what each section did, by index.
pub fn replay(
    trace: &FaultTrace,
    policy: &dyn Fn(u8) -> Candidate,
    budget_pages: usize,
    window_max: u32,
) -> HashMap<u8, Replayed> {
    let mut model = Model::new(budget_pages);
    let mut out: HashMap<u8, Replayed> = HashMap::new();
    // A region's shared detector, and each section's own, per region.
    let mut shared: HashMap<u16, Guesser> = HashMap::new();
    let mut own: HashMap<(u8, u16), Guesser> = HashMap::new();
    let policies: Vec<Candidate> = (0..=u8::MAX).map(policy).collect();
    for &TracedFault {
        far,
        section,
        region,
        page,
    } in &trace.faults
    {
        let key = (region, page);
        if let Some(h) = model.held.get_mut(&key) {
            if far || h.zero {
                if let Some(by) = h.ahead.take() {
                    out.entry(by).or_default().used += 1;
                }
                h.zero = false;
                continue;
            }
            // Freed and discarded since it came in: a first touch again (its queue entry
            // goes stale).
            model.held.remove(&key);
        }
        let counts = out.entry(section).or_default();
        if far {
            counts.far_reads += 1;
        } else {
            counts.first_touches += 1;
        }
        model.bring(key, None, false);
        let c = policies[section as usize];
        if c.line > 1 {
            // The far pages of the fault's aligned block.
            let line = (c.line as u64).min(LINE_MAX as u64);
            let start = page & !(line - 1);
            for p in (start..start + line).filter(|&p| p != page) {
                if model.is_far((region, p)) {
                    out.entry(section).or_default().fetched += 1;
                    model.bring((region, p), Some(section), false);
                }
            }
        }
        let guesser = match c.prefetch {
            Prefetch::Shared => shared
                .entry(region)
                .or_insert_with(|| Guesser::new(Prefetch::Shared, window_max, budget_pages)),
            p => own
                .entry((section, region))
                .or_insert_with(|| Guesser::new(p, window_max, budget_pages)),
        };
        for p in guesser.guess(region, page as i64, &model) {
            let k = (region, p as u64);
            if model.is_far(k) {
                out.entry(section).or_default().fetched += 1;
                model.bring(k, Some(section), false);
            } else if !model.seen.contains(&k) {
                // Zero-filled ahead of a stream (successor chains hold far pages only): room
                // taken, nothing read.
                model.bring(k, None, true);
            }
        }
    }
    out
}

/// The share of the trace's faults the calibrated model must see as misses too.
const REPRODUCED: f64 = 0.97;

/// The local memory the model should have to stand for the pager that recorded `trace` (with
/// prefetching off and lines of one page, as tune's trace round runs) at `budget_pages`: the
/// largest number of pages, at most the budget, at which replaying the trace without
/// prefetching still misses on 97% of its faults. The pager does not evict in arrival order
/// (a victim takes unused neighbours of any age along, pages a stream walked past go first),
/// and a first-in first-out model fed another order's misses holds many of the pages that
/// order had just evicted: GNU sort at 16 MiB (4096 pages) missed on faults a model of 4096
/// pages would have held 30% of, and random reads of 16384 pages at 4096 that missed 76% of
/// the time, as any policy without foresight does there, replay at 68% through the whole
/// budget (the model that reproduces them is 2304 pages). So a model of the whole budget
/// credits prefetched pages with a use they never get; this size is the order's effect, not
/// room the pager lost.
pub fn calibrated_capacity(trace: &FaultTrace, budget_pages: usize, window_max: u32) -> usize {
    let off = |_| Candidate {
        prefetch: Prefetch::Off,
        line: 1,
    };
    let target = (trace.faults.len() as f64 * REPRODUCED) as u64;
    let misses = |pages: usize| {
        let t = total(&replay(trace, &off, pages, window_max));
        t.far_reads + t.first_touches
    };
    let (mut lo, mut hi) = (1, budget_pages.max(1));
    if misses(hi) >= target {
        return hi;
    }
    // Misses fall as the model grows; find the largest size still at the target, to within a
    // 64th of the budget.
    while hi - lo > (budget_pages / 64).max(1) {
        let mid = lo + (hi - lo) / 2;
        if misses(mid) >= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The fewest far reads any policy could make on `trace` with `budget_pages` of local memory:
/// Belady's choice (evict the page whose next use is furthest away), which no replacement order
/// and no prefetcher beats at the number of pages it reads (a page read ahead is read all the
/// same). The trace holds only the faults of the run that recorded it, a part of every access the
/// program made, and leaving accesses out can only lower this count: it is a bound below what
/// the program needs, whatever a profile says. A first touch brings in a zero page, not a read,
/// and ends the life of the page's contents before it (the program freed it), so a page whose
/// next fault is a first touch is no more worth keeping than one never used again. Faults the
/// trace lost to a full buffer are not counted.
pub fn oracle_far_reads(trace: &FaultTrace, budget_pages: usize) -> u64 {
    const NEVER: u64 = u64::MAX;
    let faults = &trace.faults;
    // The index of the fault that next reads each fault's page back, or NEVER.
    let mut next = vec![NEVER; faults.len()];
    let mut later: HashMap<Key, (u64, bool)> = HashMap::new();
    for (i, f) in faults.iter().enumerate().rev() {
        let key = (f.region, f.page);
        if let Some(&(j, far)) = later.get(&key) {
            next[i] = if far { j } else { NEVER };
        }
        later.insert(key, (i as u64, f.far));
    }
    let capacity = budget_pages.max(1);
    let mut held: HashMap<Key, u64> = HashMap::with_capacity(capacity + 1);
    // By next use, furthest first; entries whose page has been used since are stale.
    let mut by_next: std::collections::BinaryHeap<(u64, Key)> = Default::default();
    let mut reads = 0;
    for (i, f) in faults.iter().enumerate() {
        let key = (f.region, f.page);
        if held.insert(key, next[i]).is_none() && f.far {
            reads += 1;
        }
        by_next.push((next[i], key));
        while held.len() > capacity {
            let Some((n, k)) = by_next.pop() else { break };
            if held.get(&k) == Some(&n) {
                held.remove(&k);
            }
        }
    }
    reads
}

/// The sum over every section of a replay.
pub fn total(r: &HashMap<u8, Replayed>) -> Replayed {
    let mut t = Replayed::default();
    for v in r.values() {
        t.add(v);
    }
    t
}

/// How one section's faults move through its pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classes {
    pub faults: u64,
    /// Faults one page after the section's previous fault in the region (either way).
    pub sequential: u64,
    /// Faults at the same stride as the two before, more than a page.
    pub strided: u64,
    /// The rest.
    pub random: u64,
    /// Pages it faulted on at least once.
    pub pages: u64,
    /// Faults on pages it had faulted on before (they were evicted in between).
    pub again: u64,
}

/// The access classes of each section of `trace`, by index.
pub fn classes(trace: &FaultTrace) -> HashMap<u8, Classes> {
    let mut out: HashMap<u8, Classes> = HashMap::new();
    let mut last: HashMap<(u8, u16), (i64, i64)> = HashMap::new();
    let mut seen: std::collections::HashSet<(u16, u64)> = std::collections::HashSet::new();
    for f in &trace.faults {
        let c = out.entry(f.section).or_default();
        c.faults += 1;
        if seen.insert((f.region, f.page)) {
            c.pages += 1;
        } else {
            c.again += 1;
        }
        let page = f.page as i64;
        match last.get(&(f.section, f.region)) {
            Some(&(prev, _)) if (page - prev).abs() == 1 => c.sequential += 1,
            Some(&(prev, stride)) if page - prev == stride && stride.abs() > 1 => c.strided += 1,
            _ => c.random += 1,
        }
        let stride = last
            .get(&(f.section, f.region))
            .map_or(0, |&(p, _)| page - p);
        last.insert((f.section, f.region), (page, stride));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(section: u8, page: u64, far: bool) -> TracedFault {
        TracedFault::new(far, section, 1, page)
    }

    fn trace_of(faults: Vec<TracedFault>) -> FaultTrace {
        FaultTrace {
            sections: vec![],
            faults,
            dropped: 0,
        }
    }

    /// Every section with `prefetch` and lines of `line` pages.
    fn all(prefetch: Prefetch, line: u8) -> impl Fn(u8) -> Candidate {
        move |_| Candidate { prefetch, line }
    }

    /// Two passes over 400 pages with room for 100: every fault of the second pass is a far
    /// read without prefetching.
    fn two_passes() -> FaultTrace {
        let mut faults = Vec::new();
        for pass in 0..2 {
            for p in 0..400 {
                faults.push(fault(1, p, pass == 1));
            }
        }
        FaultTrace {
            sections: vec!["rest".into(), "array".into()],
            faults,
            dropped: 0,
        }
    }

    #[test]
    fn a_stride_prefetcher_turns_a_second_pass_into_hits_and_off_reads_every_page() {
        let t = two_passes();
        let off = all(Prefetch::Off, 1);
        let r = replay(&t, &off, 100, 64)[&1];
        assert_eq!((r.first_touches, r.far_reads, r.fetched), (400, 400, 0));
        let own = all(Prefetch::Own, 1);
        let r = replay(&t, &own, 100, 64)[&1];
        assert!(r.far_reads < 40, "{r:?}");
        assert!(r.accuracy().unwrap() > 0.9, "{r:?}");
        assert!(r.cost(0.4) < 100.0, "{r:?}");
    }

    #[test]
    fn prefetching_random_pages_is_seen_to_waste_what_it_fetches() {
        // Random faults over 1000 pages with room for 100, after a first touch of each.
        let mut faults: Vec<TracedFault> = (0..1000).map(|p| fault(1, p, false)).collect();
        let mut x: u64 = 12345;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            faults.push(fault(1, (x >> 33) % 1000, true));
        }
        let t = trace_of(faults);
        let line4 = all(Prefetch::Off, 4);
        let r = replay(&t, &line4, 100, 64)[&1];
        assert!(r.accuracy().unwrap() < 0.3, "{r:?}");
        let off = all(Prefetch::Off, 1);
        let o = replay(&t, &off, 100, 64)[&1];
        assert!(o.cost(0.4) < r.cost(0.4), "off {o:?} line 4 {r:?}");
    }

    #[test]
    fn a_page_freed_and_touched_again_is_a_first_touch_though_the_model_holds_it() {
        let mut faults: Vec<TracedFault> = (0..10).map(|p| fault(1, p, false)).collect();
        // The program freed page 3 (the preload discarded it) and wrote it again.
        faults.push(fault(1, 3, false));
        faults.push(fault(1, 3, true));
        let t = trace_of(faults);
        let off = all(Prefetch::Off, 1);
        let r = replay(&t, &off, 100, 64)[&1];
        // The first touch again is a miss, the far fault after it a hit (the model holds it).
        assert_eq!((r.first_touches, r.far_reads), (11, 0), "{r:?}");
    }

    #[test]
    fn the_model_is_sized_to_the_pager_that_recorded_the_trace() {
        // A pager that held 50 pages, first in first out, under random reads of 300 pages:
        // its misses are the trace.
        let (mut held, mut seen) = (VecDeque::new(), std::collections::HashSet::new());
        let mut faults = Vec::new();
        let mut x: u64 = 99;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let p = (x >> 33) % 300;
            if held.contains(&p) {
                continue;
            }
            faults.push(fault(1, p, !seen.insert(p)));
            held.push_back(p);
            if held.len() > 50 {
                held.pop_front();
            }
        }
        let c = calibrated_capacity(&trace_of(faults), 200, 64);
        assert!((40..=56).contains(&c), "{c}");
        // A trace the whole budget reproduces keeps the budget.
        let t = trace_of((0..500).map(|p| fault(1, p, false)).collect());
        assert_eq!(calibrated_capacity(&t, 200, 64), 200);
    }

    #[test]
    fn the_oracle_reads_no_more_than_any_policy_and_what_it_must() {
        // Passes over 150 pages with room for 100: first in first out misses on every page of
        // every pass after the first; Belady keeps 99 of them and reads the other 51 a pass.
        let mut faults = Vec::new();
        for pass in 0..4 {
            faults.extend((0..150).map(|p| fault(1, p, pass > 0)));
        }
        let t = trace_of(faults);
        let fifo = total(&replay(&t, &all(Prefetch::Off, 1), 100, 64)).far_reads;
        assert_eq!(fifo, 450);
        let oracle = oracle_far_reads(&t, 100);
        assert!((3 * 50..=3 * 52).contains(&oracle), "{oracle}");
        // With room for all, only first touches: nothing read.
        assert_eq!(oracle_far_reads(&t, 150), 0);
        // A page freed and touched again is never worth keeping in between: with room for one
        // page, the oracle holds the page read again, where first in first out took the freed
        // one's first touch in its place.
        let t = trace_of(vec![
            fault(1, 1, false),
            fault(1, 2, false),
            fault(1, 2, true),
            fault(1, 1, false),
            fault(1, 2, true),
        ]);
        let fifo = total(&replay(&t, &all(Prefetch::Off, 1), 1, 64)).far_reads;
        assert_eq!((fifo, oracle_far_reads(&t, 1)), (1, 0));
    }

    #[test]
    fn classes_tell_a_scan_from_a_stride_from_random_faults() {
        let mut faults: Vec<TracedFault> = (0..100).map(|p| fault(1, p, false)).collect();
        faults.extend((0..100).map(|i| fault(2, 1000 + 8 * i, false)));
        faults.extend([5u64, 77, 31, 90, 12].map(|p| fault(3, p * 13, false)));
        faults.extend((0..10).map(|p| fault(1, p, true)));
        let t = trace_of(faults);
        let c = classes(&t);
        assert_eq!(c[&1].faults, 110);
        assert!(c[&1].sequential >= 105, "{:?}", c[&1]);
        assert_eq!((c[&1].pages, c[&1].again), (100, 10));
        assert!(c[&2].strided >= 97, "{:?}", c[&2]);
        assert_eq!(c[&3].random, 5);
    }
}
