//! Sharry's sharing experiment: three client processes, each caching part of its objects
//! locally and swapping the rest with memory nodes (evict-and-fetch on every miss), all on one
//! node or each on a node of its own, with unique copy (fetched objects leave the node) or keep
//! copy (they stay).

use super::data::{check, keys, noise, share_ratios, value, SHARE_CLIENTS, VALUE_BYTES};
use crate::harness::{Ctx, Matrix, Placement, Sample, System, Workload};
use crate::job::Job;
use crate::job::ShareJob;
use crate::node::{tidepool_bin, NodeProcess};
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};
use tidepool_store::{FetchMode, Key};

/// Where the clients' objects go: one node for all, or a node each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    Shared,
    Separate,
}

impl System for Topology {
    /// The node count is in the name: shared is one node, separate one per client.
    fn name(&self) -> &'static str {
        match self {
            Topology::Shared => "tidepool-node-shared",
            Topology::Separate => "tidepool-node-separate",
        }
    }
}

impl Topology {
    fn nodes(self) -> usize {
        match self {
            Topology::Shared => 1,
            Topology::Separate => SHARE_CLIENTS,
        }
    }
}

/// Unique or keep copy, at one local ratio.
#[derive(Debug, Clone, Copy)]
struct Share {
    unique: bool,
    ratio: f64,
    objects: u64,
}

impl Workload for Share {
    fn name(&self) -> &str {
        if self.unique {
            "share-unique"
        } else {
            "share-keep"
        }
    }

    fn on(&self, system: &str) -> String {
        format!("{} on {system} at local {}", self.name(), self.ratio)
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("clients", SHARE_CLIENTS as f64),
            ("local_ratio", self.ratio),
            ("objects_per_client", self.objects as f64),
        ]
    }
}

/// Both copy modes on both topologies, ratio after ratio: aggregate throughput (the median
/// of the rounds) and far bytes against the live data held far (the same every round: they
/// depend on the data, not on time).
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let objects = keys(&ctx.opts);
    let secs = if ctx.opts.quick { 0.8 } else { 2.0 };
    let systems = [Topology::Shared, Topology::Separate];
    for ratio in share_ratios(&ctx.opts) {
        let local = (objects as f64 * ratio) as u64;
        let workloads = [true, false].map(|unique| Share {
            unique,
            ratio,
            objects,
        });
        let samples = Matrix::new(&systems, &workloads, ctx.opts.rounds())
            .note_failures()
            .run(ctx, |ctx, _, w, t| {
                let r = share_run(
                    ctx.opts.placement,
                    t.nodes(),
                    w.unique,
                    objects,
                    local,
                    secs,
                )?;
                Ok(Sample::new()
                    .median("ops_per_s", "ops/s", r.ops_per_s)
                    .last("far_bytes", "bytes", r.far_bytes)
                    .last("far_live_bytes", "bytes", r.far_live_bytes)
                    .last(
                        "far_bytes_per_live_byte",
                        "x",
                        r.far_bytes / r.far_live_bytes.max(1.0),
                    ))
            })?;
        samples.report(ctx);
    }
    Ok(())
}

/// One sharing client: caches `local` of its `objects` locally, swaps the rest with the node.
/// Prints `ready`, waits for a line on stdin, runs, prints one JSON line of results.
pub fn share_worker(a: ShareJob) -> Result<()> {
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

/// A sharing client process, killed when dropped.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(job: &ShareJob) -> Result<Worker> {
        let mut child = Job::Share(job.clone())
            .command(&tidepool_bin()?)
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

/// What the clients of one run did together.
#[derive(Debug, Default, Clone, Copy)]
struct ShareResult {
    ops_per_s: f64,
    far_bytes: f64,
    far_live_bytes: f64,
}

/// One run: `SHARE_CLIENTS` client processes over `nodes` nodes, their results summed.
fn share_run(
    placement: Placement,
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
        workers.push(Worker::spawn(&ShareJob {
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
