//! Workload `mixed`: one arbiter over paged programs and soft memory.
//!
//! Four programs share a memory cgroup standing for the machine (no swap):
//!
//! - `zipf`: a paged program under `tidepool run` whose pages are drawn from a Zipf
//!   distribution: more local memory keeps more of its hot set;
//! - `scan`: a paged program walking its pages in order, round and round: no budget short of
//!   the whole allocation keeps a page a pass comes back to;
//! - `dear` and `cheap`: soft-memory applications (`coord-app` jobs of `tidepool bench-worker`)
//!   whose objects cost 100 and 2 us of CPU to rebuild.
//!
//! The paged programs' far memory is a memory node outside the cgroup (another machine's
//! DRAM). Midway through a run a memory antagonist takes part of the cgroup, holds it, and
//! leaves. Each program runs as if alone on a CPU of 35% speed (`Pacer`: after each batch it
//! sleeps 1/0.35 - 1 times the CPU it used, less the time it waited for a CPU), so its work
//! and rebuilds take their time and a stall on a fault adds its own. Two earlier designs measured something else: with nothing,
//! a program stalled on faults lent its CPU to the one pinned beside it, which then ran at up
//! to 1.5 times its all-local speed; with a CFS quota of 45% of a CPU, a program could stall
//! 55% of the time and lose nothing (it used its quota in the rest), so a paged program's
//! memory looked worthless up to there. Systems:
//!
//! - `all-local`: each program with room for all its state, no cgroup, no coordinator: the
//!   normaliser;
//! - `midas`: `tidepool coord --policy midas`, every program joined;
//! - `equal`: `tidepool coord --policy static`: the pool split evenly (still following
//!   pressure);
//! - `static-best`: the best of a grid of fixed splits (`--policy static` with a weight of 1 or
//!   3 for each program: 15 splits, `equal` among them), found by a search that runs each once
//!   before the rounds; the winner is then run in every round like the others.
//!
//! The systems run in [`ROUNDS`] rounds, all-local first in each; a run is normalised by its
//! round's all-local run, and figures are medians over the rounds.
//!
//! Metrics: `normalized_throughput`, the sum over the programs of each one's operations per
//! second over its all-local figure (4 is everything local), measured from the end of the
//! warm-up to the end of the run, antagonist included; and `oom_kills` in the cgroup.

use crate::harness::{wanted, BenchOpts, Ctx, Matrix, Pass, Sample, System, Workload};
use crate::job::Walk;
use crate::node::NodeProcess;
use anyhow::{Context, Result};
use one_run::run_once;
use std::process::{Command, Stdio};

mod one_run;

/// Bytes an object takes in soft memory (4 KiB and its header).
const OBJECT: u64 = 4096 + 16;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Paged {
        walk: Walk,
        bytes: u64,
        skew: f64,
    },
    Soft {
        objects: u64,
        skew: f64,
        rebuild_us: f64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Program {
    name: &'static str,
    kind: Kind,
}

/// Sizes and times of a run.
#[derive(Debug, Clone)]
struct Scale {
    programs: [Program; 4],
    /// The cgroup's limit (the machine) and the coordinator's reserve.
    limit: u64,
    reserve: u64,
    /// The antagonist: bytes, when it starts taking them, how long it holds them.
    antagonist: u64,
    antagonist_at: f64,
    antagonist_hold: f64,
    /// Seconds of a run, and when its measured part starts.
    run_s: f64,
    from_s: f64,
    /// The speed of the CPU each program runs as if alone on (`Pacer`), all-local included.
    speed: f64,
    /// CPU per operation: paged programs, soft applications (microseconds).
    paged_work_us: f64,
    soft_work_us: f64,
    spin: f64,
}

fn scale(opts: &BenchOpts) -> Scale {
    let (mib, objects, run_s) = if opts.quick {
        (1u64 << 20, 49_152, 40.0)
    } else {
        (3u64 << 20, 147_456, 100.0)
    };
    Scale {
        programs: [
            Program {
                name: "zipf",
                kind: Kind::Paged {
                    walk: Walk::Zipf,
                    bytes: 192 * mib,
                    skew: 0.99,
                },
            },
            Program {
                name: "scan",
                kind: Kind::Paged {
                    walk: Walk::Scan,
                    bytes: 256 * mib,
                    skew: 0.0,
                },
            },
            Program {
                name: "dear",
                kind: Kind::Soft {
                    objects,
                    skew: 0.9,
                    rebuild_us: 100.0,
                },
            },
            Program {
                name: "cheap",
                kind: Kind::Soft {
                    objects,
                    skew: 0.9,
                    rebuild_us: 2.0,
                },
            },
        ],
        limit: 768 * mib,
        reserve: 96 * mib,
        antagonist: 160 * mib,
        antagonist_at: run_s * 0.55,
        antagonist_hold: run_s * 0.2,
        run_s,
        // After the soft applications' warm-up (the dear one's builds 49k objects at 100 us
        // each, on a CPU it shares: about 8 s in a quick run).
        from_s: run_s * 0.4,
        speed: 0.35,
        paged_work_us: 2.0,
        soft_work_us: 10.0,
        spin: 0.0,
    }
}

/// How memory is split in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    AllLocal,
    Midas,
    Equal,
    StaticBest,
}

