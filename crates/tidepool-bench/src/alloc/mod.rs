//! The `alloc` suite: tidepool-alloc (libtidepool_malloc.so) against glibc, jemalloc, tcmalloc and
//! mimalloc, each injected with LD_PRELOAD into the same workload process.
//!
//! Workloads follow Memento's study of serverless functions: sizes mostly under 512 bytes, 71%
//! of objects freed within 16 further allocations, the rest freed together when the invocation
//! ends (`serverless-burst`, `serverless-threads`, `serverless-json`) or never, dying with the
//! process (`serverless-exit`). Besides them: producers and consumers freeing each other's
//! objects, large buffers, and CPython running function-style code with `PYTHONMALLOC=malloc`.
//!
//! Each run is a fresh process (`tidepool bench-worker alloc ...`, or python3) that times its
//! own work and reports its peak RSS (VmHWM). Systems alternate within each round; the median
//! over rounds is reported.

use crate::{BenchOpts, Ctx, Placement, Suite};
use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The peer allocators as benchmarks.md names them: library file, Debian's package, Fedora's.
const PEERS: [(&str, &str, &str, &str); 3] = [
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2", "jemalloc"),
    (
        "tcmalloc",
        "libtcmalloc_minimal.so.4",
        "libtcmalloc-minimal4",
        "gperftools-libs",
    ),
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0", "mimalloc"),
];

/// Workloads run by `tidepool bench-worker alloc`.
const WORKER_WORKLOADS: [&str; 6] = [
    "serverless-burst",
    "serverless-exit",
    "serverless-threads",
    "serverless-json",
    "producer-consumer",
    "large-objects",
];
const PYTHON_WORKLOAD: &str = "cpython-functions";

#[derive(Debug)]
pub struct AllocSuite;

impl Suite for AllocSuite {
    fn name(&self) -> &'static str {
        "alloc"
    }

    fn about(&self) -> &'static str {
        "malloc under serverless-style workloads, cross-thread frees, large objects and CPython: \
         tidepool vs glibc, jemalloc, tcmalloc, mimalloc (LD_PRELOAD)"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        ((WORKER_WORKLOADS.len() + 1) * opts.rounds()) as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let systems = systems(ctx)?;
        let python = python3();
        let script = ctx.opts.out.join("cpython_functions.py");
        std::fs::write(&script, include_str!("cpython_functions.py"))?;
        let scale = if ctx.opts.quick { 1 } else { 4 };
        let mut workloads: Vec<&str> = WORKER_WORKLOADS.to_vec();
        if python.is_some() {
            workloads.push(PYTHON_WORKLOAD);
        } else {
            ctx.note("python3 not found: the cpython-functions workload is skipped");
        }
        // (workload, system) -> per-round (seconds, peak RSS MiB)
        let mut samples: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for round in 0..ctx.opts.rounds() {
            for workload in &workloads {
                ctx.step(format!("{workload}, round {}", round + 1));
                // Rotate the order each round so no system always runs first (or warm).
                let n = systems.len();
                for k in 0..n {
                    let (name, lib) = &systems[(k + round) % n];
                    let mut cmd = if *workload == PYTHON_WORKLOAD {
                        let mut c = Command::new(python.as_ref().expect("checked above"));
                        c.arg(&script)
                            .arg((300 * scale).to_string())
                            .env("PYTHONMALLOC", "malloc")
                            .env("PYTHONHASHSEED", "0");
                        c
                    } else {
                        let mut c = Command::new(std::env::current_exe()?);
                        c.args(["bench-worker", "alloc", workload, &scale.to_string()]);
                        c
                    };
                    if let Some(lib) = lib {
                        cmd.env("LD_PRELOAD", lib);
                    }
                    let threaded = matches!(*workload, "serverless-threads" | "producer-consumer");
                    let result = run_worker(cmd, ctx.opts.placement, threaded, lib.as_deref())
                        .with_context(|| format!("{workload} on {name}"))?;
                    samples
                        .entry((workload.to_string(), name.clone()))
                        .or_default()
                        .push(result);
                }
                ctx.advance();
            }
        }
        for ((workload, system), runs) in &samples {
            let secs = median(runs.iter().map(|r| r.0).collect());
            let rss = median(runs.iter().map(|r| r.1).collect());
            ctx.report.push(
                system,
                workload,
                "seconds",
                secs,
                "s",
                &[("scale", scale as f64)],
            );
            ctx.report.push(
                system,
                workload,
                "peak_rss_mib",
                rss,
                "MiB",
                &[("scale", scale as f64)],
            );
        }
        // Keep systems in a stable order in the table: tidepool first, then the peers.
        let order = |s: &str| {
            systems
                .iter()
                .position(|(n, _)| n == s)
                .unwrap_or(usize::MAX)
        };
        ctx.report.results.sort_by_key(|r| {
            (
                workloads.iter().position(|w| *w == r.workload),
                r.metric.clone(),
                order(&r.system),
            )
        });
        verdict(ctx);
        Ok(())
    }
}

