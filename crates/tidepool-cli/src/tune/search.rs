//! `tidepool tune`'s offline search: one run of the program records its demand faults with
//! prefetching off everywhere (the trace round), and every prefetcher and line for every busy
//! section is then tried against that trace (`tidepool_pager::replay`) instead of in a run of
//! the program each, as Mira searches its configurations against a profile. A section keeps
//! a prefetcher only if most of what it fetched in the replay was used ([`ACCURATE`]); one
//! whose default prefetches were mostly wasted gets a prefetcher that is accurate, or none.

/// What the oracle's bound says, at length for tune's report and short for the profile.
pub(crate) struct Bound {
    pub(crate) long: String,
    pub(crate) short: String,
}

/// The fewest pages any profile could have the program read at this budget
/// ([`replay::oracle_far_reads`] over the trace round's faults) against the `pages_read` of
/// round 0 (the profile so far): how much room a profile has at all. Under the in-process store
/// a run's time follows the pages it reads, so a program whose bound is near 1x cannot be made
/// much faster by any section's policy, only by more local memory. The converse does not hold:
/// reads of 16384 pages at random with room for 4096 took the pager 152.7k far reads, as
/// any policy without foresight would (75% of 200k reads miss), and the oracle 70.7k.
pub(crate) fn oracle_bound(trace: &FaultTrace, budget_pages: usize, pages_read: u64) -> Bound {
    let least = replay::oracle_far_reads(trace, budget_pages);
    let lost = if trace.dropped > 0 {
        format!(
            " (of the first {} faults; the trace lost {} more)",
            trace.faults.len(),
            trace.dropped
        )
    } else {
        String::new()
    };
    let most = if least == 0 {
        "no page need be read".to_string()
    } else {
        format!("{:.2}x fewer at most", pages_read as f64 / least as f64)
    };
    Bound {
        long: format!(
            "oracle: with all {budget_pages} pages of the budget and foresight, the program \
             reads at least {least} pages{lost}; round 0 read {pages_read} in all: {most}"
        ),
        short: format!("an oracle reads {least} of round 0's {pages_read} pages: {most}"),
    }
}

#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;
use tidepool_pager::fault_trace::FaultTrace;
use tidepool_pager::profile::{Observed, PrefetchName, Program};
use tidepool_pager::replay::{self, Candidate, Classes, Replayed};
use tidepool_pager::Prefetch;

/// Demand faults the trace round records (a word each in the program's memory: 16 MiB).
pub(crate) const TRACE_FAULTS: usize = 1 << 21;

/// The least part of what a section's prefetcher or line fetched that the replay must see
/// used for the section to keep it.
pub(crate) const ACCURATE: f64 = 0.7;

/// Sections searched, busiest first: the rest keep the default.
const SEARCHED_MAX: usize = 8;

/// A section's part of the replayed far reads and fetched pages that makes it worth a search.
const BUSY: f64 = 0.01;

/// A new policy must save this part of the replayed cost to replace the one a section has.
const BETTER: f64 = 0.97;

/// What the search chose for one section, and why.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub name: String,
    pub to: Candidate,
    pub before: Replayed,
    pub after: Replayed,
}

impl Choice {
    pub(crate) fn why(&self) -> String {
        format!(
            "offline search: replayed far reads {} -> {}, fetched {} ({}) -> {} ({})",
            self.before.far_reads,
            self.after.far_reads,
            self.before.fetched,
            used_share(&self.before),
            self.after.fetched,
            used_share(&self.after),
        )
    }
}

fn used_share(r: &Replayed) -> String {
    r.accuracy()
        .map_or("none".into(), |a| format!("{:.0}% used", a * 100.0))
}

/// What the search found: each searched section's choice, every candidate it replayed (for
/// the rounds after, which need not run them), and a report to print.
#[derive(Debug, Default)]
pub(crate) struct Search {
    pub choices: Vec<Choice>,
    pub tried: Vec<(String, Candidate)>,
    pub report: String,
}

/// The trace of program `me`'s busiest process in a round's directory `dir`.
pub(crate) fn read_trace(dir: &Path, me: &Program) -> anyhow::Result<FaultTrace> {
    let mut best: Option<(u64, u32)> = None;
    for (pid, o) in Observed::read_dir_by_pid(dir)? {
        if &o.program != me {
            continue;
        }
        let faults: u64 = o.sections.iter().map(|s| s.faults).sum();
        if best.is_none_or(|(f, _)| faults > f) {
            best = Some((faults, pid));
        }
    }
    let (_, pid) = best.ok_or_else(|| {
        anyhow::anyhow!(
            "no process of {} reported its sections in the trace round",
            me.name
        )
    })?;
    Ok(FaultTrace::read(&dir.join(FaultTrace::file_name(pid)))?)
}

