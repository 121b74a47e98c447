//! `tidepool tune`: profile-guided configuration, Mira's iterative loop.
//!
//! For an unmodified program (`tidepool tune --local SIZE -- PROGRAM ARGS`), each round runs
//! the program under `tidepool run` with the profile so far, reads what every section did
//! (each process writes its sections at exit, `TIDEPOOL_RUN_SECTIONS_OUT`), and proposes a
//! change for each section that matters (at least 1% of the far reads or of the prefetches),
//! the first rung of its ladder not tried yet:
//!
//! - a stride detector of its own (`own`: its streams are followed whatever else the program
//!   does meanwhile), then a sweep detector of its own (`sweep`), then a learned successor
//!   table (`successor`);
//! - none (`off`), if its prefetches were under half used;
//! - with far reads, a line of 2 pages, then 4, with the prefetcher it keeps.
//!
//! Once no such change is left, the section with the most far reads has its pages kept
//! longer (`keep = "high"`), then pinned (`keep = "pin"`), one section a round; then the
//! section that moves the most pages while hardly any come back within the budget (a stream)
//! is held to a small share of it (`share = 10`), as Mira sizes its sections. Keeping one
//! section's pages takes room from the others, so such a change stays only if the whole
//! program's cost fell.
//!
//! The next round tries every proposal at once; each section keeps its change if its cost fell
//! by 3% (demand far reads, plus 0.4 of a miss for every page prefetched and not used or read
//! along a line) and, for a new prefetcher, the program used a quarter of what it fetched,
//! and goes back otherwise, and a round more than 25% slower than the best so far
//! is undone as a whole. At the end the profile and the default policies run three times
//! each, alternating, and a profile whose median time is not the lower is left empty. The
//! program's output must be the same in every round (a profile never
//! changes an answer; a program whose output varies needs `--ignore-output`). Tuning on its own
//! output (`--from`) goes on from there, as Mira's iterations do.
//!
//! For far data structures (`tidepool tune PROFILE.json --budget SIZE`), see `tidepool_far::tune`.

use crate::run::find_program;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use tidepool_pager::profile::{
    KeepName, ObservedSection, PrefetchName, Profile, Program, SectionEntry,
};

/// `tidepool tune` for an unmodified program.
#[derive(Debug, Clone)]
pub struct ProgramTune {
    pub local: u64,
    pub backend: String,
    pub out: Option<PathBuf>,
    pub rounds: u32,
    pub from: Option<PathBuf>,
    pub ignore_output: bool,
    pub program: Vec<OsString>,
}

/// A round this much slower than the best is undone whatever its counters say. Runs of one
/// program vary by 15% and more on this kind of machine (four runs of one CPython dict at
/// 16 MiB: 3.56 to 4.95 s), so time is a guard here and the counters decide.
const SLOWER: f64 = 1.25;

/// A section's part of the far reads or prefetches that makes it worth a policy.
const SIGNIFICANT: f64 = 0.01;
/// What a page prefetched and not used, or read along a line, costs against a miss. Under
/// the compressing default store such a page costs a decompression and a copy in, and the
/// compression of the page it pushes out: about 8 us against a miss's 15-20 us here. At 0.1
/// tune kept lines that cut misses and cost time (V8's heap with lines of 2: 65.9k -> 54.7k
/// far reads for 47k line pages, a slower round).
const WASTE: f64 = 0.4;

/// Runs of the program with the profile and without it, alternating, before tune believes
/// the profile makes it faster at all.
const CHECKS: usize = 3;

/// What one round did.
struct Round {
    seconds: f64,
    output: Vec<u8>,
    sections: BTreeMap<String, ObservedSection>,
}

impl Round {
    fn far_reads(&self) -> u64 {
        self.sections.values().map(|s| s.far_reads).sum()
    }

    fn accuracy(&self) -> Option<f64> {
        let (p, u) = self
            .sections
            .values()
            .fold((0, 0), |(p, u), s| (p + s.prefetched, u + s.used));
        (p > 0).then(|| u as f64 / p as f64)
    }
}

fn cost(s: &ObservedSection) -> f64 {
    s.far_reads as f64 + WASTE * (s.prefetched.saturating_sub(s.used) + s.line_pages) as f64
}

/// A section's policy as tune changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Setting {
    prefetch: PrefetchName,
    line: u8,
    keep: KeepName,
    /// The most of the budget the section may hold, in percent (0: no limit).
    share: u8,
}

fn policy_of(p: &Profile, name: &str) -> Setting {
    p.sections.iter().find(|s| s.name == name).map_or(
        Setting {
            line: 1,
            ..Setting::default()
        },
        |s| Setting {
            prefetch: s.prefetch,
            line: s.line,
            keep: s.keep,
            share: s.share,
        },
    )
}

