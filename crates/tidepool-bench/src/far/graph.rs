//! Part (a): Mira's graph traversal (its Figure 4) on far vectors, tuned and untuned, against
//! the same vectors used as swap, the transparent pager, Linux swap to zram and native code.
//! See the suite's docs.

use super::sizes::Sizes;
use crate::harness::{Ctx, Matrix, Sample, System, Turns, Workload};
use crate::job::GraphSystem;
use crate::worker::run_worker;
use crate::zram::Zram;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;
use tidepool_far::Config;

/// The native worker's resident set with an empty graph (4.2 MiB measured): what the process
/// needs besides the graph. The pager suite's 16 MiB would hand zram and the pager a quarter of
/// the footprint for free at small ratios.
const ALLOWANCE: u64 = 4 << 20;
pub(super) const RATIOS: [f64; 5] = [0.1, 0.25, 0.5, 0.75, 1.0];

/// Where the graph walk runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Graph {
    /// Far vectors in the sections the tuning loop kept.
    FarTuned,
    /// Far vectors in `Config::untuned` sections.
    FarUntuned,
    /// Far vectors in one fully associative section, element by element.
    FarSwap,
    /// The native program under `tidepool run` (in-process store).
    Pager,
    /// The native program in a memory cgroup, swapping to zram.
    LinuxZram,
    /// The native program, everything local.
    Native,
}

impl System for Graph {
    fn name(&self) -> &'static str {
        match self {
            Graph::FarTuned => "tidepool-far-tuned",
            Graph::FarUntuned => "tidepool-far-untuned",
            Graph::FarSwap => "tidepool-far-swap",
            Graph::Pager => "tidepool-pager",
            Graph::LinuxZram => "linux-zram",
            Graph::Native => "native",
        }
    }
}

/// The walk at one local-memory ratio of the footprint.
#[derive(Debug, Clone)]
struct GraphAt {
    ratio: f64,
    footprint: u64,
    /// The untuned configuration's file and the one the tuning loop kept.
    untuned: PathBuf,
    tuned: PathBuf,
}

impl GraphAt {
    fn pct(&self) -> u64 {
        (self.ratio * 100.0).round() as u64
    }

    fn local(&self) -> u64 {
        (self.footprint as f64 * self.ratio) as u64
    }
}

impl Workload for GraphAt {
    fn name(&self) -> &str {
        "graph"
    }

    fn on(&self, system: &str) -> String {
        format!("graph on {system} at {}% local", self.pct())
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("local_ratio", self.pct() as f64 / 100.0),
            ("footprint_mib", (self.footprint >> 20) as f64),
        ]
    }
}

/// Part (a): tunes at every ratio, then runs every system at every ratio.
pub(super) fn run(ctx: &mut Ctx, s: &Sizes) -> Result<()> {
    let footprint = (s.nodes + s.edges) * 8;
    let exe = std::env::current_exe()?;
    let preload = crate::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so")?;
    let zram = match Zram::start(footprint * 2) {
        Ok(z) => Some(z),
        Err(e) => {
            ctx.note(format!("linux-zram skipped: {e:#}"));
            None
        }
    };
    let workloads = tuned_workloads(ctx, s, footprint)?;
    let mut systems = vec![
        Graph::FarTuned,
        Graph::FarUntuned,
        Graph::FarSwap,
        Graph::Pager,
    ];
    if zram.is_some() {
        systems.push(Graph::LinuxZram);
    }
    systems.push(Graph::Native);
    let launch = Launch {
        exe: &exe,
        preload: &preload,
        zram: zram.as_ref(),
        s,
    };
    let samples = Matrix::new(&systems, &workloads, s.rounds)
        .turns(Turns::Rotate)
        .only(|w, &sys| sys != Graph::Native || w.ratio == 1.0)
        .note_failures()
        .run(ctx, |_, _, w, &sys| {
            let cmd = launch.command(sys, w)?;
            Ok(Sample::new().median("edges_per_s", "edges/s", run_worker(cmd)?))
        })?;
    samples.report_by(ctx, |r| {
        (
            r.system.clone(),
            r.params
                .get("local_ratio")
                .map(|x| (x * 100.0).round() as u64),
        )
    });
    Ok(())
}