impl System for Split {
    fn name(&self) -> &'static str {
        match self {
            Split::AllLocal => "all-local",
            Split::Midas => "midas",
            Split::Equal => "equal",
            Split::StaticBest => "static-best",
        }
    }
}

#[derive(Debug, Clone)]
struct Mixed {
    limit: u64,
}

impl Workload for Mixed {
    fn name(&self) -> &str {
        "mixed"
    }
    fn on(&self, system: &str) -> String {
        format!(
            "mixed on {system}: 2 paged programs, 2 soft applications, {} MiB",
            self.limit >> 20
        )
    }
    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![("limit_mib", (self.limit >> 20) as f64)]
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
struct Outcome {
    ops_per_s: [f64; 4],
    oom_kills: u64,
    /// Programs that did not finish (killed, or failed).
    failed: usize,
    /// Median budget over the measured part, bytes (coordinated runs).
    budgets: [f64; 4],
}

/// Rounds of the measurement. Each round runs every system once, all-local first, and each
/// run is normalised by its own round's all-local run: this host's speed drifted by up to a
/// third over minutes (all-local's figures rose or fell by a fifth from one run to the next,
/// in both directions), so a figure measured once, against a normaliser measured half an hour
/// before, said as much about the host as about the policy. Figures are medians over the rounds.
pub(super) const ROUNDS: usize = 3;

/// How a run is set up: everything local, or a coordinator's policy with weights.
#[derive(Debug, Clone, Copy)]
enum Setup {
    AllLocal,
    Coordinated {
        policy: &'static str,
        weights: [f64; 4],
    },
}

/// The grid `static-best` searches: a weight of 1 or 3 for each program (all 3s is all 1s).
fn grid() -> Vec<[f64; 4]> {
    (0..15u32)
        .map(|bits| std::array::from_fn(|i| if bits >> i & 1 == 1 { 3.0 } else { 1.0 }))
        .collect()
}

/// Runs the workload: the node, `static-best`'s search, then every system in each round.
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let mut sc = scale(&ctx.opts);
    sc.spin = super::app::Spinner::calibrate().iters_per_us;
    let node = NodeProcess::start("8G").context("cannot start the memory node")?;
    // The node stands for another machine's DRAM, whose CPUs the programs do not share: it
    // must not wait for a CPU behind them. At equal priority a far fault took 2-5 ms here (the
    // node's turn on a CPU); at nice -10 its round trip's mean was still 324 us against a
    // median of 21 (its tail waiting for a CPU), where a node of its own answers in tens of
    // microseconds. Real-time priority lets it run as soon as a request arrives.
    let priority = prioritise(node.pid()).unwrap_or_else(|e| format!("normal priority ({e})"));
    ctx.report
        .notes
        .push(format!("coord mixed: the memory node runs at {priority}"));
    ctx.report.notes.push(setup_note(&sc));
    let systems = [
        Split::AllLocal,
        Split::Midas,
        Split::Equal,
        Split::StaticBest,
    ];
    let workloads = [Mixed { limit: sc.limit }];
    // TIDEPOOL_BENCH_SYSTEMS=midas,equal runs only some (all-local always: it normalises).
    let best = if wanted(Split::StaticBest.name()) {
        Some(search(ctx, &sc, &node)?)
    } else {
        None
    };
    ctx.advance();
    // This round's all-local outcome, and every round's (for the note).
    let mut local = Outcome::default();
    let mut locals = Vec::new();
    // Each system's normalized figure, round by round (for the note).
    let mut by_round: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let matrix = Matrix::new(&systems, &workloads, ROUNDS)
        .only(|_, s: &Split| *s == Split::AllLocal || wanted(s.name()));
    let samples = matrix.run(ctx, |ctx, pass, _, &split| {
        let round = match pass {
            Pass::Round(r) => r + 1,
            Pass::WarmUp => 0,
        };
        let tag = format!("{}-{round}", split.name());
        let outcome = run_once(ctx, &sc, &node, setup_of(split, best), &tag)?;
        if split == Split::AllLocal {
            local = outcome.clone();
            locals.push(outcome.clone());
        }
        let n = normalized(&outcome, &local);
        match by_round.iter_mut().find(|(s, _)| *s == split.name()) {
            Some((_, v)) => v.push(n),
            None => by_round.push((split.name(), vec![n])),
        }
        Ok(sample_of(&sc, split, &outcome, &local, n))
    })?;
    round_notes(ctx, &sc, &locals, &by_round);
    samples.report(ctx);
    Ok(())
}

