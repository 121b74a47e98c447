//! `tidepool tune`: profile-guided configuration, Mira's iterative loop.
//!
//! For an unmodified program (`tidepool tune --local SIZE -- PROGRAM ARGS`), each round runs
//! the program under `tidepool run` with the profile so far, reads what every section did
//! (each process writes its sections at exit, `TIDEPOOL_RUN_SECTIONS_OUT`).
//!
//! After the first round comes the offline search (`tune/search.rs`): one round with
//! prefetching off in every section records the program's demand faults
//! (`TIDEPOOL_RUN_FAULT_TRACE`), tune prints each busy section's access classes (sequential,
//! strided, random; pages touched and faults again), replays every prefetcher with lines of 1,
//! 2 and 4 pages for each busy section against the trace, and gives each the policy with the
//! lowest replayed cost among those whose fetched pages were at least 70% used (or none), if
//! it beats the policy the section has. One round then runs with those choices, kept unless
//! the program's cost rose by more than 3% or the round was 25% slower. Over the same trace,
//! tune gives the *oracle's bound*: the fewest pages any policy could read at the budget
//! (Belady's choice with foresight of the faults), against the pages round 0 read. Under the
//! in-process store a run's time follows the pages it reads, so a bound near 1x says that no
//! profile can make the program much faster at this size, only more local memory can. A bound
//! well above 1x does not say a profile can get there: foresight is worth 2x on reads at
//! uniform random, where every policy without it misses alike.
//!
//! Then each round proposes a change for each section that matters (at least 1% of the far
//! reads or of the prefetches), the first rung of its ladder not tried yet (offline or in a
//! round):
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
//! each, alternating, and a profile whose median time is not 3% below the default's is left
//! empty. With `--check-arg` or `--check-local` the same check runs again on that larger
//! input or budget, and the profile must pass it too: a profile 3% faster at the tuning's size
//! can be slower at ten times it (SQLite's, 0.92x), and a check at a middling size is the
//! nearest tune gets to the run the profile is for. The program's output must be the same in
//! every round, and with the profile as without it in each check (a profile never changes an
//! answer; a program whose output varies needs `--ignore-output`). Tuning on its own output
//! (`--from`) goes on from there, as Mira's iterations do.
//!
//! For far data structures (`tidepool tune PROFILE.json --budget SIZE`), see `tidepool_far::tune`.

mod check;
mod ladder;
mod search;

use crate::run::find_program;
use anyhow::{bail, Context, Result};
use check::check;
pub use check::Larger;
use ladder::{fetches_earn_their_place, next_changes, Change};
use search::TRACE_FAULTS;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use tidepool_pager::profile::{
    KeepName, ObservedSection, PrefetchName, Profile, Program, SectionEntry,
};
use tidepool_pager::replay::Candidate;

/// `tidepool tune` for an unmodified program.
#[derive(Debug, Clone)]
pub struct ProgramTune {
    pub local: u64,
    pub backend: String,
    pub out: Option<PathBuf>,
    pub rounds: u32,
    pub from: Option<PathBuf>,
    pub ignore_output: bool,
    /// The second, larger check a profile must pass too (`--check-arg`, `--check-local`).
    pub larger: Option<Larger>,
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

    /// Every page read from the store: far reads, prefetched pages and line pages (on the
    /// in-process store a round's time follows this more than its far reads).
    fn pages_read(&self) -> u64 {
        self.sections
            .values()
            .map(|s| s.far_reads + s.prefetched + s.line_pages)
            .sum()
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

/// One run of the program in a tuning: what messages call it, and its work files' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunName {
    /// Round 0 (the default policies, or `--from`'s) and the ladder's rounds.
    Round(u32),
    /// The trace round of the offline search.
    Trace,
    /// The round with what the offline search chose.
    Searched,
    /// The final check's `i`th run, with the profile or without it.
    Check(usize, bool),
    /// The same on the larger check's input (`--check-arg`, `--check-local`).
    Larger(usize, bool),
}

impl RunName {
    /// The stem of its work files in the tuning's directory.
    fn stem(self) -> String {
        match self {
            RunName::Round(n) => format!("round-{n}"),
            RunName::Trace => "trace-round".into(),
            RunName::Searched => "searched-round".into(),
            RunName::Check(i, true) => format!("check-{i}-profile"),
            RunName::Check(i, false) => format!("check-{i}-default"),
            RunName::Larger(i, true) => format!("larger-check-{i}-profile"),
            RunName::Larger(i, false) => format!("larger-check-{i}-default"),
        }
    }
}

impl std::fmt::Display for RunName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RunName::Round(n) => write!(f, "round {n}"),
            RunName::Trace => write!(f, "the trace round"),
            RunName::Searched => write!(f, "the search's round"),
            RunName::Check(i, with) => write!(
                f,
                "check run {i} {} the profile",
                if with { "with" } else { "without" }
            ),
            RunName::Larger(i, with) => write!(
                f,
                "larger check run {i} {} the profile",
                if with { "with" } else { "without" }
            ),
        }
    }
}

