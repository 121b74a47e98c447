//! The `far` suite: far data structures (Mira's runtime) against the transparent pager, Linux
//! swap to zram and native code.
//!
//! (a) Mira's graph traversal (its Figure 4): edges read in order, each adding to its two
//! nodes, chosen at random. The footprint is the edges and the nodes together; local-memory
//! ratios are of it. Systems, each in a fresh process:
//! - `tidepool-far-tuned`: far vectors over the in-process store, in the sections
//!   `tidepool tune` chose: the tuning loop runs first at every ratio (profile, tune, run,
//!   keep the configuration if faster, until it is not; see [`tune_loop`]), and its steps are
//!   notes of the report; the configurations it kept are written next to the report. The
//!   walk requests the nodes of each line of edges before updating them (the split phase);
//!   nodes given a section of their own size are one plain slice.
//! - `tidepool-far-untuned`: the same program in [`Config::untuned`] sections: one fully
//!   associative section of 4 KiB lines per vector, the budget split by size.
//! - `tidepool-far-swap`: the same vectors in one fully associative section of 4 KiB lines,
//!   accessed element by element: far memory as a swap system sees it.
//! - `tidepool-pager`: the native program under `tidepool run` (in-process store).
//! - `linux-zram`: the native program in a memory cgroup of the same size, swapping to zram.
//! - `native`: the native program with everything local.
//!
//! Every system's local memory is the ratio times the footprint. zram and the pager get
//! [`ALLOWANCE`] on top for the rest of the process; the far sections do not, and their line
//! tables count against their share.
//!
//! (b) DataFrame analytics offloaded to a memory node against fetched: see `far_query.rs`.
//! (c) Each access API's overhead at 100% local against a `Vec`: see `far_overhead.rs`.

use crate::pager::{run_worker, Zram};
use crate::{median, BenchOpts, Ctx, Suite};
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_far::{Config, Far, FarVec, Section, SectionConfig, Structure};

/// The native worker's resident set with an empty graph (4.2 MiB measured): what the process
/// needs besides the graph. The pager suite's 16 MiB would hand zram and the pager a quarter of
/// the footprint for free at small ratios.
const ALLOWANCE: u64 = 4 << 20;
const RATIOS: [f64; 5] = [0.1, 0.25, 0.5, 0.75, 1.0];
const GRAPH_SYSTEMS: [&str; 6] = [
    "tidepool-far-tuned",
    "tidepool-far-untuned",
    "tidepool-far-swap",
    "tidepool-pager",
    "linux-zram",
    "native",
];

#[derive(Debug)]
pub struct FarSuite;

struct Sizes {
    nodes: u64,
    edges: u64,
    seconds: f64,
    rounds: usize,
    /// Rows of part (b)'s table.
    rows: usize,
}

/// `TIDEPOOL_FAR_PARTS=b` runs only some parts (`a`, `b`, `c`; default all).
fn part(p: &str) -> bool {
    std::env::var("TIDEPOOL_FAR_PARTS").map_or(true, |v| v.split(',').any(|x| x.trim() == p))
}

fn sizes(opts: &BenchOpts) -> Sizes {
    if opts.quick {
        Sizes {
            nodes: 2 << 20,
            edges: 2 << 20,
            seconds: 0.5,
            rounds: 1,
            rows: 2 << 20,
        }
    } else {
        Sizes {
            nodes: 8 << 20,
            edges: 8 << 20,
            seconds: 2.0,
            rounds: 3,
            rows: 8 << 20,
        }
    }
}

impl Suite for FarSuite {
    fn name(&self) -> &'static str {
        "far"
    }

    fn about(&self) -> &'static str {
        "far data structures with cache sections: Mira's graph traversal against the \
         transparent pager, Linux swap to zram and native"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        let s = sizes(opts);
        // Tuning, then the rounds.
        let a = if part("a") { RATIOS.len() } else { 0 };
        let b = if part("b") {
            crate::far_query::RATIOS.len()
        } else {
            0
        };
        let c = usize::from(part("c"));
        (s.rounds * (a + b + c) + a) as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let s = sizes(&ctx.opts);
        if part("a") {
            graph(ctx, &s)?;
        }
        if part("b") {
            crate::far_query::run(ctx, s.rows, s.rounds)?;
        }
        if part("c") {
            crate::far_overhead::run(ctx, s.rounds)?;
        }
        verdict(ctx);
        Ok(())
    }
}

