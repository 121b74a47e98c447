//! The `store` suite: the memory node against Redis and memcached on 4 KiB values, and Sharry's
//! sharing experiment.
//!
//! Every system is reached through the same [`FarStore`] code a Tidepool user runs, each with its
//! best batched command (node GET_MANY / PUT_MANY, Redis MGET / pipelined SET, memcached
//! pipelined meta `mg` / `ms`), at the same number of requests in flight:
//!
//! - `get-unpipelined`, `put-unpipelined`: one client, one request at a time: p50/p99 latency.
//! - `get-batched`, `put-batched`: `threads` clients with `batch` requests in flight each:
//!   throughput.
//! - `share-unique`, `share-keep`: three client processes, each caching half of its objects
//!   locally and swapping the rest with the node (evict-and-fetch on every miss), either all on
//!   one node or on three nodes of their own. Unique copy takes fetched objects off the node;
//!   keep copy leaves them there. Reports far bytes against the live data held far, and
//!   aggregate throughput.

use crate::{median, BenchOpts, Ctx, Suite};
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_store::{FarStore, FetchMode, Key};

pub const VALUE_BYTES: usize = 4096;
const THREADS: usize = 4;
const SHARE_CLIENTS: usize = 3;

#[derive(Debug)]
pub struct StoreSuite;

fn keys(opts: &BenchOpts) -> u64 {
    if opts.quick {
        4096
    } else {
        16384
    }
}

/// Requests in flight per client thread for the batched workloads: the ratio between systems
/// depends on it (fixed per-round-trip costs weigh less as batches grow), so it is swept.
fn batches(opts: &BenchOpts) -> Vec<usize> {
    if opts.quick {
        vec![8, 32, 128]
    } else {
        vec![1, 8, 32, 128]
    }
}

fn share_ratios(opts: &BenchOpts) -> Vec<f64> {
    if opts.quick {
        vec![0.5]
    } else {
        vec![0.25, 0.5, 0.75]
    }
}

impl Suite for StoreSuite {
    fn name(&self) -> &'static str {
        "store"
    }

    fn about(&self) -> &'static str {
        "memory node vs Redis vs memcached on 4 KiB values; Sharry's sharing experiment"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        let r = opts.rounds() as u64;
        5 + (2 + 2 * batches(opts).len() as u64) * 5 * r
            + LOSS_LAYOUTS.len() as u64 * r
            + 2 * 2 * r * share_ratios(opts).len() as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let systems = start_systems(ctx)?;
        kv_workloads(ctx, &systems)?;
        drop(systems);
        node_loss(ctx)?;
        if wanted("tidepool-node") {
            sharing(ctx)?;
        }
        Ok(())
    }
}

/// A value whose first 8 bytes name its key and next 4 its version; the rest is noise, so no
/// backend can compress its way ahead.
pub fn value(key: Key, version: u32, noise: &[u8]) -> Vec<u8> {
    let mut v = noise[..VALUE_BYTES].to_vec();
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..12].copy_from_slice(&version.to_le_bytes());
    v
}

fn check(key: Key, version: Option<u32>, got: Option<&Bytes>, who: &str) -> Result<()> {
    let got = got.ok_or_else(|| anyhow!("{who}: key {key} vanished"))?;
    if got.len() != VALUE_BYTES || got[..8] != key.to_le_bytes() {
        bail!("{who}: key {key} came back wrong ({} bytes)", got.len());
    }
    if let Some(v) = version {
        let have = u32::from_le_bytes([got[8], got[9], got[10], got[11]]);
        if have != v {
            bail!("{who}: key {key} came back at version {have}, expected {v}");
        }
    }
    Ok(())
}

fn noise() -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    (0..VALUE_BYTES).map(|_| rng.gen()).collect()
}

/// A `tidepool node` child process.
#[derive(Debug)]
pub struct NodeProcess {
    child: Child,
    pub addr: String,
}

/// The `tidepool` binary to start nodes and workers from: this executable unless
/// `TIDEPOOL_BIN` says otherwise.
fn tidepool_bin() -> Result<PathBuf> {
    match std::env::var_os("TIDEPOOL_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().context("cannot find the tidepool executable"),
    }
}

