//! The public allocator benchmarks of mimalloc-bench (github.com/daanx/mimalloc-bench), run
//! under every allocator of the suite, by their own names and with the arguments its
//! `bench.sh` gives them (`$procs` being this machine's CPU count).
//!
//! Nothing of mimalloc-bench is part of Tidepool: not its code, not a binary built from it, not
//! a recipe to build it. The user builds a checkout with its own `./build-bench-env.sh bench`
//! and passes it with `--mimalloc-bench DIR`: binaries in `DIR/out/bench/`, inputs in
//! `DIR/bench/`. Without it, or for programs missing from it, these workloads are skipped with a
//! note saying how to get them.
//!
//! Each program reports its wall time as `seconds`, or its own figure where it prints one
//! (larson's throughput, xmalloc-test's relative time, rptest's memory operations per CPU
//! second, glibc-thread's iterations in its fixed run), and its peak RSS from the kernel. The
//! output of the deterministic ones, timing lines removed, must be glibc's (`same_output`).
//! Programs running several threads get every CPU, as in mimalloc-bench (see [`cpus_for`]).
//!
//! `programs.rs` says how each program runs and what it reports, `output.rs` compares outputs
//! with glibc's; this module runs them (through `external.rs`) and draws the verdict.

mod output;
mod programs;

use super::allocators::{Allocator, PEER_NAMES};
use super::external::{self, Finished};
use crate::harness::{
    geomean, matrix_steps, BenchOpts, Ctx, Matrix, Placement, Sample, Turns, Workload,
};
use crate::job::Launch;
use anyhow::{Context, Result};
use output::{comparable, compare_outputs, Output};
use programs::{available, Check, Figure, Program};
use std::time::Duration;

/// A program that outlives this is hung, not slow.
const TIMEOUT: Duration = Duration::from_secs(300);

/// One program at this run's arguments.
#[derive(Debug, Clone)]
struct PublicWorkload {
    program: &'static Program,
    args: Vec<String>,
    threads: usize,
}

impl Workload for PublicWorkload {
    fn name(&self) -> &str {
        self.program.name
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        if self.program.threaded {
            vec![("threads", self.threads as f64)]
        } else {
            Vec::new()
        }
    }
}

/// Rounds over the programs: a quick run keeps every program but runs each once per
/// allocator (most take seconds whatever their arguments).
fn rounds(opts: &BenchOpts) -> usize {
    if opts.quick {
        1
    } else {
        opts.rounds()
    }
}

/// Progress steps [`run`] takes.
pub(super) fn steps(opts: &BenchOpts) -> u64 {
    let (found, _) = available(opts.mimalloc_bench.as_deref());
    matrix_steps(found.len(), rounds(opts))
}

/// Where a program runs: single-threaded ones where the suite's own workloads run; those
/// running `{procs}` threads on every CPU (as mimalloc-bench runs them; cache-thrash and
/// cache-scratch measure what threads on different CPUs do to each other), except under
/// `--placement shared` (CPU 0) and `free` (unpinned).
fn cpus_for(placement: Placement, threaded: bool) -> Option<Vec<usize>> {
    if !threaded {
        return placement.for_workload(true).client_cpus();
    }
    match placement {
        Placement::Shared => Some(vec![0]),
        Placement::Free => None,
        Placement::Auto | Placement::Split => Some((0..tidepool_sys::online_cpus()).collect()),
    }
}

/// Runs every available program under every allocator and adds the rows and notes; then the
/// verdict over them.
pub(super) fn run(ctx: &mut Ctx, systems: &[Allocator]) -> Result<()> {
    let dir = ctx.opts.mimalloc_bench.clone();
    let (found, notes) = available(dir.as_deref());
    for n in notes {
        ctx.note(n);
    }
    let Some(dir) = dir.filter(|_| !found.is_empty()) else {
        return Ok(());
    };
    // Absolute: the programs run in DIR/out/bench and are named by path.
    let dir = std::fs::canonicalize(&dir)
        .with_context(|| format!("cannot resolve --mimalloc-bench {}", dir.display()))?;
    let (bin, bench) = (dir.join("out/bench"), dir.join("bench"));
    let workloads = public_workloads(&found, ctx.opts.quick, &bench.to_string_lossy());
    let mut seen = Seen::default();
    let placement = ctx.opts.placement;
    let samples = Matrix::new(systems, &workloads, rounds(&ctx.opts))
        .turns(Turns::Rotate)
        .note_failures()
        .run(ctx, |_, _, w, a| {
            let p = w.program;
            let run = external::run(&Launch {
                program: bin.join(p.name),
                args: w.args.clone(),
                cwd: bin.clone(),
                stdin: p.stdin.map(|input| bench.join(input)),
                preload: a.lib.clone(),
                cpus: cpus_for(placement, p.threaded),
                timeout_s: TIMEOUT.as_secs(),
            })?;
            seen.sample(p, a.name, &run)
        })?;
    let mut rows = samples.rows();
    let checked: Vec<output::Checked> = workloads
        .iter()
        .filter(|w| w.program.check != Check::Nothing)
        .map(|w| (w.program.name, w.params_for("same_output")))
        .collect();
    let (same, notes) = compare_outputs(&checked, &seen.outputs, &ctx.opts.out);
    rows.extend(same);
    for n in notes {
        ctx.note(n);
    }
    if let Some(note) = seen.unchecked_note() {
        ctx.note(note);
    }
    let position = |s: &str| systems.iter().position(|a| a.name == s);
    rows.sort_by_key(|r| {
        (
            workloads.iter().position(|w| w.name() == r.workload),
            r.metric.clone(),
            position(&r.system),
        )
    });
    ctx.report.results.extend(rows);
    verdict(ctx, &found);
    Ok(())
}

