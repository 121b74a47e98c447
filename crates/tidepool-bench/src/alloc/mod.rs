//! The `alloc` suite: tidepool-alloc (libtidepool_malloc.so) against glibc, jemalloc, tcmalloc and
//! mimalloc, each injected with LD_PRELOAD into the same workload process.
//!
//! Workloads follow Memento's study of serverless functions: sizes mostly under 512 bytes, 71%
//! of objects freed within 16 further allocations, the rest freed together when the invocation
//! ends (`serverless-burst`, `serverless-threads`, `serverless-json`) or never, dying with the
//! process (`serverless-exit`). Besides them: producers and consumers freeing each other's
//! objects, large buffers, and CPython running function-style code with `PYTHONMALLOC=malloc`.
//!
//! Each run is a fresh process (`tidepool bench-worker` with an `alloc` job, or python3) that times
//! its own work and reports its peak RSS (VmHWM). Systems alternate within each round; the median
//! over rounds is reported.
//!
//! With `--mimalloc-bench DIR` the public allocator benchmarks of mimalloc-bench run too, the
//! same way ([`public`]).
//!
//! Modules: `allocators.rs` (the systems and the check of what a process has mapped),
//! `worker.rs` and `stress.rs` (the workloads, run in the measured process), `external.rs`
//! (running a program not ours: wall time, peak RSS from `wait4`, output, the preload seen
//! live), `public/` (mimalloc-bench's programs: `programs.rs` how each runs and reports,
//! `output.rs` their output against glibc's, `mod.rs` the runs and the verdict).

mod allocators;
mod external;
mod public;
mod stress;
mod worker;

pub use allocators::tidepool_library;
pub use external::worker as exec_worker;
pub use stress::stress;
pub use worker::worker;

use crate::harness::{
    geomean, matrix_steps, BenchOpts, Ctx, Matrix, Placement, Sample, Suite, Turns, Workload,
};
use crate::job::{AllocJob, Job};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Workloads of the `alloc` job of `tidepool bench-worker`.
pub(crate) const WORKER_WORKLOADS: [&str; 6] = [
    "serverless-burst",
    "serverless-exit",
    "serverless-threads",
    "serverless-json",
    "producer-consumer",
    "large-objects",
];
const PYTHON_WORKLOAD: &str = "cpython-functions";

/// One workload, at the run's scale.
#[derive(Debug, Clone, Copy)]
struct AllocWorkload {
    name: &'static str,
    scale: usize,
}

impl Workload for AllocWorkload {
    fn name(&self) -> &str {
        self.name
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![("scale", self.scale as f64)]
    }
}

#[derive(Debug)]
pub struct AllocSuite;

impl Suite for AllocSuite {
    fn name(&self) -> &'static str {
        "alloc"
    }

    fn about(&self) -> &'static str {
        "malloc under serverless-style workloads, cross-thread frees, large objects and CPython, \
         and mimalloc-bench's public programs (larson, cfrac, espresso, barnes, ...; \
         --mimalloc-bench DIR): tidepool vs glibc, jemalloc, tcmalloc, mimalloc (LD_PRELOAD)"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        matrix_steps(WORKER_WORKLOADS.len() + 1, opts.rounds()) + public::steps(opts)
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let systems = allocators::systems(ctx)?;
        let python = python3();
        let script = ctx.opts.out.join("cpython_functions.py");
        std::fs::write(&script, include_str!("../cpython_functions.py"))?;
        let scale = if ctx.opts.quick { 1 } else { 4 };
        let mut names: Vec<&'static str> = WORKER_WORKLOADS.to_vec();
        if python.is_some() {
            names.push(PYTHON_WORKLOAD);
        } else {
            ctx.note("python3 not found: the cpython-functions workload is skipped");
        }
        let workloads: Vec<AllocWorkload> = names
            .iter()
            .map(|&name| AllocWorkload { name, scale })
            .collect();
        // Each run is a fresh process; the rotation keeps any system from always running
        // first (or warm).
        let samples = Matrix::new(&systems, &workloads, ctx.opts.rounds())
            .turns(Turns::Rotate)
            .run(ctx, |ctx, _, w, a| {
                let mut cmd = if w.name == PYTHON_WORKLOAD {
                    let mut c = Command::new(python.as_ref().expect("checked above"));
                    c.arg(&script)
                        .arg((300 * scale).to_string())
                        .env("PYTHONMALLOC", "malloc")
                        .env("PYTHONHASHSEED", "0");
                    c
                } else {
                    Job::Alloc(AllocJob {
                        workload: w.name.to_owned(),
                        scale,
                    })
                    .command(&std::env::current_exe()?)
                };
                if let Some(lib) = &a.lib {
                    cmd.env("LD_PRELOAD", lib);
                }
                let threaded = matches!(w.name, "serverless-threads" | "producer-consumer");
                let (secs, rss) = run_worker(cmd, ctx.opts.placement, threaded, a.lib.as_deref())?;
                Ok(Sample::new()
                    .median("seconds", "s", secs)
                    .median("peak_rss_mib", "MiB", rss))
            })?;
        // Per workload, each metric with the systems side by side: tidepool first, then the
        // peers.
        let position = |s: &str| systems.iter().position(|a| a.name == s);
        samples.report_by(ctx, |r| {
            (
                names.iter().position(|w| *w == r.workload),
                r.metric.clone(),
                position(&r.system),
            )
        });
        verdict(ctx);
        public::run(ctx, &systems)
    }
}