impl NodeProcess {
    pub fn start(capacity: &str) -> Result<NodeProcess> {
        Self::start_with(capacity, &[])
    }

    /// A node with more options (`--busy-poll-us 200`, ...).
    pub fn start_with(capacity: &str, args: &[&str]) -> Result<NodeProcess> {
        let bin = tidepool_bin()?;
        let mut child = Command::new(&bin)
            .args(["node", "--listen", "127.0.0.1:0", "--capacity", capacity])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} node", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the node's address")?;
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .ok_or_else(|| anyhow!("the node did not say where it listens: '{}'", line.trim()))?
            .to_string();
        Ok(NodeProcess { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct System {
    name: &'static str,
    store: Arc<dyn FarStore>,
    /// The server processes, for pinning and their CPU time.
    pids: Vec<u32>,
    _server: Box<dyn std::any::Any>,
}

impl System {
    fn pin(&self, placement: crate::Placement) -> Result<()> {
        self.pids.iter().try_for_each(|&p| placement.pin_server(p))
    }

    fn cpu_seconds(&self) -> Option<f64> {
        self.pids.iter().map(|&p| cpu_seconds(p)).sum()
    }
}

/// Memory nodes started together for one store over all of them.
fn start_nodes(n: usize, query: &str) -> Result<Started> {
    let nodes = (0..n)
        .map(|_| NodeProcess::start("2G"))
        .collect::<Result<Vec<_>>>()?;
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    Ok((
        nodes.iter().map(NodeProcess::pid).collect(),
        format!("node://bench@{}?{query}", addrs.join(",")),
        Box::new(nodes),
    ))
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks / 100.0)
}

/// `TIDEPOOL_BENCH_SYSTEMS=tidepool-node,redis` limits a run to some systems (for profiling).
fn wanted(system: &str) -> bool {
    match std::env::var("TIDEPOOL_BENCH_SYSTEMS") {
        Ok(list) => list.split(',').any(|s| s.trim() == system),
        Err(_) => true,
    }
}

/// A started server: its pids, the store URL to reach it, and what keeps it running.
type Started = (Vec<u32>, String, Box<dyn std::any::Any>);
type StartFn = fn() -> Result<Started>;

fn start_systems(ctx: &mut Ctx) -> Result<Vec<System>> {
    let candidates: [(&'static str, StartFn); 5] = [
        ("tidepool-node", || {
            let n = NodeProcess::start("2G")?;
            Ok((
                vec![n.pid()],
                format!("node://bench@{}", n.addr),
                Box::new(n),
            ))
        }),
        ("tidepool-node-x3-r2", || start_nodes(3, "replicas=2")),
        ("tidepool-node-x6-ec4+2", || start_nodes(6, "ec=4+2")),
        ("redis", || {
            let r = tidepool_peers::RedisServer::start()?;
            Ok((vec![r.pid()], format!("redis://{}", r.addr()), Box::new(r)))
        }),
        ("memcached", || {
            let m = tidepool_peers::Memcached::start(1024)?;
            Ok((
                vec![m.pid()],
                format!("memcached://{}", m.addr()),
                Box::new(m),
            ))
        }),
    ];
    let mut systems = vec![];
    for (name, start) in candidates {
        ctx.step(format!("starting {name}"));
        if wanted(name) {
            let started = start().and_then(|(pids, url, server)| {
                let s = System {
                    name,
                    store: tidepool_store::open(&url)?,
                    pids,
                    _server: server,
                };
                s.pin(ctx.opts.placement)?;
                Ok(s)
            });
            match started {
                Ok(s) => systems.push(s),
                Err(e) => ctx.note(format!("{name} could not start: {e:#}")),
            }
        }
        ctx.advance();
    }
    if systems.is_empty() {
        bail!("no system could be started");
    }
    Ok(systems)
}

fn preload(store: &dyn FarStore, n: u64, noise: &[u8]) -> Result<()> {
    let values: Vec<Vec<u8>> = (0..n).map(|k| value(k, 0, noise)).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let items: Vec<(Key, &[u8])> = chunk
            .iter()
            .map(|&k| (k, values[k as usize].as_slice()))
            .collect();
        store.write_many(&items)?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Get,
    Put,
}

fn kv_workloads(ctx: &mut Ctx, systems: &[System]) -> Result<()> {
    let n = keys(&ctx.opts);
    let noise = noise();
    for s in systems {
        ctx.step(format!("loading {n} values into {}", s.name));
        preload(s.store.as_ref(), n, &noise).with_context(|| format!("loading {}", s.name))?;
        // What the store keeps far for each byte of the values (redundancy and allocation
        // overhead), where the backend can tell.
        if let Some(far) = s.store.stats().ok().and_then(|st| st.far_bytes) {
            ctx.report.push(
                s.name,
                "load",
                "far_bytes_per_live_byte",
                far as f64 / (n as f64 * VALUE_BYTES as f64),
                "ratio",
                &[("value_bytes", VALUE_BYTES as f64)],
            );
        }
    }
    let d = ctx.opts.measure_for();
    let mut workloads = vec![
        ("get-unpipelined", Kind::Get, 1usize, 1usize),
        ("put-unpipelined", Kind::Put, 1, 1),
    ];
    for b in batches(&ctx.opts) {
        workloads.push(("get-batched", Kind::Get, THREADS, b));
        workloads.push(("put-batched", Kind::Put, THREADS, b));
    }
    // results[workload][system]: histograms pooled over rounds, throughput per round.
    let mut hists: Vec<Vec<Histogram<u64>>> = workloads
        .iter()
        .map(|_| systems.iter().map(|_| new_hist()).collect())
        .collect();
    let mut rates: Vec<Vec<Vec<f64>>> = workloads
        .iter()
        .map(|_| systems.iter().map(|_| vec![]).collect())
        .collect();
    // Server CPU seconds and operations, summed over rounds.
    let mut server_cpu: Vec<Vec<(f64, u64)>> = workloads
        .iter()
        .map(|_| systems.iter().map(|_| (0.0, 0)).collect())
        .collect();
    // One pass over everything first, not recorded: fresh connections grow their TCP windows and
    // allocators settle over the first second of traffic, and that would tilt whichever system
    // and round came first.
    let warm = ctx.opts.measure_for() / 2;
    for &(name, kind, threads, batch) in &workloads {
        for s in systems {
            ctx.step(format!("warming up {name} on {}", s.name));
            s.pin(
                ctx.opts
                    .placement
                    .for_workload(name.ends_with("unpipelined")),
            )?;
            drive(&s.store, kind, threads, batch, n, warm, &noise, s.name)?;
        }
    }
    for round in 0..ctx.opts.rounds() {
        for (w, &(name, kind, threads, batch)) in workloads.iter().enumerate() {
            for (si, s) in systems.iter().enumerate() {
                ctx.step(format!("round {} {name} on {}", round + 1, s.name));
                // Every system gets the same placement for the same workload.
                s.pin(
                    ctx.opts
                        .placement
                        .for_workload(name.ends_with("unpipelined")),
                )?;
                let cpu0 = s.cpu_seconds();
                let (hist, ops, secs) =
                    drive(&s.store, kind, threads, batch, n, d, &noise, s.name)?;
                if let (Some(a), Some(b)) = (cpu0, s.cpu_seconds()) {
                    server_cpu[w][si].0 += b - a;
                    server_cpu[w][si].1 += ops;
                }
                hists[w][si].add(&hist).expect("same bounds");
                rates[w][si].push(ops as f64 / secs);
                if std::env::var_os("TIDEPOOL_BENCH_TRACE").is_some() {
                    eprintln!(
                        "trace: round {} {name} batch {batch} {}: {:.0} ops/s",
                        round + 1,
                        s.name,
                        ops as f64 / secs
                    );
                }
                ctx.advance();
            }
        }
    }
    for (w, &(name, _, threads, batch)) in workloads.iter().enumerate() {
        let params = [
            ("threads", threads as f64),
            ("batch", batch as f64),
            ("value_bytes", VALUE_BYTES as f64),
        ];
        for (si, s) in systems.iter().enumerate() {
            let h = &hists[w][si];
            let rate = median(&mut rates[w][si]);
            ctx.report
                .push(s.name, name, "ops_per_s", rate, "ops/s", &params);
            // What the server itself spends per operation, whoever limited the throughput.
            let (cpu, ops) = server_cpu[w][si];
            if ops > 0 && !name.ends_with("unpipelined") {
                ctx.report.push(
                    s.name,
                    name,
                    "server_cpu_us_per_op",
                    cpu * 1e6 / ops as f64,
                    "us",
                    &params,
                );
            }
            if name.ends_with("unpipelined") {
                let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                ctx.report
                    .push(s.name, name, "p50_us", us(0.5), "us", &params);
                ctx.report
                    .push(s.name, name, "p99_us", us(0.99), "us", &params);
            }
        }
    }
    Ok(())
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(100, 10_000_000_000, 3).expect("valid bounds")
}

/// Runs `threads` clients for `d`, each with `batch` requests per call. Returns the pooled
/// per-call latency (ns), keys done, and seconds taken.
#[allow(clippy::too_many_arguments)]
fn drive(
    store: &Arc<dyn FarStore>,
    kind: Kind,
    threads: usize,
    batch: usize,
    n: u64,
    d: Duration,
    noise: &[u8],
    who: &str,
) -> Result<(Histogram<u64>, u64, f64)> {
    let start = Instant::now();
    let results: Vec<Result<(Histogram<u64>, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = Arc::clone(store);
                s.spawn(move || -> Result<(Histogram<u64>, u64)> {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 7);
                    let mut hist = new_hist();
                    let mut done = 0u64;
                    let mut keys = vec![0u64; batch];
                    // Values for puts are built before timing starts; each is re-tagged with
                    // its key (8 bytes) before it is sent.
                    let mut bufs: Vec<Vec<u8>> = if kind == Kind::Put {
                        (0..batch).map(|_| value(0, 0, noise)).collect()
                    } else {
                        vec![]
                    };
                    let deadline = start + d;
                    while Instant::now() < deadline {
                        for k in keys.iter_mut() {
                            *k = rng.gen_range(0..n);
                        }
                        let t0 = Instant::now();
                        match kind {
                            Kind::Get => {
                                let got = store.read_many(&keys)?;
                                hist.record(t0.elapsed().as_nanos() as u64).ok();
                                for (k, g) in keys.iter().zip(&got) {
                                    check(*k, None, g.as_ref(), who)?;
                                }
                            }
                            Kind::Put => {
                                for (b, k) in bufs.iter_mut().zip(&keys) {
                                    b[..8].copy_from_slice(&k.to_le_bytes());
                                }
                                let items: Vec<(Key, &[u8])> = keys
                                    .iter()
                                    .copied()
                                    .zip(bufs.iter().map(Vec::as_slice))
                                    .collect();
                                store.write_many(&items)?;
                                hist.record(t0.elapsed().as_nanos() as u64).ok();
                            }
                        }
                        done += batch as u64;
                    }
                    Ok((hist, done))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("client thread panicked")))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut hist = new_hist();
    let mut ops = 0;
    for r in results {
        let (h, n) = r?;
        hist.add(&h).expect("same bounds");
        ops += n;
    }
    Ok((hist, ops, secs))
}

// ---- Losing a node under load ----

/// The stores `node-loss` runs on: (system, nodes, URL query). Each has one node more than its
/// system's layout in `start_systems`, so that what the lost node held can be protected again.
const LOSS_LAYOUTS: [(&str, usize, &str); 2] = [
    ("tidepool-node-x3-r2", 4, "replicas=2"),
    ("tidepool-node-x6-ec4+2", 7, "ec=4+2"),
];

/// `node-loss`: readers run batches of 32 over the whole store; one node is SIGKILLed.
/// `recovery_ms`: from the kill to the first correct read begun after it, in the slowest reader.
/// `reprotect_mib_per_s`: bytes stored again (on the spare node and the others) over the time
/// from the kill until every value has all its pieces again, re-protection riding on the load.
fn node_loss(ctx: &mut Ctx) -> Result<()> {
    let n = keys(&ctx.opts);
    let noise = noise();
    for (name, nodes, query) in LOSS_LAYOUTS {
        if !wanted(name) {
            continue;
        }
        let (mut recovery, mut rate) = (vec![], vec![]);
        for round in 0..ctx.opts.rounds() {
            ctx.step(format!("round {} node-loss on {name}", round + 1));
            let (ms, mib_s) = one_loss(ctx, nodes, query, n, &noise)
                .with_context(|| format!("node-loss on {name}"))?;
            recovery.push(ms);
            rate.push(mib_s);
            ctx.advance();
        }
        let params = [
            ("nodes", nodes as f64),
            ("threads", THREADS as f64),
            ("batch", 32.0),
            ("value_bytes", VALUE_BYTES as f64),
        ];
        ctx.report.push(
            name,
            "node-loss",
            "recovery_ms",
            median(&mut recovery),
            "ms",
            &params,
        );
        ctx.report.push(
            name,
            "node-loss",
            "reprotect_mib_per_s",
            median(&mut rate),
            "MiB/s",
            &params,
        );
    }
    Ok(())
}

fn extra_stat(store: &dyn FarStore, name: &str) -> Result<u64> {
    let st = store.stats()?;
    st.extra
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow!("the store reports no {name}"))
}

fn one_loss(ctx: &Ctx, nodes: usize, query: &str, n: u64, noise: &[u8]) -> Result<(f64, f64)> {
    let (pids, url, servers) = start_nodes(nodes, query)?;
    for &p in &pids {
        ctx.opts.placement.pin_server(p)?;
    }
    let store = tidepool_store::open(&url)?;
    preload(store.as_ref(), n, noise)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let killed: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let (recovered, reprotect) = std::thread::scope(|s| -> Result<(f64, f64)> {
        let readers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, stop, killed) = (&store, &stop, &killed);
                s.spawn(move || -> Result<Option<Duration>> {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 99);
                    let mut keys = vec![0u64; 32];
                    let mut first_after = None;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        keys.iter_mut().for_each(|k| *k = rng.gen_range(0..n));
                        let begun = Instant::now();
                        let got = store.read_many(&keys)?;
                        for (k, g) in keys.iter().zip(&got) {
                            check(*k, Some(0), g.as_ref(), "node-loss")?;
                        }
                        match killed.get() {
                            Some(&k) if begun >= k && first_after.is_none() => {
                                first_after = Some(begun.elapsed() + (begun - k))
                            }
                            _ => {}
                        }
                    }
                    Ok(first_after)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let before = extra_stat(store.as_ref(), "bytes_reprotected")?;
        // SIGKILL the first node: the nodes are a Vec<NodeProcess> whose drop kills.
        let victim = pids[0];
        let victim = rustix::process::Pid::from_raw(victim as i32)
            .ok_or_else(|| anyhow!("node pid {victim}"))?;
        rustix::process::kill_process(victim, rustix::process::Signal::KILL)
            .context("killing a node")?;
        let at = Instant::now();
        killed.set(at).expect("killed once");
        let deadline = at + Duration::from_secs(60);
        let result = loop {
            let left = extra_stat(store.as_ref(), "bytes_not_protected");
            match left {
                Ok(0) => break Ok(at.elapsed()),
                Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(b) => break Err(anyhow!("{b} bytes still unprotected after 60 s")),
                Err(e) => break Err(e),
            }
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut worst = Duration::ZERO;
        for r in readers {
            let first = r
                .join()
                .map_err(|_| anyhow!("reader panicked"))??
                .ok_or_else(|| anyhow!("a reader made no read after the kill"))?;
            worst = worst.max(first);
        }
        let took = result?;
        let bytes = extra_stat(store.as_ref(), "bytes_reprotected")? - before;
        Ok((
            worst.as_secs_f64() * 1e3,
            bytes as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        ))
    })?;
    drop(servers);
    Ok((recovered, reprotect))
}

// ---- The sharing experiment ----

/// Arguments of one sharing client process (`tidepool bench-worker share ...`).
#[derive(Debug, Clone)]
pub struct ShareArgs {
    pub url: String,
    pub objects: u64,
    pub local: u64,
    pub unique: bool,
    pub seconds: f64,
    pub seed: u64,
}

impl ShareArgs {
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "bench-worker".into(),
            "share".into(),
            self.url.clone(),
            self.objects.to_string(),
            self.local.to_string(),
            if self.unique { "unique" } else { "keep" }.into(),
            self.seconds.to_string(),
            self.seed.to_string(),
        ]
    }

    pub fn parse(args: &[String]) -> Result<ShareArgs> {
        let [url, objects, local, mode, seconds, seed] = args else {
            bail!("usage: bench-worker share URL OBJECTS LOCAL unique|keep SECONDS SEED");
        };
        Ok(ShareArgs {
            url: url.clone(),
            objects: objects.parse()?,
            local: local.parse()?,
            unique: match mode.as_str() {
                "unique" => true,
                "keep" => false,
                m => bail!("mode must be unique or keep, not {m}"),
            },
            seconds: seconds.parse()?,
            seed: seed.parse()?,
        })
    }
}