/// Part (a): see the module docs.
fn graph(ctx: &mut Ctx, s: &Sizes) -> Result<()> {
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
    let mut samples: std::collections::BTreeMap<(String, u64), Vec<f64>> = Default::default();
    // Each ratio's configurations: untuned, and what the tuning loop kept.
    let mut configs = std::collections::BTreeMap::new();
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
        configs.insert(pct, (path("untuned.toml"), tuned));
        ctx.advance();
    }
    for round in 0..s.rounds {
        for &ratio in &RATIOS {
            ctx.step(format!(
                "graph at {:.0}% local, round {}",
                ratio * 100.0,
                round + 1
            ));
            let local = (footprint as f64 * ratio) as u64;
            let systems: Vec<&str> = GRAPH_SYSTEMS
                .into_iter()
                .filter(|&n| n != "linux-zram" || zram.is_some())
                .filter(|&n| n != "native" || ratio == 1.0)
                .collect();
            let n = systems.len();
            for k in 0..n {
                let system = systems[(k + round) % n];
                let worker_system = match system {
                    "tidepool-far-tuned" | "tidepool-far-untuned" => "far",
                    "tidepool-far-swap" => "far-swap",
                    _ => "native",
                };
                let pct = (ratio * 100.0).round() as u64;
                let config = match system {
                    "tidepool-far-tuned" => configs[&pct].1.display().to_string(),
                    "tidepool-far-untuned" => configs[&pct].0.display().to_string(),
                    _ => "-".into(),
                };
                let mut cmd = match system {
                    "linux-zram" => zram
                        .as_ref()
                        .expect("listed only if started")
                        .command(local + ALLOWANCE)?,
                    "tidepool-pager" => {
                        let mut c = Command::new(&exe);
                        c.args(["run", "--local", &(local + ALLOWANCE).to_string()])
                            .args(["--backend", "local:", "--"])
                            .env("TIDEPOOL_PRELOAD", &preload);
                        c
                    }
                    _ => Command::new("env"),
                };
                cmd.arg(&exe).args([
                    "bench-worker",
                    "far-graph",
                    worker_system,
                    &s.nodes.to_string(),
                    &s.edges.to_string(),
                    &s.seconds.to_string(),
                    &local.to_string(),
                    &config,
                ]);
                match run_worker(cmd) {
                    Ok(v) => samples
                        .entry((system.into(), (ratio * 100.0).round() as u64))
                        .or_default()
                        .push(v),
                    Err(e) => ctx.note(format!(
                        "graph on {system} at {:.0}% local, round {}: {e:#}",
                        ratio * 100.0,
                        round + 1
                    )),
                }
            }
            ctx.advance();
        }
    }
    for ((system, pct), mut v) in samples {
        ctx.report.push(
            &system,
            "graph",
            "edges_per_s",
            median(&mut v),
            "edges/s",
            &[
                ("local_ratio", pct as f64 / 100.0),
                ("footprint_mib", (footprint >> 20) as f64),
            ],
        );
    }
    Ok(())
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
    path: &dyn Fn(&str) -> std::path::PathBuf,
) -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let run = |config: &std::path::Path, profile: Option<&std::path::Path>| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "bench-worker",
            "far-graph",
            "far",
            &s.nodes.to_string(),
            &s.edges.to_string(),
            &s.seconds.to_string(),
            &local.to_string(),
        ])
        .arg(config);
        if let Some(p) = profile {
            cmd.arg(p);
        }
        run_worker(cmd)
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