/// Builds libtidepool_malloc.so (profile `malloc`) into `target_dir`, for tests: see
/// [`tidepool_peers::libs::build_malloc_into`].
pub fn build_library_into(target_dir: &Path, workspace_dir: &Path) -> Result<PathBuf> {
    Ok(tidepool_peers::libs::build_malloc_into(
        target_dir,
        workspace_dir,
    )?)
}

fn python3() -> Option<PathBuf> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Runs one worker process; returns (seconds, peak RSS MiB) from its report line, after checking
/// that the intended allocator was the one mapped into it.
fn run_worker(
    mut cmd: Command,
    placement: Placement,
    threaded: bool,
    lib: Option<&Path>,
) -> Result<(f64, f64)> {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if !threaded {
        if let Some(cpus) = placement.for_workload(true).client_cpus() {
            // Best effort: the process may already have exited.
            let _ = tidepool_sys::pin_process(child.id(), &cpus);
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "worker failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("worker printed no report: {stdout}"))?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    allocators::check_mapped(v["allocator"].as_str().unwrap_or(""), lib)
        .map_err(|e| anyhow::anyhow!("in the worker: {e}"))?;
    let secs = v["seconds"].as_f64().context("report lacks seconds")?;
    let rss = v["peak_rss_kib"]
        .as_f64()
        .context("report lacks peak_rss_kib")?
        / 1024.0;
    Ok((secs, rss))
}

/// The acceptance figures, computed from this run and added as notes.
fn verdict(ctx: &mut Ctx) {
    let serverless: Vec<&str> = WORKER_WORKLOADS
        .iter()
        .copied()
        .filter(|w| w.contains("serverless"))
        .collect();
    let ratio = |ctx: &Ctx, peer: &str, metric: &str, workloads: &[&str]| -> Option<f64> {
        let r: Option<Vec<f64>> = workloads
            .iter()
            .map(|w| {
                Some(ctx.report.value(peer, w, metric)? / ctx.report.value("tidepool", w, metric)?)
            })
            .collect();
        r.map(|r| geomean(&r))
    };
    let mut notes = vec![];
    for peer in allocators::PEER_NAMES {
        if let Some(speed) = ratio(ctx, peer, "seconds", &serverless) {
            notes.push(format!(
                "serverless geomean speed-up of tidepool over {peer}: {speed:.3}x"
            ));
        }
    }
    let lowest_peer_rss = |ctx: &Ctx, w: &str| -> Option<f64> {
        allocators::PEER_NAMES
            .iter()
            .filter_map(|p| ctx.report.value(p, w, "peak_rss_mib"))
            .reduce(f64::min)
    };
    for w in &serverless {
        if let (Some(t), Some(low)) = (
            ctx.report.value("tidepool", w, "peak_rss_mib"),
            lowest_peer_rss(ctx, w),
        ) {
            notes.push(format!(
                "{w}: tidepool peak RSS {t:.1} MiB = {:.3}x the lowest peer's {low:.1} MiB",
                t / low
            ));
        }
    }
    if let Some(speed) = ratio(ctx, "glibc", "seconds", &[PYTHON_WORKLOAD]) {
        notes.push(format!(
            "{PYTHON_WORKLOAD}: tidepool {speed:.3}x faster than glibc"
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}