/// Systems in report order, each with the library to preload (None: glibc itself).
fn systems(ctx: &mut Ctx) -> Result<Vec<(String, Option<PathBuf>)>> {
    let mut systems = vec![("tidepool".to_string(), Some(tidepool_library()?))];
    systems.push(("glibc".to_string(), None));
    for (name, file, debian, fedora) in PEERS {
        match tidepool_peers::shared_library(file) {
            Some(path) => systems.push((name.to_string(), Some(path))),
            None => ctx.note(format!(
                "{name} skipped: {file} is not installed (package {debian} on Debian, \
                 {fedora} on Fedora; scripts/setup installs it)"
            )),
        }
    }
    Ok(systems)
}

/// libtidepool_malloc.so next to this executable (built first under `cargo run`).
pub fn tidepool_library() -> Result<PathBuf> {
    crate::libs::next_to_exe("tidepool-malloc", "libtidepool_malloc.so")
}

/// Builds libtidepool_malloc.so in release mode into `target_dir`, for tests.
pub fn build_library_into(target_dir: &Path, workspace_dir: &Path) -> Result<PathBuf> {
    crate::libs::build_into(
        target_dir,
        workspace_dir,
        "tidepool-malloc",
        "libtidepool_malloc.so",
    )
}

fn python3() -> Option<PathBuf> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Runs one worker process; returns (seconds, peak RSS MiB) from its report line, after checking
/// that the intended allocator was the one mapped into it.
fn run_worker(
    mut cmd: Command,
    placement: Placement,
    threaded: bool,
    lib: Option<&Path>,
) -> Result<(f64, f64)> {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if !threaded {
        if let Some(cpus) = placement.for_workload(true).client_cpus() {
            // Best effort: the process may already have exited.
            let _ = tidepool_sys::pin_process(child.id(), &cpus);
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "worker failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("worker printed no report: {stdout}"))?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let mapped = v["allocator"].as_str().unwrap_or("");
    match lib {
        Some(lib) => {
            let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !mapped.contains(name) {
                bail!(
                    "LD_PRELOAD={} was not live in the worker (saw '{mapped}')",
                    lib.display()
                );
            }
        }
        None if !mapped.is_empty() => {
            bail!("an allocator was preloaded into the glibc run: {mapped}")
        }
        None => {}
    }
    let secs = v["seconds"].as_f64().context("report lacks seconds")?;
    let rss = v["peak_rss_kib"]
        .as_f64()
        .context("report lacks peak_rss_kib")?
        / 1024.0;
    Ok((secs, rss))
}

fn median(mut v: Vec<f64>) -> f64 {
    crate::median(&mut v)
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// The acceptance figures, computed from this run and added as notes.
fn verdict(ctx: &mut Ctx) {
    let serverless: Vec<&str> = WORKER_WORKLOADS
        .iter()
        .copied()
        .filter(|w| w.contains("serverless"))
        .collect();
    let ratio = |ctx: &Ctx, peer: &str, metric: &str, workloads: &[&str]| -> Option<f64> {
        let r: Option<Vec<f64>> = workloads
            .iter()
            .map(|w| {
                Some(ctx.report.value(peer, w, metric)? / ctx.report.value("tidepool", w, metric)?)
            })
            .collect();
        r.map(|r| geomean(&r))
    };
    let mut notes = vec![];
    for peer in ["glibc", "jemalloc", "tcmalloc", "mimalloc"] {
        if let Some(speed) = ratio(ctx, peer, "seconds", &serverless) {
            notes.push(format!(
                "serverless geomean speed-up of tidepool over {peer}: {speed:.3}x"
            ));
        }
    }
    let lowest_peer_rss = |ctx: &Ctx, w: &str| -> Option<f64> {
        ["glibc", "jemalloc", "tcmalloc", "mimalloc"]
            .iter()
            .filter_map(|p| ctx.report.value(p, w, "peak_rss_mib"))
            .reduce(f64::min)
    };
    for w in &serverless {
        if let (Some(t), Some(low)) = (
            ctx.report.value("tidepool", w, "peak_rss_mib"),
            lowest_peer_rss(ctx, w),
        ) {
            notes.push(format!(
                "{w}: tidepool peak RSS {t:.1} MiB = {:.3}x the lowest peer's {low:.1} MiB",
                t / low
            ));
        }
    }
    if let Some(speed) = ratio(ctx, "glibc", "seconds", &[PYTHON_WORKLOAD]) {
        notes.push(format!(
            "{PYTHON_WORKLOAD}: tidepool {speed:.3}x faster than glibc"
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}

// ---------------------------------------------------------------------------------------------
// The worker side: runs inside the process whose malloc is being measured.

/// `tidepool bench-worker alloc WORKLOAD SCALE`: runs the workload and prints one JSON line.
/// `tidepool bench-worker alloc stress SECONDS`: the long verifying stress run.
pub fn worker(args: &[String]) -> Result<()> {
    if let [cmd, seconds] = args {
        if cmd == "stress" {
            return stress(seconds.parse().context("SECONDS must be a whole number")?);
        }
    }
    let [workload, scale] = args else {
        bail!("usage: bench-worker alloc WORKLOAD SCALE");
    };
    let scale: usize = scale.parse().context("SCALE must be a whole number")?;
    let start = Instant::now();
    let checksum = match workload.as_str() {
        "serverless-burst" => serverless_burst(12 * scale, 100_000, 1),
        "serverless-exit" => serverless_exit(600_000 * scale),
        "serverless-threads" => serverless_threads(8 * scale, 100_000),
        "serverless-json" => serverless_json(30 * scale),
        "producer-consumer" => producer_consumer(400_000 * scale),
        "large-objects" => large_objects(1500 * scale),
        other => bail!("unknown alloc workload '{other}'"),
    };
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "workload": workload,
            "seconds": seconds,
            "peak_rss_kib": peak_rss_kib()?,
            "allocator": preloaded_allocator()?,
            "checksum": checksum,
        })
    );
    Ok(())
}

/// VmHWM of this process.
fn peak_rss_kib() -> Result<u64> {
    status_kib("VmHWM:")
}

/// VmRSS of this process.
fn current_rss_kib() -> Result<u64> {
    status_kib("VmRSS:")
}

/// A kB field of /proc/self/status.
fn status_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("malformed {field}"))?
        .parse()?)
}

