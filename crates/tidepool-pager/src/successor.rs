//! A prefetcher for walks that repeat an order no stride describes: a pointer chase over
//! objects placed at random (a linked list or a tree walked again and again, a garbage
//! collector marking a heap that did not move since its last mark). It learns, for each page
//! of a section that faulted, the page that faulted next (a Markov predictor with one
//! successor a page: Joseph and Grunwald, ISCA 1997), and on a fault follows the chain of
//! learned successors and fetches the far pages on it.
//!
//! The chain's last far page is left unmapped as a trigger, as the stride detector leaves
//! its window's middle page (`prefetch.rs`): the program's fault there proves it followed the
//! chain, credits the pages before it as used, and plans the next chain, twice as long. A
//! fault anywhere else teaches the table that page as the successor of the page the chain
//! started from, and halves the chain. Each entry has a two-bit confidence, so a successor
//! seen many times is replaced only after it was wrong as often.
//!
//! The table is direct-mapped, a page and its successor in eight bytes: 2 MiB holds the
//! successors of a GiB of pages. It is made at the section's first fault in a region and
//! counts as the pager's own memory.

/// The shortest chain and the longest, in pages (the trigger included).
const DEPTH_MIN: u32 = 4;
pub const DEPTH_MAX: usize = 64;

/// Successors of pages at or past this index are not learned (two bits of the slot's
/// successor word are its confidence).
const PAGE_LIMIT: i64 = 1 << 30;
const CONFIDENCE_SHIFT: u32 = 30;
const PAGE_MASK: u32 = (1 << CONFIDENCE_SHIFT) - 1;

/// The far pages of a chain to fetch, and its trigger, left unmapped.
#[derive(Debug, Clone, Copy)]
pub struct Chain {
    pages: [i64; DEPTH_MAX],
    len: usize,
    pub trigger: i64,
}

impl Chain {
    /// The pages to fetch, in the order the program is expected to want them (not including
    /// the trigger). Some may be mapped by the time they are fetched: they are passed over.
    pub fn pages(&self) -> &[i64] {
        &self.pages[..self.len]
    }
}

/// The chain planned after the last fault: every step of it up to its trigger, and which
/// of them were fetched (bit `k` for step `k`).
#[derive(Debug, Clone, Copy)]
struct Pending {
    from: i64,
    steps: [i64; DEPTH_MAX],
    /// The trigger's step: the last.
    trigger_at: usize,
    fetched: u64,
}

/// The successor detector of one section in one region.
#[derive(Debug)]
pub struct SuccessorDetector {
    /// `(page + 1, successor | confidence << 30)`; a first word of 0 is an empty slot.
    slots: Box<[(u32, u32)]>,
    shift: u32,
    /// The page the last fault was on, and the chain planned from it if any.
    last: Option<i64>,
    pending: Option<Pending>,
    depth: u32,
    /// Pages planned so far, and planned pages the program has since walked past.
    pub planned: u64,
    pub credited: u64,
}

impl SuccessorDetector {
    /// A detector with room for the successors of about `pages` pages: twice as many slots,
    /// a power of two from 2^13 to 2^21.
    pub fn new(pages: usize) -> SuccessorDetector {
        let slots = (2 * pages).clamp(1 << 13, 1 << 21).next_power_of_two();
        SuccessorDetector {
            slots: vec![(0, 0); slots].into_boxed_slice(),
            shift: 32 - slots.trailing_zeros(),
            last: None,
            pending: None,
            depth: DEPTH_MIN,
            planned: 0,
            credited: 0,
        }
    }