/// The note saying how the workload is set up: the cgroup, the programs, the antagonist, the
/// runs and the search.
fn setup_note(sc: &Scale) -> String {
    format!(
        "coord mixed: in a {} MiB memory cgroup (reserve {} MiB): {}; far memory on a memory \
         node outside the cgroup; an antagonist takes {} MiB at {:.0} s for {:.0} s; runs of \
         {:.0} s measured from {:.0} s. static-best: the best of {} fixed splits (weights 1 or \
         3 each, --policy static) in a search of one run each, then run in each of {ROUNDS} \
         rounds like the others; each round's all-local run normalises that round.",
        sc.limit >> 20,
        sc.reserve >> 20,
        sc.programs
            .iter()
            .map(|p| match p.kind {
                Kind::Paged { walk, bytes, .. } => format!(
                    "{} (paged, {} walk, {} MiB)",
                    p.name,
                    walk.name(),
                    bytes >> 20
                ),
                Kind::Soft {
                    objects,
                    rebuild_us,
                    ..
                } => format!(
                    "{} (soft, {} MiB, rebuild {rebuild_us} us)",
                    p.name,
                    (objects * OBJECT) >> 20
                ),
            })
            .collect::<Vec<_>>()
            .join(", "),
        sc.antagonist >> 20,
        sc.antagonist_at,
        sc.antagonist_hold,
        sc.run_s,
        sc.from_s,
        grid().len()
    )
}

/// How a system's run is set up (`best`: the weights `static-best`'s search chose).
fn setup_of(split: Split, best: Option<[f64; 4]>) -> Setup {
    match split {
        Split::AllLocal => Setup::AllLocal,
        Split::Midas => Setup::Coordinated {
            policy: "midas",
            weights: [1.0; 4],
        },
        Split::Equal => Setup::Coordinated {
            policy: "static",
            weights: [1.0; 4],
        },
        Split::StaticBest => Setup::Coordinated {
            policy: "static",
            weights: best.expect("static-best runs only after its search"),
        },
    }
}

/// A run's figures: normalised throughput `n`, OOM kills, failures, and each program's
/// throughput (also normalised by this round's all-local run, `local`) and budget.
fn sample_of(sc: &Scale, split: Split, outcome: &Outcome, local: &Outcome, n: f64) -> Sample {
    let mut sample = Sample::new()
        .median("normalized_throughput", "x", n)
        .median("oom_kills", "", outcome.oom_kills as f64)
        .median("programs that failed", "", outcome.failed as f64);
    for (i, p) in sc.programs.iter().enumerate() {
        sample = sample
            .median(format!("{} ops/s", p.name), "ops/s", outcome.ops_per_s[i])
            .median(
                format!("{} normalized", p.name),
                "x",
                ratio(outcome.ops_per_s[i], local.ops_per_s[i]),
            );
        if split != Split::AllLocal {
            sample = sample.median(
                format!("{} budget MiB", p.name),
                "MiB",
                outcome.budgets[i] / (1 << 20) as f64,
            );
        }
    }
    sample
}

