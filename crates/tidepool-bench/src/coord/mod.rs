//! The `coord` suite: the soft-memory coordinator with several applications (Midas §7).
//!
//! (a) **Coordination** (Midas §7.1, in small): four synthetic applications, each a process
//! of its own, serve Zipfian requests over 4 KiB objects that cost something to rebuild, with
//! different skews and reconstruction costs (a storage server, a skewed social feed, an image
//! search whose features are dear to recompute, a cheap lookup), sharing idle memory worth 30%
//! of what caching everything would take (Midas: 20 of 67.5 GiB). Overall throughput is the
//! mean of each application's throughput normalised to its throughput with memory for all its
//! state (the *ideal* run: the same four processes at once, each with room for everything),
//! for the `midas`, `hitrate` and `static` policies, with the time the budgets took to settle.
//!
//! Work per request and reconstruction costs are spun on the CPU for a calibrated number of
//! iterations, not for wall-clock time: four processes share two CPUs here, and a spin timed
//! by the clock would count the time a process waited for a CPU as work.

use crate::{median, BenchOpts, Ctx, Suite};
use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct CoordSuite;

/// One synthetic application.
#[derive(Debug, Clone, Copy)]
struct AppSpec {
    name: &'static str,
    skew: f64,
    rebuild_us: f64,
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
/// The CPU a bench application pins itself to.
const PIN_ENV: &str = "TIDEPOOL_BENCH_CPU";
/// Spin iterations per microsecond, calibrated once by the harness.
const SPIN_ENV: &str = "TIDEPOOL_BENCH_SPIN";
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

impl Suite for CoordSuite {
    fn name(&self) -> &'static str {
        "coord"
    }
    fn about(&self) -> &'static str {
        "the soft-memory coordinator: four applications sharing idle memory, midas vs hitrate vs static, against the ideal"
    }
    fn steps(&self, _opts: &BenchOpts) -> u64 {
        6
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        // The applications on every CPU, as processes of a server would be (the harness pins
        // clients to CPU 0).
        let all: Vec<usize> = (0..tidepool_sys::online_cpus()).collect();
        tidepool_sys::set_affinity(0, &all).context("cannot unpin the applications")?;
        // TIDEPOOL_BENCH_PARTS=bc runs only some parts (a: coordinate, b: harvest, c: pressure).
        let parts = std::env::var("TIDEPOOL_BENCH_PARTS").unwrap_or_else(|_| "abc".into());
        if parts.contains('a') {
            coordinate(ctx)?;
        }
        if parts.contains('b') {
            match Cgroup::create("harvest", pressure_scale(&ctx.opts).limit) {
                Ok(cg) => harvest(ctx, &cg)?,
                Err(e) => ctx.note(format!("coord (b) skipped: {e:#}")),
            }
        }
        ctx.advance();
        if parts.contains('c') {
            match Cgroup::create("pressure", pressure_scale(&ctx.opts).limit) {
                Ok(cg) => pressure(ctx, &cg)?,
                Err(e) => ctx.note(format!("coord (c) skipped: {e:#}")),
            }
        }
        ctx.advance();
        Ok(())
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

/// Seconds until every budget stayed within `band` bytes of where it settled.
fn converged_at(traces: &[Trace], tail: f64, band: f64) -> f64 {
    let mut at: f64 = 0.0;
    for t in traces {
        let settled = t.settled_budget(tail);
        for p in &t.points {
            if (p.2 as f64 - settled).abs() > band {
                at = at.max(p.0);
            }
        }
    }
    at
}

fn coordinate(ctx: &mut Ctx) -> Result<()> {
    let mut sc = scale(&ctx.opts);
    sc.spin = Spinner::calibrate().iters_per_us;
    let state = sc.objects * OBJECT;
    let idle = ((state * APPS.len() as u64) as f64 * IDLE_SHARE) as u64 >> 21 << 21;
    let params = [
        ("objects", sc.objects as f64),
        ("idle_mib", (idle >> 20) as f64),
    ];
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
    // The ideal: room for everything, no coordinator.
    ctx.step("ideal: every application with room for all its state");
    // Long enough that the dearest application's warm-up (about 30 s at full scale) is over
    // before the measured tail.
    let ideal_run = sc.run_s.min(75.0);
    let ideal = run_apps(&sc, None, Some(state * 5 / 4 + (16 << 20)), ideal_run)?;
    let ideal_tput: Vec<f64> = ideal.iter().map(|t| t.throughput(sc.tail_s)).collect();
    for (a, &x) in APPS.iter().zip(&ideal_tput) {
        ctx.report.push(
            "ideal",
            "coordinate",
            &format!("{} ops/s", a.name),
            x,
            "ops/s",
            &params,
        );
    }
    ctx.report.push(
        "ideal",
        "coordinate",
        "normalized throughput",
        1.0,
        "x",
        &params,
    );
    ctx.advance();
    for policy in ["midas", "hitrate", "static"] {
        ctx.step(format!("{policy}: four applications, {} MiB", idle >> 20));
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
        let mut norm = Vec::new();
        for (i, a) in APPS.iter().enumerate() {
            let x = traces[i].throughput(sc.tail_s);
            let n = if ideal_tput[i] > 0.0 {
                x / ideal_tput[i]
            } else {
                0.0
            };
            norm.push(n);
            ctx.report.push(
                policy,
                "coordinate",
                &format!("{} ops/s", a.name),
                x,
                "ops/s",
                &params,
            );
            ctx.report.push(
                policy,
                "coordinate",
                &format!("{} normalized", a.name),
                n,
                "x",
                &params,
            );
            ctx.report.push(
                policy,
                "coordinate",
                &format!("{} budget MiB", a.name),
                traces[i].settled_budget(sc.tail_s) / (1 << 20) as f64,
                "MiB",
                &params,
            );
        }
        let overall = norm.iter().sum::<f64>() / norm.len() as f64;
        ctx.report.push(
            policy,
            "coordinate",
            "normalized throughput",
            overall,
            "x",
            &params,
        );
        let band = (idle as f64 * 0.05).max((4 << 20) as f64);
        ctx.report.push(
            policy,
            "coordinate",
            "converged after",
            converged_at(&traces, sc.tail_s, band),
            "s",
            &params,
        );
        ctx.advance();
    }
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
    let mut coord = None;
    if let Some((policy, idle)) = policy {
        let mut c = Command::new(&exe);
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
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let mut child = Guard(c.spawn().context("cannot start tidepool coord")?);
        let mut first = String::new();
        let mut out = BufReader::new(child.0.stdout.take().expect("piped"));
        out.read_line(&mut first)?;
        if !first.starts_with("tidepool coord listening") {
            bail!("tidepool coord did not start: {first:?}");
        }
        // Kept open: the coordinator's next line must not meet a closed pipe.
        coord = Some((child, out));
    }
    let mut apps = Vec::new();
    for (i, a) in APPS.iter().enumerate() {
        let mut c = Command::new(&exe);
        c.args(["bench-worker", "coord-app"])
            .arg(a.name)
            .arg(sc.objects.to_string())
            .arg(a.skew.to_string())
            .arg(a.rebuild_us.to_string())
            .arg(WORK_US.to_string())
            .arg(seconds.to_string())
            .arg(
                fixed_budget
                    .or(policy.map(|(_, idle)| idle / APPS.len() as u64))
                    .unwrap_or(0)
                    .to_string(),
            )
            .arg((i as u64 + 1).to_string())
            // Two applications to a CPU, each pinned: each gets half a CPU whatever the other
            // does, as if on a (slower) CPU of its own. Unpinned, the scheduler's balancing
            // moved shares between the four by up to 9% over a 40 s tail, in the ideal run as
            // in the others, and the normalised figures moved with it (0.80 to 0.88 for the
            // same policy).
            .env(PIN_ENV, (i % tidepool_sys::online_cpus()).to_string())
            .env(SPIN_ENV, sc.spin.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Rebuild-cost warnings are the point of this bench, not news.
            .env("RUST_LOG", "error");
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
            std::thread::spawn(move || {
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
            })
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

/// Kills a child process when dropped (a failed run leaves nothing behind).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- (b) harvesting and (c) pressure, in a memory cgroup ------------------------------------

/// Sizes of the cgroup parts.
struct PressureScale {
    /// The cgroup's memory limit (the "machine").
    limit: u64,
    reserve: u64,
    objects: u64,
    /// Seconds between the events of a run.
    phase_s: f64,
}

fn pressure_scale(opts: &BenchOpts) -> PressureScale {
    if opts.quick {
        PressureScale {
            limit: 1 << 30,
            reserve: 128 << 20,
            objects: 160_000,
            phase_s: 8.0,
        }
    } else {
        PressureScale {
            limit: 3 << 30,
            reserve: 256 << 20,
            objects: 512_000,
            phase_s: 15.0,
        }
    }
}

/// A v1 memory cgroup with no swap, standing for a machine whose memory is `limit`; removed
/// when dropped.
struct Cgroup {
    dir: std::path::PathBuf,
}

impl Cgroup {
    fn create(name: &str, limit: u64) -> Result<Cgroup> {
        let root = std::path::Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").exists() {
            bail!(
                "needs the cgroup v1 memory controller at {}",
                root.display()
            );
        }
        let dir = root.join(format!("tidepool-bench-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create {} (root needed)", dir.display()))?;
        let cg = Cgroup { dir };
        cg.set("memory.limit_in_bytes", limit)?;
        // No swap: soft memory must give way by itself, or something is OOM-killed.
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            cg.set("memory.memsw.limit_in_bytes", limit)?;
        }
        Ok(cg)
    }

    fn set(&self, file: &str, v: u64) -> Result<()> {
        std::fs::write(self.dir.join(file), v.to_string())
            .with_context(|| format!("cannot set {file}"))
    }

    fn read(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Limit less usage: what the "machine" has left.
    fn headroom(&self) -> u64 {
        self.read("memory.limit_in_bytes")
            .saturating_sub(self.read("memory.usage_in_bytes"))
    }

    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `tidepool ARGS` started inside the cgroup (it joins before anything runs).
    fn command(&self, args: &[String]) -> Result<Command> {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$1" && shift && exec "$@""#)
            .arg("sh")
            .arg(self.dir.join("cgroup.procs"))
            .arg(std::env::current_exe()?)
            .args(args);
        Ok(c)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What the sampler saw: (seconds, headroom) every 10 ms, and the longest stretch under the
/// reserve.
#[derive(Debug, Default)]
struct Watch {
    points: Vec<(f64, u64)>,
    longest_below: f64,
}

/// A thread watching a cgroup's headroom until finished.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Watch>,
}

impl Sampler {
    fn start(cg: &Cgroup, reserve: u64, t0: Instant) -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, dir) = (stop.clone(), cg.dir.clone());
        let thread = std::thread::spawn(move || {
            let cg = Cgroup { dir };
            let w = watch(&cg, reserve, &st, t0);
            std::mem::forget(cg); // the caller's guard removes it
            w
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Result<Watch> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("sampler panicked"))
    }
}

fn watch(cg: &Cgroup, reserve: u64, stop: &std::sync::atomic::AtomicBool, t0: Instant) -> Watch {
    let mut w = Watch::default();
    let mut below_since: Option<f64> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t = t0.elapsed().as_secs_f64();
        let h = cg.headroom();
        w.points.push((t, h));
        match (h < reserve, below_since) {
            (true, None) => below_since = Some(t),
            (false, Some(s)) => {
                w.longest_below = w.longest_below.max(t - s);
                below_since = None;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(s) = below_since {
        w.longest_below = w.longest_below.max(t0.elapsed().as_secs_f64() - s);
    }
    w
}

/// A thread collecting an application's JSON lines: (seconds, ops, hits, misses, budget,
/// usage) each.
type AppReader = std::thread::JoinHandle<Vec<[f64; 6]>>;

fn read_app(out: std::process::ChildStdout) -> AppReader {
    std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
            .map(|v| {
                ["t", "ops", "hits", "misses", "budget", "usage"]
                    .map(|k| v[k].as_f64().unwrap_or(0.0))
            })
            .collect()
    })
}

/// Throughput, hit rate and mean usage of an application between two times.
fn phase(points: &[[f64; 6]], from: f64, to: f64) -> (f64, f64, f64) {
    let inside: Vec<&[f64; 6]> = points
        .iter()
        .filter(|p| p[0] >= from && p[0] <= to)
        .collect();
    let (Some(a), Some(b)) = (inside.first(), inside.last()) else {
        return (0.0, 0.0, 0.0);
    };
    let dt = (b[0] - a[0]).max(1e-9);
    let (h, m) = (b[2] - a[2], b[3] - a[3]);
    let usage = inside.iter().map(|p| p[5]).sum::<f64>() / inside.len() as f64;
    (
        (b[1] - a[1]) / dt,
        if h + m > 0.0 { h / (h + m) } else { 0.0 },
        usage,
    )
}

/// Rows of an application's throughput, hit rate and soft memory in each (name, from, to)
/// phase of a run.
fn push_phases(
    ctx: &mut Ctx,
    workload: &str,
    params: &[(&str, f64)],
    trace: &[[f64; 6]],
    phases: &[(&str, f64, f64)],
) {
    for &(name, from, to) in phases {
        let (tput, hit, usage) = phase(trace, from, to);
        let r = &mut ctx.report;
        r.push(
            "tidepool",
            workload,
            &format!("{name}: ops/s"),
            tput,
            "ops/s",
            params,
        );
        r.push(
            "tidepool",
            workload,
            &format!("{name}: hit rate"),
            hit,
            "",
            params,
        );
        let mib = usage / (1 << 20) as f64;
        r.push(
            "tidepool",
            workload,
            &format!("{name}: soft MiB"),
            mib,
            "MiB",
            params,
        );
    }
}

/// The coordinator and one application in the cgroup; returns them and the app's trace reader.
fn start_in(
    cg: &Cgroup,
    ps: &PressureScale,
    seconds: f64,
    log: &std::path::Path,
) -> Result<(Guard, Guard, AppReader)> {
    let socket = std::env::temp_dir().join(format!(
        "tidepool-bench-coord-cg-{}.sock",
        std::process::id()
    ));
    let mut c = cg.command(&[
        "coord".into(),
        "--reserve".into(),
        ps.reserve.to_string(),
        "--floor".into(),
        "4M".into(),
        "--socket".into(),
        socket.display().to_string(),
    ])?;
    // The coordinator's log (joins, departures, cuts) is kept beside the results.
    c.stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .env(
            "RUST_LOG",
            std::env::var("TIDEPOOL_BENCH_COORD_LOG")
                .unwrap_or_else(|_| "tidepool_coord=info".into()),
        );
    let mut coord = Guard(c.spawn().context("cannot start tidepool coord")?);
    let mut first = String::new();
    let out = coord.0.stdout.take().expect("piped");
    let mut out = BufReader::new(out);
    out.read_line(&mut first)?;
    if !first.starts_with("tidepool coord listening") {
        bail!("tidepool coord did not start: {first:?}");
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let mut c = cg.command(&[
        "bench-worker".into(),
        "coord-app".into(),
        "cache".into(),
        ps.objects.to_string(),
        "0.99".into(),
        "20".into(),
        "10".into(),
        seconds.to_string(),
        "0".into(),
        "1".into(),
    ])?;
    c.stdout(Stdio::piped())
        .env("RUST_LOG", "error")
        .env(tidepool_soft::coord::ENV_SOCKET, &socket)
        .env("TIDEPOOL_APP", "cache");
    let mut app = Guard(c.spawn().context("cannot start the application")?);
    let reader = read_app(app.0.stdout.take().expect("piped"));
    Ok((coord, app, reader))
}

/// `tidepool bench-worker antagonist` in the cgroup: takes `bytes` at `mib_per_s` (0: as fast
/// as it can) after `delay_s`, and holds them for `hold_s`.
fn antagonist(cg: &Cgroup, bytes: u64, mib_per_s: f64, delay_s: f64, hold_s: f64) -> Result<Guard> {
    let mut c = cg.command(&[
        "bench-worker".into(),
        "antagonist".into(),
        bytes.to_string(),
        mib_per_s.to_string(),
        delay_s.to_string(),
        hold_s.to_string(),
    ])?;
    c.stdout(Stdio::null()).stderr(Stdio::inherit());
    Ok(Guard(c.spawn().context("cannot start the antagonist")?))
}

/// (c) An antagonist takes half the memory at a moderate rate, gives it back, then takes it as
/// fast as it can.
fn pressure(ctx: &mut Ctx, cg: &Cgroup) -> Result<()> {
    let ps = pressure_scale(&ctx.opts);
    let p = ps.phase_s;
    // Warm-up (the application builds its state), moderate, hold, free, fast, hold, free.
    let (moderate_at, fast_at) = (2.0 * p, 5.0 * p);
    let take = ps.limit / 2;
    let rate = (take >> 20) as f64 / p; // over one phase
    let run = 7.0 * p;
    ctx.step(format!(
        "pressure: {} MiB taken at {rate:.0} MiB/s, then as fast as possible, in a {} MiB cgroup",
        take >> 20,
        ps.limit >> 20
    ));
    let t0 = Instant::now();
    let log = ctx.opts.out.join("coord-pressure.log");
    let (coord, mut app, reader) = start_in(cg, &ps, run, &log)?;
    let sampler = Sampler::start(cg, ps.reserve, t0);
    let mut moderate = antagonist(cg, take, rate, moderate_at, p)?;
    let mut fast = antagonist(cg, take, 0.0, fast_at, p)?;
    let app_status = app.0.wait()?;
    let (m, f) = (moderate.0.wait()?, fast.0.wait()?);
    let w = sampler.finish()?;
    drop(coord);
    let trace = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    let params = [
        ("limit_mib", (ps.limit >> 20) as f64),
        ("reserve_mib", (ps.reserve >> 20) as f64),
    ];
    let kills = cg.oom_kills();
    let killed = [app_status, m, f].iter().filter(|s| !s.success()).count();
    ctx.report.push(
        "tidepool",
        "pressure",
        "OOM kills",
        kills as f64,
        "",
        &params,
    );
    ctx.report.push(
        "tidepool",
        "pressure",
        "processes that failed",
        killed as f64,
        "",
        &params,
    );
    ctx.report.push(
        "tidepool",
        "pressure",
        "longest under reserve",
        w.longest_below * 1e3,
        "ms",
        &params,
    );
    // The app's time base starts a little after t0; near enough at these scales.
    let phases = [
        ("before", moderate_at - p / 2.0, moderate_at),
        ("moderate, held", moderate_at + p, moderate_at + 2.0 * p),
        ("between", fast_at - p / 2.0, fast_at),
        ("fast, held", fast_at + p / 3.0, fast_at + p),
        ("after", run - p / 2.0, run),
    ];
    push_phases(ctx, "pressure", &params, &trace, &phases);
    write_timeline(ctx, "pressure", &w, &trace, ps.reserve)?;
    Ok(())
}

/// (b) Idle memory appears during the run: two balloons holding a third of the memory each
/// are let go one after the other.
fn harvest(ctx: &mut Ctx, cg: &Cgroup) -> Result<()> {
    let ps = pressure_scale(&ctx.opts);
    let p = ps.phase_s;
    let balloon = ps.limit / 3;
    let (first, second, run) = (2.0 * p, 4.0 * p, 6.0 * p);
    ctx.step(format!(
        "harvest: two {} MiB balloons let go",
        balloon >> 20
    ));
    let t0 = Instant::now();
    let mut b1 = antagonist(cg, balloon, 0.0, 0.0, first)?;
    let mut b2 = antagonist(cg, balloon, 0.0, 0.0, second)?;
    std::thread::sleep(Duration::from_secs(2)); // the balloons fill before the application starts
    let log = ctx.opts.out.join("coord-harvest.log");
    let (coord, mut app, reader) = start_in(cg, &ps, run, &log)?;
    let sampler = Sampler::start(cg, ps.reserve, t0);
    let status = app.0.wait()?;
    let _ = (b1.0.wait(), b2.0.wait());
    let w = sampler.finish()?;
    drop(coord);
    let trace = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    let params = [
        ("limit_mib", (ps.limit >> 20) as f64),
        ("balloon_mib", (balloon >> 20) as f64),
    ];
    ctx.report.push(
        "tidepool",
        "harvest",
        "OOM kills",
        cg.oom_kills() as f64,
        "",
        &params,
    );
    ctx.report.push(
        "tidepool",
        "harvest",
        "application failed",
        (!status.success()) as u8 as f64,
        "",
        &params,
    );
    let shift = 2.0; // the app started about two seconds after t0
    let phases = [
        ("two balloons", first - p / 2.0 - shift, first - shift),
        ("one balloon", second - p / 2.0 - shift, second - shift),
        ("none", run - p / 2.0, run),
    ];
    push_phases(ctx, "harvest", &params, &trace, &phases);
    // How long soft memory took to take up each balloon's worth (90% of the step).
    for (name, at, until) in [
        ("first balloon", first - shift, second - shift),
        ("second balloon", second - shift, run),
    ] {
        let before = phase(&trace, at - 1.0, at).2;
        let after = phase(&trace, until - p / 4.0, until).2;
        let target = before + 0.9 * (after - before);
        let took = trace
            .iter()
            .find(|x| x[0] >= at && x[5] >= target)
            .map_or(f64::NAN, |x| x[0] - at);
        ctx.report.push(
            "tidepool",
            "harvest",
            &format!("{name}: s to 90%"),
            took,
            "s",
            &params,
        );
    }
    write_timeline(ctx, "harvest", &w, &trace, ps.reserve)?;
    Ok(())
}

/// Writes the run's timeline as JSON and draws it (headroom, soft memory, hit rate).
fn write_timeline(
    ctx: &mut Ctx,
    part: &str,
    w: &Watch,
    trace: &[[f64; 6]],
    reserve: u64,
) -> Result<()> {
    let json = ctx.opts.out.join(format!("coord-{part}.json"));
    let headroom: Vec<(f64, u64)> = w.points.iter().step_by(10).copied().collect();
    let app: Vec<[f64; 6]> = trace.to_vec();
    std::fs::write(
        &json,
        serde_json::to_string(&serde_json::json!({
            "part": part, "reserve": reserve, "headroom": headroom, "app": app,
        }))?,
    )?;
    let png = ctx.opts.out.join(format!("coord-{part}.png"));
    let script = std::env::temp_dir().join(format!("tidepool-timeline-{}.py", std::process::id()));
    std::fs::write(&script, TIMELINE_PY)?;
    let out = Command::new("python3")
        .arg(&script)
        .arg(&json)
        .arg(&png)
        .output();
    let _ = std::fs::remove_file(&script);
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => ctx.note(format!(
            "no {part} timeline drawn: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => ctx.note(format!("no {part} timeline drawn: {e}")),
    }
    Ok(())
}

const TIMELINE_PY: &str = r#"
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
h = d["headroom"]
a.plot([p[0] for p in h], [p[1] / 2**20 for p in h], label="headroom (idle)")
app = d["app"]
t0 = 0
a.plot([p[0] for p in app], [p[5] / 2**20 for p in app], label="soft memory held")
a.plot([p[0] for p in app], [p[4] / 2**20 for p in app], label="budget", linestyle=":")
a.axhline(d["reserve"] / 2**20, color="red", linewidth=0.8, label="reserve")
a.set_ylabel("MiB"); a.legend(loc="upper right", fontsize=8)
a.set_title("coord " + d["part"])
t, r = [], []
for p, q in zip(app, app[1:]):
    dh, dm = q[2] - p[2], q[3] - p[3]
    if q[0] - p[0] >= 0.2 and q[1] > p[1]:
        t.append(q[0]); r.append((q[1] - p[1]) / (q[0] - p[0]))
b.plot(t, r, label="ops/s"); b.set_ylabel("ops/s"); b.set_xlabel("seconds")
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=100)
"#;

/// `tidepool bench-worker antagonist BYTES MIB_PER_S DELAY_S HOLD_S`: waits, takes BYTES of
/// memory (at MIB_PER_S, or as fast as it can with 0), holds it, and exits.
pub fn antagonist_worker(args: &[String]) -> Result<()> {
    let [bytes, rate, delay, hold] = args else {
        bail!("usage: bench-worker antagonist BYTES MIB_PER_S DELAY_S HOLD_S");
    };
    let bytes: u64 = bytes.parse().context("BYTES")?;
    let rate: f64 = rate.parse().context("MIB_PER_S")?;
    std::thread::sleep(Duration::from_secs_f64(delay.parse().context("DELAY_S")?));
    let t = Instant::now();
    let chunk = 16u64 << 20;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut taken = 0u64;
    while taken < bytes {
        // Zeroed pages from mmap: memory arrives as each page is touched.
        let mut c = vec![0u8; chunk.min(bytes - taken) as usize];
        for p in c.chunks_mut(4096) {
            p[0] = 1;
        }
        taken += c.len() as u64;
        held.push(c);
        if rate > 0.0 {
            let due = Duration::from_secs_f64((taken >> 20) as f64 / rate);
            if let Some(wait) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    eprintln!(
        "antagonist: {} MiB in {:.0} ms",
        taken >> 20,
        t.elapsed().as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_secs_f64(hold.parse().context("HOLD_S")?));
    std::hint::black_box(&held);
    Ok(())
}

// ---- the application ------------------------------------------------------------------------

/// Spins for CPU time, not wall-clock time: iterations calibrated against this thread's CPU
/// clock.
struct Spinner {
    iters_per_us: f64,
}

impl Spinner {
    fn calibrate() -> Spinner {
        let cpu = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
        };
        let mut best = f64::MAX;
        for _ in 0..5 {
            let n = 2_000_000u64;
            let t0 = cpu();
            spin_iters(n);
            let us = cpu() - t0;
            best = best.min(us / n as f64);
        }
        Spinner {
            iters_per_us: 1.0 / best,
        }
    }

    fn spin(&self, us: f64) {
        spin_iters((us * self.iters_per_us) as u64);
    }
}

fn spin_iters(n: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x);
}

/// `tidepool bench-worker coord-app NAME OBJECTS SKEW REBUILD_US WORK_US SECONDS BUDGET SEED`:
/// one synthetic application. With TIDEPOOL_COORD set the coordinator sets the budget (with
/// TIDEPOOL_BENCH_JOIN_LATE too, only after a warm-up on BUDGET; 0 is 8 MiB). Prints a JSON line every quarter second: seconds, operations, hits,
/// misses, budget, bytes held.
pub fn worker(args: &[String]) -> Result<()> {
    let [_name, objects, skew, rebuild_us, work_us, seconds, budget, seed] = args else {
        bail!("usage: bench-worker coord-app NAME OBJECTS SKEW REBUILD_US WORK_US SECONDS BUDGET SEED");
    };
    let objects: u64 = objects.parse().context("OBJECTS")?;
    let skew: f64 = skew.parse().context("SKEW")?;
    let rebuild_us: f64 = rebuild_us.parse().context("REBUILD_US")?;
    let work_us: f64 = work_us.parse().context("WORK_US")?;
    let seconds: f64 = seconds.parse().context("SECONDS")?;
    let budget: u64 = budget.parse().context("BUDGET")?;
    let seed: u64 = seed.parse().context("SEED")?;
    if let Some(cpu) = std::env::var(PIN_ENV).ok().and_then(|c| c.parse().ok()) {
        // Before any thread starts: the evacuator and the coordinator link inherit it.
        tidepool_sys::set_affinity(0, &[cpu]).context("cannot pin the application")?;
    }
    // The clock starts before the warm-up: applications started together end together, and
    // measurements of their tails overlap.
    let start = Instant::now();
    let spinner = std::sync::Arc::new(
        match std::env::var(SPIN_ENV).ok().and_then(|s| s.parse().ok()) {
            Some(iters_per_us) if iters_per_us > 0.0 => Spinner { iters_per_us },
            _ => Spinner::calibrate(),
        },
    );
    // With TIDEPOOL_BENCH_JOIN_LATE, the application warms up on BUDGET alone and joins the
    // coordinator afterwards (as in Midas §7.1, where every application starts with the same
    // soft memory): a warm-up scan has no ghost hits, and would look worth nothing to the
    // coordinator. Otherwise the arena joins as any program does, when it is made.
    let coordinator = if std::env::var_os("TIDEPOOL_BENCH_JOIN_LATE").is_some() {
        let c = tidepool_soft::coord::CoordConfig::from_env();
        std::env::remove_var(tidepool_soft::coord::ENV_SOCKET);
        c
    } else {
        None
    };
    let arena = tidepool_soft::SoftArena::new(tidepool_soft::ArenaConfig {
        budget: if budget == 0 {
            8 << 20
        } else {
            budget as usize
        },
        max_bytes: 4 << 30,
    })?;
    // Free-segment watermarks of 1 and 2% (at least one and two segments): small budgets
    // keep more of themselves for objects.
    arena.start_evacuator(0.01, 0.02)?;
    let s = spinner.clone();
    let values: tidepool_soft::SoftVec<[u8; 4096]> =
        tidepool_soft::SoftVec::new(&arena, objects as usize, move |i| {
            s.spin(rebuild_us);
            let mut v = [0u8; 4096];
            v[..8].copy_from_slice(&(i as u64).to_le_bytes());
            v
        });
    // Warm-up: every object built once, as a service's cache is warm before it is measured
    // (with a budget too small for all, the last ones built stay).
    for i in 0..objects as usize {
        std::hint::black_box(values.get(i));
    }
    if let Some(c) = coordinator {
        arena.join_coordinator(c)?;
    }
    let zipf = rand_distr::Zipf::new(objects, skew).context("Zipf parameters")?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut next_print = Duration::ZERO;
    let mut ops = 0u64;
    let mut sum = 0u64;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    loop {
        let el = start.elapsed();
        if el >= next_print {
            let st = values.stats();
            writeln!(
                out,
                "{{\"t\":{:.3},\"ops\":{ops},\"hits\":{},\"misses\":{},\"budget\":{},\"usage\":{}}}",
                el.as_secs_f64(),
                st.hits,
                st.misses,
                arena.budget(),
                arena.usage()
            )?;
            out.flush()?;
            next_print += Duration::from_millis(250);
            if el.as_secs_f64() >= seconds {
                break;
            }
        }
        for _ in 0..16 {
            use rand_distr::Distribution;
            let rank = zipf.sample(&mut rng) as u64 - 1;
            let key = rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % objects;
            let v = values.get(key as usize);
            sum = sum.wrapping_add(v[0] as u64);
            spinner.spin(work_us);
            ops += 1;
        }
    }
    std::hint::black_box(sum);
    Ok(())
}