fn set_policy(p: &mut Profile, name: &str, to: Setting, why: String) {
    p.sections.retain(|s| s.name != name);
    if (to.prefetch, to.line, to.keep, to.share) != (PrefetchName::Shared, 1, KeepName::Normal, 0) {
        p.sections.push(SectionEntry {
            name: name.to_string(),
            prefetch: to.prefetch,
            line: to.line,
            keep: to.keep,
            share: to.share,
            why: (!why.is_empty()).then_some(why),
        });
    }
    p.sections.sort_by(|a, b| a.name.cmp(&b.name));
}

/// A change to try: a section and the policy to give it.
type Change = (String, Setting);

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
fn fetches_earn_their_place(was: PrefetchName, to: Setting, after: &ObservedSection) -> bool {
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

/// What each busy section's far reads were: pages read for the first time, or pages that came
/// back after this many bytes of evictions (under the budget: more room would have kept
/// them). One line a section, busiest first, for the sections with 1% of the far reads.
fn reuse(r: &Round, local: u64) -> String {
    let far = r.far_reads();
    let mut busy: Vec<&ObservedSection> = r
        .sections
        .values()
        .filter(|s| s.far_reads > 0 && s.far_reads as f64 >= SIGNIFICANT * far as f64)
        .collect();
    busy.sort_by_key(|s| std::cmp::Reverse(s.far_reads));
    let mut out = String::new();
    for s in busy {
        let again: u64 = s.refetched.iter().sum();
        let soon = s.refetched_within(local);
        let half = s.refetched_within(local / 2);
        out += &format!(
            "  {}: {} far reads, {} of pages read before: {} back within {} of evictions, {} within {}\n",
            s.name,
            s.far_reads,
            again,
            soon,
            tidepool_node::format_size(local),
            half,
            tidepool_node::format_size(local / 2),
        );
    }
    out
}

fn total_cost(r: &Round) -> f64 {
    r.sections.values().map(cost).sum()
}

fn counters_moved(before: &ObservedSection, after: &ObservedSection) -> String {
    format!(
        "far reads {} -> {}, prefetched {} ({} used) -> {} ({} used), line pages {} -> {}",
        before.far_reads,
        after.far_reads,
        before.prefetched,
        before.used,
        after.prefetched,
        after.used,
        before.line_pages,
        after.line_pages
    )
}

/// Runs the program once under `tidepool run` with `profile` (none: the default policies),
/// and reads what the sections of the program `me` did (`None`: of the busiest program among
/// the processes, which becomes `me`).
fn run_round(
    t: &ProgramTune,
    me: &mut Option<Program>,
    profile: Option<&Profile>,
    dir: &Path,
    n: u32,
) -> Result<Round> {
    let out = dir.join(format!("round-{n}"));
    std::fs::create_dir(&out)?;
    let log = dir.join(format!("round-{n}.stderr"));
    let mut cmd = round_command(t, profile, dir, n)?;
    cmd.env(tidepool_pager::run_env::SECTIONS_OUT, &out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?);
    let started = Instant::now();
    let result = cmd.output().context("cannot start tidepool run")?;
    let seconds = started.elapsed().as_secs_f64();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    if !result.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        bail!(
            "the program failed under tidepool run in round {n} ({}); the end of what it said:\n{}",
            result.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    if stderr.contains("profile")
        && (stderr.contains("ignored") || stderr.contains("changed nothing"))
    {
        bail!("tidepool run did not apply the profile in round {n}:\n{stderr}");
    }
    let records = tidepool_pager::profile::Observed::read_dir(&out)?;
    if me.is_none() {
        *me = busiest_program(&records);
    }
    let sections = sections_of(records, me.as_ref());
    if sections.is_empty() {
        bail!(
            "no process reported its sections in round {n}: did the program run under \
             tidepool run, fault at all at --local {}, and exit (not die by a signal)?",
            tidepool_node::format_size(t.local)
        );
    }
    Ok(Round {
        seconds,
        output: result.stdout,
        sections,
    })
}

/// `tidepool run` of the program at the tuning's budget and store, with `profile` (written
/// into `dir` for round `n`) if there is one.
fn round_command(
    t: &ProgramTune,
    profile: Option<&Profile>,
    dir: &Path,
    n: u32,
) -> Result<Command> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "run",
        "--no-coord",
        "--local",
        &t.local.to_string(),
        "--backend",
        &t.backend,
    ]);
    if let Some(profile) = profile {
        let profile_file = dir.join(format!("profile-{n}.toml"));
        std::fs::write(&profile_file, profile.to_toml())?;
        cmd.arg("--profile").arg(&profile_file);
    }
    cmd.arg("--").args(&t.program);
    Ok(cmd)
}

