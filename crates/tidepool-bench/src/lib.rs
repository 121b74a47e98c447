//! `tidepool bench SUITE [--quick] [--out DIR]`: end-to-end comparisons against the peers a user
//! would pick instead, run side by side on the same machine, in the same run.
//!
//! A suite implements [`Suite`]: it starts the peers it needs, runs each system on the same
//! workloads (alternating systems round by round, so drift on a shared machine hits all of them
//! alike) and records rows in a [`Report`]. The harness writes `DIR/SUITE.json`, draws
//! `DIR/SUITE.png` with matplotlib, prints a table, and shows a progress bar while it runs.
#![forbid(unsafe_code)]

pub mod alloc;
pub mod apps;
pub mod coord;
pub mod env;
pub mod far;
mod far_overhead;
mod far_query;
pub mod libs;
pub mod pager;
pub mod report;
pub mod soft;
pub mod store;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
pub use report::{Report, Row};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where servers and clients run. On small VMs a wake-up across vCPUs costs tens of
/// microseconds, so placement moves results more than code does; every system of a suite gets
/// the same placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Latency workloads as `Shared` (a round trip then measures the software, not the
    /// hypervisor's price for waking another vCPU), throughput workloads as `Split` (the server
    /// has a core of its own, as a memory node would).
    Auto,
    /// Servers on the last CPU, clients on the others (one CPU each on a 2-vCPU machine).
    Split,
    /// Everything on CPU 0: results measure total CPU per operation, with no cross-CPU wake-up.
    Shared,
    /// Wherever the scheduler puts things.
    Free,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Placement::Auto),
            "split" => Ok(Placement::Split),
            "shared" => Ok(Placement::Shared),
            "free" => Ok(Placement::Free),
            _ => Err(format!(
                "placement must be auto, split, shared or free, not '{s}'"
            )),
        }
    }
}

impl Placement {
    /// CPUs of the machine (not of this thread's affinity, which placement itself narrows).
    fn cpus() -> usize {
        tidepool_sys::online_cpus()
    }

    /// The placement for one kind of workload.
    pub fn for_workload(self, latency: bool) -> Placement {
        match self {
            Placement::Auto if latency => Placement::Shared,
            Placement::Auto => Placement::Split,
            p => p,
        }
    }

    /// CPUs for client threads and client processes, if pinned.
    pub fn client_cpus(self) -> Option<Vec<usize>> {
        match self {
            Placement::Split | Placement::Auto if Self::cpus() > 1 => {
                Some((0..Self::cpus() - 1).collect())
            }
            Placement::Split | Placement::Auto | Placement::Shared => Some(vec![0]),
            Placement::Free => None,
        }
    }

    /// CPUs for server processes, if pinned.
    pub fn server_cpus(self) -> Option<Vec<usize>> {
        match self {
            Placement::Split | Placement::Auto => Some(vec![Self::cpus() - 1]),
            Placement::Shared => Some(vec![0]),
            Placement::Free => None,
        }
    }

    /// Pins a server process (all its threads) where servers go.
    pub fn pin_server(self, pid: u32) -> Result<()> {
        if let Some(cpus) = self.server_cpus() {
            tidepool_sys::pin_process(pid, &cpus)
                .with_context(|| format!("cannot pin server process {pid}"))?;
        }
        Ok(())
    }

    fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto (latency: shared, throughput: split)",
            Placement::Split => "split",
            Placement::Shared => "shared",
            Placement::Free => "free",
        }
    }
}

/// How a suite should run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// Finish within about a minute, keeping every system and workload with less data.
    pub quick: bool,
    pub out: PathBuf,
    pub placement: Placement,
}

impl BenchOpts {
    /// Seconds per measurement.
    pub fn measure_for(&self) -> Duration {
        if self.quick {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(1)
        }
    }

    /// Rounds over all systems; results are the median (throughput) or pooled (latency).
    /// Several short alternating rounds beat one long one on a shared VM: drift hits every
    /// system, and the median drops the round that a neighbour disturbed.
    pub fn rounds(&self) -> usize {
        if self.quick {
            3
        } else {
            5
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
        // Straight to stderr: the progress bar hides its own output when not on a terminal.
        self.progress.suspend(|| eprintln!("note: {msg}"));
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

/// The median of `v` (0 if empty); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// Every suite `tidepool bench` knows.
pub fn suites() -> Vec<Box<dyn Suite>> {
    vec![
        Box::new(store::StoreSuite),
        Box::new(alloc::AllocSuite),
        Box::new(pager::PagerSuite),
        Box::new(soft::SoftSuite),
        Box::new(coord::CoordSuite),
        Box::new(far::FarSuite),
        Box::new(apps::AppsSuite),
    ]
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
    let mut report = Report::new(name, opts.quick);
    report.env = Some(env::Env::capture(opts.quick));
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
