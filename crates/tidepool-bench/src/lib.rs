//! `tidepool bench SUITE [--quick] [--out DIR]`: end-to-end comparisons against the peers a user
//! would pick instead, run side by side on the same machine, in the same run.
//!
//! A suite implements [`Suite`]: it starts the peers it needs, runs each system on the same
//! workloads (alternating systems round by round, so drift on a shared machine hits all of them
//! alike) and records rows in a [`Report`]. The harness writes `DIR/SUITE.json`, draws
//! `DIR/SUITE.png` with matplotlib, prints a table, and shows a progress bar while it runs.
#![forbid(unsafe_code)]

pub mod report;
pub mod store;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
pub use report::{Report, Row};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a suite should run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// Finish within about a minute, keeping every system and workload with less data.
    pub quick: bool,
    pub out: PathBuf,
}

impl BenchOpts {
    /// Seconds per measurement.
    pub fn measure_for(&self) -> Duration {
        if self.quick {
            Duration::from_millis(400)
        } else {
            Duration::from_secs(2)
        }
    }

    /// Rounds over all systems; results are the median (throughput) or pooled (latency).
    pub fn rounds(&self) -> usize {
        if self.quick {
            2
        } else {
            3
        }
    }
}

/// What a suite gets while it runs.
#[derive(Debug)]
pub struct Ctx {
    pub opts: BenchOpts,
    pub report: Report,
    pub progress: ProgressBar,
}

impl Ctx {
    /// Records that a peer or measurement could not run, and why; the rest still reports.
    pub fn note(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        self.progress.println(format!("note: {msg}"));
        self.report.notes.push(msg);
    }

    pub fn step(&self, what: impl Into<String>) {
        self.progress.set_message(what.into());
    }

    pub fn advance(&self) {
        self.progress.inc(1);
    }
}

/// One benchmark suite.
pub trait Suite {
    fn name(&self) -> &'static str;
    fn about(&self) -> &'static str;
    /// How many progress steps `run` will take.
    fn steps(&self, opts: &BenchOpts) -> u64;
    fn run(&self, ctx: &mut Ctx) -> Result<()>;
}

/// Every suite `tidepool bench` knows.
pub fn suites() -> Vec<Box<dyn Suite>> {
    vec![Box::new(store::StoreSuite)]
}

/// Runs one suite end to end and writes its JSON and PNG. Returns the report.
pub fn run(name: &str, opts: BenchOpts) -> Result<Report> {
    let all = suites();
    let Some(suite) = all.iter().find(|s| s.name() == name) else {
        let names: Vec<_> = all.iter().map(|s| s.name()).collect();
        bail!("unknown suite '{name}'; available: {}", names.join(", "));
    };
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create output directory {}", opts.out.display()))?;
    let progress = ProgressBar::new(suite.steps(&opts));
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut ctx = Ctx {
        report: Report::new(name, opts.quick),
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
    std::fs::write(&script, include_str!("plot.py"))?;
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
