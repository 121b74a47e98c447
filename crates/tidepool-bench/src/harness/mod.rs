//! What every suite shares: how it is told to run ([`BenchOpts`], [`Placement`]), what it
//! gets while it runs ([`Ctx`]: the report, notes, progress), the rounds x systems loop that
//! measures its comparisons ([`Matrix`]), and the end of a run (the JSON, the table, the plot).
//!
//! A suite declares its systems and workloads and how to measure one system on one workload;
//! the harness decides the order (alternating systems round by round, so drift on a shared
//! machine hits all of them alike), pins servers where the placement puts them, keeps the
//! progress bar moving and turns the rounds' samples into report rows.

mod ctx;
mod matrix;
mod placement;

pub use ctx::{Ctx, Suite};
pub use matrix::{
    geomean, matrix_steps, median, Matrix, Pass, Sample, Samples, System, Turns, Workload,
};
pub use placement::{on_any_cpu, BenchOpts, Placement};

use crate::report::Report;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::time::Duration;

/// Runs `suite` end to end and writes its JSON and PNG. Returns the report.
pub fn run(suite: &dyn Suite, opts: BenchOpts) -> Result<Report> {
    let name = suite.name();
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create output directory {}", opts.out.display()))?;
    let progress = ProgressBar::new(suite.steps(&opts));
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut report = Report::new(name, opts.quick);
    report.env = Some(crate::env::Env::capture(opts.quick));
    // Clients (this thread, the threads it starts, the processes it spawns) go where clients go;
    // suites move each server they start to the server CPUs.
    if let Some(cpus) = opts.placement.client_cpus() {
        tidepool_sys::set_affinity(0, &cpus).context("cannot pin the benchmark's clients")?;
    }
    let cpus = |c: Option<Vec<usize>>| match c {
        Some(v) => v
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(","),
        None => "any".into(),
    };
    report.notes.push(format!(
        "placement {}: clients on CPU {}, servers on CPU {}",
        opts.placement.name(),
        cpus(opts.placement.client_cpus()),
        cpus(opts.placement.server_cpus())
    ));
    let mut ctx = Ctx {
        report,
        opts: opts.clone(),
        progress,
    };
    let outcome = suite.run(&mut ctx);
    ctx.progress.finish_and_clear();
    let report = ctx.report;
    // Whatever was measured is written even if the suite failed part-way.
    let json = opts.out.join(format!("{name}.json"));
    report.write_json(&json)?;
    print!("{}", report.table());
    println!("wrote {}", json.display());
    let png = opts.out.join(format!("{name}.png"));
    match plot(&json, &png) {
        Ok(()) => println!("wrote {}", png.display()),
        Err(e) => eprintln!("warning: no plot drawn: {e:#}"),
    }
    outcome?;
    Ok(report)
}

/// Draws the PNG with the bundled matplotlib script.
pub fn plot(json: &Path, png: &Path) -> Result<()> {
    let script = std::env::temp_dir().join(format!("tidepool-plot-{}.py", std::process::id()));
    std::fs::write(&script, include_str!("../plot.py"))?;
    let mut last_err = String::new();
    for python in ["python3", "/usr/bin/python3"] {
        let out = std::process::Command::new(python)
            .arg(&script)
            .arg(json)
            .arg(png)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let _ = std::fs::remove_file(&script);
                return Ok(());
            }
            Ok(o) => last_err = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last_err = format!("{python}: {e}"),
        }
    }
    let _ = std::fs::remove_file(&script);
    bail!(
        "python3 with matplotlib is needed for the plot (pip install matplotlib, or apt-get \
         install python3-matplotlib): {last_err}"
    )
}

/// `TIDEPOOL_BENCH_SYSTEMS=tidepool-node,redis` limits a run to some systems (for profiling).
pub fn wanted(system: &str) -> bool {
    match std::env::var("TIDEPOOL_BENCH_SYSTEMS") {
        Ok(list) => list.split(',').any(|s| s.trim() == system),
        Err(_) => true,
    }
}