/// The candidates a section is searched over: every prefetcher with lines of 1, 2 and 4.
fn candidates() -> Vec<Candidate> {
    let mut out = Vec::new();
    for prefetch in [
        Prefetch::Shared,
        Prefetch::Off,
        Prefetch::Own,
        Prefetch::Sweep,
        Prefetch::Successor,
    ] {
        for line in [1, 2, 4] {
            out.push(Candidate { prefetch, line });
        }
    }
    out
}

/// Whether `c` may serve a section that did `r` with it: fetching nothing ahead, or using
/// most of what it fetched.
fn accurate(c: Candidate, r: &Replayed) -> bool {
    !c.fetches_ahead() || r.accuracy().is_none_or(|a| a >= ACCURATE)
}

/// Searches policies for the busy sections of `trace` at `budget_pages` local pages, each
/// fetched page that goes unused weighing `waste` of a far read; `before` is each section's
/// policy before the search (by name), which a choice must beat.
pub(crate) fn search(
    trace: &FaultTrace,
    budget_pages: usize,
    waste: f64,
    before: &dyn Fn(&str) -> Candidate,
) -> Search {
    let window = tidepool_pager::DEFAULT_PREFETCH_WINDOW_MAX;
    let model_pages = replay::calibrated_capacity(trace, budget_pages, window);
    let mut current: HashMap<u8, Candidate> = (0..trace.sections.len())
        .map(|i| (i as u8, before(trace.section_name(i as u8))))
        .filter(|(_, c)| *c != Candidate::DEFAULT)
        .collect();
    let run = |current: &HashMap<u8, Candidate>| {
        let policy = |s: u8| current.get(&s).copied().unwrap_or(Candidate::DEFAULT);
        replay::replay(trace, &policy, model_pages, window)
    };
    let base = run(&current);
    let mut out = Search {
        report: format!(
            "  model: {model_pages} pages of the budget's {budget_pages} replay 97% of the trace \
             round's faults as misses\n{}",
            report(trace, &base)
        ),
        ..Search::default()
    };
    let total = replay::total(&base);
    let moved = (total.far_reads + total.fetched).max(1) as f64;
    let mut busy: Vec<(u8, Replayed)> = base
        .iter()
        .filter(|(_, r)| (r.far_reads + r.fetched) as f64 >= BUSY * moved)
        .map(|(&s, r)| (s, *r))
        .collect();
    busy.sort_by_key(|(s, r)| (std::cmp::Reverse(r.far_reads + r.fetched), *s));
    busy.truncate(SEARCHED_MAX);
    let mut now = base;
    for (section, _) in busy {
        let name = trace.section_name(section).to_string();
        let had = current.get(&section).copied().unwrap_or(Candidate::DEFAULT);
        let mut best: Option<(f64, Candidate, HashMap<u8, Replayed>)> = None;
        for c in candidates() {
            let mut trial = current.clone();
            trial.insert(section, c);
            let r = if c == had { now.clone() } else { run(&trial) };
            out.tried.push((name.clone(), c));
            let mine = r.get(&section).copied().unwrap_or_default();
            if !accurate(c, &mine) {
                continue;
            }
            let cost = replay::total(&r).cost(waste);
            if best.as_ref().is_none_or(|(b, ..)| cost < *b) {
                best = Some((cost, c, r));
            }
        }
        let Some((cost, c, r)) = best else {
            continue;
        };
        let had_mine = now.get(&section).copied().unwrap_or_default();
        let had_ok = accurate(had, &had_mine);
        let had_cost = replay::total(&now).cost(waste);
        if c != had && (!had_ok || cost < had_cost * BETTER) {
            out.choices.push(Choice {
                name,
                to: c,
                before: had_mine,
                after: r.get(&section).copied().unwrap_or_default(),
            });
            current.insert(section, c);
            now = r;
        }
    }
    let t = replay::total(&now);
    out.report += &format!(
        "  replayed with the choices: {} far reads, fetched {} ({})\n",
        t.far_reads,
        t.fetched,
        used_share(&t)
    );
    out
}

