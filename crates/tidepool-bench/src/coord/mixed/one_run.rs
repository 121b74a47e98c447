//! One run of the mixed workload: for a coordinated run the coordinator, the four programs
//! and the antagonist in a fresh cgroup, all-local the programs alone, until they finish; what
//! each program did, and (coordinated) the budgets the coordinator gave them.

use super::{Kind, Outcome, Scale, Setup, OBJECT};
use crate::coord::app::{read_json_lines, start_coordinator, Guard, PIN_ENV, SPEED_ENV, SPIN_ENV};
use crate::coord::cgroup::Cgroup;
use crate::harness::{median, Ctx};
use crate::job::{AntagonistJob, AppJob, Job, PagedJob, Walk};
use crate::node::NodeProcess;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One run: the programs (and for a coordinated run the coordinator and the antagonist, in
/// a fresh cgroup) until they finish.
pub(super) fn run_once(
    ctx: &mut Ctx,
    sc: &Scale,
    node: &NodeProcess,
    setup: Setup,
    tag: &str,
) -> Result<Outcome> {
    let run = Run::new(ctx, sc, node, setup, tag)?;
    let (coord, http) = match setup {
        Setup::Coordinated { policy, .. } => {
            let (g, http) = run.start_coordinator(policy)?;
            (Some(g), http)
        }
        Setup::AllLocal => (None, None),
    };
    let mut children = Vec::new();
    for (i, p) in sc.programs.iter().enumerate() {
        let mut c = run.program(i)?;
        let child = Guard(
            c.spawn()
                .with_context(|| format!("cannot start program {}", p.name))?,
        );
        children.push(child);
    }
    let pids: Vec<u32> = children.iter().map(|g| g.0.id()).collect();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|g| read_json_lines(g.0.stdout.take().expect("piped"), ["t", "ops"]))
        .collect();
    let mut antagonist = run.start_antagonist()?;
    let stop = Arc::new(AtomicBool::new(false));
    let poller = http.map(|addr| {
        let (stop, pids, from) = (stop.clone(), pids.clone(), sc.from_s);
        std::thread::spawn(move || poll_budgets(&addr, &pids, from, &stop))
    });
    // A program still running long after its time is stuck: it is killed and counted as
    // failed, and the suite goes on.
    let deadline = Instant::now() + Duration::from_secs_f64(sc.run_s + 120.0);
    let mut failed = 0;
    let names = sc.programs.iter().map(|p| p.name).chain(["antagonist"]);
    for (g, name) in children.iter_mut().chain(antagonist.as_mut()).zip(names) {
        if !exits_by(&mut g.0, deadline, name)? {
            failed += 1;
        }
    }
    stop.store(true, Relaxed);
    let budgets = match poller {
        Some(p) => {
            let (budgets, states) = p
                .join()
                .map_err(|_| anyhow::anyhow!("budget poller panicked"))?;
            // The coordinator's state every half second, to see where a split went.
            std::fs::write(
                run.out_dir.join(format!("coord-mixed-{tag}-states.json")),
                serde_json::to_vec(&states)?,
            )?;
            budgets
        }
        None => [0.0; 4],
    };
    let oom_kills = run.cg.as_ref().map_or(0, |cg| cg.oom_kills());
    drop(coord);
    drop(children);
    let _ = std::fs::remove_file(&run.socket);
    let mut ops_per_s = [0.0; 4];
    for (i, r) in readers.into_iter().enumerate() {
        let points = r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        ops_per_s[i] = throughput(&points, sc.from_s);
    }
    Ok(Outcome {
        ops_per_s,
        oom_kills,
        failed,
        budgets,
    })
}

/// What starting a run's processes needs: the run's sizes and setup, where its logs go, its
/// cgroup (coordinated runs), the coordinator's socket, and where budgets start.
struct Run<'a> {
    sc: &'a Scale,
    node: &'a NodeProcess,
    setup: Setup,
    tag: &'a str,
    exe: PathBuf,
    out_dir: PathBuf,
    cg: Option<Cgroup>,
    socket: PathBuf,
    /// Where budgets start: an even share of what the machine leaves.
    start_budget: u64,
}