/// The program whose processes faulted most: a wrapper (a pyenv shim, a shell script)
/// hardly faults at all.
fn busiest_program(records: &[tidepool_pager::profile::Observed]) -> Option<Program> {
    let mut faults: BTreeMap<String, (u64, Program)> = BTreeMap::new();
    for o in records {
        let f: u64 = o.sections.iter().map(|s| s.faults).sum();
        let key = format!("{}\0{:?}", o.program.name, o.program.build_id);
        faults.entry(key).or_insert((0, o.program.clone())).0 += f;
    }
    faults.into_values().max_by_key(|v| v.0).map(|v| v.1)
}

/// The sections of program `me`, each one's counters summed over its processes.
fn sections_of(
    records: Vec<tidepool_pager::profile::Observed>,
    me: Option<&Program>,
) -> BTreeMap<String, ObservedSection> {
    let mut sections: BTreeMap<String, ObservedSection> = BTreeMap::new();
    for o in records {
        if Some(&o.program) != me {
            continue;
        }
        for s in o.sections {
            match sections.get_mut(&s.name) {
                Some(a) => {
                    a.faults += s.faults;
                    a.far_reads += s.far_reads;
                    a.evicted += s.evicted;
                    a.prefetched += s.prefetched;
                    a.used += s.used;
                    a.line_pages += s.line_pages;
                }
                None => {
                    sections.insert(s.name.clone(), s);
                }
            }
        }
    }
    sections
}

fn summary(r: &Round) -> String {
    format!(
        "{:.2} s, {} far reads, prefetches {} used",
        r.seconds,
        r.far_reads(),
        r.accuracy()
            .map_or("none".to_string(), |a| format!("{:.0}%", a * 100.0))
    )
}

