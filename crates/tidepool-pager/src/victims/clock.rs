//! GCLOCK, eviction's second source of victims: the clock hand's, with second chances for
//! referenced and hot pages; pinned sections and sections under their share passed over within
//! a reach; each victim with its cold neighbours, so that victims come in runs.

use super::{is_hole, Ask, VictimPolicy, Victims};
use crate::budget::EVICT_BATCH;
use crate::region::RegionInner;
use crate::sections::Keep;
use crate::table::{kind, BUSY, CHANCES, CHANCE_SHIFT, HEAT, INHERITED, REFERENCED, RESIDENT};
use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// Unused resident neighbours a clock victim takes along, one page apart, when eviction moves
/// pages into the frames that are the store (see [`Clock`]'s cold neighbours): measured
/// against none, CPython's 3M-entry dict at 50% local 7% faster (`local:?compress=none`),
/// zipf-0.99 3%, uniform-rmw within the noise (ARCHITECTURE.md, "Victims in runs").
pub(crate) const RUN_NEIGHBOURS: usize = 7;
/// Unused resident neighbours a clock victim takes along when eviction writes pages out, from
/// up to [`EVICT_REACH`] pages either side, across pages that are not mapped (ARCHITECTURE.md,
/// "Victims in spans").
pub(crate) const EVICT_NEIGHBOURS: usize = 31;
/// How far apart two victims may be and still be frozen with one write-protection: every page
/// between them must be unmapped (see `evict::spans_of`).
pub(crate) const EVICT_REACH: usize = 32;

/// A page on the clock: region, page, and the page's `evicted_at` when it joined, which
/// tells a stale entry (the page went out and came back since, by another way than this entry)
/// from the live one.
pub(crate) type ClockEntry = (Arc<RegionInner>, usize, u32);

/// The clock entry of `page`, which joins now.
pub(crate) fn clock_entry(region: &Arc<RegionInner>, page: usize) -> ClockEntry {
    (
        region.clone(),
        page,
        region.table.evicted_at(page).load(Relaxed),
    )
}

/// Whether a clock entry is left over: its region is gone, or its page went out since it
/// joined (and may be back, with an entry of its own).
pub(crate) fn stale((region, page, joined): &ClockEntry) -> bool {
    region.dead.load(Acquire) || region.table.evicted_at(*page).load(Relaxed) != *joined
}

/// The clock: every resident page the pager installed, in the order they joined.
#[derive(Debug, Default)]
pub(crate) struct Clock(Mutex<VecDeque<ClockEntry>>);

impl Clock {
    /// Page `page` of `region` joins the clock.
    pub(crate) fn push(&self, region: &Arc<RegionInner>, page: usize) {
        self.0.lock().push_back(clock_entry(region, page));
    }

    /// Pages `pages` of `region` join the clock.
    pub(crate) fn extend(&self, region: &Arc<RegionInner>, pages: impl Iterator<Item = usize>) {
        self.0.lock().extend(pages.map(|p| clock_entry(region, p)));
    }

    /// The entries, oldest first, locked.
    pub(crate) fn entries(&self) -> MutexGuard<'_, VecDeque<ClockEntry>> {
        self.0.lock()
    }
}

impl VictimPolicy for Clock {
    /// Moves the clock hand until the batch is full or the pass's reach is spent, locking the
    /// victims it chooses and their cold neighbours.
    fn take(&self, ask: &Ask, victims: &mut Victims) {
        let mut clock = self.0.lock();
        let mut pass = Pass::new(ask, clock.len());
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
            match look_at(ask, &mut pass, &region, page) {
                Seen::Gone => {}
                Seen::Stays => clock.push_back(entry),
                Seen::PassedOver => {
                    pass.budget += 1;
                    clock.push_back(entry);
                }
                Seen::Victim => match region.table.try_lock(page, &[RESIDENT]) {
                    Some(w) => {
                        let more = EVICT_BATCH.saturating_sub(victims.len() + 1);
                        take_cold_neighbours(ask, &region, page, more, victims);
                        victims.push((region, page, w));
                    }
                    None => clock.push_back(entry),
                },
            }
        }
    }
}

/// One pass of the clock hand: how many entries it may still look at, and the reach that pins
/// and shares give it (see [`Clock`]).
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
    fn new(ask: &Ask, clock_len: usize) -> Pass {
        let over = ask.sections.over_shares(ask.budget_pages);
        Pass {
            budget: clock_len.min(EVICT_BATCH * 8),
            pin_reach: if ask.sections.pins_hold() {
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

/// What the clock hand does with page `page` of `region`: passes it by (spending a second
/// chance, or the reach pins and shares give the pass), drops a stale entry, or takes it.
fn look_at(ask: &Ask, pass: &mut Pass, region: &RegionInner, page: usize) -> Seen {
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
        && ask.sections.keep_of(&region.sections, page) == Keep::Pin;
    if for_share && spend(&mut pass.share_reach) {
        ask.sections.shares_give_way();
    }
    if for_pin && spend(&mut pass.pin_reach) {
        ask.sections.pins_give_way();
    }
    if for_share || for_pin {
        return Seen::PassedOver;
    }
    if !region.readable(page) {
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
    ask: &Ask,
    region: &Arc<RegionInner>,
    page: usize,
    max: usize,
    victims: &mut Vec<(Arc<RegionInner>, usize, u64)>,
) {
    let spans = ask.spans;
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
            if kind(w) != RESIDENT || w & unused != 0 || !region.readable(p) {
                break;
            }
            // A section kept longer than by heat keeps its pages out of others' spans.
            if ask.sections.keep_of(&region.sections, p) != Keep::Normal {
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
