//! The `apps` suite: unmodified programs no one here wrote, with less local memory than they
//! use, under `tidepool run` and under Linux swap to zram.
//!
//! Workloads (each checks its answer; a wrong one fails the suite):
//! - `redis-get`, `redis-set`: redis-server holding N values of 4 KiB (random bytes: zram would
//!   flatter itself on patterns), driven by redis-benchmark on random keys, pipeline 16
//!   (`ops_per_s`); then `redis-bgsave`: BGSAVE while redis-benchmark keeps setting keys
//!   (`seconds`). The keys are read back from the server and from the RDB file (loaded into a
//!   second, native redis-server): every key there, every value sampled either the one written
//!   or redis-benchmark's.
//! - `pandas-groupby`: a DataFrame of random rows, grouped with sum and mean (`seconds`); the
//!   result's sha256 must be native's.
//! - `sort`: GNU sort of a generated text file larger than local memory (`seconds`); the
//!   output's sha256 must be native's.
//! - `python-dict`: CPython building and summing a dict of strings (`seconds`); the sum must be
//!   native's.
//! - `go-map`, `jvm-hashmap`, `node-map`: garbage-collected runtimes (`runtimes.rs`): a Go map
//!   of strings (default build, statically linked), a Java 17 HashMap with long arrays
//!   (`-Xmx2g -XX:+UseParallelGC`), a Node.js Map with Buffers (`seconds`, the whole run); each
//!   answer (count and checksum) must be native's. Skipped, with a note, where the toolchain
//!   is missing.
//!
//! Systems ([`System`]): `tidepool-default` (`tidepool run` as a user types it: pages
//! compressed in process), `tidepool-tuned` (the same with `--profile`, a profile `tidepool
//! tune` made on a tenth of the workload's input: `tuned.rs`), `tidepool-local` (pages kept whole in process: the pager alone),
//! `tidepool-node` (a `tidepool node` on the other CPU), `linux-zram` (a cgroup v1 memory group
//! limited to the same local size, swapping to zram) and `native`. Every figure has a
//! `machine_mib` row beside it, the bytes the system held on this machine for the program at
//! their peak, under `tidepool-node` a `far_mib` row, what the node held, and under each
//! `tidepool-*` system an `unpaged_mib` row, the program's memory outside the pager's regions
//! (code, stacks, the pager's own tables, an in-process store) ([`crate::meter`]). A node's
//! `machine_mib` should be its budget (with a forked child's, under BGSAVE) plus that, within
//! 10%: the verdict says where it is not. Beside every program's time but Redis's (whose load
//! generator's own wake-ups would drown them), an `interrupts` row counts the cross-CPU
//! interrupts (function calls and rescheduling, /proc/interrupts) this machine took during the
//! run, and `tlb_shootdowns` the TLB shootdowns among them: what paging cost the other CPU.
//! Under `tidepool-default` and `tidepool-tuned`, `far_reads` counts the pager's misses and
//! `prefetch_accuracy` the share of prefetched pages the program used (percent), from the
//! sections every process writes at exit (for Redis, the server's whole run); a note puts the
//! tuned run beside the default one. Local memory is `local_ratio` (0.25
//! and 0.5) of each program's peak RSS, measured natively first. linux-zram, when the kernel
//! OOM-killed it, runs once more (with a note saying so); killed twice, it gets a row with
//! metric `oom_killed` = 1.

mod launch;
mod paired;
mod programs;
mod redis;
mod resp;
pub mod runtimes;
mod tuned;
mod workload;

use crate::harness::{BenchOpts, Ctx, Suite};
use crate::meter::Held;
use crate::node::NodeProcess;
use crate::zram::Zram;
use anyhow::{bail, Result};
pub use launch::{run_to_end, Ended, Launcher, SectionTotals, System};
pub use programs::{
    pandas, python, python_dict, sort, sort_input, Outcome, Ran, Sizes, PANDAS_SCRIPT,
};
pub use redis::{redis, redis_value, verify_rdb, RedisResult, RedisRun};
use std::ffi::OsString;
use workload::{Inputs, Runs};

#[derive(Debug)]
pub struct AppsSuite;

const RATIOS: [f64; 2] = [0.25, 0.5];
const WORKLOADS: [&str; 7] = [
    "redis",
    "pandas-groupby",
    "sort",
    "python-dict",
    "go-map",
    "jvm-hashmap",
    "node-map",
];