    /// Records a demand fault on `page`; returns what to fetch, if anything. `far(p)` says
    /// whether page `p` is in far memory (only those are fetched, and one of them is the
    /// trigger).
    pub fn on_fault(&mut self, page: i64, far: impl Fn(i64) -> bool) -> Option<Chain> {
        let pending = self.pending.take();
        let step = pending.and_then(|p| p.steps[..=p.trigger_at].iter().position(|&s| s == page));
        match (pending, step) {
            (Some(p), Some(k)) => {
                // The program followed the chain to step `k`: its trigger, or a page on the
                // way that was not fetched (on its way out when planned, or dropped for want
                // of room). Its first step gains confidence; the pages before `k` were used.
                self.credited += (p.fetched & ((1 << k) - 1)).count_ones() as u64;
                if let Some(next) = self.successor(p.from) {
                    self.learn(p.from, next);
                }
                if k == p.trigger_at {
                    self.depth = (self.depth * 2).min(DEPTH_MAX as u32);
                }
            }
            (pending, _) => {
                if let Some(last) = self.last {
                    self.learn(last, page);
                }
                if pending.is_some() {
                    self.depth = (self.depth / 2).max(DEPTH_MIN);
                }
            }
        }
        self.last = Some(page);
        self.plan(page, far)
    }

    /// The two slots `page` may be in (a two-way set: one direct-mapped slot lost a third
    /// of a random walk's successors to collisions at half load).
    fn set(&self, page: i64) -> [usize; 2] {
        let i = ((page as u32).wrapping_mul(0x9E37_79B1) >> self.shift) as usize & !1;
        [i, i + 1]
    }

    /// The slot holding `page`'s successor, if any.
    fn find(&self, page: i64) -> Option<usize> {
        if !(0..PAGE_LIMIT).contains(&page) {
            return None;
        }
        self.set(page)
            .into_iter()
            .find(|&i| self.slots[i].0 == page as u32 + 1)
    }

    fn learn(&mut self, page: i64, next: i64) {
        if !(0..PAGE_LIMIT).contains(&page) || !(0..PAGE_LIMIT).contains(&next) || page == next {
            return;
        }
        let fresh = (page as u32 + 1, next as u32 | 1 << CONFIDENCE_SHIFT);
        let Some(i) = self.find(page) else {
            // Into the set's empty or least confident slot.
            let [a, b] = self.set(page);
            let confidence =
                |i: usize| (self.slots[i].0 != 0) as u32 + (self.slots[i].1 >> CONFIDENCE_SHIFT);
            let i = if confidence(a) < confidence(b) { a } else { b };
            self.slots[i] = fresh;
            return;
        };
        let word = self.slots[i].1;
        let (old, confidence) = (word & PAGE_MASK, word >> CONFIDENCE_SHIFT);
        self.slots[i].1 = if old == next as u32 {
            old | (confidence + 1).min(3) << CONFIDENCE_SHIFT
        } else if confidence > 1 {
            old | (confidence - 1) << CONFIDENCE_SHIFT
        } else {
            fresh.1
        };
    }

    /// The learned successor of `page`, if any.
    fn successor(&self, page: i64) -> Option<i64> {
        self.find(page)
            .map(|i| (self.slots[i].1 & PAGE_MASK) as i64)
    }