/// Tunes the program: rounds of runs, a profile out.
pub fn tune_program(t: &ProgramTune) -> Result<()> {
    let (name, _) = t.program.split_first().context("no program given")?;
    find_program(name)
        .with_context(|| format!("{} is not a program on PATH", name.to_string_lossy()))?;
    let from = t.from.as_deref().map(Profile::read).transpose()?;
    let mut me = from.as_ref().map(|p| p.program.clone());
    let dir = private_dir()?;
    eprintln!(
        "tidepool tune: {} at --local {}, up to {} rounds (work files in {})",
        name.to_string_lossy(),
        tidepool_node::format_size(t.local),
        t.rounds,
        dir.display()
    );
    let mut last = run_round(t, &mut me, from.as_ref(), &dir, 0)?;
    let me = me.expect("round 0 found the program");
    let mut profile = from.unwrap_or_else(|| Profile::new(me.clone()));
    eprintln!(
        "round 0 (the profile so far, for {}): {}",
        me.name,
        summary(&last)
    );
    eprint!("{}", reuse(&last, t.local));
    let (mut best_seconds, output) = (last.seconds, last.output.clone());
    let mut times = vec![last.seconds];
    let mut ever_tried: Vec<Change> = Vec::new();
    // `last` holds each section's counters under the policy it keeps: a change that was
    // dropped leaves the section's counters from before it.
    for n in 1..t.rounds {
        let mut tried = proposals(&profile, &last, &ever_tried);
        let keeping = tried.is_empty();
        if keeping {
            tried.extend(
                keep_proposal(&profile, &last, &ever_tried, t.local)
                    .or_else(|| share_proposal(&profile, &last, &ever_tried, t.local)),
            );
        }
        ever_tried.extend(tried.iter().cloned());
        if tried.is_empty() {
            eprintln!("nothing left to try");
            break;
        }
        let mut trial = profile.clone();
        for (name, to) in &tried {
            set_policy(&mut trial, name, *to, String::new());
        }
        let round = run_round(t, &mut Some(me.clone()), Some(&trial), &dir, n)?;
        times.push(round.seconds);
        if !t.ignore_output && round.output != output {
            bail!(
                "the program printed something else in round {n} than in round 0: tune needs a \
                 program whose output is the same every run (or --ignore-output)"
            );
        }
        eprintln!(
            "round {n} ({} changes tried): {}",
            tried.len(),
            summary(&round)
        );
        if round.seconds > best_seconds * SLOWER {
            eprintln!(
                "  {:.2} s is more than 25% slower than the best round ({best_seconds:.2} s): undone",
                round.seconds
            );
            continue;
        }
        best_seconds = best_seconds.min(round.seconds);
        last = if keeping {
            judge_keep(&mut profile, &tried[0], last, round)
        } else {
            judge_changes(&mut profile, &tried, &last, round)
        };
    }
    let checked = check(t, &me, &profile, &dir)?;
    if let Some(why) = &checked {
        eprintln!("{why}: the profile is left empty");
        profile.sections.clear();
    }
    write_profile(t, &mut profile, &times)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Judges keeping one section's pages (`tried`), by the whole program's cost: the round
/// that comes next starts from `round` if it is kept, else from `last`.
fn judge_keep(profile: &mut Profile, tried: &Change, last: Round, round: Round) -> Round {
    let (name, to) = tried;
    let (was, now) = (total_cost(&last), total_cost(&round));
    let kept = now < was * 0.95;
    let why = format!(
        "the program's far reads {} -> {} (cost {was:.0} -> {now:.0})",
        last.far_reads(),
        round.far_reads()
    );
    eprintln!(
        "  {name}: keep {:?}, share {}% {} ({why})",
        to.keep,
        to.share,
        if kept { "kept" } else { "dropped" }
    );
    if kept {
        set_policy(profile, name, *to, why);
        round
    } else {
        last
    }
}

/// Judges each section's change (`tried`) by its own counters: the round that comes next
/// has `round`'s counters for the sections whose change is kept, `last`'s for the others.
fn judge_changes(profile: &mut Profile, tried: &[Change], last: &Round, round: Round) -> Round {
    let mut next = round.sections.clone();
    for (name, to) in tried {
        let (Some(before), Some(after)) = (last.sections.get(name), round.sections.get(name))
        else {
            continue;
        };
        let kept = cost(after) < cost(before) * 0.97
            && fetches_earn_their_place(policy_of(profile, name).prefetch, *to, after);
        let why = counters_moved(before, after);
        eprintln!(
            "  {name}: {:?}/{} {} ({why})",
            to.prefetch,
            to.line,
            if kept { "kept" } else { "dropped" }
        );
        if kept {
            set_policy(profile, name, *to, why);
        } else {
            next.insert(name.clone(), before.clone());
        }
    }
    Round {
        sections: next,
        ..round
    }
}

/// Notes how the profile was made and writes it to `--out` or standard output.
fn write_profile(t: &ProgramTune, profile: &mut Profile, times: &[f64]) -> Result<()> {
    profile.tuned = Some(format!(
        "tidepool tune --local {} -- {}; rounds took {} s",
        tidepool_node::format_size(t.local),
        t.program
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        times
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let text = profile.to_toml();
    match &t.out {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// Runs the program [`CHECKS`] times with `profile` and as many without, alternating (the
/// rounds' times are one run each, and runs vary by 15% and more): `Some(why)` if the profile's
/// median time is not below the default's.
fn check(t: &ProgramTune, me: &Program, profile: &Profile, dir: &Path) -> Result<Option<String>> {
    if profile.sections.is_empty() {
        return Ok(None);
    }
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..CHECKS {
        let n = 100 + 2 * i as u32;
        without.push(run_round(t, &mut Some(me.clone()), None, dir, n)?.seconds);
        with.push(run_round(t, &mut Some(me.clone()), Some(profile), dir, n + 1)?.seconds);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, d) = (median(&mut with), median(&mut without));
    eprintln!(
        "check: {CHECKS} runs each, alternating: median {w:.2} s with the profile, {d:.2} s without"
    );
    Ok((w >= d).then(|| {
        format!("the profile did not make the program faster (median {w:.2} s against {d:.2} s)")
    }))
}

/// A fresh directory only this user can read, for the rounds' files.
fn private_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let dir = base.join(format!("tidepool-tune-{}-{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).context("cannot make a work directory"),
        }
    }
    bail!("cannot make a work directory in {}", base.display())
}

/// `tidepool tune PROFILE.json --budget SIZE`: far data structures' sections from a profile.
pub fn tune_far(profile: &Path, budget: u64, out: Option<&Path>) -> Result<()> {
    let text = std::fs::read_to_string(profile)
        .with_context(|| format!("cannot read the profile {}", profile.display()))?;
    let p = tidepool_far::profile::Profile::from_json(&text).with_context(|| {
        format!(
            "{} is not a far-structure profile (JSON from Far::profile().to_json())",
            profile.display()
        )
    })?;
    if p.sites.is_empty() {
        bail!(
            "{} holds no sites: profile a run with Far::enable_profiling() before making \
             the vectors, and write the profile after they are dropped",
            profile.display()
        );
    }
    let t = tidepool_far::tune::tune(&p, budget);
    for n in &t.notes {
        eprintln!("{n}");
    }
    let toml = t.config.to_toml();
    match out {
        Some(path) => std::fs::write(path, toml)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{toml}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