impl<'a> Run<'a> {
    /// A run of `setup` named `tag`: its cgroup made if it is coordinated.
    fn new(
        ctx: &Ctx,
        sc: &'a Scale,
        node: &'a NodeProcess,
        setup: Setup,
        tag: &'a str,
    ) -> Result<Run<'a>> {
        let exe = std::env::current_exe()?;
        let out_dir = ctx.opts.out.clone();
        let cg = match setup {
            Setup::AllLocal => None,
            Setup::Coordinated { .. } => Some(Cgroup::create(&format!("mixed-{tag}"), sc.limit)?),
        };
        let socket =
            std::env::temp_dir().join(format!("tidepool-bench-mixed-{}.sock", std::process::id()));
        Ok(Run {
            sc,
            node,
            setup,
            tag,
            exe,
            out_dir,
            cg,
            socket,
            start_budget: ((sc.limit - sc.reserve) / 5) >> 21 << 21,
        })
    }

    /// The log file of `what` in this run.
    fn log(&self, what: &str) -> Result<std::fs::File> {
        Ok(std::fs::File::create(
            self.out_dir
                .join(format!("coord-mixed-{}-{what}.log", self.tag)),
        )?)
    }

    /// The command for `tidepool ARGS`: in the cgroup if there is one.
    fn tidepool(&self, args: Vec<String>) -> Result<Command> {
        match &self.cg {
            Some(cg) => cg.command(&args),
            None => {
                let mut c = Command::new(&self.exe);
                c.args(args);
                Ok(c)
            }
        }
    }

    /// Starts `tidepool coord --policy POLICY` at the run's socket, logging to a file of its
    /// own; returns it with the address of its HTTP API.
    fn start_coordinator(&self, policy: &str) -> Result<(Guard, Option<String>)> {
        let mut c = self.tidepool(vec![
            "coord".into(),
            "--policy".into(),
            policy.into(),
            "--reserve".into(),
            self.sc.reserve.to_string(),
            "--floor".into(),
            "8M".into(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--socket".into(),
            self.socket.display().to_string(),
        ])?;
        // (TIDEPOOL_BENCH_COORD_LOG=tidepool_coord=debug logs every move.)
        let filter = std::env::var("TIDEPOOL_BENCH_COORD_LOG");
        c.stderr(self.log("coord")?).env(
            "RUST_LOG",
            filter.as_deref().unwrap_or("tidepool_coord=info"),
        );
        let (g, first) = start_coordinator(c)?;
        let http = first
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .map(str::to_string);
        Ok((g, http))
    }

    /// The command of program `i`: two programs to a CPU, each pinned (see part (a)) and
    /// paced, its output piped and its errors logged.
    fn program(&self, i: usize) -> Result<Command> {
        let (sc, p) = (self.sc, &self.sc.programs[i]);
        let weight = match self.setup {
            Setup::Coordinated { weights, .. } => weights[i],
            Setup::AllLocal => 1.0,
        };
        let mut c = match p.kind {
            Kind::Paged { walk, bytes, skew } => self.paged(i, weight, walk, (bytes, skew))?,
            Kind::Soft {
                objects,
                skew,
                rebuild_us,
            } => self.soft(i, weight, objects, (skew, rebuild_us))?,
        };
        let cpus = tidepool_sys::online_cpus().max(1);
        c.env(PIN_ENV, (i % cpus).to_string())
            .env(SPEED_ENV, sc.speed.to_string())
            .env(SPIN_ENV, sc.spin.to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(self.log(p.name)?);
        Ok(c)
    }

    /// A paged program (the `i`th) under `tidepool run`, its far memory on the node: with
    /// room for all of it all-local, else joined to the coordinator with `weight`.
    fn paged(
        &self,
        i: usize,
        weight: f64,
        walk: Walk,
        (bytes, skew): (u64, f64),
    ) -> Result<Command> {
        let (sc, name) = (self.sc, self.sc.programs[i].name);
        let mut args: Vec<String> = vec!["run".into(), "--local".into()];
        match self.setup {
            Setup::AllLocal => {
                args.push((bytes + bytes / 4 + (32 << 20)).to_string());
                args.push("--no-coord".into());
            }
            Setup::Coordinated { .. } => {
                args.extend([
                    self.start_budget.to_string(),
                    "--coord".into(),
                    self.socket.display().to_string(),
                    "--weight".into(),
                    weight.to_string(),
                    "--min".into(),
                    "8M".into(),
                ]);
            }
        }
        args.extend([
            "--backend".into(),
            format!("node://mixed@{}", self.node.addr),
            "--name".into(),
            name.into(),
            "--".into(),
            self.exe.display().to_string(),
        ]);
        args.extend(
            Job::PagedApp(PagedJob {
                walk,
                bytes: bytes as usize,
                skew,
                work_us: sc.paged_work_us,
                seconds: sc.run_s,
                seed: i as u64 + 1,
            })
            .args(),
        );
        self.tidepool(args)
    }

    /// A soft-memory application (the `i`th): with room for all its objects all-local, else
    /// joining the coordinator late with `weight`.
    fn soft(
        &self,
        i: usize,
        weight: f64,
        objects: u64,
        (skew, rebuild_us): (f64, f64),
    ) -> Result<Command> {
        let (sc, name) = (self.sc, self.sc.programs[i].name);
        let budget = match self.setup {
            Setup::AllLocal => objects * OBJECT * 5 / 4 + (16 << 20),
            Setup::Coordinated { .. } => self.start_budget,
        };
        let job = Job::CoordApp(AppJob {
            name: name.to_owned(),
            objects,
            skew,
            rebuild_us,
            work_us: sc.soft_work_us,
            seconds: sc.run_s,
            budget,
            seed: i as u64 + 1,
        });
        let mut c = self.tidepool(job.args().into())?;
        match self.setup {
            Setup::AllLocal => {
                c.env_remove(tidepool_soft::coord::ENV_SOCKET);
            }
            Setup::Coordinated { .. } => {
                c.env(tidepool_soft::coord::ENV_SOCKET, &self.socket)
                    .env("TIDEPOOL_APP", name)
                    .env("TIDEPOOL_WEIGHT", weight.to_string())
                    .env("TIDEPOOL_BENCH_JOIN_LATE", "1");
            }
        }
        Ok(c)
    }

    /// Starts the memory antagonist in the run's cgroup, if it has one.
    fn start_antagonist(&self) -> Result<Option<Guard>> {
        let (Some(cg), sc) = (&self.cg, self.sc) else {
            return Ok(None);
        };
        let job = Job::Antagonist(AntagonistJob {
            bytes: sc.antagonist,
            mib_per_s: 256.0,
            delay_s: sc.antagonist_at,
            hold_s: sc.antagonist_hold,
        });
        let mut c = cg.command(&job.args())?;
        c.stdout(Stdio::null()).stderr(self.log("antagonist")?);
        Ok(Some(Guard(
            c.spawn().context("cannot start the antagonist")?,
        )))
    }
}

/// Waits for `child` until `deadline`; true if it exited successfully. One still running then
/// is killed, with a message naming it.
fn exits_by(child: &mut std::process::Child, deadline: Instant, name: &str) -> Result<bool> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() >= deadline {
            eprintln!(
                "coord mixed: program {name} (pid {}) is still running long after its time: \
                 killed, and counted as failed",
                child.id()
            );
            let _ = child.kill();
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Operations per second from `from` seconds to the last point.
fn throughput(points: &[[f64; 2]], from: f64) -> f64 {
    let (Some(a), Some(b)) = (points.iter().find(|p| p[0] >= from), points.last()) else {
        return 0.0;
    };
    if b[0] <= a[0] {
        return 0.0;
    }
    (b[1] - a[1]) / (b[0] - a[0])
}

/// Every half second, each program's budget as the coordinator's state says (by process id);
/// the medians over the measured part, and every state seen (for the timeline file).
fn poll_budgets(
    addr: &str,
    pids: &[u32],
    from: f64,
    stop: &AtomicBool,
) -> ([f64; 4], Vec<serde_json::Value>) {
    let t0 = Instant::now();
    let mut seen: [Vec<f64>; 4] = Default::default();
    let mut states = Vec::new();
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        let Ok(mut state) = get_state(addr) else {
            continue;
        };
        let t = t0.elapsed().as_secs_f64();
        for a in state["apps"].as_array().into_iter().flatten() {
            let pid = a["pid"].as_u64().unwrap_or(0) as u32;
            if let Some(i) = pids.iter().position(|&p| p == pid) {
                if t >= from {
                    seen[i].push(a["budget"].as_f64().unwrap_or(0.0));
                }
            }
        }
        state["t"] = t.into();
        states.push(state);
    }
    (seen.map(|mut v| median(&mut v)), states)
}

/// The coordinator's `/api/state`.
fn get_state(addr: &str) -> Result<serde_json::Value> {
    let body = ureq::get(&format!("http://{addr}/api/state"))
        .timeout(Duration::from_secs(2))
        .call()?
        .into_string()?;
    Ok(serde_json::from_str(&body)?)
}