/// Runs the program once under `tidepool run` with `profile` (none: the default policies),
/// and reads what the sections of the program `me` did (`None`: of the busiest program among
/// the processes, which becomes `me`); each process records up to `trace` demand faults beside
/// its sections.
fn run_round(
    t: &ProgramTune,
    me: &mut Option<Program>,
    profile: Option<&Profile>,
    dir: &Path,
    n: RunName,
    trace: usize,
) -> Result<Round> {
    let out = dir.join(n.stem());
    std::fs::create_dir(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let log = dir.join(format!("{}.stderr", n.stem()));
    let mut cmd = round_command(t, profile, dir, n)?;
    if trace > 0 {
        cmd.env(tidepool_pager::run_env::FAULT_TRACE, trace.to_string());
    }
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
            "the program failed under tidepool run in {n} ({}); the end of what it said:\n{}",
            result.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let records = tidepool_pager::profile::Observed::read_dir(&out)?;
    if me.is_none() {
        *me = busiest_program(&records);
    }
    let sections = sections_of(records, me.as_ref());
    // A wrapper that forks the program (a shell script without `exec`) says at exit that the
    // profile is not for it; that matters only if the program itself did not run.
    let not_applied = profile.is_some()
        && stderr.contains("profile")
        && (stderr.contains("ignored") || stderr.contains("changed nothing"));
    if not_applied && sections.is_empty() {
        bail!("tidepool run did not apply the profile in {n}:\n{stderr}");
    }
    if sections.is_empty() {
        bail!(
            "no process reported its sections in {n}: did the program run under \
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
/// into `dir` for run `n`) if there is one.
fn round_command(
    t: &ProgramTune,
    profile: Option<&Profile>,
    dir: &Path,
    n: RunName,
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
        let profile_file = dir.join(format!("profile-{}.toml", n.stem()));
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
        "{:.2} s, {} far reads, {} pages read in all, prefetches {} used",
        r.seconds,
        r.far_reads(),
        r.pages_read(),
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
    let mut last = run_round(t, &mut me, from.as_ref(), &dir, RunName::Round(0), 0)?;
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
    let ctx = Tuning {
        t,
        me: &me,
        dir: &dir,
        output: &output,
    };
    // What the profile's `tuned` line says besides the command and the rounds' times.
    let mut notes: Vec<String> = Vec::new();
    last = ctx.offline(&mut profile, last, &mut ever_tried, &mut times, &mut notes)?;
    best_seconds = times.iter().copied().fold(best_seconds, f64::min);
    // `last` holds each section's counters under the policy it keeps: a change that was
    // dropped leaves the section's counters from before it.
    for n in 1..t.rounds {
        let (tried, keeping) = next_changes(&profile, &last, &ever_tried, t.local);
        ever_tried.extend(tried.iter().cloned());
        if tried.is_empty() {
            eprintln!("nothing left to try");
            break;
        }
        let mut trial = profile.clone();
        for (name, to) in &tried {
            set_policy(&mut trial, name, *to, String::new());
        }
        let name = RunName::Round(n);
        let round = run_round(t, &mut Some(me.clone()), Some(&trial), &dir, name, 0)?;
        times.push(round.seconds);
        ctx.same_output(&round, name)?;
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
    check(t, &me, &mut profile, &dir, &mut notes)?;
    write_profile(t, &mut profile, &times, &notes)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// What every round of one tuning shares.
struct Tuning<'a> {
    t: &'a ProgramTune,
    me: &'a Program,
    dir: &'a Path,
    /// What the program printed in round 0.
    output: &'a [u8],
}

impl Tuning<'_> {
    /// Fails if round `n` printed something else than round 0.
    fn same_output(&self, round: &Round, n: RunName) -> Result<()> {
        if !self.t.ignore_output && round.output != self.output {
            bail!(
                "the program printed something else in {n} than in round 0: tune needs a \
                 program whose output is the same every run (or --ignore-output)"
            );
        }
        Ok(())
    }

    /// The offline search (`tune/search.rs`): a round with prefetching off and lines of one
    /// page in every section `last` saw, recording its faults; every policy replayed against
    /// them; then one round with what the search chose, kept if the program's cost did not
    /// rise by more than noise (3%) and the round was not more than 25% slower. Returns the
    /// counters the next round starts from; adds the oracle's bound to `notes`.
    fn offline(
        &self,
        profile: &mut Profile,
        last: Round,
        ever_tried: &mut Vec<Change>,
        times: &mut Vec<f64>,
        notes: &mut Vec<String>,
    ) -> Result<Round> {
        let mut traced = profile.clone();
        for name in last.sections.keys() {
            let now = policy_of(profile, name);
            let off = Setting {
                prefetch: PrefetchName::Off,
                line: 1,
                ..now
            };
            set_policy(&mut traced, name, off, String::new());
        }
        let me = &mut Some(self.me.clone());
        let round = run_round(
            self.t,
            me,
            Some(&traced),
            self.dir,
            RunName::Trace,
            TRACE_FAULTS,
        )?;
        self.same_output(&round, RunName::Trace)?;
        eprintln!(
            "trace round (prefetching off, faults recorded): {}",
            summary(&round)
        );
        let trace = search::read_trace(&self.dir.join(RunName::Trace.stem()), self.me)?;
        let budget_pages = (self.t.local / tidepool_pager::PAGE as u64) as usize;
        let bound = search::oracle_bound(&trace, budget_pages, last.pages_read());
        eprintln!("  {}", bound.long);
        notes.push(bound.short);
        let before = |name: &str| {
            let s = policy_of(profile, name);
            Candidate {
                prefetch: s.prefetch.into(),
                line: s.line,
            }
        };
        let found = search::search(&trace, budget_pages, WASTE, &before);
        eprint!("{}", found.report);
        for (name, c) in &found.tried {
            let now = policy_of(profile, name);
            let to = Setting {
                prefetch: search::prefetch_name(c.prefetch),
                line: c.line,
                ..now
            };
            ever_tried.push((name.clone(), to));
        }
        if found.choices.is_empty() {
            eprintln!("offline search: no busy section is better served than by its policy now");
            return Ok(last);
        }
        let mut trial = profile.clone();
        for c in &found.choices {
            let now = policy_of(profile, &c.name);
            let to = Setting {
                prefetch: search::prefetch_name(c.to.prefetch),
                line: c.to.line,
                ..now
            };
            eprintln!("  {}: {:?}/{} ({})", c.name, to.prefetch, to.line, c.why());
            set_policy(&mut trial, &c.name, to, c.why());
        }
        let round = run_round(self.t, me, Some(&trial), self.dir, RunName::Searched, 0)?;
        times.push(round.seconds);
        self.same_output(&round, RunName::Searched)?;
        let (was, now) = (total_cost(&last), total_cost(&round));
        let slower = round.seconds > last.seconds * SLOWER;
        let kept = !slower && now <= was * 1.03;
        eprintln!(
            "the search's profile: {} (cost {was:.0} -> {now:.0}): {}",
            summary(&round),
            if kept { "kept" } else { "dropped" }
        );
        if kept {
            *profile = trial;
            Ok(round)
        } else {
            Ok(last)
        }
    }
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
fn write_profile(
    t: &ProgramTune,
    profile: &mut Profile,
    times: &[f64],
    notes: &[String],
) -> Result<()> {
    profile.tuned = Some(format!(
        "tidepool tune --local {} -- {}; rounds took {} s{}",
        tidepool_node::format_size(t.local),
        command_line(&t.program),
        times
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        notes.iter().map(|n| format!("; {n}")).collect::<String>()
    ));
    let text = profile.to_toml();
    match &t.out {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// A program and its arguments as one line, for messages and the profile's `tuned` line.
fn command_line(program: &[OsString]) -> String {
    program
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
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