    /// The chain from `from`: up to `depth` successors, cut after the last far one, which
    /// becomes the trigger.
    fn plan(&mut self, from: i64, far: impl Fn(i64) -> bool) -> Option<Chain> {
        let mut p = Pending {
            from,
            steps: [0; DEPTH_MAX],
            trigger_at: 0,
            fetched: 0,
        };
        let (mut n, mut trigger_at) = (0, None);
        let mut at = from;
        while n < self.depth as usize {
            let Some(next) = self.successor(at) else {
                break;
            };
            if next == from || p.steps[..n].contains(&next) {
                break;
            }
            p.steps[n] = next;
            if far(next) {
                p.fetched |= 1 << n;
                trigger_at = Some(n);
            }
            n += 1;
            at = next;
        }
        p.trigger_at = trigger_at?;
        // The trigger is left unmapped, and nothing after it is fetched.
        p.fetched &= (1 << p.trigger_at) - 1;
        let mut chain = Chain {
            pages: [0; DEPTH_MAX],
            len: 0,
            trigger: p.steps[p.trigger_at],
        };
        for k in (0..p.trigger_at).filter(|&k| p.fetched & 1 << k != 0) {
            chain.pages[chain.len] = p.steps[k];
            chain.len += 1;
        }
        self.planned += chain.len as u64;
        self.pending = Some(p);
        Some(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Pages `0..n` in a random order (a list whose nodes were placed at random).
    fn shuffled(n: i64, mut x: u64) -> Vec<i64> {
        let mut v: Vec<i64> = (0..n).collect();
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
        v
    }

    /// Walks `order` `passes` times with `room` pages mapped at most (the oldest unmapped
    /// first); returns the faults of the last pass.
    fn walk(d: &mut SuccessorDetector, order: &[i64], passes: usize, room: usize) -> u64 {
        let mut mapped = std::collections::VecDeque::new();
        let mut set = HashSet::new();
        let mut faults = 0;
        let map = |p: i64, mapped: &mut std::collections::VecDeque<i64>, set: &mut HashSet<i64>| {
            if set.insert(p) {
                mapped.push_back(p);
                if mapped.len() > room {
                    set.remove(&mapped.pop_front().unwrap());
                }
            }
        };
        for pass in 0..passes {
            for &p in order {
                if set.contains(&p) {
                    continue;
                }
                if pass == passes - 1 {
                    faults += 1;
                }
                map(p, &mut mapped, &mut set);
                let snapshot = set.clone();
                if let Some(chain) = d.on_fault(p, |q| !snapshot.contains(&q)) {
                    for &q in chain.pages() {
                        map(q, &mut mapped, &mut set);
                    }
                }
            }
        }
        faults
    }

    #[test]
    fn a_repeated_random_walk_faults_on_few_pages_once_learned() {
        let order = shuffled(20_000, 0x9E37_79B9_7F4A_7C15);
        let mut d = SuccessorDetector::new(20_000);
        let faults = walk(&mut d, &order, 3, 2_000);
        // One fault a chain, and chains grow to DEPTH_MAX pages.
        assert!(faults < 20_000 / 10, "{faults} faults");
        assert!(
            d.credited * 10 >= d.planned * 9,
            "{} of {}",
            d.credited,
            d.planned
        );
    }

    #[test]
    fn random_faults_that_never_repeat_fetch_little() {
        let mut d = SuccessorDetector::new(1 << 16);
        let order = shuffled(200_000, 42);
        for &p in &order {
            d.on_fault(p, |_| true);
        }
        assert_eq!(d.planned, 0);
        // A new random order over the same pages: every learned successor is wrong once,
        // and the chains stay at their shortest.
        for &p in &shuffled(200_000, 7) {
            d.on_fault(p, |_| true);
        }
        assert!(d.planned < 200_000 * 4, "{} planned", d.planned);
        assert!(
            d.credited * 50 < d.planned,
            "{} of {}",
            d.credited,
            d.planned
        );
    }

    #[test]
    fn a_confident_successor_survives_one_detour() {
        let mut d = SuccessorDetector::new(1 << 13);
        for _ in 0..3 {
            d.on_fault(10, |_| true);
            d.on_fault(20, |_| true);
        }
        d.on_fault(10, |_| true);
        d.on_fault(99, |_| true);
        assert_eq!(d.successor(10), Some(20));
        // Wrong twice more and it gives way.
        for _ in 0..3 {
            d.on_fault(10, |_| true);
            d.on_fault(99, |_| true);
        }
        assert_eq!(d.successor(10), Some(99));
    }

    #[test]
    fn only_far_pages_are_fetched_and_the_last_is_the_trigger() {
        let mut d = SuccessorDetector::new(1 << 13);
        for p in [1, 2, 3, 4, 5] {
            d.on_fault(p, |_| true);
        }
        // From 1: 2 3 4 5; 3 is mapped, 5 is the last far one.
        let chain = d.on_fault(1, |q| q != 3).expect("a chain");
        assert_eq!((chain.pages(), chain.trigger), (&[2, 4][..], 5));
        assert_eq!(d.planned, 2);
        // The program got there: credited, and no successor of 1 learned from it.
        d.on_fault(5, |_| true);
        assert_eq!((d.credited, d.successor(1)), (2, Some(2)));
    }
}