impl Suite for AppsSuite {
    fn name(&self) -> &'static str {
        "apps"
    }

    fn about(&self) -> &'static str {
        "unmodified programs with a quarter and a half of the memory they use: redis-server \
         (GET, SET, BGSAVE), pandas, GNU sort, CPython, Go, a JVM, Node.js; tidepool run (default compressed, \
         plain in-process and node stores) vs Linux swap to zram vs native, in time and in \
         bytes held on this machine"
    }

    fn steps(&self, _opts: &BenchOpts) -> u64 {
        (WORKLOADS.len() * (1 + RATIOS.len() * System::CONSTRAINED.len())) as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let s = Sizes::of(&ctx.opts);
        let exe = std::env::current_exe()?;
        let preload = crate::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so")?;
        let (polling, sleeping) = start_nodes(ctx)?;
        let node_url = |n: &NodeProcess| format!("node://apps@{}", n.addr);
        let mut l = Launcher::new(exe, preload, Some(node_url(&polling)));
        l.load_cpus = ctx.opts.placement.server_cpus();
        let systems = constrained_systems(ctx, &mut l);
        let dir = ctx.opts.out.join("apps-work");
        std::fs::create_dir_all(&dir)?;
        l.sections_dir = Some(dir.join("sections"));
        let (python, has_pandas) = python()?;
        let sort_file = sort_input(&dir, s.sort_lines)?;
        let inputs = Inputs {
            s: &s,
            dir: &dir,
            python: &python,
            sort_file: &sort_file,
        };
        for workload in WORKLOADS {
            let Some(runtime_argv) = ready(ctx, workload, &inputs, has_pandas) else {
                for _ in 0..self.steps(&ctx.opts) / WORKLOADS.len() as u64 {
                    ctx.advance();
                }
                continue;
            };
            ctx.step(format!("{workload}: native"));
            l.node = Some(node_url(if workload == "redis" {
                &sleeping
            } else {
                &polling
            }));
            Runs::new(workload, &inputs, runtime_argv).measure(ctx, &mut l, &systems)?;
        }
        verdict(ctx);
        Ok(())
    }
}

/// The suite's two memory nodes, each on the server's CPU: one that polls for requests
/// before it sleeps, and one that sleeps at once (for Redis).
fn start_nodes(ctx: &mut Ctx) -> Result<(NodeProcess, NodeProcess)> {
    // As in the pager suite, a node with a CPU of its own polls for requests before it
    // sleeps (a cross-CPU wake-up per miss costs this VM more than serving the page). The
    // Redis workloads' load generator shares that CPU, and a polling node halves its
    // throughput there: Redis pages to a node that sleeps.
    let poll = crate::node::NODE_BUSY_POLL_US.to_string();
    let polling = NodeProcess::start_with("4G", &["--busy-poll-us", &poll])?;
    ctx.opts.placement.pin_server(polling.pid())?;
    let sleeping = NodeProcess::start("4G")?;
    ctx.opts.placement.pin_server(sleeping.pid())?;
    ctx.note(format!(
        "tidepool-node: the node polls {poll} us for requests before it sleeps, except \
         under Redis, whose load generator shares the node's CPU"
    ));
    ctx.note(
        "programs other than Redis run on any CPU, as a user's would, except node-backed \
         ones, which stay off the node's CPU; Redis and its load generator keep their CPUs",
    );
    Ok((polling, sleeping))
}

/// The constrained systems this run wants; linux-zram only if zram starts (it is then the
/// launcher's).
fn constrained_systems(ctx: &mut Ctx, l: &mut Launcher) -> Vec<System> {
    let mut systems: Vec<System> = System::CONSTRAINED
        .into_iter()
        .filter(|s| crate::harness::wanted(s.name()))
        .collect();
    match Zram::start(8 << 30) {
        Ok(z) => l.zram = Some(z),
        Err(e) => {
            ctx.note(format!("linux-zram skipped: {e:#}"));
            systems.retain(|&sy| sy != System::LinuxZram);
        }
    }
    systems
}