/// The access classes of the trace's busy sections, and what the default policies did in the
/// replay.
fn report(trace: &FaultTrace, base: &HashMap<u8, Replayed>) -> String {
    let classes = replay::classes(trace);
    let mut rows: Vec<(&u8, &Classes)> = classes.iter().collect();
    rows.sort_by_key(|(s, c)| (std::cmp::Reverse(c.faults), **s));
    let all: u64 = rows.iter().map(|(_, c)| c.faults).sum();
    let pct = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    let mut out = format!(
        "  trace: {} demand faults{}\n",
        trace.faults.len(),
        if trace.dropped > 0 {
            format!(" ({} more past its end, not replayed)", trace.dropped)
        } else {
            String::new()
        }
    );
    for (s, c) in rows
        .into_iter()
        .filter(|(_, c)| c.faults as f64 >= BUSY * all as f64)
    {
        let d = base.get(s).copied().unwrap_or_default();
        out += &format!(
            "  {}: {} faults ({:.0}% sequential, {:.0}% strided, {:.0}% random), {} pages, \
             {} faults again; default policies replayed: {} far reads, fetched {} ({})\n",
            trace.section_name(*s),
            c.faults,
            pct(c.sequential, c.faults),
            pct(c.strided, c.faults),
            pct(c.random, c.faults),
            c.pages,
            c.again,
            d.far_reads,
            d.fetched,
            used_share(&d),
        );
    }
    out
}

/// The profile's name for a replay's prefetcher.
pub(crate) fn prefetch_name(p: Prefetch) -> PrefetchName {
    p.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_pager::fault_trace::TracedFault;

    fn names(choices: &[Choice]) -> BTreeMap<String, Candidate> {
        choices.iter().map(|c| (c.name.clone(), c.to)).collect()
    }

    fn fault(section: u8, page: u64, far: bool) -> TracedFault {
        TracedFault::new(far, section, 1, page)
    }

    /// Section 1 scans 600 pages three times; section 2 reads 300 other pages at random.
    fn trace() -> FaultTrace {
        let mut faults = Vec::new();
        let mut x: u64 = 7;
        for pass in 0..3 {
            for p in 0..600 {
                faults.push(fault(1, p, pass > 0));
                if p % 2 == 0 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    faults.push(fault(2, 10_000 + (x >> 33) % 300, pass > 0));
                }
            }
        }
        FaultTrace {
            sections: vec!["rest".into(), "scan".into(), "table".into()],
            faults,
            dropped: 0,
        }
    }

    #[test]
    fn the_search_gives_a_scan_a_prefetcher_and_random_reads_none_that_wastes() {
        let s = search(&trace(), 200, 0.4, &|_| Candidate::DEFAULT);
        let chosen = names(&s.choices);
        // The scan is followed (it faulted on every page three times in order); the random
        // section never gets a prefetcher or a line whose pages go unused.
        assert!(chosen["scan"].fetches_ahead(), "{chosen:?}\n{}", s.report);
        if let Some(c) = chosen.get("table") {
            assert!(!c.fetches_ahead(), "{c:?}: {s:?}");
        }
        for c in &s.choices {
            if c.to.fetches_ahead() {
                assert!(c.after.accuracy().unwrap_or(1.0) >= ACCURATE, "{c:?}");
            }
        }
        let scan = &s.choices.iter().find(|c| c.name == "scan").unwrap();
        assert!(
            scan.after.far_reads * 3 < scan.before.far_reads * 2,
            "{scan:?}"
        );
        assert!(s.report.contains("scan:"), "{}", s.report);
        assert!(s.report.contains("% sequential"), "{}", s.report);
        assert!(s.tried.len() >= candidates().len(), "{}", s.tried.len());
    }

    #[test]
    fn a_section_already_at_its_best_policy_is_left_alone() {
        let first = search(&trace(), 200, 0.4, &|_| Candidate::DEFAULT);
        let best = names(&first.choices)["scan"];
        let again = search(&trace(), 200, 0.4, &|name| {
            if name == "scan" {
                best
            } else {
                Candidate::DEFAULT
            }
        });
        assert!(
            !again.choices.iter().any(|c| c.name == "scan"),
            "{:?}",
            again.choices
        );
    }

    #[test]
    fn the_oracle_bound_says_how_many_pages_and_what_the_trace_lost() {
        // Three passes over 150 pages with room for 100: the oracle reads about 51 a pass.
        let mut t = trace();
        t.faults = (0..3)
            .flat_map(|pass| (0..150).map(move |p| fault(1, p, pass > 0)))
            .collect();
        let b = oracle_bound(&t, 100, 300);
        assert!(
            b.long.starts_with("oracle: with all 100 pages"),
            "{}",
            b.long
        );
        assert!(b.short.contains(" of round 0's 300 pages: "), "{}", b.short);
        assert!(b.short.ends_with("x fewer at most"), "{}", b.short);
        assert!(!b.long.contains("lost"), "{}", b.long);
        t.dropped = 7;
        assert!(oracle_bound(&t, 100, 300)
            .long
            .contains("the trace lost 7 more"));
        t.faults.truncate(150);
        let b = oracle_bound(&t, 200, 300);
        assert!(b.short.ends_with("no page need be read"), "{}", b.short);
    }
}
