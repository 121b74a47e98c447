//! Part (a), coordination: four applications sharing idle memory under each policy, against
//! the ideal (every application with room for all its state). See the suite's docs.

use super::app::{Guard, Spinner, PIN_ENV, SPIN_ENV};
use crate::harness::{median, BenchOpts, Ctx, Matrix, Sample, System, Workload};
use crate::job::{AppJob, Job};
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};

/// One synthetic application.
#[derive(Debug, Clone, Copy)]
struct AppSpec {
    name: &'static str,
    skew: f64,
    rebuild_us: f64,
}

/// How the coordinator shares idle memory (`tidepool coord --policy`, `tidepool_coord`'s
/// policies); each is a system of the report, as is `ideal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Midas's: memory goes where it saves the most reconstruction time per byte.
    Midas,
    /// Cliffhanger's: memory goes where it brings the most hits per byte.
    Hitrate,
    /// An even split, whatever the applications need.
    Static,
}

impl Policy {
    /// The name `tidepool coord --policy` takes and the report's rows carry.
    fn name(self) -> &'static str {
        match self {
            Policy::Midas => "midas",
            Policy::Hitrate => "hitrate",
            Policy::Static => "static",
        }
    }
}

/// A run of the four applications: the ideal (room for everything, no coordinator), or
/// sharing idle memory under a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Ideal,
    Coordinated(Policy),
}

impl System for Run {
    fn name(&self) -> &'static str {
        match self {
            Run::Ideal => "ideal",
            Run::Coordinated(p) => p.name(),
        }
    }
}

/// The four applications of `objects` objects each, sharing `idle` bytes.
#[derive(Debug, Clone, Copy)]
struct Coordinate {
    objects: u64,
    idle: u64,
}

impl Workload for Coordinate {
    fn name(&self) -> &str {
        "coordinate"
    }

    fn on(&self, system: &str) -> String {
        match system {
            "ideal" => "ideal: every application with room for all its state".into(),
            policy => format!("{policy}: four applications, {} MiB", self.idle >> 20),
        }
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("objects", self.objects as f64),
            ("idle_mib", (self.idle >> 20) as f64),
        ]
    }
}

/// Midas §7.1's four, in small: (name, Zipf skew, reconstruction cost).
const APPS: [AppSpec; 4] = [
    AppSpec {
        name: "storage",
        skew: 0.99,
        rebuild_us: 20.0,
    },
    AppSpec {
        name: "social",
        skew: 1.2,
        rebuild_us: 10.0,
    },
    AppSpec {
        name: "hdsearch",
        skew: 0.7,
        rebuild_us: 200.0,
    },
    AppSpec {
        name: "lookup",
        skew: 0.9,
        rebuild_us: 2.0,
    },
];
/// Work per request, microseconds of CPU.
const WORK_US: f64 = 10.0;
/// Bytes an object takes in soft memory (4 KiB and its header).
const OBJECT: u64 = 4096 + 16;
/// Idle memory, as a share of what caching every application's state would take.
const IDLE_SHARE: f64 = 0.3;

struct Scale {
    objects: u64,
    /// Spin iterations per microsecond of work, measured once for every run (each
    /// application calibrating for itself, at the start of each run, added a few percent of
    /// noise between runs to every ratio to the ideal).
    spin: f64,
    /// Seconds of a policy run and of its measured tail.
    run_s: f64,
    tail_s: f64,
}

fn scale(opts: &BenchOpts) -> Scale {
    if opts.quick {
        Scale {
            objects: 8192,
            spin: 0.0,
            run_s: 20.0,
            tail_s: 8.0,
        }
    } else {
        Scale {
            objects: 65536,
            spin: 0.0,
            run_s: 150.0,
            tail_s: 40.0,
        }
    }
}

/// What one application did: (seconds, ops, budget bytes) every quarter second, and the
/// lines it printed (kept beside the report, to see where a policy lost).
#[derive(Debug, Default, Clone)]
struct Trace {
    points: Vec<(f64, u64, u64)>,
    lines: Vec<serde_json::Value>,
}

impl Trace {
    /// Operations per second over the last `tail` seconds.
    fn throughput(&self, tail: f64) -> f64 {
        let Some(&(t1, n1, _)) = self.points.last() else {
            return 0.0;
        };
        let start = self
            .points
            .iter()
            .find(|p| p.0 >= t1 - tail)
            .copied()
            .unwrap_or((0.0, 0, 0));
        if t1 <= start.0 {
            return 0.0;
        }
        (n1 - start.1) as f64 / (t1 - start.0)
    }

    /// The median budget over the last `tail` seconds.
    fn settled_budget(&self, tail: f64) -> f64 {
        let t1 = self.points.last().map_or(0.0, |p| p.0);
        let mut v: Vec<f64> = self
            .points
            .iter()
            .filter(|p| p.0 >= t1 - tail)
            .map(|p| p.2 as f64)
            .collect();
        median(&mut v)
    }
}