/// Whether `workload` runs: `None` if it is skipped (not wanted, or pandas or its runtime is
/// missing, which a note says); else its runtime's command line, if it is a runtime workload.
fn ready(
    ctx: &mut Ctx,
    workload: &str,
    inputs: &Inputs<'_>,
    has_pandas: bool,
) -> Option<Option<Vec<OsString>>> {
    if !workload_wanted(workload) {
        return None;
    }
    if workload == "pandas-groupby" && !has_pandas {
        ctx.note(format!(
            "pandas-groupby skipped: {} has no pandas (scripts/setup installs it)",
            inputs.python.display()
        ));
        return None;
    }
    match workload {
        "go-map" | "jvm-hashmap" | "node-map" => {
            match runtimes::argv(workload, inputs.dir, inputs.s.runtime_entries(workload)) {
                Ok(argv) => Some(Some(argv)),
                Err(e) => {
                    ctx.note(format!("{workload} skipped: {e:#}"));
                    None
                }
            }
        }
        _ => Some(None),
    }
}

/// The figure a workload's speed is read from: operations a second where higher is better,
/// else seconds.
fn speed_metric(higher_better: bool) -> &'static str {
    if higher_better {
        "ops_per_s"
    } else {
        "seconds"
    }
}

/// `tidepool-tuned` against `tidepool-default` on workload `w` at `ratio`: the speed ratio
/// (issue 57 asks 1.3x), each one's prefetch accuracy and far reads. `at(system, metric)`
/// finds a figure.
fn tuned_note(
    w: &str,
    ratio: f64,
    higher_better: bool,
    at: &dyn Fn(&str, &str) -> Option<f64>,
) -> Option<String> {
    let metric = speed_metric(higher_better);
    let (t, d) = (
        at("tidepool-tuned", metric)?,
        at("tidepool-default", metric)?,
    );
    let speed = if higher_better { t / d } else { d / t };
    let shown = |sys: &str| {
        let acc = at(sys, "prefetch_accuracy").map_or("-".to_string(), |a| format!("{a:.0}%"));
        let far = at(sys, "far_reads").map_or("-".to_string(), |f| format!("{f:.0}"));
        format!("prefetch accuracy {acc}, {far} far reads")
    };
    Some(format!(
        "{w} at {:.0}% local: tidepool-tuned {speed:.2}x tidepool-default's speed ({}; \
         default: {})",
        ratio * 100.0,
        shown("tidepool-tuned"),
        shown("tidepool-default")
    ))
}

/// The local memory a program of native peak RSS `peak` (bytes) gets at `ratio`.
fn local_bytes(peak: u64, ratio: f64) -> u64 {
    ((peak as f64 * ratio) as u64).max(16 << 20)
}

/// `TIDEPOOL_BENCH_RATIOS=0.25` limits a run to some shares of local memory.
fn ratio_wanted(ratio: f64) -> bool {
    match std::env::var("TIDEPOOL_BENCH_RATIOS") {
        Ok(list) => list
            .split(',')
            .any(|r| r.trim().parse::<f64>().is_ok_and(|r| r == ratio)),
        Err(_) => true,
    }
}

/// `TIDEPOOL_BENCH_WORKLOADS=sort,python-dict` limits a run to some workloads (for profiling;
/// `redis` stands for its three).
fn workload_wanted(workload: &str) -> bool {
    match std::env::var("TIDEPOOL_BENCH_WORKLOADS") {
        Ok(list) => list.split(',').any(|w| w.trim() == workload),
        Err(_) => true,
    }
}

enum Measured {
    Redis(RedisResult),
    Program(Ran),
}

impl Measured {
    /// A program's time, if it finished.
    fn seconds(&self) -> Option<f64> {
        match self {
            Measured::Program(Ran {
                outcome: Outcome::Done { seconds, .. },
                ..
            }) => Some(*seconds),
            _ => None,
        }
    }

    fn oom_killed(&self) -> bool {
        match self {
            Measured::Redis(r) => r.oom_killed,
            Measured::Program(r) => matches!(r.outcome, Outcome::OomKilled),
        }
    }
}