/// The notes on the rounds: all-local's throughput in each, and each system's normalised
/// figure in each.
fn round_notes(
    ctx: &mut Ctx,
    sc: &Scale,
    locals: &[Outcome],
    by_round: &[(&'static str, Vec<f64>)],
) {
    ctx.note(format!(
        "coord mixed all-local: ops/s in each of the {ROUNDS} rounds (each round's normalises \
         that round's other runs): {}",
        sc.programs
            .iter()
            .enumerate()
            .map(|(i, p)| format!(
                "{} {}",
                p.name,
                locals
                    .iter()
                    .map(|o| format!("{:.0}", o.ops_per_s[i]))
                    .collect::<Vec<_>>()
                    .join("/")
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    ctx.note(format!(
        "coord mixed normalized_throughput round by round: {}",
        by_round
            .iter()
            .filter(|(s, _)| *s != Split::AllLocal.name())
            .map(|(s, v)| format!(
                "{s} {}",
                v.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join("/")
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
}

/// `static-best`'s grid search: an all-local run, then every split of the grid, each
/// normalised by it. Returns the weights of the best. (The winner's figure is not reported:
/// the best of fifteen noisy runs is the luckiest as much as the best split, so the rounds
/// run it again, as they run every system.)
fn search(ctx: &mut Ctx, sc: &Scale, node: &NodeProcess) -> Result<[f64; 4]> {
    ctx.step("mixed static-best: all-local, to normalise the search");
    let local = run_once(ctx, sc, node, Setup::AllLocal, "all-local-search")?;
    let mut best: Option<(f64, [f64; 4])> = None;
    let mut tried = Vec::new();
    for w in grid() {
        let name = weights_name(&w);
        ctx.step(format!("mixed static-best search: weights {name}"));
        let setup = Setup::Coordinated {
            policy: "static",
            weights: w,
        };
        let o = run_once(ctx, sc, node, setup, &format!("static-{name}"))?;
        let n = normalized(&o, &local);
        tried.push(format!("{name} {n:.2}"));
        if best.is_none_or(|b| n > b.0) {
            best = Some((n, w));
        }
    }
    let (_, w) = best.expect("the grid is not empty");
    ctx.note(format!(
        "coord mixed static-best: weights {} (zipf:scan:dear:cheap) won the search; every split \
         tried (one run each): {}",
        weights_name(&w),
        tried.join(", ")
    ));
    Ok(w)
}

fn weights_name(w: &[f64; 4]) -> String {
    w.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn ratio(x: f64, base: f64) -> f64 {
    if base > 0.0 {
        x / base
    } else {
        0.0
    }
}

fn normalized(o: &Outcome, local: &Outcome) -> f64 {
    (0..4)
        .map(|i| ratio(o.ops_per_s[i], local.ops_per_s[i]))
        .sum()
}

/// Puts every thread of process `pid` (and the threads they start) under SCHED_FIFO at
/// priority 10, with `chrt` (root); else raises them to nice -10. The node serves each request
/// in microseconds and blocks between them, so it cannot starve the programs.
fn prioritise(pid: u32) -> Result<String> {
    let fifo = Command::new("chrt")
        .args(["--fifo", "--all-tasks", "--pid", "10", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if matches!(fifo, Ok(s) if s.success()) {
        return Ok("SCHED_FIFO priority 10".into());
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("cannot list the threads of process {pid}"))?;
    let mut reniced = 0;
    for t in tasks.flatten() {
        let tid = t.file_name().to_string_lossy().parse::<i32>().ok();
        if let Some(tid) = tid.and_then(rustix::process::Pid::from_raw) {
            if rustix::process::setpriority_process(Some(tid), -10).is_ok() {
                reniced += 1;
            }
        }
    }
    anyhow::ensure!(
        reniced > 0,
        "neither chrt --fifo nor nice -10 could be applied (not root?)"
    );
    Ok("nice -10 (chrt --fifo failed)".into())
}