/// The acceptance ratios, from this run, as notes.
fn verdict(ctx: &mut Ctx) {
    let at = |r: &crate::Report, workload: &str, system: &str, ratio: f64| {
        r.at_ratio(system, workload, ratio)
    };
    let targets = [
        (0.25, "linux-zram", 5.0),
        (0.25, "tidepool-pager", 2.0),
        (1.0, "native", 1.0 / 1.1),
        (0.1, "tidepool-far-untuned", 1.0),
        (0.25, "tidepool-far-untuned", 1.0),
        (0.5, "tidepool-far-untuned", 1.0),
        (0.75, "tidepool-far-untuned", 1.0),
        (1.0, "tidepool-far-untuned", 1.0),
    ];
    let mut notes = Vec::new();
    for (ratio, peer, want) in targets {
        if let (Some(t), Some(p)) = (
            at(&ctx.report, "graph", "tidepool-far-tuned", ratio),
            at(&ctx.report, "graph", peer, ratio),
        ) {
            notes.push(format!(
                "graph at {:.0}% local: tidepool-far-tuned / {peer} = {:.2}x (target >= {want:.2}x)",
                ratio * 100.0,
                t / p
            ));
        }
    }
    if let (Some(o), Some(f)) = (
        at(&ctx.report, "query", "tidepool-far-offload", 0.1),
        at(&ctx.report, "query", "tidepool-far-fetch", 0.1),
    ) {
        notes.push(format!(
            "query at 10% local: offload / fetch = {:.2}x (target >= 2.00x)",
            o / f
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}

#[derive(
    Clone,
    Copy,
    Default,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
struct Edge {
    from: u32,
    to: u32,
}

/// Edge `i` of a graph of `nodes` nodes: both ends uniformly random (SplitMix64 of `i`), so
/// every system can make the same graph in any order without storing it first.
fn edge(i: u64, nodes: u64) -> Edge {
    let z = splitmix64(i.wrapping_add(1));
    Edge {
        from: ((z & 0xFFFF_FFFF) % nodes) as u32,
        to: ((z >> 32) % nodes) as u32,
    }
}

/// The SplitMix64 mix of `x`: the far suite's reproducible random numbers, by index.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Edges between looks at the clock.
const CHECK_EVERY: u64 = 1 << 14;

/// `tidepool bench-worker far-graph SYSTEM NODES EDGES SECONDS LOCAL_BYTES`: builds the graph,
/// then walks its edges (over and over) for SECONDS, and prints `{"value": edges/s, ...}`.
/// SYSTEM is `native` (plain vectors), `far` or `far-swap` (far vectors over the in-process
/// store in LOCAL_BYTES of sections).
pub fn graph_worker(args: &[String]) -> Result<()> {
    let (system, nodes, edges, seconds, local, config, profile) = match args {
        [a, b, c, d, e, f] => (a, b, c, d, e, f, None),
        [a, b, c, d, e, f, g] => (a, b, c, d, e, f, Some(std::path::PathBuf::from(g))),
        _ => bail!(
            "usage: tidepool bench-worker far-graph SYSTEM NODES EDGES SECONDS LOCAL_BYTES \
             CONFIG|- [PROFILE_OUT]"
        ),
    };
    let nodes: u64 = nodes.parse().context("NODES")?;
    let edges: u64 = edges.parse().context("EDGES")?;
    if nodes == 0 || nodes > u32::MAX as u64 || edges == 0 {
        bail!("NODES must be 1..2^32 and EDGES positive");
    }
    let run_for = Duration::from_secs_f64(seconds.parse().context("SECONDS")?);
    let local: usize = local.parse().context("LOCAL_BYTES")?;
    let (done, secs, checksum, extra) = match system.as_str() {
        "native" => graph_native(nodes, edges, run_for),
        "far" => {
            let text = std::fs::read_to_string(config)
                .with_context(|| format!("reading the section configuration {config}"))?;
            let config = Config::from_toml(&text)?;
            graph_far(nodes, edges, run_for, local, Some(&config), profile)?
        }
        "far-swap" => graph_far(nodes, edges, run_for, local, None, None)?,
        other => bail!("unknown far-graph system '{other}' (native, far, far-swap)"),
    };
    println!(
        "{{\"value\": {}, \"edges\": {done}, \"checksum\": {checksum}{extra}}}",
        done as f64 / secs
    );
    Ok(())
}

fn graph_native(nodes: u64, edges: u64, run_for: Duration) -> (u64, f64, u64, String) {
    let e: Vec<Edge> = (0..edges).map(|i| edge(i, nodes)).collect();
    let mut n = vec![0u64; nodes as usize];
    // Touched before the clock starts, as the far systems load their sections first.
    n.fill(0);
    std::hint::black_box(&mut n);
    let start = Instant::now();
    let (mut i, mut done) = (0usize, 0u64);
    loop {
        for _ in 0..CHECK_EVERY {
            let x = e[i];
            n[x.from as usize] += i as u64;
            n[x.to as usize] += 1;
            i += 1;
            if i == e.len() {
                i = 0;
            }
        }
        done += CHECK_EVERY;
        if start.elapsed() >= run_for {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    (done, secs, n.iter().sum(), String::new())
}

/// Bytes of a far vector's line table: local memory it uses besides its section.
fn table_bytes(bytes: u64, line: u64) -> u64 {
    bytes.div_ceil(line) * 4
}

/// The graph over far vectors: in `config`'s sections (profiling into `profile` if given),
/// or, without one, swap-like: one fully associative section, element by element.
fn graph_far(
    nodes: u64,
    edges: u64,
    run_for: Duration,
    local: usize,
    config: Option<&Config>,
    profile: Option<std::path::PathBuf>,
) -> Result<(u64, f64, u64, String)> {
    let far = Far::new(Arc::new(tidepool_store::LocalStore::new(false)));
    if profile.is_some() {
        far.enable_profiling();
    }
    let (node_bytes, edge_bytes) = (nodes * 8, edges * 8);
    const PAGE: u64 = 4096;
    let swap_like = config.is_none();
    let (es, ns, nodes_local, ahead) = match config {
        None => {
            let tables = table_bytes(node_bytes, PAGE) + table_bytes(edge_bytes, PAGE);
            let cap = (local as u64).saturating_sub(tables).max(2 * PAGE);
            let s = Section::new(SectionConfig::new(
                Structure::Full,
                PAGE as usize,
                cap as usize,
            ))?;
            (s.clone(), s, false, 8)
        }
        Some(c) => {
            let site = |name: &str| {
                c.site
                    .get(name)
                    .with_context(|| format!("the configuration has no section for {name}"))
            };
            let (e, n) = (site("graph.edges")?, site("graph.nodes")?);
            let whole = n.structure()? == Structure::Direct && n.capacity as u64 >= node_bytes;
            (e.section()?, n.section()?, whole, e.prefetch)
        }
    };
    let ev: FarVec<Edge> = FarVec::named(&far, &es, edges as usize, "graph.edges")?;
    // Written a line at a time through the section (no fetch: whole lines), never all local.
    ev.fill_with(|i| edge(i as u64, nodes))?;
    let per = ev.per_line();
    ev.set_prefetch(ahead);
    let nv: FarVec<u64> = FarVec::named(&far, &ns, nodes as usize, "graph.nodes")?;
    if nodes_local {
        nv.load_all()?;
    }
    let start = Instant::now();
    let mut done = 0u64;
    let mut wanted = Vec::with_capacity(2 * per);
    'walk: loop {
        if swap_like {
            // Element by element, as a program on swap would.
            let mut i = 0u64;
            for x in ev.iter() {
                let x = x?;
                nv.update(x.from as usize, |n| *n += i)?;
                nv.update(x.to as usize, |n| *n += 1)?;
                i += 1;
                if i.is_multiple_of(CHECK_EVERY) && start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        } else if let Some(mut n) = nv.local_mut() {
            let mut i = 0u64;
            for line in ev.line_iter() {
                for x in line?.iter() {
                    n[x.from as usize] += i;
                    n[x.to as usize] += 1;
                    i += 1;
                }
                if start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        } else {
            let mut i = 0u64;
            for line in ev.line_iter() {
                let line = line?;
                // Split phase: the node lines of this line of edges, in one round trip.
                wanted.clear();
                wanted.extend(line.iter().flat_map(|x| [x.from as usize, x.to as usize]));
                nv.request(&wanted)?;
                for x in line.iter() {
                    nv.update(x.from as usize, |n| *n += i)?;
                    nv.update(x.to as usize, |n| *n += 1)?;
                    i += 1;
                }
                if start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Not in a profiling run: the profile is of the walk, not of a check after it.
    let checksum = if profile.is_some() {
        0
    } else {
        nv.iter().try_fold(0u64, |a, x| x.map(|x| a + x))?
    };
    let (e, n) = (es.stats(), ns.stats());
    let extra = format!(
        ", \"node_misses\": {}, \"node_fetches\": {}, \"edge_misses\": {}",
        n.misses, n.fetches, e.misses
    );
    if let Some(path) = profile {
        drop((ev, nv));
        std::fs::write(&path, far.profile().to_json())
            .with_context(|| format!("writing the profile {}", path.display()))?;
    }
    Ok((done, secs, checksum, extra))
}