/// The malloc library mapped into this process, if any besides libc.
fn preloaded_allocator() -> Result<String> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("malloc") || p.contains("jemalloc") || p.contains("tcmalloc"))
        .unwrap_or("")
        .to_string())
}

/// Memento's size mix: mostly under 512 bytes, a tail up to 32 KiB.
fn object_size(rng: &mut SmallRng) -> usize {
    match rng.gen_range(0..100) {
        0..=49 => rng.gen_range(8..=64),
        50..=79 => rng.gen_range(65..=256),
        80..=94 => rng.gen_range(257..=512),
        95..=98 => rng.gen_range(513..=4096),
        _ => rng.gen_range(4097..=32768),
    }
}

/// One object: allocated and written at once, as programs do.
fn make_object(rng: &mut SmallRng, tag: u8) -> Vec<u8> {
    let n = object_size(rng);
    let mut v = Vec::with_capacity(n);
    v.resize(n, tag);
    v
}

/// One function invocation: `allocs` objects; 71% die within the next 16 allocations, the rest
/// live until the invocation ends (returned, so the caller decides when they die).
fn invocation(rng: &mut SmallRng, allocs: usize) -> (u64, Vec<Vec<u8>>) {
    const RING: usize = 32;
    let mut ring: Vec<Option<Vec<u8>>> = (0..RING).map(|_| None).collect();
    let mut survivors = Vec::with_capacity(allocs * 3 / 10);
    let mut sum = 0u64;
    for i in 0..allocs {
        // Whatever was scheduled to die now, dies.
        if let Some(dead) = ring[i % RING].take() {
            sum = sum.wrapping_add(dead[dead.len() / 2] as u64);
        }
        let obj = make_object(rng, i as u8);
        if rng.gen_range(0..100) < 71 {
            let d = rng.gen_range(1..=16);
            if let Some(early) = ring[(i + d) % RING].replace(obj) {
                sum = sum.wrapping_add(early[0] as u64);
            }
        } else {
            survivors.push(obj);
        }
    }
    (sum, survivors)
}

