//! Tune's ladder: the one change per section, or the one section kept or held to a share,
//! that the next round tries (see the module above for the order).

use super::{policy_of, Round, Setting, SIGNIFICANT};
use tidepool_pager::profile::{KeepName, ObservedSection, PrefetchName, Profile};

/// A change to try: a section and the policy to give it.
pub(super) type Change = (String, Setting);

/// What the next round tries after `round`: the prefetch and line changes of
/// [`proposals`], or once none is left, one section kept longer ([`keep_proposal`]) or held to
/// a share ([`share_proposal`]); and whether it is the latter (judged by the whole program).
pub(super) fn next_changes(
    profile: &Profile,
    round: &Round,
    tried: &[Change],
    local: u64,
) -> (Vec<Change>, bool) {
    let changes = proposals(profile, round, tried);
    if !changes.is_empty() {
        return (changes, false);
    }
    let one = keep_proposal(profile, round, tried, local)
        .or_else(|| share_proposal(profile, round, tried, local));
    (one.into_iter().collect(), true)
}

/// The prefetch and line changes worth trying after `round`, made under `profile`: for each
/// section that matters, the first policy of its ladder not tried yet (`tried`). The ladder: a
/// stride detector of its own, a sweep detector of its own, a successor table, none (if its
/// prefetches were under half used), then lines of 2 and 4 pages with the prefetcher it keeps.
fn proposals(profile: &Profile, round: &Round, tried: &[Change]) -> Vec<Change> {
    let far: u64 = round.far_reads();
    let prefetched: u64 = round.sections.values().map(|s| s.prefetched).sum();
    let mut out = Vec::new();
    for s in round.sections.values() {
        let matters = s.far_reads as f64 >= SIGNIFICANT * far as f64
            || s.prefetched as f64 >= SIGNIFICANT * prefetched as f64;
        if !matters || s.far_reads + s.prefetched == 0 {
            continue;
        }
        let accuracy = (s.prefetched > 0).then(|| s.used as f64 / s.prefetched as f64);
        let now = policy_of(profile, &s.name);
        let with = |prefetch, line| Setting {
            prefetch,
            line,
            ..now
        };
        let mut ladder = vec![
            with(PrefetchName::Own, now.line),
            with(PrefetchName::Sweep, now.line),
            with(PrefetchName::Successor, now.line),
        ];
        if accuracy.is_none_or(|a| a < 0.5) {
            ladder.push(with(PrefetchName::Off, now.line));
        }
        if s.far_reads > 0 {
            ladder.extend([with(now.prefetch, 2), with(now.prefetch, 4)]);
        }
        let next = ladder.into_iter().find(|&to| {
            to != now
                && (to.line <= now.line || to.line == 2 * now.line)
                && !tried.iter().any(|t| t.0 == s.name && t.1 == to)
        });
        if let Some(to) = next {
            out.push((s.name.clone(), to));
        }
    }
    out
}

/// The least part of a new prefetcher's fetched pages the program must use for it to stay.
const USED_AT_LEAST: f64 = 0.25;

/// Whether a section's new prefetcher (`to`, after `was`) fetched pages the program used: one
/// whose pages mostly went unused can pass the cost test only by fetching less than the old
/// one, within one run's noise (CPython's dict table kept `successor` with 27 of 2940 fetched
/// pages used); fetching nothing is `off`'s rung, tried on its own.
pub(super) fn fetches_earn_their_place(
    was: PrefetchName,
    to: Setting,
    after: &ObservedSection,
) -> bool {
    to.prefetch == was
        || to.prefetch == PrefetchName::Off
        || after.prefetched == 0
        || after.used as f64 >= USED_AT_LEAST * after.prefetched as f64
}

/// Sections whose far reads make keeping their pages longer worth a round: at least this
/// share of the program's.
const KEEP_WORTH: f64 = 0.05;

/// The eviction change worth trying after `round` once no prefetch or line change is left:
/// for the section with the most far reads that came back soon (pages evicted less than the
/// budget's bytes before: what more room would have kept) that has not tried it, pages kept
/// high, then pinned. One at a time: keeping one section's pages costs every other section
/// room, so it is judged by the whole program's cost.
fn keep_proposal(profile: &Profile, round: &Round, tried: &[Change], local: u64) -> Option<Change> {
    let far = round.far_reads() as f64;
    let mut busiest: Vec<&ObservedSection> = round
        .sections
        .values()
        .filter(|s| {
            let soon = s.refetched_within(local);
            soon as f64 >= KEEP_WORTH * far && soon > 0
        })
        .collect();
    busiest.sort_by_key(|s| std::cmp::Reverse(s.refetched_within(local)));
    busiest.into_iter().find_map(|s| {
        let now = policy_of(profile, &s.name);
        let to = match now.keep {
            KeepName::Normal => KeepName::High,
            KeepName::High => KeepName::Pin,
            // Pinned, or a kind of keep this ladder does not know: nothing further to try.
            _ => return None,
        };
        let to = Setting { keep: to, ..now };
        (!tried.iter().any(|t| t.0 == s.name && t.1 == to)).then(|| (s.name.clone(), to))
    })
}