/// Each ratio's configurations: untuned, and what the tuning loop kept.
fn tuned_workloads(ctx: &mut Ctx, s: &Sizes, footprint: u64) -> Result<Vec<GraphAt>> {
    let mut workloads = Vec::new();
    for &ratio in &RATIOS {
        ctx.step(format!("tuning the graph at {:.0}% local", ratio * 100.0));
        let pct = (ratio * 100.0).round() as u64;
        let local = (footprint as f64 * ratio) as u64;
        let untuned = Config::untuned(
            &[("graph.edges", s.edges * 8), ("graph.nodes", s.nodes * 8)],
            local,
        );
        let dir = ctx.opts.out.clone();
        let path = |what: &str| dir.join(format!("far-graph-{pct}-{what}"));
        std::fs::write(path("untuned.toml"), untuned.to_toml())?;
        let tuned = tune_loop(ctx, s, pct, local, &untuned, &path)?;
        workloads.push(GraphAt {
            ratio,
            footprint,
            untuned: path("untuned.toml"),
            tuned,
        });
        ctx.advance();
    }
    Ok(workloads)
}

/// What the graph worker is started with: this executable, the preload library for the
/// pager, zram's cgroup if it started, the sizes.
struct Launch<'a> {
    exe: &'a Path,
    preload: &'a Path,
    zram: Option<&'a Zram>,
    s: &'a Sizes,
}

impl Launch<'_> {
    /// The command of the graph worker under `sys` at `w`'s share of local memory.
    fn command(&self, sys: Graph, w: &GraphAt) -> Result<Command> {
        let (exe, s) = (self.exe, self.s);
        let local = w.local();
        let far = |config: &Path| GraphSystem::Far {
            config: config.to_owned(),
            profile_out: None,
        };
        let system = match sys {
            Graph::FarTuned => far(&w.tuned),
            Graph::FarUntuned => far(&w.untuned),
            Graph::FarSwap => GraphSystem::FarSwap,
            _ => GraphSystem::Native,
        };
        let mut cmd = match sys {
            Graph::LinuxZram => self
                .zram
                .expect("listed only if started")
                .command(local + ALLOWANCE)?,
            Graph::Pager => {
                let mut c = Command::new(exe);
                c.args(["run", "--local", &(local + ALLOWANCE).to_string()])
                    .args(["--backend", "local:", "--"])
                    .env("TIDEPOOL_PRELOAD", self.preload);
                c
            }
            _ => Command::new("env"),
        };
        cmd.arg(exe).args(s.job(system, local).args());
        Ok(cmd)
    }
}

/// Mira's loop at one ratio: profile the program in the best configuration so far, tune
/// from the profile, run the result, keep it if faster (by more than noise), and stop at
/// the first that is not (rolling it back) or after [`TUNE_ROUNDS`]. Each step is a note.
/// Returns the path of the configuration kept.
fn tune_loop(
    ctx: &mut Ctx,
    s: &Sizes,
    pct: u64,
    local: u64,
    untuned: &Config,
    path: &dyn Fn(&str) -> PathBuf,
) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let run = |config: &Path, profile: Option<&Path>| {
        let system = GraphSystem::Far {
            config: config.to_owned(),
            profile_out: profile.map(Path::to_owned),
        };
        run_worker(s.job(system, local).command(&exe))
    };
    let mut best = path("untuned.toml");
    let mut best_rate = run(&best, None)?;
    let mut steps = vec![format!("untuned {best_rate:.3e}")];
    let mut current = untuned.clone();
    for round in 1..=TUNE_ROUNDS {
        let profile = path(&format!("profile-{round}.json"));
        run(&best, Some(&profile))?;
        let p = tidepool_far::profile::Profile::from_json(&std::fs::read_to_string(&profile)?)?;
        let t = tidepool_far::tune::tune(&p, local);
        if t.config == current {
            steps.push(format!(
                "round {round}: the profile gives the same configuration, done"
            ));
            break;
        }
        let candidate = path(&format!("tuned-{round}.toml"));
        std::fs::write(&candidate, t.config.to_toml())?;
        let rate = run(&candidate, None)?;
        if rate > best_rate * 1.02 {
            steps.push(format!("round {round}: {rate:.3e} (kept)"));
            best = candidate;
            best_rate = rate;
            current = t.config;
        } else {
            steps.push(format!("round {round}: {rate:.3e} (rolled back)"));
            break;
        }
    }
    ctx.note(format!(
        "tuning the graph at {pct}% local (edges/s): {}; kept {}",
        steps.join(", "),
        best.file_name()
            .map_or(String::new(), |f| f.to_string_lossy().into_owned())
    ));
    Ok(best)
}

/// Profile-tune-run rounds at most.
const TUNE_ROUNDS: usize = 3;