/// The programs found, each at its arguments (the quick ones with `quick`), `{procs}` being
/// this machine's CPU count and `{bench}` the inputs' directory.
fn public_workloads(found: &[&'static Program], quick: bool, bench: &str) -> Vec<PublicWorkload> {
    let procs = tidepool_sys::online_cpus();
    found
        .iter()
        .map(|&program| {
            let args = match (quick, program.quick_args) {
                (true, Some(quick)) => quick,
                _ => program.args,
            };
            PublicWorkload {
                program,
                args: args
                    .split_whitespace()
                    .map(|a| {
                        a.replace("{procs}", &procs.to_string())
                            .replace("{bench}", bench)
                    })
                    .collect(),
                threads: procs,
            }
        })
        .collect()
}

/// What the runs showed besides their figures: the outputs to compare with glibc's, and the
/// runs whose preload could not be verified.
#[derive(Default)]
struct Seen {
    outputs: Vec<Output>,
    unchecked: Vec<String>,
}

impl Seen {
    /// The sample of one run of `p` under allocator `system`: its figure and its peak RSS;
    /// its output is kept for comparing.
    fn sample(&mut self, p: &Program, system: &'static str, run: &Finished) -> Result<Sample> {
        if !run.preload_checked {
            self.unchecked.push(format!("{} on {}", p.name, system));
        }
        let (metric, unit) = p.figure.metric();
        let value = match p.figure {
            Figure::WallTime => run.seconds,
            f => f
                .read(&run.stdout)
                .with_context(|| format!("no {metric} in its output: {}", run.stdout.trim()))?,
        };
        if p.check != Check::Nothing {
            self.outputs.push(Output {
                program: p.name,
                system,
                text: comparable(p.check, &run.stdout, &run.stderr),
            });
        }
        Ok(Sample::new().median(metric, unit, value).median(
            "peak_rss_mib",
            "MiB",
            run.peak_rss_kib as f64 / 1024.0,
        ))
    }

    /// The note naming the runs whose preload was not verified, if there were any.
    fn unchecked_note(&mut self) -> Option<String> {
        if self.unchecked.is_empty() {
            return None;
        }
        self.unchecked.sort();
        self.unchecked.dedup();
        Some(format!(
            "preload not verified (the program exited before its libraries were seen mapped): {}",
            self.unchecked.join(", ")
        ))
    }
}

/// The figures over the public programs, as notes: tidepool's speed against each peer
/// (geometric mean of peer time over tidepool's, rates inverted), larson against mimalloc, and
/// tidepool's peak RSS against the lowest peer's.
fn verdict(ctx: &mut Ctx, programs: &[&Program]) {
    let value = |ctx: &Ctx, system: &str, p: &Program, metric: &str| {
        ctx.report.value(system, p.name, metric)
    };
    let mut notes = Vec::new();
    for peer in PEER_NAMES {
        let speed: Vec<(&str, f64)> = programs
            .iter()
            .filter_map(|p| {
                let metric = p.figure.metric().0;
                let t = value(ctx, "tidepool", p, metric)?;
                let q = value(ctx, peer, p, metric)?;
                let faster = if p.figure.higher_is_better() {
                    t / q
                } else {
                    q / t
                };
                Some((p.name, faster))
            })
            .collect();
        let Some(&(worst, low)) = speed.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
            continue;
        };
        let ratios: Vec<f64> = speed.iter().map(|s| s.1).collect();
        notes.push(format!(
            "mimalloc-bench geomean speed of tidepool over {peer}: {:.3}x over {} programs \
             (>1: tidepool faster; least {worst} {low:.3}x)",
            geomean(&ratios),
            ratios.len()
        ));
    }
    if let Some(larson) = programs.iter().find(|p| p.name == "larson") {
        if let (Some(t), Some(m)) = (
            value(ctx, "tidepool", larson, "ops_per_s"),
            value(ctx, "mimalloc", larson, "ops_per_s"),
        ) {
            notes.push(format!(
                "larson: tidepool {:.2}M ops/s = {:.3}x mimalloc's {:.2}M",
                t / 1e6,
                t / m,
                m / 1e6
            ));
        }
    }
    let rss: Vec<f64> = programs
        .iter()
        .filter_map(|p| {
            let t = value(ctx, "tidepool", p, "peak_rss_mib")?;
            let low = PEER_NAMES
                .iter()
                .filter_map(|peer| value(ctx, peer, p, "peak_rss_mib"))
                .reduce(f64::min)?;
            Some(t / low)
        })
        .collect();
    if !rss.is_empty() {
        notes.push(format!(
            "mimalloc-bench: tidepool's peak RSS is {:.3}x the lowest peer's (geomean over {} \
             programs)",
            geomean(&rss),
            rss.len()
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}
