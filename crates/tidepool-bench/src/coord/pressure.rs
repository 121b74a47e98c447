//! Parts (b) harvesting (idle memory appearing during the run) and (c) pressure (an antagonist
//! taking memory, moderately then as fast as it can), one application and the coordinator in a
//! memory cgroup.

use super::app::{read_json_lines, start_coordinator, Guard};
use super::cgroup::{pressure_scale, Cgroup, PressureScale, Sampler, Watch};
use crate::harness::Ctx;
use crate::job::{AntagonistJob, AppJob, Job};
use anyhow::{Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A thread collecting an application's JSON lines: (seconds, ops, hits, misses, budget,
/// usage) each.
type AppReader = std::thread::JoinHandle<Vec<[f64; 6]>>;

fn read_app(out: std::process::ChildStdout) -> AppReader {
    read_json_lines(out, ["t", "ops", "hits", "misses", "budget", "usage"])
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
    c.stderr(std::fs::File::create(log)?).env(
        "RUST_LOG",
        std::env::var("TIDEPOOL_BENCH_COORD_LOG").unwrap_or_else(|_| "tidepool_coord=info".into()),
    );
    let (coord, _) = start_coordinator(c).with_context(|| {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        format!("its log {}: {}", log.display(), said.trim())
    })?;
    let job = Job::CoordApp(AppJob {
        name: "cache".into(),
        objects: ps.objects,
        skew: 0.99,
        rebuild_us: 20.0,
        work_us: 10.0,
        seconds,
        budget: 0,
        seed: 1,
    });
    let mut c = cg.command(&job.args())?;
    c.stdout(Stdio::piped())
        .env("RUST_LOG", "error")
        .env(tidepool_soft::coord::ENV_SOCKET, &socket)
        .env("TIDEPOOL_APP", "cache");
    let mut app = Guard(c.spawn().context("cannot start the application")?);
    let reader = read_app(app.0.stdout.take().expect("piped"));
    Ok((coord, app, reader))
}

/// `tidepool bench-worker`'s `antagonist` job in the cgroup: takes `bytes` at `mib_per_s` (0: as
/// fast as it can) after `delay_s`, and holds them for `hold_s`.
fn antagonist(cg: &Cgroup, bytes: u64, mib_per_s: f64, delay_s: f64, hold_s: f64) -> Result<Guard> {
    let job = Job::Antagonist(AntagonistJob {
        bytes,
        mib_per_s,
        delay_s,
        hold_s,
    });
    let mut c = cg.command(&job.args())?;
    c.stdout(Stdio::null()).stderr(Stdio::inherit());
    Ok(Guard(c.spawn().context("cannot start the antagonist")?))
}

/// (c) An antagonist takes half the memory at a moderate rate, gives it back, then takes it as
/// fast as it can.
pub(super) fn pressure(ctx: &mut Ctx, cg: &Cgroup) -> Result<()> {
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
pub(super) fn harvest(ctx: &mut Ctx, cg: &Cgroup) -> Result<()> {
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
