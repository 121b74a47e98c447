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
/// Work per request, microseconds of CPU.
const WORK_US: f64 = 10.0;
/// Bytes an object takes in soft memory (4 KiB and its header).
const OBJECT: u64 = 4096 + 16;
/// Idle memory, as a share of what caching every application's state would take.
const IDLE_SHARE: f64 = 0.3;

struct Scale {
    objects: u64,
    /// Seconds of a policy run and of its measured tail.
    run_s: f64,
    tail_s: f64,
}

fn scale(opts: &BenchOpts) -> Scale {
    if opts.quick {
        Scale {
            objects: 8192,
            run_s: 20.0,
            tail_s: 8.0,
        }
    } else {
        Scale {
            objects: 65536,
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
        4
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        coordinate(ctx)
    }
}

/// What one application did: (seconds, ops, budget bytes) every quarter second.
#[derive(Debug, Default, Clone)]
struct Trace {
    points: Vec<(f64, u64, u64)>,
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
    // Four applications on every CPU, as processes of a server would be (the harness pins
    // clients to CPU 0).
    let all: Vec<usize> = (0..tidepool_sys::online_cpus()).collect();
    tidepool_sys::set_affinity(0, &all).context("cannot unpin the applications")?;
    let sc = scale(&ctx.opts);
    let state = sc.objects * OBJECT;
    let idle = ((state * APPS.len() as u64) as f64 * IDLE_SHARE) as u64 >> 21 << 21;
    let params = [
        ("objects", sc.objects as f64),
        ("idle_mib", (idle >> 20) as f64),
    ];
    ctx.report.notes.push(format!(
        "coord (a): {} applications of {} 4 KiB objects each ({} MiB of state each), sharing {} MiB \
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
    let ideal_run = sc.run_s.min(60.0);
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
            .arg(fixed_budget.unwrap_or(0).to_string())
            .arg((i as u64 + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Rebuild-cost warnings are the point of this bench, not news.
            .env("RUST_LOG", "error");
        if coord.is_some() {
            c.env(tidepool_soft::coord::ENV_SOCKET, &socket)
                .env("TIDEPOOL_APP", a.name);
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
/// one synthetic application. BUDGET 0 leaves the budget to the coordinator named by
/// TIDEPOOL_COORD. Prints a JSON line every quarter second: seconds, operations, hits,
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
    let spinner = std::sync::Arc::new(Spinner::calibrate());
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
    let zipf = rand_distr::Zipf::new(objects, skew).context("Zipf parameters")?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let start = Instant::now();
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