/// The bytes rows beside a workload's figure: `machine_mib`, `far_mib` on a memory node, and
/// `unpaged_mib` under the pager.
fn push_held(
    ctx: &mut Ctx,
    system: &str,
    workload: &str,
    held: &Held,
    params: &[(&'static str, f64)],
) {
    ctx.report.push(
        system,
        workload,
        "machine_mib",
        held.machine_mib(),
        "MiB",
        params,
    );
    if let Some(far) = held.far_mib() {
        ctx.report
            .push(system, workload, "far_mib", far, "MiB", params);
    }
    if let Some(unpaged) = held
        .unpaged_mib()
        .filter(|_| system.starts_with("tidepool-"))
    {
        ctx.report
            .push(system, workload, "unpaged_mib", unpaged, "MiB", params);
    }
}

/// The pager's record beside a figure under `tidepool run`: its far reads and the share of
/// the pages its prefetcher brought in that the program used (`prefetch_accuracy`, percent).
fn push_sections(
    ctx: &mut Ctx,
    system: &str,
    workload: &str,
    sections: Option<&SectionTotals>,
    params: &[(&'static str, f64)],
) {
    let Some(t) = sections else {
        return;
    };
    ctx.report.push(
        system,
        workload,
        "far_reads",
        t.far_reads as f64,
        "",
        params,
    );
    if let Some(a) = t.accuracy_pct() {
        ctx.report
            .push(system, workload, "prefetch_accuracy", a, "%", params);
    }
}

impl Measured {
    fn peak_rss(&self) -> u64 {
        match self {
            Measured::Redis(r) => r.peak_rss,
            Measured::Program(r) => r.peak_rss,
        }
    }

    fn answer(&self) -> Option<String> {
        match self {
            Measured::Program(Ran {
                outcome: Outcome::Done { answer, .. },
                ..
            }) => Some(answer.clone()),
            _ => None,
        }
    }

    /// Rows for the report; a wrong answer is an error.
    fn report(
        &self,
        ctx: &mut Ctx,
        system: System,
        workload: &str,
        ratio: f64,
        peak: u64,
        want: Option<&str>,
    ) -> Result<()> {
        let params = [
            ("local_ratio", ratio),
            ("peak_rss_mib", (peak >> 20) as f64),
        ];
        let name = system.name();
        match self {
            Measured::Redis(r) => {
                if r.oom_killed {
                    for w in ["redis-get", "redis-set", "redis-bgsave"] {
                        ctx.report.push(name, w, "oom_killed", 1.0, "", &params);
                    }
                    return Ok(());
                }
                if let Some(v) = r.get_ops {
                    ctx.report
                        .push(name, "redis-get", "ops_per_s", v, "ops/s", &params);
                    push_held(ctx, name, "redis-get", &r.get_held, &params);
                }
                if let Some(v) = r.set_ops {
                    ctx.report
                        .push(name, "redis-set", "ops_per_s", v, "ops/s", &params);
                    push_held(ctx, name, "redis-set", &r.set_held, &params);
                }
                if let Some(v) = r.bgsave_seconds {
                    ctx.report
                        .push(name, "redis-bgsave", "seconds", v, "s", &params);
                    push_held(ctx, name, "redis-bgsave", &r.bgsave_held, &params);
                }
                // One server ran all three: its sections' record is the whole run's.
                for w in ["redis-get", "redis-set", "redis-bgsave"] {
                    push_sections(ctx, name, w, r.sections.as_ref(), &params);
                }
            }
            Measured::Program(Ran {
                outcome: Outcome::OomKilled,
                ..
            }) => {
                ctx.report
                    .push(name, workload, "oom_killed", 1.0, "", &params);
            }
            Measured::Program(Ran {
                outcome: Outcome::Done { seconds, answer },
                held,
                interrupts,
                sections,
                ..
            }) => {
                if let Some(want) = want {
                    if answer != want {
                        bail!("{workload} under {name} at {:.0}% local answered '{answer}', natively '{want}'", ratio * 100.0);
                    }
                }
                ctx.report
                    .push(name, workload, "seconds", *seconds, "s", &params);
                push_held(ctx, name, workload, held, &params);
                push_sections(ctx, name, workload, sections.as_ref(), &params);
                if let Some(i) = interrupts {
                    ctx.report.push(
                        name,
                        workload,
                        "interrupts",
                        i.cross_cpu() as f64,
                        "",
                        &params,
                    );
                    ctx.report.push(
                        name,
                        workload,
                        "tlb_shootdowns",
                        i.tlb_shootdown as f64,
                        "",
                        &params,
                    );
                }
            }
        }
        Ok(())
    }
}

/// Each tidepool system against linux-zram on each workload and ratio, as notes: its speed
/// and its `machine_mib`, each as a ratio of zram's, and whether that is a win (faster at no
/// more bytes, or smaller at no more time). Issue 54 asks it of `tidepool-default`.
fn verdict(ctx: &mut Ctx) {
    let mut notes = Vec::new();
    let figures = WORKLOADS.iter().flat_map(|&w| match w {
        "redis" => vec!["redis-get", "redis-set", "redis-bgsave"],
        w => vec![w],
    });
    let results = &ctx.report.results;
    for w in figures {
        for ratio in RATIOS {
            let higher_better = w == "redis-get" || w == "redis-set";
            let at = |sys: &str, m: &str| {
                results
                    .iter()
                    .find(|r| {
                        r.system == sys
                            && r.workload == w
                            && r.metric == m
                            && r.params.get("local_ratio") == Some(&ratio)
                    })
                    .map(|r| r.value)
            };
            if let Some(n) = tuned_note(w, ratio, higher_better, &at) {
                notes.push(n);
            }
            for system in [
                "tidepool-default",
                "tidepool-tuned",
                "tidepool-local",
                "tidepool-node",
            ] {
                notes.extend(against_zram(w, ratio, system, higher_better, &at));
            }
            notes.extend(node_budget_note(results, w, ratio, &at));
        }
    }
    for n in notes {
        ctx.note(n);
    }
}

/// `system` against linux-zram on workload `w` at `ratio` (see [`verdict`]); `None` if
/// either has no figure. `at(system, metric)` finds a figure.
fn against_zram(
    w: &str,
    ratio: f64,
    system: &str,
    higher_better: bool,
    at: &dyn Fn(&str, &str) -> Option<f64>,
) -> Option<String> {
    let metric = speed_metric(higher_better);
    let (Some(t), Some(t_mib)) = (at(system, metric), at(system, "machine_mib")) else {
        return None;
    };
    let pct = ratio * 100.0;
    match (at("linux-zram", metric), at("linux-zram", "machine_mib")) {
        (Some(z), Some(z_mib)) => {
            let speed = if higher_better { t / z } else { z / t };
            let bytes = t_mib / z_mib;
            let verdict = match (speed >= 1.0, bytes <= 1.0) {
                (true, true) => "wins",
                (true, false) => "faster but larger",
                (false, true) => "smaller but slower",
                (false, false) => "loses",
            };
            let irqs = match (at(system, "interrupts"), at("linux-zram", "interrupts")) {
                (Some(t), Some(z)) => format!(
                    "; {t:.0} cross-CPU interrupts, {:.1}x linux-zram's {z:.0}",
                    t / z.max(1.0)
                ),
                _ => String::new(),
            };
            Some(format!(
                "{w} at {pct:.0}% local: {system} {speed:.2}x linux-zram's speed at \
                 {bytes:.2}x its machine_mib ({t_mib:.0} vs {z_mib:.0} MiB): \
                 {verdict}{irqs}"
            ))
        }
        _ if at("linux-zram", "oom_killed").is_some() => Some(format!(
            "{w} at {pct:.0}% local: linux-zram was OOM-killed, {system} finished \
             holding {t_mib:.0} MiB"
        )),
        _ => None,
    }
}

/// A memory node takes the pages off this machine: what stays is the budget and what the
/// pager does not page. The note comparing the two on workload `w` at `ratio`, if the node
/// ran it.
fn node_budget_note(
    results: &[crate::report::Row],
    w: &str,
    ratio: f64,
    at: &dyn Fn(&str, &str) -> Option<f64>,
) -> Option<String> {
    let (Some(m), Some(u), Some(peak)) = (
        at("tidepool-node", "machine_mib"),
        at("tidepool-node", "unpaged_mib"),
        results
            .iter()
            .find(|r| r.workload == w && r.params.get("local_ratio") == Some(&ratio))
            .and_then(|r| r.params.get("peak_rss_mib").copied()),
    ) else {
        return None;
    };
    let mut budget = (local_bytes((peak as u64) << 20, ratio) >> 20) as f64;
    // BGSAVE's forked child has a budget of its own: a quarter of its parent's
    // (`tidepool run --child-local`'s default).
    let child = if w == "redis-bgsave" {
        budget *= 1.25;
        ", its forked child's quarter included"
    } else {
        ""
    };
    Some(crate::meter::budget_note(
        w,
        ratio,
        "tidepool-node",
        m,
        budget,
        child,
        u,
    ))
}