/// The share of the budget tune tries for a section whose pages hardly come back within it.
const SMALL_SHARE: u8 = 10;
/// A section whose far reads of pages evicted within the budget's bytes are under this part of
/// its far and prefetched pages reuses little of the room it holds.
const LITTLE_REUSE: f64 = 0.1;

/// Mira's section sizes, once no keep change is left: the section that moves the most pages
/// (at least [`KEEP_WORTH`] of the program's far and prefetched pages) while hardly any of
/// them come back within the budget (a stream, or random reads over far more than fits) is
/// held to a small share of the budget, if another section's pages do come back within it
/// (that section gets the room). Judged, like keeping, by the whole program's cost.
fn share_proposal(
    profile: &Profile,
    round: &Round,
    tried: &[Change],
    local: u64,
) -> Option<Change> {
    let moved = |s: &ObservedSection| s.far_reads + s.prefetched;
    let all: u64 = round.sections.values().map(moved).sum();
    let far = round.far_reads() as f64;
    let reuses = |s: &ObservedSection| s.refetched_within(local) as f64;
    let mut wasteful: Vec<&ObservedSection> = round
        .sections
        .values()
        .filter(|s| moved(s) as f64 >= KEEP_WORTH * all as f64)
        .filter(|s| reuses(s) < LITTLE_REUSE * moved(s) as f64)
        .collect();
    wasteful.sort_by_key(|s| std::cmp::Reverse(moved(s)));
    wasteful.into_iter().find_map(|s| {
        let others_reuse = round
            .sections
            .values()
            .any(|o| o.name != s.name && reuses(o) >= KEEP_WORTH * far && reuses(o) > 0.0);
        let now = policy_of(profile, &s.name);
        let to = Setting {
            share: SMALL_SHARE,
            ..now
        };
        (others_reuse && now.share == 0 && !tried.iter().any(|t| t.0 == s.name && t.1 == to))
            .then(|| (s.name.clone(), to))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_pager::profile::Program;

    fn section(name: &str, far_reads: u64, prefetched: u64, reused_soon: u64) -> ObservedSection {
        ObservedSection {
            name: name.into(),
            faults: far_reads,
            far_reads,
            evicted: far_reads + prefetched,
            prefetched,
            used: prefetched,
            line_pages: 0,
            prefetch: PrefetchName::Shared,
            line: 1,
            keep: KeepName::Normal,
            // Bucket 0: pages that came back within 1 MiB of evictions.
            refetched: vec![reused_soon],
        }
    }

    fn round(sections: Vec<ObservedSection>) -> Round {
        Round {
            seconds: 1.0,
            output: Vec::new(),
            sections: sections.into_iter().map(|s| (s.name.clone(), s)).collect(),
        }
    }

    #[test]
    fn a_stream_beside_a_section_that_reuses_its_room_is_held_to_a_small_share() {
        let program = Program {
            name: "p".into(),
            build_id: None,
        };
        let profile = Profile::new(program);
        let local = 16 << 20;
        let stream = section("stream", 100, 10_000, 0);
        let table = section("table", 5_000, 0, 3_000);
        let r = round(vec![stream.clone(), table.clone()]);
        let (name, to) = share_proposal(&profile, &r, &[], local).expect("a share to try");
        assert_eq!((name.as_str(), to.share), ("stream", SMALL_SHARE));
        // Tried once, not again.
        assert!(share_proposal(&profile, &r, &[(name, to)], local).is_none());
        // Nobody would use the room: nothing to try.
        let r = round(vec![stream, section("table", 5_000, 0, 0)]);
        assert!(share_proposal(&profile, &r, &[], local).is_none());
        // A section whose pages come back is not held down.
        let r = round(vec![section("table", 5_000, 0, 3_000)]);
        assert!(share_proposal(&profile, &r, &[], local).is_none());
    }

    #[test]
    fn a_new_prefetcher_whose_pages_go_unused_is_not_kept() {
        let to = |prefetch| Setting {
            prefetch,
            line: 1,
            ..Setting::default()
        };
        let mut after = section("s", 6_701, 2_940, 0);
        after.used = 27;
        let was = PrefetchName::Sweep;
        assert!(!fetches_earn_their_place(
            was,
            to(PrefetchName::Successor),
            &after
        ));
        // Turning prefetching off, or changing only the line, is judged by cost alone.
        assert!(fetches_earn_their_place(was, to(PrefetchName::Off), &after));
        assert!(fetches_earn_their_place(was, to(was), &after));
        after.used = 1_000;
        assert!(fetches_earn_their_place(
            was,
            to(PrefetchName::Successor),
            &after
        ));
    }
}