/// Many invocations in one warm process; each frees its survivors together at its end.
fn serverless_burst(invocations: usize, allocs: usize, seed: u64) -> u64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut sum = 0u64;
    for _ in 0..invocations {
        let (s, survivors) = invocation(&mut rng, allocs);
        sum = sum.wrapping_add(s).wrapping_add(survivors.len() as u64);
        drop(survivors);
    }
    sum
}

/// One invocation whose survivors are never freed: they die with the process.
fn serverless_exit(allocs: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(7);
    let (s, survivors) = invocation(&mut rng, allocs);
    let n = survivors.len() as u64;
    std::mem::forget(survivors);
    s.wrapping_add(n)
}

/// Two concurrent invocation streams, as a container serving two requests at once.
fn serverless_threads(invocations: usize, allocs: usize) -> u64 {
    let handles: Vec<_> = (0..2u64)
        .map(|t| std::thread::spawn(move || serverless_burst(invocations / 2, allocs, 100 + t)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .fold(0, u64::wrapping_add)
}

/// Parse a request, transform it, render a response: what most functions do.
fn serverless_json(invocations: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(3);
    let records: Vec<serde_json::Value> = (0..2000)
        .map(|i| {
            serde_json::json!({
                "id": i,
                "user": format!("user-{}", rng.gen_range(0..500)),
                "tags": (0..rng.gen_range(1..6)).map(|t| format!("tag{t}")).collect::<Vec<_>>(),
                "score": rng.gen_range(0.0..100.0),
                "address": {"city": format!("city-{}", i % 37), "zip": format!("{:05}", i * 7 % 99999)},
            })
        })
        .collect();
    let request = serde_json::to_string(&records).expect("serialisable");
    let mut sum = 0u64;
    for _ in 0..invocations {
        let parsed: serde_json::Value = serde_json::from_str(&request).expect("valid JSON");
        let items = parsed.as_array().expect("an array");
        let mut by_city: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
        for it in items {
            if it["score"].as_f64().unwrap_or(0.0) > 20.0 {
                by_city
                    .entry(it["address"]["city"].as_str().unwrap_or("").to_string())
                    .or_default()
                    .push(it);
            }
        }
        let response: Vec<serde_json::Value> = by_city
            .iter()
            .map(|(city, its)| {
                serde_json::json!({
                    "city": city,
                    "count": its.len(),
                    "users": its.iter().map(|i| i["user"].clone()).collect::<Vec<_>>(),
                    "label": format!("{} ({} users)", city.to_uppercase(), its.len()),
                })
            })
            .collect();
        sum = sum.wrapping_add(
            serde_json::to_string(&response)
                .expect("serialisable")
                .len() as u64,
        );
    }
    sum
}

/// Two producers allocate messages; two consumers free them: every free is cross-thread.
fn producer_consumer(messages: usize) -> u64 {
    let mut handles = vec![];
    let mut consumers = vec![];
    for p in 0..2u64 {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(256);
        handles.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(p);
            for i in 0..messages / 2 {
                let n = rng.gen_range(32..=1024);
                let mut v = Vec::with_capacity(n);
                v.resize(n, i as u8);
                tx.send(v).expect("consumer alive");
            }
            0u64
        }));
        consumers.push(std::thread::spawn(move || {
            rx.iter()
                .map(|m| m[m.len() - 1] as u64)
                .fold(0u64, u64::wrapping_add)
        }));
    }
    handles
        .into_iter()
        .chain(consumers)
        .map(|h| h.join().expect("thread panicked"))
        .fold(0, u64::wrapping_add)
}

/// Zeroed buffers from 64 KiB to 8 MiB, every page written, a few alive at a time.
fn large_objects(iterations: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(11);
    let mut live: Vec<Vec<u8>> = Vec::new();
    let mut sum = 0u64;
    for i in 0..iterations {
        let n = 1usize << rng.gen_range(16..=22);
        let n = n + rng.gen_range(0..n);
        // A zeroed buffer (calloc), then one write per page: allocators that trust fresh zero
        // pages skip the clearing; reused memory must be cleared.
        let mut v = vec![0u8; n];
        for page in (0..n).step_by(4096) {
            v[page] = i as u8;
        }
        live.push(v);
        if live.len() > 8 {
            let dead = live.remove(rng.gen_range(0..live.len()));
            sum = sum.wrapping_add(dead[0] as u64);
        }
    }
    sum
}

/// A block whose every byte is derived from its address and a stamp, so corruption, overlap
/// and use of a wrong size are all visible when it is checked.
struct Stamped {
    bytes: Vec<u8>,
    stamp: u8,
}