/// One sharing client: caches `local` of its `objects` locally, swaps the rest with the node.
/// Prints `ready`, waits for a line on stdin, runs, prints one JSON line of results.
pub fn share_worker(a: ShareArgs) -> Result<()> {
    let store = tidepool_store::open(&a.url)?;
    let noise = noise();
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut version = vec![0u32; a.objects as usize];
    // Resident objects: id -> (data, dirty); `resident_ids` for picking victims at random.
    let mut local: std::collections::HashMap<Key, (Vec<u8>, bool)> = Default::default();
    let mut resident_ids: Vec<Key> = (0..a.local).collect();
    for id in 0..a.local {
        local.insert(id, (value(id, 0, &noise), false));
    }
    // Far: everything not resident, and with keep-copy the resident ones too (their far copy
    // is made when they are created, as AIFM-style systems do).
    let far_from = if a.unique { a.local } else { 0 };
    let far: Vec<Key> = (far_from..a.objects).collect();
    for chunk in far.chunks(64) {
        let vals: Vec<Vec<u8>> = chunk.iter().map(|&k| value(k, 0, &noise)).collect();
        let items: Vec<(Key, &[u8])> = chunk
            .iter()
            .copied()
            .zip(vals.iter().map(|v| v.as_slice()))
            .collect();
        store.write_many(&items)?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.seconds);
    let (mut ops, mut misses) = (0u64, 0u64);
    let mode = if a.unique {
        FetchMode::Take
    } else {
        FetchMode::Keep
    };
    while Instant::now() < deadline {
        for _ in 0..64 {
            let id = rng.gen_range(0..a.objects);
            let write = rng.gen_bool(0.3);
            if !local.contains_key(&id) {
                misses += 1;
                let vi = rng.gen_range(0..resident_ids.len());
                let victim = resident_ids[vi];
                let (vdata, dirty) = local.remove(&victim).expect("resident");
                let evict: Vec<(Key, &[u8])> = if a.unique || dirty {
                    vec![(victim, vdata.as_slice())]
                } else {
                    vec![]
                };
                let got = store.evict_fetch(&evict, &[id], mode)?;
                check(id, Some(version[id as usize]), got[0].as_ref(), "share")?;
                local.insert(id, (got[0].as_ref().expect("checked").to_vec(), false));
                resident_ids[vi] = id;
            }
            if write {
                let entry = local.get_mut(&id).expect("resident");
                version[id as usize] += 1;
                entry.0[8..12].copy_from_slice(&version[id as usize].to_le_bytes());
                entry.1 = true;
            }
            ops += 1;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = store.stats()?;
    println!(
        "{}",
        serde_json::json!({
            "ops": ops,
            "misses": misses,
            "seconds": seconds,
            "far_bytes": stats.far_bytes.unwrap_or(0),
            "far_live_bytes": (a.objects - a.local) * VALUE_BYTES as u64,
        })
    );
    Ok(())
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(args: &ShareArgs) -> Result<Worker> {
        let mut child = Command::new(tidepool_bin()?)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start a sharing client process")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    fn expect_line(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.is_empty() {
            bail!("a sharing client exited early (see its message above)");
        }
        Ok(line)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct ShareResult {
    ops_per_s: f64,
    far_bytes: f64,
    far_live_bytes: f64,
}

fn share_run(
    placement: crate::Placement,
    nodes: usize,
    unique: bool,
    objects: u64,
    local: u64,
    secs: f64,
) -> Result<ShareResult> {
    let servers: Vec<NodeProcess> = (0..nodes)
        .map(|_| {
            let n = NodeProcess::start("1G")?;
            placement.pin_server(n.pid())?;
            Ok(n)
        })
        .collect::<Result<_>>()?;
    let mut workers = vec![];
    for c in 0..SHARE_CLIENTS {
        let node = &servers[c % nodes];
        workers.push(Worker::spawn(&ShareArgs {
            url: format!("node://client{c}@{}", node.addr),
            objects,
            local,
            unique,
            seconds: secs,
            seed: c as u64 + 1,
        })?);
    }
    for w in &mut workers {
        let l = w.expect_line()?;
        if l.trim() != "ready" {
            bail!("sharing client said '{}' instead of ready", l.trim());
        }
    }
    for w in &mut workers {
        writeln!(w.stdin, "go")?;
        w.stdin.flush()?;
    }
    let mut r = ShareResult::default();
    for w in &mut workers {
        let l = w.expect_line()?;
        let v: serde_json::Value = serde_json::from_str(&l).context("sharing client output")?;
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        r.ops_per_s += f("ops") / f("seconds");
        r.far_bytes += f("far_bytes");
        r.far_live_bytes += f("far_live_bytes");
    }
    Ok(r)
}

fn sharing(ctx: &mut Ctx) -> Result<()> {
    let objects = keys(&ctx.opts);
    let secs = if ctx.opts.quick { 0.8 } else { 2.0 };
    for ratio in share_ratios(&ctx.opts) {
        let local = (objects as f64 * ratio) as u64;
        // [mode][topology] -> per-round results
        let mut runs = vec![vec![vec![]; 2]; 2];
        for round in 0..ctx.opts.rounds() {
            for (mi, unique) in [true, false].into_iter().enumerate() {
                for (ti, nodes) in [1usize, SHARE_CLIENTS].into_iter().enumerate() {
                    ctx.step(format!(
                        "round {} sharing {} copy, {nodes} node(s), local {ratio}",
                        round + 1,
                        if unique { "unique" } else { "keep" }
                    ));
                    match share_run(ctx.opts.placement, nodes, unique, objects, local, secs) {
                        Ok(r) => runs[mi][ti].push(r),
                        Err(e) => ctx.note(format!("sharing run failed: {e:#}")),
                    }
                    ctx.advance();
                }
            }
        }
        for (mi, workload) in ["share-unique", "share-keep"].into_iter().enumerate() {
            // The node count is in the system's name: shared is one node, separate one per client.
            for (ti, system) in ["tidepool-node-shared", "tidepool-node-separate"]
                .into_iter()
                .enumerate()
            {
                let rs = &runs[mi][ti];
                if rs.is_empty() {
                    continue;
                }
                let mut ops: Vec<f64> = rs.iter().map(|r| r.ops_per_s).collect();
                // Far bytes are the same every round (they depend on the data, not on time).
                let last = rs[rs.len() - 1];
                let params = [
                    ("clients", SHARE_CLIENTS as f64),
                    ("local_ratio", ratio),
                    ("objects_per_client", objects as f64),
                ];
                let rep = &mut ctx.report;
                rep.push(
                    system,
                    workload,
                    "ops_per_s",
                    median(&mut ops),
                    "ops/s",
                    &params,
                );
                rep.push(
                    system,
                    workload,
                    "far_bytes",
                    last.far_bytes,
                    "bytes",
                    &params,
                );
                rep.push(
                    system,
                    workload,
                    "far_live_bytes",
                    last.far_live_bytes,
                    "bytes",
                    &params,
                );
                rep.push(
                    system,
                    workload,
                    "far_bytes_per_live_byte",
                    last.far_bytes / last.far_live_bytes.max(1.0),
                    "x",
                    &params,
                );
            }
        }
    }
    Ok(())
}