/// Seconds until every budget stayed within `band` bytes of where it settled. The samples of
/// the run's last moment are left out: the applications leave one by one then, and the
/// coordinator hands what the first leave to the rest, which is teardown, not convergence (it
/// had put 20 s, the run's end, on runs whose budgets settled at 3.4 s).
fn converged_at(traces: &[Trace], tail: f64, band: f64) -> f64 {
    let end = traces
        .iter()
        .filter_map(|t| t.points.last())
        .map(|p| p.0)
        .fold(0.0, f64::max);
    let mut at: f64 = 0.0;
    for t in traces {
        let settled = t.settled_budget(tail);
        // Samples come every quarter second: half of that before the end is the last one.
        for p in t.points.iter().filter(|p| p.0 < end - 0.125) {
            if (p.2 as f64 - settled).abs() > band {
                at = at.max(p.0);
            }
        }
    }
    at
}

/// Part (a): the ideal run, then each policy.
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let mut sc = scale(&ctx.opts);
    sc.spin = Spinner::calibrate().iters_per_us;
    let state = sc.objects * OBJECT;
    let idle = ((state * APPS.len() as u64) as f64 * IDLE_SHARE) as u64 >> 21 << 21;
    ctx.report.notes.push(format!(
        "coord (a) coordinate: {} applications of {} 4 KiB objects each ({} MiB of state each), sharing {} MiB \
         of idle memory ({:.0}% of all state); work {WORK_US} us a request; skews and rebuild costs: {}. \
         Midas §7.1 reports 0.75 of ideal for midas, 0.56 for Cliffhanger (hitrate), 0.487 for static.",
        APPS.len(),
        sc.objects,
        state >> 20,
        idle >> 20,
        100.0 * IDLE_SHARE,
        APPS.iter()
            .map(|a| format!("{} {} / {} us", a.name, a.skew, a.rebuild_us))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let systems = [
        Run::Ideal,
        Run::Coordinated(Policy::Midas),
        Run::Coordinated(Policy::Hitrate),
        Run::Coordinated(Policy::Static),
    ];
    let workloads = [Coordinate {
        objects: sc.objects,
        idle,
    }];
    // Each application's throughput in the ideal run, which the policies' are normalised to.
    let mut ideal_tput: Vec<f64> = Vec::new();
    let samples = Matrix::new(&systems, &workloads, 1).run(ctx, |ctx, _, _, &system| {
        let policy = match system {
            Run::Coordinated(p) => p.name(),
            Run::Ideal => {
                // Long enough that the dearest application's warm-up (about 30 s at full
                // scale) is over before the measured tail.
                let ideal_run = sc.run_s.min(75.0);
                let ideal = run_apps(&sc, None, Some(state * 5 / 4 + (16 << 20)), ideal_run)?;
                ideal_tput = ideal.iter().map(|t| t.throughput(sc.tail_s)).collect();
                let mut sample = Sample::new();
                for (a, &x) in APPS.iter().zip(&ideal_tput) {
                    sample = sample.median(format!("{} ops/s", a.name), "ops/s", x);
                }
                return Ok(sample.median("normalized throughput", "x", 1.0));
            }
        };
        let traces = run_apps(&sc, Some((policy, idle)), None, sc.run_s)?;
        // Every application's quarter-second lines (ops, hits, misses, budget, usage).
        let timeline: serde_json::Map<String, serde_json::Value> = APPS
            .iter()
            .zip(&traces)
            .map(|(a, t)| (a.name.to_string(), serde_json::Value::from(t.lines.clone())))
            .collect();
        std::fs::write(
            ctx.opts.out.join(format!("coord-coordinate-{policy}.json")),
            serde_json::to_vec(&timeline)?,
        )?;
        let mut sample = Sample::new();
        let mut norm = Vec::new();
        for (i, a) in APPS.iter().enumerate() {
            let x = traces[i].throughput(sc.tail_s);
            let n = if ideal_tput[i] > 0.0 {
                x / ideal_tput[i]
            } else {
                0.0
            };
            norm.push(n);
            let budget = traces[i].settled_budget(sc.tail_s) / (1 << 20) as f64;
            sample = sample
                .median(format!("{} ops/s", a.name), "ops/s", x)
                .median(format!("{} normalized", a.name), "x", n)
                .median(format!("{} budget MiB", a.name), "MiB", budget);
        }
        let overall = norm.iter().sum::<f64>() / norm.len() as f64;
        let band = (idle as f64 * 0.05).max((4 << 20) as f64);
        Ok(sample.median("normalized throughput", "x", overall).median(
            "converged after",
            "s",
            converged_at(&traces, sc.tail_s, band),
        ))
    })?;
    samples.report(ctx);
    Ok(())
}

/// Starts the coordinator (for a policy) and the four applications, and collects their
/// traces until they finish.
fn run_apps(
    sc: &Scale,
    policy: Option<(&str, u64)>,
    fixed_budget: Option<u64>,
    seconds: f64,
) -> Result<Vec<Trace>> {
    let exe = std::env::current_exe()?;
    let socket =
        std::env::temp_dir().join(format!("tidepool-bench-coord-{}.sock", std::process::id()));
    let coord = match policy {
        Some((policy, idle)) => Some(start_coord(&exe, policy, idle, &socket)?),
        None => None,
    };
    let budget = fixed_budget
        .or(policy.map(|(_, idle)| idle / APPS.len() as u64))
        .unwrap_or(0);
    let mut apps = Vec::new();
    for (i, a) in APPS.iter().enumerate() {
        let mut c = app_command(&exe, sc, (i, a), seconds, budget);
        if coord.is_some() {
            c.env(tidepool_soft::coord::ENV_SOCKET, &socket)
                .env("TIDEPOOL_APP", a.name)
                .env("TIDEPOOL_BENCH_JOIN_LATE", "1");
        } else {
            c.env_remove(tidepool_soft::coord::ENV_SOCKET);
        }
        apps.push(Guard(
            c.spawn().context("cannot start a bench application")?,
        ));
    }
    // One reader thread per application.
    let readers: Vec<_> = apps
        .iter_mut()
        .map(|g| {
            let out = g.0.stdout.take().expect("piped");
            std::thread::spawn(move || read_trace(out))
        })
        .collect();
    let mut traces = Vec::new();
    for (g, r) in apps.iter_mut().zip(readers) {
        let status = g.0.wait()?;
        if !status.success() {
            bail!("a bench application failed: {status}");
        }
        traces.push(r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?);
    }
    drop(coord);
    let _ = std::fs::remove_file(&socket);
    Ok(traces)
}

/// Starts `tidepool coord` with `policy` and `idle` bytes to share, at `socket`; returns it
/// once it says it listens, with its output (kept open: the coordinator's next line must not
/// meet a closed pipe).
fn start_coord(
    exe: &Path,
    policy: &str,
    idle: u64,
    socket: &Path,
) -> Result<(Guard, BufReader<ChildStdout>)> {
    let mut c = Command::new(exe);
    c.args([
        "coord",
        "--policy",
        policy,
        "--reserve",
        "64M",
        "--floor",
        "4M",
    ])
    .args(["--http", "127.0.0.1:0", "--max"])
    .arg(format!("{idle}"))
    .arg("--socket")
    .arg(socket)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    let mut child = Guard(c.spawn().context("cannot start tidepool coord")?);
    let mut first = String::new();
    let mut out = BufReader::new(child.0.stdout.take().expect("piped"));
    out.read_line(&mut first)?;
    if !first.starts_with("tidepool coord listening") {
        bail!("tidepool coord did not start: {first:?}");
    }
    Ok((child, out))
}

/// The command of application `a` (the `i`th) of the bench, starting on `budget` bytes.
fn app_command(
    exe: &Path,
    sc: &Scale,
    (i, a): (usize, &AppSpec),
    seconds: f64,
    budget: u64,
) -> Command {
    let job = Job::CoordApp(AppJob {
        name: a.name.to_owned(),
        objects: sc.objects,
        skew: a.skew,
        rebuild_us: a.rebuild_us,
        work_us: WORK_US,
        seconds,
        budget,
        seed: i as u64 + 1,
    });
    let mut c = job.command(exe);
    // Two applications to a CPU, each pinned: each gets half a CPU whatever the other
    // does, as if on a (slower) CPU of its own. Unpinned, the scheduler's balancing
    // moved shares between the four by up to 9% over a 40 s tail, in the ideal run as
    // in the others, and the normalised figures moved with it (0.80 to 0.88 for the
    // same policy).
    c.env(PIN_ENV, (i % tidepool_sys::online_cpus()).to_string())
        .env(SPIN_ENV, sc.spin.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Rebuild-cost warnings are the point of this bench, not news.
        .env("RUST_LOG", "error");
    c
}

/// An application's trace: the JSON lines it prints until it exits.
fn read_trace(out: ChildStdout) -> Trace {
    let mut t = Trace::default();
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            t.points.push((
                v["t"].as_f64().unwrap_or(0.0),
                v["ops"].as_u64().unwrap_or(0),
                v["budget"].as_u64().unwrap_or(0),
            ));
            t.lines.push(v);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace of budgets (MiB) sampled every quarter second from `start`.
    fn trace(start: f64, budgets: &[u64]) -> Trace {
        Trace {
            points: budgets
                .iter()
                .enumerate()
                .map(|(i, &b)| (start + i as f64 * 0.25, 0, b << 20))
                .collect(),
            lines: Vec::new(),
        }
    }

    #[test]
    fn convergence_is_when_budgets_last_left_their_settled_value_teardown_aside() {
        let band = (4 << 20) as f64;
        // Settles at 8 MiB from 1.0 s; the last sample, as the others leave, jumps to 18.
        let mut budgets = vec![18, 18, 18, 18];
        budgets.extend([8; 36]);
        let leaving = {
            let mut b = budgets.clone();
            b.push(18);
            b
        };
        budgets.push(8);
        assert_eq!(converged_at(&[trace(0.0, &budgets)], 8.0, band), 0.75);
        assert_eq!(converged_at(&[trace(0.0, &leaving)], 8.0, band), 0.75);
        // A budget that moves before the end still counts.
        let mut late = budgets.clone();
        late[30] = 20;
        assert_eq!(converged_at(&[trace(0.0, &late)], 8.0, band), 7.5);
    }
}