impl Stamped {
    fn new(n: usize, stamp: u8) -> Stamped {
        let mut bytes = Vec::with_capacity(n);
        let base = bytes.as_ptr() as usize;
        bytes.extend((0..n).map(|i| ((base + i) as u8) ^ stamp));
        Stamped { bytes, stamp }
    }

    fn intact(&self) -> bool {
        let base = self.bytes.as_ptr() as usize;
        self.bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((base + i) as u8) ^ self.stamp)
    }
}

/// Several threads allocate (every size range, large included), verify, free, and pass blocks
/// to each other to free, for `seconds`; RSS is sampled every second. Fails on the first
/// corrupted block; reports RSS in the first and last tenth of the run.
fn stress(seconds: u64) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let corrupt = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    let threads = 4;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads)
        .map(|_| std::sync::mpsc::sync_channel::<Stamped>(512))
        .unzip();
    let mut handles = vec![];
    for (t, rx) in receivers.into_iter().enumerate() {
        let next = senders[(t + 1) % threads].clone();
        let (stop, corrupt, ops) = (stop.clone(), corrupt.clone(), ops.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
            let mut mine: Vec<Stamped> = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    let size = match rng.gen_range(0..1000) {
                        0..=4 => rng.gen_range(40_000..2_000_000),
                        _ => object_size(&mut rng),
                    };
                    mine.push(Stamped::new(size, rng.gen()));
                    // Keep the live set bounded but churning: random frees, some passed on.
                    while mine.len() > 2000 {
                        let b = mine.swap_remove(rng.gen_range(0..mine.len()));
                        if !b.intact() {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        if rng.gen_range(0..4) == 0 {
                            let _ = next.try_send(b);
                        }
                    }
                    while let Ok(b) = rx.try_recv() {
                        if !b.intact() {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    n += 1;
                }
                // Now and then a thread comes and goes, as thread pools resize.
                if rng.gen_range(0..50) == 0 {
                    let v: Vec<Stamped> = (0..200).map(|i| Stamped::new(64 + i, 7)).collect();
                    let back =
                        std::thread::spawn(move || v.into_iter().filter(|b| b.intact()).count())
                            .join()
                            .unwrap_or(0);
                    if back != 200 {
                        corrupt.fetch_add(1, Ordering::Relaxed);
                    }
                }
                ops.store(ops.load(Ordering::Relaxed) + 1000, Ordering::Relaxed);
            }
            n
        }));
    }
    drop(senders);
    let start = Instant::now();
    let mut samples = vec![];
    while start.elapsed().as_secs() < seconds {
        std::thread::sleep(std::time::Duration::from_secs(1));
        samples.push(current_rss_kib()?);
        if corrupt.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let tenth = (samples.len() / 10).max(1);
    let early = samples[..tenth].iter().copied().max().unwrap_or(0);
    let late = samples[samples.len() - tenth..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    let report = serde_json::json!({
        "workload": "stress",
        "seconds": start.elapsed().as_secs_f64(),
        "allocations": total,
        "corrupt_blocks": corrupt.load(Ordering::Relaxed),
        "rss_kib_first_tenth": early,
        "rss_kib_last_tenth": late,
        "peak_rss_kib": peak_rss_kib()?,
        "allocator": preloaded_allocator()?,
    });
    println!("{report}");
    if corrupt.load(Ordering::Relaxed) > 0 {
        bail!("{} corrupted blocks", corrupt.load(Ordering::Relaxed));
    }
    // Unbounded growth would show as the last tenth far above the first.
    if late > early * 3 / 2 + 16 * 1024 {
        bail!("RSS grew from {early} KiB to {late} KiB over the run");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_follows_the_memento_shape() {
        let mut rng = SmallRng::seed_from_u64(1);
        let (_, survivors) = invocation(&mut rng, 100_000);
        let share = survivors.len() as f64 / 100_000.0;
        assert!((0.26..0.32).contains(&share), "survivor share {share}");
        let small = survivors.iter().filter(|v| v.len() <= 512).count() as f64;
        assert!(
            small / survivors.len() as f64 > 0.9,
            "most objects must be under 512 B"
        );
    }

    #[test]
    fn workloads_run_and_report() {
        assert_ne!(serverless_burst(2, 1000, 1), 0);
        assert_ne!(serverless_exit(1000), 0);
        assert_ne!(serverless_json(1), 0);
        assert_ne!(large_objects(10), 0);
        producer_consumer(1000);
        assert!(peak_rss_kib().unwrap() > 0);
    }
}
