//! Choosing victims: the pages streams walked past first, then the GCLOCK hand's (second
//! chances for referenced and hot pages; pinned sections and sections under their share passed
//! over within a reach), each with its cold neighbours, so that victims come in runs.

use crate::budget::EVICT_BATCH;
use crate::pager::{Inner, RegionInner, EVICT_NEIGHBOURS, EVICT_REACH, RUN_NEIGHBOURS};
use crate::region::stale;
use crate::sections::Keep;
use crate::table::{
    kind, BUSY, CHANCES, CHANCE_SHIFT, FAR, HEAT, INHERITED, REFERENCED, RESIDENT, UNTOUCHED,
    WRITEBACK,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// A page chosen for eviction, locked: its region, its index, its word before the lock.
pub(crate) type Victim = (Arc<RegionInner>, usize, u64);
pub(crate) type Victims = Vec<Victim>;

/// One pass of the clock hand: how many entries it may still look at, and the reach that pins
/// and shares give it (see `Inner::take_from_clock`).
struct Pass {
    budget: usize,
    /// Pinned sections' pages are passed over without counting against the pass's budget, up
    /// to a turn of the clock (they gather in a block, which a pass must get across). A pass
    /// that passes a whole turn of them (more is pinned than the budget holds) takes them from
    /// there on, and pins give way for the next batches (see `Sections::pins_hold`), so such a
    /// pass costs one batch in many.
    pin_reach: usize,
    /// Sections over their share of the budget (a bit each): their pages lose their second
    /// chances, and other sections' pages are passed over, up to a turn of the clock, to find
    /// them (shares then give way for some batches, as pins do).
    over: u128,
    share_reach: usize,
}

impl Pass {
    fn new(inner: &Inner, clock_len: usize) -> Pass {
        let over = inner.sections.over_shares(inner.budget.pages());
        Pass {
            budget: clock_len.min(EVICT_BATCH * 8),
            pin_reach: if inner.sections.pins_hold() {
                clock_len
            } else {
                0
            },
            over,
            share_reach: if over != 0 { clock_len } else { 0 },
        }
    }
}

/// What the clock hand does with an entry.
enum Seen {
    /// A stale entry: dropped.
    Gone,
    /// Back to the end of the clock (a second chance, held by another thread, unreadable).
    Stays,
    /// Back to the end of the clock without counting against the pass's budget (a pin's or a
    /// share's reach paid for it).
    PassedOver,
    /// To be evicted.
    Victim,
}

/// Spends one of a pass's `reach`; true if that was the last.
fn spend(reach: &mut usize) -> bool {
    *reach -= 1;
    *reach == 0
}

/// A page nothing maps in the program's view but through its lock (not mapped, and not the
/// program's own mapping): a write-protection over it changes nothing, and one that lands on it
/// after an install costs at most one write-protect fault (`serve_write_protect`).
pub(crate) fn is_hole(word: u64) -> bool {
    matches!(kind(word), FAR | UNTOUCHED | WRITEBACK)
}

impl Inner {
    /// Pages a stream is done with, which go first.
    pub(crate) fn take_done(&self, victims: &mut Victims) {
        let mut done = self.done.lock();
        while victims.len() < EVICT_BATCH {
            let Some((region, page)) = done.pop_back() else {
                break;
            };
            let word = region.table.state(page).load(Acquire);
            if region.dead.load(Acquire)
                || kind(word) != RESIDENT
                || word & (REFERENCED | INHERITED) != 0
                || self.sections.keep_of(&region.sections, page) == Keep::Pin
                || !self.readable(&region, page)
            {
                continue;
            }
            if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                victims.push((region, page, w));
            }
        }
    }

    /// Moves the clock hand until the batch is full or the pass's reach is spent, locking the
    /// victims it chooses and their cold neighbours.
    pub(crate) fn take_from_clock(&self, victims: &mut Victims) {
        let mut clock = self.clock.lock();
        let mut pass = Pass::new(self, clock.len());
        while victims.len() < EVICT_BATCH && pass.budget > 0 {
            pass.budget -= 1;
            let Some(entry) = clock.pop_front() else {
                break;
            };
            if stale(&entry) {
                // Gone, or an entry left by an eviction that took the page out of turn
                // (a stream's, a neighbour's): the page is on the clock elsewhere if at all.
                continue;
            }
            let (region, page) = (entry.0.clone(), entry.1);
            match self.look_at(&mut pass, &region, page) {
                Seen::Gone => {}
                Seen::Stays => clock.push_back(entry),
                Seen::PassedOver => {
                    pass.budget += 1;
                    clock.push_back(entry);
                }
                Seen::Victim => match region.table.try_lock(page, &[RESIDENT]) {
                    Some(w) => {
                        let more = EVICT_BATCH.saturating_sub(victims.len() + 1);
                        self.take_cold_neighbours(&region, page, more, victims);
                        victims.push((region, page, w));
                    }
                    None => clock.push_back(entry),
                },
            }
        }
    }

    /// What the clock hand does with page `page` of `region`: passes it by (spending a second
    /// chance, or the reach pins and shares give the pass), drops a stale entry, or takes it.
    fn look_at(&self, pass: &mut Pass, region: &RegionInner, page: usize) -> Seen {
        let s = region.table.state(page);
        let word = s.load(Acquire);
        if kind(word) == BUSY {
            // Another thread holds the page (a write fault lifting its protection, say): it
            // may stay mapped, and must stay on the clock.
            return Seen::Stays;
        }
        if kind(word) != RESIDENT || word & INHERITED != 0 {
            // A stale entry (evicted or discarded already), or a page a forked child shares
            // with its parent.
            return Seen::Gone;
        }
        // Second chances: a reference, then each chance the page's heat gave it.
        let spared = if word & REFERENCED != 0 {
            Some(word & !REFERENCED)
        } else if word & CHANCES != 0 {
            Some(word - (1 << CHANCE_SHIFT))
        } else {
            None
        };
        let over_share = pass.over != 0 && pass.over & (1 << region.sections.of(page).index()) != 0;
        if let (Some(spared), false) = (spared, over_share) {
            if s.compare_exchange(word, spared, AcqRel, Relaxed).is_ok() {
                return Seen::Stays;
            }
        }
        // Passed over for a section over its share, or kept for being pinned: each spends
        // the pass's reach for it, not its budget.
        let for_share = pass.share_reach > 0 && !over_share;
        let for_pin = !for_share
            && pass.pin_reach > 0
            && self.sections.keep_of(&region.sections, page) == Keep::Pin;
        if for_share && spend(&mut pass.share_reach) {
            self.sections.shares_give_way();
        }
        if for_pin && spend(&mut pass.pin_reach) {
            self.sections.pins_give_way();
        }
        if for_share || for_pin {
            return Seen::PassedOver;
        }
        if !self.readable(region, page) {
            // Inaccessible (PROT_NONE): it cannot be read to be saved; it stays until the
            // program opens it again.
            return Seen::Stays;
        }
        Seen::Victim
    }

    /// Locks up to `max` resident neighbours of clock victim `page` that show no use and adds
    /// them to `victims`: victims then come in runs or spans, frozen or moved by one system call
    /// and one TLB shootdown where scattered victims cost one each (about a miss's worth, more
    /// when the program runs on another CPU). Their clock entries stay behind, stale (see
    /// [`stale`]).
    ///
    /// Written out in spans ([`Frames::evicts_in_spans`](crate::tier::Frames::evicts_in_spans)), a neighbour is any resident page up
    /// to [`EVICT_REACH`] pages away, across holes, not referenced since the hand last passed
    /// (a write to a page installed clean, the one use the pager sees without a miss): its
    /// chances and heat do not count, since they only say how soon the page came back after its
    /// last eviction, and a neighbour left behind splits the span (measured, ARCHITECTURE.md). Moved as frames, only a
    /// page with no reference, chance or heat goes, one page apart (a page whose chances the
    /// hand has just used up is still warm, and went to the back of the line).
    fn take_cold_neighbours(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        max: usize,
        victims: &mut Vec<(Arc<RegionInner>, usize, u64)>,
    ) {
        let spans = self.frames.evicts_in_spans();
        let unused = if spans {
            REFERENCED | INHERITED
        } else {
            REFERENCED | CHANCES | HEAT | INHERITED
        };
        let (max, reach) = if spans {
            (max.min(EVICT_NEIGHBOURS), EVICT_REACH)
        } else {
            (max.min(RUN_NEIGHBOURS), RUN_NEIGHBOURS)
        };
        let pages = region.table.pages();
        let mut taken = 0;
        for step in [1isize, -1] {
            let mut p = page;
            for _ in 0..reach {
                if taken == max {
                    return;
                }
                match p.checked_add_signed(step) {
                    Some(next) if next < pages => p = next,
                    _ => break,
                }
                let w = region.table.state(p).load(Acquire);
                if spans && is_hole(w) {
                    continue;
                }
                if kind(w) != RESIDENT || w & unused != 0 || !self.readable(region, p) {
                    break;
                }
                // A section kept longer than by heat keeps its pages out of others' spans.
                if self.sections.keep_of(&region.sections, p) != Keep::Normal {
                    break;
                }
                match region.table.try_lock(p, &[RESIDENT]) {
                    Some(w) => victims.push((region.clone(), p, w)),
                    None => break,
                }
                taken += 1;
            }
        }
    }
}
